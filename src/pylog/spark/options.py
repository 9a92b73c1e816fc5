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

Spark partitions (:func:`plan_splits`): one per offset range, as Spark's Kafka source, except that

- ``minPartitions`` above the number of ranges splits each range in proportion to its size (Kafka's rule);
- ranges smaller than ``PACK_RECORDS`` records and ``PACK_BYTES`` bytes share a Spark partition, up to those
  limits (a topic of 1,000 small partitions is not read by 1,000 tasks of a few milliseconds of work each,
  which Spark runs at tens of milliseconds apiece); ``minPartitions`` still bounds the count from below.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pylog.errors import ConfigError, OffsetOutOfRangeError
from pylog.spark.snapshot import LogView, PartitionView

__all__ = [
    "EARLIEST",
    "ISOLATION_LEVELS",
    "KAFKA_FIELDS",
    "LATEST",
    "PACK_BYTES",
    "PACK_RECORDS",
    "OffsetRange",
    "Options",
    "plan_splits",
    "split_ranges",
]

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
        self.raw = {str(k).lower(): str(v) for k, v in raw.items()}
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
        self.max_offsets_per_trigger = self.int_option("maxoffsetspertrigger", 0)
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
        self.columns = self._columns()

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

    def topic_partitions(self, log: LogView) -> list[tuple[str, int]]:
        """The selected (topic, partition) pairs, sorted. Unknown topics in subscribe/assign raise."""
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
            try:
                pattern = re.compile(self.raw["subscribepattern"])
            except re.error as exc:
                raise ConfigError(f"subscribePattern is not a valid regex: {exc}") from exc
            topics = [t for t in log.topics() if pattern.fullmatch(t)]
        return sorted((t, p) for t in set(topics) for p in range(log.num_partitions(t)))

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
        return min(max(spec, lo), hi)


def split_ranges(ranges: list[OffsetRange], min_partitions: int) -> list[OffsetRange]:
    """Kafka's rule, made exact: with ``minPartitions`` above the number of ranges, split each range into
    parts proportional to its size (at least one part each, at most one per offset). Kafka rounds each share,
    which can leave fewer parts than asked for; here the parts left over go to the largest remainders, so a
    read has at least ``minPartitions`` parts whenever it has that many offsets."""
    ranges = [r for r in ranges if r.size > 0]
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
    out: list[OffsetRange] = []
    for r, parts in zip(ranges, counts, strict=True):
        bounds = [r.start + r.size * i // parts for i in range(parts + 1)]
        out.extend(r.part(a, b) for a, b in itertools.pairwise(bounds) if b > a)
    return out


def plan_splits(
    ranges: list[OffsetRange], min_partitions: int, bytes_per_offset: Mapping[tuple[str, int], float]
) -> list[tuple[OffsetRange, ...]]:
    """The Spark partitions of a read: :func:`split_ranges`, then consecutive small ranges packed together.

    A group is closed before it would exceed ``PACK_RECORDS`` records or ``PACK_BYTES`` bytes (estimated from
    ``bytes_per_offset`` per topic partition); a bigger range is a group of its own. With ``minPartitions``
    the record limit is at most ``total // minPartitions``, so packing leaves at least that many groups."""
    pieces = split_ranges(ranges, min_partitions)
    limit = PACK_RECORDS
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
