"""The record accumulator: the producer's per-topic queues, and their drain into batches.

``Producer.send`` adds each record to its topic's queue (:class:`QueuedRecords`); a drain takes a topic's
whole queue, partitions the records in bulk (murmur2 vectorized with numpy), cuts them into batches (framing
and CRC in :mod:`pylog.batching` / :mod:`pylog.record`) and appends them, per partition in the order they were
sent. Drains run under one lock, which keeps the queues of a topic in order; with ``acks="all"`` the fsync that
makes a drain durable runs after that lock is released, so that drains of other threads append meanwhile and
the partition's next fsync covers them all (group commit).

Delivery contract: every queued record ends written (its offset set) or failed; a failed queue is kept until
:meth:`RecordAccumulator.take_failed` hands it to the producer, which raises what nobody saw through a future.

Thread-safety: thread-safe. ``append`` may be called from any number of threads; drains serialize on the
drain lock.
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
    cut,
    group,
    payload_limit,
    runs,
    sizes_of,
)
from pylog.errors import (
    InvalidRecordError,
    InvalidTimestampError,
    LogClosedError,
    RecordTooLargeError,
    UnknownPartitionError,
    UnknownTopicError,
)
from pylog.partitioner import KEYLESS_RUN_BYTES, StickyPartitioner, partitions_for_keys
from pylog.producer_config import ProducerConfig
from pylog.record import HEADER_SIZE, LAYOUT_SIZE, encode_batch, encode_columns
from pylog.structs import TopicPartition

if TYPE_CHECKING:
    from pylog.directory import LogDirectory
    from pylog.partition.log import AppendInfo, PartitionLog
    from pylog.topic import Topic

__all__ = ["FIELDS", "AppendBatch", "BatchFields", "QueuedRecords", "RecordAccumulator"]

_log = logging.getLogger("pylog.producer")
FIELDS = 5  # items per queued record (see QueuedRecords)

#: Producer id, epoch, sequence and transactional flag of the next batch to a partition.
BatchFields = Callable[[TopicPartition], Mapping[str, Any]]
#: Append one encoded batch to a partition (the idempotent producer retries here).
AppendBatch = Callable[["PartitionLog", TopicPartition, bytes, Mapping[str, Any]], "AppendInfo"]


class QueuedRecords:
    """Records queued for one topic, drained together.

    ``append`` adds each record as five consecutive items of ``records`` (key, value, timestamp or -1, encoded
    headers, partition or -1): extending one flat list is cheaper than appending to five, and the drain splits
    it into columns with slices. ``plain`` stays True while no record has a partition, timestamp or headers
    of its own."""

    __slots__ = (
        "acc",
        "error",
        "finished",
        "headers",
        "keys",
        "nbytes",
        "observed",
        "offsets",
        "partitions",
        "plain",
        "records",
        "topic",
        "ts",
        "values",
    )

    def __init__(self, acc: RecordAccumulator, topic: str) -> None:
        self.acc = acc
        self.topic = topic
        self.records: list[Any] = []
        self.plain = True
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.ts: list[int] = []
        self.headers: list[bytes] = []
        self.partitions: list[int] = []
        self.nbytes = 0
        self.finished = False  # written (or failed); waiters are woken through the accumulator's condition
        self.error: BaseException | None = None
        self.observed: set[int] = set()  # records of a failed drain whose failure reached the user
        self.offsets: npt.NDArray[np.int64] | range | None = None

    def written(self, i: int) -> bool:
        """Record ``i`` reached the log (a drain that failed part way wrote the batches before the failure)."""
        offsets = self.offsets
        return offsets is not None and int(offsets[i]) >= 0

    def unwritten(self) -> int:
        offsets = self.offsets
        if offsets is None:
            return len(self.keys)
        return 0 if isinstance(offsets, range) else int((offsets < 0).sum())

    def split(self) -> None:
        """Turn the queued records into the column lists (once, when drained)."""
        r, self.records = self.records, []
        self.keys, self.values, self.ts, self.headers, self.partitions = (
            r[0::FIELDS],
            r[1::FIELDS],
            r[2::FIELDS],
            r[3::FIELDS],
            r[4::FIELDS],
        )


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
        self.lock = threading.Lock()
        self.drain_lock = threading.RLock()
        self.pending: dict[str, QueuedRecords] = {}
        self.callbacks: list[tuple[Any, Any, Any]] = []  # (future, on success, on error), run by the producer
        self.failed: list[QueuedRecords] = []  # failed drains not yet reported by flush()/close()
        self.inflight: set[QueuedRecords] = set()  # taken from the queue, not yet finished (fsync under way)
        self._sticky = StickyPartitioner(min(config.batch_size, KEYLESS_RUN_BYTES))
        self._finished_cond = threading.Condition()
        self._finish_waiters = 0
        self.on_new_queue: Callable[[], None] = lambda: None  # wakes the sender thread if it sleeps
        self.on_callback: Callable[[], None] = lambda: None  # wakes the sender thread to run a callback

    # -- queueing -----------------------------------------------------------------------------------------

    def append(
        self, topic: str, record: tuple[Any, ...], size: int, plain: bool
    ) -> tuple[QueuedRecords, int]:
        """Queue ``record`` (see :class:`QueuedRecords`); returns its queue, its index there, and drains the
        topic first when its queue holds ``queue_bytes``."""
        with self.lock:
            p = self.pending.get(topic)
            if p is None:
                p = self.pending[topic] = QueuedRecords(self, topic)
                self.on_new_queue()
            records = p.records
            i = len(records) // FIELDS
            records += record
            nbytes = p.nbytes = p.nbytes + size
            if not plain:
                p.plain = False
        if nbytes >= self.config.queue_bytes:
            self.drain_topic(topic, p)
        return p, i

    def take_failed(self) -> list[QueuedRecords]:
        with self.lock:
            failed, self.failed = self.failed, []
        return failed

    # -- draining -----------------------------------------------------------------------------------------

    def _take(self, topic: str, p: QueuedRecords | None = None) -> QueuedRecords | None:
        with self.lock:
            cur = self.pending.get(topic)
            if cur is None or (p is not None and cur is not p):
                return None
            return self.pending.pop(topic)

    def drain_topic(self, topic: str, p: QueuedRecords | None = None) -> None:
        """Append the records queued for ``topic`` (under the drain lock, which keeps them in order), then,
        with ``acks="all"``, wait for their fsync outside it: drains of other threads append meanwhile, and
        the partition's next fsync covers them all (group commit)."""
        with self.drain_lock:
            taken = self._take(topic, p)
            if taken is None:
                return
            self.inflight.add(taken)
            durable = self._write(topic, taken)
        try:
            if durable:
                self._make_durable(topic, taken, durable)
        finally:
            self.inflight.discard(taken)

    def drain_all(self) -> None:
        for topic in list(self.pending):
            self.drain_topic(topic)

    def drain_for(self, p: QueuedRecords, timeout: float | None) -> None:
        """Drain ``p`` for a caller waiting on one of its records. With ``acks="all"`` and an fsync of this
        producer under way, first wait for that fsync: the records sent meanwhile then go out as one batch
        with one fsync (group commit), instead of one batch and one fsync per waiting caller."""
        if self.acks == "all" and self.inflight:
            with self._finished_cond:
                self._finish_waiters += 1
                try:
                    self._finished_cond.wait_for(
                        lambda: p.finished or not self.inflight or self.pending.get(p.topic) is not p,
                        timeout,
                    )
                finally:
                    self._finish_waiters -= 1
        if not p.finished:
            self.drain_topic(p.topic, p)

    def wait_finished(self, p: QueuedRecords, timeout: float | None) -> bool:
        """Wait until another thread finished writing ``p`` (a waiter registers before it checks, and the
        writer checks for waiters after it marked ``p`` finished, so no wake-up is lost)."""
        with self._finished_cond:
            self._finish_waiters += 1
            try:
                return self._finished_cond.wait_for(lambda: p.finished, timeout)
            finally:
                self._finish_waiters -= 1

    def fail_queued(self, exc: BaseException) -> None:
        """Fail every queued record with ``exc`` (the log was closed under the producer)."""
        with self.drain_lock:
            with self.lock:
                queued, self.pending = list(self.pending.values()), {}
            for p in queued:
                p.split()
                p.error = exc
                p.finished = True
                with self.lock:
                    self.failed.append(p)
            with self._finished_cond:
                self._finished_cond.notify_all()

    def _make_durable(self, topic: str, p: QueuedRecords, durable: list[tuple[PartitionLog, int]]) -> None:
        try:
            for plog, up_to in durable:
                plog.flush(up_to)
        except BaseException as exc:
            self._fail(topic, p, exc)
        finally:
            self._finish(p)

    def _fail(self, topic: str, p: QueuedRecords, exc: BaseException) -> None:
        if self.acks == "all":
            p.offsets = None  # not durable: none of them is acknowledged
        p.error = self._typed(topic, exc)
        with self.lock:
            self.failed.append(p)
        _log.debug("producer write to %s failed: %r", topic, exc)

    def _finish(self, p: QueuedRecords) -> None:
        p.finished = True
        self.inflight.discard(p)
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

    def _write(self, topic: str, p: QueuedRecords) -> list[tuple[PartitionLog, int]]:
        """Append ``p``'s records; returns what must be fsynced before they are acknowledged (``acks="all"``),
        else marks them finished."""
        durable: list[tuple[PartitionLog, int]] = []
        try:
            self._append_queued(topic, p, durable)
        except BaseException as exc:
            self._fail(topic, p, exc)
            durable = []
        if not durable:
            self._finish(p)
        return durable

    def _append_queued(self, topic: str, p: QueuedRecords, durable: list[tuple[PartitionLog, int]]) -> None:
        p.split()
        t = self.log.topic(topic)
        n = len(p.keys)
        now = self.log.clock.time_ms()
        if n <= SMALL_BATCH and t.num_partitions == 1 and self._fits_one_batch(t, p, n):
            self._write_small(t, p, now, durable)
            return
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
        """:meth:`_write` for a few records to a one-partition topic (a caller waiting on each send): one
        batch, built and acknowledged without numpy, whose per-call overhead would dominate."""
        n = len(p.keys)
        if p.plain or t.config.log_append_time:
            p.ts = [now] * n
        else:
            p.ts = [now if x < 0 else x for x in p.ts]
        p.partitions = [0] * n
        plog = t.partition(0)
        tp = TopicPartition(plog.topic, 0)
        fields = self._batch_fields(tp)
        headers = p.headers if not p.plain and any(p.headers) else None
        batch = encode_batch(0, p.keys, p.values, p.ts, headers, compression=self.compression(t), **fields)
        info = self._append_batch(plog, tp, batch, fields)
        if info.log_append_time >= 0:
            p.ts = [info.log_append_time] * n
        p.offsets = range(info.base_offset, info.last_offset + 1)
        if self.acks == "all":
            durable.append((plog, info.last_offset + 1))

    def _fits_one_batch(self, t: Topic, p: QueuedRecords, n: int) -> bool:
        if n == 1:
            return True  # send() checked that a record fits on its own
        limit = payload_limit(min(t.config.max_message_bytes, self.config.batch_size), self.compression(t))
        return p.nbytes + n * (PER_RECORD_MAX - PER_RECORD) <= limit

    def _assign_partitions(self, t: Topic, p: QueuedRecords) -> npt.NDArray[np.int32]:
        n = t.num_partitions
        if n == 1:
            p.partitions = [0] * len(p.keys)
            return np.zeros(len(p.keys), dtype=np.int32)
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

    def write_columns(
        self,
        t: Topic,
        kcol: Column,
        vcol: Column,
        partition: int | None,
        timestamps: npt.ArrayLike | None,
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]:
        """Append ``n`` records given as columns (``Producer.send_batch``), after what is queued for the topic;
        returns their partitions and offsets. Raises at once, writing nothing, for bad input."""
        n = len(kcol)
        sizes, largest = _column_sizes(t, kcol, vcol)
        now = self.log.clock.time_ms()
        ts: npt.NDArray[np.int64] | None = None  # None: every record gets ``now``
        if timestamps is not None:
            ts = np.asarray(timestamps, dtype=np.int64)
            if ts.shape != (n,) or (ts < 0).any():
                raise InvalidTimestampError("timestamps must be n integers >= 0")
            if t.config.log_append_time:
                ts = None
        if largest + HEADER_SIZE + LAYOUT_SIZE > t.config.max_message_bytes:
            raise RecordTooLargeError(f"a record exceeds max_message_bytes={t.config.max_message_bytes}")
        parts = self._column_partitions(t, kcol, vcol, partition, n)
        offsets = np.empty(n, dtype=np.int64)
        compression = self.compression(t)
        limit = payload_limit(t.config.max_message_bytes, compression)
        with self.drain_lock:
            self.drain_topic(t.name)
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

    def _column_partitions(
        self, t: Topic, kcol: Column, vcol: Column, partition: int | None, n: int
    ) -> npt.NDArray[np.int32]:
        if partition is not None:
            if (
                isinstance(partition, bool)
                or not isinstance(partition, int)
                or not 0 <= partition < t.num_partitions
            ):
                raise UnknownPartitionError(f"partition {partition!r} does not exist in topic {t.name!r}")
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


def _column_sizes(t: Topic, kcol: Column, vcol: Column) -> tuple[int | npt.NDArray[np.int64], int]:
    """Check ``send_batch``'s records for nulls; returns their sizes (one int when all have the same) and the
    largest."""
    if kcol.width is not None and vcol.width is not None:
        if kcol.width < 0 and vcol.width < 0:
            raise InvalidRecordError("a record has both key and value None")
        if t.config.compacted and kcol.width < 0:
            raise InvalidRecordError(f"topic {t.name!r} is compacted: every record needs a key")
        sizes: int | npt.NDArray[np.int64] = max(kcol.width, 0) + max(vcol.width, 0) + PER_RECORD_MAX
        return sizes, int(sizes)
    klens, vlens = kcol.lens, vcol.lens
    if ((klens < 0) & (vlens < 0)).any():
        raise InvalidRecordError("a record has both key and value None")
    if t.config.compacted and (klens < 0).any():
        raise InvalidRecordError(f"topic {t.name!r} is compacted: every record needs a key")
    sizes = np.maximum(klens, 0) + np.maximum(vlens, 0) + PER_RECORD_MAX
    return sizes, int(sizes.max())
