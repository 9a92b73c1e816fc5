"""Log compaction: keep the last record of every key, with offsets unchanged (Kafka's log cleaner).

For a topic with ``cleanup_policy`` ``"compact"`` (or ``"compact,delete"``, where retention also applies):

* only rolled segments are cleaned, never the active one, and only segments whose largest timestamp is at
  least ``min_compaction_lag_ms`` old (a prefix of the log);
* cleaning runs when the *dirty* share (bytes of those segments past the cleaner checkpoint, i.e. not yet
  cleaned) reaches ``min_cleanable_dirty_ratio``, or when forced;
* a record survives when it is the latest record of its key among the cleanable segments; a tombstone (a
  null value) survives that too, until it is older than ``delete_retention_ms``; records without a key are kept;
* surviving records keep their offsets, timestamps, keys, values and headers byte for byte; batches keep
  their compression; a batch of which nothing survives disappears, and so does a segment;
* readers that ask for an offset compaction removed get the next surviving record.

Crash safety: each segment is rewritten two-phase. The cleaned copy is written as ``<base>.log.cleaned`` and
fsynced; the old segment's index files are removed (they are rebuilt); the copy is renamed to
``<base>.log.swap`` and the directory fsynced (the commit point); the ``.swap`` is renamed over
``<base>.log`` and the directory fsynced; new indexes are written. Recovery deletes ``.cleaned`` files and
completes ``.swap`` renames, so after a crash at any step each segment is either the old or the new one,
both holding every record compaction must keep.

``cleaner.checkpoint`` (in the partition directory, replaced atomically)::

    b"pylog-cleaner 1 <crc32c of the rest, 8 hex digits>\\n" + b"<first dirty offset>"

Thread-safety: runs under the partition's lock for the swap; other processes see the new layout through the
partition's shared state (a new layout epoch) and reopen the segments whose file changed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from pylog import fs
from pylog.errors import CorruptRecordError
from pylog.partition import files
from pylog.partition.segment import Segment
from pylog.record import DecodedBatch, crc32c, decode_batch, decode_header, encode_batch, encode_headers

if TYPE_CHECKING:
    from pylog.partition.log import PartitionLog

__all__ = ["CleanResult", "clean_partition", "read_checkpoint"]

CHECKPOINT_NAME = "cleaner.checkpoint"
_MAGIC = b"pylog-cleaner 1 "


@dataclass
class CleanResult:
    """What one cleaning pass did."""

    segments_cleaned: int = 0
    segments_removed: int = 0
    records_read: int = 0
    records_removed: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    skipped: str = ""


def read_checkpoint(directory: str) -> int:
    """The first offset not yet cleaned (0 when the partition was never cleaned)."""
    path = os.path.join(directory, CHECKPOINT_NAME)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return 0
    head, _, body = raw.partition(b"\n")
    if not head.startswith(_MAGIC) or head[len(_MAGIC) :] != b"%08x" % crc32c(body):
        raise CorruptRecordError(f"{path}: bad cleaner checkpoint", path=path)
    return int(body)


def _write_checkpoint(directory: str, offset: int) -> None:
    body = str(offset).encode()
    fs.atomic_write(os.path.join(directory, CHECKPOINT_NAME), _MAGIC + b"%08x\n" % crc32c(body) + body)


def _batches(seg: Segment) -> Iterator[tuple[int, DecodedBatch]]:
    buf = seg.view()
    pos = 0
    while pos < seg.size:
        h = decode_header(buf, pos, seg.size)
        yield pos, decode_batch(buf, pos)
        pos += h.batch_length


def clean_partition(plog: PartitionLog, now_ms: int, *, force: bool = False) -> CleanResult:
    """One cleaning pass over ``plog`` (a compacted topic's partition)."""
    config = plog.config
    result = CleanResult()
    segments = plog.segments[:-1]  # never the active segment
    cleanable: list[Segment] = []
    for seg in segments:
        if seg.size == 0 or now_ms - seg.max_timestamp < config.min_compaction_lag_ms:
            break
        cleanable.append(seg)
    if not cleanable:
        result.skipped = "no segment is cleanable yet"
        return result
    first_dirty = read_checkpoint(plog.directory)
    total = sum(s.size for s in cleanable)
    dirty = sum(s.size for s in cleanable if s.next_offset > first_dirty)
    if not force and (dirty == 0 or dirty / total < config.min_cleanable_dirty_ratio):
        result.skipped = f"dirty ratio {dirty / total:.2f} below min_cleanable_dirty_ratio"
        return result

    batches = [(seg, pos, b) for seg in cleanable for pos, b in _batches(seg)]
    survivors = _latest_mask(batches)
    horizon = now_ms - config.delete_retention_ms
    cleaned: list[tuple[Segment, bytes, int, int]] = []
    at = 0
    per_segment: dict[int, list[tuple[int, DecodedBatch]]] = {}
    for seg, pos, b in batches:
        per_segment.setdefault(id(seg), []).append((pos, b))
    for seg in cleanable:
        mine = per_segment.get(id(seg), [])
        n = sum(len(b.offsets) for _, b in mine)
        data, kept, read = _clean_segment(seg, mine, survivors[at : at + n], horizon)
        at += n
        cleaned.append((seg, data, kept, read))
        result.records_read += read
        result.records_removed += read - kept
        result.bytes_before += seg.size
        result.bytes_after += len(data)
    for group in _groups(cleaned, config.segment_bytes):
        if all(kept == read for _, _, kept, read in group):
            continue  # nothing to remove here
        if _swap(plog, [seg for seg, _, _, _ in group], b"".join(data for _, data, _, _ in group)):
            result.segments_cleaned += 1
            result.segments_removed += len(group) - 1
    _write_checkpoint(plog.directory, cleanable[-1].next_offset)
    return result


def _groups(
    cleaned: list[tuple[Segment, bytes, int, int]], limit: int
) -> Iterator[list[tuple[Segment, bytes, int, int]]]:
    """Consecutive segments whose cleaned bytes fit in one segment of ``limit`` bytes (Kafka's
    groupSegmentsBySize). A group is named by its first segment's base offset, so the log start offset does not
    move; only when nothing at all survives before the active segment do those segments go.
    An empty group merges into the next one."""
    group: list[tuple[Segment, bytes, int, int]] = []
    size = 0
    for item in cleaned:
        if group and size + len(item[1]) > limit and size > 0:
            yield group
            group, size = [], 0
        group.append(item)
        size += len(item[1])
    if group:
        yield group


def _latest_mask(batches: list[tuple[Segment, int, DecodedBatch]]) -> npt.NDArray[np.bool_]:
    """For every record of ``batches`` (in order): is it the latest record of its key among them? Records
    without a key count as latest.

    Fixed-width keys (the common case: ids, UUIDs) are compared as numpy void scalars, sorted once: no Python
    code per record. Other keys go through a dict (key -> latest offset), built and probed at C speed."""
    if not batches:
        return np.zeros(0, dtype=bool)
    offsets = np.concatenate([b.offsets for _, _, b in batches])
    valid = np.concatenate([b.key_valid for _, _, b in batches])
    lengths = np.concatenate([np.diff(b.key_offsets) for _, _, b in batches])
    widths = np.unique(lengths[valid])
    if len(widths) == 1 and widths[0] > 0:
        w = int(widths[0])
        raw = np.concatenate([np.frombuffer(b.key_data, dtype=np.uint8) for _, _, b in batches])
        keys = raw.reshape(-1, w).view(np.dtype((np.void, w))).ravel()
        _, ids = np.unique(keys, return_inverse=True)
        last = np.full(int(ids.max()) + 1, -1, dtype=np.int64)
        np.maximum.at(last, ids, offsets[valid])
        newest = np.full(len(offsets), -1, dtype=np.int64)
        newest[valid] = last[ids]
    else:
        latest: dict[bytes | None, int] = {}
        all_keys: list[bytes | None] = []
        for _, _, b in batches:
            keys_b = b.keys()
            all_keys += keys_b
            latest.update(zip(keys_b, b.offsets.tolist(), strict=True))
        newest = np.fromiter(map(latest.__getitem__, all_keys), dtype=np.int64, count=len(all_keys))
    result: npt.NDArray[np.bool_] = (newest == offsets) | ~valid
    return result


def _clean_segment(
    seg: Segment, batches: list[tuple[int, DecodedBatch]], latest: npt.NDArray[np.bool_], horizon: int
) -> tuple[bytes, int, int]:
    """The segment's bytes with only the surviving records; returns ``(bytes, kept, read)``."""
    out: list[bytes] = []
    kept = read = 0
    view = seg.view()
    for pos, b in batches:
        n = len(b.offsets)
        expired = ~b.value_valid & (b.timestamps < horizon)
        keep = latest[read : read + n] & ~expired
        read += n
        count = int(keep.sum())
        kept += count
        if count == n:
            out.append(bytes(view[pos : pos + b.header.batch_length]))
        elif count:
            out.append(_rebuild(b, np.flatnonzero(keep)))
    return b"".join(out), kept, read


def _rebuild(b: DecodedBatch, idx: npt.NDArray[np.intp]) -> bytes:
    """A batch of the records ``idx`` of ``b``, with their offsets, timestamps and bytes unchanged."""
    pick = idx.tolist()
    ko, kd, kv = b.key_offsets.tolist(), b.key_data, b.key_valid
    vo, vd, vv = b.value_offsets.tolist(), b.value_data, b.value_valid
    keys = [bytes(kd[ko[i] : ko[i + 1]]) if kv[i] else None for i in pick]
    values = [bytes(vd[vo[i] : vo[i + 1]]) if vv[i] else None for i in pick]
    headers = b.headers()
    offsets = b.offsets[idx]
    h = b.header
    return encode_batch(
        int(offsets[0]),
        keys,
        values,
        b.timestamps[idx],
        [encode_headers(headers[i]) if headers[i] else b"" for i in pick],
        offset_deltas=offsets - offsets[0],
        compression=h.compression,
        log_append_time=bool(h.timestamp_type),
        producer_id=h.producer_id,
        producer_epoch=h.producer_epoch,
        base_sequence=h.base_sequence,
    )


def _swap(plog: PartitionLog, olds: list[Segment], data: bytes) -> bool:
    """Replace the consecutive segments ``olds`` by one segment holding ``data``, named by the first one's
    base offset, under the partition lock; False when they changed meanwhile (retention deleted one)."""
    directory = plog.directory
    base = olds[0].base_offset
    log_path = files.segment_path(directory, base, files.LOG)
    with plog._lock:
        plog._refresh()
        plog._state.lock()
        try:
            plog._sync_for_write()
            by_base = {s.base_offset: s for s in plog._segments[:-1]}
            current = [by_base.get(old.base_offset) for old in olds]
            if any(c is None or c.size != old.size for c, old in zip(current, olds, strict=True)):
                return False
            group = [c for c in current if c is not None]
            i = plog._segments.index(group[0])
            if not data:
                # nothing survives before the active segment: the segments go, as retention would delete them
                del plog._segments[i : i + len(group)]
                del plog._bases[i : i + len(group)]
                plog._epoch += 1
                plog._publish()
                for seg in group:
                    seg.delete_files()
                fs.FS.fsync_dir(directory)
                return True
            cleaned = log_path + ".cleaned"
            fd = fs.FS.open(cleaned, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                fs.FS.pwrite(fd, data, 0)
                fs.FS.fsync(fd)
            finally:
                fs.FS.close(fd)
            for seg in group:
                seg.close_fd()
                seg.drop_map()
                plog._cache.forget(seg)
            for suffix in (files.INDEX, files.TIMEINDEX):
                path = files.segment_path(directory, base, suffix)
                if os.path.exists(path):
                    fs.FS.unlink(path)
            fs.FS.fsync_dir(directory)
            fs.FS.rename(cleaned, log_path + files.SWAP)
            fs.FS.fsync_dir(directory)  # the commit point: recovery completes the swap from here
            for seg in group[1:]:
                seg.delete_files()  # its surviving records are in the swap
            fs.FS.rename(log_path + files.SWAP, log_path)
            fs.FS.fsync_dir(directory)
            fresh = Segment(directory, base, plog._cache, dense=False)
            fresh.size = len(data)
            scan = fresh.scan(0, len(data), verify=True, index_interval=plog.config.index_interval_bytes)
            if scan.error is not None:
                raise scan.error
            fresh.add_final_time_entry()
            fresh.rewrite_indexes()
            plog._segments[i : i + len(group)] = [fresh]
            plog._bases[i : i + len(group)] = [base]
            plog._epoch += 1
            plog._publish()
            return True
        finally:
            plog._state.unlock()
