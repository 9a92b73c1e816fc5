"""Offset ranges of topic partitions to ``pyarrow.RecordBatch``es, straight from the mapped segment files.

The read loop walks batch headers (skipping batches the offset range or the timestamp bounds exclude), decodes
the rest (CRC-checked) and gathers slices of them, across the ranges of a Spark partition, until an output batch
holds about ``ROWS_PER_BATCH`` rows or ``BYTES_PER_BATCH`` bytes. Only the columns of the schema Spark asked for
are built. An output batch is built with numpy, with no Python loop per record:

- ``key``/``value``: the slices' offset arrays, shifted and concatenated, become the int32 offsets of an Arrow
  binary array; their bytes are joined once, or, for an output batch of one slice (a decoded batch of at least
  ``OWN_BATCH_ROWS`` rows is one), not copied at all: the Arrow buffer is a view of the mapped segment;
  nulls become a validity bitmap (``np.packbits``);
- ``offset``, ``timestamp`` (ms * 1000, ``timestamp[us, tz=UTC]``), ``timestampType``, ``partition``:
  concatenated numpy arrays; ``topic``: each slice's name repeated through an offsets array;
- ``headers`` (``includeHeaders=true``): the msgpack header blobs are unpacked by one C ``Unpacker`` per output
  batch, then flattened into a list-of-struct array (a Python loop over the header pairs only);
- decoded values (``valueFormat=msgpack``): one ``Unpacker`` over the joined value bytes yields the maps, and
  ``pa.array(maps, type=struct)`` converts them in C; each user column is a field of that struct.

The output schema is exactly ``to_arrow_schema(schema, timezone="UTC")``, as Spark requires.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

from pylog.errors import DeserializationError, OffsetOutOfRangeError
from pylog.partition.visibility import is_skipped
from pylog.record import DecodedBatch
from pylog.spark.filters import Bounds
from pylog.spark.options import OffsetRange
from pylog.spark.remote import RemoteRead, read_batches
from pylog.spark.snapshot import PartitionView, decode_checked, open_partition

__all__ = [
    "BYTES_PER_BATCH",
    "KAFKA_COLUMNS",
    "OWN_BATCH_ROWS",
    "ROWS_PER_BATCH",
    "ReadSpec",
    "read_range",
    "read_ranges",
]

ROWS_PER_BATCH = 65536
#: A decoded batch with at least this many rows to read becomes an output batch of its own, its key and value
#: columns views of the mapped segment (or of the decompressed batch): copying the bytes of large batches into
#: fresh memory cost a Spark task more than Spark's handling of smaller Arrow batches (profiled in the worker).
OWN_BATCH_ROWS = 4096
BYTES_PER_BATCH = 64 << 20
_log = logging.getLogger("pylog.spark")
KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers")


@dataclass(frozen=True)
class ReadSpec:
    """Everything a task needs besides its offset range (picklable)."""

    path: str
    schema_json: str
    fail_on_data_loss: bool
    value_format: str
    bounds: Bounds
    #: a log in an object store (``path`` is its URL): the store and the segments pinned at planning
    remote: RemoteRead | None = None
    #: the topics whose ``cleanup_policy`` includes ``compact``: their offsets may have gaps; every other
    #: topic's batches follow each other without one (both readers check base offsets by it)
    compacted: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class _Slice:
    rng: OffsetRange
    batch: DecodedBatch
    lo: int
    hi: int


def read_range(spec: ReadSpec, rng: OffsetRange) -> Iterator[Any]:
    """The records of ``rng`` as RecordBatches of ``spec``'s schema."""
    return read_ranges(spec, (rng,))


def read_ranges(spec: ReadSpec, ranges: Sequence[OffsetRange]) -> Iterator[Any]:
    """The records of ``ranges``, in order, as RecordBatches of ``spec``'s schema."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType, _parse_datatype_json_string

    schema = _parse_datatype_json_string(spec.schema_json)
    assert isinstance(schema, StructType)
    target = to_arrow_schema(schema, timezone="UTC")
    builder = _Builder(pa, target, spec)
    for group in _groups(spec, ranges):
        rb = builder.build(group)
        if rb.num_rows:
            yield rb


def _groups(spec: ReadSpec, ranges: Sequence[OffsetRange]) -> Iterator[list[_Slice]]:
    """Slices of decoded batches covering ``ranges``, grouped into output batches."""
    group: list[_Slice] = []
    rows = size = 0
    for rng in ranges:
        for b, lo, hi in _batches(spec, rng):
            # a large slice goes out alone: its key and value bytes are not copied
            if hi - lo >= OWN_BATCH_ROWS:
                if group:
                    yield group
                    group, rows, size = [], 0, 0
                for first in range(lo, hi, ROWS_PER_BATCH):
                    yield [_Slice(rng, b, first, min(first + ROWS_PER_BATCH, hi))]
                continue
            while lo < hi:
                take = min(hi - lo, ROWS_PER_BATCH - rows)
                group.append(_Slice(rng, b, lo, lo + take))
                rows += take
                size += int(b.key_offsets[lo + take] - b.key_offsets[lo])
                size += int(b.value_offsets[lo + take] - b.value_offsets[lo])
                lo += take
                if rows >= ROWS_PER_BATCH or size >= BYTES_PER_BATCH:
                    yield group
                    group, rows, size = [], 0, 0
    if group:
        yield group


def _batches(spec: ReadSpec, rng: OffsetRange) -> Iterator[tuple[DecodedBatch, int, int]]:
    """Each decoded batch holding records of ``rng``, with the index range ``[lo, hi)`` of those records."""
    if spec.remote is not None:  # a log in an object store (pylog.spark.remote)
        yield from read_batches(spec.remote, rng, spec.fail_on_data_loss, spec.bounds.timestamp)
        return
    view = open_partition(spec.path, rng.topic, rng.partition)
    start, end = _check_loss(view, rng, spec.fail_on_data_loss)
    ts = spec.bounds.timestamp
    for seg in view.segments_for(start, end):
        hint = seg.max_timestamp_hint() if ts.active else None
        if hint is not None and not ts.overlaps(-(1 << 62), hint * 1000):
            continue
        try:
            buf = seg.view()
        except FileNotFoundError:
            if spec.fail_on_data_loss:
                raise _lost(rng, f"segment {seg.path} was deleted while the query ran") from None
            _log.warning(
                "data loss reading %s-%d offsets [%d, %d): segment %s was deleted while the query ran; "
                "failOnDataLoss=false, so its records are skipped",
                rng.topic,
                rng.partition,
                rng.start,
                rng.end,
                seg.path,
            )
            continue
        for p, h in seg.checked_headers(buf, start, dense=rng.topic not in spec.compacted):
            if h.base_offset >= end:
                break
            if h.last_offset < start:
                continue  # between the indexed batch and the range's start
            if ts.active and not ts.overlaps(h.base_timestamp * 1000, h.max_timestamp * 1000):
                continue
            if rng.skipped and is_skipped(rng.skipped, max(h.base_offset, start)):
                continue  # read_committed: an aborted or control batch (pylog.spark.committed)
            b = decode_checked(seg, buf, p)
            lo = 0 if h.base_offset >= start else int(np.searchsorted(b.offsets, start))
            hi = len(b.offsets) if h.last_offset < end else int(np.searchsorted(b.offsets, end))
            yield b, lo, hi


def _check_loss(view: PartitionView, rng: OffsetRange, fail: bool) -> tuple[int, int]:
    start, end = rng.start, rng.end
    if view.log_start_offset > start:
        if fail:
            raise _lost(
                rng,
                f"offsets {start}..{view.log_start_offset - 1} were deleted (log now starts at "
                f"{view.log_start_offset})",
            )
        _skipping(rng, start, min(view.log_start_offset, end), "were deleted")
        start = min(view.log_start_offset, end)
    if view.log_end_offset < end:
        if fail:
            raise _lost(rng, f"the log was truncated to end at {view.log_end_offset}")
        _skipping(rng, max(view.log_end_offset, start), end, "were truncated away")
        end = max(view.log_end_offset, start)
    return start, end


def _skipping(rng: OffsetRange, first: int, stop: int, what: str) -> None:
    """failOnDataLoss=false: the offsets ``[first, stop)`` of a planned range are gone; say so, as Kafka's
    source does, and read on."""
    _log.warning(
        "data loss reading %s-%d offsets [%d, %d): offsets %d..%d %s; failOnDataLoss=false, so they are "
        "skipped. Some data may have been lost: it was deleted by retention, or the log was truncated",
        rng.topic,
        rng.partition,
        rng.start,
        rng.end,
        first,
        stop - 1,
        what,
    )


def _lost(rng: OffsetRange, what: str) -> OffsetOutOfRangeError:
    return OffsetOutOfRangeError(
        f"data loss reading {rng.topic}-{rng.partition} offsets [{rng.start}, {rng.end}): {what}. "
        "Set failOnDataLoss=false to skip records that are gone."
    )


class _Builder:
    """Builds one output RecordBatch from a group of slices."""

    def __init__(self, pa: Any, target: Any, spec: ReadSpec) -> None:
        self.pa = pa
        self.target = target
        self.bounds = spec.bounds
        names = set(target.names)
        self.value_fields = [f for f in target if f.name not in KAFKA_COLUMNS]
        if spec.value_format != "msgpack" and self.value_fields:
            bad = ", ".join(f.name for f in self.value_fields)
            raise DeserializationError(
                f"columns {bad} are not Kafka columns: set valueFormat=msgpack to read them from the values"
            )
        self.needs_values = "value" in names or bool(self.value_fields)

    def build(self, group: list[_Slice]) -> Any:
        pa = self.pa
        offsets = _cat([s.batch.offsets[s.lo : s.hi] for s in group])
        n = len(offsets)
        ts_ms = _cat([s.batch.timestamps[s.lo : s.hi] for s in group])
        decoded: Any = None
        columns = []
        for f in self.target:
            name = f.name
            if name == "key":
                col = self._binary(group, "key")
            elif name == "value":
                col = self._binary(group, "value")
            elif name == "topic":
                col = self._topic(group, n)
            elif name == "partition":
                col = _fixed(pa, pa.int32(), _per_slice(group, lambda s: s.rng.partition, np.int32))
            elif name == "offset":
                col = _fixed(pa, pa.int64(), np.ascontiguousarray(offsets, dtype=np.int64))
            elif name == "timestamp":
                col = _fixed(pa, pa.timestamp("us", tz="UTC"), ts_ms * 1000)
            elif name == "timestampType":
                types = _per_slice(group, lambda s: s.batch.header.timestamp_type, np.int32)
                col = _fixed(pa, pa.int32(), types)
            elif name == "headers":
                col = self._headers(group, f.type)
            else:
                if decoded is None:
                    struct = self._decode_values(group, offsets)
                    decoded = dict(zip(struct.type.names, struct.flatten(), strict=True))
                col = decoded[name]
            if col.type != f.type:
                col = col.cast(f.type)
            columns.append(col)
        rb = pa.RecordBatch.from_arrays(columns, schema=self.target)
        mask = self._mask(offsets, ts_ms)
        return rb if mask is None else rb.filter(pa.array(mask))

    def _mask(self, offsets: npt.NDArray[np.int64], ts_ms: npt.NDArray[np.int64]) -> Any:
        m = None
        if self.bounds.offset.values is not None:
            m = self.bounds.offset.mask(offsets)
        if self.bounds.timestamp.active:
            t = self.bounds.timestamp.mask(ts_ms * 1000)
            m = t if m is None else (m & t if t is not None else m)
        if m is None or bool(m.all()):
            return None
        return m

    def _topic(self, group: list[_Slice], n: int) -> Any:
        pa = self.pa
        names = [s.rng.topic.encode() for s in group]
        if len(set(names)) == 1:
            offs = np.arange(n + 1, dtype=np.int32) * len(names[0])
            data = names[0] * n
        else:
            lengths = _per_slice(group, lambda s: len(s.rng.topic.encode()), np.int32)
            offs = np.zeros(n + 1, dtype=np.int32)
            np.cumsum(lengths, out=offs[1:])
            data = b"".join(name * (s.hi - s.lo) for name, s in zip(names, group, strict=True))
        return pa.Array.from_buffers(
            pa.string(), n, [None, pa.py_buffer(offs), pa.py_buffer(data)], null_count=0
        )

    def _binary(self, group: list[_Slice], which: str) -> Any:
        pa = self.pa
        pieces, chunks, valids = [], [], []
        base = 0
        for s in group:
            b = s.batch
            o = b.key_offsets if which == "key" else b.value_offsets
            data = b.key_data if which == "key" else b.value_data
            a, z = int(o[s.lo]), int(o[s.hi])
            pieces.append(o[s.lo : s.hi] - (a - base))
            chunks.append(data[a:z])
            valids.append(b.key_valid[s.lo : s.hi] if which == "key" else b.value_valid[s.lo : s.hi])
            base += z - a
        pieces.append(np.array([base], dtype=np.int64))
        offs = np.concatenate(pieces).astype(np.int32)
        valid = _cat(valids)
        n = len(valid)
        data_buf = pa.py_buffer(chunks[0] if len(chunks) == 1 else b"".join(chunks))  # one slice: no copy
        if valid.all():
            return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offs), data_buf], null_count=0)
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
        nulls = int(n - np.count_nonzero(valid))
        return pa.Array.from_buffers(pa.binary(), n, [bitmap, pa.py_buffer(offs), data_buf], null_count=nulls)

    def _headers(self, group: list[_Slice], list_type: Any) -> Any:
        """list<struct<key, value>> per record; null for records without headers (as Spark's Kafka source)."""
        pa = self.pa
        lengths = []
        blobs = []
        for s in group:
            ho = s.batch.header_offsets
            if ho is None:
                lengths.append(np.zeros(s.hi - s.lo, dtype=np.int64))
                continue
            lengths.append(np.diff(ho[s.lo : s.hi + 1]))
            blobs.append(s.batch.header_data[int(ho[s.lo]) : int(ho[s.hi])])
        has = _cat(lengths) > 0
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(sum(len(b) for b in blobs), 1))
        for blob in blobs:
            unpacker.feed(blob)
        per_record = list(unpacker)
        counts = np.zeros(len(has), dtype=np.int32)
        counts[has] = [len(h) for h in per_record]
        offs = np.zeros(len(has) + 1, dtype=np.int32)
        np.cumsum(counts, out=offs[1:])
        keys = [k for h in per_record for k, _ in h]
        values = [v for h in per_record for _, v in h]
        struct_type = list_type.value_type
        items = pa.StructArray.from_arrays(
            [pa.array(keys, type=pa.string()), pa.array(values, type=pa.binary())],
            fields=list(struct_type),
        )
        mask = pa.array(~has)
        return pa.ListArray.from_arrays(pa.array(offs), items, type=list_type, mask=mask)

    def _decode_values(self, group: list[_Slice], offsets: npt.NDArray[np.int64]) -> Any:
        """The msgpack map values as one StructArray of the user's value columns (null for null values)."""
        pa = self.pa
        struct_type = pa.struct(self.value_fields)
        chunks, valids = [], []
        for s in group:
            o = s.batch.value_offsets
            chunks.append(s.batch.value_data[int(o[s.lo]) : int(o[s.hi])])
            valids.append(s.batch.value_valid[s.lo : s.hi])
        valid = _cat(valids)
        data = b"".join(chunks)
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(data), 1))
        unpacker.feed(data)
        where = _where(group, offsets)
        try:
            maps = list(unpacker)
        except Exception as exc:
            raise DeserializationError(f"values are not valid msgpack in {where}: {exc}") from exc
        if len(maps) != int(np.count_nonzero(valid)):
            raise DeserializationError(f"values are not one msgpack object each in {where}")
        try:
            arr = pa.array(maps, type=struct_type)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise DeserializationError(
                f"msgpack values do not fit the schema {struct_type} in {where}: {exc}"
            ) from exc
        if len(maps) == len(valid):
            return arr
        idx = np.cumsum(valid, dtype=np.int64) - 1
        return arr.take(pa.array(idx, mask=~valid))


def _fixed(pa: Any, arrow_type: Any, values: npt.NDArray[Any]) -> Any:
    """A null-free fixed-width column over the numpy buffer: no copy, and unlike ``pa.array`` on numpy input
    it does not import pandas in every fresh Python worker."""
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)], null_count=0)


def _where(group: list[_Slice], offsets: npt.NDArray[np.int64]) -> str:
    """The records of an output batch, for error messages."""
    parts = list(dict.fromkeys(f"{s.rng.topic}-{s.rng.partition}" for s in group))
    if len(parts) == 1:
        return f"{parts[0]} offsets {int(offsets[0])}..{int(offsets[-1])}"
    return f"partitions {', '.join(parts)}"


def _per_slice(group: list[_Slice], value: Callable[[_Slice], int], dtype: Any) -> npt.NDArray[Any]:
    """One value per slice, repeated for each of its rows."""
    values = [value(s) for s in group]
    n = sum(s.hi - s.lo for s in group)
    if len(set(values)) == 1:
        return np.full(n, values[0], dtype=dtype)
    return np.repeat(np.array(values, dtype=dtype), [s.hi - s.lo for s in group])


def _cat(arrays: list[Any]) -> Any:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
