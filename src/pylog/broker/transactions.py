"""Kafka transactions mapped onto pylog's: InitProducerId with a transactional id, AddPartitionsToTxn,
AddOffsetsToTxn, TxnOffsetCommit, EndTxn, and the transactional batches of Produce.

Each Kafka transactional id is served by one pylog transactional producer
(:class:`~pylog.idempotent.IdempotentProducer`, ``log.producer(transactional_id=...)``) owned by the broker:

============================  ================================================================================
Kafka                         pylog
============================  ================================================================================
InitProducerId(txn id)        ``init_transactions()``: the id's producer id and a new epoch (older instances
                              fenced, their open transaction aborted), transaction timeout from the request
AddPartitionsToTxn,           ``begin_transaction()`` when none is open
AddOffsetsToTxn
Produce (transactional)       the records appended through the producer: pylog's transactional batches, tagged
                              ``(producer id, epoch, txn)``, invisible to read_committed readers until commit
TxnOffsetCommit               ``send_offsets_to_transaction(offsets, group_id)``: committed with the records
EndTxn(commit / abort)        ``commit_transaction()`` / ``abort_transaction()``
============================  ================================================================================

So embedded ``read_committed`` consumers and Kafka ``read_committed`` consumers see the same thing: the broker's
Fetch applies pylog's visibility rule (:mod:`pylog.broker.fetch`). A request with an older epoch than the
id's current one is answered PRODUCER_FENCED (INVALID_PRODUCER_EPOCH before the versions that know it); one
for an id the broker has not initialized, INVALID_PRODUCER_ID_MAPPING. TxnOffsetCommit answers a partition that
does not exist UNKNOWN_TOPIC_OR_PARTITION and does not stage its offset.

Thread-safety: the producers are used from the thread pool, one call at a time per transactional id (a lock
per id).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from pylog.broker.protocol import ErrorCode, Request
from pylog.errors import CommitFailedError, ConfigError, IllegalStateError, ProducerFencedError, PylogError
from pylog.idempotent import IdempotentProducer
from pylog.structs import OffsetAndMetadata, TopicPartition

if TYPE_CHECKING:
    from pylog.broker.context import Context

__all__ = ["TRANSACTION_MAX_TIMEOUT_MS", "Transactions"]

T = TypeVar("T")

# Kafka's transaction.max.timeout.ms (15 minutes): an InitProducerId asking for a longer transaction timeout
# is refused with INVALID_TRANSACTION_TIMEOUT, as Kafka refuses it, rather than holding read_committed readers
# back for as long as the client asked.
TRANSACTION_MAX_TIMEOUT_MS = 900_000


@dataclass
class _Txn:
    producer: IdempotentProducer
    lock: threading.Lock = field(default_factory=threading.Lock)


class Transactions:
    """The broker's transactional producers, by transactional id (and by producer id for Produce)."""

    def __init__(self) -> None:
        self._by_id: dict[str, _Txn] = {}
        self._by_pid: dict[int, str] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            txns = list(self._by_id.values())
            self._by_id.clear()
            self._by_pid.clear()
        for t in txns:
            try:
                t.producer.close()  # an open transaction stays open: its timeout aborts it
            except PylogError:
                pass

    def init(self, ctx: Context, tid: str, timeout_ms: int) -> tuple[int, int]:
        """The id's producer id and new epoch; :class:`ConfigError` for a timeout out of Kafka's range (1 ms to
        :data:`TRANSACTION_MAX_TIMEOUT_MS`)."""
        if timeout_ms > TRANSACTION_MAX_TIMEOUT_MS:
            raise ConfigError(
                f"transaction timeout {timeout_ms} ms is above the broker's maximum, {TRANSACTION_MAX_TIMEOUT_MS} ms"
            )
        with self._lock:
            txn = self._by_id.get(tid)
            if txn is None or txn.producer.transaction_timeout_ms != timeout_ms:
                producer = ctx.log.producer(
                    transactional_id=tid,
                    value_serializer=None,
                    linger_ms=0,
                    transaction_timeout_ms=timeout_ms,
                )
                assert isinstance(producer, IdempotentProducer)
                if txn is not None:
                    txn.producer.close()
                txn = self._by_id[tid] = _Txn(producer)
        with txn.lock:
            txn.producer.init_transactions()
            pid, epoch = txn.producer.producer_id, txn.producer.producer_epoch
        with self._lock:
            self._by_pid[pid] = tid
        return pid, epoch

    def producer_for(self, pid: int, epoch: int) -> tuple[IdempotentProducer | None, ErrorCode]:
        """The transactional producer of a Produce batch with ``(pid, epoch)``, or an error code."""
        with self._lock:
            tid = self._by_pid.get(pid)
            txn = None if tid is None else self._by_id.get(tid)
        if txn is None:
            return None, ErrorCode.invalid_producer_id_mapping
        if txn.producer.producer_id != pid or txn.producer.producer_epoch != epoch:
            return None, ErrorCode.producer_fenced
        if txn.producer.open_transaction is None:
            return None, ErrorCode.invalid_txn_state
        return txn.producer, ErrorCode.none

    def call(
        self, tid: str, pid: int, epoch: int, fn: Callable[[IdempotentProducer], T]
    ) -> tuple[ErrorCode, T | None]:
        """``fn(producer)`` for transactional id ``tid`` after checking the request's producer id and epoch."""
        with self._lock:
            txn = self._by_id.get(tid)
        if txn is None or txn.producer.producer_id != pid:
            return ErrorCode.invalid_producer_id_mapping, None
        if txn.producer.producer_epoch != epoch:
            return ErrorCode.producer_fenced, None
        with txn.lock:
            try:
                return ErrorCode.none, fn(txn.producer)
            except ProducerFencedError:
                return ErrorCode.producer_fenced, None
            except CommitFailedError:
                return ErrorCode.illegal_generation, None
            except (IllegalStateError, ConfigError):
                return ErrorCode.invalid_txn_state, None


def _begin(producer: IdempotentProducer) -> None:
    if producer.open_transaction is None:
        producer.begin_transaction()


def _fenced(request: Request, code: ErrorCode) -> ErrorCode:
    """PRODUCER_FENCED is INVALID_PRODUCER_EPOCH in the versions before it existed (EndTxn etc. < 2)."""
    if code == ErrorCode.producer_fenced and request.version < 2:
        return ErrorCode.invalid_producer_epoch
    return code


async def add_partitions(ctx: Context, request: Request) -> dict[str, Any]:
    body = request.body
    code, _ = await ctx.run(
        ctx.transactions.call,
        str(body.v3_and_below_transactional_id),
        int(body.v3_and_below_producer_id),
        int(body.v3_and_below_producer_epoch),
        _begin,
    )
    code = _fenced(request, code)
    return {
        "throttle_time": 0,
        "results_by_topic_v3_and_below": [
            {
                "name": t.name,
                "results_by_partition": [
                    {"partition_index": p, "partition_error_code": code} for p in t.partitions
                ],
            }
            for t in body.v3_and_below_topics
        ],
    }


async def add_offsets(ctx: Context, request: Request) -> dict[str, Any]:
    body = request.body
    code, _ = await ctx.run(
        ctx.transactions.call,
        str(body.transactional_id),
        int(body.producer_id),
        int(body.producer_epoch),
        _begin,
    )
    return {"throttle_time": 0, "error_code": _fenced(request, code)}


async def txn_offset_commit(ctx: Context, request: Request) -> dict[str, Any]:
    body = request.body
    offsets = {
        TopicPartition(str(t.name), int(p.partition_index)): OffsetAndMetadata(
            int(p.committed_offset), p.committed_metadata or ""
        )
        for t in body.topics
        for p in t.partitions
    }
    group_id = str(body.group_id)

    def send(producer: IdempotentProducer) -> dict[TopicPartition, ErrorCode]:
        """Stage the offsets of partitions that exist; the others (not staged), UNKNOWN_TOPIC_OR_PARTITION
        as Kafka answers. An offset outside [0, the partition's end] is not staged either and answered
        OFFSET_OUT_OF_RANGE: a commit may not pass a record that exists nowhere (pylog's rule; the transaction
        could not commit with it)."""
        counts: dict[str, int] = {}  # topic -> its partition count (0: no such topic)
        for tp in offsets:
            if tp.topic not in counts:
                counts[tp.topic] = (
                    ctx.log.topic(tp.topic).num_partitions if ctx.log.has_topic(tp.topic) else 0
                )
        refused = {
            tp: ErrorCode.unknown_topic_or_partition
            for tp in offsets
            if not 0 <= tp.partition < counts[tp.topic]
        }
        for tp, om in offsets.items():
            if tp not in refused:
                end = ctx.log.topic(tp.topic).partition(tp.partition).log_end_offset
                if not 0 <= om.offset <= end:
                    refused[tp] = ErrorCode.offset_out_of_range
        _begin(producer)
        producer.send_offsets_to_transaction(
            {tp: om for tp, om in offsets.items() if tp not in refused}, group_id
        )
        return refused

    code, refused = await ctx.run(
        ctx.transactions.call,
        str(body.transactional_id),
        int(body.producer_id),
        int(body.producer_epoch),
        send,
    )
    code = _fenced(request, code)
    return {
        "throttle_time": 0,
        "topics": [
            {
                "name": t.name,
                "partitions": [
                    {
                        "partition_index": p.partition_index,
                        "error_code": (refused or {}).get(
                            TopicPartition(str(t.name), int(p.partition_index)), code
                        ),
                    }
                    for p in t.partitions
                ],
            }
            for t in body.topics
        ],
    }


async def end_txn(ctx: Context, request: Request) -> dict[str, Any]:
    body = request.body
    commit = bool(body.committed)

    def end(producer: IdempotentProducer) -> None:
        if producer.open_transaction is None:
            return  # nothing was added to it: nothing to decide
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()

    code, _ = await ctx.run(
        ctx.transactions.call,
        str(body.transactional_id),
        int(body.producer_id),
        int(body.producer_epoch),
        end,
    )
    return {"throttle_time": 0, "error_code": _fenced(request, code)}
