"""Log compaction: keep the last record of every key, with offsets unchanged (Kafka's log cleaner).

For a partition of a topic whose ``cleanup_policy`` includes ``compact``, one cleaning pass:

1. Picks the cleanable segments: a prefix of the rolled segments (never the active one) whose largest
   timestamps are at least ``min_compaction_lag_ms`` old, ending before the first segment that holds a batch
   of a transaction still open (the last stable offset: what is undecided cannot be compacted yet).
2. Goes on only when the dirty share of their bytes (segments past the first dirty offset, i.e. not cleaned
   by an earlier pass) reaches ``min_cleanable_dirty_ratio``, when a tombstone kept by the last pass may have
   expired, or when forced.
3. Decodes them and builds the offset map (:mod:`pylog.partition.keymap`) over the records that count: those
   with a key that are not part of an aborted transaction.
4. Keeps a record when it is the latest of its key, or has no key. Drops records of aborted transactions.
   Drops a tombstone (a null value) once ``delete_retention_ms`` have passed since the pass that first cleaned
   it (Kafka's delete horizon, KIP-534), so that a reader has that long to see the deletion. When nothing at
   all would remain, the last record is kept: the log start offset never moves, so every offset of the cleaned
   range stays a valid position.
5. Rewrites the segments, merging consecutive ones whose cleaned bytes fit in ``segment_bytes`` (and whose
   offsets span less than 2**32, the reach of a relative index entry) into one segment named by the first
   one's base offset (Kafka's ``groupSegmentsBySize``). A batch of which some records survive is re-encoded
   with exactly those records' offsets, timestamps, keys, values and headers, and the batch's compression,
   timestamp type, transactional flag and producer fields; an untouched batch is copied byte for byte; a batch
   of which nothing survives disappears. A group in which nothing changes is left alone.
6. Records the pass in ``cleaner.checkpoint``.

Readers that ask for an offset compaction removed get the next surviving record (the segments are sparse).

Each group is replaced two-phase. Without the partition lock (``cleaner.lock`` keeps other cleaners out),
the cleaned copy is written as ``<base>.log.cleaned`` and fsynced. Then, with the partition lock: the group
is checked to be unchanged (same files, same sizes: retention or truncation may have changed it; then the
copy is deleted and the pass is not recorded), the old index files of ``<base>`` are removed, the copy is
renamed to ``<base>.log.swap`` and the directory fsynced (the commit point), the other segments of the group
are deleted, the ``.swap`` is renamed over ``<base>.log``, the directory is fsynced and new indexes written.
Recovery deletes ``.cleaned`` files, completes ``.swap`` renames and deletes segments that a completed merge
covers. After a crash at any step each segment is the old one or the new one; both hold every record
compaction must keep.

``cleaner.checkpoint`` (in the partition directory, replaced atomically; integers little-endian)::

    offset   size  type  field
    0        4     u32   magic             b"PLCC"
    4        2     u16   version           1
    6        2     u16   count             n, the passes recorded (at most 64)
    8        8     i64   tombstones_since  time of the pass that first cleaned the oldest tombstone the last pass
                                           kept; -1 when it kept none
    16       16*n        passes, oldest first, both fields strictly increasing:
                   i64     end_offset      offsets below it were cleaned by this pass or an earlier one
                   i64     cleaned_ms      the clock's time when the pass ran
    16+16*n  4     u32   crc               CRC-32C of bytes [0, 16 + 16*n)

The first dirty offset is the last pass's ``end_offset`` (0 before the first pass). A tombstone at offset
``o`` was first cleaned by the first pass whose ``end_offset`` is above ``o``. Passes older than the last one
whose tombstones have all expired are dropped, and past 64 passes the oldest are: either only makes a
tombstone look cleaned later than it was, so it survives longer, never shorter. A damaged checkpoint reads as
empty (every segment is dirty again and tombstones start over); cleaning twice is harmless, and the pass
reports the damage in ``CleanResult.problems``. Truncating the log below a pass's ``end_offset`` lowers it
(:func:`truncate_checkpoint`), so records written again at those offsets count as dirty.

Thread-safety: safe. One pass per partition runs at a time, across threads and processes (an ``flock`` on
``cleaner.lock`` held for the pass); a second pass started meanwhile returns at once with ``skipped`` set.
Swaps and checkpoint updates run under the partition's lock. Readers keep reading the old files through
their maps until they see the new layout epoch, then reopen the segments whose file changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from pylog import fs
from pylog.errors import CorruptRecordError
from pylog.partition import files
from pylog.partition.keymap import latest_mask
from pylog.partition.segment import Segment
from pylog.partition.visibility import ABORTED, OPEN, TxnStatus, Visibility
from pylog.record import ATTR_CONTROL, ATTR_TRANSACTIONAL, DecodedBatch, crc32c, decode_batch, encode_columns

if TYPE_CHECKING:
    from pylog.partition.log import PartitionLog

__all__ = [
    "CleanResult",
    "CleanerCheckpoint",
    "TxnStatus",
    "clean_partition",
    "load_checkpoint",
    "mark_compacted",
    "read_checkpoint",
    "truncate_checkpoint",
]

_HEAD = struct.Struct("<IHHq")
_PASS = struct.Struct("<qq")
_CRC = struct.Struct("<I")
_MAGIC = int.from_bytes(b"PLCC", "little")
_MAX_PASSES = 64
_NEVER = np.iinfo(np.int64).max
_MAX_REL = 0xFFFFFFFF  # the largest offset relative to a segment's base that its index can hold
_WRITE_CHUNK = 8 << 20


@dataclass
class CleanResult:
    """What one cleaning pass did (``skipped`` says why it did nothing)."""

    segments_cleaned: int = 0
    segments_removed: int = 0
    records_read: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    skipped: str = ""
    problems: list[str] = field(default_factory=list)


# -- the checkpoint ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CleanerCheckpoint:
    """The passes recorded in ``cleaner.checkpoint`` (layout in the module docstring)."""

    passes: tuple[tuple[int, int], ...] = ()
    tombstones_since: int = -1

    @property
    def first_dirty(self) -> int:
        return self.passes[-1][0] if self.passes else 0

    def cleaned_at(self, offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Per offset, the time of the pass that first cleaned it; ``_NEVER`` when no pass did."""
        ends = np.array([end for end, _ in self.passes], dtype=np.int64)
        times = np.array([t for _, t in self.passes] + [_NEVER], dtype=np.int64)
        return times[np.searchsorted(ends, offsets, side="right")]

    def after_pass(
        self, end: int, now_ms: int, retention_ms: int, tombstones_since: int
    ) -> CleanerCheckpoint:
        passes = list(self.passes)
        if end > self.first_dirty:
            passes.append((end, max(now_ms, passes[-1][1] if passes else now_ms)))
        expired = [i for i, (_, t) in enumerate(passes) if t + retention_ms <= now_ms]
        if expired:
            passes = passes[expired[-1] :]
        return CleanerCheckpoint(tuple(passes[-_MAX_PASSES:]), tombstones_since)

    def truncated(self, offset: int) -> CleanerCheckpoint:
        """After the log was truncated to ``offset``: no pass covers offsets at or above it."""
        passes: list[tuple[int, int]] = []
        for end, t in self.passes:
            end = min(end, offset)
            if not passes or end > passes[-1][0]:
                passes.append((end, t))
        return CleanerCheckpoint(tuple(passes), self.tombstones_since)

    def encode(self) -> bytes:
        body = _HEAD.pack(_MAGIC, 1, len(self.passes), self.tombstones_since) + b"".join(
            _PASS.pack(end, t) for end, t in self.passes
        )
        return body + _CRC.pack(crc32c(body))

    @classmethod
    def decode(cls, raw: bytes) -> CleanerCheckpoint | None:
        """The checkpoint in ``raw``, or None when it is damaged."""
        if len(raw) < _HEAD.size + _CRC.size:
            return None
        magic, version, n, since = _HEAD.unpack_from(raw)
        end = _HEAD.size + n * _PASS.size
        if magic != _MAGIC or version != 1 or len(raw) != end + _CRC.size:
            return None
        if _CRC.unpack_from(raw, end)[0] != crc32c(raw[:end]):
            return None
        passes = tuple((int(e), int(t)) for e, t in _PASS.iter_unpack(raw[_HEAD.size : end]))
        if any(a[0] >= b[0] or a[1] > b[1] for a, b in itertools.pairwise(passes)):
            return None
        if passes and passes[0][0] < 0:
            return None
        return cls(passes, int(since))


def load_checkpoint(directory: str) -> tuple[CleanerCheckpoint, str | None]:
    """The partition's cleaner checkpoint and, when it was damaged (and reads as empty), a line saying so."""
    path = os.path.join(directory, files.CLEANER_CHECKPOINT)
    try:
        raw = fs.FS.read_file(path)
    except FileNotFoundError:
        return CleanerCheckpoint(), None
    found = CleanerCheckpoint.decode(raw)
    if found is None:
        return CleanerCheckpoint(), f"{path}: damaged; every segment counts as dirty again"
    return found, None


def read_checkpoint(directory: str) -> int:
    """The first offset no cleaning pass has covered yet (0 when the partition was never cleaned)."""
    return load_checkpoint(directory)[0].first_dirty


def _store_checkpoint(directory: str, checkpoint: CleanerCheckpoint) -> None:
    fs.atomic_write(os.path.join(directory, files.CLEANER_CHECKPOINT), checkpoint.encode())


def truncate_checkpoint(directory: str, offset: int) -> None:
    """The log was truncated to ``offset`` (lock held): records written there again are dirty."""
    if not os.path.exists(os.path.join(directory, files.CLEANER_CHECKPOINT)):
        return
    checkpoint, _ = load_checkpoint(directory)
    truncated = checkpoint.truncated(offset)
    if truncated != checkpoint:
        _store_checkpoint(directory, truncated)


# -- a pass ------------------------------------------------------------------------------------------------


class _Changed(Exception):
    """A segment file changed under the pass (retention, truncation): the pass stops without harm."""


@dataclass
class _Part:
    """One cleanable segment: its file mapped by the pass, its batches and which of them were aborted."""

    seg: Segment
    view: memoryview
    batches: list[tuple[int, DecodedBatch]]
    aborted: list[bool]


@dataclass
class _Group:
    """Consecutive segments to be replaced by one, with their cleaned bytes."""

    parts: list[_Part] = field(default_factory=list)
    chunks: list[bytes | memoryview] = field(default_factory=list)
    size: int = 0
    changed: bool = False


def clean_partition(
    plog: PartitionLog, now_ms: int, *, force: bool = False, txn_status: TxnStatus | None = None
) -> CleanResult:
    """One cleaning pass over ``plog`` (a compacted topic's partition) at clock time ``now_ms``.

    ``force`` ignores ``min_cleanable_dirty_ratio``. ``txn_status`` tells the state of transactional batches;
    without it a transactional batch counts as open, and the pass stops before its segment."""
    result = CleanResult()
    with _cleaner_lock(plog.directory) as mine:
        if not mine:
            result.skipped = "another cleaning pass is running on this partition"
            return result
        try:
            _clean(plog, now_ms, force, txn_status, result)
        except _Changed as exc:
            result.skipped = f"the partition changed during the pass ({exc}); nothing lost, run it again"
    return result


@contextlib.contextmanager
def _cleaner_lock(directory: str) -> Iterator[bool]:
    fd = fs.FS.open(os.path.join(directory, files.CLEANER_LOCK), os.O_RDWR | os.O_CREAT)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        fs.FS.close(fd)


def _clean(
    plog: PartitionLog, now: int, force: bool, txn_status: TxnStatus | None, result: CleanResult
) -> None:
    config = plog.config
    checkpoint, problem = load_checkpoint(plog.directory)
    if problem:
        result.problems.append(problem)
    lagged: list[Segment] = []
    for seg in plog.segments[:-1]:  # never the active segment
        if seg.size == 0 or now - seg.max_timestamp < config.min_compaction_lag_ms:
            break
        lagged.append(seg)
    if not lagged:
        result.skipped = "no segment is cleanable yet (the active one, or younger than min_compaction_lag_ms)"
        return
    if not force and not _due(
        lagged, checkpoint, now, config.min_cleanable_dirty_ratio, config.delete_retention_ms
    ):
        result.skipped = "the dirty ratio is below min_cleanable_dirty_ratio"
        return
    parts: list[_Part] = []
    visibility = Visibility(txn_status or _undecided)  # statuses cached for the pass
    for seg in lagged:
        part = _read(seg, visibility)
        if part is None:
            break  # an open transaction: nothing from here on can be compacted yet
        parts.append(part)
    if not parts:
        result.skipped = "the first cleanable segment holds an open transaction"
        return
    keep, since = _decide(parts, checkpoint, now, config.delete_retention_ms, result)
    expected = _rewrite(plog, parts, keep, config.segment_bytes, result)
    _record(plog, parts, expected, now, since, result)


def _due(
    segments: list[Segment], checkpoint: CleanerCheckpoint, now: int, ratio: float, retention: int
) -> bool:
    total = sum(s.size for s in segments)
    dirty = sum(s.size for s in segments if s.next_offset > checkpoint.first_dirty)
    if dirty and dirty / total >= ratio:
        return True
    since = checkpoint.tombstones_since
    return since >= 0 and now - since >= retention  # a tombstone kept last time may go now


def _undecided(producer_id: int, producer_epoch: int, txn: int) -> str:
    """The status function of a pass given none: no transaction is known to be decided."""
    return OPEN


def _read(seg: Segment, visibility: Visibility) -> _Part | None:
    """Map and decode ``seg`` (CRC and offsets checked); None when it holds a batch of an open transaction
    (:mod:`pylog.partition.visibility`: the last stable offset). Aborted batches are marked, to be dropped."""
    view = _map(seg)
    batches: list[tuple[int, DecodedBatch]] = []
    aborted: list[bool] = []
    pos, expected = 0, seg.base_offset
    while pos < seg.size:
        try:
            b = decode_batch(view, pos)
        except CorruptRecordError as exc:
            exc.path, exc.position = seg.path, pos
            raise
        h = b.header
        if h.base_offset < expected or h.next_offset > seg.next_offset:
            # the base offset is outside the CRC: never bake a damaged one into a rewritten batch
            raise CorruptRecordError(
                f"batch at position {pos} has offsets {h.base_offset}..{h.last_offset}, expected them in "
                f"[{expected}, {seg.next_offset})",
                path=seg.path,
                position=pos,
            )
        verdict = visibility.classify(h)
        if verdict == OPEN:
            return None
        batches.append((pos, b))
        aborted.append(verdict == ABORTED)  # a control batch is kept, as any batch of a decided transaction
        expected = h.next_offset
        pos += h.batch_length
    return _Part(seg, view, batches, aborted)


def _map(seg: Segment) -> memoryview:
    """A read-only map of ``seg``'s file, private to the pass (it stays valid after the file is replaced)."""
    try:
        fd = os.open(seg.path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise _Changed(f"{seg.path} was deleted") from None
    try:
        st = os.fstat(fd)
        if st.st_ino != seg.ino or st.st_size < seg.size:
            raise _Changed(f"{seg.path} was replaced")
        return memoryview(mmap.mmap(fd, seg.size, access=mmap.ACCESS_READ))
    finally:
        os.close(fd)


def _decide(
    parts: list[_Part], checkpoint: CleanerCheckpoint, now: int, retention: int, result: CleanResult
) -> tuple[npt.NDArray[np.bool_], int]:
    """Which records survive, one flag per record of ``parts`` in order; and ``tombstones_since``."""
    batches = [b for p in parts for _, b in p.batches]
    counts = [len(b.offsets) for b in batches]
    aborted = np.repeat(np.array([a for p in parts for a in p.aborted], dtype=np.bool_), counts)
    offsets = np.concatenate([b.offsets for b in batches])
    has_key = np.concatenate([b.key_valid for b in batches])
    tombstone = has_key & ~np.concatenate([b.value_valid for b in batches])
    first_cleaned = checkpoint.cleaned_at(offsets)
    horizon = max(now - retention, -_NEVER)
    expired = tombstone & (first_cleaned <= horizon)
    keep = (latest_mask(batches, ~aborted) | ~has_key) & ~aborted & ~expired
    if not keep.any():
        # keep the last record, so that the log start offset stays where it is
        candidates = np.flatnonzero(~aborted)
        keep[candidates[-1] if len(candidates) else len(keep) - 1] = True
    result.tombstones_removed = int((expired & ~keep).sum())
    kept = tombstone & keep
    since = -1
    if kept.any():
        since = int(np.where(first_cleaned == _NEVER, now, first_cleaned)[kept].min())
    return keep, since


def _rewrite(
    plog: PartitionLog, parts: list[_Part], keep: npt.NDArray[np.bool_], limit: int, result: CleanResult
) -> dict[int, int | None] | None:
    """Clean every part and replace them group by group. Returns the expected ``{base offset: inode}`` of the
    cleaned range afterwards, or None when a group could not be replaced (the partition changed)."""
    expected: dict[int, int | None] | None = {p.seg.base_offset: p.seg.ino for p in parts}
    group = _Group()
    at = 0
    for part in parts:
        n = sum(len(b.offsets) for _, b in part.batches)
        chunks, kept = _clean_segment(part, keep[at : at + n])
        at += n
        size = sum(len(c) for c in chunks)
        result.records_read += n
        result.records_removed += n - kept
        result.bytes_before += part.seg.size
        result.bytes_after += size
        if group.parts and not _fits(group, part, size, limit):
            expected = _replace(plog, group, expected, result)
            group = _Group()
        group.parts.append(part)
        group.chunks += chunks
        group.size += size
        group.changed |= kept < n
    return _replace(plog, group, expected, result)


def _fits(group: _Group, part: _Part, size: int, limit: int) -> bool:
    span = part.seg.next_offset - 1 - group.parts[0].seg.base_offset
    return (group.size == 0 or group.size + size <= limit) and span <= _MAX_REL


def _clean_segment(part: _Part, keep: npt.NDArray[np.bool_]) -> tuple[list[bytes | memoryview], int]:
    """The surviving batches of ``part`` (untouched ones as views of the file) and how many records survive."""
    chunks: list[bytes | memoryview] = []
    kept = at = 0
    for pos, b in part.batches:
        n = len(b.offsets)
        mine = keep[at : at + n]
        at += n
        count = int(mine.sum())
        kept += count
        if count == n:
            chunks.append(part.view[pos : pos + b.header.batch_length])
        elif count:
            chunks.append(_rebuild(b, np.flatnonzero(mine)))
    return chunks, kept


def _rebuild(b: DecodedBatch, idx: npt.NDArray[np.intp]) -> bytes:
    """A batch of the records ``idx`` of ``b``: their offsets, timestamps, keys, values and headers unchanged."""
    h = b.header
    key_lens, keys = _take(b.key_data, b.key_offsets, b.key_valid, idx)
    value_lens, values = _take(b.value_data, b.value_offsets, b.value_valid, idx)
    header_lens: npt.NDArray[np.int64] | None = None
    headers = b""
    if b.header_offsets is not None:
        header_lens, headers = _take(b.header_data, b.header_offsets, None, idx)
        if not header_lens.any():
            header_lens = None
    offsets = b.offsets[idx]
    return encode_columns(
        int(offsets[0]),
        key_lens,
        keys,
        value_lens,
        values,
        b.timestamps[idx],
        header_lens,
        headers,
        offset_deltas=offsets - offsets[0],
        compression=h.compression,
        log_append_time=bool(h.timestamp_type),
        producer_id=h.producer_id,
        producer_epoch=h.producer_epoch,
        base_sequence=h.base_sequence,
        transactional=bool(h.attributes & ATTR_TRANSACTIONAL),
        control=bool(h.attributes & ATTR_CONTROL),
    )


def _take(
    data: memoryview,
    bounds: npt.NDArray[np.int64],
    valid: npt.NDArray[np.bool_] | None,
    idx: npt.NDArray[np.intp],
) -> tuple[npt.NDArray[np.int64], bytes]:
    """Lengths (-1 for null) and concatenated bytes of the entries ``idx`` of an Arrow-style column; each run
    of consecutive entries is copied as one slice."""
    starts, ends = bounds[idx], bounds[idx + 1]
    cut = np.flatnonzero(np.diff(idx) != 1) + 1
    lo = starts[np.concatenate(([0], cut))].tolist()
    hi = ends[np.concatenate((cut - 1, [len(idx) - 1]))].tolist()
    raw = b"".join([data[a:z] for a, z in zip(lo, hi, strict=True)])
    lens = ends - starts
    if valid is not None:
        lens = np.where(valid[idx], lens, -1)
    return lens, raw


def _replace(
    plog: PartitionLog, group: _Group, expected: dict[int, int | None] | None, result: CleanResult
) -> dict[int, int | None] | None:
    if not group.changed or not group.size:
        return expected
    segments = [p.seg for p in group.parts]
    cleaned = files.segment_path(plog.directory, segments[0].base_offset, files.LOG + files.CLEANED)
    _write(cleaned, group.chunks)
    fresh = _swap(plog, segments, cleaned, group.size)
    if fresh is None or expected is None:
        return None
    for seg in segments:
        del expected[seg.base_offset]
    expected[fresh.base_offset] = fresh.ino
    result.segments_cleaned += 1
    result.segments_removed += len(segments) - 1
    return expected


def _write(path: str, chunks: list[bytes | memoryview]) -> None:
    """Write ``chunks`` to a new file at ``path`` and fsync it (in writes of about 8 MiB)."""
    fd = fs.FS.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        position = 0
        for piece in _coalesce(chunks):
            fs.FS.pwrite(fd, piece, position)
            position += len(piece)
        fs.FS.fsync(fd)
    finally:
        fs.FS.close(fd)


def _coalesce(chunks: list[bytes | memoryview]) -> Iterator[bytes]:
    pending: list[bytes | memoryview] = []
    size = 0
    for chunk in chunks:
        pending.append(chunk)
        size += len(chunk)
        if size >= _WRITE_CHUNK:
            yield b"".join(pending)
            pending, size = [], 0
    if pending:
        yield b"".join(pending)


def mark_compacted(directory: str) -> None:
    """Leave the ``compacted`` marker in a partition directory (durably, once): its offsets may skip from
    now on, whatever its topic's ``cleanup_policy`` later says (see :func:`files.offsets_may_skip`)."""
    path = os.path.join(directory, files.COMPACTED)
    if not os.path.exists(path):
        fs.atomic_write(path, _COMPACTED_TEXT)


_COMPACTED_TEXT = b"pylog: compaction cleaned this partition; its offsets may skip\n"


def _swap(plog: PartitionLog, olds: list[Segment], cleaned: str, size: int) -> Segment | None:
    """Replace the consecutive segments ``olds`` by the fsynced file ``cleaned`` of ``size`` bytes, under the
    partition lock. None (and ``cleaned`` deleted) when they changed since the pass read them."""
    directory = plog.directory
    base = olds[0].base_offset
    log_path = files.segment_path(directory, base, files.LOG)
    with plog.locked_for_write() as layout:
        group = layout.find_run(olds)
        if group is None:
            fs.FS.unlink(cleaned)
            return None
        for seg in group:
            layout.release(seg)
        for suffix in (files.INDEX, files.TIMEINDEX):
            path = files.segment_path(directory, base, suffix)
            if os.path.exists(path):
                fs.FS.unlink(path)
        fs.FS.fsync_dir(directory)  # no stale index may outlive the swap
        mark_compacted(directory)  # before the first gap: a reader must know offsets may skip
        fs.FS.rename(cleaned, log_path + files.SWAP)
        fs.FS.fsync_dir(directory)  # the commit point: recovery completes the swap from here
        for seg in group[1:]:
            seg.delete_files()  # merged: its surviving records are in the swap
        fs.FS.rename(log_path + files.SWAP, log_path)
        fs.FS.fsync_dir(directory)
        fresh = layout.new_segment(base, dense=False)
        fresh.size = size
        scan = fresh.scan(0, size, verify=False, index_interval=plog.config.index_interval_bytes)
        if scan.error is not None:
            raise scan.error
        fresh.add_final_time_entry()  # as a roll leaves a segment
        fresh.rewrite_indexes()
        layout.replace(group, fresh)
        plog.publish()
        return fresh


def _record(
    plog: PartitionLog,
    parts: list[_Part],
    expected: dict[int, int | None] | None,
    now: int,
    since: int,
    result: CleanResult,
) -> None:
    """Append the pass to the checkpoint (read again under the lock: truncation may have lowered it), if the
    cleaned range is still exactly what the pass left."""
    last = parts[-1].seg
    with plog.locked_for_write() as layout:
        now_there = {s.base_offset: s.ino for s in layout if s.base_offset <= last.base_offset}
        if expected is None or now_there != expected:
            result.problems.append("the partition changed during the pass: the pass is not recorded")
            return
        current, _ = load_checkpoint(plog.directory)
        updated = current.after_pass(last.next_offset, now, plog.config.delete_retention_ms, since)
        if updated != current:
            _store_checkpoint(plog.directory, updated)
