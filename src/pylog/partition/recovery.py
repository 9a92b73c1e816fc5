"""Opening a partition after a clean or an unclean shutdown, and rewriting segments safely.

Run by the first process that opens a log directory (no other process has it open), with the partition lock
held. The steps, in order (Kafka's ``LogLoader`` is the model):

1. Delete ``.tmp``, ``.cleaned`` and ``.deleted`` files; finish interrupted ``.swap`` renames (a ``.swap`` is
   only created from a complete, fsynced ``.cleaned`` file, so renaming it over the original is safe).
2. Delete orphan index files (no ``.log`` beside them). Ignore nothing silently: a missing segment in the
   middle of an uncompacted partition is a :class:`CorruptRecordError`.
3. Segments entirely below the recovery point are trusted: their indexes are sanity-checked and rebuilt from
   the log if they fail. After a clean shutdown the same holds for every segment.
4. After an unclean shutdown, every segment from the one holding the recovery point on is revalidated batch
   by batch (bounds, CRC-32C, increasing offsets). At the first invalid batch the log is truncated (bytes
   dropped are reported) and later segments are deleted, unless the invalid batch lies below the recovery
   point: that is corruption of durable data, which is never truncated (the open fails with a typed error
   that names the file and position; ``pylog.repair(path)`` is the only thing that drops it).
5. The indexes of revalidated segments are rewritten, the tail fsynced, the recovery point advanced to the log
   end, and the shared state rebuilt.

Recovery is idempotent: a crash at any step leaves files from which the same procedure converges.

Thread-safety: the caller holds the partition's file lock (``flock`` on ``partition.state``) and no other
thread has the partition yet (recovery) or holds its thread lock (truncation, through
:meth:`PartitionLog.locked_for_write`). The new layout is handed to the partition's
:class:`~pylog.partition.segments.SegmentList`; recovery then resets the shared state from it, and
truncation's caller publishes it.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pylog import fs
from pylog.errors import CorruptRecordError
from pylog.partition import files
from pylog.partition.checkpoint import RecoveryCheckpoint
from pylog.partition.cleaner import truncate_checkpoint
from pylog.partition.segment import MapCache, Segment

if TYPE_CHECKING:
    from pylog.partition.log import PartitionLog

__all__ = ["RecoveryReport", "recover_partition", "repair_partition", "rescan_active", "truncate_segments"]


@dataclass
class RecoveryReport:
    """What opening a partition had to do."""

    clean_shutdown: bool = True
    segments_validated: int = 0
    batches_validated: int = 0
    bytes_truncated: int = 0
    segments_removed: int = 0
    indexes_rebuilt: int = 0
    temp_files_removed: int = 0
    swaps_completed: int = 0
    problems: list[str] = field(default_factory=list)


def _clean_directory(directory: str, report: RecoveryReport) -> list[int]:
    names = fs.FS.listdir(directory)
    changes = report.temp_files_removed + report.swaps_completed
    for name in sorted(names):
        parsed = files.parse_segment_name(name)
        path = os.path.join(directory, name)
        if parsed is None:
            if name.endswith(files.TMP):
                fs.FS.unlink(path)
                report.temp_files_removed += 1
            continue
        _, _, temp = parsed
        if temp in files.TEMP_SUFFIXES:
            fs.FS.unlink(path)
            report.temp_files_removed += 1
        elif temp == files.SWAP:
            fs.FS.rename(path, path[: -len(files.SWAP)])
            report.swaps_completed += 1
    names = fs.FS.listdir(directory)
    logs = set(files.live_segment_bases(names))
    for name in names:
        parsed = files.parse_segment_name(name)
        if parsed and not parsed[2] and parsed[1] != files.LOG and parsed[0] not in logs:
            fs.FS.unlink(os.path.join(directory, name))
            report.temp_files_removed += 1
    if report.temp_files_removed + report.swaps_completed != changes:
        fs.FS.fsync_dir(directory)
    return sorted(logs)


def recover_partition(plog: PartitionLog, clean_shutdown: bool) -> RecoveryReport:
    report = RecoveryReport(clean_shutdown=clean_shutdown)
    directory = plog.directory
    bases = _clean_directory(directory, report)
    layout = plog.segment_list
    interval = plog.config.index_interval_bytes
    if not bases:
        seg = layout.new_segment(0, dense=False)
        fd = fs.FS.open(seg.path, os.O_RDWR | os.O_CREAT)
        fs.FS.fsync(fd)
        fs.FS.close(fd)
        fs.FS.fsync_dir(directory)
        bases = [0]
    point = plog.checkpoint.read()
    segments: list[Segment] = []
    for i, base in enumerate(bases):
        seg = layout.new_segment(base)
        seg.size = seg.file_size()
        next_base = bases[i + 1] if i + 1 < len(bases) else None
        trusted = clean_shutdown or (next_base is not None and next_base <= point)
        if trusted:
            fast = seg.load_trusted(seg.size, interval)
            # a trusted segment must also end where the next one starts (not past it: see _drop_strays)
            fits = next_base is None or fast is None or fast.next_offset <= next_base
            if fast is not None and fast.error is None and fast.end == seg.size and fits:
                segments.append(seg)
                continue
            seg = layout.new_segment(base)
            seg.size = seg.file_size()
        result = None
        if next_base is None:
            result = seg.load_from_point(seg.size, point, interval)
            if result is None:  # it may have loaded part of the indexes: validate a fresh segment
                seg = layout.new_segment(base)
                seg.size = seg.file_size()
        if result is None:
            result = seg.scan(0, seg.size, verify=True, index_interval=interval)
        report.segments_validated += 1
        report.batches_validated += result.batches
        report.indexes_rebuilt += 1
        if result.error is not None:
            bad_offset = seg.next_offset
            if bad_offset < point:
                result.error.path = seg.path
                raise CorruptRecordError(
                    f"corrupt batch below the recovery point ({point}) in {seg.path} at position "
                    f"{result.end}: {result.error}. Durable data is never dropped automatically; run "
                    f"Log.verify() (or `pylog verify`) for a report and pylog.repair(path) (or `pylog repair`) to truncate it.",
                    path=seg.path,
                    position=result.end,
                ) from result.error
            report.problems.append(f"{seg.path}: {result.error}")
            report.bytes_truncated += seg.size - result.end
            fd = seg.open_fd()
            fs.FS.ftruncate(fd, result.end)
            seg.size = result.end
            seg.rewrite_indexes()
            segments.append(seg)
            for later in bases[i + 1 :]:
                dead = layout.new_segment(later, dense=False)
                report.bytes_truncated += dead.file_size()
                dead.delete_files()
                report.segments_removed += 1
            break
        if next_base is not None:
            seg.add_final_time_entry()  # a rolled segment: as its roll left it
        seg.rewrite_indexes()
        segments.append(seg)
    if plog.gapped:
        segments = _drop_covered(segments, report)
    segments = _drop_strays(segments, report)
    _check_contiguous(segments, plog.gapped)
    layout.reset(segments)
    active = segments[-1]
    changed = report.bytes_truncated or report.segments_removed or report.swaps_completed
    if changed or active.next_offset != point:
        # make what recovery kept durable before the recovery point says so; after a clean shutdown with
        # nothing to fix the files already are (the last closer fsynced them), so opening costs no fsync
        fs.FS.fsync(active.open_fd())
        fs.FS.fsync_dir(directory)
    plog.reset_state()
    if active.next_offset != point:
        plog.checkpoint.write(active.next_offset, sync=True)
    if active.next_offset < point:
        plog.checkpoint.reset(active.next_offset)
    return report


def _drop_covered(segments: list[Segment], report: RecoveryReport) -> list[Segment]:
    """In a compacted partition, delete segments whose offsets the segment before them covers.

    Compaction merges consecutive segments into one (a ``.swap`` named by the first one's base offset) and
    deletes the others only after the merged one is durable; a crash in between (or during the recovery that
    completes the swap) leaves them beside it. The merged segment holds every record of theirs that survives
    compaction, so they go.

    A merged segment holds only offsets of the segments it merged, and those are deleted in offset order: it
    ends at or before the end of the last segment it overlaps. One that reaches past it does so because a
    base offset (outside the CRC) is damaged; then nothing is deleted and the partition is refused
    (:class:`CorruptRecordError`: ``pylog verify`` reports it, ``pylog repair`` truncates it)."""
    kept: list[Segment] = []
    for i, seg in enumerate(segments):
        prev = kept[-1] if kept else None
        if prev is not None and prev.size and seg.base_offset < prev.next_offset:
            _check_merged(prev, [s for s in segments[i:] if s.base_offset < prev.next_offset])
            report.problems.append(f"{seg.path}: merged into {prev.path} by compaction")
            seg.delete_files()
            report.segments_removed += 1
            continue
        kept.append(seg)
    return kept


def _check_merged(merged: Segment, overlapped: list[Segment]) -> None:
    end = overlapped[-1].next_offset
    if merged.next_offset > end:
        raise CorruptRecordError(
            f"{merged.path} reaches offset {merged.next_offset - 1}, past the end ({end}) of the segments it "
            f"overlaps ({', '.join(str(s.base_offset) for s in overlapped)}): a damaged base offset, not a "
            f"compaction merge; no segment is deleted. Run Log.verify() (or `pylog verify`) for a report and "
            f"pylog.repair(path) (or `pylog repair`) to truncate it.",
            path=merged.path,
        )


def _drop_strays(segments: list[Segment], report: RecoveryReport) -> list[Segment]:
    """Delete empty segment files whose base offset lies inside the segment before them.

    A roll creates the new (empty) segment file before publishing it; when it fails in between and cannot
    remove the file, appends go on into the old segment, past the new file's base offset. Such a file holds
    nothing (a published segment is never empty unless it is the last one and starts where the one before it
    ends), so removing it loses no data."""
    kept: list[Segment] = []
    for seg in segments:
        if kept and seg.size == 0 and seg.base_offset < kept[-1].next_offset:
            report.problems.append(f"{seg.path}: empty, inside the previous segment (a failed roll)")
            seg.delete_files()
            report.segments_removed += 1
            continue
        kept.append(seg)
    return kept


def _check_contiguous(segments: list[Segment], compacted: bool) -> None:
    for prev, seg in itertools.pairwise(segments):
        if seg.base_offset < prev.next_offset or (not compacted and seg.base_offset != prev.next_offset):
            raise CorruptRecordError(
                f"segment files are not contiguous: {prev.path} ends at offset {prev.next_offset} but the next "
                f"segment starts at {seg.base_offset} (a segment file is missing or out of place)",
                path=seg.path,
            )


def rescan_active(plog: PartitionLog) -> None:
    """After a writer died mid-publish: find the valid end of the active segment from its start."""
    active = plog.segment_list.active
    active.size = active.file_size()
    result = active.scan(0, active.size, verify=True, index_interval=plog.config.index_interval_bytes)
    active.size = result.end
    active.rewrite_indexes()


def truncate_segments(plog: PartitionLog, offset: int) -> None:
    """Drop every batch whose last offset is >= ``offset`` (lock held). Published data is never shrunk in
    place: the kept prefix is copied to ``.cleaned``, fsynced, renamed to ``.swap`` and then over the log."""
    segments = plog.segment_list
    gone = segments.truncate(offset)
    for dead in gone:
        dead.delete_files()
    reopened = bool(gone)
    seg = segments.active
    position = seg.position_for(offset) if seg.size else 0
    if reopened and position == seg.size:
        # a sealed segment becomes the active one again, whole: its indexes lose the final time entry its
        # roll added (an active segment has none; verify() and the next roll expect that)
        seg.scan(0, seg.size, verify=False, index_interval=plog.config.index_interval_bytes)
        seg.rewrite_indexes()
    if position < seg.size:
        keep = bytes(seg.view(position)) if position else b""
        cleaned = seg.path + files.CLEANED
        fd = fs.FS.open(cleaned, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            fs.FS.pwrite(fd, keep, 0)
            fs.FS.fsync(fd)
        finally:
            fs.FS.close(fd)
        fs.FS.rename(cleaned, seg.path + files.SWAP)
        seg.close_fd()
        seg.drop_map()
        fs.FS.rename(seg.path + files.SWAP, seg.path)
        fs.FS.fsync_dir(plog.directory)
        seg.size = position
        seg.scan(0, position, verify=False, index_interval=plog.config.index_interval_bytes)
        seg.rewrite_indexes()
    point = min(plog.checkpoint.read(), seg.next_offset)
    plog.checkpoint.reset(point)
    truncate_checkpoint(plog.directory, seg.next_offset)  # records written there again are dirty


def repair_partition(directory: str, compacted: bool) -> list[str]:
    """Truncate a partition at its first invalid batch, wherever it is, and say what was dropped.

    The only operation that may drop data below the recovery point. The caller must be alone with the log
    directory. Returns one line per action taken (empty when the partition was intact)."""
    actions: list[str] = []
    compacted = files.offsets_may_skip(directory, compacted)  # cleaned before its cleanup_policy changed
    bases = files.live_segment_bases(fs.FS.listdir(directory))
    cache = MapCache(4)
    expected = -1
    for i, base in enumerate(bases):
        seg = Segment(directory, base, cache, dense=not compacted)
        seg.size = seg.file_size()
        result = seg.scan(0, seg.size, verify=True, after_offset=max(expected, base))
        gap = expected >= 0 and base != expected and not compacted
        if result.error is None and not gap:
            expected = result.next_offset
            continue
        cut = 0 if gap else result.end
        dropped_from = base if gap else result.next_offset
        later = bases[i + 1 :]
        lost = (
            seg.size - cut + sum(os.path.getsize(files.segment_path(directory, b, files.LOG)) for b in later)
        )
        reason = "segment missing before it" if gap else str(result.error)
        actions.append(
            f"{seg.path}: dropped offsets >= {dropped_from} ({lost} bytes in {1 + len(later)} segment(s)): {reason}"
        )
        if cut == 0 and i > 0:
            seg.delete_files()
        else:
            fd = seg.open_fd()
            fs.FS.ftruncate(fd, cut)
            fs.FS.fsync(fd)
            seg.close_fd()
            seg.size = cut
            seg.scan(0, cut, verify=False)
            seg.rewrite_indexes()
        for b in later:
            Segment(directory, b, cache).delete_files()
        fs.FS.fsync_dir(directory)
        RecoveryCheckpoint(os.path.join(directory, files.CHECKPOINT)).reset(dropped_from if cut else base)
        truncate_checkpoint(directory, dropped_from if cut else base)
        break
    return actions
