"""Record batch format (format version 1): the one definition the codec is built from.

A segment ``.log`` file is a sequence of batches. All integers are little-endian.

Batch header, 64 bytes (``HEADER``)::

    offset size type  field
    0      8    i64   base_offset        offset of the first record
    8      4    i32   batch_length       bytes of the whole batch, header included
    12     4    u32   crc                CRC-32C of bytes [16, batch_length): header fields after it AND payload
    16     1    u8    magic              format version, 1
    17     1    u8    reserved           0
    18     2    i16   attributes         bits 0-2 compression (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd),
                                         bit 3 timestamp type (0 CreateTime, 1 LogAppendTime),
                                         bit 4 transactional, bit 5 control batch
    20     4    i32   last_offset_delta  offset of the last record minus base_offset
    24     8    i64   base_timestamp     smallest timestamp in the batch (ms); records store deltas from it
    32     8    i64   max_timestamp      largest timestamp in the batch (ms)
    40     8    i64   producer_id        -1 when not idempotent
    48     2    i16   producer_epoch     -1 when not idempotent
    50     2    u16   reserved           0
    52     4    i32   base_sequence      -1 when not idempotent
    56     4    i32   record_count       number of records, >= 1
    60     4    i32   payload_length     bytes of the UNcompressed payload (bounds decompression)

Payload (compressed as one block when the compression bits are set). It is columnar, so that a reader can hand
keys and values to numpy/Arrow without a Python loop per record, and a writer can build it from arrays::

    offset  size            field
    0       1               ts_width      bytes per timestamp delta: 0 (all equal base_timestamp), 1, 2, 4, 8
    1       1               delta_width   bytes per offset delta: 0 (dense: 0, 1, ..., n-1), 1, 2, 4
    2       1               key_width     bytes per key length: 1, 2, 4 (signed; -1 means a null key)
    3       1               value_width   bytes per value length: 1, 2, 4 (signed; -1 means a null value)
    4       1               header_width  bytes per headers length: 0 (no record has headers), 1, 2, 4
    5       3               reserved      0
    8       n*ts_width      timestamp deltas      unsigned, from base_timestamp
    .       n*delta_width   offset deltas         unsigned, strictly increasing, last == last_offset_delta
    .       n*key_width     key lengths           signed
    .       n*value_width   value lengths         signed
    .       n*header_width  headers lengths       unsigned
    .       sum(key)        key bytes             concatenated
    .       sum(value)      value bytes           concatenated (values are msgpack by default; stored as given)
    .       sum(headers)    headers bytes         per record a msgpack array of [str, bytes] pairs

A record is therefore (offset delta, timestamp delta, key, value, headers), as in Kafka, laid out by column.
Storage overhead for 16-byte keys and 100-byte values in batches of 50 is about 3.3 bytes per record.

Every reader checks, before trusting a batch: ``magic`` is known (else :class:`UnsupportedFormatError`),
``HEADER_SIZE + 8 <= batch_length`` and the batch fits the file, the CRC, the column widths, that the lengths add
up to exactly ``payload_length``, offset deltas increasing and ending at ``last_offset_delta``, and timestamps
within ``[base_timestamp, max_timestamp]``. Any failure is a :class:`CorruptRecordError`.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import crc32c as _crc32c
import lz4.block as _lz4
import msgpack
import numpy as np
import numpy.typing as npt
import zstandard as _zstd

try:  # snappy needs the optional cramjam package (the 'snappy' extra)
    import cramjam as _cramjam
except ImportError:  # pragma: no cover - exercised by patching _cramjam in the tests
    _cramjam = None  # type: ignore[assignment]

from pylog.errors import (
    CorruptRecordError,
    InvalidRecordError,
    SerializationError,
    UnsupportedCodecError,
    UnsupportedFormatError,
)
from pylog.speedups import core as _core
from pylog.structs import NO_HEADERS, Headers

__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "MAGIC",
    "BatchHeader",
    "DecodedBatch",
    "check_codec",
    "codec_available",
    "crc32c",
    "decode_batch",
    "decode_header",
    "decode_lists",
    "encode_batch",
    "encode_headers",
    "encode_one",
    "item_lengths",
]

MAGIC: Final = 1
HEADER: Final = struct.Struct("<qiIBBhiqqqhHiii")
HEADER_SIZE: Final = HEADER.size  # 64
LAYOUT: Final = struct.Struct("<BBBBB3x")
LAYOUT_SIZE: Final = LAYOUT.size  # 8
_CRC_START: Final = 16
_CRC: Final = struct.Struct("<I")

COMPRESSION_CODES: Final = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
_CODE_NAMES: Final = {v: k for k, v in COMPRESSION_CODES.items()}
ATTR_COMPRESSION_MASK: Final = 0x07
ATTR_LOG_APPEND_TIME: Final = 0x08
ATTR_TRANSACTIONAL: Final = 0x10
ATTR_CONTROL: Final = 0x20

_UNSIGNED: dict[int, np.dtype[Any]] = {
    1: np.dtype("<u1"),
    2: np.dtype("<u2"),
    4: np.dtype("<u4"),
    8: np.dtype("<u8"),
}
_UNSIGNED4: dict[int, np.dtype[Any]] = {k: v for k, v in _UNSIGNED.items() if k <= 4}
_SIGNED: dict[int, np.dtype[Any]] = {1: np.dtype("<i1"), 2: np.dtype("<i2"), 4: np.dtype("<i4")}
_MAX_RECORDS: Final = 1 << 24
_MAX_OFFSET: Final = (1 << 63) - 1
_SMALL: Final = 32  # batches up to this many records are coded with struct alone (lower latency)
_FMT_U: Final = {1: "B", 2: "H", 4: "I", 8: "Q"}
_FMT_S: Final = {1: "b", 2: "h", 4: "i"}

crc32c = _crc32c.crc32c
# the largest expansion each format can encode (deflate 1032:1, a 3-byte snappy copy 64 bytes, an lz4 length
# byte 255, a 4-byte zstd RLE block 128 KiB): a payload_length beyond it is corrupt and is never allocated
_MAX_RATIO: Final = {1: 1032, 2: 22, 3: 255, 4: 1 << 15}
_ZSTD_C = _zstd.ZstdCompressor(level=3)
_ZSTD_D = _zstd.ZstdDecompressor()
_PACK = msgpack.Packer(use_bin_type=True).pack


class BatchHeader(NamedTuple):
    """The decoded 64-byte batch header (field order as in the byte table)."""

    base_offset: int
    batch_length: int
    crc: int
    magic: int
    reserved: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    reserved2: int
    base_sequence: int
    record_count: int
    payload_length: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> str:
        return _CODE_NAMES.get(self.attributes & ATTR_COMPRESSION_MASK, "unknown")

    @property
    def timestamp_type(self) -> int:
        return 1 if self.attributes & ATTR_LOG_APPEND_TIME else 0


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """A batch's columns. ``key_data``/``value_data`` are the concatenated bytes; ``*_offsets`` have n+1 entries
    (Arrow style) and ``*_valid`` mark non-null entries. Slices of the payload are views, not copies; the
    arrays are not to be written to (an all-true ``*_valid`` is a read-only view shared between batches)."""

    header: BatchHeader
    offsets: npt.NDArray[np.int64]
    timestamps: npt.NDArray[np.int64]
    key_offsets: npt.NDArray[np.int64]
    key_valid: npt.NDArray[np.bool_]
    key_data: memoryview
    value_offsets: npt.NDArray[np.int64]
    value_valid: npt.NDArray[np.bool_]
    value_data: memoryview
    header_offsets: npt.NDArray[np.int64] | None
    header_data: memoryview

    def keys(self) -> list[bytes | None]:
        return _slices(self.key_data, self.key_offsets, self.key_valid)

    def values(self) -> list[bytes | None]:
        return _slices(self.value_data, self.value_offsets, self.value_valid)

    def headers(self) -> list[Headers]:
        """Per record its headers: a list of ``(str, bytes)`` pairs; records without headers share the read-only
        empty list :data:`~pylog.structs.NO_HEADERS`."""
        n = self.header.record_count
        if self.header_offsets is None:
            return [NO_HEADERS] * n
        raw = bytes(self.header_data)
        bounds = self.header_offsets.tolist()
        out: list[Headers] = []
        for i in range(n):
            start, end = bounds[i], bounds[i + 1]
            out.append(decode_headers(raw[start:end]) if end > start else NO_HEADERS)
        return out


def _slices(
    data: memoryview, offsets: npt.NDArray[np.int64], valid: npt.NDArray[np.bool_]
) -> list[bytes | None]:
    raw = bytes(data)
    bounds = offsets.tolist()
    out: list[bytes | None] = [raw[a:b] for a, b in itertools.pairwise(bounds)]
    if not valid.all():
        for i in np.flatnonzero(~valid).tolist():
            out[i] = None
    return out


def _width_unsigned(max_value: int) -> int:
    if max_value < 1 << 8:
        return 1
    if max_value < 1 << 16:
        return 2
    if max_value < 1 << 32:
        return 4
    return 8


def _width_signed(max_value: int) -> int:
    if max_value < 1 << 7:
        return 1
    if max_value < 1 << 15:
        return 2
    return 4


def encode_headers(headers: Any) -> bytes:
    """Encode ``[(str, bytes), ...]`` as the msgpack array stored per record. Raises SerializationError (a
    ``TypeError``, as kafka-python raises for bad headers). On the compiled path the usual form (a list or
    tuple of ``(str, bytes | None)`` pairs) is packed in C, byte for byte as below."""
    if _core is not None:
        out = _core.encode_headers(headers)
        if out is not NotImplemented:
            return out  # type: ignore[no-any-return]
    if not isinstance(headers, list | tuple):
        raise SerializationError(
            f"headers must be a list of (str, bytes) pairs, got {type(headers).__name__}"
        )
    pairs = []
    for item in headers:
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise SerializationError(f"each header must be a (str, bytes) pair, got {item!r}")
        key, value = item
        if not isinstance(key, str):
            raise SerializationError(f"header keys must be str, got {type(key).__name__}")
        if value is not None and not isinstance(value, bytes | bytearray | memoryview):
            raise SerializationError(f"header values must be bytes or None, got {type(value).__name__}")
        pairs.append((key, None if value is None else bytes(value)))
    return bytes(_PACK(pairs)) if pairs else b""


def decode_headers(raw: bytes) -> Headers:
    """A record's headers from the blob :func:`encode_headers` wrote: ``(str, bytes | None)`` pairs. Anything
    else (corrupted beyond what the CRC caught: only reachable with a forged CRC) is a CorruptRecordError."""
    try:
        pairs = [(k, v) for k, v in msgpack.unpackb(raw, use_list=True, raw=False, strict_map_key=True)]
    except Exception as exc:
        raise CorruptRecordError(f"undecodable record headers: {exc}") from exc
    for k, v in pairs:
        if type(k) is not str or (v is not None and type(v) is not bytes):
            raise CorruptRecordError(f"undecodable record headers: {(k, v)!r} is not a (str, bytes) pair")
    return pairs


def item_lengths(items: Sequence[bytes | None]) -> tuple[npt.NDArray[np.int64], bool]:
    """Lengths (-1 for None) and whether any item is None."""
    try:
        return np.fromiter(map(len, items), dtype=np.int64, count=len(items)), False  # type: ignore[arg-type]
    except TypeError:
        pass
    return np.fromiter((-1 if x is None else len(x) for x in items), dtype=np.int64, count=len(items)), True


def encode_batch(
    base_offset: int,
    keys: list[bytes | None],
    values: list[bytes | None],
    timestamps: npt.ArrayLike,
    headers: list[bytes] | None = None,
    *,
    offset_deltas: npt.NDArray[np.int64] | None = None,
    compression: str = "none",
    log_append_time: bool = False,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
) -> bytes:
    """Build one batch. ``headers`` are already-encoded blobs (see :func:`encode_headers`), b"" for none.

    ``offset_deltas`` (n increasing values from 0) is only given by compaction, which keeps offsets unchanged.
    On the compiled path (:mod:`pylog.speedups`) one C loop builds dense batches of bytes keys and values
    (:func:`_encode_batch_pure` builds the rest, byte for byte the same).
    """
    if _core is not None and offset_deltas is None:
        attributes = (
            COMPRESSION_CODES.get(compression, -1)
            | (ATTR_LOG_APPEND_TIME if log_append_time else 0)
            | (ATTR_TRANSACTIONAL if transactional else 0)
            | (ATTR_CONTROL if control else 0)
        )
        if attributes >= 0:
            out = _core.encode_batch(
                base_offset,
                keys,
                values,
                timestamps
                if isinstance(timestamps, list)
                else np.asarray(timestamps, dtype=np.int64).tolist(),
                headers,
                attributes,
                producer_id,
                producer_epoch,
                base_sequence,
                False,
            )
            if out is not NotImplemented:
                return out  # type: ignore[no-any-return]
    return _encode_batch_pure(
        base_offset,
        keys,
        values,
        timestamps,
        headers,
        offset_deltas=offset_deltas,
        compression=compression,
        log_append_time=log_append_time,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        transactional=transactional,
        control=control,
    )


def _encode_batch_pure(
    base_offset: int,
    keys: list[bytes | None],
    values: list[bytes | None],
    timestamps: npt.ArrayLike,
    headers: list[bytes] | None = None,
    *,
    offset_deltas: npt.NDArray[np.int64] | None = None,
    compression: str = "none",
    log_append_time: bool = False,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
) -> bytes:
    """:func:`encode_batch` in Python."""
    n = len(keys)
    if n <= _SMALL and offset_deltas is None and compression == "none" and n:
        return _encode_small(
            base_offset,
            keys,
            values,
            [int(t) for t in timestamps]
            if isinstance(timestamps, list)
            else np.asarray(timestamps, dtype=np.int64).reshape(n).tolist(),
            headers,
            log_append_time,
            producer_id,
            producer_epoch,
            base_sequence,
            transactional,
            control,
        )
    key_lens, key_nulls = item_lengths(keys)
    value_lens, value_nulls = item_lengths(values)
    header_lens = None if headers is None or not any(headers) else item_lengths(headers)[0]
    return encode_columns(
        base_offset,
        key_lens,
        b"".join([k for k in keys if k] if key_nulls else keys),  # type: ignore[arg-type]
        value_lens,
        b"".join([v for v in values if v] if value_nulls else values),  # type: ignore[arg-type]
        np.asarray(timestamps, dtype=np.int64).reshape(n),
        header_lens,
        b"".join(headers) if header_lens is not None and headers is not None else b"",
        offset_deltas=offset_deltas,
        compression=compression,
        log_append_time=log_append_time,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        transactional=transactional,
        control=control,
    )


# One record without headers: the header, the layout and the two lengths packed by one Struct (by the widths of
# the key and value lengths), then the key and value bytes. ``_ONE[(key_width, value_width)]``.
_ONE: Final = {
    (kw, vw): struct.Struct("<qiIBBhiqqqhHiii" + "BBBBB3x" + _FMT_S[kw] + _FMT_S[vw])
    for kw in (1, 2, 4)
    for vw in (1, 2, 4)
}


def encode_one(
    key: bytes | None,
    value: bytes | None,
    timestamp: int,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
) -> bytearray:
    """One uncompressed record without headers as a batch with base offset 0: byte for byte what
    :func:`encode_batch` builds for it, in one ``struct`` call (the path of a caller that waits on each record).
    Returned as a ``bytearray``, which :meth:`PartitionLog.append` patches without copying."""
    if _core is not None:
        out = _core.encode_batch(
            0,
            [key],
            [value],
            [timestamp],
            None,
            ATTR_TRANSACTIONAL if transactional else 0,
            producer_id,
            producer_epoch,
            base_sequence,
            True,
        )
        if out is not NotImplemented:
            return out  # type: ignore[no-any-return]
    return _encode_one_pure(key, value, timestamp, producer_id, producer_epoch, base_sequence, transactional)


def _encode_one_pure(
    key: bytes | None,
    value: bytes | None,
    timestamp: int,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
) -> bytearray:
    """:func:`encode_one` in Python."""
    klen = -1 if key is None else len(key)
    vlen = -1 if value is None else len(value)
    kw = 1 if klen < 128 else (2 if klen < 32768 else 4)
    vw = 1 if vlen < 128 else (2 if vlen < 32768 else 4)
    payload = LAYOUT_SIZE + kw + vw + max(klen, 0) + max(vlen, 0)
    buf = bytearray(
        _ONE[(kw, vw)].pack(
            0,
            HEADER_SIZE + payload,
            0,
            MAGIC,
            0,
            ATTR_TRANSACTIONAL if transactional else 0,
            0,
            timestamp,
            timestamp,
            producer_id,
            producer_epoch,
            0,
            base_sequence,
            1,
            payload,
            0,
            0,
            kw,
            vw,
            0,
            klen,
            vlen,
        )
    )
    if key:
        buf += key
    if value:
        buf += value
    _CRC.pack_into(buf, 12, crc32c(memoryview(buf)[_CRC_START:]))
    return buf


def _width_for(lens: list[int], signed: bool) -> int:
    top = max(lens)
    return _width_signed(top) if signed else min(_width_unsigned(top), 4)


def _encode_small(
    base_offset: int,
    keys: list[bytes | None],
    values: list[bytes | None],
    timestamps: list[int],
    headers: list[bytes] | None,
    log_append_time: bool,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    transactional: bool,
    control: bool,
) -> bytes:
    """:func:`encode_batch` for a few uncompressed records, with ``struct`` only (byte-identical output)."""
    n = len(keys)
    ts_min, ts_max = min(timestamps), max(timestamps)
    ts_w = 0 if ts_min == ts_max else _width_unsigned(ts_max - ts_min)
    key_lens = [-1 if k is None else len(k) for k in keys]
    value_lens = [-1 if v is None else len(v) for v in values]
    header_lens = [len(h) for h in headers] if headers is not None and any(headers) else None
    key_w, value_w = _width_for(key_lens, True), _width_for(value_lens, True)
    header_w = 0 if header_lens is None else _width_for(header_lens, False)
    parts: list[bytes] = [LAYOUT.pack(ts_w, 0, key_w, value_w, header_w)]
    if ts_w:
        parts.append(struct.pack(f"<{n}{_FMT_U[ts_w]}", *[t - ts_min for t in timestamps]))
    parts.append(struct.pack(f"<{n}{_FMT_S[key_w]}", *key_lens))
    parts.append(struct.pack(f"<{n}{_FMT_S[value_w]}", *value_lens))
    if header_lens is not None:
        parts.append(struct.pack(f"<{n}{_FMT_U[header_w]}", *header_lens))
    parts += [k for k in keys if k]
    parts += [v for v in values if v]
    if header_lens is not None and headers is not None:
        parts += headers
    payload = b"".join(parts)
    attributes = (
        (ATTR_LOG_APPEND_TIME if log_append_time else 0)
        | (ATTR_TRANSACTIONAL if transactional else 0)
        | (ATTR_CONTROL if control else 0)
    )
    head = bytearray(
        HEADER.pack(
            base_offset,
            HEADER_SIZE + len(payload),
            0,
            MAGIC,
            0,
            attributes,
            n - 1,
            ts_min,
            ts_max,
            producer_id,
            producer_epoch,
            0,
            base_sequence,
            n,
            len(payload),
        )
    )
    struct.pack_into("<I", head, 12, crc32c(payload, crc32c(memoryview(head)[_CRC_START:])))
    return bytes(head) + payload


def encode_columns(
    base_offset: int,
    key_lens: npt.NDArray[np.int64],
    key_data: bytes | memoryview,
    value_lens: npt.NDArray[np.int64],
    value_data: bytes | memoryview,
    timestamps: npt.NDArray[np.int64],
    header_lens: npt.NDArray[np.int64] | None = None,
    header_data: bytes = b"",
    *,
    offset_deltas: npt.NDArray[np.int64] | None = None,
    compression: str = "none",
    log_append_time: bool = False,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
) -> bytes:
    """Build one batch from columns (the vectorized entry point; :func:`encode_batch` wraps it)."""
    n = int(key_lens.shape[0])
    if n < 1 or n > _MAX_RECORDS:
        raise InvalidRecordError(f"a batch holds 1..{_MAX_RECORDS} records, got {n}")
    ts_min = int(timestamps.min())
    ts_max = int(timestamps.max())
    ts_width = 0 if ts_min == ts_max else _width_unsigned(ts_max - ts_min)
    if offset_deltas is None:
        delta_width, last_delta = 0, n - 1
    else:
        last_delta = int(offset_deltas[-1])
        delta_width = 0 if last_delta == n - 1 else min(_width_unsigned(last_delta), 4)
    key_width = _width_signed(int(key_lens.max()))
    value_width = _width_signed(int(value_lens.max()))
    header_width = 0 if header_lens is None else min(_width_unsigned(int(header_lens.max())), 4)
    parts: list[bytes | memoryview] = [
        LAYOUT.pack(ts_width, delta_width, key_width, value_width, header_width)
    ]
    if ts_width:
        parts.append((timestamps - ts_min).astype(_UNSIGNED[ts_width]).tobytes())
    if delta_width and offset_deltas is not None:
        parts.append(offset_deltas.astype(_UNSIGNED[delta_width]).tobytes())
    parts.append(key_lens.astype(_SIGNED[key_width]).tobytes())
    parts.append(value_lens.astype(_SIGNED[value_width]).tobytes())
    if header_width and header_lens is not None:
        parts.append(header_lens.astype(_UNSIGNED[header_width]).tobytes())
    parts += [key_data, value_data, header_data]
    code = COMPRESSION_CODES[compression]
    if code == 0:  # the batch is joined once, header included: the CRC is computed over the parts
        payload_length = sum(memoryview(x).nbytes for x in parts)
        body: list[bytes | memoryview] = parts
    else:
        payload = b"".join(parts)
        payload_length = len(payload)
        body = [_compress(code, payload)]
    attributes = code
    if log_append_time:
        attributes |= ATTR_LOG_APPEND_TIME
    if transactional:
        attributes |= ATTR_TRANSACTIONAL
    if control:
        attributes |= ATTR_CONTROL
    fields = [
        base_offset,
        HEADER_SIZE + (payload_length if code == 0 else len(body[0])),
        0,
        MAGIC,
        0,
        attributes,
        last_delta,
        ts_min,
        ts_max,
        producer_id,
        producer_epoch,
        0,
        base_sequence,
        n,
        payload_length,
    ]
    crc = crc32c(HEADER.pack(*fields)[_CRC_START:])
    for part in body:
        crc = crc32c(part, crc)
    fields[2] = crc
    return b"".join([HEADER.pack(*fields), *body])


def codec_available(name: str) -> bool:
    """Whether the library of compression ``name`` (a key of :data:`COMPRESSION_CODES`) is installed."""
    return name != "snappy" or _cramjam is not None


def check_codec(name: str) -> None:
    """:class:`~pylog.errors.UnsupportedCodecError` naming the extra to install if ``name``'s library is
    missing (snappy: the cramjam package)."""
    if not codec_available(name):
        raise UnsupportedCodecError(
            f"compression {name!r} needs the cramjam package, which is not installed: "
            "pip install 'pylog[snappy]'"
        )


def _snappy() -> Any:
    check_codec("snappy")
    return _cramjam.snappy


def _compress(code: int, payload: bytes) -> bytes:
    if code == 1:
        c = zlib.compressobj(6, zlib.DEFLATED, 31)
        return c.compress(payload) + c.flush()
    if code == 2:  # one raw snappy block (Kafka's xerial framing is a wire detail pylog does not store)
        return bytes(_snappy().compress_raw(payload))
    if code == 3:
        return bytes(_lz4.compress(payload, store_size=False))
    return bytes(_ZSTD_C.compress(payload))


def _decompress(code: int, body: bytes | memoryview, size: int) -> bytes:
    if code not in _MAX_RATIO:
        raise CorruptRecordError(f"unknown compression code {code}")
    if size > _MAX_RATIO[code] * len(body) + 64:  # lz4 and zstd allocate the claimed size up front
        raise CorruptRecordError(
            f"payload length {size} is impossible for {len(body)} {_CODE_NAMES[code]} bytes"
        )
    try:
        if code == 1:
            d = zlib.decompressobj(31)
            out = d.decompress(body, size)
        elif code == 2:
            snappy = _snappy()
            if snappy.decompress_raw_len(body) != size:
                raise CorruptRecordError(
                    f"snappy block holds {snappy.decompress_raw_len(body)} bytes, header says {size}"
                )
            out = snappy.decompress_raw(body)
        elif code == 3:
            out = _lz4.decompress(body, uncompressed_size=size)
        elif code == 4:
            out = _ZSTD_D.decompress(body, max_output_size=size)
        else:
            raise CorruptRecordError(f"unknown compression code {code}")
    except (CorruptRecordError, UnsupportedCodecError):
        raise
    except Exception as exc:
        raise CorruptRecordError(f"batch payload does not decompress: {exc}") from exc
    if len(out) != size:
        raise CorruptRecordError(f"decompressed payload is {len(out)} bytes, header says {size}")
    return bytes(out)


def decode_header(
    buf: bytes | memoryview | bytearray, position: int = 0, limit: int | None = None
) -> BatchHeader:
    """Decode and bounds-check the header at ``position``; ``limit`` is where valid bytes end.

    Checks magic and that the batch fits before ``limit``. Does NOT check the CRC (see :func:`check_crc`).
    """
    end = len(buf) if limit is None else limit
    if position + HEADER_SIZE > end:
        raise CorruptRecordError(f"truncated batch header at position {position}", position=position)
    h = BatchHeader._make(HEADER.unpack_from(buf, position))
    if h.magic != MAGIC:
        if h.magic > MAGIC and h.batch_length >= HEADER_SIZE:
            raise UnsupportedFormatError(
                f"batch at position {position} has format version {h.magic}; this pylog reads version {MAGIC}"
            )
        raise CorruptRecordError(f"bad magic {h.magic} at position {position}", position=position)
    if h.batch_length < HEADER_SIZE + LAYOUT_SIZE or position + h.batch_length > end:
        raise CorruptRecordError(
            f"batch length {h.batch_length} at position {position} is out of bounds", position=position
        )
    if not 1 <= h.record_count <= _MAX_RECORDS or h.last_offset_delta < h.record_count - 1:
        raise CorruptRecordError(
            f"bad record count or offset delta at position {position}", position=position
        )
    if (
        h.base_offset < 0
        or h.base_offset > _MAX_OFFSET - h.last_offset_delta
        or h.payload_length < LAYOUT_SIZE
        or h.max_timestamp < h.base_timestamp
    ):
        raise CorruptRecordError(f"impossible header field values at position {position}", position=position)
    return h


def check_crc(buf: bytes | memoryview | bytearray, position: int, header: BatchHeader) -> None:
    view = memoryview(buf)[position + _CRC_START : position + header.batch_length]
    if crc32c(view) != header.crc:
        raise CorruptRecordError(
            f"CRC mismatch in batch at position {position} (base offset {header.base_offset})",
            position=position,
        )


def decode_batch(
    buf: bytes | memoryview | bytearray, position: int = 0, *, verify_crc: bool = True
) -> DecodedBatch:
    """Decode the batch at ``position`` into columns, checking everything listed in the module docstring."""
    h = decode_header(buf, position)
    if verify_crc:
        check_crc(buf, position, h)
    body = memoryview(buf)[position + HEADER_SIZE : position + h.batch_length]
    code = h.attributes & ATTR_COMPRESSION_MASK
    if code:
        payload: memoryview = memoryview(_decompress(code, body, h.payload_length))
    elif len(body) != h.payload_length:
        raise CorruptRecordError(f"payload length mismatch at position {position}", position=position)
    else:
        payload = body
    try:
        return _decode_columns(h, payload)
    except CorruptRecordError as exc:
        raise CorruptRecordError(f"{exc} (batch at position {position})", position=position) from exc


def _column(payload: memoryview, at: int, width: int, n: int, table: dict[int, np.dtype[Any]]) -> Any:
    """The ``n`` values of width ``width`` at ``at``, in their stored (narrow) dtype, and where they end."""
    if width not in table:
        raise CorruptRecordError(f"bad column width {width}")
    end = at + width * n
    if end > len(payload):
        raise CorruptRecordError("column runs past the payload")
    return np.frombuffer(payload, dtype=table[width], count=n, offset=at), end


def _length_column(
    payload: memoryview, at: int, width: int, n: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_], int]:
    """A key or value length column as Arrow-style offsets (n+1) and validity, and where the column ends.

    A column whose records all have one length (fixed-width keys or values, the common case) needs no
    cumulative sum; a column without nulls shares one read-only all-true validity array."""
    lens, end = _column(payload, at, width, n, _SIGNED)
    lo, hi = int(lens.min()), int(lens.max())
    if lo < -1:
        raise CorruptRecordError("negative record length")
    if lo == hi and lo > 0:  # every record has this length
        return _ramp(lo, n + 1), _all_true(n), end
    offsets = _offsets(lens if lo >= 0 else np.maximum(lens, 0))
    return offsets, (_all_true(n) if lo >= 0 else lens >= 0), end


_TRUE: npt.NDArray[np.bool_] = np.ones(0, dtype=np.bool_)
_RAMPS: dict[int, npt.NDArray[np.int64]] = {}
_RAMP_MAX = 1 << 16  # longest shared ramp (512 KiB); longer ones are built per batch
_RAMP_STEPS = 64  # distinct record lengths kept


def _ramp(step: int, n: int) -> npt.NDArray[np.int64]:
    """``0, step, 2*step, ...`` (``n`` values): the offsets of ``n - 1`` records of length ``step``. Up to
    :data:`_RAMP_MAX` values it is a read-only view of one array shared by every batch of that record length."""
    shared = _RAMPS.get(step)
    if shared is None or len(shared) < n:
        if n > _RAMP_MAX:
            return np.arange(0, n * step, step, dtype=np.int64)
        size = min(max(n, 1024, 2 * len(shared) if shared is not None else 0), _RAMP_MAX)
        shared = np.arange(0, size * step, step, dtype=np.int64)
        shared.flags.writeable = False
        if len(_RAMPS) >= _RAMP_STEPS:
            _RAMPS.clear()
        _RAMPS[step] = shared
    return shared[:n]


def _all_true(n: int) -> npt.NDArray[np.bool_]:
    """A read-only all-true array of ``n`` (a view of one shared array, grown on demand)."""
    global _TRUE
    shared = _TRUE
    if len(shared) < n:
        shared = np.ones(max(n, 2 * len(shared), 1 << 16), dtype=np.bool_)
        shared.flags.writeable = False
        _TRUE = shared
    return shared[:n]


def _decode_columns(h: BatchHeader, payload: memoryview) -> DecodedBatch:
    n = h.record_count
    ts_w, delta_w, key_w, value_w, header_w = LAYOUT.unpack_from(payload, 0)
    # the fixed-width columns must fit before anything is allocated from the record count
    if LAYOUT_SIZE + n * (ts_w + delta_w + key_w + value_w + header_w) > len(payload):
        raise CorruptRecordError("columns run past the payload")
    at = LAYOUT_SIZE
    if ts_w:
        ts_deltas, at = _column(payload, at, ts_w, n, _UNSIGNED)
        # compared as Python ints: an 8-byte delta beyond the int64 range cannot pass
        if int(ts_deltas.max()) != h.max_timestamp - h.base_timestamp or int(ts_deltas.min()) != 0:
            raise CorruptRecordError("timestamps disagree with the batch header")
        timestamps = ts_deltas.astype(np.int64)
        timestamps += h.base_timestamp  # cannot overflow: every delta <= max - base
    else:
        if h.base_timestamp != h.max_timestamp:
            raise CorruptRecordError("timestamps disagree with the batch header")
        timestamps = np.full(n, h.base_timestamp, dtype=np.int64)
    if delta_w:
        deltas, at = _column(payload, at, delta_w, n, _UNSIGNED4)
        deltas = deltas.astype(np.int64)
        if int(deltas[0]) != 0 or int(deltas[-1]) != h.last_offset_delta or (np.diff(deltas) <= 0).any():
            raise CorruptRecordError("offset deltas are not increasing from 0 to last_offset_delta")
        offsets = deltas + h.base_offset
    else:
        if h.last_offset_delta != n - 1:
            raise CorruptRecordError("dense batch with wrong last_offset_delta")
        offsets = np.arange(h.base_offset, h.base_offset + n, dtype=np.int64)
    key_offsets, key_valid, at = _length_column(payload, at, key_w, n)
    value_offsets, value_valid, at = _length_column(payload, at, value_w, n)
    header_offsets = None
    header_total = 0
    if header_w:
        header_lens, at = _column(payload, at, header_w, n, _UNSIGNED4)
        header_offsets = _offsets(header_lens)
        header_total = int(header_offsets[-1])
    key_total, value_total = int(key_offsets[-1]), int(value_offsets[-1])
    if at + key_total + value_total + header_total != len(payload):
        raise CorruptRecordError("record lengths do not add up to the payload length")
    key_data = payload[at : at + key_total]
    value_data = payload[at + key_total : at + key_total + value_total]
    header_data = payload[at + key_total + value_total :]
    return DecodedBatch(
        h,
        offsets,
        timestamps,
        key_offsets,
        key_valid,
        key_data,
        value_offsets,
        value_valid,
        value_data,
        header_offsets,
        header_data,
    )


class RecordLists(NamedTuple):
    """A batch's records as Python lists (what a per-record consumer needs)."""

    header: BatchHeader
    offsets: list[int]
    timestamps: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[Headers]


def decode_lists(buf: bytes | memoryview | bytearray, position: int = 0) -> RecordLists:
    """Decode the batch at ``position`` into Python lists, with the same checks as :func:`decode_batch`.

    On the compiled path (:mod:`pylog.speedups`) one C loop does it; the pure-Python path is
    :func:`_decode_lists_pure`."""
    if _core is None:
        return _decode_lists_pure(buf, position)
    return RecordLists._make(_core.decode_lists(buf, position)[:6])


def _decode_lists_pure(buf: bytes | memoryview | bytearray, position: int = 0) -> RecordLists:
    """:func:`decode_lists` in Python.

    Small uncompressed batches are parsed with ``struct`` alone (numpy's per-call overhead dominates there,
    which matters for latency); larger ones go through the vectorized decoder."""
    h = decode_header(buf, position)
    if h.record_count > _SMALL or h.attributes & ATTR_COMPRESSION_MASK:
        b = decode_batch(buf, position)
        return RecordLists(h, b.offsets.tolist(), b.timestamps.tolist(), b.keys(), b.values(), b.headers())
    check_crc(buf, position, h)
    payload = bytes(memoryview(buf)[position + HEADER_SIZE : position + h.batch_length])
    if len(payload) != h.payload_length:
        raise CorruptRecordError(f"payload length mismatch at position {position}", position=position)
    try:
        return _small_lists(h, payload)
    except (CorruptRecordError, struct.error, KeyError) as exc:
        raise CorruptRecordError(
            f"invalid batch payload at position {position}: {exc}", position=position
        ) from exc


def _small_lists(h: BatchHeader, payload: bytes) -> RecordLists:
    n = h.record_count
    ts_w, delta_w, key_w, value_w, header_w = LAYOUT.unpack_from(payload, 0)
    at = LAYOUT_SIZE

    def column(width: int, fmt: dict[int, str]) -> list[int]:
        nonlocal at
        values = list(struct.unpack_from(f"<{n}{fmt[width]}", payload, at))
        at += width * n
        return values

    if ts_w:
        if ts_w not in _FMT_U:
            raise CorruptRecordError(f"bad column width {ts_w}")
        timestamps = [d + h.base_timestamp for d in column(ts_w, _FMT_U)]
        if max(timestamps) != h.max_timestamp or min(timestamps) != h.base_timestamp:
            raise CorruptRecordError("timestamps disagree with the batch header")
    else:
        if h.base_timestamp != h.max_timestamp:
            raise CorruptRecordError("timestamps disagree with the batch header")
        timestamps = [h.base_timestamp] * n
    if delta_w:
        if delta_w not in (1, 2, 4):
            raise CorruptRecordError(f"bad column width {delta_w}")
        deltas = column(delta_w, _FMT_U)
        if (
            deltas[0] != 0
            or deltas[-1] != h.last_offset_delta
            or any(b <= a for a, b in itertools.pairwise(deltas))
        ):
            raise CorruptRecordError("offset deltas are not increasing from 0 to last_offset_delta")
        offsets = [d + h.base_offset for d in deltas]
    else:
        if h.last_offset_delta != n - 1:
            raise CorruptRecordError("dense batch with wrong last_offset_delta")
        offsets = list(range(h.base_offset, h.base_offset + n))
    key_lens = column(key_w, _FMT_S)
    value_lens = column(value_w, _FMT_S)
    header_lens = column(header_w, {1: "B", 2: "H", 4: "I"}) if header_w else None
    if min(key_lens) < -1 or min(value_lens) < -1:
        raise CorruptRecordError("negative record length")
    total = sum(k for k in key_lens if k > 0) + sum(v for v in value_lens if v > 0) + sum(header_lens or ())
    if at + total != len(payload):
        raise CorruptRecordError("record lengths do not add up to the payload length")
    keys: list[bytes | None] = []
    for k in key_lens:
        keys.append(None if k < 0 else payload[at : at + k])
        at += max(k, 0)
    values: list[bytes | None] = []
    for v in value_lens:
        values.append(None if v < 0 else payload[at : at + v])
        at += max(v, 0)
    headers: list[Headers]
    if header_lens is None:
        headers = [NO_HEADERS] * n
    else:
        headers = []
        for hl in header_lens:
            headers.append(decode_headers(payload[at : at + hl]) if hl else NO_HEADERS)
            at += hl
    return RecordLists(h, offsets, timestamps, keys, values, headers)


def _offsets(lengths: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    out = np.empty(lengths.shape[0] + 1, dtype=np.int64)
    out[0] = 0
    np.cumsum(lengths, dtype=np.int64, out=out[1:])
    return out


def _header_field_positions() -> dict[str, int]:
    """Where each field of :class:`BatchHeader` starts in the header, derived from ``HEADER``'s format."""
    codes = HEADER.format.lstrip("<")
    return {name: struct.calcsize("<" + codes[:i]) for i, name in enumerate(BatchHeader._fields)}


#: Byte position of each header field (``BatchHeader`` names), for code that patches a header in place.
HEADER_FIELD_AT: Final = _header_field_positions()
BASE_OFFSET_AT: Final = HEADER_FIELD_AT["base_offset"]  # i64, outside the CRC: assigned at append time
BATCH_LENGTH_AT: Final = HEADER_FIELD_AT["batch_length"]  # i32
CRC_AT: Final = HEADER_FIELD_AT["crc"]  # u32, of bytes [CRC_START, batch_length)
CRC_START: Final = _CRC_START
ATTRIBUTES_AT: Final = HEADER_FIELD_AT["attributes"]  # i16
LAST_DELTA_AT: Final = HEADER_FIELD_AT["last_offset_delta"]  # i32
BASE_TIMESTAMP_AT: Final = HEADER_FIELD_AT["base_timestamp"]  # i64, followed by max_timestamp
MAX_TIMESTAMP_AT: Final = HEADER_FIELD_AT["max_timestamp"]  # i64


def _configure_compiled(module: Any) -> None:
    """Hand the compiled loops (``pylog._speedups``) the one definition of everything they use."""
    module.configure(
        BatchHeader,
        NO_HEADERS,
        decode_headers,
        crc32c,
        _decompress,
        CorruptRecordError,
        UnsupportedFormatError,
        _compress,
    )


if _core is not None:
    _configure_compiled(_core)
