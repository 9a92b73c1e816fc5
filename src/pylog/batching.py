"""Batch building for the producer: records cut into batches that fit ``max_message_bytes``, grouped by
partition, and encoded with :mod:`pylog.record` (framing, CRC).

Two inputs: the records a producer queued one by one (:class:`QueueColumns`, built from the lists of a drained
queue), and the columns given to ``Producer.send_batch`` (:class:`Column`: a list of bytes, a 2-D ``uint8``
array or a pyarrow binary array). Sizes are budgeted with :data:`PER_RECORD_MAX` per record, the most column
bytes a record can cost in a batch, so a batch of records that each fit ``max_message_bytes`` fits too.

Thread-safety: the functions are pure; a :class:`QueueColumns` or :class:`Column` belongs to one drain.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from pylog.errors import InvalidRecordError, SerializationError
from pylog.partitioner import murmur2_fixed, partitions_for_keys
from pylog.record import HEADER_SIZE, LAYOUT_SIZE, encode_batch, encode_columns, item_lengths
from pylog.speedups import core as _core

if TYPE_CHECKING:
    from pylog.topic import Topic

__all__ = [
    "PER_RECORD",
    "PER_RECORD_MAX",
    "RECORD_OVERHEAD",
    "SMALL_BATCH",
    "Column",
    "QueueColumns",
    "as_list",
    "column_sizes",
    "cut",
    "group",
    "payload_limit",
    "runs",
    "sizes_of",
]

PER_RECORD = 8  # bytes of column overhead budgeted per record in a queue's byte count
# The most column bytes a record can cost in a batch (8 B timestamp delta, 4 B each offset delta, key, value and
# headers length): batches are cut with it, so a batch of records that each fit max_message_bytes fits too.
PER_RECORD_MAX = 24
SMALL_BATCH = 32  # chunks up to this many records go through encode_batch (struct only, lower latency)
RECORD_OVERHEAD = HEADER_SIZE + LAYOUT_SIZE + 16  # a batch of one record: header, layout, widest lengths


class QueueColumns:
    """Records drained from a producer's queue as columns, encoded into batches chunk by chunk.

    The lengths are computed once for the whole drain; a chunk of contiguous records is encoded from list
    slices (no gather): by :func:`~pylog.record.encode_batch` on the compiled path (one C loop, any size) and
    for a small chunk, else with :func:`~pylog.record.encode_columns` directly."""

    def __init__(
        self, keys: list[bytes | None], values: list[bytes | None], headers: list[bytes] | None
    ) -> None:
        self.keys, self.values = keys, values
        self.headers = headers if headers is not None and any(headers) else None
        self.key_lens, self.key_nulls = item_lengths(self.keys)
        self.value_lens, self.value_nulls = item_lengths(self.values)
        self.header_lens = None if self.headers is None else item_lengths(self.headers)[0]
        sizes = np.maximum(self.key_lens, 0)
        sizes += np.maximum(self.value_lens, 0)
        sizes += PER_RECORD_MAX
        if self.header_lens is not None:
            sizes += self.header_lens
        self.sizes = sizes

    def encode(
        self,
        chunk: npt.NDArray[np.intp],
        ts: npt.NDArray[np.int64],
        compression: str,
        fields: Mapping[str, Any],
    ) -> bytes:
        a, b = int(chunk[0]), int(chunk[-1]) + 1
        if b - a == len(chunk):  # contiguous: slice the lists instead of gathering
            keys, values = self.keys[a:b], self.values[a:b]
            hdrs = None if self.headers is None else self.headers[a:b]
            sel: slice | npt.NDArray[np.intp] = slice(a, b)
        else:
            pick = operator.itemgetter(*chunk.tolist())
            keys, values = as_list(pick(self.keys), len(chunk)), as_list(pick(self.values), len(chunk))
            hdrs = None if self.headers is None else as_list(pick(self.headers), len(chunk))
            sel = chunk
        if hdrs is not None and not any(hdrs):
            hdrs = None  # no record of this chunk has headers: no headers column
        if _core is not None or (len(keys) <= SMALL_BATCH and compression == "none"):
            return encode_batch(0, keys, values, ts[sel], hdrs, compression=compression, **fields)
        return encode_columns(
            0,
            self.key_lens[sel],
            b"".join([k for k in keys if k] if self.key_nulls else keys),  # type: ignore[arg-type]
            self.value_lens[sel],
            b"".join([v for v in values if v] if self.value_nulls else values),  # type: ignore[arg-type]
            ts[sel],
            None if self.header_lens is None or hdrs is None else self.header_lens[sel],
            b"" if hdrs is None else b"".join(hdrs),
            compression=compression,
            **fields,
        )


def group(parts: npt.NDArray[np.int32]) -> list[npt.NDArray[np.intp]]:
    order = np.argsort(parts, kind="stable")
    sorted_parts = parts[order]
    cuts = np.flatnonzero(np.diff(sorted_parts)) + 1
    return list(np.split(order, cuts))


def as_list(picked: Any, n: int) -> list[Any]:
    return [picked] if n == 1 else list(picked)


def payload_limit(max_bytes: int, compression: str | None) -> int:
    """Bytes of records (as budgeted by ``PER_RECORD_MAX``) that one batch of at most ``max_bytes`` holds;
    compressed payloads keep room for incompressible data (gzip, lz4 and zstd grow it by under 1/250)."""
    limit = max_bytes - HEADER_SIZE - LAYOUT_SIZE
    if compression not in (None, "none"):
        limit = limit * 250 // 251 - 64
    return max(limit, 1)


def sizes_of(sizes: int | npt.NDArray[np.int64], n: int) -> npt.NDArray[np.int64]:
    return np.full(n, sizes, dtype=np.int64) if isinstance(sizes, int) else sizes


def runs(n: int, sizes: int | npt.NDArray[np.int64], limit: int) -> list[slice]:
    """:func:`cut` for the records ``0..n-1`` in order, as slices (arithmetic when all sizes are equal)."""
    if isinstance(sizes, int):
        per = max(limit // sizes, 1)
        return [slice(a, min(a + per, n)) for a in range(0, n, per)]
    return [slice(int(c[0]), int(c[-1]) + 1) for c in cut(np.arange(n), sizes, limit)]


def cut(idx: npt.NDArray[np.intp], sizes: npt.NDArray[np.int64], limit: int) -> list[npt.NDArray[np.intp]]:
    """Split ``idx`` into runs whose summed ``sizes`` stay within ``limit``."""
    s = sizes[idx]
    if int(s.sum()) <= limit:
        return [idx]
    out = []
    csum = np.cumsum(s)
    start = 0
    base = 0
    while start < len(idx):
        end = int(np.searchsorted(csum, base + limit, side="right"))
        end = max(end, start + 1)
        out.append(idx[start:end])
        base = int(csum[end - 1])
        start = end
    return out


class Column:
    """A column of byte strings given as a list, a 2-D uint8 array or a pyarrow binary array.

    ``width`` is the length every record has (fixed-width arrays; -1 for a column of nulls), or None; the
    per-record ``lens`` of such a column are only built when asked for."""

    def __init__(
        self, lens: npt.NDArray[np.int64] | None, data: Any, kind: str, raw: Any, *, n: int, width: int | None
    ) -> None:
        self._lens = lens
        self.data = data
        self.kind = kind
        self.raw = raw
        self.n = n
        self.width = width

    @property
    def lens(self) -> npt.NDArray[np.int64]:
        if self._lens is None:
            self._lens = np.full(self.n, -1 if self.width is None else self.width, dtype=np.int64)
        return self._lens

    @property
    def is_none(self) -> bool:
        return self.kind == "none"

    def __len__(self) -> int:
        return self.n

    @classmethod
    def nulls(cls, n: int) -> Column:
        return cls(None, None, "nulls", None, n=n, width=-1)

    @classmethod
    def of_bytes(cls, col: list[bytes | None]) -> Column:
        """A column of a list whose items pylog itself made and knows to be ``bytes`` or None (the records a
        broker decoded from a Kafka batch): no per-record type check and no copy of the list, which must not
        change until written. Input from users goes through :meth:`of`."""
        return cls(item_lengths(col)[0], None, "list", col, n=len(col), width=None)

    @classmethod
    def of(cls, col: Any, what: str) -> Column:
        if col is None:
            return cls(np.zeros(0, dtype=np.int64), None, "none", None, n=0, width=None)
        if isinstance(col, np.ndarray):
            if col.dtype != np.uint8 or col.ndim != 2:
                raise InvalidRecordError(f"{what} as a numpy array must be 2-D uint8 (one row per record)")
            raw = np.ascontiguousarray(col)
            return cls(None, raw, "fixed", raw, n=col.shape[0], width=col.shape[1])
        if type(col).__module__.startswith("pyarrow"):
            import pyarrow as pa

            arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
            if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
                raise InvalidRecordError(f"{what} as a pyarrow array must be binary")
            offs = np.frombuffer(
                arr.buffers()[1], dtype=np.int32 if pa.types.is_binary(arr.type) else np.int64
            )
            offs = offs[arr.offset : arr.offset + len(arr) + 1].astype(np.int64)
            lens = np.diff(offs)
            if arr.null_count:
                lens[np.asarray(arr.is_null())] = -1
            data = (
                np.frombuffer(arr.buffers()[2], dtype=np.uint8)
                if arr.buffers()[2] is not None
                else np.zeros(0, np.uint8)
            )
            return cls(lens, (offs, data), "arrow", arr, n=len(lens), width=None)
        if isinstance(col, list | tuple):
            for x in col:
                if x is not None and not isinstance(x, bytes):
                    raise SerializationError(
                        f"{what} must be bytes or None in send_batch, got {type(x).__name__}"
                    )
            return cls(item_lengths(col)[0], None, "list", list(col), n=len(col), width=None)
        raise InvalidRecordError(
            f"{what} must be a list of bytes, a 2-D uint8 array or a pyarrow binary array"
        )

    def take(self, sel: slice | npt.NDArray[np.intp]) -> tuple[npt.NDArray[np.int64], bytes | memoryview]:
        """Lengths and concatenated bytes of the records ``sel`` (a slice, or indexes)."""
        if self.width is not None:
            count = len(range(self.n)[sel]) if isinstance(sel, slice) else len(sel)
            lens = np.full(count, self.width, dtype=np.int64)
            if self.kind == "nulls":
                return lens, b""
            if isinstance(sel, slice):
                return lens, memoryview(self.raw[sel]).cast("B")
            return lens, self.raw[sel].tobytes()
        lens = self.lens[sel]
        if isinstance(sel, slice):
            a, b, _ = sel.indices(self.n)
            if self.kind == "arrow":
                offs, data = self.data
                return lens, data[int(offs[a]) : int(offs[b])].data
            return lens, b"".join([x for x in self.raw[a:b] if x])
        if self.kind == "arrow":
            offs, data = self.data
            return lens, b"".join(data[int(offs[i]) : int(offs[i + 1])].tobytes() for i in sel.tolist())
        raw = self.raw
        return lens, b"".join([raw[i] for i in sel.tolist() if raw[i]])

    def as_list(self, idx: npt.NDArray[np.intp]) -> list[bytes]:
        if self.kind == "fixed":
            return [bytes(r) for r in self.raw[idx]]
        if self.kind == "arrow":
            offs, data = self.data
            return [data[int(offs[i]) : int(offs[i + 1])].tobytes() for i in idx.tolist()]
        return [self.raw[i] for i in idx.tolist()]

    def partitions(self, n: int) -> npt.NDArray[np.int32]:
        if self.kind == "fixed":
            return ((murmur2_fixed(self.raw).astype(np.int64) & 0x7FFFFFFF) % n).astype(np.int32)
        return partitions_for_keys(self.as_list(np.arange(len(self.lens))), n)


def column_sizes(
    t: Topic, kcol: Column, vcol: Column, *, null_records: bool = False
) -> tuple[int | npt.NDArray[np.int64], int]:
    """Check ``send_batch``'s records for nulls; returns their sizes (one int when all have the same) and the
    largest. ``null_records``: a record whose key and value are both None is allowed (Kafka accepts one on a
    topic that is not compacted, and a broker stores what its clients send); pylog's own producers refuse it
    as a likely mistake."""
    if kcol.width is not None and vcol.width is not None:
        if kcol.width < 0 and vcol.width < 0 and not null_records:
            raise InvalidRecordError("a record has both key and value None")
        if t.config.compacted and kcol.width < 0:
            raise InvalidRecordError(f"topic {t.name!r} is compacted: every record needs a key")
        sizes: int | npt.NDArray[np.int64] = max(kcol.width, 0) + max(vcol.width, 0) + PER_RECORD_MAX
        return sizes, int(sizes)
    klens, vlens = kcol.lens, vcol.lens
    if not null_records and ((klens < 0) & (vlens < 0)).any():
        raise InvalidRecordError("a record has both key and value None")
    if t.config.compacted and (klens < 0).any():
        raise InvalidRecordError(f"topic {t.name!r} is compacted: every record needs a key")
    sizes = np.maximum(klens, 0) + np.maximum(vlens, 0) + PER_RECORD_MAX
    return sizes, int(sizes.max())
