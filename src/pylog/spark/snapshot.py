"""A read-only view of a log directory, for Spark readers.

Readers on Spark executors never open the log with :func:`pylog.open`: that takes locks, may run recovery and
writes marker files. Instead they read what writers publish, the same way a :class:`~pylog.Log` in another
process does, but without creating or changing any file:

- the manifest (topics and partition counts), checked by its CRC;
- per partition, the published state (``partition.state``: active segment and its published size) read with
  the seqlock protocol, and the segment files listed in the directory;
- the ``.index`` file of a segment, only as a hint for where to start walking batch headers.

A :class:`PartitionView` is a snapshot: records appended after it was taken are not visible through it, and a
segment deleted by retention after it was taken is still readable if it was already mapped.

Thread-safety: a view is immutable once built; build one per thread or task.
"""

from __future__ import annotations

import bisect
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from pylog.errors import CorruptRecordError, UnknownPartitionError, UnknownTopicError, UnsupportedFormatError
from pylog.log import _decode_manifest
from pylog.partition import files
from pylog.partition.index import OFFSET_ENTRY, TIME_ENTRY
from pylog.record import BatchHeader, DecodedBatch, decode_batch, decode_header

__all__ = ["LogView", "PartitionView", "SegmentView", "check_log_dir"]

_STATE_MAGIC = int.from_bytes(b"PLPSTAT1", "little")
_STATE = struct.Struct("<qq5q")  # magic, seq, log_end_offset, active_base, active_size, epoch, max_ts


def check_log_dir(path: str) -> str:
    """The absolute path of an existing pylog directory; raises FileNotFoundError with a readable message."""
    if not path:
        raise FileNotFoundError("no log directory given: use .load(path) or .option('path', ...)")
    full = os.path.abspath(path)
    if not os.path.isdir(full):
        raise FileNotFoundError(f"pylog directory {full} does not exist (or is not visible on this machine)")
    if not os.path.exists(os.path.join(full, "manifest")):
        raise FileNotFoundError(f"{full} is not a pylog directory: it has no manifest")
    return full


class LogView:
    """Topics and partition counts of a log directory, from its manifest."""

    def __init__(self, path: str) -> None:
        self.path = check_log_dir(path)
        manifest_path = os.path.join(self.path, "manifest")
        with open(manifest_path, "rb") as f:
            manifest = _decode_manifest(f.read(), manifest_path)
        self.partition_counts: dict[str, int] = {
            name: int(meta["partitions"]) for name, meta in sorted(manifest["topics"].items())
        }

    def topics(self) -> list[str]:
        return list(self.partition_counts)

    def num_partitions(self, topic: str) -> int:
        try:
            return self.partition_counts[topic]
        except KeyError:
            raise UnknownTopicError(
                f"unknown topic {topic!r} in {self.path} (topics: {', '.join(self.topics()) or 'none'})"
            ) from None

    def partition(self, topic: str, partition: int) -> PartitionView:
        count = self.num_partitions(topic)
        if not 0 <= partition < count:
            raise UnknownPartitionError(
                f"partition {partition} does not exist in topic {topic!r} (partitions 0..{count - 1})"
            )
        return PartitionView(files.partition_dir(self.path, topic, partition), topic, partition)


@dataclass(frozen=True, slots=True)
class SegmentView:
    """One segment as published: ``size`` valid bytes, offsets in ``[base_offset, next_offset)``."""

    path: str
    base_offset: int
    next_offset: int
    size: int
    sealed: bool

    def max_timestamp_hint(self) -> int | None:
        """The segment's largest timestamp from its ``.timeindex`` (sealed segments only), or None."""
        if not self.sealed:
            return None
        try:
            raw = np.fromfile(self.path[: -len(files.LOG)] + files.TIMEINDEX, dtype=TIME_ENTRY)
        except (OSError, ValueError):
            return None
        return int(raw["ts"][-1]) if len(raw) else None

    def position_for(self, buf: memoryview | bytes, offset: int) -> int:
        """Byte position of the first batch whose last offset is >= ``offset`` (``size`` if none)."""
        pos = self._index_floor(buf, offset)
        for p, h in walk(buf, pos, self.size, self.path):
            if h.last_offset >= offset:
                return p
        return self.size

    def _index_floor(self, buf: memoryview | bytes, offset: int) -> int:
        """A position at or before the batch holding ``offset``, from the ``.index`` hint (0 when unusable)."""
        try:
            entries = np.fromfile(self.path[: -len(files.LOG)] + files.INDEX, dtype=OFFSET_ENTRY)
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


def walk(buf: memoryview | bytes, pos: int, end: int, path: str) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each batch from ``pos`` to ``end`` of segment file ``path`` (bounds-checked, CRC
    not checked); a header that fails its checks raises the same error naming the file."""
    while pos < end:
        try:
            h = decode_header(buf, pos, end)
        except CorruptRecordError as exc:
            raise CorruptRecordError(
                f"corrupt batch in {path} at position {pos}: {exc}", path=path, position=pos
            ) from exc
        except UnsupportedFormatError as exc:
            raise UnsupportedFormatError(f"{path}: {exc}") from exc
        yield pos, h
        pos += h.batch_length


def _read_state(path: str) -> tuple[int, int, int, int] | None:
    """(log_end_offset, active_base_offset, active_size, layout_epoch), or None if never initialized."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        for _ in range(10_000):
            raw = os.pread(fd, _STATE.size, 0)
            if len(raw) < _STATE.size:
                return None
            magic, seq, end, base, size, epoch, _ = _STATE.unpack(raw)
            if magic != _STATE_MAGIC:
                return None
            if seq & 1:
                continue
            if struct.unpack("<q", os.pread(fd, 8, 8))[0] == seq:
                return end, base, size, epoch
    finally:
        os.close(fd)
    raise CorruptRecordError(f"{path}: a writer stays in the middle of publishing", path=path)


class PartitionView:
    """The published segments of one partition at the time the view was built."""

    def __init__(self, directory: str, topic: str, partition: int) -> None:
        self.directory = directory
        self.topic = topic
        self.partition = partition
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"partition directory {directory} is missing")
        self.segments = self._load()
        self._bases = [s.base_offset for s in self.segments]

    def _load(self) -> list[SegmentView]:
        state_path = os.path.join(self.directory, files.STATE)
        for _ in range(100):
            before = _read_state(state_path)
            segments = self._list(before)
            if _read_state(state_path) == before:
                return segments
        raise CorruptRecordError(f"{self.directory}: the segment layout keeps changing while listed")

    def _list(self, state: tuple[int, int, int, int] | None) -> list[SegmentView]:
        bases = sorted(
            p[0]
            for p in map(files.parse_segment_name, os.listdir(self.directory))
            if p and p[1] == files.LOG and not p[2] and (state is None or p[0] <= state[1])
        )
        if not bases and state is None and not os.listdir(self.directory):
            # a partition nobody has used yet: pylog creates its files on first use
            return [SegmentView(files.segment_path(self.directory, 0, files.LOG), 0, 0, 0, False)]
        if not bases:
            raise CorruptRecordError(f"{self.directory}: no segment files", path=self.directory)
        out: list[SegmentView] = []
        for i, base in enumerate(bases):
            path = files.segment_path(self.directory, base, files.LOG)
            last = i == len(bases) - 1
            if last and state is not None:
                out.append(SegmentView(path, base, state[0], state[2], False))
                continue
            size = os.stat(path).st_size if os.path.exists(path) else 0
            nxt = bases[i + 1] if not last else self._scan_end(path, base, size)
            out.append(SegmentView(path, base, nxt, size, not last))
        return out

    @staticmethod
    def _scan_end(path: str, base: int, size: int) -> int:
        """The next offset of a segment whose end is not published (a log never opened by a writer)."""
        nxt = base
        if size:
            with open(path, "rb") as f:
                buf = f.read()
            for _, h in walk(buf, 0, size, path):
                nxt = h.next_offset
        return nxt

    @property
    def log_start_offset(self) -> int:
        return self.segments[0].base_offset

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
            for pos, h in walk(buf, 0, seg.size, seg.path):
                if h.max_timestamp >= timestamp:
                    b = decode_checked(seg, buf, pos)
                    return int(b.offsets[int(np.argmax(b.timestamps >= timestamp))])
        return None

    def segments_for(self, start: int, end: int) -> list[SegmentView]:
        """Segments holding offsets in ``[start, end)``."""
        i = max(bisect.bisect_right(self._bases, start) - 1, 0)
        return [s for s in self.segments[i:] if s.base_offset < end and s.next_offset > start and s.size]


def decode_checked(seg: SegmentView, buf: memoryview | bytes, pos: int) -> DecodedBatch:
    """Decode (and CRC-check) the batch at ``pos``; a failure names the file and position."""
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
