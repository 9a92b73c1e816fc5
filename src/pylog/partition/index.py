"""Sparse offset and time indexes of one segment, searched with ``np.searchsorted``.

Offset index (``.index``), 8-byte entries::

    offset size type field
    0      4    u32  relative_offset   base offset of an indexed batch minus the segment's base offset
    4      4    u32  position          byte position of that batch in the ``.log`` file

Time index (``.timeindex``), 12-byte entries::

    offset size type field
    0      8    i64  timestamp         largest timestamp in the segment up to and including the indexed batch
    8      4    u32  relative_offset   base offset of that batch minus the segment's base offset

An offset-index entry is added for a batch when at least ``index_interval_bytes`` of log were written since the
previous entry (and for the first batch). Beside each offset-index entry a time-index entry is added when the
segment's largest timestamp grew since the previous time-index entry, and a roll adds one for the final largest
timestamp, so timestamps in the file are strictly increasing, the largest timestamp is the last entry's or a
later batch's (a reader scans from the last indexed batch), and the last entry of a rolled segment is its largest
timestamp. Lookups: the greatest indexed batch whose base offset is <= the target, and for a time the batch
after the last entry whose timestamp is < the target; the caller scans batch headers forward from there.

Contract: the indexes are NOT checksummed and are never trusted blindly. :func:`check_offset_index` and
:func:`check_time_index` validate them on open (sizes, monotonicity, bounds); on failure the caller rebuilds them
from the log. Entries are kept in memory and appended to the file lazily (on flush, roll and close); a stale
file prefix is still a correct sparse index. Not thread-safe: the owning segment serializes access.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from pylog.errors import CorruptIndexError

__all__ = [
    "OFFSET_ENTRY",
    "TIME_ENTRY",
    "SparseIndex",
    "check_offset_index",
    "check_time_index",
    "durable_prefix",
]

OFFSET_ENTRY = np.dtype([("rel", "<u4"), ("pos", "<u4")])
TIME_ENTRY = np.dtype([("ts", "<i8"), ("rel", "<u4")])


class SparseIndex:
    """A growable array of index entries, with how many of them are already in the file."""

    __slots__ = ("_entries", "_n", "dtype", "written")

    def __init__(self, dtype: np.dtype[Any], entries: npt.NDArray[Any] | None = None) -> None:
        self.dtype = dtype
        n = 0 if entries is None else len(entries)
        self._entries = np.zeros(max(16, n * 2), dtype=dtype)
        if entries is not None:
            self._entries[:n] = entries
        self._n = n
        self.written = n

    def __len__(self) -> int:
        return self._n

    @property
    def entries(self) -> npt.NDArray[Any]:
        return self._entries[: self._n]

    def append(self, a: int, b: int) -> None:
        if self._n == len(self._entries):
            grown = np.zeros(len(self._entries) * 2, dtype=self.dtype)
            grown[: self._n] = self._entries[: self._n]
            self._entries = grown
        self._entries[self._n] = (a, b)
        self._n += 1

    def pending_bytes(self) -> bytes:
        return self._entries[self.written : self._n].tobytes()

    def truncate_entries(self, keep: int) -> None:
        self._n = keep
        self.written = min(self.written, keep)

    def last(self) -> tuple[int, int] | None:
        if not self._n:
            return None
        e = self._entries[self._n - 1]
        return int(e[0]), int(e[1])

    def floor_position(self, rel_offset: int) -> int:
        """Position of the greatest indexed batch with relative base offset <= ``rel_offset`` (0 if none)."""
        return self.floor_entry(rel_offset)[1]

    def floor_entry(self, rel_offset: int) -> tuple[int, int]:
        """``(relative offset, position)`` of the greatest indexed batch with relative base offset <=
        ``rel_offset`` (``(0, 0)``, the first batch, if none)."""
        rel = self._entries["rel"][: self._n]
        i = int(np.searchsorted(rel, rel_offset, side="right")) - 1
        return (int(self._entries["rel"][i]), int(self._entries["pos"][i])) if i >= 0 else (0, 0)

    def time_floor_rel(self, timestamp: int) -> int:
        """Relative offset from which a scan for the first record with ts >= ``timestamp`` may start.

        Every batch before the indexed batch of the last entry whose timestamp is < ``timestamp`` holds only
        smaller timestamps, so the scan may start at that batch (0 when there is none).
        """
        floor = self.time_floor_entry(timestamp)
        return 0 if floor is None else floor[1]

    def time_floor_entry(self, timestamp: int) -> tuple[int, int] | None:
        """``(timestamp, relative offset)`` of the last entry whose timestamp is < ``timestamp`` (None when
        there is none): the entry :meth:`time_floor_rel` starts from."""
        ts = self._entries["ts"][: self._n]
        i = int(np.searchsorted(ts, timestamp, side="left")) - 1
        return (int(self._entries["ts"][i]), int(self._entries["rel"][i])) if i >= 0 else None


def _load(raw: bytes, dtype: np.dtype[Any], name: str) -> npt.NDArray[Any]:
    if len(raw) % dtype.itemsize:
        raise CorruptIndexError(f"{name}: size {len(raw)} is not a multiple of {dtype.itemsize}")
    return np.frombuffer(raw, dtype=dtype).copy()


def check_offset_index(raw: bytes, log_size: int, max_rel: int, name: str = "index") -> npt.NDArray[Any]:
    """Parse and sanity-check an offset index; raises CorruptIndexError (the caller rebuilds)."""
    e = _load(raw, OFFSET_ENTRY, name)
    if len(e):
        rel = e["rel"].astype(np.int64)
        pos = e["pos"].astype(np.int64)
        if (np.diff(rel) <= 0).any() or (np.diff(pos) <= 0).any():
            raise CorruptIndexError(f"{name}: entries are not strictly increasing")
        if int(pos[-1]) >= log_size or int(rel[-1]) > max_rel or int(pos[0]) != 0 or int(rel[0]) != 0:
            raise CorruptIndexError(f"{name}: entries point outside the segment")
    return e


def check_time_index(raw: bytes, max_rel: int, name: str = "timeindex") -> npt.NDArray[Any]:
    """Parse and sanity-check a time index; raises CorruptIndexError (the caller rebuilds)."""
    e = _load(raw, TIME_ENTRY, name)
    if len(e):
        if (np.diff(e["ts"]) <= 0).any() or (np.diff(e["rel"].astype(np.int64)) < 0).any():
            raise CorruptIndexError(f"{name}: entries are not increasing")
        if int(e["rel"][-1]) > max_rel:
            raise CorruptIndexError(f"{name}: entries point outside the segment")
    return e


def durable_prefix(
    oraw: bytes, traw: bytes, log_size: int, max_rel: int
) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """The longest prefixes of an offset and a time index (raw file bytes) that are well formed and name only
    batches at relative offsets <= ``max_rel`` inside the first ``log_size`` bytes.

    After an unclean shutdown, entries up to the recovery point were fsynced with the log; entries after it
    may be missing or damaged (a file grown but its last blocks never written). A sparse index stays valid
    when cut at any entry, so the well-formed prefix is what recovery can start from."""
    oe = np.frombuffer(oraw[: len(oraw) - len(oraw) % OFFSET_ENTRY.itemsize], dtype=OFFSET_ENTRY)
    rel = oe["rel"].astype(np.int64)
    pos = oe["pos"].astype(np.int64)
    ok = (rel <= max_rel) & (pos < log_size)
    ok[1:] &= (np.diff(rel) > 0) & (np.diff(pos) > 0)
    if len(ok):
        ok[0] &= rel[0] == 0 and pos[0] == 0
    bad = np.flatnonzero(~ok)
    o_keep = int(bad[0]) if len(bad) else len(oe)
    last_rel = int(rel[o_keep - 1]) if o_keep else -1
    te = np.frombuffer(traw[: len(traw) - len(traw) % TIME_ENTRY.itemsize], dtype=TIME_ENTRY)
    trel = te["rel"].astype(np.int64)
    tok = trel <= last_rel
    tok[1:] &= (np.diff(te["ts"]) > 0) & (np.diff(trel) >= 0)
    tbad = np.flatnonzero(~tok)
    t_keep = int(tbad[0]) if len(tbad) else len(te)
    return oe[:o_keep].copy(), te[:t_keep].copy()
