"""Produce: Kafka record batches written to pylog partitions.

Each partition's batches are decoded (:mod:`pylog.broker.records`) and appended through a pylog producer of
the broker's that stores keys, values and headers as the bytes the client sent (no serializer), with the
partition the client chose and the records' own timestamps. ``acks``:

- ``0``: written like ``1``; no response is sent (the client does not wait for one);
- ``1``: answered once the records are written to the operating system (they survive a crash of the
  broker's process, not a power loss);
- ``-1`` (``all``): answered once they are fsynced (pylog's ``acks="all"``), so an acknowledged record survives
  a power loss too: the single node is the whole in-sync replica set. The fsync runs after the broker's write
  lock is released (other requests write meanwhile) and is a group commit
  (:meth:`pylog.partition.log.PartitionLog.flush`): the acks=all requests of a partition written while an
  fsync runs share the next one, and each is answered once an fsync that started after its records were
  written has completed.

The broker writes a Kafka batch as one write of consecutive offsets (one partition write at a time), and
answers with the offset of its first record, as Kafka does. The records of an idempotent producer's batch
are stored in pylog batches stamped with its producer id, epoch and sequences
(:mod:`pylog.broker.idempotence`: the sequence checks survive a restart of the broker).

Thread-safety: handlers run in the event loop; the writes run in the context's thread pool.
"""

from __future__ import annotations

from typing import Any

from pylog.broker.context import Context
from pylog.broker.idempotence import DUPLICATE, PARTIAL, KafkaWriter, rest_of
from pylog.broker.protocol import ErrorCode, Request
from pylog.broker.records import InvalidBatchError, KafkaBatch, decode_batches
from pylog.errors import (
    InvalidRecordError,
    InvalidTimestampError,
    InvalidTopicError,
    LogClosedError,
    PylogError,
    RecordTooLargeError,
    StorageError,
    UnknownPartitionError,
    UnknownTopicError,
)
from pylog.producer import Producer
from pylog.record import decode_header

__all__ = ["produce"]


async def produce(ctx: Context, request: Request) -> dict[str, Any] | None:
    body = request.body
    acks = int(body.acks)
    responses = await ctx.run(_produce_all, ctx, body, acks)
    if acks == 0:
        return None
    return {"responses": responses, "throttle_time": 0}


def _produce_all(ctx: Context, body: Any, acks: int) -> list[dict[str, Any]]:
    out = []
    for topic_data in body.topic_data:
        parts = []
        for pd in topic_data.partition_data:
            code, base, start, message = _produce_partition(
                ctx, topic_data.name, int(pd.index), pd.records, acks
            )
            parts.append(
                {
                    "index": pd.index,
                    "error_code": code,
                    "base_offset": base,
                    "log_append_time": _append_time(ctx, topic_data.name, int(pd.index), code, base),
                    "log_start_offset": start,
                    "record_errors": [],
                    "error_message": message,
                }
            )
        out.append({"name": topic_data.name, "partition_responses": parts})
    return out


def _append_time(ctx: Context, topic: str, partition: int, code: ErrorCode, base: int) -> int:
    """The timestamp the log gave the records of a LogAppendTime topic (-1 for CreateTime), read from the
    stored batch, so that clients report the records' real timestamps."""
    if code != ErrorCode.none or base < 0:
        return -1
    try:
        t = ctx.log.topic(topic)
        if not t.config.log_append_time:
            return -1
        for buf, at in t.partition(partition).read_raw(base, 1):
            return decode_header(buf, at).max_timestamp
    except PylogError:
        pass
    return -1


def _produce_partition(
    ctx: Context, topic: str, partition: int, records: bytes | None, acks: int
) -> tuple[ErrorCode, int, int, str | None]:
    try:
        t = ctx.log.topic(topic)
        plog = t.partition(partition)
    except (UnknownTopicError, UnknownPartitionError):
        return ErrorCode.unknown_topic_or_partition, -1, -1, None
    except InvalidTopicError as exc:
        return ErrorCode.invalid_topic_exception, -1, -1, str(exc)
    try:
        batches = decode_batches(records or b"")
    except InvalidBatchError as exc:
        code = ErrorCode.unsupported_compression_type if exc.compression else ErrorCode.corrupt_message
        return code, -1, -1, str(exc)
    if not batches:
        return ErrorCode.corrupt_message, -1, -1, "no record batch"
    for batch in batches:
        if batch.control:
            return ErrorCode.invalid_record, -1, -1, "a producer does not write control batches"
    try:
        if any(batch.producer_id >= 0 for batch in batches):
            ctx.sequences.prepare(topic, partition, plog)  # the long part of load(), without the write lock
        base = -1
        with ctx.write_lock:
            for batch in batches:
                if batch.producer_id >= 0:
                    ctx.sequences.load(topic, partition, plog, compacted=t.config.compacted)
                    verdict, first, done = ctx.sequences.check(topic, partition, batch)
                    if isinstance(verdict, ErrorCode):
                        return verdict, -1, -1, None
                    if verdict != DUPLICATE:
                        if batch.transactional:
                            txn, code = ctx.transactions.producer_for(batch.producer_id, batch.producer_epoch)
                            if txn is None:
                                return code, -1, -1, None
                            first = _write_with(txn, topic, partition, batch)
                        else:
                            at = _write_idempotent(ctx, topic, partition, batch, done)
                            first = first if verdict == PARTIAL else at
                        ctx.sequences.written(topic, partition, batch, first)
                else:
                    first = _write(ctx, topic, partition, batch)
                if base < 0:
                    base = first
            end = plog.log_end_offset  # covers every record of this request (a duplicate's too)
        if acks == -1:
            plog.flush(end)  # without the write lock: the requests written meanwhile share the fsync
        return ErrorCode.none, base, plog.log_start_offset, None
    except RecordTooLargeError as exc:
        return ErrorCode.message_too_large, -1, -1, str(exc)
    except InvalidTimestampError as exc:
        return ErrorCode.invalid_timestamp, -1, -1, str(exc)
    except InvalidRecordError as exc:
        return ErrorCode.invalid_record, -1, -1, str(exc)
    except StorageError as exc:
        return ErrorCode.kafka_storage_error, -1, -1, str(exc)
    except LogClosedError as exc:
        return ErrorCode.not_leader_or_follower, -1, -1, str(exc)
    except PylogError as exc:
        return ErrorCode.unknown_server_error, -1, -1, f"{type(exc).__name__}: {exc}"


def _write_idempotent(ctx: Context, topic: str, partition: int, batch: KafkaBatch, done: int) -> int:
    """Append an idempotent batch's records from the ``done``-th on (0: all of them; more when a write of it
    failed part way before), in batches stamped with its producer id, epoch and sequences; the offset of the
    first record appended. After a failure the producers' state of the partition is rebuilt from the log at
    its next batch, so that a retry writes only what this write left out."""
    rest = rest_of(batch, done) if done else batch
    writer = ctx.writer(False)  # acks=all: fsynced by the caller, after the write lock
    try:
        with writer.stamped(batch.producer_id, batch.producer_epoch, rest.base_sequence):
            return _write_with(writer, topic, partition, rest)
    except BaseException:
        ctx.sequences.unload(topic, partition)
        raise


def _write(ctx: Context, topic: str, partition: int, batch: KafkaBatch) -> int:
    """Append one Kafka batch's records (not fsynced); the offset of the first."""
    return _write_with(ctx.writer(False), topic, partition, batch)


def _write_with(writer: Producer, topic: str, partition: int, batch: KafkaBatch) -> int:
    """Append one Kafka batch's records through ``writer``; the offset of the first. Records with headers,
    and a transaction's (which the record queue tags with the open transaction), go one by one; the others
    as columns."""
    if batch.headers is None and not batch.transactional:
        if isinstance(writer, KafkaWriter):  # the broker's own decoded bytes: no per-record type check
            return writer.write_decoded(topic, batch.keys, batch.values, partition, batch.timestamps)
        result = writer.send_batch(
            topic, batch.keys, batch.values, partition=partition, timestamps=batch.timestamps
        )
        return int(result.offsets[0])
    futures = [
        writer.send(topic, value, key, headers, partition, ts)  # None header values are stored
        for ts, key, value, headers in zip(
            batch.timestamps, batch.keys, batch.values, batch.headers or [[]] * len(batch), strict=True
        )
    ]
    writer.flush()
    return futures[0].get().offset
