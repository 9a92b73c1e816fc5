"""Whole-log retention of a tiered partition: dropping expired remote segments, then deleting their objects.

``retention_ms`` and ``retention_bytes`` apply to the whole log of a ``remote_storage_enable`` topic, remote
segments included (Kafka's rule); the local copies follow ``local_retention_ms`` / ``local_retention_bytes``
(:meth:`PartitionLog.apply_retention <pylog.partition.log.PartitionLog.apply_retention>`). For one partition
(:func:`apply_remote_retention`):

1. Read the newest manifest. Its oldest segments are expired while each is older than ``retention_ms`` (its
   largest timestamp) or the whole log without it (remote bytes plus the local bytes above the remote end)
   still holds ``retention_bytes``, and its local copy is gone (it lies below the local log start: the local
   retention, never longer than the whole-log one, deletes it first, so a remote segment is never dropped
   while a local copy could be uploaded again).
2. Publish a new manifest version without them (create-if-absent; a lost race reads the winner and decides
   again). From then on no reader that takes the newest manifest uses them.
3. Only then delete their objects (``.log``, ``.index``, ``.timeindex``): objects a manifest named, so
   objects pylog created.
4. Sweep objects of crashed uploads and of crashed deletions: an object under ``<topic>/<partition>/segments/``
   whose key has pylog's pattern (``<base:020d>-<16 hex digits>.log|.index|.timeindex``, the id pylog draws
   per upload) that the newest manifest does not name, and whose base offset is below that manifest's end
   offset. The uploader only ever adds segments at or above the end of the manifest it merges into (and the
   end never moves back while a manifest names a segment), so no upload can name such an object later: it is
   garbage pylog made. Anything else under the prefix is left alone.

A crash between 2 and 3 leaves unnamed objects, which step 4 of a later pass deletes. A reader that took an
older manifest a moment before may find a dropped object gone: it gets a
:class:`~pylog.errors.RemoteStorageError` and, reading the newest manifest, an offset out of range (as a
local reader does when retention deletes a segment under it).

Thread-safety: safe to run concurrently with uploads and with itself (create-if-absent decides each
version). Crash contract: every step is one atomic store operation; a crash at any point leaves a valid newest
manifest, and at most objects that step 4 removes later.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pylog.config import TopicConfig
from pylog.errors import RemoteStorageError
from pylog.tiered.manifest import (
    PartitionManifest,
    RemoteSegment,
    partition_prefix,
    publish_manifest,
    read_manifest,
)
from pylog.tiered.store import ObjectStore

__all__ = ["RemoteRetentionResult", "apply_remote_retention", "expired_prefix", "sweep_orphans"]

_PUBLISH_ATTEMPTS = 16
_OBJECT_NAME = re.compile(r"^(\d{20})-[0-9a-f]{16}\.(log|index|timeindex)$")


@dataclass(frozen=True)
class RemoteRetentionResult:
    """What :func:`apply_remote_retention` did: the segments the new manifest dropped, every object deleted
    (theirs and swept orphans), and the newest manifest (None when the partition has none)."""

    topic: str
    partition: int
    dropped: tuple[RemoteSegment, ...]
    deleted: tuple[str, ...]
    manifest: PartitionManifest | None


def expired_prefix(
    segments: tuple[RemoteSegment, ...], config: TopicConfig, now: int, *, local_start: int, local_bytes: int
) -> int:
    """How many of the oldest ``segments`` the whole-log retention drops (see the module docstring).
    ``local_bytes``: bytes of the local log above the remote end (the rest of the whole log)."""
    if not config.deletes or (config.retention_ms < 0 and config.retention_bytes < 0):
        return 0
    total = sum(s.size for s in segments) + local_bytes
    count = 0
    for seg in segments:
        if seg.next_offset > local_start:
            break  # its local copy is still there: the local retention goes first
        by_time = config.retention_ms >= 0 and now - seg.max_timestamp > config.retention_ms
        by_size = config.retention_bytes >= 0 and total - seg.size >= config.retention_bytes
        if not (by_time or by_size):
            break
        total -= seg.size
        count += 1
    return count


def apply_remote_retention(
    store: ObjectStore,
    topic: str,
    partition: int,
    config: TopicConfig,
    now: int,
    *,
    local_start: int,
    local_bytes: int,
) -> RemoteRetentionResult:
    """Drop the expired remote segments of one partition, then delete their objects and sweep orphans.
    ``local_start`` is the local log start offset, ``local_bytes`` the bytes of the local log at or above
    the remote end offset (both of the partition as it is now)."""
    current, highest = read_manifest(store, topic, partition)
    dropped: tuple[RemoteSegment, ...] = ()
    for _ in range(_PUBLISH_ATTEMPTS):
        if current is None:
            return RemoteRetentionResult(topic, partition, (), (), None)
        count = expired_prefix(
            current.segments, config, now, local_start=local_start, local_bytes=local_bytes
        )
        if count == 0:
            break
        draft = PartitionManifest(
            topic, partition, current.partitions, current.config, current.segments[count:]
        )
        published = publish_manifest(store, draft, highest + 1)
        if published is not None:
            dropped, current = current.segments[:count], published
            break
        current, highest = read_manifest(store, topic, partition)  # lost the race: decide again
    else:
        raise RemoteStorageError(
            f"{topic}-{partition}: {_PUBLISH_ATTEMPTS} manifest versions were taken by other writers while "
            "dropping expired remote segments; retry",
            key=f"{topic}/{partition}/manifest/",
        )
    deleted = []
    for seg in dropped:  # named by the manifest before: pylog's own objects
        for key in _keys(seg):
            store.delete(key)
            deleted.append(key)
    deleted.extend(sweep_orphans(store, current))
    return RemoteRetentionResult(topic, partition, dropped, tuple(deleted), current)


def sweep_orphans(store: ObjectStore, manifest: PartitionManifest) -> list[str]:
    """Delete the segment objects of ``manifest``'s partition that no upload can name any more (see the
    module docstring, step 4); the keys deleted. Nothing is deleted while the manifest names no segment."""
    end = manifest.log_end_offset
    if end is None:
        return []
    named = {key for seg in manifest.segments for key in _keys(seg)}
    prefix = f"{partition_prefix(manifest.topic, manifest.partition)}segments/"
    deleted = []
    for info in store.list(prefix):
        m = _OBJECT_NAME.match(info.key[len(prefix) :])
        if m is None or info.key in named or int(m.group(1)) >= end:
            continue
        store.delete(info.key)
        deleted.append(info.key)
    return deleted


def _keys(seg: RemoteSegment) -> list[str]:
    keys = [seg.key]
    keys.extend(f.key for f in (seg.index, seg.timeindex) if f is not None)
    return keys
