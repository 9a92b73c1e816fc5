"""Consumer: assign/subscribe, poll, seek and position, with kafka-python's API and semantics.

``position(tp)`` is the next offset to return. ``seek``/``seek_to_beginning``/``seek_to_end`` are lazy: they
take effect at the next fetch. A position outside ``[log_start_offset, log_end_offset]`` (for example after
retention deleted the records) is reset according to ``auto_offset_reset`` (``"earliest"``, ``"latest"``) or
raises :class:`~pylog.errors.OffsetOutOfRangeError` (``"none"``), also when records already fetched (by a
consumer paused or slow) were deleted before being returned: records below the log start are never returned.

A consumer sees records appended by other threads and other processes as soon as their batch is published;
``poll(timeout_ms=...)`` waits for new data on the doorbells of its partitions (:mod:`pylog.partition.doorbell`):
a writer's publish, in any process, wakes it at once; with an injected clock other than the system clock it
sleeps through ``clock.sleep`` instead, so a manual clock never blocks.

Without ``group_id``, ``subscribe()`` (or topics given to the constructor) assigns every partition of the
matching topics to this consumer, and picks up partitions and topics created later. A subscribed topic that
is deleted (by any process) leaves the assignment, with or without a group; a partition given to ``assign()``
whose topic was deleted is an :class:`~pylog.errors.UnknownTopicError` from ``poll()``. Settings are checked
when the consumer is created (:mod:`pylog.consumer_config`).

Thread-safety: not thread-safe (like Kafka's consumer): use one consumer per thread.
"""

from __future__ import annotations

import contextlib
import gc
import math
import re
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar

from pylog.clock import SystemClock
from pylog.consumer_config import consumer_configs
from pylog.deadletter import DeadLetters
from pylog.errors import (
    ConfigError,
    IllegalArgumentError,
    IllegalStateError,
    InvalidOffsetError,
    InvalidTimestampError,
    LogClosedError,
    PylogError,
    StorageError,
    UnknownPartitionError,
    UnknownTopicError,
)
from pylog.fetcher import Fetcher
from pylog.future import Future
from pylog.groups.member import GroupMember, topic_names
from pylog.metrics import Sensor
from pylog.partition.doorbell import Doorbell, Doorbells
from pylog.record import DecodedBatch
from pylog.structs import (
    ConsumerGroupMetadata,
    ConsumerRecord,
    OffsetAndTimestamp,
    TopicPartition,
)
from pylog.subscription import Subscription

if TYPE_CHECKING:
    from pylog.directory import LogDirectory
    from pylog.partition.log import PartitionLog

__all__ = ["Consumer"]

_T = TypeVar("_T")
_MAX_TIMESTAMP = (1 << 63) - 1
_GROUP_WAIT_S = 0.01  # longest doorbell wait of a group member between looks at the group
_OFFSET = attrgetter("offset")


class Consumer:
    """Reads records from a :class:`~pylog.Log`. Obtain with :meth:`pylog.Log.consumer`; ``settings`` are
    kafka-python's (or Kafka's) consumer settings, listed and checked by :mod:`pylog.consumer_config`.

    Its parts: a :class:`~pylog.subscription.Subscription` (what it reads and where), shared with its
    :class:`~pylog.groups.member.GroupMember` when it has a ``group_id``, and a :class:`~pylog.fetcher.Fetcher`
    (position -> records); this class keeps the records fetched and not yet returned, one buffer per partition."""

    def __init__(self, log: LogDirectory, *topics: str, **settings: Any) -> None:
        self.config, group = consumer_configs(settings)
        for name in topics:  # before anything is created: a consumer of a missing topic leaves no trace
            log.topic(name)
        self.log = log
        self._sub = Subscription()
        self._sub.bind(self._drop_buffer, self._consumed_position)
        self._buffers: dict[TopicPartition, _Buffer] = {}
        self._current: _Buffer | None = None  # where next() takes records from without a poll
        self._dead_letters = DeadLetters(
            log, self.config.dead_letter_topic, self.config.on_deserialization_error
        )
        self._fetcher = Fetcher(log, self._sub, self.config, self._dead_letters, self._committed_position)
        self._bells = Doorbells()
        self._next_meta_check = 0.0
        self._rr = 0
        self._closed = False
        self._fetched = Sensor(log.clock.monotonic_ms())  # records per fetch into the buffers (metrics())
        self._dropped = 0  # records fetched and dropped unreturned (a seek, a pause, a revocation)
        self._group: GroupMember | None = None
        if self.config.group_id is not None:
            self._group = GroupMember(log, self._sub, self.config.group_id, group)
        if topics:
            try:
                self.subscribe(list(topics))
            except BaseException:
                self.close(autocommit=False)  # refused by the group: release what was opened
                raise

    @property
    def group_id(self) -> str | None:
        return self.config.group_id

    @property
    def consumer_timeout_ms(self) -> float:
        return self.config.consumer_timeout_ms

    # -- assignment -------------------------------------------------------------------------------------

    def _check(self) -> None:
        if self._closed:
            raise LogClosedError("the consumer is closed")
        self.log.check_open()

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Manually assign partitions (no group management). Replaces the previous assignment."""
        self._check()
        if self._sub.subscribed:
            raise IllegalStateError("assign() cannot be mixed with subscribe(); call unsubscribe() first")
        tps = [_topic_partition(tp) for tp in partitions]
        for tp in tps:
            self._plog(tp)
        self._sub.assign(tps)

    def assignment(self) -> set[TopicPartition]:
        return set(self._sub.assigned)

    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None, listener: Any = None) -> None:
        """Subscribe to topics (or a regex ``pattern``). Without a group, every partition is assigned."""
        self._check()
        if isinstance(topics, str):
            topics = [topics]
        topics = list(topics)
        if topics and pattern is not None:
            raise IllegalStateError("subscribe() takes topics or a pattern, not both")
        if not topics and pattern is None:
            raise ConfigError(
                "subscribe() needs topics (a list of topic names) or pattern= (a regular expression matching "
                "whole topic names); to stop consuming, call unsubscribe()"
            )
        for name in topics:
            self.log.topic(name)
        try:
            compiled = re.compile(pattern) if pattern is not None else None
        except (re.error, TypeError) as exc:
            raise ConfigError(f"pattern must be a valid regular expression, got {pattern!r}: {exc}") from exc
        previous = self._sub.subscribe(topics, compiled, listener)
        if self._group is None:
            self._update_subscription_assignment(force=True)
            return
        try:
            self._group.subscribe()
        except BaseException:  # a subscription the group refuses leaves the consumer as it was
            self._sub.restore(previous)
            raise

    def subscription(self) -> set[str]:
        """The subscribed topics: the names given to ``subscribe()``, or the existing topics its pattern
        matches now."""
        if self._sub.pattern is not None:
            return set(self._subscribed_topics())
        return set(self._sub.topics)

    def unsubscribe(self) -> None:
        if self._group is not None:
            self._group.unsubscribe()
        self._sub.unsubscribe()
        self._sub.revoke_all()

    def _subscribed_topics(self) -> list[str]:
        pattern = self._sub.pattern
        if pattern is None:
            return sorted(self._sub.topics)
        return [t for t in topic_names(self.log) if pattern.fullmatch(t)]

    def _update_subscription_assignment(self, force: bool = False) -> None:
        now = self.log.clock.monotonic_ms()
        if not force and now < self._next_meta_check:
            return
        self._next_meta_check = now + 500
        if not self._sub.subscribed:
            return
        existing = set(topic_names(self.log))  # a subscribed topic deleted since leaves the assignment
        tps = []
        for name in self._subscribed_topics():
            if name in existing:
                with contextlib.suppress(UnknownTopicError):
                    tps.extend(self.log.topic(name).partitions())
        if tps != self._sub.assigned:
            self._sub.assign(tps)

    def _guarded(self, tp: TopicPartition, read: Callable[[], _T]) -> _T:
        """Run ``read`` (a read of ``tp``), turning files that vanished under it into the typed error of what
        happened: the topic or the partition was deleted (by another Log object or process)."""
        try:
            return read()
        except (FileNotFoundError, LogClosedError) as exc:
            if self.log.closed or self._closed:
                raise
            raise self._vanished(tp, exc) from exc

    def _vanished(self, tp: TopicPartition, exc: Exception) -> Exception:
        if tp.topic not in topic_names(self.log):
            return UnknownTopicError(f"topic {tp.topic!r} was deleted while this consumer read it")
        if tp.partition >= self.log.topic(tp.topic).num_partitions:
            return UnknownPartitionError(f"partition {tp.partition} of topic {tp.topic!r} no longer exists")
        if isinstance(exc, LogClosedError):
            return exc
        return StorageError(f"cannot read {tp.topic}-{tp.partition}: {exc}")

    def _skip_vanished(self, tp: TopicPartition, exc: Exception) -> None:
        """A subscribed topic or partition that no longer exists is skipped: it leaves the assignment at the
        next metadata check (without a group) or rebalance (with one), as in Kafka. Under ``assign()`` the
        error is raised: the caller chose the partition."""
        if not self._sub.subscribed:
            raise exc
        self._sub.seek(tp, None)  # a topic created again under this name starts from its own offsets
        self._next_meta_check = 0.0
        if self._group is not None:
            self._group.check_topics()

    # -- positions --------------------------------------------------------------------------------------

    def _plog(self, tp: TopicPartition) -> PartitionLog:
        return self._fetcher.plog(tp)

    def _require(self, tp: TopicPartition) -> TopicPartition:
        tp = _topic_partition(tp)
        if not self._sub.is_assigned(tp):
            raise IllegalStateError(f"{tp} is not assigned to this consumer")
        return tp

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Fetch from ``offset`` next (validated at the next fetch). A seek to a record the consumer still
        holds from its last fetch of the partition (returned already, or not yet) returns it next without
        fetching again: going back to a record to process it again costs nothing."""
        tp = self._require(partition)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidOffsetError(f"offset must be an int >= 0, got {offset!r}")
        if not self._seek_in_buffer(tp, offset):
            self._sub.seek(tp, offset)

    def _seek_in_buffer(self, tp: TopicPartition, offset: int) -> bool:
        """Move the fetched buffer of ``tp`` to the record at ``offset`` when it holds it (a walk in progress
        ends and the next one starts there). What the fetch met after the buffer (a record the "raise"
        policy stopped at, a damaged batch) is kept: it comes again after these records."""
        buf = self._buffers.get(tp)
        if buf is None:
            return False
        recs = buf.recs
        i = bisect_left(recs, offset, key=_OFFSET)
        if i >= len(recs) or recs[i].offset != offset:
            return False
        buf.halt()
        buf.i = i
        return True

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        for tp in partitions or tuple(self._sub.assigned):
            tp = self._require(tp)
            self._sub.seek(tp, self._plog(tp).log_start_offset)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        for tp in partitions or tuple(self._sub.assigned):
            tp = self._require(tp)
            self._sub.seek(tp, self._plog(tp).log_end_offset)

    def position(self, partition: TopicPartition, timeout_ms: float | None = None) -> int:
        """The offset of the next record this consumer will return for ``partition``. ``timeout_ms`` is
        kafka-python's; nothing here waits for a network, so it bounds nothing."""
        _check_timeout(timeout_ms)
        tp = self._require(partition)
        pos = self._sub.positions[tp]
        if pos is None:
            pos = self._fetcher.reset_position(tp)
        buf = self._buffers.get(tp)
        if buf is None:
            return pos
        buf.settle()
        return buf.recs[buf.i].offset if buf.i < len(buf.recs) else pos

    def _consumed_position(self, tp: TopicPartition) -> int | None:
        """The subscription's ``consumed`` hook: ``position(tp)``, or None while nothing set or fetched one."""
        if self._sub.positions.get(tp) is None and tp not in self._buffers:
            return None
        return self.position(tp)

    def _committed_position(self, tp: TopicPartition) -> int | None:
        """Where a partition without a position starts when the group has committed an offset for it."""
        return self._group.committed_position(tp) if self._group is not None else None

    def _drop_buffer(self, tp: TopicPartition) -> None:
        """Forget records fetched but not returned for ``tp`` (after a seek, a pause or a revocation)."""
        buf = self._buffers.pop(tp, None)
        if buf is not None:
            buf.halt()
            self._dropped += len(buf.recs) - buf.i
        self._fetcher.poison.pop(tp, None)
        self._fetcher.pending.pop(tp, None)
        self._current = None

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop returning records of ``partitions`` until :meth:`resume` (the assignment is kept). Every
        argument is checked before any is paused: not a TopicPartition is an
        :class:`~pylog.errors.IllegalArgumentError` (a ``TypeError``), one not assigned an
        :class:`~pylog.errors.IllegalStateError`."""
        tps = [_topic_partition(tp) for tp in partitions]
        self._sub.paused.update([self._require(tp) for tp in tps])
        if self._current is not None:
            self._current.halt()
        self._current = None

    def resume(self, *partitions: TopicPartition) -> None:
        """Return records of ``partitions`` again; not a TopicPartition is an
        :class:`~pylog.errors.IllegalArgumentError` (a ``TypeError``), checked before any is resumed."""
        for tp in [_topic_partition(tp) for tp in partitions]:
            self._sub.paused.discard(tp)

    def paused(self) -> set[TopicPartition]:
        return set(self._sub.paused)

    # -- metadata ---------------------------------------------------------------------------------------

    def topics(self) -> set[str]:
        return set(topic_names(self.log))

    def partitions_for_topic(self, topic: str) -> set[int]:
        """The partition numbers of ``topic``; an empty set for a topic that does not exist (as kafka-python)."""
        if topic not in topic_names(self.log):
            return set()
        try:
            return set(range(self.log.topic(topic).num_partitions))
        except UnknownTopicError:  # deleted meanwhile
            return set()

    def highwater(self, partition: TopicPartition) -> int:
        """The offset the next record appended to ``partition`` (assigned to this consumer) will get: its log
        end offset, always known here (kafka-python: the last one a fetch reported, None before any)."""
        tp = self._require(partition)
        return self._plog(tp).log_end_offset

    def beginning_offsets(
        self, partitions: Iterable[TopicPartition], timeout_ms: float | None = None
    ) -> dict[TopicPartition, int]:
        _check_timeout(timeout_ms)
        return {tp: self._plog(tp).log_start_offset for tp in map(_topic_partition, partitions)}

    def end_offsets(
        self, partitions: Iterable[TopicPartition], timeout_ms: float | None = None
    ) -> dict[TopicPartition, int]:
        _check_timeout(timeout_ms)
        return {tp: self._plog(tp).log_end_offset for tp in map(_topic_partition, partitions)}

    def offsets_for_times(
        self, timestamps: dict[TopicPartition, int], timeout_ms: float | None = None
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """For each partition the earliest offset whose timestamp is >= the given one, or None."""
        _check_timeout(timeout_ms)
        out: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        for tp, ts in timestamps.items():
            if isinstance(ts, bool) or not isinstance(ts, int) or not 0 <= ts <= _MAX_TIMESTAMP:
                raise InvalidTimestampError(
                    f"timestamp for {tp!r} must be an int of milliseconds in 0 .. 2**63-1, got {ts!r}"
                )
            tp = _topic_partition(tp)
            hit = self._plog(tp).offset_for_time(ts)
            out[tp] = None if hit is None else OffsetAndTimestamp(*hit)
        return out

    # -- fetching ---------------------------------------------------------------------------------------

    def poll(
        self, timeout_ms: float = 0, max_records: int | None = None, update_offsets: bool = True
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records from assigned, unpaused partitions: ``{TopicPartition: [ConsumerRecord, ...]}``.

        Waits up to ``timeout_ms`` for at least one record."""
        self._check()
        limit = self.config.max_poll_records if max_records is None else max_records
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError(f"max_records must be an int >= 1, got {max_records!r}")
        return self._until_data(partial(self._collect, limit, update_offsets), timeout_ms)

    def _until_data(
        self, attempt: Callable[[], dict[TopicPartition, _T]], timeout_ms: float
    ) -> dict[TopicPartition, _T]:
        """Run ``attempt`` (one look for records) until it returns some or ``timeout_ms`` has passed.

        Between attempts, with the system clock, the consumer sleeps on the doorbells of the partitions it
        reads (:mod:`pylog.partition.doorbell`): a publish in any process wakes it at once, and no attempt runs
        while nothing was published. The marks are read before the attempt that precedes each wait, so a
        publish in between is never missed. With another clock (a test's ManualClock), or where the doorbell
        cannot be used, it spins briefly and then calls ``clock.sleep`` with a growing pause: a manual clock
        never blocks for real."""
        clock = self.log.clock
        deadline = clock.monotonic_ms() + _wait_ms(timeout_ms)
        doorbell = type(clock) is SystemClock and not self.log.read_only
        marks: list[tuple[Doorbell, int]] | None = None
        spins = 0
        while True:
            if self._group is not None:
                self._group.poll()
            else:
                self._update_subscription_assignment()
            out = attempt()
            if out or self._closed:
                return out
            now = clock.monotonic_ms()
            if now >= deadline:
                return out
            if doorbell:
                if marks is not None:
                    wait_s = (deadline - now) / 1000
                    if self._group is not None:  # a rebalance rings no doorbell: look at the group often
                        wait_s = min(wait_s, _GROUP_WAIT_S)
                    self._bells.wait(marks, wait_s)
                marks = self._marks()
                if marks is not None:
                    continue
            spins += 1
            if spins > 200:
                clock.sleep(min(0.001 * (spins - 200) / 50, 0.005, (deadline - now) / 1000))

    def _marks(self) -> list[tuple[Doorbell, int]] | None:
        """The doorbells of the fetchable partitions with their marks, or None (then sleep in a loop)."""
        directories = []
        for tp in self._sub.fetchable():
            try:
                directories.append(self._plog(tp).directory)
            except (PylogError, OSError):
                return None
        return self._bells.marks(directories)

    def _collect(self, limit: int, update: bool) -> dict[TopicPartition, list[ConsumerRecord]]:
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        poisoned = self._fetcher.poison
        remaining = limit
        for tp in self._rotated(self._sub.fetchable()):
            buf = self._buffers.get(tp)
            if buf is not None:
                buf.halt()
                if buf.i < len(buf.recs) and self._deleted_since_fetched(buf):
                    buf = None
            if buf is None or buf.i >= len(buf.recs):
                error = poisoned.get(tp) or self._fetcher.pending.get(tp)
                if error is not None:
                    if out:
                        continue  # return what is ready; the next poll raises
                    self._fetcher.pending.pop(tp, None)
                    raise error
                try:
                    buf = self._refill(tp)
                except (UnknownTopicError, UnknownPartitionError) as exc:
                    self._skip_vanished(tp, exc)
                    continue
                except PylogError as exc:
                    if not out:
                        raise
                    # the records taken from other partitions are returned (their positions moved past
                    # them); this error is raised by the next poll
                    self._fetcher.pending[tp] = exc
                    continue
                if buf is None:
                    if tp in poisoned and not out:
                        raise poisoned[tp]
                    continue
            take = buf.recs[buf.i : buf.i + remaining]
            if update:
                buf.i += len(take)
            out[tp] = take
            remaining -= len(take)
            if remaining <= 0:
                break
        return out

    def _deleted_since_fetched(self, buf: _Buffer) -> bool:
        """Whether the next record of ``buf`` is below the log start now (retention or ``delete_records``
        deleted it after the fetch, while the consumer was paused or slow). Then the buffer is dropped and the
        position left on that record, outside the log: the next fetch resets it by ``auto_offset_reset``
        (or raises OffsetOutOfRangeError under ``"none"``), as for any position below the log start. Records
        below the log start are never returned."""
        offset = buf.recs[buf.i].offset
        try:
            if offset >= buf.plog.log_start_offset:
                return False
        except (OSError, PylogError):
            return False  # the partition vanished (its topic was deleted): the next fetch says so
        self._drop_buffer(buf.tp)
        self._sub.positions[buf.tp] = offset
        return True

    def _rotated(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        """``tps`` starting one further at each call, so that every partition is first in turn: one that
        keeps raising (a damaged batch) cannot keep the others from being read."""
        if not tps:
            return tps
        start = self._rr % len(tps)
        self._rr += 1
        return tps[start:] + tps[:start]

    def _refill(self, tp: TopicPartition) -> _Buffer | None:
        """Fetch the next records of ``tp`` into a new buffer (None when there are none), replacing the old one.

        The cyclic garbage collector is paused meanwhile, and the old buffer is freed before it resumes: a
        fetch allocates thousands of records (tracked tuples that cannot form cycles), so otherwise the first
        allocation after the fetch would start a collection that walks all of them; freed in the same pause,
        the old records give back the allocation count the new ones took (when the caller kept none of them),
        and no collection is due."""
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            recs = self._guarded(tp, partial(self._fetcher.fetch, tp))
            old = self._buffers.pop(tp, None)
            if old is not None and self._current is old:
                self._current = None
            del old
            if not recs:
                return None
            self._fetched.record(len(recs), self.log.clock.monotonic_ms())
            buf = self._buffers[tp] = _Buffer(tp, recs, self._plog(tp))
            return buf
        finally:
            if paused:
                gc.enable()

    def dead_letter(self, record: ConsumerRecord, error: BaseException) -> None:
        """Send ``record`` (one this consumer returned) to ``dead_letter_topic`` with ``error`` in its headers:
        its stored key, value and headers, byte for byte (see :mod:`pylog.deadletter`)."""
        self._check()
        if not isinstance(record, ConsumerRecord):
            raise ConfigError(f"dead_letter() takes a ConsumerRecord, got {type(record).__name__}")
        tp = TopicPartition(record.topic, record.partition)
        raw = self._fetcher.raw_record(tp, record.offset)
        self._dead_letters.send(
            tp.topic, tp.partition, record.offset, record.timestamp, raw, error, "processing"
        )

    def metrics(self, raw: bool = False) -> dict[Any, Any]:
        """kafka-python's shape, ``{group: {name: value}}`` (``raw=True``: ``{(group, name): value}``):

        * ``consumer-fetch-manager-metrics``: ``records-consumed-total`` (records returned by ``poll()`` and
          iteration), ``records-consumed-rate`` (records fetched for them per second over the last 30 s),
          ``fetch-total``, ``fetch-rate``, ``records-per-request-avg`` (records per fetch), ``records-lag-max``
          (the largest :meth:`lag` now of an assigned partition that has a position; ``-inf`` with none);
        * ``consumer-coordinator-metrics``: ``assigned-partitions``;
        * ``consumer-deserialization-metrics``: ``records-skipped-total``, ``records-dead-lettered-total`` (by
          ``on_deserialization_error``, and ``dead_letter()``).

        ``poll_arrow()`` reads are not counted."""
        now = self.log.clock.monotonic_ms()
        fetched = self._fetched
        waiting = 0
        for buf in self._buffers.values():
            buf.settle()
            waiting += len(buf.recs) - buf.i
        lags = []
        if not self._closed and not self.log.closed:
            for tp in self._sub.assigned:
                pos = self._consumed_position(tp)  # None: no position yet (none is chosen here)
                if pos is not None:
                    plog = self._plog(tp)
                    lags.append(max(plog.log_end_offset - max(pos, plog.log_start_offset), 0))
        out: dict[str, dict[str, float]] = {
            "consumer-fetch-manager-metrics": {
                "records-consumed-total": float(fetched.total - self._dropped - waiting),
                "records-consumed-rate": fetched.rate(now),
                "fetch-total": float(fetched.events),
                "fetch-rate": fetched.event_rate(now),
                "records-per-request-avg": fetched.avg(now),
                "records-lag-max": float(max(lags, default=float("-inf"))),
            },
            "consumer-coordinator-metrics": {"assigned-partitions": float(len(self._sub.assigned))},
            "consumer-deserialization-metrics": {
                "records-skipped-total": float(self._dead_letters.skipped),
                "records-dead-lettered-total": float(self._dead_letters.sent),
            },
        }
        if raw:
            return {(group, name): v for group, values in out.items() for name, v in values.items()}
        return out

    def bootstrap_connected(self) -> bool:
        """kafka-python's check of its broker connection: True while this consumer and its log are open."""
        return not self._closed and not self.log.closed

    def poll_arrow(
        self, timeout_ms: float = 0, max_bytes: int | None = None, include_headers: bool = False
    ) -> dict[TopicPartition, Any]:
        """Like :meth:`poll` but returns one ``pyarrow.RecordBatch`` per partition, built from the stored
        columns without a Python loop per record (schema: :func:`pylog.arrow.arrow_schema`). Keys and values
        are the stored bytes (no deserializer runs). Reads up to ``max_bytes`` per partition (default
        ``max_partition_fetch_bytes``)."""
        from pylog.arrow import batches_to_arrow

        self._check()
        limit = self.config.max_partition_fetch_bytes if max_bytes is None else max_bytes

        def attempt() -> dict[TopicPartition, Any]:
            out: dict[TopicPartition, Any] = {}
            pending = self._fetcher.pending
            for tp in self._rotated(self._sub.fetchable()):
                if tp in pending:
                    if out:
                        continue  # the next poll raises it
                    raise pending.pop(tp)
                try:
                    batches, start = self._guarded(tp, partial(self._arrow_batches, tp, limit))
                except (UnknownTopicError, UnknownPartitionError) as exc:
                    self._skip_vanished(tp, exc)
                    continue
                except PylogError as exc:
                    if not out:
                        raise
                    pending[tp] = exc  # the batches of the other partitions are returned first
                    continue
                if not batches:
                    continue
                rb = batches_to_arrow(
                    tp.topic, tp.partition, batches, start_offset=start, include_headers=include_headers
                )
                self._sub.positions[tp] = batches[-1].header.next_offset
                if rb.num_rows:
                    out[tp] = rb
            return out

        return self._until_data(attempt, timeout_ms)

    def _arrow_batches(self, tp: TopicPartition, limit: int) -> tuple[list[DecodedBatch], int]:
        """The visible batches from the position of ``tp`` (which moves past aborted ones), and that position."""
        self._sub.seek(tp, self.position(tp))
        return self._fetcher.visible_batches(tp, limit)

    # -- iteration --------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """What ``for record in consumer`` runs: ``next()`` semantics (one record at a time, ending after
        ``consumer_timeout_ms`` without one). ``chain`` walks each fetched buffer with a C list iterator, so
        no Python code runs per record."""
        return chain.from_iterable(self._runs(self.consumer_timeout_ms))

    def _runs(self, wait: float) -> Iterator[Iterable[ConsumerRecord]]:
        """The buffers to walk, one after the other. The consumer's position (and so what a commit takes)
        follows the walk record by record (see :class:`_Buffer`): it never passes a record not yet handed
        to the caller, wherever the caller stops."""
        while True:
            buf = self._current
            if buf is not None and (self._group is None or not self._group.wants_poll):
                buf.settle()
                if buf.i < len(buf.recs) and not self._deleted_since_fetched(buf):
                    yield buf.walk()
                    buf.settle()
            buf = None  # the next fetch frees the records walked (see _refill)
            try:
                rec = self._next(wait)
            except StopIteration:
                return
            yield (rec,)

    def __next__(self) -> ConsumerRecord:
        return self._next(self.consumer_timeout_ms)

    def _next(self, wait: float) -> ConsumerRecord:
        # Fast path: the next record of the partition the last call took from, as long as nothing (a seek,
        # a pause, a rebalance the group has pending) asks for a full poll.
        buf = self._current
        if buf is not None and (self._group is None or not self._group.wants_poll):
            buf.halt()
            if buf.i < len(buf.recs):
                rec = buf.recs[buf.i]
                buf.i += 1
                return rec
        buf = None  # the poll frees the records returned (see _refill)
        got = self.poll(timeout_ms=wait, max_records=1)
        if not got:
            raise StopIteration
        ((tp, recs),) = got.items()
        self._current = self._buffers.get(tp)
        return recs[0]

    def iterate(self, timeout_ms: float | None = None) -> Iterator[ConsumerRecord]:
        """Yield records until none arrives for ``timeout_ms`` (default ``consumer_timeout_ms``). Like
        ``for record in consumer``, it walks each fetched buffer without Python code per record (much faster
        than calling ``next()``), and the position follows what it has yielded."""
        wait = self.consumer_timeout_ms if timeout_ms is None else timeout_ms
        return chain.from_iterable(self._runs(wait))

    # -- groups and lifecycle ---------------------------------------------------------------------------

    def commit(
        self, offsets: dict[TopicPartition, Any] | None = None, timeout_ms: float | None = None
    ) -> None:
        """Commit ``offsets`` (default: the position of every assigned partition) durably: returns after the
        fsync. ``timeout_ms`` is kafka-python's, and bounds nothing here (no network to wait for)."""
        _check_timeout(timeout_ms)
        if self._group is None:
            raise IllegalStateError("commit() needs a group_id")
        self._group.commit(offsets)

    def commit_async(self, offsets: dict[TopicPartition, Any] | None = None, callback: Any = None) -> Future:
        """Commit in the background, as kafka-python does: returns a :class:`~pylog.future.Future` that the
        committing thread resolves (value None, or the commit's error). ``callback(offsets, exception_or_None)``
        runs on this thread in a later ``poll()``, ``commit()`` or ``close()``; a commit's errors reach it and
        the future, and are not raised here (only a consumer without ``group_id`` raises
        :class:`~pylog.errors.IllegalStateError`, and a closed one :class:`~pylog.errors.LogClosedError`)."""
        if self._group is None:
            raise IllegalStateError("commit_async() needs a group_id")
        return self._group.commit_async(offsets, callback)

    def group_metadata(self) -> ConsumerGroupMetadata:
        """This consumer's group membership now, for ``producer.send_offsets_to_transaction(offsets,
        consumer.group_metadata())``: the transaction's offsets are then committed only if this member is still
        in that generation of the group (else :class:`~pylog.errors.CommitFailedError`). Without a
        ``group_id``: ``ConsumerGroupMetadata(group_id=None)``, as kafka-python."""
        if self._group is None:
            return ConsumerGroupMetadata(group_id=None)
        return self._group.group_metadata()

    def committed(
        self, partition: TopicPartition, metadata: bool = False, timeout_ms: float | None = None
    ) -> Any:
        """The group's committed offset for ``partition`` (the next offset to read), or None; with
        ``metadata=True`` an :class:`OffsetAndMetadata`."""
        _check_timeout(timeout_ms)
        if self._group is None:
            raise IllegalStateError("committed() needs a group_id")
        tp = _topic_partition(partition)
        return self._group.committed_metadata(tp) if metadata else self._group.committed(tp)

    def lag(self) -> dict[TopicPartition, int]:
        """Records between this consumer's position and the log end, per assigned partition; from the log
        start when the position is below it (records deleted since are not counted)."""
        self._check()
        out = {}
        for tp in self._sub.assigned:
            plog = self._plog(tp)
            out[tp] = max(plog.log_end_offset - max(self.position(tp), plog.log_start_offset), 0)
        return out

    def close(self, autocommit: bool = True, timeout_ms: float | None = None) -> None:
        """Leave the group (committing the positions first with ``autocommit`` and ``enable_auto_commit``)
        and release what the consumer holds. ``timeout_ms`` is kafka-python's and bounds nothing here."""
        _check_timeout(timeout_ms)
        if self._closed:
            return
        try:
            if self._group is not None and not self.log.closed:
                self._group.close(autocommit)
        finally:
            self._closed = True
            if self._current is not None:
                self._current.halt()
            self._current = None
            self._bells.close()
            self._dead_letters.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Buffer:
    """Records fetched for one partition; ``recs[i:]`` are not returned yet.

    ``for record in consumer`` walks ``recs`` from ``i`` with a C list iterator (no Python code per record);
    its progress is folded back into ``i`` by :meth:`settle`, which every reader of ``i`` calls first, and
    :meth:`halt` ends such a walk early (a seek, a pause, a revocation, close) by moving the iterator to the
    end of the list (``list_iterator.__setstate__``), without copying or changing ``recs``."""

    __slots__ = ("_it", "i", "plog", "recs", "tp")

    def __init__(self, tp: TopicPartition, recs: list[ConsumerRecord], plog: PartitionLog) -> None:
        self.tp = tp
        self.plog = plog  # the partition read (its log start is checked before records are returned)
        self.recs = recs
        self.i = 0
        self._it: Any = None  # a list_iterator over recs while a walk is in progress

    def settle(self) -> None:
        it = self._it
        if it is not None:
            self.i = len(self.recs) - it.__length_hint__()

    def walk(self) -> Iterator[ConsumerRecord]:
        self.halt()
        it: Any = iter(self.recs)
        it.__setstate__(self.i)
        self._it = it
        return it  # type: ignore[no-any-return]

    def halt(self) -> None:
        it = self._it
        if it is not None:
            self.settle()
            self._it = None
            it.__setstate__(len(self.recs))  # a walk in progress ends at its next step


def _wait_ms(timeout_ms: object) -> float:
    """A poll's ``timeout_ms`` as a number of milliseconds >= 0; a negative one is a ConfigError (a
    ``ValueError``, as kafka-python raises)."""
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int | float) or math.isnan(timeout_ms):
        raise ConfigError(
            f"timeout_ms must be an int or float (float('inf') waits forever), got {timeout_ms!r}"
        )
    if timeout_ms < 0:
        raise ConfigError(f"timeout_ms must not be negative, got {timeout_ms!r}")
    return float(timeout_ms)


def _check_timeout(timeout_ms: object) -> None:
    """kafka-python's ``timeout_ms`` argument of a call that waits for no network here: None or a number >= 0."""
    if timeout_ms is None:
        return
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int | float) or not timeout_ms >= 0:
        raise ConfigError(f"timeout_ms must be None or a number >= 0, got {timeout_ms!r}")


def _topic_partition(value: Any) -> TopicPartition:
    """``value`` (a TopicPartition, or a ``(topic, partition)`` pair) as a TopicPartition; anything else is an
    :class:`~pylog.errors.IllegalArgumentError` (a ``TypeError``, as kafka-python raises)."""
    try:
        topic, partition = value
    except (TypeError, ValueError):
        raise IllegalArgumentError(f"not a TopicPartition(topic, partition): {value!r}") from None
    if type(topic) is not str or type(partition) is not int:
        raise IllegalArgumentError(f"not a TopicPartition(topic: str, partition: int): {value!r}")
    return TopicPartition(topic, partition)
