"""Idempotent Kafka producers: InitProducerId and the sequence checks of Produce.

InitProducerId gives a producer an id from pylog's producer-id allocator (the log directory's ``producers``
file, :meth:`pylog.transactions.TxnLog.allocate_pid`: ids are never reused, by the broker or by pylog's own
idempotent producers) and epoch 0; called again with its id and epoch (KIP-360, after a fatal sequence
error) it bumps the epoch.

Each batch of an idempotent producer carries ``(producerId, producerEpoch, baseSequence)``; per producer
and partition the broker remembers the epoch and the last five batches written (Kafka's
``max.in.flight.requests.per.connection`` limit for idempotence), and checks each new batch as Kafka does:

- an epoch older than the one known: INVALID_PRODUCER_EPOCH (a fenced, older instance);
- a batch equal to one of the last five (same first and last sequence): a retry of a batch already written,
  answered with that batch's offset and not written again;
- otherwise its first sequence must follow the last one written (0 after an epoch bump), else
  OUT_OF_ORDER_SEQUENCE_NUMBER.

The state is kept in the broker's memory: after a restart of the broker a producer's next batch is accepted
at whatever sequence it carries, so a retry of a batch written just before the restart can be written
twice (Kafka keeps it in producer snapshots; pylog's broker does not yet).

Thread-safety: :class:`Sequences` is used under the context's write lock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pylog.broker.protocol import ErrorCode, Request
from pylog.broker.records import KafkaBatch
from pylog.errors import ConfigError

if TYPE_CHECKING:
    from pylog.broker.context import Context

__all__ = ["DUPLICATE", "WRITE", "Sequences", "init_producer_id"]

WRITE = "write"
DUPLICATE = "duplicate"
_KEPT = 5
_MAX_SEQ = 0x7FFFFFFF


@dataclass
class _Partition:
    epoch: int
    batches: deque[tuple[int, int, int]] = field(
        default_factory=lambda: deque(maxlen=_KEPT)
    )  # first, last, offset


class Sequences:
    """What the broker remembers of idempotent producers, per (producer id, topic, partition)."""

    def __init__(self) -> None:
        self._state: dict[tuple[int, str, int], _Partition] = {}
        self.epochs: dict[int, int] = {}  # producer id -> current epoch (InitProducerId)

    def check(self, topic: str, partition: int, batch: KafkaBatch) -> tuple[str | ErrorCode, int]:
        """(WRITE, -1), (DUPLICATE, base offset of the batch already written) or (an error code, -1)."""
        pid, epoch, first = batch.producer_id, batch.producer_epoch, batch.base_sequence
        last = _add(first, len(batch) - 1)
        known = self.epochs.get(pid)
        if known is not None and epoch < known:
            return ErrorCode.invalid_producer_epoch, -1
        state = self._state.get((pid, topic, partition))
        if state is None or epoch > state.epoch:
            if state is not None and first != 0:
                return ErrorCode.out_of_order_sequence_number, -1
            return WRITE, -1
        if epoch < state.epoch:
            return ErrorCode.invalid_producer_epoch, -1
        for f, la, offset in state.batches:
            if (f, la) == (first, last):
                return DUPLICATE, offset
        if state.batches and first != _add(state.batches[-1][1], 1):
            return ErrorCode.out_of_order_sequence_number, -1
        return WRITE, -1

    def written(self, topic: str, partition: int, batch: KafkaBatch, base_offset: int) -> None:
        key = (batch.producer_id, topic, partition)
        state = self._state.get(key)
        if state is None or batch.producer_epoch > state.epoch:
            state = self._state[key] = _Partition(batch.producer_epoch)
        state.batches.append((batch.base_sequence, _add(batch.base_sequence, len(batch) - 1), base_offset))


def _add(sequence: int, n: int) -> int:
    """Kafka's sequences wrap from 2**31 - 1 to 0."""
    return (sequence + n) % (_MAX_SEQ + 1)


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
        if pid >= 0 and epochs.get(pid) == epoch:
            epochs[pid] = epoch + 1
            answer.update(producer_id=pid, producer_epoch=epoch + 1)
            return answer
        if pid >= 0:
            answer["error_code"] = (
                ErrorCode.invalid_producer_epoch if pid in epochs else ErrorCode.unknown_producer_id
            )
            return answer
    new = await ctx.run(lambda: ctx.log.transactions().allocate_pid())
    with ctx.write_lock:
        ctx.sequences.epochs[new] = 0
    answer.update(producer_id=new, producer_epoch=0)
    return answer
