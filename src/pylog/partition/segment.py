"""One segment: a ``.log`` file of record batches with its ``.index`` and ``.timeindex``.

Thread-safety: not thread-safe; :class:`~pylog.partition.log.PartitionLog` serializes writers and gives readers
immutable snapshots (a segment's published ``size`` only grows while it is active).

Crash contract:
- batches are written with ``pwrite`` at the published size and become visible only when the partition
  publishes the new size; bytes past the published size are garbage to every reader and are overwritten or
  truncated by the next writer or by recovery;
- the file is never shrunk below its published size while other readers may map it (that raises SIGBUS);
  truncation of published data writes a shortened copy and renames it over the original (readers keep the old
  inode);
- the indexes are hints: they are rebuilt from the log when they fail their sanity checks. Their entries are
  written in groups (and at every flush, roll and close), always *after* the batches they describe were
  published, so the files may lag the log by a few entries but never hold an entry of a batch that is not in
  the log: a writer killed before publishing leaves garbage only past the published size of the ``.log``,
  which the next writer overwrites. The final time entry of a roll is written once the next segment is
  published. Entries of batches below the recovery point were fsynced with them. After an unclean shutdown the active segment is
  validated from its last indexed batch below the recovery point (time proportional to the unflushed tail), a
  segment holding the point without usable entries from its start.

Reads go through a read-only ``mmap`` of the file (opened lazily, bounded by :class:`MapCache`), so a
``np.frombuffer`` over a batch is zero-copy.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pylog import fs
from pylog.errors import CorruptIndexError, CorruptRecordError, DiskFullError, UnsupportedFormatError
from pylog.partition import files
from pylog.partition.index import (
    OFFSET_ENTRY,
    TIME_ENTRY,
    SparseIndex,
    check_offset_index,
    check_time_index,
    durable_prefix,
)
from pylog.partition.reader import walk_headers
from pylog.record import (
    BATCH_LENGTH_AT,
    CRC_AT,
    CRC_START,
    HEADER_SIZE,
    BatchHeader,
    check_crc,
    crc32c,
    decode_header,
)

__all__ = ["MapCache", "ScanResult", "Segment", "inode_of"]

_EMPTY = b""
_I32, _U32 = struct.Struct("<i"), struct.Struct("<I")


# Index entries are written to their files this many at a time (and at every flush, roll and close): a
# sparse index cut at any entry is valid, so lagging entries only lengthen the scan that finds the end of
# the segment when it is opened (at most this many index intervals).
_INDEX_WRITE_ENTRIES = 32
_MAX_REL = 0xFFFFFFFF  # the largest offset relative to the segment's base that its index can hold


class MapCache:
    """Bounds how many segment files are memory-mapped at once (each map holds a file descriptor).

    Evicting a map only drops pylog's reference: views handed to callers (for example zero-copy Arrow buffers)
    keep the mapping alive until they are released, so eviction can never invalidate data a caller holds.
    Thread-safe.
    """

    def __init__(self, max_maps: int = 256) -> None:
        self.max_maps = max_maps
        self._lru: OrderedDict[int, Segment] = OrderedDict()
        self._lock = threading.Lock()

    def touch(self, segment: Segment) -> None:
        with self._lock:
            key = id(segment)
            self._lru[key] = segment
            self._lru.move_to_end(key)
            while len(self._lru) > self.max_maps:
                _, old = self._lru.popitem(last=False)
                old.drop_map()

    def forget(self, segment: Segment) -> None:
        with self._lock:
            self._lru.pop(id(segment), None)

    def __len__(self) -> int:
        return len(self._lru)


@dataclass
class ScanResult:
    """What a validating scan found: where valid data ends and what it holds."""

    end: int
    next_offset: int
    max_timestamp: int
    first_timestamp: int
    batches: int
    error: CorruptRecordError | None = None


class Segment:
    """A segment file set. ``size`` is the published (valid) byte size of the ``.log`` file."""

    def __init__(self, directory: str, base_offset: int, cache: MapCache, *, dense: bool = False) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.dense = dense  # offsets follow each other without gaps (not compacted): checked exactly
        self.path = files.segment_path(directory, base_offset, files.LOG)
        self.index_path = files.segment_path(directory, base_offset, files.INDEX)
        self.timeindex_path = files.segment_path(directory, base_offset, files.TIMEINDEX)
        self.ino = inode_of(self.path)  # which file this object describes: compaction may replace it
        self.size = 0
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.first_timestamp = -1
        self.offset_index = SparseIndex(OFFSET_ENTRY)
        self.time_index = SparseIndex(TIME_ENTRY)
        self.last_indexed_position = -1
        self.fd: int | None = None
        # appends and index entries made, and how many of each the last completed fsync covers: counters
        # rather than flags, so an append racing a flush is never marked durable by it
        self._appends = 0
        self._appends_synced = 0
        self._index_changes = 0
        self._index_synced = 0
        self._map: mmap.mmap | None = None
        self._map_size = 0
        self._read_fd: int | None = None
        self._cache = cache

    def __repr__(self) -> str:
        return f"Segment(base={self.base_offset}, size={self.size}, next={self.next_offset})"

    @property
    def unflushed(self) -> bool:
        """True when this object appended bytes that no completed :meth:`flush` covers."""
        return self._appends != self._appends_synced

    # -- files -------------------------------------------------------------------------------------------

    def open_fd(self) -> int:
        if self.fd is None:
            self.fd = fs.FS.open(self.path, os.O_RDWR | os.O_CREAT)
        return self.fd

    def close_fd(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            fs.FS.close(fd)

    def file_size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except FileNotFoundError:
            return 0

    # -- reading -----------------------------------------------------------------------------------------

    def view(self, end: int | None = None) -> memoryview | bytes:
        """A read-only view of the file's first ``end`` bytes (default: the published size)."""
        want = self.size if end is None else end
        if want <= 0:
            return _EMPTY
        if self._map is None or self._map_size < want:
            self.drop_map()
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), want, access=mmap.ACCESS_READ)
            self._map_size = want
        self._cache.touch(self)
        return memoryview(self._map)[:want]

    def drop_map(self) -> None:
        self._map = None
        self._map_size = 0
        if self._read_fd is not None:
            fd, self._read_fd = self._read_fd, None
            fs.FS.close(fd)

    def read_range(self, start: int, length: int, *, active: bool) -> tuple[memoryview | bytes, int]:
        """Bytes ``[start, start + length)`` (clamped to the published size) as ``(buffer, position of start in
        buffer)``. A mapped range is a zero-copy view; the growing tail of the active segment is read with
        ``pread`` instead of remapping the file on every append."""
        end = min(self.size, start + length)
        if end <= start:
            return _EMPTY, 0
        if self._map is not None and self._map_size >= end:
            self._cache.touch(self)
            return memoryview(self._map)[:end], start
        if not active:
            return self.view(), start
        if self._read_fd is None:
            self._read_fd = fs.FS.open(self.path, os.O_RDONLY)
            self._cache.touch(self)
        return fs.FS.pread(self._read_fd, end - start, start), 0

    def headers(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of each batch from ``start`` up to ``end``, bounds-checked, CRC not checked."""
        limit = self.size if end is None else end
        return walk_headers(self.view(limit), start, limit)

    def position_for(self, offset: int) -> int:
        """Byte position of the first batch whose last offset is >= ``offset`` (``size`` if none)."""
        for pos, h in self._walk_from(offset - self.base_offset):
            if h.last_offset >= offset:
                return pos
        return self.size

    def position_for_time(self, timestamp: int) -> int:
        """Byte position of the first batch whose max timestamp is >= ``timestamp`` (``size`` if none).

        A time-index entry ``(ts, rel)`` says that no batch up to the one at ``rel`` holds a timestamp above
        ``ts``. The index is not checksummed: when the batch the walk starts at holds a larger one, the entry
        is damaged, and the walk starts again at the segment's first batch (a slower answer, not a wrong
        one)."""
        floor = self.time_index.time_floor_entry(timestamp)
        for n, (pos, h) in enumerate(self._walk_from(0 if floor is None else floor[1])):
            if n == 0 and floor is not None and h.max_timestamp > floor[0]:
                return next((p for p, g in self._walk_from(0) if g.max_timestamp >= timestamp), self.size)
            if h.max_timestamp >= timestamp:
                return pos
        return self.size

    def _walk_from(self, rel_offset: int) -> Iterator[tuple[int, BatchHeader]]:
        """Headers from the indexed batch at or before ``rel_offset`` on. The base offset is outside the CRC, so
        each one is checked: the indexed batch must carry its entry's offset, and every later one must continue
        its predecessor (exactly in a dense segment). A damaged offset is a CorruptRecordError, never a wrong
        batch."""
        rel, start = self.offset_index.floor_entry(rel_offset)
        # a compacted segment's first batch may start after its base offset (its first records were cleaned)
        expected, exact = self.base_offset + rel, self.dense or start > 0
        for pos, h in self.headers(start):
            if h.base_offset != expected and (exact or self.dense or h.base_offset < expected):
                raise CorruptRecordError(
                    f"batch at position {pos} has base offset {h.base_offset}, expected {expected}",
                    path=self.path,
                    position=pos,
                )
            yield pos, h
            expected, exact = h.next_offset, False

    # -- writing -----------------------------------------------------------------------------------------

    def append(
        self,
        batch: bytes | bytearray,
        header: BatchHeader,
        index_interval: int,
        rest: memoryview | None = None,
    ) -> None:
        """Write ``batch`` (followed by ``rest``, when the batch comes in two parts) at the published size and
        index it in memory. The caller publishes the new size, then calls :meth:`write_due_index_entries`.

        All or nothing: when writing the batch fails, the in-memory state (end offset, timestamps, index
        entries) is as it was before the error propagates, so the next append reuses the same offsets and
        position; the index files are not touched before the batch is published."""
        fd = self.open_fd()
        position = self.size
        try:
            fs.FS.pwrite(fd, batch, position)
            if rest is not None:
                fs.FS.pwrite(fd, rest, position + len(batch))
        except OSError:
            # bytes past the published size are garbage; trim them now so the file stays tidy.
            try:
                fs.FS.ftruncate(fd, position)
            except OSError:
                pass  # overwritten by the next append, or truncated by recovery
            raise
        self._account(position, header, index_interval)
        self.size = position + header.batch_length
        self._appends += 1

    def _account(self, position: int, h: BatchHeader, index_interval: int) -> None:
        """Update offsets, timestamps and the sparse indexes for a batch at ``position``."""
        self.next_offset = h.next_offset
        if self.first_timestamp < 0:
            self.first_timestamp = h.max_timestamp
        rel = h.base_offset - self.base_offset
        if h.max_timestamp > self.max_timestamp:
            self.max_timestamp = h.max_timestamp
        gap = position - self.last_indexed_position
        if self.last_indexed_position < 0 or (gap > 0 and gap >= index_interval):
            self.offset_index.append(rel, position)
            self.last_indexed_position = position
            self._index_changes += 1
            last = self.time_index.last()
            if (
                last is None or last[0] < self.max_timestamp
            ):  # the largest timestamp grew since the last entry
                self.time_index.append(self.max_timestamp, rel)

    def write_due_index_entries(self) -> None:
        """After a publish: write the pending index entries once a group of them is due. A failed write
        leaves them pending (the batch is in the log; the next write, flush, roll or close retries)."""
        if len(self.offset_index) - self.offset_index.written >= _INDEX_WRITE_ENTRIES:
            try:
                self.write_index_entries()
            except OSError:
                pass

    def write_index_entries(self) -> bool:
        """Write the entries not yet in the files: the time index first, so a process killed in between
        leaves a time entry past the last offset entry (which fails the checks: rebuilt) rather than an
        offset entry whose time entry is missing (which would pass them with a wrong largest timestamp).
        A failed write is retried whole from the same place (entries are fixed-size, at fixed positions).

        On a full disk the entries stay pending and False is returned: both files are cut back to what
        they held (a consistent prefix; a later flush, roll or close writes the rest). A file shorter than
        the entries this object wrote (another process cut it on a full disk) is continued where it ends,
        never past a hole. Any other error raises."""
        before = ((self.time_index, self.time_index.written), (self.offset_index, self.offset_index.written))
        for index, path in ((self.time_index, self.timeindex_path), (self.offset_index, self.index_path)):
            n = len(index)
            if index.written == n:
                continue
            try:
                fd = fs.FS.open(path, os.O_WRONLY | os.O_CREAT)
                try:
                    index.written = min(index.written, fs.FS.size(fd) // index.dtype.itemsize)
                    fs.FS.pwrite(fd, index.pending_bytes(), index.written * index.dtype.itemsize)
                finally:
                    fs.FS.close(fd)
            except DiskFullError:
                for idx, written in before:
                    idx.written = min(written, idx.written)
                    where = self.timeindex_path if idx is self.time_index else self.index_path
                    _cut_file(where, idx.written * idx.dtype.itemsize)
                return False
            index.written = n
        return True

    @property
    def index_pending(self) -> bool:
        """True when index entries are not in the files yet (written lazily, or held back by a full disk)."""
        return self.offset_index.written < len(self.offset_index) or self.time_index.written < len(
            self.time_index
        )

    def seal(self) -> None:
        """Once the next segment is published: add the final time-index entry (the segment's largest
        timestamp) and write it. Not fsynced: a sealed segment's index without it is a valid prefix."""
        self.add_final_time_entry()
        self.write_index_entries()

    def add_final_time_entry(self) -> None:
        """In memory only: the time-index entry a roll adds for the segment's largest timestamp."""
        last = self.time_index.last()
        if self.max_timestamp >= 0 and (last is None or last[0] < self.max_timestamp):
            rel = self.offset_index.last()
            self.time_index.append(self.max_timestamp, rel[0] if rel else 0)
            self._index_changes += 1

    @property
    def index_changes(self) -> int:
        """How many index entries appends have added (a counter: compare with :attr:`index_synced`)."""
        return self._index_changes

    @property
    def index_synced(self) -> int:
        """The value :attr:`index_changes` had when both index files were last fsynced."""
        return self._index_synced

    def flush(self, *, write_index: bool = True, sync_index: bool = True) -> None:
        """fsync the log, and both indexes when they gained entries since their last fsync (a failed fsync
        raises; nothing is marked flushed). Covers every append made before it was called. A caller that
        fsyncs outside the partition lock writes the pending index entries itself under the lock first
        (``write_index=False``): entries are added by appends, and must not be written concurrently.
        ``sync_index=False`` fsyncs the log only (the records are durable; the recovery point must then stay
        below what the unsynced entries index: see :meth:`PartitionLog.flush`). Index entries a full disk
        holds back do not fail the flush: the records are fsynced, the entries stay pending."""
        appends, index_changes = self._appends, self._index_changes
        if write_index:
            self.write_index_entries()
        fd = self.open_fd()
        fs.FS.fsync(fd)
        # entries a full disk held back are not in the files: the recovery point must not count them synced
        if sync_index and index_changes != self._index_synced and not self.index_pending:
            for path in (self.index_path, self.timeindex_path):
                if os.path.exists(path):
                    ifd = fs.FS.open(path, os.O_RDONLY)
                    try:
                        fs.FS.fsync(ifd)
                    finally:
                        fs.FS.close(ifd)
            self._index_synced = max(self._index_synced, index_changes)
        self._appends_synced = max(self._appends_synced, appends)

    # -- loading, validation, index rebuild ---------------------------------------------------------------

    def scan(
        self,
        start: int,
        end: int,
        *,
        verify: bool,
        index_interval: int = 4096,
        after_offset: int = -1,
        fresh: bool | None = None,
    ) -> ScanResult:
        """Walk batches from ``start`` to ``end``; with ``verify`` check CRCs too. Stops at the first invalid
        batch (``error`` set) and re-accounts every valid batch into fresh indexes when ``fresh`` (default:
        when ``start`` is 0)."""
        if start == 0 if fresh is None else fresh:
            self.offset_index = SparseIndex(OFFSET_ENTRY)
            self.time_index = SparseIndex(TIME_ENTRY)
            self.last_indexed_position = -1
            self.max_timestamp = -1
            self.first_timestamp = -1
            self.next_offset = self.base_offset
        if start == 0:
            buf: memoryview | bytes = self.view(end)
            shift = 0
        else:  # a tail: read just that range instead of remapping a growing file
            buf, at = self.read_range(start, end - start, active=True)
            shift = at - start
        pos, batches, expected = start, 0, max(after_offset, self.next_offset)
        error: CorruptRecordError | None = None
        while pos < end:
            try:
                try:
                    h = decode_header(buf, pos + shift, end + shift)
                except UnsupportedFormatError as exc:
                    raise _unless_intact(buf, pos + shift, end + shift, exc, pos) from exc
                if verify:
                    check_crc(buf, pos + shift, h)
                if (
                    h.base_offset < expected
                    or (self.dense and h.base_offset != expected)
                    or h.last_offset_delta > 0x7FFFFFFF
                    or h.base_offset - self.base_offset > _MAX_REL  # beyond what its index can name
                ):
                    raise CorruptRecordError(
                        f"offsets not {'contiguous' if self.dense else 'increasing'} at position {pos}: "
                        f"base {h.base_offset}, expected {expected}",
                        position=pos,
                    )
            except CorruptRecordError as exc:
                exc.path = self.path
                error = exc
                break
            self._account(pos, h, index_interval)
            expected = h.next_offset
            pos += h.batch_length
            batches += 1
        return ScanResult(pos, self.next_offset, self.max_timestamp, self.first_timestamp, batches, error)

    def load_indexes(self, max_rel: int) -> bool:
        """Load the index files and sanity-check them against the published size; False if they need a
        rebuild (missing, wrong size, out of order, pointing outside the segment, or not matching the log)."""
        try:
            oraw = _read_or_empty(self.index_path)
            traw = _read_or_empty(self.timeindex_path)
            oe = check_offset_index(oraw, max(self.size, 1), max_rel, self.index_path)
            # every time entry names an indexed batch, so none lies beyond the last offset entry
            te = check_time_index(traw, int(oe["rel"][-1]) if len(oe) else 0, self.timeindex_path)
            if self.size and not (len(oe) and len(te)):
                raise CorruptIndexError("index is empty for a non-empty segment")
            if len(oe):
                h = decode_header(self.view(), int(oe["pos"][-1]))
                if h.base_offset != self.base_offset + int(oe["rel"][-1]):
                    raise CorruptIndexError("last index entry does not match the log")
        except CorruptRecordError:
            return False
        self.offset_index = SparseIndex(OFFSET_ENTRY, oe)
        self.time_index = SparseIndex(TIME_ENTRY, te)
        self.last_indexed_position = int(oe["pos"][-1]) if len(oe) else -1
        return True

    def load_trusted(self, size: int, index_interval: int) -> ScanResult | None:
        """Open a segment whose contents are trusted (below the recovery point, or after a clean shutdown):
        load its indexes and scan only from the last indexed batch to ``size``. Cost is independent of the
        segment's length. Returns None when the indexes fail their checks (the caller rebuilds them)."""
        self.size = size
        if size == 0:
            return ScanResult(0, self.base_offset, -1, -1, 0)
        if not self.load_indexes(0xFFFFFFFF):
            return None
        last_ts = self.time_index.last()
        self.max_timestamp = last_ts[0] if last_ts else -1
        try:
            self.first_timestamp = decode_header(self.view(), 0).max_timestamp
        except CorruptRecordError:
            return None  # the caller revalidates the segment
        last = self.offset_index.last()
        return self._scan_from_entry(last or (0, 0), size, index_interval, verify=False)

    def _scan_from_entry(
        self, entry: tuple[int, int], size: int, index_interval: int, *, verify: bool
    ) -> ScanResult:
        """Scan from the indexed batch ``entry`` (relative offset, position) to ``size`` on top of the loaded
        indexes and largest timestamp: the batches before it are trusted."""
        rel, start = entry
        self.next_offset = self.base_offset + rel
        self.last_indexed_position = start
        return self.scan(
            start,
            size,
            verify=verify,
            index_interval=index_interval,
            after_offset=self.next_offset,
            fresh=False,
        )

    def load_from_point(self, size: int, point: int, index_interval: int) -> ScanResult | None:
        """Recovery of the active segment after an unclean shutdown, in time proportional to its tail: trust
        the batches below the recovery ``point`` (fsynced, as were their index entries) and validate (CRC)
        only from the last indexed batch at or below it to ``size``.

        Returns None when there is nothing to start from (no usable index entry, or the indexed batch fails
        its checks): the caller then validates the whole segment. A result with ``error`` set names the first
        invalid batch after the start (a torn tail), as a full scan would."""
        self.size = size
        if size == 0 or point <= self.base_offset:
            return None
        try:
            oraw, traw = _read_or_empty(self.index_path), _read_or_empty(self.timeindex_path)
        except CorruptRecordError:
            return None  # missing: rebuilt by the full scan
        oe, te = durable_prefix(oraw, traw, size, point - self.base_offset - 1)  # batches below the point
        if len(oe) * OFFSET_ENTRY.itemsize == len(oraw):
            # Never start at the file's last offset entry: a roll killed after sealing this segment (and before
            # the next one existed) left the seal's final time entry at that entry's offset, with the largest
            # timestamp of the whole segment. Entries before the last one are never followed by it.
            oe = oe[:-1]
            te = te[te["rel"] <= (int(oe["rel"][-1]) if len(oe) else -1)]
        if not len(oe) or not len(te):
            return None
        rel, start = int(oe["rel"][-1]), int(oe["pos"][-1])
        try:
            view = self.view()
            self.first_timestamp = decode_header(view, 0).max_timestamp
            h = decode_header(view, start)
            check_crc(view, start, h)
        except CorruptRecordError:
            return None
        if h.base_offset != self.base_offset + rel:
            return None
        self.offset_index = SparseIndex(OFFSET_ENTRY, oe)
        self.time_index = SparseIndex(TIME_ENTRY, te)
        self.max_timestamp = int(te["ts"][-1])
        return self._scan_from_entry((rel, start), size, index_interval, verify=True)

    def rewrite_indexes(self) -> None:
        """Replace both index files with the in-memory entries (two-phase: temp, fsync, rename, fsync dir).

        On a full disk (:class:`~pylog.errors.DiskFullError`) the rewrite is deferred instead of failing: each
        file is cut (which needs no space) to the longest prefix it shares with the entries, and the entries
        past it stay pending, written by :meth:`write_index_entries` at the next flush, roll or close that
        finds room. A sparse index cut at any entry is valid, so a partition can be recovered, read and
        cleaned up (retention, topic deletion) on a disk with no free block."""
        try:
            fs.atomic_write(self.index_path, self.offset_index.entries.tobytes())
            self.offset_index.written = len(self.offset_index)
            fs.atomic_write(self.timeindex_path, self.time_index.entries.tobytes())
            self.time_index.written = len(self.time_index)
        except DiskFullError:
            self._defer_index_rewrite()

    def _defer_index_rewrite(self) -> None:
        """Cut both index files to a consistent prefix of the in-memory entries (see :meth:`rewrite_indexes`).

        Consistent: the time file must not lag the offset file (a loaded index takes its last time entry as
        the largest timestamp up to its last offset entry), so offset entries at or after the first time
        entry missing from the file are cut too, and time entries past the last offset entry kept."""
        for path in (self.index_path, self.timeindex_path):
            try:
                fs.FS.unlink(path + files.TMP)  # the failed rewrite's temp file holds space
            except FileNotFoundError:
                pass
        oe, te = self.offset_index.entries, self.time_index.entries
        k_o = _shared_prefix(self.index_path, oe)
        k_t = _shared_prefix(self.timeindex_path, te)
        if k_t < len(te):
            k_o = min(k_o, int(np.searchsorted(oe["rel"], te["rel"][k_t], side="left")))
        last_rel = int(oe["rel"][k_o - 1]) if k_o else -1
        k_t = min(k_t, int(np.searchsorted(te["rel"], last_rel, side="right")))
        for path, index, keep in (
            (self.index_path, self.offset_index, k_o),
            (self.timeindex_path, self.time_index, k_t),
        ):
            _cut_file(path, keep * index.dtype.itemsize)
            index.written = keep

    def tail_from_index(self) -> int:
        """Position of the last indexed batch (a safe place to start scanning for the end), or 0."""
        last = self.offset_index.last()
        return last[1] if last else 0

    def delete_files(self) -> None:
        """Remove the segment: rename the log to ``.deleted`` first (the segment disappears atomically), then
        unlink everything. Readers that still map the file keep reading the old inode safely."""
        self.close_fd()
        self.drop_map()
        self._cache.forget(self)
        deleted = self.path + files.DELETED
        try:
            fs.FS.rename(self.path, deleted)
        except FileNotFoundError:
            deleted = ""
        for path in (self.index_path, self.timeindex_path, deleted):
            if path:
                try:
                    fs.FS.unlink(path)
                except FileNotFoundError:
                    pass


def _unless_intact(
    buf: memoryview | bytes, at: int, limit: int, exc: UnsupportedFormatError, pos: int
) -> CorruptRecordError:
    """A batch claiming a newer format version is real only if it is intact: it fits before ``limit`` and its
    CRC (which covers the version byte) matches. Then ``exc`` is re-raised; otherwise the bytes are a torn or
    garbage write and are reported as corruption, like any other invalid batch."""
    length = _I32.unpack_from(buf, at + BATCH_LENGTH_AT)[0]
    crc = _U32.unpack_from(buf, at + CRC_AT)[0]
    fits = HEADER_SIZE <= length <= limit - at
    if fits and crc32c(memoryview(buf)[at + CRC_START : at + length]) == crc:
        raise exc
    return CorruptRecordError(f"invalid batch at position {pos}: {exc}", position=pos)


def _shared_prefix(path: str, entries: npt.NDArray[Any]) -> int:
    """How many leading entries of the file at ``path`` equal ``entries`` (0 when it is missing)."""
    try:
        raw = fs.FS.read_file(path)
    except FileNotFoundError:
        return 0
    on_disk = np.frombuffer(raw[: len(raw) - len(raw) % entries.dtype.itemsize], dtype=entries.dtype)
    n = min(len(on_disk), len(entries))
    differ = np.flatnonzero(on_disk[:n] != entries[:n])
    return int(differ[0]) if len(differ) else n


def _cut_file(path: str, size: int) -> None:
    """Shorten the file at ``path`` to ``size`` bytes when it is longer (a missing file stays missing)."""
    try:
        fd = fs.FS.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return
    try:
        if fs.FS.size(fd) > size:
            fs.FS.ftruncate(fd, size)
    finally:
        fs.FS.close(fd)


def _read_or_empty(path: str) -> bytes:
    try:
        return fs.FS.read_file(path)
    except FileNotFoundError:
        raise CorruptIndexError(f"{path} is missing") from None


__all__ += ["HEADER_SIZE"]


def inode_of(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None
