"""Idempotent Kafka producers: InitProducerId and the sequence checks of Produce.

InitProducerId gives a producer an id from pylog's producer-id allocator (the log directory's ``producers``
file, :meth:`pylog.transactions.TxnLog.allocate_pid`: ids are never reused, by the broker or by pylog's own
idempotent producers) and epoch 0. Called again with its id and epoch (KIP-360, after a fatal sequence
error) it bumps the epoch; with an epoch older than the one the broker knows, it is refused
(INVALID_PRODUCER_EPOCH); with an id the broker does not know (its state expired, see below), the producer
gets a new id, as Kafka gives producers without a transactional id.

Each batch of an idempotent producer carries ``(producerId, producerEpoch, baseSequence)``; per producer
and partition the broker remembers the epoch and the last five batches written (Kafka's
``max.in.flight.requests.per.connection`` limit for idempotence), and checks each new batch as Kafka does:

- an epoch older than the one known: INVALID_PRODUCER_EPOCH (a fenced, older instance);
- a batch equal to one of the last five (same first and last sequence): a retry of a batch already written,
  answered with that batch's offset and not written again;
- otherwise its first sequence must follow the last one written (0 after an epoch bump), else
  OUT_OF_ORDER_SEQUENCE_NUMBER.

The state survives a restart of the broker (a graceful stop or a killed process): the broker stores the
records of an idempotent batch in pylog batches stamped with the Kafka producer's id, epoch and the sequence
of their first record (:class:`KafkaWriter`; a Kafka batch is one pylog batch, or a few consecutive ones
when it is larger than a pylog batch may be), and the first time after a start that an idempotent batch
comes for a partition it reads the batch headers of the partition's tail, the last :data:`STATE_WINDOW`
offsets (1,000,000; fewer when they hold more than about :data:`STATE_BATCHES`, 100,000 batches, estimated
from the batches at the end), and rebuilds every producer's epoch and last batches from them (Kafka rebuilds
its producer state from the log the same way, from a snapshot on). The read is done without the broker's
write lock: only the batches for that partition wait for it (about 1 s for 100,000 batches of one record on
a loaded 2-core machine, 50 ms for 1,000,000 records in 1,000-record batches). So a retry of a batch written just before the restart is
answered as a duplicate with its offset, a sequence gap is refused, and a batch with an epoch older than
the newest one in the partition is refused. The bound: a producer whose last batch in the partition is
older than the window is unknown after a restart, and its next batch is accepted at whatever sequence it
carries, as Kafka accepts the next batch of a producer whose state expired (``producer.id.expiration.ms``).
The same headers make a write that failed part way safe to retry: a Kafka batch stored as several pylog
batches whose write fails after some of them (a storage error) leaves the partition's state to be rebuilt,
and the client's retry of the batch writes only the records left out, answered with the batch's first
offset. On a compacted topic, a producer whose last batch is in a segment the cleaner may have rewritten
(any but the active one) keeps only its epoch: compaction may drop a batch's first records, after which its
sequences no longer follow from its offsets. Transactional batches are not rebuilt: after a restart a transaction that was open is aborted by its
timeout, and its producer's next request is refused (INVALID_PRODUCER_ID_MAPPING) until it initializes
again.

Thread-safety: :class:`Sequences` is used under the context's write lock, but for :meth:`Sequences.prepare`
(thread-safe, called before taking it); a :class:`KafkaWriter` is stamped under it too (one Kafka batch
written at a time).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pylog.batching import Column
from pylog.broker.protocol import ErrorCode, Request
from pylog.broker.records import KafkaBatch
from pylog.errors import ConfigError, InvalidRecordError, LogClosedError, OffsetOutOfRangeError
from pylog.producer import Producer
from pylog.record import ATTR_CONTROL, ATTR_TRANSACTIONAL, decode_header

if TYPE_CHECKING:
    from pylog.broker.context import Context
    from pylog.partition.log import AppendInfo, PartitionLog
    from pylog.structs import TopicPartition

__all__ = [
    "DUPLICATE",
    "PARTIAL",
    "STATE_WINDOW",
    "WRITE",
    "KafkaWriter",
    "Sequences",
    "init_producer_id",
    "rest_of",
]

WRITE = "write"
DUPLICATE = "duplicate"
PARTIAL = "partial"
#: Offsets at the end of a partition read to rebuild its producers' state after a start ...
STATE_WINDOW = 1_000_000
#: ... and about how many batches of them at most (estimated from the batches at the partition's end).
STATE_BATCHES = 100_000
_KEPT = 5
# batches remembered per producer and partition when rebuilt from the log: pylog batches, several of which
# may hold one Kafka batch, so more than five, to cover the last five Kafka batches
_KEPT_REBUILT = 64
_MAX_SEQ = 0x7FFFFFFF
_PROBE_OFFSETS = 10_000
_PROBE_BYTES = 1 << 20


@dataclass
class _Partition:
    epoch: int
    batches: deque[tuple[int, int, int]] = field(
        default_factory=lambda: deque(maxlen=_KEPT)
    )  # first, last, offset
    # batches read from the log: a Kafka batch may be several consecutive entries
    pieces: bool = False


class Sequences:
    """What the broker remembers of idempotent producers, per (producer id, topic, partition)."""

    def __init__(self, window: int = STATE_WINDOW, batches: int = STATE_BATCHES) -> None:
        self._state: dict[tuple[int, str, int], _Partition] = {}
        self._loaded: set[tuple[str, int]] = set()
        # read ahead of load() without the write lock: (offset read up to, the state found)
        self._read: dict[tuple[str, int], tuple[int, dict[int, _Partition]]] = {}
        self._reading: dict[tuple[str, int], threading.Lock] = {}
        self._lock = threading.Lock()
        self.window = window
        self.batches = batches
        self.epochs: dict[int, int] = {}  # producer id -> current epoch (InitProducerId)

    def prepare(self, topic: str, partition: int, plog: PartitionLog) -> None:
        """Read the partition's tail for :meth:`load` ahead of it, without the write lock (the long part,
        which the writes to other partitions need not wait for); once after a start. Thread-safe."""
        key = (topic, partition)
        if key in self._loaded:
            return
        with self._lock:
            lock = self._reading.setdefault(key, threading.Lock())
        with lock:  # one reader per partition; the others wait for what it found
            if key in self._loaded or key in self._read:
                return
            end = plog.log_end_offset
            found: dict[int, _Partition] = {}
            _scan(plog, _window_start(plog, end, self.window, self.batches), end, found)
            self._read[key] = (end, found)

    def load(self, topic: str, partition: int, plog: PartitionLog, *, compacted: bool = False) -> None:
        """Rebuild the state of the producers that wrote to the partition from its tail, once after a start
        (before its first idempotent batch is checked): what :meth:`prepare` read, and the batches written
        since. ``compacted``: the topic is compacted, where a batch of a cleaned segment keeps its first
        sequence but may have lost its first records: a producer whose last batch lies before the active
        segment (never cleaned) keeps only its epoch, and its next batch is accepted at any sequence."""
        key = (topic, partition)
        if key in self._loaded:
            return
        end = plog.log_end_offset
        read = self._read.pop(key, None)
        if read is None:
            found: dict[int, _Partition] = {}
            _scan(plog, _window_start(plog, end, self.window, self.batches), end, found)
        else:
            _scan(plog, read[0], end, read[1])
            found = read[1]
        exact = plog.segments[-1].base_offset if compacted else -1
        for pid, state in found.items():
            if state.batches and state.batches[-1][2] < exact:
                state.batches.clear()
            self._state[(pid, topic, partition)] = state
            if state.epoch > self.epochs.get(pid, -1):
                self.epochs[pid] = state.epoch
        self._loaded.add(key)

    def unload(self, topic: str, partition: int) -> None:
        """Forget the partition's state, to rebuild it from the log at its next batch (after a write that
        failed part way: what was written of the batch is found there)."""
        self._loaded.discard((topic, partition))
        self._read.pop((topic, partition), None)
        for key in [k for k in self._state if k[1:] == (topic, partition)]:
            del self._state[key]

    def check(self, topic: str, partition: int, batch: KafkaBatch) -> tuple[str | ErrorCode, int, int]:
        """``(WRITE, -1, 0)``; ``(DUPLICATE, base offset of the batch already written, its length)``;
        ``(PARTIAL, base offset, n)`` when a write of this batch failed after its first ``n`` records (the
        rest is to be written); or ``(an error code, -1, 0)``."""
        pid, epoch, first = batch.producer_id, batch.producer_epoch, batch.base_sequence
        last = _add(first, len(batch) - 1)
        known = self.epochs.get(pid)
        if known is not None and epoch < known:
            return ErrorCode.invalid_producer_epoch, -1, 0
        state = self._state.get((pid, topic, partition))
        if state is None or epoch > state.epoch:
            if state is not None and first != 0:
                return ErrorCode.out_of_order_sequence_number, -1, 0
            return WRITE, -1, 0
        if epoch < state.epoch:
            return ErrorCode.invalid_producer_epoch, -1, 0
        offset, done = _written(state, first, last)
        if done == len(batch):
            return DUPLICATE, offset, done
        if done:
            return PARTIAL, offset, done
        if state.batches and first != _add(state.batches[-1][1], 1):
            return ErrorCode.out_of_order_sequence_number, -1, 0
        return WRITE, -1, 0

    def written(self, topic: str, partition: int, batch: KafkaBatch, base_offset: int) -> None:
        key = (batch.producer_id, topic, partition)
        state = self._state.get(key)
        if state is None or batch.producer_epoch > state.epoch:
            state = self._state[key] = _Partition(batch.producer_epoch)
        state.batches.append((batch.base_sequence, _add(batch.base_sequence, len(batch) - 1), base_offset))


def _written(state: _Partition, first: int, last: int) -> tuple[int, int]:
    """``(offset, n)``: the batch ``first..last`` is among those remembered, at ``offset``, with ``n`` of its
    records: all of them, or, when a write of it failed part way, the first ``n`` (the last ones written to
    the partition); else ``(-1, 0)``. Entries rebuilt from the log are pylog batches: the Kafka batch is a run
    of consecutive ones from ``first``."""
    entries = list(state.batches)
    for i, (f, la, offset) in enumerate(entries):
        if f != first:
            continue
        if la == last:
            return offset, _add(last, 1 - first)
        if not state.pieces:
            continue
        for f2, la2, _ in entries[i + 1 :]:
            if f2 != _add(la, 1):
                break
            la = la2
            if la == last:
                return offset, _add(last, 1 - first)
        if la == entries[-1][1] and _add(la, -first) < _add(last, -first):  # a prefix, written last
            return offset, _add(la, 1 - first)
    return -1, 0


def _window_start(plog: PartitionLog, end: int, window: int, batches: int) -> int:
    """Where the rebuild reads from: the last ``window`` offsets before ``end``, fewer when they hold more
    than about ``batches`` batches at the density of the batches at the end (small batches)."""
    start = max(plog.log_start_offset, end - window)
    try:
        chunk = plog.read_raw(max(start, end - _PROBE_OFFSETS), _PROBE_BYTES)
    except OffsetOutOfRangeError:
        return start
    if not chunk:
        return start
    first = decode_header(*chunk[0]).base_offset
    span = decode_header(*chunk[-1]).next_offset - first
    return max(start, end - batches * max(span, 1) // len(chunk))


def _scan(plog: PartitionLog, offset: int, end: int, out: dict[int, _Partition]) -> None:
    """Add to ``out``, per producer id, the epoch and last batches of the idempotent (not transactional)
    batches of ``plog`` from ``offset`` to ``end``: batch headers only."""
    for h in plog.headers(offset, end):
        if h.producer_id < 0 or h.base_sequence < 0 or h.attributes & (ATTR_TRANSACTIONAL | ATTR_CONTROL):
            continue
        state = out.get(h.producer_id)
        if state is None or h.producer_epoch > state.epoch:
            state = out[h.producer_id] = _Partition(
                h.producer_epoch, deque(maxlen=_KEPT_REBUILT), pieces=True
            )
        elif h.producer_epoch < state.epoch:
            continue
        span = h.last_offset - h.base_offset
        state.batches.append((h.base_sequence, _add(h.base_sequence, span), h.base_offset))


def rest_of(batch: KafkaBatch, n: int) -> KafkaBatch:
    """``batch`` without its first ``n`` records (what is left to write of it after a partial write)."""
    return replace(
        batch,
        base_sequence=_add(batch.base_sequence, n),
        timestamps=batch.timestamps[n:],
        keys=batch.keys[n:],
        values=batch.values[n:],
        headers=None if batch.headers is None else batch.headers[n:],
    )


def _add(sequence: int, n: int) -> int:
    """Kafka's sequences wrap from 2**31 - 1 to 0."""
    return (sequence + n) % (_MAX_SEQ + 1)


class KafkaWriter(Producer):
    """The broker's producer of Kafka clients' records (bytes in, bytes stored). Within :meth:`stamped` the
    batches it writes carry a Kafka idempotent producer's id and epoch, and the sequence of their first
    record (what :class:`Sequences` rebuilds its state from after a restart); otherwise none."""

    def __init__(self, log: Any, **settings: Any) -> None:
        super().__init__(log, **settings)
        self._stamp: list[int] | None = None  # producer id, epoch, sequence of the next record

    @contextmanager
    def stamped(self, producer_id: int, epoch: int, sequence: int) -> Iterator[None]:
        """Stamp the batches written meanwhile (the records of one Kafka batch, written and flushed)."""
        self._stamp = [producer_id, epoch, sequence]
        try:
            yield
        finally:
            self._stamp = None

    def write_decoded(
        self,
        topic: str,
        keys: list[bytes | None],
        values: list[bytes | None],
        partition: int,
        timestamps: list[int],
    ) -> int:
        """``send_batch(topic, keys, values, partition=partition, timestamps=timestamps)`` for the columns of a
        Kafka batch the broker decoded (lists of ``bytes`` or None of the same length, which it does not
        change): the same checks of the records as a whole (sizes, nulls, timestamps, partition), without
        :meth:`send_batch`'s check of each key's and value's type, and with Kafka's rule for nulls: a record
        with a null key and a null value is stored (refused only on a compacted topic, for its null key). The
        offset of the first record."""
        if self._closed:
            raise LogClosedError("the producer is closed")
        t = self._topics.get(topic)
        if t is None:
            t = self.log.topic(topic)
        if not keys or len(keys) != len(values):
            raise InvalidRecordError(f"a record batch of {len(keys)} keys and {len(values)} values")
        _, offsets = self._acc.write_columns(
            t, Column.of_bytes(keys), Column.of_bytes(values), partition, timestamps, null_records=True
        )
        return int(offsets[0])

    def _batch_fields(self, tp: TopicPartition) -> Mapping[str, Any]:
        stamp = self._stamp
        if stamp is None:
            return super()._batch_fields(tp)
        return {"producer_id": stamp[0], "producer_epoch": stamp[1], "base_sequence": stamp[2]}

    def _append_batch(
        self, plog: PartitionLog, tp: TopicPartition, batch: bytes | bytearray, fields: Mapping[str, Any]
    ) -> AppendInfo:
        info = super()._append_batch(plog, tp, batch, fields)
        stamp = self._stamp
        if stamp is not None and "base_sequence" in fields:
            stamp[2] = _add(int(fields["base_sequence"]), info.last_offset - info.base_offset + 1)
        return info


async def init_producer_id(ctx: Context, request: Request) -> dict[str, Any]:
    body = request.body
    answer: dict[str, Any] = {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "producer_id": -1,
        "producer_epoch": -1,
    }
    if body.transactional_id is not None:
        timeout_ms = int(body.transaction_timeout.total_seconds() * 1000)
        try:
            pid, epoch = await ctx.run(ctx.transactions.init, ctx, str(body.transactional_id), timeout_ms)
        except ConfigError:
            answer["error_code"] = ErrorCode.invalid_transaction_timeout
            return answer
        with ctx.write_lock:
            ctx.sequences.epochs[pid] = epoch
        answer.update(producer_id=pid, producer_epoch=epoch)
        return answer
    pid, epoch = int(getattr(body, "producer_id", -1)), int(getattr(body, "producer_epoch", -1))
    with ctx.write_lock:
        epochs = ctx.sequences.epochs
        known = epochs.get(pid) if pid >= 0 else None
        # an epoch newer than the one known: bumped before a restart, and not seen in a partition since
        if known is not None and epoch >= known:
            epochs[pid] = epoch + 1
            answer.update(producer_id=pid, producer_epoch=epoch + 1)
            return answer
        if known is not None:
            answer["error_code"] = ErrorCode.invalid_producer_epoch
            return answer
    new = await ctx.run(lambda: ctx.log.transactions().allocate_pid())
    with ctx.write_lock:
        ctx.sequences.epochs[new] = 0
    answer.update(producer_id=new, producer_epoch=0)
    return answer
