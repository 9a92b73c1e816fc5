"""Copying a partition's sealed segments to the object store, then publishing a manifest that names them.

For one partition (:func:`tier_partition`):

1. Read the current remote manifest (:func:`~pylog.tiered.manifest.read_manifest`).
2. Take the partition's sealed segments (every segment but the active one) that the manifest does not name.
   A sealed segment it names must have the size it names (else the local log diverged from the remote one:
   :class:`~pylog.errors.IllegalStateError`, nothing uploaded).
3. Upload each: the ``.log`` file's published bytes, then its ``.index`` and ``.timeindex``, to fresh keys
   (create-if-absent); then read every object back and compare size and CRC-32C with what was read locally.
   A segment deleted locally meanwhile (retention) is skipped.
4. Publish a new manifest version naming the old segments plus the new ones. The remote segments stay
   contiguous: if a local segment vanished before it was uploaded, the manifest keeps only the contiguous
   run that ends with the newest segment (the remote log start moves forward, as retention moved the local
   one). If another writer published the version first, read its manifest and merge again.

Idempotent: a second run finds every sealed segment named and uploads nothing. Nothing is deleted here,
locally or remotely: retention does that (:mod:`pylog.tiered.background` runs it after each upload, with the
offsets the published manifest covers, so a local segment goes only once a manifest names it;
:mod:`pylog.tiered.retention` drops expired remote segments and sweeps the unnamed objects of an upload that
crashed before its manifest).

Thread-safety: one call per partition at a time is the intended use; concurrent calls (threads or processes)
are safe, each publishing its own version, at worst uploading a segment twice (one copy stays unnamed).
Crash contract: a crash at any point leaves the previous manifest authoritative; a re-run completes.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from pylog.errors import CorruptRecordError, IllegalStateError, RemoteStorageError
from pylog.partition.log import PartitionLog
from pylog.partition.segment import Segment
from pylog.tiered.manifest import (
    PartitionManifest,
    RemoteFile,
    RemoteSegment,
    publish_manifest,
    read_manifest,
    segment_key,
)
from pylog.tiered.store import ObjectStore

__all__ = ["TierResult", "tier_partition", "upload_segment"]

_PUBLISH_ATTEMPTS = 16  # concurrent publishers: each lost race means another one made progress


@dataclass(frozen=True)
class TierResult:
    """What :func:`tier_partition` did: the segments it uploaded and the manifest now published."""

    topic: str
    partition: int
    uploaded: tuple[RemoteSegment, ...]
    manifest: PartitionManifest


def tier_partition(store: ObjectStore, plog: PartitionLog, partitions: int) -> TierResult:
    """Upload ``plog``'s sealed segments that the remote manifest does not name, then publish a manifest."""
    current, highest = read_manifest(store, plog.topic, plog.partition)
    named = {s.base_offset: s for s in current.segments} if current else {}
    sealed = plog.segments[:-1]
    _check_not_diverged(plog, sealed, named)
    uploaded = []
    for seg in sealed:
        if seg.base_offset in named or (current and seg.base_offset < (current.log_end_offset or 0)):
            continue
        remote = upload_segment(store, plog.topic, plog.partition, seg)
        if remote is not None:
            uploaded.append(remote)
    config = plog.config.to_dict()
    for _ in range(_PUBLISH_ATTEMPTS):
        base = current.segments if current else ()
        segments = _merge(base, uploaded)
        unchanged = current is not None and current.segments == segments
        if unchanged and current is not None and (current.config, current.partitions) == (config, partitions):
            # nothing left to publish; after a lost race this upload's own segments may be what the winner
            # names (a retried manifest put whose first attempt was written but whose answer was lost)
            return TierResult(plog.topic, plog.partition, _named(uploaded, segments), current)
        draft = PartitionManifest(plog.topic, plog.partition, partitions, config, segments)
        published = publish_manifest(store, draft, highest + 1)
        if published is not None:
            return TierResult(plog.topic, plog.partition, _named(uploaded, segments), published)
        current, highest = read_manifest(store, plog.topic, plog.partition)  # lost the race: merge again
    raise RemoteStorageError(
        f"{plog.topic}-{plog.partition}: {_PUBLISH_ATTEMPTS} manifest versions were taken by other writers "
        "while publishing; retry",
        key=f"{plog.topic}/{plog.partition}/manifest/",
    )


def upload_segment(store: ObjectStore, topic: str, partition: int, seg: Segment) -> RemoteSegment | None:
    """Upload one sealed segment and its indexes to fresh keys and verify them; None if its ``.log`` file is
    gone (deleted by retention meanwhile). Named by no manifest until the caller publishes one."""
    upload_id = secrets.token_hex(8)
    key = segment_key(topic, partition, seg.base_offset, upload_id, ".log")
    try:
        size, crc = store.put_file(key, seg.path, seg.size)
        _verify(store, key, size, crc)
        index = _upload_index(
            store, seg.index_path, segment_key(topic, partition, seg.base_offset, upload_id, ".index")
        )
        timeindex = _upload_index(
            store, seg.timeindex_path, segment_key(topic, partition, seg.base_offset, upload_id, ".timeindex")
        )
    except FileNotFoundError:
        return None  # deleted by retention meanwhile: what was uploaded stays unnamed
    return RemoteSegment(
        seg.base_offset, seg.next_offset, size, seg.max_timestamp, crc, key, index, timeindex
    )


def _upload_index(store: ObjectStore, path: str, key: str) -> RemoteFile | None:
    """Upload an index file as it is now (restore sanity-checks it and rebuilds it if needed); None if the
    segment has no such file (it is rebuilt from the log on restore)."""
    try:
        length = os.stat(path).st_size
    except FileNotFoundError:
        return None
    size, crc = store.put_file(key, path, length)
    _verify(store, key, size, crc)
    return RemoteFile(key, size, crc)


def _verify(store: ObjectStore, key: str, size: int, crc: int) -> None:
    """Read ``key`` back: its size and CRC-32C must be what was sent."""
    got_size, got_crc = store.checksum(key)
    if (got_size, got_crc) != (size, crc):
        raise CorruptRecordError(
            f"uploaded object {key} reads back as {got_size} bytes crc32c {got_crc:08x}, "
            f"sent {size} bytes crc32c {crc:08x}",
            path=key,
        )


def _check_not_diverged(
    plog: PartitionLog, sealed: Sequence[Segment], named: dict[int, RemoteSegment]
) -> None:
    for seg in sealed:
        remote = named.get(seg.base_offset)
        if remote is not None and (remote.size, remote.next_offset) != (seg.size, seg.next_offset):
            raise IllegalStateError(
                f"{plog.topic}-{plog.partition}: local segment {seg.base_offset} ({seg.size} bytes, next offset "
                f"{seg.next_offset}) differs from the remote copy the manifest names ({remote.size} bytes, next "
                f"offset {remote.next_offset}); the local log was truncated or rewritten after tiering"
            )


def _merge(named: Sequence[RemoteSegment], new: Sequence[RemoteSegment]) -> tuple[RemoteSegment, ...]:
    """``named`` plus the ``new`` segments it does not cover, as the contiguous run ending at the newest."""
    end = named[-1].next_offset if named else -1
    merged = list(named) + [s for s in new if s.base_offset >= end]
    merged.sort(key=lambda s: s.base_offset)
    start = len(merged) - 1
    while start > 0 and merged[start - 1].next_offset == merged[start].base_offset:
        start -= 1
    return tuple(merged[max(start, 0) :])


def _named(uploaded: Sequence[RemoteSegment], segments: Sequence[RemoteSegment]) -> tuple[RemoteSegment, ...]:
    keys = {s.key for s in segments}
    return tuple(s for s in uploaded if s.key in keys)
