"""Kafka record batches (magic 2) <-> pylog records, both directions: the one translation of the broker.

A Produce request carries Kafka record batches; the broker decodes each into its records (timestamps, keys,
values, headers, kept as the bytes the client sent, nulls kept) and pylog stores them in its own batches
(:mod:`pylog.record`). A Fetch response carries Kafka record batches built from pylog's stored batches, one
Kafka batch per pylog batch, with the same base offset, offsets, timestamps, producer fields and flags.

Kafka record batch v2, as pylog reads and writes it (all integers big-endian; varints are zigzag-encoded
like protobuf's sint, varlong for 64-bit values)::

    offset size type    field
    0      8    i64     baseOffset            the broker's offset of the first record (0 from producers)
    8      4    i32     batchLength           bytes after this field: the batch is batchLength + 12 bytes
    12     4    i32     partitionLeaderEpoch  -1 from producers; pylog writes 0 (one node, never re-elected)
    16     1    i8      magic                 2; any other is refused (CORRUPT_MESSAGE)
    17     4    u32     crc                   CRC-32C of bytes [21, end): attributes to the last record
    21     2    i16     attributes            bits 0-2 compression (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd),
                                              bit 3 timestamp type (1 LogAppendTime), bit 4 transactional,
                                              bit 5 control, bit 6 delete horizon
    23     4    i32     lastOffsetDelta       offset of the last record minus baseOffset
    27     8    i64     baseTimestamp         timestamps of records are deltas from it
    35     8    i64     maxTimestamp          largest timestamp (with LogAppendTime: every record's)
    43     8    i64     producerId            -1 when not idempotent
    51     2    i16     producerEpoch         -1 when not idempotent
    53     4    i32     baseSequence          -1 when not idempotent
    57     4    i32     recordsCount          number of records (the records follow, compressed as one block
                                              when the compression bits are set)
    61     .            records

    record (one after the other):
    varint   length           bytes of the record after this field
    i8       attributes       0 (unused)
    varlong  timestampDelta   timestamp - baseTimestamp
    varint   offsetDelta      offset - baseOffset
    varint   keyLength        -1: a null key
    bytes    key
    varint   valueLength      -1: a null value (a tombstone)
    bytes    value
    varint   headerCount
    headers: varint keyLength, key (UTF-8), varint valueLength (-1: null), value

Compressed records: gzip (RFC 1952, any number of members), snappy (Kafka's xerial framing: the magic
``\\x82SNAPPY\\x00``, two i32 versions, then blocks of an i32 length and a raw snappy block; a raw snappy
block without the framing is read too), lz4 (the LZ4 frame format), zstd (a zstd frame). Decompression is
bounded: a block inflating past :data:`MAX_RECORDS_BYTES` is refused, never allocated. pylog answers
fetches with uncompressed batches (the consumer decompresses nothing; loopback and LAN bandwidth is rarely
what limits a single node).

Checks on produce, each failing the partition's write with CORRUPT_MESSAGE (:class:`InvalidBatchError`):
the batch length fits the bytes received, the magic, the CRC, the record count matches the records, each
record's length matches its fields, offset deltas are 0..n-1 in order, header keys are UTF-8.

Thread-safety: functions only (no state).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import cramjam
import crc32c as _crc32c
import lz4.frame as _lz4f
import zstandard as _zstd

from pylog.record import (
    ATTR_CONTROL,
    ATTR_LOG_APPEND_TIME,
    ATTR_TRANSACTIONAL,
    BatchHeader,
    RecordLists,
    decode_lists,
)
from pylog.speedups import core as _core

__all__ = [
    "BATCH_OVERHEAD",
    "MAX_RECORDS_BYTES",
    "InvalidBatchError",
    "KafkaBatch",
    "decode_batches",
    "decompress",
    "empty_batch",
    "encode_batch",
    "from_pylog",
]

HEADER: Final = struct.Struct(">qiiBIhiqqqhii")
BATCH_OVERHEAD: Final = HEADER.size  # 61
_CRC_FROM: Final = 21
MAX_RECORDS_BYTES: Final = 100 << 20  # socket.request.max.bytes: no batch inflates past it
_SNAPPY_MAGIC: Final = b"\x82SNAPPY\x00"
_I32: Final = struct.Struct(">i")
_ZSTD_D: Final = _zstd.ZstdDecompressor()

Header = tuple[str, bytes | None]


class InvalidBatchError(ValueError):
    """A Kafka record batch that cannot be read (answered with CORRUPT_MESSAGE, or UNSUPPORTED_COMPRESSION_TYPE
    when ``compression`` names a codec this broker does not know)."""

    def __init__(self, message: str, *, compression: bool = False) -> None:
        super().__init__(message)
        self.compression = compression


@dataclass(frozen=True, slots=True)
class KafkaBatch:
    """One decoded Kafka record batch: its header fields and its records as columns."""

    base_offset: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    timestamps: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[list[Header]] | None  # None when no record has headers

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def compression(self) -> int:
        return self.attributes & 0x07

    def __len__(self) -> int:
        return len(self.keys)


# -- reading (Produce) ------------------------------------------------------------------------------------


def decode_batches(data: bytes | memoryview) -> list[KafkaBatch]:
    """Every batch of a Produce request's ``records`` bytes. Raises :class:`InvalidBatchError`."""
    buf = memoryview(data)
    out = []
    pos = 0
    while pos < len(buf):
        if len(buf) - pos < BATCH_OVERHEAD:
            raise InvalidBatchError(f"{len(buf) - pos} trailing bytes are shorter than a batch header")
        out.append(_decode_one(buf, pos))
        pos += _I32.unpack_from(buf, pos + 8)[0] + 12
    return out


def _decode_one(buf: memoryview, pos: int) -> KafkaBatch:
    (base, length, _, magic, crc, attrs, last_delta, base_ts, max_ts, pid, epoch, seq, count) = (
        HEADER.unpack_from(buf, pos)
    )
    if magic != 2:
        raise InvalidBatchError(
            f"record batch magic {magic}: pylog reads magic 2 (Kafka 0.11 and later) only"
        )
    end = pos + length + 12
    if length < BATCH_OVERHEAD - 12 or end > len(buf):
        raise InvalidBatchError(f"batch length {length} does not fit the {len(buf) - pos} bytes received")
    if _crc32c.crc32c(buf[pos + _CRC_FROM : end]) != crc:
        raise InvalidBatchError("record batch CRC-32C mismatch")
    if count < 0 or (count > last_delta + 1 and not attrs & ATTR_CONTROL):
        raise InvalidBatchError(f"record count {count} does not match lastOffsetDelta {last_delta}")
    body = buf[pos + BATCH_OVERHEAD : end]
    codec = attrs & 0x07
    raw = bytes(body) if codec == 0 else decompress(codec, body)
    ts, keys, values, headers = _records(raw, count, base_ts)
    if attrs & ATTR_LOG_APPEND_TIME:
        ts = [max_ts] * count
    return KafkaBatch(base, attrs, last_delta, base_ts, max_ts, pid, epoch, seq, ts, keys, values, headers)


def _records(
    raw: bytes, count: int, base_ts: int
) -> tuple[list[int], list[bytes | None], list[bytes | None], list[list[Header]] | None]:
    """The records of a batch, as columns: one C loop on the compiled path (:mod:`pylog.speedups`), else
    :func:`_records_pure`, which also reads what the C loop leaves to it (values beyond 64 bits)."""
    if _core is not None:
        try:
            got = _core.kafka_decode_records(raw, count, base_ts)
        except ValueError as exc:  # UnicodeDecodeError of a header key included
            raise InvalidBatchError(f"malformed record: {exc}") from exc
        if got is not NotImplemented:
            return got  # type: ignore[no-any-return]
    return _records_pure(raw, count, base_ts)


def _records_pure(
    raw: bytes, count: int, base_ts: int
) -> tuple[list[int], list[bytes | None], list[bytes | None], list[list[Header]] | None]:
    """The records of a batch, as columns. The hot loop of produce: one-byte varints (most lengths and
    deltas) are read through a table, longer ones by :func:`_varint`."""
    timestamps: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    headers: list[list[Header]] = []
    any_headers = False
    one = _ONE_BYTE
    varint = _varint
    pos = 0
    end = len(raw)
    try:
        for i in range(count):
            b = raw[pos]
            length, pos = (one[b], pos + 1) if b < 0x80 else varint(raw, pos)
            stop = pos + length
            if stop > end:
                raise InvalidBatchError(f"record {i} of {length} bytes runs past the batch")
            b = raw[pos + 1]  # after the attributes byte
            ts_delta, pos = (one[b], pos + 2) if b < 0x80 else varint(raw, pos + 1)
            b = raw[pos]
            offset_delta, pos = (one[b], pos + 1) if b < 0x80 else varint(raw, pos)
            if offset_delta != i:
                raise InvalidBatchError(f"record {i} has offset delta {offset_delta}")
            b = raw[pos]
            n, pos = (one[b], pos + 1) if b < 0x80 else varint(raw, pos)
            if n < 0:
                keys.append(None)
            else:
                keys.append(raw[pos : pos + n])
                pos += n
            b = raw[pos]
            n, pos = (one[b], pos + 1) if b < 0x80 else varint(raw, pos)
            if n < 0:
                values.append(None)
            else:
                values.append(raw[pos : pos + n])
                pos += n
            if raw[pos] == 0:  # no headers (the usual case)
                pos += 1
                headers.append([])
            else:
                pairs, pos = _headers(raw, pos)
                headers.append(pairs)
                any_headers = True
            if pos != stop:
                raise InvalidBatchError(
                    f"record {i} is {length} bytes long but its fields are {pos - stop + length}"
                )
            timestamps.append(base_ts + ts_delta)
    except (IndexError, UnicodeDecodeError) as exc:
        raise InvalidBatchError(f"malformed record: {exc}") from exc
    if pos != end:
        raise InvalidBatchError(f"{end - pos} bytes after the batch's {count} records")
    return timestamps, keys, values, headers if any_headers else None


def _headers(raw: bytes, pos: int) -> tuple[list[Header], int]:
    n, pos = _varint(raw, pos)
    if n < 0:
        raise InvalidBatchError(f"header count {n}")
    pairs: list[Header] = []
    for _ in range(n):
        kn, pos = _varint(raw, pos)
        if kn < 0:
            raise InvalidBatchError("a null header key")
        key = raw[pos : pos + kn].decode()
        pos += kn
        vn, pos = _varint(raw, pos)
        pairs.append((key, None if vn < 0 else raw[pos : pos + vn]))
        pos += max(vn, 0)
    return pairs, pos


_ONE_BYTE: Final = [(b >> 1) ^ -(b & 1) for b in range(0x80)]  # zigzag value of a one-byte varint


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint (or varlong) at ``pos``: (value, position after it)."""
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    result = b & 0x7F
    shift = 7
    while True:
        pos += 1
        b = buf[pos]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos + 1
        shift += 7
        if shift > 63:
            raise InvalidBatchError("varint longer than 10 bytes")


def decompress(codec: int, body: memoryview | bytes) -> bytes:
    """The records block of a batch compressed with ``codec`` (1 gzip, 2 snappy, 3 lz4, 4 zstd), bounded by
    :data:`MAX_RECORDS_BYTES`."""
    limit = MAX_RECORDS_BYTES + 1
    try:
        if codec == 1:
            out = _gunzip(bytes(body), limit)
        elif codec == 2:
            out = _unsnappy(bytes(body), limit)
        elif codec == 3:
            out = _lz4f.LZ4FrameDecompressor().decompress(bytes(body), max_length=limit)
        elif codec == 4:
            with _ZSTD_D.stream_reader(bytes(body)) as reader:
                out = reader.read(limit)
        else:
            raise InvalidBatchError(f"unknown compression codec {codec}", compression=True)
    except InvalidBatchError:
        raise
    except Exception as exc:  # each codec library raises its own error type
        raise InvalidBatchError(f"records cannot be decompressed ({type(exc).__name__}: {exc})") from exc
    if len(out) >= limit:
        raise InvalidBatchError(f"records inflate past {MAX_RECORDS_BYTES} bytes")
    return out


def _gunzip(data: bytes, limit: int) -> bytes:
    parts = []
    total = 0
    while data:
        d = zlib.decompressobj(wbits=31)
        chunk = d.decompress(data, limit - total)
        parts.append(chunk)
        total += len(chunk)
        if total >= limit or not d.eof:
            if total >= limit:
                break
            raise InvalidBatchError("truncated gzip records")
        data = d.unused_data
    return b"".join(parts)


def _unsnappy(data: bytes, limit: int) -> bytes:
    if not data.startswith(_SNAPPY_MAGIC):
        return _snappy_block(data, limit)
    parts = []
    total = 0
    pos = 16  # magic, version, compatible version
    while pos < len(data):
        (n,) = _I32.unpack_from(data, pos)
        block = _snappy_block(data[pos + 4 : pos + 4 + n], limit - total)
        parts.append(block)
        total += len(block)
        if total >= limit:
            break
        pos += 4 + n
    return b"".join(parts)


def _snappy_block(data: bytes, limit: int) -> bytes:
    size, _ = _uvarint(data, 0)
    if size >= limit:
        return b"\0" * limit  # refused by the caller, without inflating it
    return bytes(cramjam.snappy.decompress_raw(data))


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        result |= (b & 0x7F) << shift
        pos += 1
        if b < 0x80:
            return result, pos
        shift += 7


# -- writing (Fetch) --------------------------------------------------------------------------------------


def _zz(value: int) -> bytes:
    """The zigzag varint of ``value``."""
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL: Final = [_zz(i) for i in range(-1, 1 << 13)]  # varints of -1 .. 8191, index value + 1


def _v(value: int) -> bytes:
    return _SMALL[value + 1] if -1 <= value < (1 << 13) else _zz(value)


def encode_batch(records: RecordLists, *, leader_epoch: int = 0) -> bytes:
    """The Kafka batch (magic 2, uncompressed) holding the records of one pylog batch, offsets kept. The
    records are written by one C loop on the compiled path (:mod:`pylog.speedups`), else in Python."""
    h: BatchHeader = records.header
    base, base_ts = h.base_offset, h.base_timestamp
    if _core is not None:
        body = _core.kafka_encode_records(
            base, base_ts, records.offsets, records.timestamps, records.keys, records.values, records.headers
        )
        if body is not NotImplemented:
            return _frame(h, body, len(records.offsets), leader_epoch)
    return _frame(h, _encode_records_pure(records), len(records.offsets), leader_epoch)


def from_pylog(buf: bytes | memoryview | bytearray, position: int, *, leader_epoch: int = 0) -> bytes:
    """The Kafka batch for the stored pylog batch at ``position`` of ``buf``: ``encode_batch(decode_lists(buf,
    position))``, every check of :func:`pylog.record.decode_lists` included. On the compiled path one C pass
    writes the records without making a Python object per record; what it leaves to Python (headers not as
    :func:`pylog.record.encode_headers` writes them, timestamp deltas beyond int64) goes the other way."""
    if _core is not None:
        got = _core.kafka_from_pylog(buf, position)
        if got is not NotImplemented:
            header, body = got
            return _frame(header, body, header.record_count, leader_epoch)
    return encode_batch(decode_lists(buf, position), leader_epoch=leader_epoch)


def _encode_records_pure(records: RecordLists) -> bytes:
    """The records section of :func:`encode_batch`, in Python."""
    base, base_ts = records.header.base_offset, records.header.base_timestamp
    parts: list[bytes] = []
    for offset, ts, key, value, headers in zip(
        records.offsets, records.timestamps, records.keys, records.values, records.headers, strict=True
    ):
        fields = [
            b"\0",
            _v(ts - base_ts),
            _v(offset - base),
            b"\x01" if key is None else _v(len(key)) + key,
            b"\x01" if value is None else _v(len(value)) + value,
            _encode_headers(headers),
        ]
        body = b"".join(fields)
        parts.append(_v(len(body)))
        parts.append(body)
    return b"".join(parts)


def _encode_headers(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    if not headers:
        return b"\0"
    out = [_v(len(headers))]
    for key, value in headers:
        k = key.encode()
        out.append(_v(len(k)) + k)
        out.append(b"\x01" if value is None else _v(len(value)) + value)
    return b"".join(out)


def _frame(h: BatchHeader, records: bytes, count: int, leader_epoch: int) -> bytes:
    attrs = h.attributes & (ATTR_LOG_APPEND_TIME | ATTR_TRANSACTIONAL | ATTR_CONTROL)
    length = BATCH_OVERHEAD - 12 + len(records)
    head = bytearray(
        HEADER.pack(
            h.base_offset,
            length,
            leader_epoch,
            2,
            0,
            attrs,
            h.last_offset_delta,
            h.base_timestamp,
            h.max_timestamp,
            h.producer_id,
            h.producer_epoch,
            h.base_sequence,
            count,
        )
    )
    crc = _crc32c.crc32c(records, _crc32c.crc32c(bytes(head[_CRC_FROM:])))
    struct.pack_into(">I", head, 17, crc)
    return bytes(head) + records


def empty_batch(base_offset: int, last_offset_delta: int, timestamp: int) -> bytes:
    """A Kafka batch of no records spanning ``base_offset .. base_offset + last_offset_delta`` (what Kafka keeps
    of a batch whose records were all removed): consumers move past its offsets and return nothing."""
    h = BatchHeader(base_offset, 0, 0, 0, 0, 0, last_offset_delta, timestamp, timestamp, -1, -1, 0, -1, 0, 0)
    return _frame(h, b"", 0, 0)
