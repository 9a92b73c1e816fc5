"""Options of ``format("pylog")``, named and interpreted as in Spark's Kafka source.

Topic selection: exactly one of ``subscribe`` (comma list), ``subscribePattern`` (regex, full match) and
``assign`` (JSON ``{"t": [0, 1]}``).

Offsets, resolved when the query is planned (special values in JSON: -2 earliest, -1 latest)::

    startingTimestamp > startingOffsetsByTimestamp > startingOffsets     (batch default: earliest)
    endingTimestamp   > endingOffsetsByTimestamp   > endingOffsets       (default: latest)

Partitions missing from a JSON option take the option's default. A starting timestamp with no record at or
after it fails the query (``startingOffsetsByTimestampStrategy=error``, Kafka's default) or starts at the log
end (``latest``); an ending timestamp with no such record reads to the log end.

``kafka.isolation.level``: ``read_uncommitted`` (the default, as Spark's Kafka source) returns every record;
``read_committed`` skips the records of aborted transactions and ends each range at the partition's last
stable offset (the first batch of a transaction still open), batch and streaming alike
(:mod:`pylog.spark.committed`). Any other value fails the query at ``load()`` with a ConfigError.

Option names are checked (:func:`check_read_options`, :func:`check_write_options`): an unknown name is a
ConfigError naming the closest known one; an option of Spark's Kafka connector that means nothing here
(``kafka.bootstrap.servers``, ``kafka.group.id``, ``kafka.auto.offset.reset``, ...) is one saying what to use
instead; the streaming-only options (``maxOffsetsPerTrigger``, ``minOffsetsPerTrigger``, ``maxTriggerDelay``)
are refused on a batch read and the ending options on a stream. The JSON offsets and timestamps options may
name only topics the query reads and partitions that exist (:meth:`Options.check_offset_options`).

A log in an object store (``load("s3://bucket/prefix")``, see :mod:`pylog.spark.remote`) takes the store's
options as ``remoteStorage.<key>`` options (:func:`remote_storage_options`), and ``read_committed`` reads it
with the transaction decisions tiered with it (:mod:`pylog.spark.committed`); ``remoteStorage.*`` options
with a directory path are refused.

Spark partitions (:func:`plan_splits`): one per offset range, as Spark's Kafka source, except that

- ``maxRecordsPerPartition`` splits each range into ``ceil(size / maxRecordsPerPartition)`` parts, and
  ``minPartitions`` above the number of ranges splits each range in proportion to its size (Kafka's rules);
- ranges smaller than ``PACK_RECORDS`` records and ``PACK_BYTES`` bytes share a Spark partition, up to those
  limits (a topic of 1,000 small partitions is not read by 1,000 tasks of a few milliseconds of work each,
  which Spark runs at tens of milliseconds apiece); ``minPartitions`` still bounds the count from below.
"""

from __future__ import annotations

import difflib
import itertools
import json
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pylog.errors import ConfigError, OffsetOutOfRangeError
from pylog.spark.remote import (
    CLIENT_KEYS,
    MAX_PRESIGN_EXPIRY_S,
    PRESIGN_KEY,
    REMOTE_PREFIX,
    RETRY_KEYS,
    STORE_KEY_ALIASES,
    STORE_KEYS,
    is_url,
)
from pylog.spark.snapshot import LogView, PartitionView

__all__ = [
    "BATCH_ONLY",
    "EARLIEST",
    "ISOLATION_LEVELS",
    "KAFKA_FIELDS",
    "KAFKA_ONLY",
    "KAFKA_WRITE_ONLY",
    "LATEST",
    "OffsetRange",
    "Options",
    "PACK_BYTES",
    "PACK_RECORDS",
    "READ_OPTIONS",
    "STREAM_ONLY",
    "WRITE_OPTIONS",
    "check_read_options",
    "check_write_options",
    "parse_duration_ms",
    "plan_splits",
    "remote_storage_options",
    "split_ranges",
    "value_schema_names",
]

_log = logging.getLogger("pylog.spark")

EARLIEST = -2
LATEST = -1
PACK_RECORDS = 1 << 18
PACK_BYTES = 64 << 20
KAFKA_FIELDS = (
    ("key", "binary"),
    ("value", "binary"),
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "long"),
    ("timestamp", "timestamp"),
    ("timestampType", "int"),
)
HEADERS_TYPE = "array<struct<key:string,value:binary>>"
ISOLATION_LEVELS = ("read_uncommitted", "read_committed")
_TRUE = {"true": True, "false": False}

# -- which options exist ---------------------------------------------------------------------------------

#: Every read option, lower case -> the spelling the docs use.
READ_OPTIONS = {
    name.lower(): name
    for name in (
        "path",
        "subscribe",
        "subscribePattern",
        "assign",
        "startingOffsets",
        "endingOffsets",
        "startingTimestamp",
        "endingTimestamp",
        "startingOffsetsByTimestamp",
        "endingOffsetsByTimestamp",
        "startingOffsetsByTimestampStrategy",
        "failOnDataLoss",
        "minPartitions",
        "maxRecordsPerPartition",
        "maxOffsetsPerTrigger",
        "minOffsetsPerTrigger",
        "maxTriggerDelay",
        "includeHeaders",
        "kafka.isolation.level",
        "columns",
        "valueFormat",
        "valueSchema",
    )
}
#: Read options a batch query refuses (Spark's Kafka source ignores them there with a logged warning).
STREAM_ONLY = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")
#: Read options a streaming query refuses, as Spark's Kafka source does.
BATCH_ONLY = ("endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp")
#: Options of the batch writer (``df.write.format("pylog")``), lower case -> spelling.
WRITE_OPTIONS = {name.lower(): name for name in ("path", "topic", "acks")}

_NO_CONSUMER_GROUP = (
    "pylog's Spark source uses no consumer group: a streaming query keeps its offsets in its checkpoint "
    "(checkpointLocation) and a batch query takes them from startingOffsets/endingOffsets; remove it"
)
_NO_NETWORK = (
    "pylog reads the log directory's segment files directly (no broker to fetch from or poll); remove it"
)
#: Options of Spark's Kafka connector that mean nothing here, lower case -> what to do instead.
KAFKA_ONLY = {
    "kafka.bootstrap.servers": "pylog has no brokers: give the log directory instead, "
    'with .load("/path/to/log"), .save("/path/to/log") or the option path',
    "kafka.group.id": _NO_CONSUMER_GROUP,
    "groupidprefix": _NO_CONSUMER_GROUP,
    "kafka.auto.offset.reset": "set startingOffsets to earliest or latest instead (Spark's Kafka source refuses "
    "it too: a restarted query resumes from its checkpoint)",
    "kafka.enable.auto.commit": "offsets are kept in the query's checkpoint, never committed to a group "
    "(Spark's Kafka source refuses it too)",
    "kafka.key.deserializer": "keys are read as binary: decode them with DataFrame operations "
    "(Spark's Kafka source refuses it too)",
    "kafka.value.deserializer": "values are read as binary: decode them with DataFrame operations, or read "
    "msgpack map values into typed columns with valueFormat=msgpack and valueSchema",
    "kafka.interceptor.classes": "pylog runs no consumer interceptors (Spark's Kafka source refuses it too)",
    "fetchoffset.numretries": _NO_NETWORK,
    "fetchoffset.retryintervalms": _NO_NETWORK,
    "kafkaconsumer.polltimeoutms": _NO_NETWORK,
}
#: Producer settings of Spark's Kafka sink that mean nothing here, lower case -> what to do instead.
KAFKA_WRITE_ONLY = {
    "kafka.bootstrap.servers": KAFKA_ONLY["kafka.bootstrap.servers"],
    "kafka.acks": "use the option acks (1 or all)",
    "kafka.key.serializer": "keys are written as given (binary or string columns)",
    "kafka.value.serializer": "values are written as given (binary or string columns)",
    "includeheaders": "a headers column, when present, is always written",
}


def _check_names(
    raw: Mapping[str, Any],
    known: Mapping[str, str],
    kafka_only: Mapping[str, str],
    what: str,
) -> dict[str, str]:
    """``raw`` with lower-case keys and string values; unknown and Kafka-only options raise ConfigError."""
    opts = {str(k).lower(): str(v) for k, v in raw.items()}
    for key in opts:
        if key in known:
            continue
        if key in kafka_only:
            raise ConfigError(
                f"option {key!r} of Spark's Kafka connector does not apply to pylog: {kafka_only[key]}"
            )
        if key.startswith("kafka."):
            allowed = [known[k] for k in known if k.startswith("kafka.")]
            raise ConfigError(
                f"option {key!r}: pylog reads and writes the log directory's files directly, with no Kafka "
                "client, so Kafka client settings have no meaning here"
                + (f" (the only kafka.* option is {', '.join(allowed)})" if allowed else "")
            )
        close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
        hint = f"did you mean {known[close[0]]!r}?" if close else f"options are {', '.join(known.values())}"
        raise ConfigError(f"unknown option {key!r} for {what}: {hint}")
    return opts


def check_read_options(raw: Mapping[str, Any], *, streaming: bool | None = None) -> dict[str, str]:
    """Check the names of a read's options (keys case-insensitive) and return them with lower-case keys.

    Unknown names raise :class:`~pylog.errors.ConfigError` naming the closest known option; options of Spark's
    Kafka connector that have no meaning for pylog raise one saying what to use instead. With ``streaming``
    true, the batch-only options (``endingOffsets``, ...) are refused; with ``streaming`` false, the
    streaming-only ones (``maxOffsetsPerTrigger``, ...); None checks names only (the query kind is not
    known yet)."""
    remote = {k: v for k, v in raw.items() if str(k).lower().startswith(REMOTE_PREFIX)}
    known = {**READ_OPTIONS, **_REMOTE_HINTS}
    opts = _check_names(
        {k: v for k, v in raw.items() if k not in remote}, known, KAFKA_ONLY, 'spark.read.format("pylog")'
    )
    opts.update({str(k).lower(): str(v) for k, v in remote.items()})
    remote_storage_options(opts)
    if streaming is not None:
        refused = BATCH_ONLY if streaming else STREAM_ONLY
        for name in refused:
            if name.lower() in opts:
                raise ConfigError(
                    f"option {name} is not valid in streaming queries (a stream reads on as records arrive)"
                    if streaming
                    else f"option {name} only applies to streaming queries (spark.readStream); "
                    "remove it from this batch read"
                )
    return opts


def check_write_options(raw: Mapping[str, Any], extra: tuple[str, ...] = ()) -> dict[str, str]:
    """Check the names of a write's options (keys case-insensitive) and return them with lower-case keys.

    Known: ``path``, ``topic``, ``acks``, and the names in ``extra`` (a writer's own options, such as a
    streaming sink's). Unknown names raise :class:`~pylog.errors.ConfigError` naming the closest known
    option; producer settings of Spark's Kafka sink raise one saying what to use instead."""
    known = {**WRITE_OPTIONS, **{name.lower(): name for name in extra}}
    return _check_names(raw, known, KAFKA_WRITE_ONLY, 'df.write.format("pylog")')


_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(value: str, key: str) -> int:
    """A duration in Spark's notation (``15m``, ``30s``, ``500ms``, ``1h``, ``2d``; a bare number is
    milliseconds) as whole milliseconds."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", value.lower())
    if m is None or m.group(2) not in ("", *_UNITS_MS):
        raise ConfigError(f"option {key} must be a duration such as 15m, 30s or 500ms, got {value!r}")
    return int(int(m.group(1)) * _UNITS_MS.get(m.group(2) or "ms", 1))


def value_schema_names(ddl: str) -> list[str]:
    """The field names of a DDL field list (``a long, `b c` string, d struct<x:int>``)."""
    fields: list[str] = []
    current: list[str] = []
    depth, quoted = 0, False
    for ch in ddl:
        if ch == "`":
            quoted = not quoted
        elif not quoted and ch in "<(":
            depth += 1
        elif not quoted and ch in ">)":
            depth -= 1
        if ch == "," and depth == 0 and not quoted:
            fields.append("".join(current))
            current = []
        else:
            current.append(ch)
    fields.append("".join(current))
    names = []
    for field in (f.strip() for f in fields):
        if not field:
            continue
        m = re.match(r"`((?:[^`]|``)*)`|([^\s:]+)", field)
        if m is not None:
            names.append(m.group(1).replace("``", "`") if m.group(1) is not None else m.group(2))
    return names


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Records ``start <= offset < end`` of one topic partition, but those in the ``skipped`` ranges
    ``[first, next)`` (sorted, disjoint, within ``[start, end)``): the batches of aborted transactions and control
    batches a read_committed read leaves out (:mod:`pylog.spark.committed`)."""

    topic: str
    partition: int
    start: int
    end: int
    skipped: tuple[tuple[int, int], ...] = ()

    @property
    def size(self) -> int:
        return self.end - self.start

    def part(self, start: int, end: int) -> OffsetRange:
        """The offsets ``[start, end)`` of this range, with the skipped ranges that fall in them."""
        skipped = tuple((max(a, start), min(b, end)) for a, b in self.skipped if a < end and b > start)
        return OffsetRange(self.topic, self.partition, start, end, skipped)


class Options:
    """The user's options (keys case-insensitive, values strings), validated on construction."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = check_read_options(raw)
        chosen = [k for k in ("subscribe", "subscribepattern", "assign") if k in self.raw]
        if len(chosen) != 1:
            raise ConfigError(
                "give exactly one of the options subscribe, subscribePattern or assign"
                + (f" (got {', '.join(chosen)})" if chosen else "")
            )
        self.path = self.raw.get("path", "")
        self.fail_on_data_loss = self.flag("failondataloss", True)
        self.include_headers = self.flag("includeheaders", False)
        self.min_partitions = self.int_option("minpartitions", 0)
        self.max_records_per_partition = self.int_option("maxrecordsperpartition", 0)
        self.max_offsets_per_trigger = self.int_option("maxoffsetspertrigger", 0)
        self.min_offsets_per_trigger = self.int_option("minoffsetspertrigger", 0)
        if self.min_offsets_per_trigger and self.min_offsets_per_trigger > (
            self.max_offsets_per_trigger or 1 << 62
        ):
            raise ConfigError(
                f"option minOffsetsPerTrigger ({self.min_offsets_per_trigger}) is higher than "
                f"maxOffsetsPerTrigger ({self.max_offsets_per_trigger})"
            )
        self.max_trigger_delay_ms = parse_duration_ms(
            self.raw.get("maxtriggerdelay", "15m"), "maxTriggerDelay"
        )
        self.value_format = self.raw.get("valueformat", "binary").lower()
        if self.value_format not in ("binary", "msgpack"):
            raise ConfigError(f"valueFormat must be binary or msgpack, got {self.value_format!r}")
        strategy = self.raw.get("startingoffsetsbytimestampstrategy", "error").lower()
        if strategy not in ("error", "latest"):
            raise ConfigError(f"startingOffsetsByTimestampStrategy must be error or latest, got {strategy!r}")
        self.timestamp_strategy = strategy
        level = self.raw.get("kafka.isolation.level", "read_uncommitted").strip().lower()
        if level not in ISOLATION_LEVELS:
            raise ConfigError(
                f"option kafka.isolation.level must be one of {', '.join(ISOLATION_LEVELS)}, "
                f"got {self.raw['kafka.isolation.level']!r}"
            )
        self.read_committed = level == "read_committed"
        self.remote_storage_options = remote_storage_options(self.raw)
        self._check_remote()
        self.columns = self._columns()
        self._check_value_schema()

    def log_view(self) -> LogView:
        """The log this query reads, as it is now: a log directory, or a log in an object store."""
        return LogView(self.path, self.remote_storage_options)

    def _check_remote(self) -> None:
        """Store options need a URL path. (read_committed reads a URL with the transaction decisions tiered
        with the log: :mod:`pylog.spark.committed`.)"""
        if self.remote_storage_options and not is_url(self.path):
            raise ConfigError(
                "the remoteStorage.* options are for a log in an object store: load it by its URL "
                '(.load("s3://bucket/prefix")), not a log directory'
            )

    def check_query(self, *, streaming: bool) -> None:
        """Refuse the options a batch (``streaming=False``) or streaming query does not take."""
        check_read_options(self.raw, streaming=streaming)

    def _check_value_schema(self) -> None:
        """A ``valueSchema`` field named like a Kafka column would give two columns of one name (every
        reference to it ambiguous), or be taken for the Kafka column: refused."""
        ddl = self.raw.get("valueschema")
        if not ddl:
            return
        kafka = {name.lower(): name for name in (*(n for n, _ in KAFKA_FIELDS), "headers")}
        clashes = [n for n in value_schema_names(ddl) if n.lower() in kafka]
        if clashes:
            raise ConfigError(
                f"option valueSchema names {', '.join(repr(n) for n in clashes)}, the name of a Kafka column "
                f"({', '.join(kafka.values())}): a value field cannot share a name with the Kafka columns "
                "(Spark would see two columns of that name). Store the field under another name"
            )

    def _columns(self) -> tuple[str, ...] | None:
        """The ``columns`` option: Kafka column names (any case), in the order given; None when absent."""
        raw = self.raw.get("columns")
        if raw is None:
            return None
        known = {name.lower(): name for name, _ in (*KAFKA_FIELDS, ("headers", HEADERS_TYPE))}
        names = [c.strip() for c in raw.split(",") if c.strip()]
        bad = [c for c in names if c.lower() not in known]
        if bad or not names:
            raise ConfigError(f"option columns must name some of {', '.join(known.values())}, got {raw!r}")
        chosen = tuple(known[c.lower()] for c in names)
        if len(set(chosen)) != len(chosen):
            raise ConfigError(f"option columns names a column twice: {raw!r}")
        return chosen

    def kafka_ddl(self) -> str:
        """The Kafka columns of the row schema as DDL: all of them (with ``headers`` when
        ``includeHeaders=true``), or those of the ``columns`` option."""
        fields = dict(KAFKA_FIELDS)
        if self.columns is None:
            names = [name for name, _ in KAFKA_FIELDS] + (["headers"] if self.include_headers else [])
        else:
            names = list(self.columns)
        return ", ".join(f"{n} {fields.get(n, HEADERS_TYPE)}" for n in names)

    def get(self, key: str) -> str | None:
        return self.raw.get(key.lower())

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw.get(key)
        if value is None:
            return default
        if value.lower() not in _TRUE:
            raise ConfigError(f"option {key} must be true or false, got {value!r}")
        return _TRUE[value.lower()]

    def int_option(self, key: str, default: int) -> int:
        value = self.raw.get(key)
        if value is None:
            return default
        try:
            n = int(value)
        except ValueError:
            raise ConfigError(f"option {key} must be an integer, got {value!r}") from None
        if n < 1:
            raise ConfigError(f"option {key} must be >= 1, got {n}")
        return n

    # -- topics -----------------------------------------------------------------------------------------

    def topic_partitions(self, log: LogView, *, streaming: bool = False) -> list[tuple[str, int]]:
        """The selected (topic, partition) pairs, sorted. Unknown topics in assign raise, and in subscribe
        too unless ``streaming``: a stream waits for a subscribed topic to be created, as Kafka's source."""
        if "assign" in self.raw:
            assigned = _json(self.raw["assign"], "assign")
            out = []
            for topic, parts in assigned.items():
                if not isinstance(parts, list) or not all(isinstance(p, int) for p in parts):
                    raise ConfigError(
                        f'assign must look like {{"topic": [0, 1]}}, got {self.raw["assign"]!r}'
                    )
                for p in parts:
                    log.partition(topic, p)  # raises for unknown topics and partitions
                    out.append((topic, p))
            return sorted(set(out))
        if "subscribe" in self.raw:
            topics = [t.strip() for t in self.raw["subscribe"].split(",") if t.strip()]
            if not topics:
                raise ConfigError("subscribe needs at least one topic name")
        else:
            pattern = self._pattern()
            topics = [t for t in log.topics() if pattern.fullmatch(t)]
        if streaming:
            topics = [t for t in topics if t in log.partition_counts]
        return sorted((t, p) for t in set(topics) for p in range(log.num_partitions(t)))

    def _reads_topic(self, topic: str) -> bool:
        if "assign" in self.raw:
            return topic in _json(self.raw["assign"], "assign")
        if "subscribe" in self.raw:
            return topic in {t.strip() for t in self.raw["subscribe"].split(",")}
        return self._pattern().fullmatch(topic) is not None

    def _pattern(self) -> re.Pattern[str]:
        try:
            return re.compile(self.raw["subscribepattern"])
        except re.error as exc:
            raise ConfigError(f"subscribePattern is not a valid regex: {exc}") from exc

    def check_offset_options(self, log: LogView) -> None:
        """The JSON offsets and timestamps options name only topics this query reads and partitions that
        exist (and, with ``assign``, are assigned); otherwise ConfigError. A subscribed topic that does not
        exist yet (a stream waits for it) cannot have its partitions checked."""
        assigned = _json(self.raw["assign"], "assign") if "assign" in self.raw else None
        for key in (
            "startingoffsets",
            "endingoffsets",
            "startingoffsetsbytimestamp",
            "endingoffsetsbytimestamp",
        ):
            raw = self.raw.get(key)
            if raw is None or raw.strip().lower() in ("earliest", "latest"):
                continue
            name = READ_OPTIONS[key]
            for topic, parts in _json(raw, name).items():
                if not isinstance(parts, dict):
                    raise ConfigError(f'option {name} must look like {{"topic": {{"0": 23}}}}, got {raw!r}')
                if not self._reads_topic(topic):
                    close = difflib.get_close_matches(
                        topic, [t for t in log.topics() if self._reads_topic(t)], 1
                    )
                    raise ConfigError(
                        f"option {name} names topic {topic!r}, which this query does not read"
                        + (f" (did you mean {close[0]!r}?)" if close else "")
                    )
                for p in parts:
                    if not re.fullmatch(r"\d+", str(p)):
                        raise ConfigError(
                            f"option {name}: {p!r} of topic {topic!r} is not a partition number"
                        )
                    if assigned is not None and int(p) not in assigned[topic]:
                        raise ConfigError(f"option {name} names {topic}-{p}, which is not assigned")
                    count = log.partition_counts.get(topic)
                    if count is not None and int(p) >= count:
                        raise ConfigError(
                            f"option {name} names {topic}-{p}, which does not exist "
                            f"(topic {topic!r} has partitions 0..{count - 1})"
                        )

    # -- offsets ----------------------------------------------------------------------------------------

    def starting_offset(self, view: PartitionView, *, streaming: bool) -> int:
        ts = self._timestamp_for(view, "startingtimestamp", "startingoffsetsbytimestamp")
        if ts is not None:
            found = view.offset_for_time(ts)
            if found is None:
                if self.timestamp_strategy == "error":
                    raise OffsetOutOfRangeError(
                        f"no record at or after timestamp {ts} in {view.topic}-{view.partition} "
                        "(set startingOffsetsByTimestampStrategy=latest to start at the end instead)"
                    )
                return view.log_end_offset
            return found
        default = LATEST if streaming else EARLIEST
        spec = self._offset_for(view, "startingoffsets", default)
        if spec == LATEST and not streaming and "startingoffsets" in self.raw:
            raise ConfigError("startingOffsets cannot be latest (-1) in a batch query")
        return self._resolve(view, spec)

    def ending_offset(self, view: PartitionView) -> int:
        ts = self._timestamp_for(view, "endingtimestamp", "endingoffsetsbytimestamp")
        if ts is not None:
            found = view.offset_for_time(ts)
            return view.log_end_offset if found is None else found
        spec = self._offset_for(view, "endingoffsets", LATEST)
        if spec == EARLIEST:
            raise ConfigError("endingOffsets cannot be earliest (-2)")
        return self._resolve(view, spec)

    def offset_range(self, view: PartitionView) -> OffsetRange:
        start = self.starting_offset(view, streaming=False)
        end = self.ending_offset(view)
        if end < start:
            raise ConfigError(
                f"{view.topic}-{view.partition}: the ending offset {end} is before the starting offset {start}"
            )
        return OffsetRange(view.topic, view.partition, start, end)

    def _timestamp_for(self, view: PartitionView, single: str, by_partition: str) -> int | None:
        if single in self.raw:
            return _int(self.raw[single], single)
        if by_partition in self.raw:
            value = _json(self.raw[by_partition], by_partition).get(view.topic, {}).get(str(view.partition))
            return None if value is None else _int(value, by_partition)
        return None

    def _offset_for(self, view: PartitionView, key: str, default: int) -> int:
        raw = self.raw.get(key)
        if raw is None:
            return default
        word = raw.strip().lower()
        if word in ("earliest", "latest"):
            return EARLIEST if word == "earliest" else LATEST
        spec = _json(raw, key)
        value = spec.get(view.topic, {}).get(str(view.partition), default)
        return _int(value, key)

    def _resolve(self, view: PartitionView, spec: int) -> int:
        if spec == EARLIEST:
            return view.log_start_offset
        if spec == LATEST:
            return view.log_end_offset
        if spec < 0:
            raise ConfigError(f"offset {spec} is not valid (use -2 for earliest, -1 for latest)")
        lo, hi = view.log_start_offset, view.log_end_offset
        if lo <= spec <= hi:
            return spec
        if self.fail_on_data_loss:
            raise OffsetOutOfRangeError(
                f"offset {spec} of {view.topic}-{view.partition} is outside the log [{lo}, {hi}] "
                "(records may have been deleted by retention; set failOnDataLoss=false to skip them)"
            )
        clamped = min(max(spec, lo), hi)
        gone = (
            f"offsets {spec}..{lo - 1} were deleted"
            if spec < lo
            else f"offsets {hi}..{spec - 1} do not exist"
        )
        _log.warning(
            "%s-%d: offset %d is outside the log [%d, %d] (%s); failOnDataLoss=false, so reading from offset %d. "
            "Some data may have been lost: it was deleted by retention, or the log was truncated or recreated",
            view.topic,
            view.partition,
            spec,
            lo,
            hi,
            gone,
            clamped,
        )
        return clamped


#: Spellings the closest-name error of an unknown option may suggest.
_REMOTE_HINTS = {
    f"{REMOTE_PREFIX}{key}": f"remoteStorage.{key}"
    for key in (
        *("region", "endpoint", "access_key_id", "secret_access_key", "session_token"),
        *(f"client_options.{k}" for k in CLIENT_KEYS),
        *(f"retry_config.{k}" for k in RETRY_KEYS),
        "presignExpirySeconds",
    )
}


def remote_storage_options(raw: Mapping[str, str]) -> dict[str, Any]:
    """The object store's options from the reader options ``remoteStorage.<key>`` (keys lower case): the
    store's own keys (``remoteStorage.region``, ``.endpoint``, ``.access_key_id``, ...) as strings,
    ``remoteStorage.client_options.<key>`` (``allow_http``, ``timeout``, ...) and
    ``remoteStorage.retry_config.<key>`` (``max_retries``, ``retry_timeout``, ``backoff.init_backoff``,
    ``backoff.max_backoff`` as durations such as 100ms or 5s, ``backoff.base``). An unknown key is a
    :class:`~pylog.errors.ConfigError` naming the closest known one. ``remoteStorage.presignExpirySeconds``
    (how long the presigned URLs of pylog's JVM reader are valid: 1 to 604800 seconds) is not the store's: it
    is kept under :data:`~pylog.spark.remote.PRESIGN_KEY`, which opening the store leaves out."""
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if not name.startswith(REMOTE_PREFIX):
            continue
        key = name[len(REMOTE_PREFIX) :]
        name = f"remoteStorage.{key}"  # the spelling the docs use, for messages
        group, _, sub = key.partition(".")
        if key == "presignexpiryseconds":
            out[PRESIGN_KEY] = _presign_expiry(value)
        elif group == "client_options" and sub:
            _known_key(name, sub, CLIENT_KEYS, "client_options.")
            out.setdefault("client_options", {})[sub] = value
        elif group == "retry_config" and sub:
            _known_key(name, sub, list(RETRY_KEYS), "retry_config.")
            where, _, leaf = sub.rpartition(".")
            target = out.setdefault("retry_config", {})
            if where:
                target = target.setdefault(where, {})
            target[leaf] = _retry_value(name, value, RETRY_KEYS[sub])
        elif not key.startswith(STORE_KEY_ALIASES):
            _known_key(name, key, STORE_KEYS, "")
            out[key] = value
        else:
            out[key] = value
    return out


def _presign_expiry(value: str) -> int:
    try:
        seconds = int(str(value).strip())
    except ValueError:
        seconds = 0
    if not 1 <= seconds <= MAX_PRESIGN_EXPIRY_S:
        raise ConfigError(
            f"option remoteStorage.presignExpirySeconds must be a whole number of seconds from 1 to "
            f"{MAX_PRESIGN_EXPIRY_S} (7 days, S3's longest), got {value!r}"
        )
    return seconds


def _known_key(name: str, key: str, known: list[str], group: str) -> None:
    if key in known:
        return
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"did you mean 'remoteStorage.{group}{close[0]}'?" if close else f"keys are {', '.join(known)}"
    raise ConfigError(f"unknown object store option {name!r}: {hint}")


def _retry_value(name: str, value: str, kind: str) -> Any:
    if kind == "duration":
        return timedelta(milliseconds=parse_duration_ms(value, name))
    try:
        return int(value) if kind == "int" else float(value)
    except ValueError:
        raise ConfigError(f"option {name} must be a number, got {value!r}") from None


def split_ranges(ranges: list[OffsetRange], min_partitions: int, max_records: int = 0) -> list[OffsetRange]:
    """Kafka's rule, made exact: with ``maxRecordsPerPartition`` (``max_records``), split each range into
    ``ceil(size / max_records)`` equal parts; then, with ``minPartitions`` above the number of ranges, split
    each range into parts proportional to its size (at least one part each, at most one per offset). Kafka
    rounds each share, which can leave fewer parts than asked for; here the parts left over go to the largest
    remainders, so a read has at least ``minPartitions`` parts whenever it has that many offsets."""
    ranges = [r for r in ranges if r.size > 0]
    if max_records:
        ranges = [piece for r in ranges for piece in _divide(r, math.ceil(r.size / max_records))]
    if min_partitions <= len(ranges):
        return ranges
    total = sum(r.size for r in ranges)
    shares = [r.size * min_partitions / total for r in ranges]
    counts = [min(max(int(s), 1), r.size) for s, r in zip(shares, ranges, strict=True)]
    by_remainder = sorted(range(len(ranges)), key=lambda i: counts[i] - shares[i])
    while sum(counts) < min_partitions:
        growable = [i for i in by_remainder if counts[i] < ranges[i].size]
        if not growable:
            break
        for i in growable[: min_partitions - sum(counts)]:
            counts[i] += 1
    return [piece for r, parts in zip(ranges, counts, strict=True) for piece in _divide(r, parts)]


def _divide(r: OffsetRange, parts: int) -> list[OffsetRange]:
    """``r`` in ``parts`` consecutive parts of (nearly) equal size."""
    bounds = [r.start + r.size * i // parts for i in range(parts + 1)]
    return [r.part(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def plan_splits(
    ranges: list[OffsetRange],
    min_partitions: int,
    bytes_per_offset: Mapping[tuple[str, int], float],
    max_records: int = 0,
) -> list[tuple[OffsetRange, ...]]:
    """The Spark partitions of a read: :func:`split_ranges`, then consecutive small ranges packed together.

    A group is closed before it would exceed ``PACK_RECORDS`` records or ``PACK_BYTES`` bytes (estimated from
    ``bytes_per_offset`` per topic partition); a bigger range is a group of its own. With ``minPartitions``
    the record limit is at most ``total // minPartitions``, so packing leaves at least that many groups; with
    ``max_records`` (``maxRecordsPerPartition``) no group holds more records than that."""
    pieces = split_ranges(ranges, min_partitions, max_records)
    limit = min(PACK_RECORDS, max_records) if max_records else PACK_RECORDS
    if min_partitions:
        limit = max(min(limit, sum(r.size for r in pieces) // min_partitions), 1)
    groups: list[tuple[OffsetRange, ...]] = []
    group: list[OffsetRange] = []
    records = 0
    size = 0.0
    for i, r in enumerate(pieces):
        r_bytes = r.size * bytes_per_offset.get((r.topic, r.partition), 0.0)
        full = records + r.size > limit or size + r_bytes > PACK_BYTES
        # packing never leaves fewer groups than minPartitions: closed ones, this one, one per piece left
        needed = len(groups) + 1 + (len(pieces) - i) <= min_partitions
        if group and (full or needed):
            groups.append(tuple(group))
            group, records, size = [], 0, 0.0
        group.append(r)
        records += r.size
        size += r_bytes
    if group:
        groups.append(tuple(group))
    return groups


def _json(raw: str, key: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"option {key} is not valid JSON: {raw!r}") from exc
    if not isinstance(value, dict) or not all(isinstance(v, dict | list) for v in value.values()):
        raise ConfigError(f"option {key} must be a JSON object keyed by topic, got {raw!r}")
    return value


def _int(value: Any, key: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"option {key}: expected an integer, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"option {key}: expected an integer, got {value!r}") from None
