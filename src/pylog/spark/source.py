"""The ``pylog`` Spark data source: ``spark.read.format("pylog")``, ``readStream`` and ``write``.

Row schema, as Spark's Kafka source::

    key binary, value binary, topic string, partition int, offset long, timestamp timestamp,
    timestampType int [, headers array<struct<key:string,value:binary>>]   (includeHeaders=true)

Spark gives Python data sources no column pruning: a query that needs one column still receives every column
of the schema, and turning each into JVM rows is most of a scan's cost. The ``columns`` option (or a schema
given with ``.schema(...)``) keeps only the Kafka columns named, and only those are built.

With ``valueFormat=msgpack`` the user's schema (``.schema(...)``, or the ``valueSchema`` option appended to
the columns above) names columns read from each msgpack map value; columns named like the Kafka columns keep
their meaning. See ``docs/spark.md`` for every option.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql.datasource import DataSource

from pylog.errors import ConfigError
from pylog.spark.options import KAFKA_FIELDS, Options, remote_storage_options
from pylog.spark.reader import PylogReader, PylogStreamReader, make_reader
from pylog.spark.remote import REMOTE_PREFIX, is_url
from pylog.spark.sink import PylogStreamWriter, make_stream_writer
from pylog.spark.snapshot import check_log_dir
from pylog.spark.writer import PylogWriter, check_write_schema
from pylog.tiered.location import read_remote_storage

__all__ = ["KAFKA_SCHEMA", "PylogDataSource", "read_options"]

KAFKA_SCHEMA = ", ".join(f"{name} {type_name}" for name, type_name in KAFKA_FIELDS)


def read_options(raw: Mapping[str, Any]) -> Options:
    """The reader options of a query. ``remoteStorage.<key>`` options are the object store's: of a log in
    the store (a URL path), or of the store a log directory records (``remote_storage``: its tiered topics'
    remote segments are read there). With a directory that records none they are refused (ConfigError)."""
    store = {k: v for k, v in raw.items() if str(k).lower().startswith(REMOTE_PREFIX)}
    path = next((str(v) for k, v in raw.items() if str(k).lower() == "path"), "")
    if not store or not path or is_url(path) or read_remote_storage(check_log_dir(path)) is None:
        return Options(raw)
    opts = Options({k: v for k, v in raw.items() if k not in store})
    opts.remote_storage_options = remote_storage_options({str(k).lower(): str(v) for k, v in store.items()})
    return opts


class PylogDataSource(DataSource):
    """Reads and writes a pylog directory (``load(path)``/``save(path)``/``start(path)`` or the ``path``
    option); ``writeStream`` is exactly-once (:mod:`pylog.spark.sink`)."""

    @classmethod
    def name(cls) -> str:
        return "pylog"

    def _options(self) -> Options:
        opts = read_options(self.options)
        opts.log_view()  # a missing directory, bad manifest or unreachable store fails here, at load()
        return opts

    def schema(self) -> str:
        opts = self._options()
        ddl = opts.kafka_ddl()
        value_schema = opts.get("valueSchema")
        if opts.value_format == "msgpack":
            if not value_schema:
                raise ConfigError(
                    "valueFormat=msgpack needs the value columns: .schema(...) or option valueSchema"
                )
            ddl += ", " + value_schema
        return ddl

    def reader(self, schema: Any) -> PylogReader:
        return make_reader(self._options(), schema.json())

    def streamReader(self, schema: Any) -> PylogStreamReader:
        return PylogStreamReader(self._options(), schema.json())

    def writer(self, schema: Any, overwrite: bool) -> PylogWriter:
        if overwrite:
            raise ConfigError("a pylog log can only be appended to: use mode('append')")
        raw = {str(k).lower(): str(v) for k, v in self.options.items()}
        path = check_log_dir(raw.get("path", ""))
        topic = raw.get("topic")
        check_write_schema(schema, topic, path)
        acks = raw.get("acks", "1")
        if acks not in ("0", "1", "all", "-1"):
            raise ConfigError(f"acks must be 0, 1 or all, got {acks!r}")
        return PylogWriter(path, topic, "all" if acks == "-1" else acks)

    def streamWriter(self, schema: Any, overwrite: bool) -> PylogStreamWriter:
        """The exactly-once sink. ``overwrite`` (output mode complete) appends every row of each batch, as
        Spark's Kafka sink does: a topic cannot be truncated."""
        return make_stream_writer(self.options, schema)
