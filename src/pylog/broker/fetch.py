"""Fetch and ListOffsets: reading pylog partitions as Kafka record batches.

A Fetch reads each partition from its fetch offset, up to ``partition_max_bytes`` (and ``max_bytes`` in all),
whole pylog batches, the first one the batch that contains the fetch offset (clients skip the records before
it), always at least one batch so that a batch larger than the limits is still returned (Kafka's KIP-74). Each
pylog batch becomes one Kafka batch with the same offsets (:func:`pylog.broker.records.from_pylog`).

Long polling: when fewer than ``min_bytes`` were found, the fetch waits up to ``max_wait_ms`` for a writer to
publish in one of its partitions (the doorbell, :mod:`pylog.broker.waiting`), then reads again.

``isolation_level`` 1 (read_committed) applies pylog's transaction rule (:mod:`pylog.partition.visibility`):
a batch of an aborted transaction is not returned, and reading stops before a transaction still open; a
transaction open past its timeout is aborted then (at most once a second), as pylog's consumers do.
The offsets of batches left out are covered by an empty Kafka batch so that the client moves past them, and
``aborted_transactions`` is empty: the client has nothing left to filter (pylog writes no transaction
markers, so no control batch is sent either). ``last_stable_offset`` is the partition's
(:func:`last_stable_offset`), also when the batches read end before it, so that clients compute their
read_committed lag and watermarks from it as from Kafka's. ``read_uncommitted`` returns every batch, those
of aborted and open transactions included, as Kafka does. ``high_watermark`` is the log end offset.

ListOffsets: earliest (the log start), latest, by timestamp (the first record at or after it) and max
timestamp (KIP-734). Under ``isolation_level`` read_committed (v2+), as Kafka: latest is the last stable
offset (:func:`last_stable_offset`: the first offset of the earliest transaction still open, else the log
end), and an offset by timestamp or max timestamp is answered only below it (else none: offset -1).

Thread-safety: handlers run in the event loop; the reads run in the context's thread pool.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pylog.broker.context import Context
from pylog.broker.protocol import ErrorCode, Request
from pylog.broker.records import empty_batch, from_pylog
from pylog.broker.waiting import Marks
from pylog.errors import (
    CorruptRecordError,
    InvalidTopicError,
    OffsetOutOfRangeError,
    PylogError,
    UnknownPartitionError,
    UnknownTopicError,
    UnsupportedFormatError,
)
from pylog.partition.visibility import OPEN, VISIBLE, Visibility
from pylog.record import check_crc, decode_header, decode_lists

if TYPE_CHECKING:
    from pylog.partition.log import PartitionLog

__all__ = ["fetch", "last_stable_offset", "list_offsets"]

EARLIEST = -2
LATEST = -1
MAX_TIMESTAMP = -3  # ListOffsets v7+: the record with the largest timestamp (KIP-734)
_DAMAGED = (CorruptRecordError, UnsupportedFormatError)  # a stored batch that cannot be trusted


@dataclass
class _Part:
    topic: str
    partition: int
    offset: int
    max_bytes: int


async def fetch(ctx: Context, request: Request) -> dict[str, Any]:
    body = request.body
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(int(body.max_wait.total_seconds() * 1000), 0) / 1000
    min_bytes = int(body.min_bytes)
    max_bytes = int(getattr(body, "max_bytes", 0x7FFFFFFF))
    committed = int(getattr(body, "isolation_level", 0)) == 1
    parts = [
        _Part(t.topic, int(p.partition), int(p.fetch_offset), int(p.partition_max_bytes))
        for t in body.topics
        for p in t.partitions
    ]
    while True:
        marks, responses, size = await ctx.run(_marked_read, ctx, parts, max_bytes, committed)
        left = deadline - loop.time()
        if size >= min_bytes or left <= 0 or ctx.waiters.released:
            return {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0, "responses": responses}
        await ctx.waiters.wait(marks, left)


def _marked_read(
    ctx: Context, parts: list[_Part], max_bytes: int, committed: bool
) -> tuple[Marks | None, list[dict[str, Any]], int]:
    """The doorbell marks of the partitions, taken before reading them (a publish after the read is then seen
    by the wait), and the read: one trip to the thread pool."""
    marks = ctx.waiters.marks(_directories(ctx, parts))
    return (marks, *_read_all(ctx, parts, max_bytes, committed))


def _directories(ctx: Context, parts: list[_Part]) -> list[str]:
    out = []
    for p in parts:
        try:
            out.append(ctx.log.topic(p.topic).partition(p.partition).directory)
        except (UnknownTopicError, UnknownPartitionError, InvalidTopicError, *_DAMAGED):
            pass  # answered by the read (a partition that cannot be opened: CORRUPT_MESSAGE)
    return out


def _read_all(
    ctx: Context, parts: list[_Part], max_bytes: int, committed: bool
) -> tuple[list[dict[str, Any]], int]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    total = 0
    visibility = None
    if committed:
        txns = ctx.log.txn_decisions()
        visibility = Visibility(txns.status, lambda: ctx.expire_transactions(txns))
    for p in parts:
        limit = min(p.max_bytes, max_bytes - total) if total else p.max_bytes
        data = _read_partition(ctx, p, max(limit, 0), visibility)
        total += len(data.get("records") or b"")
        by_topic.setdefault(p.topic, []).append(data)
    return [{"topic": t, "partitions": ps} for t, ps in by_topic.items()], total


def _read_partition(ctx: Context, p: _Part, limit: int, visibility: Visibility | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "partition_index": p.partition,
        "error_code": ErrorCode.none,
        "high_watermark": -1,
        "last_stable_offset": -1,
        "log_start_offset": -1,
        "aborted_transactions": None,
        "preferred_read_replica": -1,
        "records": b"",  # an error is answered with no records, not null ones: librdkafka cannot parse null
    }
    try:
        plog = ctx.log.topic(p.topic).partition(p.partition)
        end = plog.log_end_offset
        out["high_watermark"] = out["last_stable_offset"] = end
        if visibility is not None:
            out["last_stable_offset"] = min(last_stable_offset(ctx, plog, visibility), end)
        out["log_start_offset"] = plog.log_start_offset
        if p.offset == end or limit <= 0:
            out["records"] = b""
            return out
        raw = _read_intact(plog, p.offset, max(limit, 1))
    except (UnknownTopicError, UnknownPartitionError, InvalidTopicError):
        out["error_code"] = ErrorCode.unknown_topic_or_partition
        return out
    except OffsetOutOfRangeError:
        out["error_code"] = ErrorCode.offset_out_of_range
        return out
    except _DAMAGED:
        out["error_code"] = ErrorCode.corrupt_message
        return out
    except PylogError:
        out["error_code"] = ErrorCode.kafka_storage_error
        return out
    chunks, damaged = _translate(raw, visibility, out)
    out["records"] = b"".join(chunks)
    if damaged and not chunks:
        out["error_code"] = ErrorCode.corrupt_message
    if visibility is not None:
        out["aborted_transactions"] = []
    return out


def _read_intact(plog: PartitionLog, offset: int, limit: int) -> list[tuple[memoryview | bytes, int]]:
    """The stored batches from the one holding ``offset``, up to ``limit`` bytes. A read of several batches
    fails as a whole when one of them is damaged (a base offset that does not continue the batch before it):
    the read is then done again one batch at a time, up to the damaged one, so that the intact batches before
    it are still served. Raises the damage when the first batch is the damaged one."""
    try:
        return plog.read_raw(offset, limit)
    except _DAMAGED:
        pass
    out: list[tuple[memoryview | bytes, int]] = []
    total = 0
    while total < limit:
        try:
            got = plog.read_raw(offset, 1)
        except _DAMAGED:
            if out:
                break
            raise
        if not got:
            break
        header = decode_header(*got[0])
        out.append(got[0])
        total += header.batch_length
        offset = header.next_offset
    return out


def _translate(
    raw: list[tuple[memoryview | bytes, int]], visibility: Visibility | None, out: dict[str, Any]
) -> tuple[list[bytes], bool]:
    """The Kafka batches of the stored batches ``raw``, up to the first damaged one (its CRC or records fail
    the checks): the client receives the intact batches before it, and its next fetch, starting at the
    damaged batch, is answered CORRUPT_MESSAGE. Second: whether a damaged batch ended them.

    Under read_committed the batches left out (aborted transactions, control batches) are CRC-checked too,
    as Kafka's consumer checks every batch it skips: a damaged attribute or producer field would otherwise
    make a committed batch look aborted and be skipped without a word."""
    chunks: list[bytes] = []
    skipped: tuple[int, int, int] | None = None  # first offset, last offset, timestamp of batches left out
    damaged = False
    for buf, at in raw:
        header = decode_header(buf, at)
        try:
            if visibility is not None:
                verdict = visibility.classify(header)
                if verdict == OPEN:
                    out["last_stable_offset"] = min(header.base_offset, out["last_stable_offset"])
                    break
                if verdict != VISIBLE:
                    check_crc(buf, at, header)
                    first = header.base_offset if skipped is None else skipped[0]
                    skipped = (first, header.last_offset, header.max_timestamp)
                    continue
            chunk = from_pylog(buf, at)
        except _DAMAGED:
            damaged = True
            break
        if skipped is not None:
            chunks.append(empty_batch(skipped[0], skipped[1] - skipped[0], skipped[2]))
            skipped = None
        chunks.append(chunk)
    if skipped is not None:
        chunks.append(empty_batch(skipped[0], skipped[1] - skipped[0], skipped[2]))
    return chunks, damaged


def _max_timestamp(plog: Any) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record with the largest timestamp of the partition, or None when it
    is empty. Reads every batch header (and the records of the batch holding the largest): the ListOffsets
    max-timestamp form is an occasional admin query."""
    best: tuple[int, int, Any, int] | None = None  # (max timestamp, base offset, buffer, position)
    offset, end = plog.log_start_offset, plog.log_end_offset
    while offset < end:
        chunk = plog.read_raw(offset, 8 << 20)
        if not chunk:
            break
        for buf, at in chunk:
            h = decode_header(buf, at)
            if best is None or h.max_timestamp > best[0]:
                best = (h.max_timestamp, h.base_offset, buf, at)
            offset = h.next_offset
    if best is None:
        return None
    records = decode_lists(best[2], best[3])
    for o, ts in zip(records.offsets, records.timestamps, strict=True):
        if ts == best[0] or records.header.attributes & 0x08:
            return o, best[0]
    return best[1], best[0]


async def list_offsets(ctx: Context, request: Request) -> dict[str, Any]:
    topics = await ctx.run(_list_offsets, ctx, request.body)
    return {"throttle_time": 0, "topics": topics}


def _list_offsets(ctx: Context, body: Any) -> list[dict[str, Any]]:
    committed = int(getattr(body, "isolation_level", 0)) == 1
    out = []
    for t in body.topics:
        parts = [
            _offset_for(ctx, t.name, int(p.partition_index), int(p.timestamp), committed)
            for p in t.partitions
        ]
        out.append({"name": t.name, "partitions": parts})
    return out


class _Stable:
    """The last stable offset of one partition, followed incrementally: the batch headers read so far
    (``scanned``: the offset after them) and the first offset of each transaction among them still open."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.scanned = -1
        self.open: dict[tuple[int, int, int], int] = {}  # (producer id, epoch, txn) -> its first offset


_STABLE: weakref.WeakKeyDictionary[PartitionLog, _Stable] = weakref.WeakKeyDictionary()
_STABLE_LOCK = threading.Lock()


def last_stable_offset(ctx: Context, plog: PartitionLog, visibility: Visibility | None = None) -> int:
    """The partition's last stable offset: the first offset of its earliest transaction still open, else its
    log end offset (Kafka's LSO). The first call for a partition reads its batch headers from the log start;
    later calls forget the transactions decided since and read only the batches written since. A
    transaction open past its timeout is aborted here, as a read_committed fetch does."""
    with _STABLE_LOCK:
        stable = _STABLE.get(plog)
        if stable is None:
            stable = _STABLE[plog] = _Stable()
    if visibility is None:
        txns = ctx.log.txn_decisions()
        visibility = Visibility(txns.status, lambda: ctx.expire_transactions(txns))
    with stable.lock:
        start, end = plog.log_start_offset, plog.log_end_offset
        if stable.scanned > end:  # truncated: read it again
            stable.scanned = -1
            stable.open.clear()
        stable.open = {k: o for k, o in stable.open.items() if visibility.status(*k) == OPEN}
        offset = max(stable.scanned, start)
        for h in plog.headers(offset, end):
            offset = h.next_offset
            if visibility.classify(h) == OPEN:
                stable.open.setdefault((h.producer_id, h.producer_epoch, h.base_sequence), h.base_offset)
        stable.scanned = offset
        return max(min(stable.open.values(), default=offset), plog.log_start_offset)


def _offset_for(
    ctx: Context, topic: str, partition: int, timestamp: int, committed: bool = False
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "partition_index": partition,
        "error_code": ErrorCode.none,
        "timestamp": -1,
        "offset": -1,
        "leader_epoch": 0,
        "old_style_offsets": [],
    }
    try:
        plog = ctx.log.topic(topic).partition(partition)
        if timestamp == LATEST:
            out["offset"] = last_stable_offset(ctx, plog) if committed else plog.log_end_offset
        elif timestamp == EARLIEST:
            out["offset"] = plog.log_start_offset
        elif timestamp >= 0 or timestamp == MAX_TIMESTAMP:
            found = plog.offset_for_time(timestamp) if timestamp >= 0 else _max_timestamp(plog)
            # read_committed: only an offset below the last stable offset is answered (Kafka's rule)
            if found is not None and (not committed or found[0] < last_stable_offset(ctx, plog)):
                out["offset"], out["timestamp"] = found
        else:
            out["error_code"] = ErrorCode.invalid_request
    except (UnknownTopicError, UnknownPartitionError, InvalidTopicError):
        out["error_code"] = ErrorCode.unknown_topic_or_partition
    except PylogError:
        out["error_code"] = ErrorCode.kafka_storage_error
    return out
