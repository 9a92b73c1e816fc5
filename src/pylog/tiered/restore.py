"""Rebuilding a writable log directory from the object store (``pylog restore URL DIR``).

Steps (:func:`restore`):

1. Refuse a target that exists and is not an empty directory (:class:`~pylog.errors.NotALogDirectoryError`).
2. Read the newest valid manifest of every remote partition (:mod:`pylog.tiered.manifest`). A store that
   holds no pylog log at all (no manifest version or fence of any partition or of the transaction decisions:
   a mistyped URL or prefix) is a :class:`~pylog.errors.NotALogDirectoryError`, unless ``allow_empty``.
3. In a new staging directory beside the target (``.<name>.restore-<random>``), create every topic with the
   config and partition count its manifests name, then download each named segment and its indexes. Every
   object's size and CRC-32C must equal what the manifest names (:class:`~pylog.errors.CorruptRecordError`
   otherwise; a missing object is a :class:`~pylog.errors.RemoteStorageError`). After the last restored
   segment an empty active segment is created, so the restored segments stay sealed.
4. Open the staging directory as a log and validate everything (``Log.verify()``: every batch's CRC, bounds
   and offsets, every index); each partition must end exactly where its manifest says.
5. Restore the transaction decisions (:mod:`pylog.tiered.decisions`): the chunks the newest decisions
   manifest names (each checked against its size and CRC-32C) become ``__transactions/decisions.log``, so a
   read_committed reader of the restored log sees what one of the source log saw when they were uploaded; the
   producers state uploaded with them becomes the ``producers`` file, made safe for new producers: its
   ``next_pid`` is raised above every producer id in the decisions and in the restored batches, and each
   transactional id's transaction counter above every transaction number its producer id has in them, so no
   new producer or transaction of the restored log reuses an id of the source (a reused
   ``(producer_id, epoch, txn)`` would inherit an old decision). A transaction of the restored batches with no
   decision that no restored transactional id holds open (its decision was not uploaded yet, or its producer
   started after the producers state was) can never be decided by the restored log: it is aborted, as its
   timeout would have. A store with no decisions manifest (tiered by a pylog that did not upload decisions)
   leaves its transactions undecided, with a warning: aborting them would lose commits. One the producers state holds open stays open, and is aborted at its timeout or when its
   transactional id's next producer starts, as in the source log.
6. Rename the staging directory to the target and fsync the parent.

Nothing is half-restored: on any error the staging directory (created by this call, so provably pylog's) is
removed and the target is left as it was. A process killed mid-restore leaves only the hidden staging
directory, which can be removed by hand.

Thread-safety: not meant to run twice on one target at once (the final rename fails for the second).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pylog import fs
from pylog.clock import Clock
from pylog.config import TopicConfig
from pylog.directory import LogDirectory
from pylog.errors import ConfigError, CorruptRecordError, NotALogDirectoryError
from pylog.partition import files
from pylog.partition.reader import walk_headers
from pylog.record import ATTR_CONTROL, ATTR_TRANSACTIONAL
from pylog.structs import TopicPartition
from pylog.tiered import decisions
from pylog.tiered.manifest import (
    PartitionManifest,
    RemoteSegment,
    holds_log,
    read_manifest,
    remote_partitions,
)
from pylog.tiered.store import ObjectStore, check_store, local_path
from pylog.transactions import OPEN, TxnDecisions, TxnLog

__all__ = ["RestoredPartition", "restore"]

_log = logging.getLogger("pylog.tiered")


@dataclass(frozen=True)
class RestoredPartition:
    """A restored partition's offsets: ``log_end_offset - 1`` is its last offset (none if they are equal)."""

    log_start_offset: int
    log_end_offset: int
    segments: int


def restore(
    store: ObjectStore | str,
    target: str | os.PathLike[str],
    *,
    clock: Clock | None = None,
    remote_storage_options: dict[str, Any] | None = None,
    allow_empty: bool = False,
    **options: Any,
) -> dict[TopicPartition, RestoredPartition]:
    """Rebuild a log directory at ``target`` from ``store`` (an :class:`ObjectStore` or a URL, with
    ``remote_storage_options`` for it, as :func:`pylog.open` takes them); returns the offsets of every
    restored partition. A store holding no pylog log at all (no manifest, not even of a deleted topic: a
    mistyped URL or prefix) is a :class:`~pylog.errors.NotALogDirectoryError` and nothing is created, unless
    ``allow_empty`` (an empty log directory is then made). Store options given as keyword arguments (the
    former way) still work, with a :class:`DeprecationWarning`."""
    if options:
        warnings.warn(
            "restore(url, target, **options) is deprecated: pass remote_storage_options={...}, as to pylog.open",
            DeprecationWarning,
            stacklevel=2,
        )
        if remote_storage_options is not None:
            raise ConfigError("give the store options once: remote_storage_options={...}")
        remote_storage_options = options
    if isinstance(store, str):
        root = local_path(check_store(store, remote_storage_options))
        if root is not None and not os.path.isdir(root) and not allow_empty:
            raise NotALogDirectoryError(
                f"{store} holds no pylog log ({root} does not exist): check the URL; nothing was restored",
                path=store,
            )
        store = ObjectStore(store, **(remote_storage_options or {}))
    elif remote_storage_options:
        raise ConfigError("remote_storage_options are for a URL; an ObjectStore is opened with its own")
    target = os.path.abspath(os.fspath(target))
    _check_target(target)
    manifests = _manifests(store)
    if not manifests and not allow_empty and not holds_log(store):
        raise NotALogDirectoryError(
            f"{store.url} holds no pylog log (no remote manifest, not even of a deleted topic): check the URL "
            "and its prefix; nothing was restored (allow_empty=True, or pylog restore --allow-empty, makes an "
            "empty log)",
            path=store.url,
        )
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.restore-", dir=parent)
    try:
        os.chmod(staging, 0o755)  # mkdtemp's 0700 would make the restored log unreadable to other users
        _create_topics(staging, manifests, clock)
        for manifest in manifests.values():
            _download_partition(store, staging, manifest)
        report = _validate(staging, manifests, clock)
        _restore_decisions(store, staging, manifests)
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


def _restore_decisions(
    store: ObjectStore, root: str, manifests: dict[TopicPartition, PartitionManifest]
) -> None:
    """Step 5 of the module docstring: the transaction directory of the restored log at ``root``."""
    manifest, _ = decisions.read_manifest(store)
    data = decisions.read_decisions(store, manifest) if manifest is not None else b""
    state: dict[str, Any] = json.loads(json.dumps(manifest.producers)) if manifest is not None else {}
    state.setdefault("next_pid", 0)
    state.setdefault("ids", {})
    known = TxnDecisions(root)  # nothing at root yet: it holds what apply() gives it
    known.apply(data, 0, decisions.PREFIX, whole=True)
    decided, epochs = known.decided()
    triples = set(decided)
    pids = set(epochs) | {pid for pid, _, _ in decided}
    for tp, m in manifests.items():
        for pid, epoch, txn, transactional in _producers_of(root, tp, m):
            pids.add(pid)
            if transactional:
                triples.add((pid, epoch, txn))
    top_txn: dict[int, int] = {}
    for pid, _, txn in triples:
        top_txn[pid] = max(top_txn.get(pid, 0), txn)
    state["next_pid"] = max([int(state["next_pid"]), *(pid + 1 for pid in pids)])
    held = set()
    for entry in state["ids"].values():
        entry["txn"] = max(int(entry["txn"]), top_txn.get(int(entry["pid"]), 0))
        if entry["open"] is not None:
            held.add((int(entry["pid"]), int(entry["epoch"]), int(entry["open"]["txn"])))
    undecided = sorted(t for t in triples if t not in held and known.status(*t) == OPEN)
    aborts = undecided if manifest is not None else []
    if manifest is None and undecided:
        _log.warning(
            "the object store holds transactional batches but no transaction decisions (tiered by a pylog "
            "that did not upload them): the restored log has them undecided, so read_committed readers stop "
            "at the first; tier the source log again with this pylog before restoring to keep their outcomes"
        )
    if not data and not aborts and not pids and not state["ids"]:
        return  # the source never handed out a producer id: no transaction directory, as there
    txns = TxnLog(root)
    try:
        txns.install(state, data, aborts)
    finally:
        txns.close()


def _producers_of(
    root: str, tp: TopicPartition, manifest: PartitionManifest
) -> Iterator[tuple[int, int, int, bool]]:
    """``(producer_id, epoch, base_sequence, transactional)`` of every batch with a producer id in the
    restored segments of ``tp`` (verified before this is called)."""
    directory = files.partition_dir(root, tp.topic, tp.partition)
    for seg in manifest.segments:
        path = files.segment_path(directory, seg.base_offset, files.LOG)
        with open(path, "rb") as f:
            buf = f.read()
        for _, h in walk_headers(buf, 0, len(buf), path):
            if h.producer_id >= 0:
                marked = bool(h.attributes & ATTR_TRANSACTIONAL) and not h.attributes & ATTR_CONTROL
                yield h.producer_id, h.producer_epoch, h.base_sequence, marked
