"""Decoded batches to Arrow, with the row shape of Spark's Kafka source and no Python loop per record.

The columnar batch payload (see :mod:`pylog.record`) already holds keys and values as one concatenated buffer
plus lengths, so an Arrow ``binary`` column is an offsets array (a cumulative sum of the lengths) and the data
buffer. Several pylog batches become one Arrow batch by concatenating their buffers once (a ``memcpy``); a
single uncompressed batch is handed over without copying its key and value bytes.

Schema (nullable fields, like Spark's)::

    key binary, value binary, topic string, partition int32, offset int64,
    timestamp timestamp[us, tz=UTC], timestampType int32 [, headers list<struct<key: string, value: binary>>]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from pylog.record import DecodedBatch

__all__ = ["arrow_schema", "batches_to_arrow"]


def _pa() -> Any:
    try:
        import pyarrow as pa
    except ImportError as exc:  # pragma: no cover - pyarrow is an extra
        raise ImportError("pyarrow is needed for Arrow output: pip install 'pylog[arrow]'") from exc
    return pa


def arrow_schema(include_headers: bool = False) -> Any:
    """The Arrow schema of :func:`batches_to_arrow` (equal to Spark's Kafka source schema in Arrow)."""
    pa = _pa()
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
        fields.append(pa.field("headers", pa.list_(header)))
    return pa.schema(fields)


def _pool_array(pa: Any, n: int, dtype: Any) -> tuple[Any, npt.NDArray[Any]]:
    """A fresh buffer of ``n`` items from Arrow's memory pool and a writable numpy view of it.

    Arrow's pool hands out memory faster than a fresh ``malloc`` of this size (whose pages the kernel must
    first fault in) and reuses it from one poll to the next; the finished column then wraps the buffer."""
    dt = np.dtype(dtype)
    buf = pa.allocate_buffer(n * dt.itemsize)
    return buf, np.frombuffer(buf, dtype=dt)


def _binary(pa: Any, parts: Sequence[tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_], memoryview]]) -> Any:
    """One Arrow binary array from per-batch (offsets, valid, data) triples.

    Each batch becomes a zero-copy array over its stored bytes (only its offsets are narrowed to int32);
    several are joined by Arrow's ``concat_arrays``, one copy into Arrow's memory pool."""
    scratch, view = _pool_array(pa, sum(len(p[0]) for p in parts), np.int32)
    arrays = []
    at = 0
    for offsets, valid, data in parts:
        n = len(offsets) - 1
        np.copyto(view[at : at + n + 1], offsets, casting="unsafe")  # a batch is below 2 GiB: they fit
        nulls = n - int(np.count_nonzero(valid))
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
        offs = scratch.slice(at * 4, (n + 1) * 4)
        arrays.append(
            pa.Array.from_buffers(pa.binary(), n, [bitmap, offs, pa.py_buffer(data)], null_count=nulls)
        )
        at += n + 1
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)


def _fixed(pa: Any, arrow_type: Any, n: int, buffer: Any) -> Any:
    """A null-free fixed-width Arrow array over ``buffer`` (no copy; and unlike ``pa.array`` on numpy input,
    it does not import pandas on first use, which costs a third of a second)."""
    return pa.Array.from_buffers(arrow_type, n, [None, buffer], null_count=0)


def _column(pa: Any, parts: Sequence[npt.NDArray[Any]], n: int, dtype: Any) -> tuple[Any, npt.NDArray[Any]]:
    """``parts`` joined into one pool buffer of ``n`` items (and a numpy view of it)."""
    buf, out = _pool_array(pa, n, dtype)
    np.concatenate(parts, out=out)
    return buf, out


def _headers(pa: Any, batches: Sequence[DecodedBatch]) -> Any:
    rows: list[list[dict[str, Any]] | None] = []
    for b in batches:
        rows.extend([[{"key": k, "value": v} for k, v in h] for h in b.headers()])
    return pa.array(rows, type=arrow_schema(True).field("headers").type)


def batches_to_arrow(
    topic: str,
    partition: int,
    batches: Sequence[DecodedBatch],
    *,
    start_offset: int = 0,
    end_offset: int | None = None,
    include_headers: bool = False,
) -> Any:
    """One ``pyarrow.RecordBatch`` of the records of ``batches`` with ``start_offset <= offset < end_offset``."""
    pa = _pa()
    schema = arrow_schema(include_headers)
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=schema)
    n = sum(len(b.offsets) for b in batches)
    offsets_buf, offsets = _column(pa, [b.offsets for b in batches], n, np.int64)
    keys = _binary(pa, [(b.key_offsets, b.key_valid, b.key_data) for b in batches])
    values = _binary(pa, [(b.value_offsets, b.value_valid, b.value_data) for b in batches])
    ts_buf, ts = _column(pa, [b.timestamps for b in batches], n, np.int64)
    ts *= 1000  # milliseconds to microseconds, in place
    ts_type_buf, ts_type = _pool_array(pa, n, np.int32)
    at = 0
    for b in batches:
        ts_type[at : at + len(b.offsets)] = b.header.timestamp_type
        at += len(b.offsets)
    partition_buf, partitions = _pool_array(pa, n, np.int32)
    partitions.fill(partition)
    name = topic.encode()
    topic_offsets_buf, topic_offsets = _pool_array(pa, n + 1, np.int32)
    topic_offsets[0] = 0
    np.cumsum(np.broadcast_to(np.int32(len(name)), (n,)), dtype=np.int32, out=topic_offsets[1:])
    topics = pa.Array.from_buffers(
        pa.string(), n, [None, topic_offsets_buf, pa.py_buffer(name * n)], null_count=0
    )
    columns = [
        keys,
        values,
        topics,
        _fixed(pa, pa.int32(), n, partition_buf),
        _fixed(pa, pa.int64(), n, offsets_buf),
        _fixed(pa, pa.timestamp("us", tz="UTC"), n, ts_buf),
        _fixed(pa, pa.int32(), n, ts_type_buf),
    ]
    if include_headers:
        columns.append(_headers(pa, batches))
    rb = pa.RecordBatch.from_arrays(columns, schema=schema)
    lo = int(np.searchsorted(offsets, start_offset, side="left"))
    hi = n if end_offset is None else int(np.searchsorted(offsets, end_offset, side="left"))
    return rb if (lo, hi) == (0, n) else rb.slice(lo, hi - lo)
