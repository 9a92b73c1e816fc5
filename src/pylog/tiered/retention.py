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

The transaction decisions (:mod:`pylog.tiered.decisions`) are never dropped by this retention: any remaining
remote segment may need them; that module sweeps its own unnamed chunks by the same rule (pylog's key pattern,
and a range no upload can name any more).

A crash between 2 and 3 leaves unnamed objects, which step 4 of a later pass deletes. A reader that took an
older manifest a moment before may find a dropped object gone: it gets a
:class:`~pylog.errors.RemoteStorageError` and, reading the newest manifest, an offset out of range (as a
local reader does when retention deletes a segment under it).

Deleting a topic's remote data (:func:`delete_remote_topic`, run by ``Log.delete_topic`` after the local
delete, and by every tiering pass for a deletion not finished yet), in two phases:

1. For every partition of the topic with a manifest object, in partition order: publish a tombstone (a
   manifest version with ``"deleted": true`` and no segments, create-if-absent above the highest version
   present; see :mod:`pylog.tiered.manifest`) unless the newest version already is one. From then on every
   reader treats the partition as absent.
2. Then, per partition: delete the segment objects that the manifest versions below the tombstone name, then
   every other object under ``<topic>/<partition>/segments/`` with pylog's pattern (crashed uploads), then the
   manifest versions below the tombstone (objects named ``<version:020d>.json``). Only keys of pylog's
   patterns are deleted; anything else under the prefix is left. The tombstone stays, so a topic created
   again with the same name publishes its manifests above it.

A crash or a store failure anywhere leaves the topic deleted for readers as far as phase 1 got (the first
partition is tombstoned first, and :func:`~pylog.tiered.manifest.remote_topics` lists a topic by its first
partition) and is finished by running :func:`delete_remote_topic` again: the writer remembers the deletion in
``<root>/remote_deletions`` (:func:`add_pending_deletion`) before it deletes the topic locally and forgets it
only once the remote deletion finished; each tiering pass finishes the pending ones before it uploads, so a
topic created again with the same name never merges into the deleted one's manifests.

``remote_deletions`` (replaced two-phase: written to ``remote_deletions.tmp``, fsynced, renamed, directory
fsynced):

| part | bytes | content |
|---|---|---|
| header | 1 line | ``b"pylog-remote-deletions 1 <crc32c of the body, 8 lowercase hex digits>\\n"`` |
| body | rest | UTF-8 JSON object ``{"topics": {"<name>": {"id": "<topic id>" or null}}}`` |

``id`` is the deleted topic's id (given at creation, in the directory manifest): a record whose topic still
exists locally with that id belongs to a local delete that never committed (a crash before it) and is dropped
without deleting anything remote. A file whose header or CRC does not check raises
:class:`~pylog.errors.CorruptRecordError` (pending deletions are not silently forgotten).

Thread-safety: safe to run concurrently with uploads and with itself (create-if-absent decides each
version); a topic deletion must not run while a topic of the same name is tiered (the writer runs both under
its pass lock). Crash contract: every step is one atomic store operation; a crash at any point leaves a valid
newest manifest, and at most objects that step 4 (or a later topic deletion) removes later.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from typing import Any

from pylog import fs
from pylog.config import TopicConfig
from pylog.errors import CorruptRecordError, RemoteStorageError, UnsupportedFormatError
from pylog.framing import frame, unframe
from pylog.tiered.manifest import (
    PartitionManifest,
    RemoteSegment,
    decode_manifest,
    delete_versions,
    manifest_key,
    partition_prefix,
    publish_manifest,
    read_manifest,
)
from pylog.tiered.store import ObjectInfo, ObjectStore

__all__ = [
    "PENDING_FILE",
    "RemoteDeletionResult",
    "RemoteRetentionResult",
    "add_pending_deletion",
    "apply_remote_retention",
    "delete_remote_topic",
    "expired_prefix",
    "pending_deletions",
    "remove_pending_deletion",
    "sweep_orphans",
]

_PUBLISH_ATTEMPTS = 16
_OBJECT_NAME = re.compile(r"^(\d{20})-[0-9a-f]{16}\.(log|index|timeindex)$")
_MANIFEST_NAME = re.compile(r"^(\d{20})\.json$")
_PARTITION_MANIFEST = re.compile(r"^(0|[1-9]\d*)/manifest/\d{20}\.json$")
PENDING_FILE = "remote_deletions"
_PENDING_MAGIC = b"pylog-remote-deletions"
_PENDING_FORMAT = 1


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


# -- deleting a topic's remote data ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteDeletionResult:
    """What :func:`delete_remote_topic` did: the partitions it found manifests of, the tombstones it published
    (partitions), and every object it deleted."""

    topic: str
    partitions: tuple[int, ...]
    tombstoned: tuple[int, ...]
    deleted: tuple[str, ...]


def delete_remote_topic(store: ObjectStore, topic: str) -> RemoteDeletionResult:
    """Delete the remote data of the deleted topic ``topic``: tombstones first, then the objects (see the
    module docstring). Idempotent: running it again finishes what a crash or a store failure left."""
    prefix = f"{topic}/"
    partitions = sorted(
        {
            int(m.group(1))
            for info in store.list(prefix)
            if (m := _PARTITION_MANIFEST.match(info.key[len(prefix) :]))
        }
    )
    tombstones: dict[int, int] = {}
    published = []
    for p in partitions:  # phase 1, in partition order
        version, new = _tombstone(store, topic, p)
        tombstones[p] = version
        if new:
            published.append(p)
    deleted: list[str] = []
    for p in partitions:  # phase 2
        deleted.extend(_delete_below(store, topic, p, tombstones[p]))
    return RemoteDeletionResult(topic, tuple(partitions), tuple(published), tuple(deleted))


def _tombstone(store: ObjectStore, topic: str, partition: int) -> tuple[int, bool]:
    """Publish a tombstone for the partition unless its newest manifest is one: ``(its version, published)``."""
    current, highest = read_manifest(store, topic, partition, tombstones=True)
    for _ in range(_PUBLISH_ATTEMPTS):
        if current is not None and current.deleted:
            return current.version, False
        base = current or PartitionManifest(topic, partition, partition + 1, {})
        draft = replace(base, segments=(), version=0, deleted=True)
        done = publish_manifest(store, draft, highest + 1)
        if done is not None:
            return done.version, True
        current, highest = read_manifest(store, topic, partition, tombstones=True)
    raise RemoteStorageError(
        f"{topic}-{partition}: {_PUBLISH_ATTEMPTS} manifest versions were taken by other writers while "
        "publishing the tombstone of a deleted topic; retry",
        key=manifest_key(topic, partition, highest + 1),
    )


def _delete_below(store: ObjectStore, topic: str, partition: int, tombstone: int) -> list[str]:
    """Phase 2 for one partition: the objects older manifest versions name, the other pattern objects under
    ``segments/``, then the manifest versions below ``tombstone``; the keys deleted."""
    base = partition_prefix(topic, partition)
    listed = store.list(base)
    old_versions: list[tuple[int, ObjectInfo]] = []
    for info in listed:
        rest = info.key[len(base) :]
        if rest.startswith("manifest/"):
            m = _MANIFEST_NAME.match(rest[len("manifest/") :])
            if m and int(m.group(1)) < tombstone:
                old_versions.append((int(m.group(1)), info))
    old_manifests = [info.key for _, info in old_versions]
    segments = [info.key for info in listed if _is_segment_object(base, info.key)]
    named: list[str] = []
    for key in old_manifests:
        try:
            manifest = decode_manifest(store.get(key))
        except ValueError:
            continue  # torn or foreign: what it would name is swept by the pattern below
        except UnsupportedFormatError:
            continue  # a newer pylog's: only pattern objects are deleted below
        except RemoteStorageError:
            continue  # gone meanwhile (a concurrent deletion of the same topic)
        named.extend(k for seg in manifest.segments for k in _keys(seg) if _is_segment_object(base, k))
    present = set(segments)
    objects = [key for key in dict.fromkeys(named + segments) if key in present]  # named first
    store.delete_many(objects)
    # last: until here a crash leaves them to find what they name; each is fenced before it goes, so its
    # version number is never published again (see pylog.tiered.manifest)
    delete_versions(store, f"{base}manifest/", old_versions)
    return objects + old_manifests


def _is_segment_object(base: str, key: str) -> bool:
    folder = f"{base}segments/"
    return key.startswith(folder) and _OBJECT_NAME.match(key[len(folder) :]) is not None


def pending_deletions(root: str) -> dict[str, str | None]:
    """``{topic: topic id}`` of the topic deletions whose remote part is not finished (see the module
    docstring); empty when the log directory ``root`` has no ``remote_deletions`` file."""
    path = os.path.join(root, PENDING_FILE)
    try:
        raw = fs.FS.read_file(path)
    except FileNotFoundError:
        return {}
    try:
        body = unframe(raw, _PENDING_MAGIC, _PENDING_FORMAT, f"pending remote deletions record {path}")
        topics: dict[str, Any] = json.loads(body)["topics"]
        return {str(name): (None if meta["id"] is None else str(meta["id"])) for name, meta in topics.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptRecordError(
            f"{path} does not check ({exc}): remove it to forget the pending remote deletions it holds",
            path=path,
        ) from exc


def add_pending_deletion(root: str, topic: str, topic_id: str | None) -> None:
    """Remember that the remote data of ``topic`` (id ``topic_id``) is to be deleted (two-phase write)."""
    pending = pending_deletions(root)
    pending[topic] = topic_id
    _write_pending(root, pending)


def remove_pending_deletion(root: str, topic: str) -> None:
    """Forget the pending deletion of ``topic`` (its remote part finished, or its local part never happened);
    the file is removed when nothing is left in it."""
    pending = pending_deletions(root)
    if pending.pop(topic, False) is False:
        return
    if pending:
        _write_pending(root, pending)
        return
    fs.FS.unlink(os.path.join(root, PENDING_FILE))
    fs.FS.fsync_dir(root)


def _write_pending(root: str, pending: dict[str, str | None]) -> None:
    body = json.dumps({"topics": {name: {"id": tid} for name, tid in sorted(pending.items())}}).encode()
    fs.atomic_write(os.path.join(root, PENDING_FILE), frame(_PENDING_MAGIC, _PENDING_FORMAT, body))
