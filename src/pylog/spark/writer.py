"""``df.write.format("pylog")``: rows to records, with the columns of Spark's Kafka sink.

Columns: ``value`` (required, binary or string), ``key`` (binary or string), ``topic`` (string; the ``topic``
option overrides it), ``partition`` (int; null lets the partitioner choose: murmur2 of the key, sticky for
keyless records) and ``headers`` (``array<struct<key:string,value:binary>>``). Other columns are an error.

Each task opens the log once and appends Arrow batches with :meth:`pylog.Producer.send_batch` (no Python
loop per record; rows with headers go through ``Producer.send`` one by one). Tasks on many executors append
to the same partitions safely: pylog serializes appending processes with a per-partition file lock.

Delivery is at-least-once: records a task wrote stay in the log when the task or the job fails afterwards,
and a retried task writes them again. The streaming sink (:mod:`pylog.spark.sink`) shares this module's
Arrow path and is exactly-once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

import pylog
from pylog.errors import ConfigError, InvalidRecordError
from pylog.spark.snapshot import LogView

__all__ = ["PylogCommitMessage", "PylogWriter", "append_record_batch", "check_write_schema"]

_ALLOWED = {
    "value": ("binary", "string"),
    "key": ("binary", "string"),
    "topic": ("string",),
    "partition": ("int", "bigint", "smallint", "tinyint"),
    "headers": ("array<struct<key:string,value:binary>>",),
}


@dataclass
class PylogCommitMessage(WriterCommitMessage):
    """What one task appended."""

    records: int


def check_write_schema(schema: Any, topic_option: str | None, path: str) -> None:
    """Raise ConfigError for columns Spark's Kafka sink would refuse; UnknownTopicError for a bad topic."""
    types = {f.name: f.dataType.simpleString() for f in schema.fields}
    if "value" not in types:
        raise ConfigError("writing to pylog needs a 'value' column (binary or string)")
    for name, type_name in types.items():
        allowed = _ALLOWED.get(name)
        if allowed is None:
            raise ConfigError(
                f"column {name!r} cannot be written to pylog (use value, key, topic, partition, headers)"
            )
        if type_name not in allowed:
            raise ConfigError(f"column {name!r} must be of type {' or '.join(allowed)}, not {type_name}")
    if topic_option is None and "topic" not in types:
        raise ConfigError("give the topic with .option('topic', ...) or a 'topic' column")
    if topic_option is not None:
        LogView(path).num_partitions(topic_option)


class PylogWriter(DataSourceArrowWriter):
    """Appends each task's rows; ``commit`` and ``abort`` have nothing to undo (at-least-once)."""

    def __init__(self, path: str, topic: str | None, acks: str) -> None:
        self.path = path
        self.topic = topic
        self.acks: int | str = "all" if acks == "all" else int(acks)

    def write(self, iterator: Iterator[Any]) -> PylogCommitMessage:
        written = 0
        with pylog.open(self.path) as log:
            producer = log.producer(acks=self.acks, value_serializer=None)
            try:
                for rb in iterator:
                    written += append_record_batch(producer, self.topic, rb)
            finally:
                producer.close()
        return PylogCommitMessage(written)

    def commit(self, messages: list[Any]) -> None:
        """Records are durable in the log as soon as each task returns; nothing to do."""

    def abort(self, messages: list[Any]) -> None:
        """Records appended by tasks that succeeded stay in the log (at-least-once)."""


def append_record_batch(producer: Any, topic_option: str | None, rb: Any) -> int:
    """Send the rows of the Arrow batch ``rb`` (the columns of :data:`_ALLOWED`) with ``producer``; returns
    how many. The ``topic`` option, when given, overrides a ``topic`` column. Shared by the batch writer and
    the streaming sink (whose producer is transactional)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = rb.num_rows
    if n == 0:
        return 0
    names = rb.schema.names
    values = _binary(rb.column(names.index("value")))
    keys = _binary(rb.column(names.index("key"))) if "key" in names else None
    if topic_option is not None:
        topics = np.full(n, topic_option, dtype=object)
    else:
        column = rb.column(names.index("topic"))
        if column.null_count:
            raise InvalidRecordError("a row has a null topic and no topic option is set")
        topics = np.asarray(column.to_pylist(), dtype=object)
    if "partition" in names:
        pcol = rb.column(names.index("partition"))
        parts = np.asarray(pcol.fill_null(-1).cast(pa.int64()))
    else:
        parts = np.full(n, -1, dtype=np.int64)
    if "headers" in names:
        headers = rb.column(names.index("headers"))
        if pc.any(pc.greater(pc.fill_null(pc.list_value_length(headers), 0), 0)).as_py():
            return _send_rows(producer, topics, parts, keys, values, headers)
    groups: dict[tuple[str, int], list[int]] = {}
    if len(set(topics.tolist())) == 1 and len(np.unique(parts)) == 1:
        groups[(str(topics[0]), int(parts[0]))] = []
    else:
        for i, tp in enumerate(zip(topics.tolist(), parts.tolist(), strict=True)):
            groups.setdefault(tp, []).append(i)
    for (topic, part), rows in groups.items():
        if rows:
            idx = pa.array(rows, type=pa.int64())
            k, v = (None if keys is None else keys.take(idx)), values.take(idx)
        else:
            k, v = keys, values
        producer.send_batch(topic, keys=k, values=v, partition=None if part < 0 else part)
    return int(n)


def _send_rows(producer: Any, topics: Any, parts: Any, keys: Any, values: Any, headers: Any) -> int:
    key_list = [None] * len(values) if keys is None else keys.to_pylist()
    rows = zip(
        topics.tolist(), parts.tolist(), key_list, values.to_pylist(), headers.to_pylist(), strict=True
    )
    for topic, part, key, value, hdrs in rows:
        pairs = [(h["key"], h["value"]) for h in hdrs or []]
        producer.send(topic, value, key=key, headers=pairs or None, partition=None if part < 0 else part)
    producer.flush()
    return len(values)


def _binary(column: Any) -> Any:
    import pyarrow as pa

    return column if pa.types.is_binary(column.type) else column.cast(pa.binary())
