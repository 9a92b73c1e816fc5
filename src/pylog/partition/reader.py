"""Reading a partition directory without opening the log: the one reader of its files from outside a writer.

A :class:`~pylog.partition.log.PartitionLog` takes locks, may run recovery and creates files. Tools that must
not (the Spark readers on executors, ``pylog dump``) read the directory the way another process of the log
does, creating and changing nothing:

- the published state (``partition.state``: the active segment, its published size, the log end offset) read
  with the seqlock protocol of :func:`pylog.partition.state.read_published`;
- the segment files, listed by the naming rules of :mod:`pylog.partition.files` (:func:`list_segments`) and
  mapped read-only up to their published size;
- batch headers, walked by :func:`walk_headers` (the one header walk of pylog: every other walker of batch
  headers, in :mod:`pylog.partition.segment` and :mod:`pylog.partition.log`, is built on it);
- the ``.index`` and ``.timeindex`` files, only as hints for where to start walking (:func:`read_entries`).

A :class:`PartitionReader` is a snapshot: records appended after it was built are not visible through it, and
a segment deleted by retention after it was built is still readable if it was already mapped. It holds only
paths and numbers (it pickles, so a Spark executor can receive one or build its own from the directory path),
and opens files lazily, when asked for a segment's bytes.

Thread-safety: a reader and its :class:`SegmentFile` objects are immutable once built; the maps they return
are read-only. Crash contract: writes nothing; a writer killed at any point leaves the published state and
the files consistent for it (bytes past the published size are never read).
"""

from __future__ import annotations

import bisect
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from pylog.errors import CorruptRecordError, UnsupportedFormatError
from pylog.partition import files
from pylog.partition.index import OFFSET_ENTRY, TIME_ENTRY
from pylog.partition.logstart import read_log_start
from pylog.partition.state import Snapshot, read_published
from pylog.record import BatchHeader, DecodedBatch, decode_batch, decode_header

__all__ = [
    "PartitionReader",
    "SegmentFile",
    "decode_checked",
    "list_segments",
    "read_entries",
    "walk_headers",
]

Buffer = memoryview | bytes | bytearray

_LAYOUT_RETRIES = 100  # listings of a directory whose layout keeps changing meanwhile


def walk_headers(
    buf: Buffer, pos: int, end: int, path: str | None = None
) -> Iterator[tuple[int, BatchHeader]]:
    """``(position, header)`` of each batch from ``pos`` to ``end`` of ``buf`` (bounds-checked, CRC not
    checked). A header that fails its checks raises :class:`CorruptRecordError` (or
    :class:`UnsupportedFormatError`) and ends the walk: the lengths after it cannot be trusted. With ``path``,
    the error names that file and the position."""
    while pos < end:
        try:
            h = decode_header(buf, pos, end)
        except CorruptRecordError as exc:
            if path is None:
                raise
            raise CorruptRecordError(
                f"corrupt batch in {path} at position {pos}: {exc}", path=path, position=pos
            ) from exc
        except UnsupportedFormatError as exc:
            if path is None:
                raise
            raise UnsupportedFormatError(f"{path}: {exc}") from exc
        yield pos, h
        pos += h.batch_length


def list_segments(directory: str, up_to: int | None = None) -> list[int]:
    """Base offsets of the live segments of a partition directory (``.log`` files without a temporary
    suffix), sorted; only those at or below ``up_to`` when given (the published active segment: a later file
    is a roll that has not been published yet)."""
    return files.live_segment_bases(os.listdir(directory), up_to)


def read_entries(path: str, dtype: np.dtype[Any]) -> tuple[np.ndarray[Any, Any], bool]:
    """The whole entries of an index file and whether its size is a whole number of entries."""
    with open(path, "rb") as f:
        raw = f.read()
    whole = len(raw) - len(raw) % dtype.itemsize
    return np.frombuffer(raw[:whole], dtype=dtype), whole == len(raw)


def decode_checked(seg: SegmentFile, buf: Buffer, pos: int) -> DecodedBatch:
    """Decode (and CRC-check) the batch at ``pos`` of ``seg``; a failure names the file and position."""
    try:
        return decode_batch(buf, pos)
    except CorruptRecordError as exc:
        try:
            where = f" (batch base offset {decode_header(buf, pos, seg.size).base_offset})"
        except CorruptRecordError:
            where = ""
        raise CorruptRecordError(
            f"corrupt batch in {seg.path} at position {pos}{where}: {exc}", path=seg.path, position=pos
        ) from exc


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """One segment as published: ``size`` valid bytes, offsets in ``[base_offset, next_offset)``."""

    path: str
    base_offset: int
    next_offset: int
    size: int
    sealed: bool

    def sibling(self, suffix: str) -> str:
        """The path of this segment's file with ``suffix`` (``files.INDEX``, ``files.TIMEINDEX``)."""
        return files.segment_path(os.path.dirname(self.path), self.base_offset, suffix)

    def max_timestamp_hint(self) -> int | None:
        """The segment's largest timestamp from its ``.timeindex`` (sealed segments only), or None."""
        if not self.sealed:
            return None
        try:
            entries, _ = read_entries(self.sibling(files.TIMEINDEX), TIME_ENTRY)
        except (OSError, ValueError):
            return None
        return int(entries["ts"][-1]) if len(entries) else None

    def position_for(self, buf: Buffer, offset: int) -> int:
        """Byte position of the first batch whose last offset is >= ``offset`` (``size`` if none)."""
        pos = self._index_floor(buf, offset)
        for p, h in walk_headers(buf, pos, self.size, self.path):
            if h.last_offset >= offset:
                return p
        return self.size

    def checked_headers(self, buf: Buffer, offset: int, *, dense: bool) -> Iterator[tuple[int, BatchHeader]]:
        """``(position, header)`` of each batch from the indexed one at or before ``offset`` (the first byte
        when the index does not help) to the end. The base offset lies outside the CRC, so each one is checked
        as :class:`pylog.partition.segment.Segment` checks it: the indexed batch must carry its entry's offset,
        every later one must continue its predecessor (exactly when ``dense``: the topic is not compacted; at
        or after it otherwise, as cleaning leaves gaps), a dense segment's first batch must start at its base
        offset, and no batch may hold offsets at or past the segment's next offset. A damaged base offset is
        a :class:`CorruptRecordError` naming the file and the position, never a walk that ends early or
        yields a misplaced batch."""
        pos = self._index_floor(buf, offset) if self.base_offset < offset else 0
        exact = pos > 0  # _index_floor checked the indexed batch's base offset
        expected = decode_header(buf, pos, self.size).base_offset if exact else self.base_offset
        for p, h in walk_headers(buf, pos, self.size, self.path):
            if h.base_offset != expected and (exact or dense or h.base_offset < expected):
                at_least = "" if exact or dense else "at least "
                raise CorruptRecordError(
                    f"corrupt batch in {self.path} at position {p}: batch has base offset {h.base_offset}, "
                    f"expected {at_least}{expected}",
                    path=self.path,
                    position=p,
                )
            if h.last_offset >= self.next_offset:
                raise CorruptRecordError(
                    f"corrupt batch in {self.path} at position {p}: batch has base offset {h.base_offset} "
                    f"and last offset {h.last_offset}, past the segment's end offset {self.next_offset}",
                    path=self.path,
                    position=p,
                )
            yield p, h
            expected, exact = h.next_offset, False

    def _index_floor(self, buf: Buffer, offset: int) -> int:
        """A position at or before the batch holding ``offset``, from the ``.index`` hint (0 when unusable)."""
        try:
            entries, _ = read_entries(self.sibling(files.INDEX), OFFSET_ENTRY)
        except (OSError, ValueError):
            return 0
        i = int(np.searchsorted(entries["rel"], offset - self.base_offset, side="right")) - 1
        if i < 0:
            return 0
        rel, pos = int(entries["rel"][i]), int(entries["pos"][i])
        try:
            if pos < self.size and decode_header(buf, pos, self.size).base_offset == self.base_offset + rel:
                return pos
        except CorruptRecordError:
            pass
        return 0

    def view(self) -> memoryview | bytes:
        """A read-only map of the published bytes. Raises FileNotFoundError if the segment was deleted."""
        if self.size == 0:
            return b""
        with open(self.path, "rb") as f:
            m = mmap.mmap(f.fileno(), self.size, access=mmap.ACCESS_READ)
        return memoryview(m)


_BEFORE_FIRST_SEGMENT = frozenset({files.STATE})
"""What a partition directory may hold before its first segment file exists (nothing published yet)."""


class PartitionReader:
    """The published segments of the partition in ``directory`` at the time the reader was built."""

    def __init__(self, directory: str, topic: str, partition: int) -> None:
        self.directory = directory
        self.topic = topic
        self.partition = partition
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"partition directory {directory} is missing")
        self.segments = self._load()
        self._bases = [s.base_offset for s in self.segments]
        self._log_start = read_log_start(directory)

    def _load(self) -> list[SegmentFile]:
        """List the segments between two reads of the published state that agree (no layout change, no
        append in between)."""
        state_path = os.path.join(self.directory, files.STATE)
        for _ in range(_LAYOUT_RETRIES):
            before = read_published(state_path)
            segments = self._list(before)
            if read_published(state_path) == before:
                return segments
        raise CorruptRecordError(f"{self.directory}: the segment layout keeps changing while listed")

    def _list(self, state: Snapshot | None) -> list[SegmentFile]:
        bases = list_segments(self.directory, None if state is None else state.active_base_offset)
        if not bases and state is None and set(os.listdir(self.directory)) <= _BEFORE_FIRST_SEGMENT:
            # a partition nobody has used yet: pylog creates its files on first use, the state file (still
            # unpublished) before the first segment, so a reader between the two sees an empty partition
            return [SegmentFile(files.segment_path(self.directory, 0, files.LOG), 0, 0, 0, False)]
        if not bases:
            raise CorruptRecordError(f"{self.directory}: no segment files", path=self.directory)
        out: list[SegmentFile] = []
        for i, base in enumerate(bases):
            path = files.segment_path(self.directory, base, files.LOG)
            last = i == len(bases) - 1
            if last and state is not None:
                out.append(SegmentFile(path, base, state.log_end_offset, state.active_size, False))
                continue
            size = os.stat(path).st_size if os.path.exists(path) else 0
            nxt = bases[i + 1] if not last else _scan_end(path, base, size)
            out.append(SegmentFile(path, base, nxt, size, not last))
        return out

    @property
    def log_start_offset(self) -> int:
        """The first segment's base offset, or past it the log start offset ``delete_records`` set."""
        base = self.segments[0].base_offset
        return base if self._log_start <= base else min(self._log_start, self.log_end_offset)

    @property
    def log_end_offset(self) -> int:
        return self.segments[-1].next_offset

    @property
    def bytes_per_offset(self) -> float:
        """Segment bytes per offset, on average: what planning uses to estimate the size of a range."""
        span = self.log_end_offset - self.log_start_offset
        return sum(s.size for s in self.segments) / span if span > 0 else 0.0

    def offset_for_time(self, timestamp: int) -> int | None:
        """The earliest offset whose timestamp is >= ``timestamp``, or None."""
        for seg in self.segments:
            hint = seg.max_timestamp_hint()
            if seg.size == 0 or (hint is not None and hint < timestamp):
                continue
            buf = seg.view()
            for pos, h in walk_headers(buf, 0, seg.size, seg.path):
                if h.max_timestamp >= timestamp:
                    b = decode_checked(seg, buf, pos)
                    return int(b.offsets[int(np.argmax(b.timestamps >= timestamp))])
        return None

    def segments_for(self, start: int, end: int) -> list[SegmentFile]:
        """Segments holding offsets in ``[start, end)``."""
        i = max(bisect.bisect_right(self._bases, start) - 1, 0)
        return [s for s in self.segments[i:] if s.base_offset < end and s.next_offset > start and s.size]


def _scan_end(path: str, base: int, size: int) -> int:
    """The next offset of a segment whose end is not published (a log never opened by a writer)."""
    nxt = base
    if size:
        with open(path, "rb") as f:
            buf = f.read()
        for _, h in walk_headers(buf, 0, size, path):
            nxt = h.next_offset
    return nxt
