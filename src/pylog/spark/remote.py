"""Spark reads of a log in an object store: ``spark.read.format("pylog").load("s3://bucket/prefix")``.

A log tiered to an object store (:mod:`pylog.tiered`) is read there by every executor, with no log directory
on any machine. The layout is the one :mod:`pylog.tiered.manifest` documents: per partition, immutable
manifest versions naming immutable segment objects.

Planning (the driver's planner worker):

- :class:`RemoteLog` lists the topics and partition counts from the remote manifests
  (:func:`pylog.tiered.manifest.remote_topics`, as ``pylog.open(url, read_only=True)`` does);
- :meth:`RemoteLog.partition` reads the partition's newest manifest and returns a
  :class:`RemotePartitionView`: its offsets (``log_start_offset``, ``log_end_offset``), its size per offset
  and ``offset_for_time`` come from that one manifest, whose segments are **pinned**: :func:`pin` puts the
  segments each Spark partition needs (keys, offsets, sizes, CRCs, index objects) into its
  :class:`RemoteRead`, so every task, and a retried one, reads the same immutable objects whatever is
  uploaded or dropped meanwhile.

Tasks (:func:`read_batches`): a :class:`~pylog.tiered.fetch.RemoteCache` per executor Python worker (kept
for the worker's life, keyed by URL and options; Spark reuses workers) and a source that returns the pinned
segments only (:class:`PinnedSegments`); batches are found and checked by :func:`pylog.partition.remote.read_raw`
(index hint, base offsets continuing, a segment ending where its manifest says) and decoded with their CRC
checked, exactly as a consumer reads remote segments. A pinned segment that is gone when a task reads it (the
writer's remote retention dropped it after planning, and the newest manifest no longer names it) is data loss:
an :class:`~pylog.errors.OffsetOutOfRangeError` with ``failOnDataLoss=true``, a logged warning naming the
offsets skipped with ``false``. A store that cannot be reached is a
:class:`~pylog.errors.RemoteStorageError` after the store's bounded retries.

Store options come from the reader options ``remoteStorage.<key>`` (see
:func:`pylog.spark.options.remote_storage_options`); they travel to the tasks inside the pickled input
partitions, never in the JSON plan of the JVM reader.

pylog's JVM reader (:mod:`pylog.spark.jvm`) reads batch URL loads of ``file://`` and ``s3://`` stores from the
same pinned segments: a :class:`RemoteRead` pickles with :func:`jvm_plan`, made on the driver when the
partitions are planned: the segments and, for S3, GET URLs presigned there (``obstore.sign``, valid for
``remoteStorage.presignExpirySeconds``, default :data:`DEFAULT_PRESIGN_EXPIRY_S`), so executors read the
objects with no credentials. The Java scan finds that JSON in the pickled partition; the Python tasks ignore it.
It reads a tiered log directory's remote segments the same way: the plan also names each tiered partition's
local log start at planning (``localStarts``), and the JVM task splits its ranges as :func:`read_batches`'s
caller in :mod:`pylog.spark.reader` does (below the local log start as the task finds it from the store, the
rest from the local files).

Thread-safety: the views and :class:`RemoteRead` are immutable once built; a task's source is its own; the
executor caches are thread-safe (:class:`~pylog.tiered.fetch.RemoteCache`). Crash contract: reads only,
locally and remotely (a ``file://`` store is opened without creating its directory).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from pylog.clock import SystemClock
from pylog.errors import CorruptRecordError, IllegalStateError, OffsetOutOfRangeError
from pylog.partition.reader import PartitionReader, SegmentFile
from pylog.partition.remote import offset_for_time, read_raw, segment_at
from pylog.partition.visibility import is_skipped
from pylog.record import DecodedBatch, decode_batch, decode_header
from pylog.tiered.fetch import RemoteCache, RemotePartition
from pylog.tiered.manifest import (
    KEEP_VERSIONS,
    PartitionManifest,
    RemoteSegment,
    manifest_key,
    read_manifest,
    remote_topics,
)
from pylog.tiered.store import ObjectStore

if TYPE_CHECKING:
    from pylog.spark.filters import ColumnBounds
    from pylog.spark.options import OffsetRange

__all__ = [
    "CLIENT_KEYS",
    "DEFAULT_PRESIGN_EXPIRY_S",
    "MAX_PRESIGN_EXPIRY_S",
    "PRESIGN_KEY",
    "RETRY_KEYS",
    "STORE_KEYS",
    "STORE_KEY_ALIASES",
    "REMOTE_PREFIX",
    "PinnedSegments",
    "RemoteLog",
    "RemotePartitionView",
    "RemoteRead",
    "TieredPartitionView",
    "is_url",
    "jvm_plan",
    "open_store",
    "pin",
    "pin_newer",
    "read_batches",
]

#: Reader options with this prefix (lower case) are the object store's options: ``remoteStorage.region``.
REMOTE_PREFIX = "remotestorage."
#: Keys under ``remoteStorage.client_options.`` (obstore's ClientConfig).
CLIENT_KEYS = [
    "allow_http",
    "allow_invalid_certificates",
    "connect_timeout",
    "default_content_type",
    "http1_only",
    "http2_keep_alive_interval",
    "http2_keep_alive_timeout",
    "http2_keep_alive_while_idle",
    "http2_only",
    "pool_idle_timeout",
    "pool_max_idle_per_host",
    "proxy_url",
    "proxy_ca_certificate",
    "proxy_excludes",
    "randomize_addresses",
    "read_timeout",
    "timeout",
    "user_agent",
]
#: Keys under ``remoteStorage.retry_config.`` and how their values are read.
RETRY_KEYS = {
    "max_retries": "int",
    "retry_timeout": "duration",
    "backoff.init_backoff": "duration",
    "backoff.max_backoff": "duration",
    "backoff.base": "float",
}
#: The store keys of obstore (S3, GCS, Azure); its ``aws_``/``google_``/``azure_`` aliases pass too.
STORE_KEYS = [
    "access_key_id",
    "secret_access_key",
    "session_token",
    "token",
    "region",
    "default_region",
    "endpoint",
    "bucket",
    "virtual_hosted_style_request",
    "skip_signature",
    "request_payer",
    "unsigned_payload",
    "checksum_algorithm",
    "conditional_put",
    "copy_if_not_exists",
    "disable_tagging",
    "imdsv1_fallback",
    "metadata_endpoint",
    "role_arn",
    "role_session_name",
    "s3_express",
    "server_side_encryption",
    "sse_kms_key_id",
    "sse_bucket_key_enabled",
    "sse_customer_key_base64",
    "sts_endpoint",
    "web_identity_token_file",
    "container_credentials_relative_uri",
    "service_account",
    "service_account_key",
    "application_credentials",
    "base_url",
    "bearer_token",
    "account_name",
    "account_key",
    "client_id",
    "client_secret",
    "tenant_id",
    "authority_host",
    "sas_key",
    "sas_token",
    "use_emulator",
    "use_fabric_endpoint",
    "msi_endpoint",
    "object_id",
    "msi_resource_id",
    "federated_token_file",
    "use_azure_cli",
    "container_name",
]
STORE_KEY_ALIASES = ("aws_", "google_", "azure_")
#: The internal key of ``remoteStorage.presignExpirySeconds`` in the store options (never given to the store).
PRESIGN_KEY = "presign_expiry_seconds"
#: How long the presigned URLs of a JVM read of an S3 store are valid by default (seconds).
DEFAULT_PRESIGN_EXPIRY_S = 3600
#: The longest expiry S3 accepts for a presigned URL (SigV4: 7 days).
MAX_PRESIGN_EXPIRY_S = 7 * 24 * 3600
#: Bytes a task asks :func:`read_raw` for at a time (its fetches go through the cache's prefetch windows).
READ_BYTES = 16 << 20
_MAX_CACHES = 4  # stores (URL + options) a worker keeps a cache for
_log = logging.getLogger("pylog.spark")


def is_url(path: str) -> bool:
    """Whether a ``load()`` path is an object-store URL (``s3://``, ``file://``, ...) rather than a directory."""
    return "://" in path


def open_store(url: str, options: Mapping[str, Any]) -> ObjectStore:
    """The object store at ``url``, opened for reading: a ``file://`` directory must exist (it is never
    created); other schemes are checked by their first request."""
    opts = {k: v for k, v in options.items() if k != PRESIGN_KEY}
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        root = urllib.parse.unquote(parsed.path)
        if not os.path.isdir(root):
            raise FileNotFoundError(
                f"{url}: no such directory (or it is not visible on this machine): a log in a file:// object "
                "store is the directory that remote_storage named"
            )
        opts["mkdir"] = False
    return ObjectStore(url, **opts)


@dataclass(frozen=True)
class RemoteRead:
    """What a task needs to read a log in an object store: the URL, the store's options, and the pinned
    segments of the partitions it reads (``{(topic, partition): segments}``, ascending and contiguous).

    A read of a log directory whose topics are tiered (:class:`TieredPartitionView`) has one too, with
    ``local_starts``: each tiered partition's local log start when the query was planned. Offsets between
    the pinned remote end and it were in neither place then (segments deleted locally that were never
    uploaded), and a consumer reads on past them; offsets at or above it were local then."""

    url: str
    options: dict[str, Any]
    segments: dict[tuple[str, int], tuple[RemoteSegment, ...]] = field(default_factory=dict)
    local_starts: dict[tuple[str, int], int] = field(default_factory=dict)
    #: the version of the manifest each partition's segments were pinned from (a URL read)
    versions: dict[tuple[str, int], int] = field(default_factory=dict)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # pickled on the driver when its partitions are planned: the JVM reader finds its plan here
        return _restore_remote_read, (
            jvm_plan(self),
            self.url,
            self.options,
            self.segments,
            self.local_starts,
            self.versions,
        )


def _restore_remote_read(
    jvm: str,
    url: str,
    options: dict[str, Any],
    segments: dict[tuple[str, int], tuple[RemoteSegment, ...]],
    local_starts: dict[tuple[str, int], int],
    versions: dict[tuple[str, int], int],
) -> RemoteRead:
    """Unpickles a :class:`RemoteRead` (``jvm`` is for pylog's JVM reader, see :func:`jvm_plan`)."""
    return RemoteRead(url, options, segments, local_starts, versions)


#: JVM reader schemes: a ``file://`` store is read as files, these through URLs the driver signs.
SIGNED_SCHEMES = ("s3", "s3a")


def jvm_plan(remote: RemoteRead) -> str:
    """The JSON pylog's JVM reader reads a task's pinned segments with (it travels in the pickled
    :class:`RemoteRead`, whose ``__reduce__`` calls this on the driver when the partitions are planned)::

        {"store": "file" | "signed" | "none", "root": str, "reason": str, "expirySeconds": int,
         "localStarts": [[topic, partition, local_log_start], ...],
         "segments": [[topic, partition, [[base, next, size, max_timestamp, key, url, index_key,
                       index_url, index_size], ...], [[newer_manifest_key, newer_manifest_url], ...]], ...]}

    ``file``: the objects are the files ``root/key`` (``url``/``index_url`` null). ``signed``: ``url`` and
    ``index_url`` are presigned GET URLs (``obstore.sign``, valid for ``expirySeconds``, the reader option
    ``remoteStorage.presignExpirySeconds``), so the store's credentials stay on the driver. ``none``: the
    JVM reader cannot read this store (``reason`` says why; the task fails with it). ``index_key``,
    ``index_url`` and ``index_size`` are null/0 when the segment has no index object (the index is only a
    hint). The newer manifest keys are versions after the pinned one ``v`` (none when it is unknown): a
    pinned object that is gone is data loss when a newer version exists (remote retention publishes a
    manifest without a segment before deleting it), else a ``RemoteStorageError`` (missing while the newest
    manifest names it), as the Python path tells them apart. A publish deletes the versions more than
    ``KEEP_VERSIONS`` below it, so the versions present are the newest ``KEEP_VERSIONS`` (a contiguous run):
    probing ``v + 1 + j * KEEP_VERSIONS`` for ``j < _NEWER_PROBES`` finds one of them whenever any version
    up to ``v + _NEWER_PROBES * KEEP_VERSIONS`` was published; past that the task errs on the safe side
    (``RemoteStorageError``, never a skip). ``localStarts`` (a tiered log directory; else empty):
    each tiered partition's local log start at planning. Its pinned segments are every remote segment holding
    offsets of its ranges, those still local at planning too: the task reads below the local log start as it
    finds it (:mod:`pylog.spark.jvm`), so it may need them."""
    parsed = urllib.parse.urlparse(remote.url)
    expiry = int(remote.options.get(PRESIGN_KEY, DEFAULT_PRESIGN_EXPIRY_S))
    plan: dict[str, Any] = {"store": "none", "root": "", "reason": "", "expirySeconds": expiry}
    urls: dict[str, str] = {}
    newer_manifests = {
        tp: [
            manifest_key(tp[0], tp[1], remote.versions[tp] + 1 + j * KEEP_VERSIONS)
            for j in range(_NEWER_PROBES)
        ]
        for tp in remote.segments
        if tp in remote.versions
    }
    keys = [k for segs in remote.segments.values() for s in segs for k in _object_keys(s)]
    keys += [k for probes in newer_manifests.values() for k in probes]
    if parsed.scheme == "file":
        plan["store"] = "file"
        plan["root"] = urllib.parse.unquote(parsed.path).rstrip("/") or "/"
    elif parsed.scheme in SIGNED_SCHEMES:
        try:
            urls = _sign(remote.url, remote.options, keys, expiry)
            plan["store"] = "signed"
        except Exception as exc:  # the Python path may still read it: the JVM task says what to do
            plan["reason"] = f"cannot presign GET URLs for {remote.url}: {exc}"
    else:
        plan["reason"] = f"the JVM reader reads file:// and s3:// stores, not {parsed.scheme}://"
    plan["localStarts"] = [[t, p, start] for (t, p), start in sorted(remote.local_starts.items())]
    plan["segments"] = [
        [
            topic,
            partition,
            [
                [
                    s.base_offset,
                    s.next_offset,
                    s.size,
                    s.max_timestamp,
                    s.key,
                    urls.get(s.key),
                    s.index.key if s.index is not None else None,
                    urls.get(s.index.key) if s.index is not None else None,
                    s.index.size if s.index is not None else 0,
                ]
                for s in segs
            ],
            [[k, urls.get(k)] for k in newer_manifests.get((topic, partition), [])],
        ]
        for (topic, partition), segs in sorted(remote.segments.items())
    ]
    return json.dumps(plan)


def _object_keys(seg: RemoteSegment) -> list[str]:
    return [seg.key] if seg.index is None else [seg.key, seg.index.key]


def _sign(url: str, options: Mapping[str, Any], keys: list[str], expiry_s: int) -> dict[str, str]:
    """Presigned GET URLs of ``keys`` (relative to the store's prefix), made locally with the store's
    credentials (no request is sent)."""
    if not keys:
        return {}
    import obstore
    from obstore.store import from_url

    opts = {k: v for k, v in options.items() if k not in (PRESIGN_KEY, "retry_config")}
    cache_key = f"{url}\0{sorted((k, repr(v)) for k, v in opts.items())!r}"
    with _caches_lock:  # opening a store costs milliseconds: a plan of many partitions signs with one
        store: Any = _signers.get(cache_key)
        if store is None:
            if len(_signers) >= _MAX_CACHES:
                _signers.clear()
            store = _signers[cache_key] = from_url(url, **opts)
    signed = obstore.sign(store, "GET", keys, timedelta(seconds=expiry_s))
    return dict(zip(keys, signed, strict=True))


_signers: dict[str, Any] = {}  # the obstore stores _sign signs with, by URL and options


class RemoteLog:
    """Topics and partition counts of a log in an object store (the planning side of a URL read)."""

    def __init__(self, url: str, options: Mapping[str, Any], *, list_topics: bool = True) -> None:
        self.url = url
        self.options = dict(options)
        self.store = open_store(url, self.options)
        self.cache = RemoteCache(self.store, prefetch_bytes=0)  # offset_for_time: a few index-guided reads
        # the remote segments of a log directory's tiered topics need no listing: the directory has the topics
        topics = remote_topics(self.store)["topics"] if list_topics else {}
        self.partition_counts: dict[str, int] = {
            name: int(meta["partitions"]) for name, meta in sorted(topics.items())
        }

    def partition(self, topic: str, partition: int) -> RemotePartitionView:
        """The partition as its newest valid manifest names it now (none yet: an empty partition at 0)."""
        manifest, _ = read_manifest(self.store, topic, partition)
        if manifest is None:
            return RemotePartitionView(self, topic, partition, ())
        return RemotePartitionView(self, topic, partition, manifest.segments, manifest.version)


class RemotePartitionView(PartitionReader):
    """One partition of a log in an object store, as one manifest version names it: the planning interface
    of :class:`~pylog.partition.reader.PartitionReader` (offsets, ``bytes_per_offset``,
    ``offset_for_time``) over remote segments. It has no local segment files (``segments`` is empty);
    tasks read ``remote_segments`` through :func:`read_batches`.

    Thread-safety: immutable once built. Crash contract: reads only."""

    def __init__(
        self,
        log: RemoteLog,
        topic: str,
        partition: int,
        segments: Sequence[RemoteSegment],
        manifest_version: int = 0,
    ) -> None:  # no super().__init__(): there is no partition directory
        self.directory = f"{log.url.rstrip('/')}/{topic}/{partition}"
        self.topic = topic
        self.partition = partition
        self.segments: list[SegmentFile] = []
        self._bases: list[int] = []
        self.remote_segments = tuple(segments)
        self.manifest_version = manifest_version  # of the manifest naming remote_segments (0: none known)
        self._log = log

    @property
    def store(self) -> ObjectStore:
        """The object store of the log (read_committed planning reads its tiered decisions there)."""
        return self._log.store

    @property
    def cache(self) -> RemoteCache:
        """The planner's block cache of the log's segment objects."""
        return self._log.cache

    @property
    def log_start_offset(self) -> int:
        return self.remote_segments[0].base_offset if self.remote_segments else 0

    @property
    def log_end_offset(self) -> int:
        return self.remote_segments[-1].next_offset if self.remote_segments else 0

    @property
    def bytes_per_offset(self) -> float:
        span = self.log_end_offset - self.log_start_offset
        return sum(s.size for s in self.remote_segments) / span if span > 0 else 0.0

    def offset_for_time(self, timestamp: int) -> int | None:
        source = PinnedSegments(self._log.cache, self.topic, self.partition, self.remote_segments)
        found = offset_for_time(source, timestamp)
        return None if found is None else found[0]

    def segments_for(self, start: int, end: int) -> list[SegmentFile]:
        raise IllegalStateError(
            f"{self.directory} lives in an object store: it has no local segment files (read it through "
            "pylog.spark.remote.read_batches)"
        )


class TieredPartitionView(PartitionReader):
    """A partition of a log directory whose topic is tiered (``remote_storage_enable``, the log recording a
    ``remote_storage`` URL): its local segments, and below them the remote segments one manifest version
    names (``remote``, pinned as for a URL read), as pylog's consumer of that log reads them: the log starts
    at the remote log start when there are remote segments, ends at the local log end, and
    ``offset_for_time`` searches the remote segments first. ``segments`` and ``segments_for`` are the local
    segments only; tasks read the offsets below the local log start through :func:`read_batches`.

    Thread-safety: immutable once built. Crash contract: reads only."""

    def __init__(self, local: PartitionReader, remote: RemotePartitionView) -> None:  # no super().__init__()
        self.directory = local.directory
        self.topic = local.topic
        self.partition = local.partition
        self.segments = local.segments
        self._bases = [s.base_offset for s in self.segments]
        self.local = local
        self.remote_segments = remote.remote_segments
        self._remote = remote

    @property
    def local_log_start_offset(self) -> int:
        return self.local.log_start_offset

    @property
    def manifest_version(self) -> int:
        """The version of the manifest naming ``remote_segments`` (0: none known)."""
        return self._remote.manifest_version

    @property
    def log_start_offset(self) -> int:
        local = self.local.log_start_offset
        return min(self._remote.log_start_offset, local) if self.remote_segments else local

    @property
    def bytes_per_offset(self) -> float:
        span = self.log_end_offset - self.log_start_offset
        local = self.local.log_start_offset
        below = sum(s.size for s in self.remote_segments if s.base_offset < local)
        return (below + sum(s.size for s in self.segments)) / span if span > 0 else 0.0

    def offset_for_time(self, timestamp: int) -> int | None:
        found = self._remote.offset_for_time(timestamp) if self.remote_segments else None
        return found if found is not None else self.local.offset_for_time(timestamp)


def pin(remote: RemoteRead | None, ranges: Sequence[OffsetRange], views: Iterable[Any]) -> RemoteRead | None:
    """``remote`` with the segments of ``views`` (the :class:`RemotePartitionView`s or
    :class:`TieredPartitionView`s the ranges were planned on) that hold offsets of ``ranges``: what one Spark
    partition's task reads (a tiered view's local log start too). None stays None (a log directory)."""
    if remote is None:
        return None
    views = [v for v in views if isinstance(v, RemotePartitionView | TieredPartitionView)]
    by_tp = {(v.topic, v.partition): v.remote_segments for v in views}
    local_starts = {
        (v.topic, v.partition): v.local_log_start_offset for v in views if isinstance(v, TieredPartitionView)
    }
    pinned: dict[tuple[str, int], tuple[RemoteSegment, ...]] = {}
    for r in ranges:
        segs = by_tp.get((r.topic, r.partition), ())
        keep = [s for s in segs if s.base_offset < r.end and s.next_offset > r.start]
        pinned[(r.topic, r.partition)] = _merged(pinned.get((r.topic, r.partition), ()), keep)
    starts = {tp: local_starts[tp] for tp in pinned if tp in local_starts}
    versions = {
        (v.topic, v.partition): v.manifest_version
        for v in views
        if isinstance(v, RemotePartitionView | TieredPartitionView) and (v.topic, v.partition) in pinned
    }
    return RemoteRead(remote.url, remote.options, pinned, starts, versions)


def _merged(*groups: Iterable[RemoteSegment]) -> tuple[RemoteSegment, ...]:
    return tuple(sorted({s.key: s for g in groups for s in g}.values(), key=lambda s: s.base_offset))


def pin_newer(remote: RemoteRead, topic: str, partition: int, start: int, end: int) -> RemoteRead:
    """``remote`` with the segments of the partition's newest manifest that hold offsets in ``[start, end)``
    added to its pinned ones. A tiered log directory's task reads offsets there from the store when they were
    local at planning and the local retention deleted them since (after their upload: a local segment goes
    only once a manifest names it). Offsets no manifest names stay unread: data loss."""
    manifest, _ = read_manifest(_cache(remote).store, topic, partition)
    newer = manifest.segments if manifest is not None else ()
    tp = (topic, partition)
    old = remote.segments.get(tp, ())
    last = old[-1].next_offset if old else start
    keep = [s for s in newer if s.base_offset < end and s.next_offset > start and s.base_offset >= last]
    return replace(remote, segments={**remote.segments, tp: _merged(old, keep)})


class _SegmentGone(OffsetOutOfRangeError):
    """A pinned segment the newest manifest no longer names (dropped by remote retention after planning)."""

    def __init__(self, segment: RemoteSegment, message: str) -> None:
        super().__init__(message)
        self.segment = segment


class PinnedSegments:
    """A :class:`pylog.partition.remote.RemoteSegments` source that lists the segments pinned at planning and
    never reads a manifest to list them; their bytes come through ``cache`` (with the prefetch of
    :class:`~pylog.tiered.fetch.RemotePartition`). A segment found gone is left out of later listings
    (``gone``), so a ``failOnDataLoss=false`` read goes on after it.

    Thread-safety: one task's (not shared). Crash contract: reads only."""

    def __init__(
        self, cache: RemoteCache, topic: str, partition: int, segments: Sequence[RemoteSegment]
    ) -> None:
        self._segments = tuple(segments)
        self._inner = RemotePartition(cache, topic, partition, SystemClock(), standalone=True)
        if self._segments:  # the prefetch of the next window and segment follows the pinned order
            self._inner.saw(PartitionManifest(topic, partition, 0, {}, self._segments))
        self.gone: set[str] = set()

    @property
    def standalone(self) -> bool:
        return True

    def segments(self, *, refresh: bool = False) -> Sequence[RemoteSegment]:
        return tuple(s for s in self._segments if s.key not in self.gone)

    def read(self, segment: Any, start: int, length: int) -> memoryview | bytes:
        try:
            return self._inner.read(segment, start, length)
        except OffsetOutOfRangeError as exc:  # the newest manifest no longer names it
            raise _SegmentGone(segment, str(exc)) from exc

    def offset_index(self, segment: Any) -> np.ndarray[Any, Any]:
        try:
            return self._inner.offset_index(segment)
        except OffsetOutOfRangeError as exc:
            raise _SegmentGone(segment, str(exc)) from exc

    def time_index(self, segment: Any) -> np.ndarray[Any, Any]:
        try:
            return self._inner.time_index(segment)
        except OffsetOutOfRangeError as exc:
            raise _SegmentGone(segment, str(exc)) from exc


_NEWER_PROBES = 16
"""Newer manifest versions a JVM task may probe for per partition (see :func:`jvm_plan`): they find a newer
version when up to ``_NEWER_PROBES * KEEP_VERSIONS`` were published after planning."""

_caches: dict[str, RemoteCache] = {}
_caches_lock = threading.Lock()


def _cache(remote: RemoteRead) -> RemoteCache:
    """This worker's cache of the store ``remote`` names (one per URL and options, kept across tasks)."""
    key = f"{remote.url}\0{sorted((k, repr(v)) for k, v in remote.options.items())!r}"
    with _caches_lock:
        cache = _caches.get(key)
        if cache is None:
            if len(_caches) >= _MAX_CACHES:
                for old in _caches.values():
                    old.close()
                _caches.clear()
            cache = _caches[key] = RemoteCache(open_store(remote.url, remote.options))
        return cache


def read_batches(
    remote: RemoteRead, rng: OffsetRange, fail_on_data_loss: bool, timestamp: ColumnBounds
) -> Iterator[tuple[DecodedBatch, int, int]]:
    """Each decoded batch holding records of ``rng``, from its pinned segments, with the index range
    ``[lo, hi)`` of those records (as :func:`pylog.spark.batches.read_ranges` wants them). Segments and batches
    the ``timestamp`` bounds exclude are skipped by the manifest's largest timestamps and the batch headers, and
    (read_committed) the batches in ``rng.skipped``, as the local reader skips them."""
    segs = remote.segments.get((rng.topic, rng.partition), ())
    start, end = _check_pinned(segs, rng, fail_on_data_loss)
    if start >= end:
        return
    source = PinnedSegments(_cache(remote), rng.topic, rng.partition, segs)
    offset = start
    while offset < end:
        listed = source.segments()
        i = segment_at(listed, offset)
        if i < 0:  # in a segment found gone: on with the next one left
            offset = next((s.base_offset for s in listed if s.base_offset > offset), end)
            continue
        seg = listed[i]
        if (
            timestamp.active
            and seg.max_timestamp >= 0
            and not timestamp.overlaps(-(1 << 62), seg.max_timestamp * 1000)
        ):
            offset = seg.next_offset
            continue
        try:
            got = read_raw(source, offset, READ_BYTES)
        except _SegmentGone as gone:
            _lose(rng, gone, fail_on_data_loss)
            source.gone.add(gone.segment.key)
            continue
        if got is None:
            break
        batches, nxt = got
        for buf, at in batches:
            h = decode_header(buf, at, len(buf))
            if h.base_offset >= end:
                return
            if timestamp.active and not timestamp.overlaps(h.base_timestamp * 1000, h.max_timestamp * 1000):
                continue
            if rng.skipped and is_skipped(rng.skipped, max(h.base_offset, offset)):
                continue  # read_committed: an aborted or control batch (pylog.spark.committed)
            b = _decode(buf, at, listed, h.base_offset)
            lo = 0 if h.base_offset >= offset else int(np.searchsorted(b.offsets, offset))
            hi = len(b.offsets) if h.last_offset < end else int(np.searchsorted(b.offsets, end))
            if lo < hi:
                yield b, lo, hi
        offset = max(nxt, offset + 1)


def _decode(buf: memoryview | bytes, at: int, segments: Sequence[RemoteSegment], base: int) -> DecodedBatch:
    """Decode (CRC-checked) the batch at ``at``; a failure names the remote object."""
    try:
        return decode_batch(buf, at)
    except CorruptRecordError as exc:
        i = segment_at(segments, base)
        key = segments[i].key if i >= 0 else "?"
        raise CorruptRecordError(
            f"corrupt batch in remote segment {key} (batch base offset {base}): {exc}", path=key
        ) from exc


def _check_pinned(segs: Sequence[RemoteSegment], rng: OffsetRange, fail: bool) -> tuple[int, int]:
    """The part of ``rng`` its pinned segments hold; the rest is data loss (the manifest pinned when the task
    was planned no longer held it: remote retention between a stream's offsets and its plan)."""
    start, end = rng.start, rng.end
    first = segs[0].base_offset if segs else end
    last = segs[-1].next_offset if segs else end
    if start < first and start < end:
        _gap(rng, start, min(first, end), "were dropped from the object store", fail)
        start = min(first, end)
    if last < end:
        _gap(rng, max(last, start), end, "are not in the remote manifest", fail)
        end = max(last, start)
    return start, end


def _lose(rng: OffsetRange, gone: _SegmentGone, fail: bool) -> None:
    seg = gone.segment
    _gap(
        rng, seg.base_offset, seg.next_offset, f"(segment {seg.key}) were dropped from the object store", fail
    )


def _gap(rng: OffsetRange, first: int, stop: int, what: str, fail: bool) -> None:
    if fail:
        raise OffsetOutOfRangeError(
            f"data loss reading {rng.topic}-{rng.partition} offsets [{rng.start}, {rng.end}): offsets "
            f"{first}..{stop - 1} {what} after the query was planned (remote retention). Set "
            "failOnDataLoss=false to skip records that are gone."
        )
    _log.warning(
        "data loss reading %s-%d offsets [%d, %d): offsets %d..%d %s after the query was planned; "
        "failOnDataLoss=false, so they are skipped",
        rng.topic,
        rng.partition,
        rng.start,
        rng.end,
        first,
        stop - 1,
        what,
    )
