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


def _binary(pa: Any, parts: Sequence[tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_], memoryview]]) -> Any:
    """One Arrow binary array from per-batch (offsets, valid, data) triples."""
    if len(parts) == 1:
        offsets, valid, data = parts[0]
        data_buf = pa.py_buffer(data)
        offs = offsets.astype(np.int32)
    else:
        lengths = np.concatenate([np.diff(p[0]) for p in parts])
        offs = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offs[1:])
        data_buf = pa.py_buffer(b"".join(p[2] for p in parts))
        valid = np.concatenate([p[1] for p in parts])
    n = len(offs) - 1
    if valid.all():
        return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offs), data_buf], null_count=0)
    bitmap = np.packbits(valid, bitorder="little")
    return pa.Array.from_buffers(
        pa.binary(), n, [pa.py_buffer(bitmap), pa.py_buffer(offs), data_buf], null_count=int(n - valid.sum())
    )


def _fixed(pa: Any, arrow_type: Any, values: npt.NDArray[Any]) -> Any:
    """A null-free fixed-width Arrow array over a numpy array's buffer (no copy; and unlike ``pa.array`` on
    numpy input, it does not import pandas on first use, which costs a third of a second)."""
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)], null_count=0)


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
    offsets = np.concatenate([b.offsets for b in batches]) if len(batches) > 1 else batches[0].offsets
    n = len(offsets)
    keys = _binary(pa, [(b.key_offsets, b.key_valid, b.key_data) for b in batches])
    values = _binary(pa, [(b.value_offsets, b.value_valid, b.value_data) for b in batches])
    ts = np.concatenate([b.timestamps for b in batches]) if len(batches) > 1 else batches[0].timestamps
    ts_type = np.concatenate(
        [np.full(len(b.offsets), b.header.timestamp_type, dtype=np.int32) for b in batches]
    )
    name = topic.encode()
    topic_offsets = np.arange(n + 1, dtype=np.int32) * len(name)
    topics = pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(topic_offsets), pa.py_buffer(name * n)], null_count=0
    )
    columns = [
        keys,
        values,
        topics,
        _fixed(pa, pa.int32(), np.full(n, partition, dtype=np.int32)),
        _fixed(pa, pa.int64(), np.ascontiguousarray(offsets, dtype=np.int64)),
        _fixed(pa, pa.timestamp("us", tz="UTC"), ts * 1000),
        _fixed(pa, pa.int32(), ts_type),
    ]
    if include_headers:
        columns.append(_headers(pa, batches))
    rb = pa.RecordBatch.from_arrays(columns, schema=schema)
    lo = int(np.searchsorted(offsets, start_offset, side="left"))
    hi = n if end_offset is None else int(np.searchsorted(offsets, end_offset, side="left"))
    return rb if (lo, hi) == (0, n) else rb.slice(lo, hi - lo)
