"""A read-only view of a log directory, for Spark readers.

Readers on Spark executors never open the log with :func:`pylog.open`: that takes locks, may run recovery and
writes marker files. Instead they read what writers publish, the same way a :class:`~pylog.Log` in another
process does, but without creating or changing any file:

- the manifest (topics and partition counts), checked by its CRC (:class:`LogView`);
- each partition through :class:`pylog.partition.reader.PartitionReader` (here ``PartitionView``), the one
  reader of a partition directory: the published state read with the seqlock protocol, the segment files
  listed in the directory, the ``.index`` file only as a hint for where to start walking batch headers.

A :class:`PartitionView` is a snapshot: records appended after it was taken are not visible through it, and a
segment deleted by retention after it was taken is still readable if it was already mapped. It holds only
paths and numbers and opens files when asked for a segment's bytes, so an executor builds (or receives) one
from the directory path alone.

A log in an object store (an ``s3://``, ``file://``, ... URL instead of a directory: tiered storage) is
viewed through :mod:`pylog.spark.remote`: :class:`LogView` then lists the topics from the remote manifests and
returns :class:`~pylog.spark.remote.RemotePartitionView` views, each pinned to its partition's newest manifest.

A log directory that records a ``remote_storage`` URL (:mod:`pylog.tiered.location`) has its topics with
``remote_storage_enable`` viewed as pylog's consumer of that log reads them: each partition's view
(:class:`~pylog.spark.remote.TieredPartitionView`) holds its local segments and, below them, the remote
segments of its newest manifest, so "earliest", offsets and timestamps resolve into the object store too.

Thread-safety: a view is immutable once built; build one per thread or task.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pylog.directory import decode_manifest as _decode_manifest
from pylog.errors import IllegalStateError, ReadOnlyLogError, UnknownPartitionError, UnknownTopicError
from pylog.partition import files
from pylog.partition.reader import PartitionReader, SegmentFile, decode_checked, walk_headers
from pylog.spark.remote import RemoteLog, RemotePartitionView, TieredPartitionView, is_url
from pylog.tiered.location import read_remote_storage

__all__ = [
    "LogView",
    "PartitionView",
    "SegmentView",
    "check_log_dir",
    "decode_checked",
    "open_partition",
    "walk",
]

#: The names the Spark modules use for the partition reader's types and its batch-header walk.
PartitionView = PartitionReader
SegmentView = SegmentFile
walk = walk_headers


def open_partition(path: str, topic: str, partition: int) -> PartitionView:
    """The reader of one partition of the log at ``path`` (as :func:`check_log_dir` resolved it). Every Spark
    read of a log directory opens partitions here (planning through :meth:`LogView.partition`, executors
    directly); a log in an object store is read through :mod:`pylog.spark.remote` instead."""
    return PartitionView(files.partition_dir(path, topic, partition), topic, partition)


def check_log_dir(path: str) -> str:
    """The absolute path of an existing pylog directory; raises FileNotFoundError with a readable message."""
    if not path:
        raise FileNotFoundError("no log directory given: use .load(path) or .option('path', ...)")
    if is_url(path):
        raise ReadOnlyLogError(
            f"{path} is an object-store URL: a log there is read-only (spark.read and readStream read it); "
            "write to the log directory of the writing log"
        )
    full = os.path.abspath(path)
    if not os.path.isdir(full):
        raise FileNotFoundError(f"pylog directory {full} does not exist (or is not visible on this machine)")
    if not os.path.exists(os.path.join(full, "manifest")):
        raise FileNotFoundError(f"{full} is not a pylog directory: it has no manifest")
    return full


class LogView:
    """Topics and partition counts of a log directory, from its manifest; or of a log in an object store
    (``path`` a URL, ``remote_options`` the store's options), from its remote manifests.

    A log directory recording a ``remote_storage`` URL (``tiered_url``) has the partitions of its topics
    with ``remote_storage_enable`` (``tiered_topics``) viewed with their remote segments, read from that
    store with ``remote_options``; set ``tiered_url`` to None for views of the local segments only."""

    def __init__(self, path: str, remote_options: Mapping[str, Any] | None = None) -> None:
        self.remote: RemoteLog | None = None
        self.remote_options = dict(remote_options or {})
        self.tiered_url: str | None = None
        self.tiered_topics: frozenset[str] = frozenset()
        #: topics whose ``cleanup_policy`` includes ``compact`` (their segments' offsets may have gaps)
        self.compacted_topics: frozenset[str] = frozenset()
        self._tiered: RemoteLog | None = None
        if is_url(path):
            self.path = path
            self.remote = RemoteLog(path, self.remote_options)
            self.partition_counts: dict[str, int] = dict(self.remote.partition_counts)
            return
        self.path = check_log_dir(path)
        manifest_path = os.path.join(self.path, "manifest")
        with open(manifest_path, "rb") as f:
            manifest = _decode_manifest(f.read(), manifest_path)
        topics = manifest["topics"]
        self.partition_counts = {name: int(meta["partitions"]) for name, meta in sorted(topics.items())}
        self.tiered_topics = frozenset(
            name for name, meta in topics.items() if meta["config"].get("remote_storage_enable")
        )
        self.compacted_topics = frozenset(  # offsets may skip: compacted now, or cleaned before
            name
            for name, meta in topics.items()
            if any(
                files.offsets_may_skip(
                    files.partition_dir(self.path, name, p),
                    "compact" in meta["config"].get("cleanup_policy", "delete"),
                )
                for p in range(int(meta["partitions"]))
            )
        )
        if self.tiered_topics:
            self.tiered_url = read_remote_storage(self.path)

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
        if self.remote is not None:
            return self.remote.partition(topic, partition)
        local = open_partition(self.path, topic, partition)
        if self.tiered_url is None or topic not in self.tiered_topics:
            return local
        if self._tiered is None or self._tiered.url != self.tiered_url:
            self._tiered = RemoteLog(self.tiered_url, self.remote_options, list_topics=False)
        return TieredPartitionView(local, self._tiered.partition(topic, partition))

    def remote_view(self, view: TieredPartitionView) -> RemotePartitionView:
        """The remote segments a tiered view pinned, as a view of the log's object store (read_committed
        planning walks their batch headers: :func:`pylog.spark.committed.committed_range`)."""
        if self._tiered is None:
            raise IllegalStateError(f"{self.path}: {view.topic}-{view.partition} is not a view of this log")
        return RemotePartitionView(self._tiered, view.topic, view.partition, view.remote_segments)
