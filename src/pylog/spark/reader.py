"""Batch and streaming readers of ``format("pylog")``.

Only picklable state lives on a reader (options, schema as JSON, filter bounds): Spark builds readers in
planner workers and runs ``read()`` on a copy in executor workers, which open the segment files themselves.

Batch: offsets are fixed in :meth:`PylogReader.partitions` (one Spark partition per topic partition, more
with ``minPartitions``, small ones packed together: :func:`~pylog.spark.options.plan_splits`). Streaming: offsets are ``{"topic": {"partition": next_offset}}`` dicts with keys in
sorted string order, so they survive JSON round trips and compare equal as JSON strings.

A log directory whose topics are tiered (:class:`~pylog.spark.remote.TieredPartitionView`): offsets resolve
over the remote and local segments, the remote segments are pinned at planning as for a URL read
(:func:`~pylog.spark.remote.pin`), and each task reads the offsets below the partition's local log start, as
it is when the task runs, from the store, the rest from the local segments (:func:`_read_tiered`).
"""

from __future__ import annotations

import inspect
import itertools
import json
import math
import pickle
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from pylog.clock import Clock, SystemClock
from pylog.errors import ConfigError, OffsetOutOfRangeError
from pylog.partition.visibility import Visibility
from pylog.spark.batches import ReadSpec, read_ranges
from pylog.spark.committed import committed_range, visibility
from pylog.spark.filters import Bounds, push
from pylog.spark.options import OffsetRange, Options, plan_splits
from pylog.spark.remote import RemoteRead, TieredPartitionView, is_url, pin, pin_newer
from pylog.spark.snapshot import LogView, PartitionView, check_log_dir, open_partition

__all__ = ["PylogFilteringReader", "PylogReader", "PylogStreamReader", "RangePartition", "make_reader"]

StreamOffset = dict[str, dict[str, int]]


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One Spark partition: offset ranges of one or more topic partitions.

    It pickles as ``_restore(plan, state)``: ``plan`` is JSON that pylog's JVM reader
    (:mod:`pylog.spark.jvm`) reads without a Python interpreter, ``{"path": str, "failOnDataLoss": bool,
    "ranges": [[topic, partition, start, end, skipped, dense], ...], "timestamp": {"lo": int|null, "hi":
    int|null, "values": [int]|null}}`` (``skipped``: ``[[first, next], ...]``, the offsets of aborted and
    control batches a read_committed read leaves out, see :mod:`pylog.spark.committed`, empty otherwise;
    ``dense``: the topic is not compacted, so the JVM reader checks that each batch's base offset is exactly
    the offset after its predecessor's, as pylog's log does, and only that it is greater otherwise;
    ``timestamp``: the pushed timestamp bounds in microseconds, present only when a filter set them; the JVM
    reader skips segments and batches outside them); ``state`` is the pickled partition itself.

    A partition of a tiered log directory also has ``"tiered": url`` (the store): the JVM reader then finds
    the pinned remote segments and the planned local log starts in the pickled
    :class:`~pylog.spark.remote.RemoteRead` (:func:`~pylog.spark.remote.jvm_plan`) and reads each range as
    :func:`_read_tiered` does."""

    ranges: tuple[OffsetRange, ...]
    spec: ReadSpec

    def __reduce__(self) -> tuple[Any, tuple[str, bytes]]:
        plan = {
            "path": self.spec.path,
            "failOnDataLoss": self.spec.fail_on_data_loss,
            "ranges": [
                [
                    r.topic,
                    r.partition,
                    r.start,
                    r.end,
                    [list(s) for s in r.skipped],
                    r.topic not in self.spec.compacted,
                ]
                for r in self.ranges
            ],
        }
        remote = self.spec.remote
        if remote is not None and remote.local_starts:  # a tiered log directory: its store's plan too
            plan["tiered"] = remote.url
        ts = self.spec.bounds.timestamp
        if ts.active:
            plan["timestamp"] = {
                "lo": ts.lo,
                "hi": ts.hi,
                "values": None if ts.values is None else sorted(ts.values),
            }
        return _restore, (json.dumps(plan), pickle.dumps((self.ranges, self.spec)))


def _restore(plan: str, state: bytes) -> RangePartition:
    """Unpickles a :class:`RangePartition` (``plan`` is for the JVM reader)."""
    ranges, spec = pickle.loads(state)
    return RangePartition(ranges, spec)


def _partitions(
    options: Options, spec: ReadSpec, ranges: list[OffsetRange], views: Iterable[PartitionView]
) -> list[RangePartition]:
    views = list(views)
    sizes = {(v.topic, v.partition): v.bytes_per_offset for v in views}
    groups = plan_splits(ranges, options.min_partitions, sizes, options.max_records_per_partition)
    if spec.remote is not None:  # a log in an object store: each task gets the segments it reads, pinned
        return [RangePartition(g, replace(spec, remote=pin(spec.remote, g, views))) for g in groups]
    return [RangePartition(g, spec) for g in groups]


def _read(partition: InputPartition) -> Iterator[Any]:
    if not isinstance(partition, RangePartition):  # Spark's stand-in when there is nothing to read
        return iter(())
    spec = partition.spec
    if spec.remote is not None and spec.remote.local_starts:
        return _read_tiered(spec, spec.remote, partition.ranges)
    return read_ranges(spec, partition.ranges)


def _read_tiered(spec: ReadSpec, remote: RemoteRead, ranges: tuple[OffsetRange, ...]) -> Iterator[Any]:
    """A task of a tiered log directory: of each range, the offsets below the partition's local log start
    (as it is now) from the remote segments pinned at planning, the rest from the local segments; offsets
    between the pinned remote end and the local log start at planning were in neither place (a consumer
    reads on past them), and offsets the local retention deleted since planning come from the newest
    manifest (:func:`~pylog.spark.remote.pin_newer`)."""
    below: list[OffsetRange] = []
    plain: list[OffsetRange] = []
    local: list[OffsetRange] = []
    for r in ranges:
        tp = (r.topic, r.partition)
        planned = remote.local_starts.get(tp)
        if planned is None or r.size <= 0:
            plain.append(r)
            continue
        cut = min(max(r.start, open_partition(spec.path, r.topic, r.partition).log_start_offset), r.end)
        if cut < r.end:
            local.append(r.part(cut, r.end))
        segments = remote.segments.get(tp, ())
        pinned_end = segments[-1].next_offset if segments else r.start
        if r.start < min(cut, pinned_end):
            below.append(r.part(r.start, min(cut, pinned_end)))
        gone = max(r.start, pinned_end, planned)  # local at planning, deleted locally since
        if gone < cut:
            remote = pin_newer(remote, r.topic, r.partition, gone, cut)
            below.append(r.part(gone, cut))
    if below:
        yield from read_ranges(replace(spec, remote=remote), below)
    if plain:
        yield from read_ranges(replace(spec, remote=None), plain)
    yield from _read_local_tiered(spec, remote, local)


def _read_local_tiered(spec: ReadSpec, remote: RemoteRead, ranges: list[OffsetRange]) -> Iterator[Any]:
    """The local part of tiered ranges, one local segment at a time. The local retention deletes a segment
    only after its upload, so a segment found gone before this task mapped it (deleted after the local log
    start was read) is read from the store, never skipped as data loss; what the store lacks then is data
    loss as ``failOnDataLoss`` says."""
    strict = replace(spec, remote=None, fail_on_data_loss=True)
    for r in ranges:
        view = open_partition(spec.path, r.topic, r.partition)
        cuts = [r.start, *(s.base_offset for s in view.segments if r.start < s.base_offset < r.end), r.end]
        for lo, hi in itertools.pairwise(cuts):
            part = r.part(lo, hi)
            started = False
            try:
                for rb in read_ranges(strict, [part]):
                    started = True
                    yield rb
            except OffsetOutOfRangeError:
                if started:  # a segment once mapped stays readable: not a deletion, a real loss
                    raise
                remote = pin_newer(remote, r.topic, r.partition, lo, hi)
                yield from read_ranges(replace(spec, remote=remote), [part])


def _committed_range(log: LogView, view: PartitionView, rng: OffsetRange, rule: Visibility) -> OffsetRange:
    """:func:`~pylog.spark.committed.committed_range`; of a tiered partition, the offsets below its local log
    start are judged by the batch headers of its pinned remote segments (the decisions are the log
    directory's own, as for its consumer), the rest by the local ones."""
    if not isinstance(view, TieredPartitionView) or rng.start >= min(view.local_log_start_offset, rng.end):
        return committed_range(view, rng, rule)
    cut = min(view.local_log_start_offset, rng.end)
    below = committed_range(log.remote_view(view), rng.part(rng.start, cut), rule)
    if below.end < cut or cut == rng.end:  # a transaction still open below the local log start
        return below
    rest = committed_range(view, rng.part(cut, rng.end), rule)
    return OffsetRange(rng.topic, rng.partition, rng.start, rest.end, below.skipped + rest.skipped)


def _spec(options: Options, schema_json: str, bounds: Bounds, log: LogView) -> ReadSpec:
    remote = None
    if is_url(options.path):
        remote = RemoteRead(options.path, options.remote_storage_options)
    elif log.tiered_url is not None:  # a log directory with tiered topics: their remote segments too
        remote = RemoteRead(log.tiered_url, options.remote_storage_options)
    path = options.path if is_url(options.path) else check_log_dir(options.path)
    return ReadSpec(
        path,
        schema_json,
        options.fail_on_data_loss,
        options.value_format,
        bounds,
        remote,
        log.compacted_topics,
    )


class PylogReader(DataSourceReader):
    """Batch reader: offsets are resolved when the query is planned."""

    def __init__(self, options: Options, schema_json: str) -> None:
        options.check_query(streaming=False)
        self.options = options
        self.schema_json = schema_json
        self.bounds = Bounds()

    def partitions(self) -> list[RangePartition]:
        opts = self.options
        log = opts.log_view()
        spec = _spec(opts, self.schema_json, self.bounds, log)
        opts.check_offset_options(log)
        rule = visibility(log.path) if opts.read_committed else None
        ranges, views = [], []
        for topic, p in opts.topic_partitions(log):
            if not self.bounds.admits_partition(topic, p):
                continue
            view = log.partition(topic, p)
            r = opts.offset_range(view)
            start, end = self.bounds.narrow(r.start, r.end)
            rng = OffsetRange(topic, p, start, end)
            ranges.append(_committed_range(log, view, rng, rule) if rule is not None else rng)
            views.append(view)
        return _partitions(opts, spec, ranges, views)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(partition)


class PylogFilteringReader(PylogReader):
    """The batch reader with filter pushdown (see :mod:`pylog.spark.filters`)."""

    def pushFilters(self, filters: list[Any]) -> list[Any]:
        return push(self.bounds, list(filters))


def make_reader(options: Options, schema_json: str) -> PylogReader:
    """The filtering reader inside Spark's filter-pushdown step, the plain one elsewhere.

    Spark refuses a reader that implements ``pushFilters`` when ``spark.sql.python.filterPushdown.enabled`` is
    false, and the data source cannot read that setting; it can tell which planning step called it."""
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_filename.endswith("data_source_pushdown_filters.py"):
            return PylogFilteringReader(options, schema_json)
        frame = frame.f_back
    return PylogReader(options, schema_json)


class PylogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming reader: per-partition offsets, ``maxOffsetsPerTrigger``, ``minOffsetsPerTrigger`` with
    ``maxTriggerDelay``, ``trigger(availableNow=True)``.

    Subscribed topics that do not exist yet are waited for (a trigger before they exist plans nothing) and
    read from their earliest offset once created, as topics a ``subscribePattern`` matches later.

    ``minOffsetsPerTrigger`` (Kafka's rule): a trigger that finds fewer new offsets than that, summed over
    the partitions, plans no batch, unless ``maxTriggerDelay`` (default 15m) has passed since the last batch
    was planned. The first trigger of a reader always plans a batch, and ``trigger(availableNow=True)``
    reads everything regardless. Time comes from ``clock`` (:class:`pylog.clock.Clock`). Spark keeps one
    stream reader per query for the life of the query, so the time of the last batch lives on it.
    """

    def __init__(self, options: Options, schema_json: str, clock: Clock | None = None) -> None:
        options.check_query(streaming=True)
        self.options = options
        self.schema_json = schema_json
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._target: StreamOffset | None = None
        self._last_trigger_ms: int | None = None

    def initialOffset(self) -> StreamOffset:
        log = self.options.log_view()
        self.options.check_offset_options(log)
        out: dict[tuple[str, int], int] = {}
        for topic, p in self.options.topic_partitions(log, streaming=True):
            out[(topic, p)] = self.options.starting_offset(log.partition(topic, p), streaming=True)
        return _offsets(out)

    def _ends(self) -> dict[tuple[str, int], int]:
        log = self.options.log_view()
        tps = self.options.topic_partitions(log, streaming=True)
        return {tp: log.partition(*tp).log_end_offset for tp in tps}

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = _offsets(self._ends())

    def getDefaultReadLimit(self) -> Any:
        n = self.options.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: StreamOffset, limit: Any) -> StreamOffset:
        ends = self._ends()
        if self._target is not None:
            target = _flat(self._target)
            ends = {tp: min(e, target[tp]) for tp, e in ends.items() if tp in target}
        begins = self._begins(start, ends)
        if self.options.read_committed:  # never past the last stable offset: open transactions come later
            ends = {tp: r.end for tp, r in self._committed(begins, ends).items()}
        if self._delay(begins, ends):
            return _offsets(_flat(start or {}))
        if isinstance(limit, ReadMaxRows):
            ends = _rate_limit(begins, ends, limit.max_rows)
        return _offsets({tp: max(e, begins[tp]) for tp, e in ends.items()})

    def _delay(self, begins: dict[tuple[str, int], int], ends: dict[tuple[str, int], int]) -> bool:
        """``minOffsetsPerTrigger``: whether this trigger is skipped (fewer new offsets than that, and less
        than ``maxTriggerDelay`` since the last batch). Kafka's ``delayBatch``."""
        minimum = self.options.min_offsets_per_trigger
        if not minimum or self._target is not None:
            return False
        now = self.clock.time_ms()
        last = self._last_trigger_ms
        waited = last is None or now - last >= self.options.max_trigger_delay_ms
        if not waited and sum(max(e - begins[tp], 0) for tp, e in ends.items()) < minimum:
            return True
        self._last_trigger_ms = now
        return False

    def _begins(self, start: StreamOffset, tps: Any) -> dict[tuple[str, int], int]:
        """Where each partition starts: its offset in ``start``, or (a new partition) the log start."""
        known = _flat(start or {})
        log = self.options.log_view()
        out = {}
        for tp in tps:
            out[tp] = known[tp] if tp in known else log.partition(*tp).log_start_offset
        return out

    def _committed(
        self, begins: dict[tuple[str, int], int], ends: dict[tuple[str, int], int]
    ) -> dict[tuple[str, int], OffsetRange]:
        """The read_committed view of ``[begins, ends)`` per partition (see :mod:`pylog.spark.committed`)."""
        log = self.options.log_view()
        rule = visibility(log.path)
        return {
            (t, p): _committed_range(log, log.partition(t, p), OffsetRange(t, p, begins[(t, p)], e), rule)
            for (t, p), e in ends.items()
        }

    def partitions(self, start: StreamOffset, end: StreamOffset) -> list[RangePartition]:
        log = self.options.log_view()
        spec = _spec(self.options, self.schema_json, Bounds(), log)
        ends = _flat(end)
        begins = self._begins(start, ends)
        if self.options.read_committed:
            # latestOffset chose ``end`` at or below the LSO: every batch below it is decided for good
            committed = self._committed(begins, ends)
            ranges = [committed[tp] for tp in sorted(ends)]
            for r in ranges:
                if r.end < ends[(r.topic, r.partition)]:
                    raise ConfigError(
                        f"{r.topic}-{r.partition}: the batch ends at offset {ends[(r.topic, r.partition)]}, past "
                        f"the last stable offset {r.end} (its end offset was not chosen by a read_committed "
                        "read: a checkpoint of a read_uncommitted query?); use a new checkpoint location"
                    )
        else:
            ranges = [OffsetRange(t, p, begins[(t, p)], e) for (t, p), e in sorted(ends.items())]
        views = [log.partition(r.topic, r.partition) for r in ranges if r.size > 0]
        return _partitions(self.options, spec, ranges, views)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(partition)

    def commit(self, end: StreamOffset) -> None:
        """Nothing to do: the source keeps no state of its own (the log is never written by readers)."""


def _offsets(flat: dict[tuple[str, int], int]) -> StreamOffset:
    """``{(t, p): o}`` as ``{"t": {"p": o}}`` with keys in sorted string order."""
    nested: dict[str, dict[str, int]] = {}
    for (topic, p), off in flat.items():
        nested.setdefault(topic, {})[str(p)] = int(off)
    return {t: dict(sorted(parts.items())) for t, parts in sorted(nested.items())}


def _flat(offsets: StreamOffset | str) -> dict[tuple[str, int], int]:
    if isinstance(offsets, str):
        offsets = dict(json.loads(offsets))
    return {(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}


def _rate_limit(
    begins: dict[tuple[str, int], int], ends: dict[tuple[str, int], int], limit: int
) -> dict[tuple[str, int], int]:
    """Kafka's rule: share ``limit`` records between partitions in proportion to what each has to read."""
    sizes = {tp: max(ends[tp] - begins[tp], 0) for tp in ends}
    total = sum(sizes.values())
    if total <= limit:
        return ends
    out = {}
    for tp, size in sizes.items():
        prorate = limit * (size / total)
        step = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        out[tp] = min(begins[tp] + step, ends[tp])
    return out
