"""The record accumulator: the producer's per-topic queues, and their drain into batches.

``Producer.send`` adds each record to its topic's queue without a lock; a drain takes a topic's whole queue,
partitions the records in bulk (murmur2 vectorized with numpy), cuts them into batches (framing and CRC in
:mod:`pylog.batching` / :mod:`pylog.record`) and appends them, per partition in the order they were sent. A
drain of a few records that fit one batch (a caller waiting on each send) takes a path without numpy, whose
per-call cost would be most of the drain's: the scalar murmur2, one batch per partition the records go to.
Drains run under one lock, which keeps the queues of a topic in order; with ``acks="all"`` the fsync that makes
a drain durable runs after that lock is released, so that drains of other threads append meanwhile and the
partition's next fsync covers them all (group commit, in :meth:`PartitionLog.flush`).

How a record is queued without a lock (the GIL makes ``list.append`` and an attribute store atomic): a topic's
:class:`TopicQueue` holds its current :class:`QueuedRecords`, whose ``records`` list ``send`` appends to. A
drain installs a new one, *then* marks the old one ``sealed``, *then* takes a copy of its list (``taken``; the
list itself is never replaced, so a late append cannot land in the copy). A sender that appended to the old
list checks ``sealed`` after its append: if it reads False its record was appended before the seal, hence
before the copy, and is drained; if it reads True it takes the drain lock (the copy is made by then) and,
should its record have missed the copy, queues it again in the current queue (:meth:`settle`).

Each record is a tuple, ``(key, value)`` or ``(key, value, timestamp, headers, partition)`` for a record with
options of its own; its future (the producer's) holds the queue and the record, and finds the record's index in
the drained list by identity, only when asked. A record holds nothing but bytes and ints, so that the garbage
collector stops tracking it at its first pass: a queue of a million records costs the collector nothing.

Delivery contract: every queued record ends written (its offset set) or failed; a failed queue is kept until
:meth:`RecordAccumulator.take_failed` hands it to the producer, which raises what nobody saw through a future.

Thread-safety: thread-safe. Records may be queued from any number of threads; drains serialize on the drain
lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from pylog.batching import (
    PER_RECORD,
    PER_RECORD_MAX,
    SMALL_BATCH,
    Column,
    QueueColumns,
    column_sizes,
    cut,
    group,
    payload_limit,
    runs,
    sizes_of,
)
from pylog.errors import (
    InvalidTimestampError,
    LogClosedError,
    RecordTooLargeError,
    UnknownPartitionError,
    UnknownTopicError,
)
from pylog.partitioner import (
    KEYLESS_RUN_BYTES,
    StickyPartitioner,
    murmur2,
    partition_list,
    partitions_for_keys,
)
from pylog.producer_config import ProducerConfig
from pylog.record import HEADER_SIZE, LAYOUT_SIZE, encode_batch, encode_columns, encode_one
from pylog.structs import TopicPartition

if TYPE_CHECKING:
    from pylog.directory import LogDirectory
    from pylog.partition.log import AppendInfo, PartitionLog
    from pylog.topic import Topic

__all__ = ["AppendBatch", "BatchFields", "QueuedRecords", "RecordAccumulator", "TopicQueue"]

_log = logging.getLogger("pylog.producer")
_NO_OPTIONS = (-1, b"", -1)  # timestamp, headers, partition of a record sent without them
_WITH_OPTIONS = 5  # items of a queued record with options (see the module docstring)
_ALWAYS = -1  # a TopicQueue.drain_at that sends every append through settle() (the sender thread sleeps)

#: Producer id, epoch, sequence and transactional flag of the next batch to a partition.
BatchFields = Callable[[TopicPartition], Mapping[str, Any]]
#: Append one encoded batch to a partition (the idempotent producer retries here).
AppendBatch = Callable[["PartitionLog", TopicPartition, bytes | bytearray, Mapping[str, Any]], "AppendInfo"]


class QueuedRecords:
    """Records queued for one topic, drained (and acknowledged) together.

    ``records`` holds one tuple per record (see the module docstring); ``plain`` stays True while no record
    has a partition, timestamp or headers of its own. Once drained, the columns (``keys``, ``values``, ``ts``,
    ``headers``, ``partitions``) and ``offsets`` describe each record by its index in ``taken``, the drain's
    copy of ``records``."""

    __slots__ = (
        "_index",
        "error",
        "finished",
        "headers",
        "keys",
        "nbytes",
        "observed",
        "offsets",
        "partitions",
        "plain",
        "queue",
        "records",
        "sealed",
        "taken",
        "ts",
        "values",
    )

    def __init__(self, queue: TopicQueue) -> None:
        self.queue = queue
        self.records: list[tuple[Any, ...]] = []  # appended to by send(), never replaced
        self.taken: list[tuple[Any, ...]] = []  # the drain's copy of ``records``: what it writes
        self.plain = True
        self.nbytes = 0  # approximate: updated without a lock (it only decides when send() drains)
        self.sealed = False  # taken by a drain: appends from now on may miss it (see settle)
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.ts: list[int] = []
        self.headers: list[bytes] = []
        self.partitions: list[int] = []
        self.finished = False  # written (or failed); waiters are woken through the accumulator's condition
        self.error: BaseException | None = None
        self.observed: set[int] = set()  # ids of records of a failed drain whose failure reached the user
        self.offsets: npt.NDArray[np.int64] | range | None = None
        self._index: dict[int, int] | None = None

    @property
    def acc(self) -> RecordAccumulator:
        return self.queue.acc

    @property
    def topic(self) -> str:
        return self.queue.name

    def index_of(self, record: tuple[Any, ...]) -> int:
        """The index of ``record`` (a drained one) in the columns."""
        records = self.taken
        if len(records) == 1:
            return 0
        index = self._index
        if index is None:
            index = self._index = {id(r): i for i, r in enumerate(records)}
        return index[id(record)]

    def holds(self, record: tuple[Any, ...]) -> bool:
        return any(r is record for r in reversed(self.taken))

    def written(self, record: tuple[Any, ...]) -> bool:
        """``record`` reached the log (a drain that failed part way wrote the batches before the failure)."""
        offsets = self.offsets
        return offsets is not None and int(offsets[self.index_of(record)]) >= 0

    def unwritten(self) -> int:
        offsets = self.offsets
        if offsets is None:
            return len(self.taken)
        return 0 if isinstance(offsets, range) else int((offsets < 0).sum())

    def take(self) -> None:
        """Seal the queue and keep what it holds now (the drain's copy: see the module docstring)."""
        self.sealed = True
        self.taken = self.records[:]  # ``records`` itself stays the list late appends go to

    def split(self) -> None:
        """Turn the records into the column lists (once, when drained)."""
        records = self.taken
        n = len(records)
        if self.plain:  # (list comprehensions: zip(*records) is ten times slower for long lists)
            self.keys = [r[0] for r in records]
            self.values = [r[1] for r in records]
            self.headers = [b""] * n
            self.partitions = [-1] * n
            self.ts = [-1] * n
            return
        full = [r if len(r) == _WITH_OPTIONS else (*r, *_NO_OPTIONS) for r in records]
        self.keys = [r[0] for r in full]
        self.values = [r[1] for r in full]
        self.ts = [r[2] for r in full]
        self.headers = [r[3] for r in full]
        self.partitions = [r[4] for r in full]


class TopicQueue:
    """A topic's queue: its current :class:`QueuedRecords` (``gen``), replaced by each drain.

    ``drain_at`` is the byte count at which ``send`` hands its append to :meth:`RecordAccumulator.settle`
    (which drains); :data:`_ALWAYS` while the sender thread sleeps, so that the next append wakes it."""

    __slots__ = ("acc", "column_bytes", "columns", "drain_at", "gen", "name", "topic", "tps")

    def __init__(self, acc: RecordAccumulator, topic: Topic) -> None:
        self.acc = acc
        self.name = topic.name
        self.topic = topic
        self.tps = [TopicPartition(topic.name, 0)]  # of partitions 0, 1, ... (extended by tp())
        self.drain_at = acc.config.queue_bytes
        self.gen = QueuedRecords(self)
        #: ``send_batch(wait=False)`` calls not yet written, in order, and about how many bytes they hold.
        #: While it is not empty, ``send`` takes its slow path, which writes them first (order is kept).
        self.columns: list[QueuedColumns] = []
        self.column_bytes = 0

    def tp(self, partition: int) -> TopicPartition:
        """The :class:`TopicPartition` of ``partition`` of this topic (made once)."""
        tps = self.tps
        while len(tps) <= partition:
            tps.append(TopicPartition(self.name, len(tps)))
        return tps[partition]


class QueuedColumns:
    """The records of one ``send_batch(wait=False)``, checked and waiting for a drain (which may write the
    columns of many calls as one batch). ``partitions``/``offsets`` are set once written; ``error`` if not.
    Same delivery contract as :class:`QueuedRecords` (``unwritten``, ``observed``, ``topic``, ``error``)."""

    __slots__ = (
        "error",
        "finished",
        "kcol",
        "n",
        "nbytes",
        "observed",
        "offsets",
        "partition",
        "partitions",
        "queue",
        "timestamps",
        "vcol",
    )

    def __init__(
        self,
        queue: TopicQueue,
        kcol: Column,
        vcol: Column,
        partition: int | None,
        timestamps: npt.NDArray[np.int64] | None,
        nbytes: int,
    ) -> None:
        self.queue = queue
        self.kcol = kcol
        self.vcol = vcol
        self.partition = partition
        self.timestamps = timestamps
        self.n = len(kcol)
        self.nbytes = nbytes
        self.finished = False
        self.error: BaseException | None = None
        self.partitions: npt.NDArray[np.int32] | None = None
        self.offsets: npt.NDArray[np.int64] | None = None
        self.observed: set[int] = set()  # marks 0..n-1 once the failure reached the user

    @property
    def topic(self) -> str:
        return self.queue.name

    def unwritten(self) -> int:
        if self.error is None:
            return 0
        return self.n if self.offsets is None else int((self.offsets < 0).sum())


class RecordAccumulator:
    """The queues of one producer and their drain (see the module docstring).

    ``batch_fields`` and ``append_batch`` are the producer's hooks for each batch (the idempotent producer
    sets a sequence and retries appends)."""

    def __init__(
        self, log: LogDirectory, config: ProducerConfig, batch_fields: BatchFields, append_batch: AppendBatch
    ) -> None:
        self.log = log
        self.config = config
        self.acks = config.acks
        self._batch_fields = batch_fields
        self._append_batch = append_batch
        self.lock = threading.Lock()  # guards the queue dicts and ``failed``, never held by send's fast path
        self.drain_lock = threading.RLock()
        self.queues: dict[str, TopicQueue] = {}
        #: the queue of each open Topic object, for send's fast path (a topic deleted and created again is
        #: another object, so a stale entry is never found)
        self.by_topic: dict[Topic | None, TopicQueue] = {}
        self.callbacks: list[tuple[Any, Any, Any]] = []  # (future, on success, on error), run by the producer
        #: failed drains not yet reported by flush()/close()
        self.failed: list[QueuedRecords | QueuedColumns] = []
        self.inflight: set[QueuedRecords] = set()  # taken from the queue, not yet finished (fsync under way)
        self._sticky = StickyPartitioner(min(config.batch_size, KEYLESS_RUN_BYTES))
        self._finished_cond = threading.Condition()
        self._finish_waiters = 0
        self.sleeping = False  # the sender thread waits for a wake-up (set by the sender only)
        self.wake_sender: Callable[[], None] = lambda: None
        self.on_callback: Callable[[], None] = lambda: None  # wakes the sender thread to run a callback

    # -- queueing -----------------------------------------------------------------------------------------

    def queue(self, topic: Topic) -> TopicQueue:
        """The queue of ``topic`` (created on first use)."""
        q = self.by_topic.get(topic)
        if q is not None:
            return q
        with self.lock:
            q = self.queues.get(topic.name)
            if q is None:
                q = self.queues[topic.name] = TopicQueue(self, topic)
            elif q.topic is not topic:  # deleted and created again: forget the old object
                self.by_topic.pop(q.topic, None)
                q.topic = topic
            self.by_topic[topic] = q
        return q

    def append(self, q: TopicQueue, record: tuple[Any, ...], size: int) -> QueuedRecords:
        """Queue ``record`` (what ``send``'s fast path does inline); returns the queue that holds it."""
        g = q.gen
        if len(record) == _WITH_OPTIONS:
            g.plain = False  # before the append: a drain that takes the record sees the flag
        g.records.append(record)
        g.nbytes += size
        if g.sealed or g.nbytes >= q.drain_at:
            return self.settle(q, g, record)
        return g

    def settle(self, q: TopicQueue, g: QueuedRecords, record: tuple[Any, ...]) -> QueuedRecords:
        """After ``record`` was appended to ``g``: queue it again if a drain sealed ``g`` without it, wake the
        sender thread if it sleeps, and drain when the queue holds ``queue_bytes``. Returns the queue that
        holds the record."""
        if self.sleeping:
            self.wake_sender()
        if g.sealed:
            with self.drain_lock:  # the drain that sealed g has taken its copy
                if g.holds(record):
                    return g
            size = len(record[0] or b"") + len(record[1] or b"") + len(record[3] if len(record) > 2 else b"")
            return self.append(q, record, size + PER_RECORD)
        if g.nbytes >= self.config.queue_bytes:
            self.drain_topic(q, g)
        return g

    def queued(self) -> bool:
        """Some queue holds records."""
        return any(q.gen.records or q.columns for q in list(self.queues.values()))

    def sender_sleeps(self, sleeping: bool) -> None:
        """The sender thread is about to wait for a wake-up (or woke up): while it sleeps every append goes
        through :meth:`settle`, which wakes it. Set before the sender's last look at the queues."""
        self.sleeping = sleeping
        drain_at = _ALWAYS if sleeping else self.config.queue_bytes
        for q in list(self.queues.values()):
            q.drain_at = drain_at

    def take_failed(self) -> list[QueuedRecords | QueuedColumns]:
        with self.lock:
            failed, self.failed = self.failed, []
        return failed

    # -- draining -----------------------------------------------------------------------------------------

    def _take(self, q: TopicQueue, g: QueuedRecords | None = None) -> QueuedRecords | None:
        """Install a new queue in ``q`` and take the old one (only if it is ``g``, when given). Under the drain
        lock."""
        cur = q.gen
        if (g is not None and cur is not g) or not cur.records:
            return None
        q.gen = QueuedRecords(q)
        cur.take()
        return cur

    def drain_topic(self, q: TopicQueue, g: QueuedRecords | None = None) -> None:
        """Append the records queued in ``q`` (under the drain lock, which keeps them in order), then,
        with ``acks="all"``, wait for their fsync outside it: drains of other threads append meanwhile, and
        the partition's next fsync covers them all (group commit)."""
        with self.drain_lock:
            taken = self._take(q, g)
            if taken is None:
                return
            self.inflight.add(taken)
            durable = self._write(taken)
        try:
            if durable:
                self._make_durable(taken, durable)
        finally:
            self.inflight.discard(taken)

    def drain_all(self) -> None:
        for q in list(self.queues.values()):
            if q.columns:
                self.drain_columns(q)
            if q.gen.records:
                self.drain_topic(q)

    def drain_for(self, g: QueuedRecords) -> None:
        """Drain ``g`` for a caller waiting on one of its records, in the caller's thread, at once. With
        ``acks="all"`` the fsync that follows is shared: a partition's flush waits for the fsync under way and
        then runs one fsync for every batch appended meanwhile (group commit), so a caller does not wait for
        another caller's fsync before appending (which would serialize appends and fsyncs)."""
        if not g.finished:
            self.drain_topic(g.queue, g)

    def wait_finished(self, g: QueuedRecords | QueuedColumns, timeout: float | None) -> bool:
        """Wait until another thread finished writing ``g`` (a waiter registers before it checks, and the
        writer checks for waiters after it marked ``g`` finished, so no wake-up is lost)."""
        with self._finished_cond:
            self._finish_waiters += 1
            try:
                return self._finished_cond.wait_for(lambda: g.finished, timeout)
            finally:
                self._finish_waiters -= 1

    def fail_queued(self, exc: BaseException) -> None:
        """Fail every queued record with ``exc`` (the log was closed under the producer)."""
        with self.drain_lock:
            for q in list(self.queues.values()):
                for c in self._take_columns(q):
                    c.error = exc
                    c.finished = True
                    with self.lock:
                        self.failed.append(c)
                g = self._take(q)
                if g is None:
                    continue
                g.split()
                g.error = exc
                g.finished = True
                with self.lock:
                    self.failed.append(g)
            with self._finished_cond:
                self._finished_cond.notify_all()

    def _make_durable(self, g: QueuedRecords, durable: list[tuple[PartitionLog, int]]) -> None:
        try:
            for plog, up_to in durable:
                plog.flush(up_to)
        except BaseException as exc:
            self._fail(g, exc)
        finally:
            self._finish(g)

    def _fail(self, g: QueuedRecords, exc: BaseException) -> None:
        if self.acks == "all":
            g.offsets = None  # not durable: none of them is acknowledged
        g.error = self._typed(g.topic, exc)
        with self.lock:
            self.failed.append(g)
        _log.debug("producer write to %s failed: %r", g.topic, exc)

    def _finish(self, g: QueuedRecords) -> None:
        g.finished = True
        self.inflight.discard(g)
        if self._finish_waiters:  # read after setting finished: see wait_finished
            with self._finished_cond:
                self._finished_cond.notify_all()

    def _typed(self, topic: str, exc: BaseException) -> BaseException:
        """The error to report for a failed drain: a topic deleted under the producer (its files vanish) is
        :class:`UnknownTopicError`, not an ``OSError``."""
        if isinstance(exc, FileNotFoundError | LogClosedError) and not self.log.closed:
            try:
                gone = not self.log.has_topic(topic)
            except Exception:
                gone = False
            if gone:
                typed = UnknownTopicError(f"topic {topic!r} was deleted before these records were written")
                typed.__cause__ = exc
                return typed
        return exc

    # -- batch building -----------------------------------------------------------------------------------

    def _write(self, p: QueuedRecords) -> list[tuple[PartitionLog, int]]:
        """Append ``p``'s records; returns what must be fsynced before they are acknowledged (``acks="all"``),
        else marks them finished."""
        durable: list[tuple[PartitionLog, int]] = []
        try:
            self._append_queued(p, durable)
        except BaseException as exc:
            self._fail(p, exc)
            durable = []
        if not durable:
            self._finish(p)
        return durable

    def _append_queued(self, p: QueuedRecords, durable: list[tuple[PartitionLog, int]]) -> None:
        t = self.log.topic(p.queue.name)  # checks the manifest: a topic deleted (and created again) meanwhile
        now = self.log.clock.time_ms()
        n = len(p.taken)
        if n <= SMALL_BATCH and (n == 1 or self._fits_one_batch(t, p, n)):
            self._write_small(t, p, now, durable)
            return
        p.split()
        if p.plain or t.config.log_append_time:
            ts = np.full(n, now, dtype=np.int64)
            p.ts = [now] * n
        else:
            ts = np.asarray(p.ts, dtype=np.int64)
            ts[ts < 0] = now
            p.ts = ts.tolist()
        parts = self._assign_partitions(t, p)
        offsets = np.full(n, -1, dtype=np.int64)
        p.offsets = offsets  # filled batch by batch: a failure part way fails only the rest
        self._append_groups(t, p, parts, ts, offsets, durable)

    def compression(self, t: Topic) -> str:
        return self.config.compression_type or t.config.compression_type

    def _write_small(
        self, t: Topic, p: QueuedRecords, now: int, durable: list[tuple[PartitionLog, int]]
    ) -> None:
        """:meth:`_write` for a few records that fit one batch together (a caller waiting on each send):
        partitioned with the scalar murmur2 and built without numpy, whose per-call overhead (microseconds a
        call) would dominate; one batch for each partition they go to, in partition order as
        :meth:`_append_groups` writes them."""
        records = p.taken
        n = len(records)
        headers: list[bytes] | None = None
        if p.plain:
            p.keys = [r[0] for r in records]
            p.values = [r[1] for r in records]
            p.ts = [now] * n
            p.headers = [b""] * n
        else:
            p.split()
            p.ts = [now] * n if t.config.log_append_time else [now if x < 0 else x for x in p.ts]
            headers = p.headers if any(p.headers) else None
        parts = p.partitions = self._small_partitions(t, p)
        first = parts[0]
        if n == 1 or parts.count(first) == n:
            info = self._append_small(t, p, first, None, headers, durable)
            if info.log_append_time >= 0:
                p.ts = [info.log_append_time] * n
            p.offsets = range(info.base_offset, info.last_offset + 1)
            return
        offsets = np.full(n, -1, dtype=np.int64)
        p.offsets = offsets  # filled batch by batch: a failure part way fails only the rest
        by_partition: dict[int, list[int]] = {}
        for i, part in enumerate(parts):
            by_partition.setdefault(part, []).append(i)
        for part in sorted(by_partition):
            idx = by_partition[part]
            info = self._append_small(t, p, part, idx, headers, durable)
            offsets[idx] = range(info.base_offset, info.last_offset + 1)
            if info.log_append_time >= 0:
                for i in idx:
                    p.ts[i] = info.log_append_time

    def _append_small(
        self,
        t: Topic,
        p: QueuedRecords,
        part: int,
        idx: list[int] | None,
        headers: list[bytes] | None,
        durable: list[tuple[PartitionLog, int]],
    ) -> AppendInfo:
        """Append the records ``idx`` of ``p`` (None: all of them) to partition ``part``, as one batch."""
        keys, values, ts = p.keys, p.values, p.ts
        if idx is not None:
            keys, values, ts = [keys[i] for i in idx], [values[i] for i in idx], [ts[i] for i in idx]
            if headers is not None:
                headers = [headers[i] for i in idx]
                if not any(headers):
                    headers = None
        plog = t.partition(part)
        tp = p.queue.tp(part)
        fields = self._batch_fields(tp)
        compression = self.compression(t)
        batch: bytes | bytearray
        if len(keys) == 1 and headers is None and compression == "none":
            batch = encode_one(keys[0], values[0], ts[0], **fields)
        else:
            batch = encode_batch(0, keys, values, ts, headers, compression=compression, **fields)
        info = self._append_batch(plog, tp, batch, fields)
        if self.acks == "all":
            durable.append((plog, info.last_offset + 1))
        return info

    def _small_partitions(self, t: Topic, p: QueuedRecords) -> list[int]:
        """Partitions of the few records of ``p`` (split), as :meth:`_assign_partitions` computes them, without
        numpy for keyed records: the scalar murmur2 of each key."""
        num = t.num_partitions
        n = len(p.keys)
        if num == 1:
            return [0] * n
        keys = p.keys
        if p.plain and None not in keys:  # every record keyed, none with a partition of its own
            if n == 1:  # (send().get(): the common case, inline)
                return [(murmur2(keys[0]) & 0x7FFFFFFF) % num]  # type: ignore[arg-type]
            return partition_list(keys, num)  # type: ignore[arg-type]
        parts = [-1] * n if p.plain else list(p.partitions)
        keyless: list[int] = []
        for i, part in enumerate(parts):
            if part < 0:
                key = keys[i]
                if key is None:
                    keyless.append(i)
                else:
                    parts[i] = (murmur2(key) & 0x7FFFFFFF) % num
        if keyless:
            values, headers = p.values, p.headers
            sizes = [len(values[i] or b"") + len(headers[i]) + PER_RECORD for i in keyless]
            chosen = self._sticky.partition_list(
                t.name, num, sizes, lambda q: t.partition(q).log_end_offset, t
            )
            for i, part in zip(keyless, chosen, strict=True):
                parts[i] = part
        return parts

    def _fits_one_batch(self, t: Topic, p: QueuedRecords, n: int) -> bool:
        """The ``n`` (a few) records of ``p`` fit one batch (``send()`` checked each fits on its own)."""
        limit = payload_limit(min(t.config.max_message_bytes, self.config.batch_size), self.compression(t))
        size = sum(len(r[0] or b"") + len(r[1] or b"") + (len(r[3]) if len(r) > 2 else 0) for r in p.taken)
        return size + n * PER_RECORD_MAX <= limit

    def _assign_partitions(self, t: Topic, p: QueuedRecords) -> npt.NDArray[np.int32]:
        n = t.num_partitions
        if n == 1:
            p.partitions = [0] * len(p.keys)
            return np.zeros(len(p.keys), dtype=np.int32)
        if p.plain and None not in p.keys:  # every record keyed, none with a partition of its own
            parts = partitions_for_keys(p.keys, n)  # type: ignore[arg-type]
            p.partitions = parts.tolist()
            return parts
        parts = np.asarray(p.partitions, dtype=np.int32)
        free = np.flatnonzero(parts < 0)
        if len(free):
            keys = p.keys
            keyed = [i for i in free.tolist() if keys[i] is not None]
            if keyed:
                parts[keyed] = partitions_for_keys([keys[i] for i in keyed], n)  # type: ignore[misc]
            if len(keyed) < len(free):
                keyless = [i for i in free.tolist() if keys[i] is None]
                values, headers = p.values, p.headers
                sizes = [len(values[i] or b"") + len(headers[i]) + PER_RECORD for i in keyless]
                parts[keyless] = self.sticky_partitions(t, sizes)
        p.partitions = parts.tolist()
        return parts

    def sticky_partitions(self, t: Topic, sizes: Any) -> npt.NDArray[np.int32]:
        """Partitions of keyless records of ``sizes`` bytes (sticky runs, see :mod:`pylog.partitioner`)."""
        return self._sticky.partitions(
            t.name, t.num_partitions, sizes, lambda q: t.partition(q).log_end_offset, t
        )

    def _append_groups(
        self,
        t: Topic,
        p: QueuedRecords,
        parts: npt.NDArray[np.int32],
        ts: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
        durable: list[tuple[PartitionLog, int]],
    ) -> None:
        n = len(p.keys)
        groups = [np.arange(n)] if t.num_partitions == 1 else group(parts)
        compression = self.compression(t)
        limit = payload_limit(min(t.config.max_message_bytes, self.config.batch_size), compression)
        columns = QueueColumns(p.keys, p.values, None if p.plain else p.headers)
        flush_to: dict[int, int] = {}
        for idx in groups:
            part = int(parts[idx[0]])
            plog = t.partition(part)
            tp = TopicPartition(plog.topic, plog.partition)
            for whole in cut(idx, columns.sizes, limit):
                for chunk, batch, fields in self._encoded(
                    whole, tp, t.config.max_message_bytes, lambda c, f: columns.encode(c, ts, compression, f)
                ):
                    info = self._append_batch(plog, tp, batch, fields)
                    offsets[chunk] = np.arange(info.base_offset, info.last_offset + 1)
                    if info.log_append_time >= 0:
                        for i in chunk.tolist():
                            p.ts[i] = info.log_append_time
                    flush_to[part] = info.last_offset + 1
        if self.acks == "all":
            durable.extend((t.partition(part), up_to) for part, up_to in flush_to.items())

    def _encoded(
        self,
        chunk: npt.NDArray[np.intp],
        tp: TopicPartition,
        max_bytes: int,
        encode: Callable[[npt.NDArray[np.intp], Mapping[str, Any]], bytes],
    ) -> Iterator[tuple[npt.NDArray[np.intp], bytes, Mapping[str, Any]]]:
        """Encode ``chunk`` as one batch, or, should it come out larger than ``max_bytes`` (compression that
        grows the data), as halves, recursively: records that fit on their own never fail for being batched
        together. Each batch's fields are taken when it is about to be appended (they follow the appends)."""
        fields = self._batch_fields(tp)
        batch = encode(chunk, fields)
        if len(batch) <= max_bytes or len(chunk) == 1:
            yield chunk, batch, fields
            return
        half = len(chunk) // 2
        yield from self._encoded(chunk[:half], tp, max_bytes, encode)
        yield from self._encoded(chunk[half:], tp, max_bytes, encode)

    # -- send_batch: columns appended at once ------------------------------------------------------------

    def check_columns(
        self,
        t: Topic,
        kcol: Column,
        vcol: Column,
        partition: int | None,
        timestamps: npt.ArrayLike | None,
        *,
        null_records: bool = False,
    ) -> tuple[int | npt.NDArray[np.int64], npt.NDArray[np.int64] | None]:
        """Check ``send_batch``'s records (raising at once, writing nothing, for bad input); returns their
        sizes and their timestamps (None: each gets the clock's time when written). ``null_records``: see
        :func:`pylog.batching.column_sizes`."""
        n = len(kcol)
        sizes, largest = column_sizes(t, kcol, vcol, null_records=null_records)
        ts: npt.NDArray[np.int64] | None = None
        if timestamps is not None:
            ts = np.asarray(timestamps, dtype=np.int64)
            if ts.shape != (n,) or (ts < 0).any():
                raise InvalidTimestampError("timestamps must be n integers >= 0")
            if n:  # outside the topic's window: the call is refused whole, before anything is queued
                t.config.check_timestamps(int(ts.min()), int(ts.max()), t.env.clock.time_ms(), "send_batch")
            if t.config.log_append_time:
                ts = None
        if largest + HEADER_SIZE + LAYOUT_SIZE > t.config.max_message_bytes:
            raise RecordTooLargeError(f"a record exceeds max_message_bytes={t.config.max_message_bytes}")
        if partition is not None and (
            isinstance(partition, bool)
            or not isinstance(partition, int)
            or not 0 <= partition < t.num_partitions
        ):
            raise UnknownPartitionError(f"partition {partition!r} does not exist in topic {t.name!r}")
        return sizes, ts

    def write_columns(
        self,
        t: Topic,
        kcol: Column,
        vcol: Column,
        partition: int | None,
        timestamps: npt.ArrayLike | None,
        *,
        null_records: bool = False,
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]:
        """Append ``n`` records given as columns (``Producer.send_batch``), after what is queued for the topic;
        returns their partitions and offsets. Raises at once, writing nothing, for bad input."""
        sizes, ts = self.check_columns(t, kcol, vcol, partition, timestamps, null_records=null_records)
        with self.drain_lock:
            q = self.queue(t)
            if q.columns:
                self.drain_columns(q)
            self.drain_topic(q)
            return self._write_checked(t, kcol, vcol, partition, ts, sizes)

    def _write_checked(
        self,
        t: Topic,
        kcol: Column,
        vcol: Column,
        partition: int | None,
        ts: npt.NDArray[np.int64] | None,
        sizes: int | npt.NDArray[np.int64],
        parts_out: npt.NDArray[np.int32] | None = None,
        offsets_out: npt.NDArray[np.int64] | None = None,
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]:
        """Append checked columns (drain lock held). ``offsets_out`` (-1 filled) gets each record's offset as
        soon as its batch is written, so that a failure part way says which were."""
        n = len(kcol)
        now = self.log.clock.time_ms()
        parts = self._column_partitions(t, kcol, vcol, partition, n)
        if parts_out is not None:
            parts_out[:] = parts
        offsets = np.full(n, -1, dtype=np.int64) if offsets_out is None else offsets_out
        compression = self.compression(t)
        limit = payload_limit(t.config.max_message_bytes, compression)
        if t.num_partitions == 1 or partition is not None:
            groups: list[tuple[int, list[Any]]] = [(int(parts[0]), runs(n, sizes, limit))]
        else:
            groups = [(int(parts[idx[0]]), cut(idx, sizes_of(sizes, n), limit)) for idx in group(parts)]
        for part, chunks in groups:
            plog = t.partition(part)
            tp = TopicPartition(plog.topic, plog.partition)
            for sel in chunks:
                kl, kd = kcol.take(sel)
                vl, vd = vcol.take(sel)
                chunk_ts = np.full(len(kl), now, dtype=np.int64) if ts is None else ts[sel]
                fields = self._batch_fields(tp)
                batch = encode_columns(0, kl, kd, vl, vd, chunk_ts, compression=compression, **fields)
                info = self._append_batch(plog, tp, batch, fields)
                offsets[sel] = np.arange(info.base_offset, info.last_offset + 1)
            if self.acks == "all":
                last = chunks[-1]
                plog.flush(int(offsets[last.stop - 1 if isinstance(last, slice) else last[-1]]) + 1)
        return parts, offsets

    # -- send_batch(wait=False): columns queued, written together by a drain ------------------------------

    def queue_columns(
        self,
        t: Topic,
        kcol: Column,
        vcol: Column,
        partition: int | None,
        timestamps: npt.ArrayLike | None,
    ) -> QueuedColumns:
        """Check ``send_batch``'s records (raising at once for bad input) and queue them after what the topic
        holds; a drain writes them (with the columns of other calls, as one batch where they fit)."""
        sizes, ts = self.check_columns(t, kcol, vcol, partition, timestamps)
        q = self.queue(t)
        if q.gen.records:  # records of send() queued before these go first
            self.drain_topic(q)
        nbytes = int(sizes) * len(kcol) if isinstance(sizes, int) else int(sizes.sum())
        c = QueuedColumns(q, kcol, vcol, partition, ts, nbytes)
        with self.lock:
            q.columns.append(c)
            q.column_bytes += nbytes
            full = q.column_bytes >= self.config.queue_bytes
        if full:
            self.drain_columns(q)
        elif self.sleeping:
            self.wake_sender()
        return c

    def _take_columns(self, q: TopicQueue) -> list[QueuedColumns]:
        with self.lock:
            taken, q.columns, q.column_bytes = q.columns, [], 0
        return taken

    def drain_columns(self, q: TopicQueue) -> None:
        """Write the columns queued in ``q``, in order: consecutive calls of the same shape (fixed-width or
        null keys and values of one width each, no partition or timestamps of their own) as one set of
        columns, which the batch cutter splits as it would one large call."""
        with self.drain_lock:
            taken = self._take_columns(q)
            if not taken:
                return
            try:
                i = 0
                while i < len(taken):
                    j = i + 1
                    while j < len(taken) and _same_shape(taken[i], taken[j]):
                        j += 1
                    self._write_queued_columns(taken[i:j])
                    i = j
            finally:
                if self._finish_waiters:
                    with self._finished_cond:
                        self._finished_cond.notify_all()

    def _write_queued_columns(self, run: list[QueuedColumns]) -> None:
        """Write ``run`` (calls of one shape) as one set of columns; a failure fails the records not yet
        written (each call's ``offsets`` say which were: -1 for those that were not)."""
        first = run[0]
        n = sum(c.n for c in run)
        offsets = np.full(n, -1, dtype=np.int64)
        parts = np.full(n, -1, dtype=np.int32)
        try:
            t = self.log.topic(first.queue.name)  # a topic deleted meanwhile fails here
            if len(run) == 1:
                kcol, vcol = first.kcol, first.vcol
            else:
                kcol, vcol = _concat([c.kcol for c in run]), _concat([c.vcol for c in run])
            sizes, _ = column_sizes(t, kcol, vcol)
            self._write_checked(t, kcol, vcol, first.partition, first.timestamps, sizes, parts, offsets)
            error = None
        except BaseException as exc:
            error = self._typed(first.queue.name, exc)
            _log.debug("producer write to %s failed: %r", first.queue.name, exc)
        at = 0
        for c in run:
            c.partitions, c.offsets = parts[at : at + c.n], offsets[at : at + c.n]
            at += c.n
            if error is not None and (c.offsets < 0).any():
                c.error = error
                with self.lock:
                    self.failed.append(c)
            c.finished = True

    def drain_columns_for(self, c: QueuedColumns) -> None:
        """Write ``c`` for a caller waiting on it, in the caller's thread."""
        if not c.finished:
            self.drain_columns(c.queue)

    def _column_partitions(
        self, t: Topic, kcol: Column, vcol: Column, partition: int | None, n: int
    ) -> npt.NDArray[np.int32]:
        if partition is not None:  # checked by check_columns
            return np.full(n, partition, dtype=np.int32)
        if t.num_partitions == 1:
            return np.zeros(n, dtype=np.int32)
        parts = np.zeros(n, dtype=np.int32)
        keyed = kcol.lens >= 0
        if keyed.all():
            parts[:] = kcol.partitions(t.num_partitions)
        else:
            idx = np.flatnonzero(keyed)
            if len(idx):
                parts[idx] = partitions_for_keys(kcol.as_list(idx), t.num_partitions)
            keyless = np.flatnonzero(~keyed)
            sizes = np.maximum(vcol.lens[keyless], 0) + PER_RECORD
            parts[keyless] = self.sticky_partitions(t, sizes)
        return parts


def _same_shape(a: QueuedColumns, b: QueuedColumns) -> bool:
    """``a`` and ``b`` can be written as one set of columns: fixed-width (or null) keys and values of the
    same widths, and neither has a partition or timestamps of its own."""
    return (
        a.partition is None
        and b.partition is None
        and a.timestamps is None
        and b.timestamps is None
        and a.kcol.width is not None
        and a.kcol.width == b.kcol.width
        and a.vcol.width is not None
        and a.vcol.width == b.vcol.width
        and a.kcol.kind == b.kcol.kind
        and a.vcol.kind == b.vcol.kind
    )


def _concat(cols: list[Column]) -> Column:
    """Columns of the same shape (see :func:`_same_shape`) as one."""
    first = cols[0]
    n = sum(c.n for c in cols)
    if first.kind == "nulls":
        return Column.nulls(n)
    raw = np.concatenate([c.raw for c in cols])
    return Column(None, raw, "fixed", raw, n=n, width=first.width)
