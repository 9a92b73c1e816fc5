"""Rebuilding a writable log directory from the object store (``pylog restore URL DIR``).

Steps (:func:`restore`):

1. Refuse a target that exists and is not an empty directory (:class:`~pylog.errors.NotALogDirectoryError`).
2. Read the newest valid manifest of every remote partition (:mod:`pylog.tiered.manifest`).
3. In a new staging directory beside the target (``.<name>.restore-<random>``), create every topic with the
   config and partition count its manifests name, then download each named segment and its indexes. Every
   object's size and CRC-32C must equal what the manifest names (:class:`~pylog.errors.CorruptRecordError`
   otherwise; a missing object is a :class:`~pylog.errors.RemoteStorageError`). After the last restored
   segment an empty active segment is created, so the restored segments stay sealed.
4. Open the staging directory as a log and validate everything (``Log.verify()``: every batch's CRC, bounds
   and offsets, every index); each partition must end exactly where its manifest says.
5. Rename the staging directory to the target and fsync the parent.

Nothing is half-restored: on any error the staging directory (created by this call, so provably pylog's) is
removed and the target is left as it was. A process killed mid-restore leaves only the hidden staging
directory, which can be removed by hand.

Thread-safety: not meant to run twice on one target at once (the final rename fails for the second).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from pylog import fs
from pylog.clock import Clock
from pylog.config import TopicConfig
from pylog.directory import LogDirectory
from pylog.errors import CorruptRecordError, NotALogDirectoryError
from pylog.partition import files
from pylog.structs import TopicPartition
from pylog.tiered.manifest import PartitionManifest, RemoteSegment, read_manifest, remote_partitions
from pylog.tiered.store import ObjectStore

__all__ = ["RestoredPartition", "restore"]


@dataclass(frozen=True)
class RestoredPartition:
    """A restored partition's offsets: ``log_end_offset - 1`` is its last offset (none if they are equal)."""

    log_start_offset: int
    log_end_offset: int
    segments: int


def restore(
    store: ObjectStore | str, target: str | os.PathLike[str], *, clock: Clock | None = None, **options: Any
) -> dict[TopicPartition, RestoredPartition]:
    """Rebuild a log directory at ``target`` from ``store`` (an :class:`ObjectStore` or a URL, with
    ``options`` for it); returns the offsets of every restored partition."""
    if isinstance(store, str):
        store = ObjectStore(store, **options)
    target = os.path.abspath(os.fspath(target))
    _check_target(target)
    manifests = _manifests(store)
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.restore-", dir=parent)
    try:
        os.chmod(staging, 0o755)  # mkdtemp's 0700 would make the restored log unreadable to other users
        _create_topics(staging, manifests, clock)
        for manifest in manifests.values():
            _download_partition(store, staging, manifest)
        report = _validate(staging, manifests, clock)
        _check_target(target)
        if os.path.isdir(target):
            os.rmdir(target)  # empty, checked just above
        os.rename(staging, target)
        fs.FS.fsync_dir(parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return report


def _check_target(target: str) -> None:
    if os.path.lexists(target) and (not os.path.isdir(target) or os.listdir(target)):
        raise NotALogDirectoryError(f"restore target {target} exists and is not an empty directory")


def _manifests(store: ObjectStore) -> dict[TopicPartition, PartitionManifest]:
    out: dict[TopicPartition, PartitionManifest] = {}
    for topic, partitions in remote_partitions(store).items():
        for p in partitions:
            manifest, _ = read_manifest(store, topic, p)
            if manifest is not None:
                out[TopicPartition(topic, p)] = manifest
    return out


def _create_topics(
    root: str, manifests: dict[TopicPartition, PartitionManifest], clock: Clock | None
) -> None:
    topics: dict[str, PartitionManifest] = {}
    counts: dict[str, int] = {}
    for tp, manifest in manifests.items():
        newest = topics.get(tp.topic)
        if newest is None or tp.partition == 0:
            topics[tp.topic] = manifest  # partition 0's config when present (every manifest carries one)
        counts[tp.topic] = max(counts.get(tp.topic, 0), manifest.partitions, tp.partition + 1)
    with LogDirectory(root, clock=clock) as log:
        for name, manifest in sorted(topics.items()):
            config = TopicConfig.from_dict(manifest.config)
            log.create_topic(name, counts[name], **config.to_dict())


def _download_partition(store: ObjectStore, root: str, manifest: PartitionManifest) -> None:
    directory = files.partition_dir(root, manifest.topic, manifest.partition)
    for seg in manifest.segments:
        _download_segment(store, directory, seg)
    if manifest.segments:
        path = files.segment_path(directory, manifest.segments[-1].next_offset, files.LOG)
        fd = fs.FS.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        fs.FS.fsync(fd)
        fs.FS.close(fd)
    fs.FS.fsync_dir(directory)


def _download_segment(store: ObjectStore, directory: str, seg: RemoteSegment) -> None:
    parts = [(files.LOG, seg.key, seg.size, seg.crc32c)]
    for suffix, remote in ((files.INDEX, seg.index), (files.TIMEINDEX, seg.timeindex)):
        if remote is not None:
            parts.append((suffix, remote.key, remote.size, remote.crc32c))
    for suffix, key, size, crc in parts:
        path = files.segment_path(directory, seg.base_offset, suffix)
        got = store.download(key, path)
        if got != (size, crc):
            raise CorruptRecordError(
                f"remote object {key} holds {got[0]} bytes with crc32c {got[1]:08x}; its manifest names "
                f"{size} bytes with crc32c {crc:08x}: nothing was restored",
                path=key,
            )


def _validate(
    root: str, manifests: dict[TopicPartition, PartitionManifest], clock: Clock | None
) -> dict[TopicPartition, RestoredPartition]:
    report: dict[TopicPartition, RestoredPartition] = {}
    with LogDirectory(root, clock=clock) as log:
        problems = log.verify()
        if problems:
            raise CorruptRecordError(f"the restored log does not verify, nothing was restored: {problems}")
        for name in log.topics():
            topic = log.topic(name)
            for p in range(topic.num_partitions):
                plog = topic.partition(p)
                start, end = plog.log_start_offset, plog.log_end_offset
                manifest = manifests.get(TopicPartition(name, p))
                expected = manifest.log_end_offset if manifest else None
                if expected is not None and end != expected:
                    raise CorruptRecordError(
                        f"restored {name}-{p} ends at offset {end}, its manifest at {expected}: nothing was restored"
                    )
                report[TopicPartition(name, p)] = RestoredPartition(
                    start, end, len(manifest.segments) if manifest else 0
                )
    return report
