"""Reading remote segments: the object-store side of :class:`pylog.partition.remote.RemoteSegments`.

A :class:`RemotePartition` is the source of one partition's remote segments: it lists them from the newest
valid manifest (:func:`~pylog.tiered.manifest.read_manifest`, re-read at most every ``manifest_ttl_ms`` of the
injected clock, or at once when a read asks for an offset the cached one does not hold), and returns byte
ranges of their ``.log`` objects through a :class:`RemoteCache` shared by every partition of a log. The
checks of what is read (index hint, base offsets, CRCs by the decoder) are the partition layer's
(:mod:`pylog.partition.remote`); this module only moves bytes.

The cache holds fixed-size blocks (``block_bytes``, 1 MiB by default) of segment objects, keyed by object key
and block number, least recently used first out once ``max_bytes`` is reached: the bound holds at all times
(a block larger than the bound is returned but not kept). A read fetches the blocks it misses with one ranged
GET per run of consecutive missing blocks. When a read continues where the previous read of the partition
ended (a consumer reading sequentially), the rest of its prefetch window and the whole next one are fetched
in the background (windows of ``prefetch_bytes``, 16 MiB by default and at most a quarter of the cache,
aligned in the object; into the next segment at the end of one), each missing run as one ranged GET: a
sequential reader asks for every window once, while it reads the one before, and finds it cached. Fewer,
larger requests matter: an object store's cost is per request as much as per byte (on the loopback moto
server of the benchmark, 1 MiB GETs reach about 15 MB/s and 16 MiB ones about 180 MB/s). A background fetch
that fails is forgotten: the read that needs the block fetches it again and reports the error.

Index objects (small) are fetched whole, once, and checked against the size and CRC-32C the manifest names:
one that does not check is not used (reads then walk from the segment's first batch, which is correct, only
slower).

Errors: the store's (:class:`~pylog.errors.RemoteStorageError` after its bounded retries: see
:mod:`pylog.tiered.store`); an object shorter than its manifest says is a
:class:`~pylog.errors.CorruptRecordError` raised by the partition layer.

Thread-safety: thread-safe (one lock per cache and per partition; fetches run outside them, and two readers
of one missing block share its fetch). Crash contract: writes nothing, locally or remotely.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import crc32c
import numpy as np

from pylog.clock import Clock
from pylog.errors import ConfigError, OffsetOutOfRangeError, PylogError, RemoteStorageError
from pylog.partition.index import OFFSET_ENTRY, TIME_ENTRY
from pylog.tiered.manifest import PartitionManifest, RemoteFile, RemoteSegment, read_manifest
from pylog.tiered.store import ObjectStore

__all__ = ["DEFAULT_CACHE_BYTES", "RemoteCache", "RemotePartition"]

DEFAULT_CACHE_BYTES = 64 << 20
DEFAULT_BLOCK_BYTES = 1 << 20
DEFAULT_PREFETCH_BYTES = 16 << 20
MANIFEST_TTL_MS = 1000

_Block = tuple[str, int]  # (object key, block number)


class RemoteCache:
    """Blocks of remote segment objects, at most ``max_bytes`` of them, least recently used out first; and
    the background fetcher for prefetches (two threads, started on first use, stopped by :meth:`close`).

    Thread-safety: thread-safe (one lock; fetches run outside it). Crash contract: memory only, writes
    nothing."""

    def __init__(
        self,
        store: ObjectStore,
        max_bytes: int = DEFAULT_CACHE_BYTES,
        *,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
    ) -> None:
        self.check(max_bytes, block_bytes)
        if isinstance(prefetch_bytes, bool) or not isinstance(prefetch_bytes, int) or prefetch_bytes < 0:
            raise ConfigError(f"remote cache prefetch_bytes must be an int >= 0, got {prefetch_bytes!r}")
        self.store = store
        self.max_bytes = max_bytes
        self.block_bytes = block_bytes
        self.prefetch_bytes = prefetch_bytes
        self._blocks: OrderedDict[_Block, bytes] = OrderedDict()
        self._inflight: dict[_Block, Future[bytes]] = {}
        self._lock = threading.Lock()
        self._size = 0
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        #: counters: blocks served from the cache, fetched by a read, fetched by a prefetch; GETs issued
        self.hits = self.misses = self.prefetched = self.requests = 0

    @staticmethod
    def check(max_bytes: object, block_bytes: object = DEFAULT_BLOCK_BYTES) -> None:
        """Raise :class:`~pylog.errors.ConfigError` unless both are ints > 0."""
        for name, value in (("remote_cache_bytes", max_bytes), ("block_bytes", block_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"remote cache {name} must be an int > 0, got {value!r}")

    @property
    def size(self) -> int:
        """Bytes held now (never above ``max_bytes``)."""
        return self._size

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            self._blocks.clear()
            self._size = 0
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def read(self, key: str, object_size: int, start: int, length: int) -> memoryview | bytes:
        """Bytes ``[start, start + length)`` of the object ``key`` (``object_size`` bytes long)."""
        end = min(start + length, object_size)
        if end <= start:
            return b""
        bs = self.block_bytes
        first, last = start // bs, (end - 1) // bs
        blocks = self._get(key, object_size, range(first, last + 1))
        if len(blocks) == 1:
            return memoryview(blocks[0])[start - first * bs : end - first * bs]
        joined = b"".join(blocks)
        return memoryview(joined)[start - first * bs : end - first * bs]

    def prefetch(self, ranges: Sequence[tuple[str, int, int, int]]) -> None:
        """Fetch ``(key, object_size, start, length)`` ranges in the background (blocks not cached yet)."""
        if self.prefetch_bytes == 0:
            return
        with self._lock:
            if self._closed:
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pylog-remote-prefetch")
            pool = self._pool
        bs = self.block_bytes
        for key, object_size, start, length in ranges:
            end = min(start + length, object_size)
            wanted: list[int] = []
            futures: dict[int, Future[bytes]] = {}
            with self._lock:
                for n in range(start // bs, (end - 1) // bs + 1) if end > start else ():
                    if (key, n) not in self._blocks and (key, n) not in self._inflight:
                        futures[n] = self._inflight[(key, n)] = Future()
                        wanted.append(n)
            for run in _runs(wanted):  # one GET per run of missing blocks: fewer, larger requests
                fill = {n: futures[n] for n in run}
                try:
                    pool.submit(self._fill, key, object_size, fill)
                except RuntimeError:  # shut down meanwhile
                    self._fail(key, fill, RemoteStorageError("the log is closed", key=key))

    # -- internals --------------------------------------------------------------------------------------

    def _fill(self, key: str, object_size: int, futures: dict[int, Future[bytes]]) -> None:
        numbers = sorted(futures)
        try:
            data = self._fetch(key, object_size, numbers[0], numbers[-1])
        except BaseException as exc:
            self._fail(key, futures, exc)
            return
        self.prefetched += len(numbers)
        for n, block in zip(numbers, data, strict=True):
            self._settle(key, n, futures[n], block, None)

    def _fail(self, key: str, futures: dict[int, Future[bytes]], exc: BaseException) -> None:
        for n, fut in futures.items():
            self._settle(key, n, fut, None, exc)

    def _settle(
        self, key: str, n: int, fut: Future[bytes], data: bytes | None, exc: BaseException | None
    ) -> None:
        with self._lock:
            self._inflight.pop((key, n), None)
            if data is not None:
                self._keep((key, n), data)
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(data if data is not None else b"")

    def _get(self, key: str, object_size: int, numbers: range) -> list[bytes]:
        found: dict[int, bytes] = {}
        waiting: dict[int, Future[bytes]] = {}
        missing: list[int] = []
        with self._lock:
            for n in numbers:
                data = self._blocks.get((key, n))
                if data is not None:
                    self._blocks.move_to_end((key, n))
                    found[n] = data
                    self.hits += 1
                elif (key, n) in self._inflight:
                    waiting[n] = self._inflight[(key, n)]
                else:
                    missing.append(n)
        for run in _runs(missing):
            fetched = self._fetch(key, object_size, run[0], run[-1])
            self.misses += len(run)
            with self._lock:
                for n, data in zip(run, fetched, strict=True):
                    found[n] = data
                    self._keep((key, n), data)
        for n, fut in waiting.items():
            try:
                found[n] = fut.result()
            except BaseException:  # the prefetch failed: fetch it here, where its error is reported
                found[n] = self._fetch(key, object_size, n, n)[0]
            self.hits += 1
        return [found[n] for n in numbers]

    def _fetch(self, key: str, object_size: int, first: int, last: int) -> list[bytes]:
        """Blocks ``first..last`` of ``key`` with one ranged GET."""
        bs = self.block_bytes
        start = first * bs
        length = min((last + 1) * bs, object_size) - start
        self.requests += 1
        data = self.store.get_range(key, start, length)
        return [data[i * bs : (i + 1) * bs] for i in range(last - first + 1)]

    def _keep(self, block: _Block, data: bytes) -> None:
        """Cache ``data`` (lock held), evicting the least recently used blocks to stay within the bound."""
        if self._closed or len(data) > self.max_bytes or block in self._blocks:
            return
        self._blocks[block] = data
        self._size += len(data)
        while self._size > self.max_bytes:
            _, old = self._blocks.popitem(last=False)
            self._size -= len(old)


class RemotePartition:
    """The remote segments of one partition (see the module docstring); implements
    :class:`pylog.partition.remote.RemoteSegments`. ``standalone``: the log has no local segments (opened
    read-only from the object store).

    Thread-safety: thread-safe (one lock for the cached manifest and indexes; requests run outside it).
    Crash contract: reads only."""

    def __init__(
        self,
        cache: RemoteCache,
        topic: str,
        partition: int,
        clock: Clock,
        *,
        standalone: bool = False,
        manifest_ttl_ms: int = MANIFEST_TTL_MS,
    ) -> None:
        self.cache = cache
        self.topic = topic
        self.partition = partition
        self.clock = clock
        self._standalone = standalone
        self.manifest_ttl_ms = manifest_ttl_ms
        self._lock = threading.Lock()
        self._manifest: PartitionManifest | None = None
        self._read_at = 0.0
        self._loaded = False
        self._indexes: dict[str, np.ndarray[Any, Any]] = {}
        self._last: tuple[str, int, int] | None = None  # the previous read: key, start, end

    def __repr__(self) -> str:
        return f"RemotePartition({self.cache.store.url!r}, {self.topic}-{self.partition})"

    @property
    def standalone(self) -> bool:
        return self._standalone

    def segments(self, *, refresh: bool = False) -> Sequence[RemoteSegment]:
        now = self.clock.monotonic_ms()
        with self._lock:
            fresh = self._loaded and now - self._read_at < self.manifest_ttl_ms
            if fresh and not refresh and self._manifest is not None:
                return self._manifest.segments
            if fresh and not refresh:
                return ()
        # a tombstone (the topic was deleted) is taken as a manifest naming no segment
        manifest, _ = read_manifest(self.cache.store, self.topic, self.partition, tombstones=True)
        with self._lock:
            if manifest is None or self._manifest is None or manifest.version >= self._manifest.version:
                self._manifest = manifest if manifest is not None else self._manifest
            self._read_at = now
            self._loaded = True
            return self._manifest.segments if self._manifest is not None else ()

    def saw(self, manifest: PartitionManifest) -> None:
        """A manifest this process just published (``Log.tier()``): newer than any cached one, use it now."""
        with self._lock:
            if self._manifest is None or manifest.version >= self._manifest.version:
                self._manifest = manifest
                self._read_at = self.clock.monotonic_ms()
                self._loaded = True

    def read(self, segment: Any, start: int, length: int) -> memoryview | bytes:
        seg: RemoteSegment = segment
        try:
            data = self.cache.read(seg.key, seg.size, start, length)
        except RemoteStorageError as exc:
            raise self._gone(seg, exc) from exc
        end = start + len(data)
        with self._lock:
            last = self._last
            # sequential: this read starts inside the previous one (a consumer's next fetch), or the previous
            # read was of the segment before this one
            sequential = last is not None and (
                (last[0] == seg.key and last[1] <= start <= last[2]) or last[0] == self._key_before(seg)
            )
            self._last = (seg.key, start, end)
        if sequential and self.cache.prefetch_bytes:
            self._prefetch_after(seg, end)
        return data

    def offset_index(self, segment: Any) -> np.ndarray[Any, Any]:
        seg: RemoteSegment = segment
        try:
            return self._index(seg.index, OFFSET_ENTRY)
        except RemoteStorageError as exc:
            raise self._gone(seg, exc) from exc

    def time_index(self, segment: Any) -> np.ndarray[Any, Any]:
        seg: RemoteSegment = segment
        try:
            return self._index(seg.timeindex, TIME_ENTRY)
        except RemoteStorageError as exc:
            raise self._gone(seg, exc) from exc

    # -- internals --------------------------------------------------------------------------------------

    def _gone(self, seg: RemoteSegment, exc: RemoteStorageError) -> PylogError:
        """The error of a failed read of ``seg``: :class:`OffsetOutOfRangeError` when the newest manifest no
        longer names it (remote retention deleted it after the manifest this reader held), else ``exc``."""
        try:
            segments = self.segments(refresh=True)
        except RemoteStorageError:
            return exc
        if any(s.key == seg.key for s in segments):
            return exc
        start = segments[0].base_offset if segments else None
        return OffsetOutOfRangeError(
            f"offsets {seg.base_offset}..{seg.next_offset - 1} of {self.topic}-{self.partition} are no longer in "
            f"the object store (deleted by retention); the remote log now starts at {start}"
        )

    def _key_before(self, seg: RemoteSegment) -> str | None:
        segments = self._manifest.segments if self._manifest is not None else ()
        for before, s in itertools.pairwise(segments):
            if s.key == seg.key:
                return before.key
        return None

    def _prefetch_after(self, seg: RemoteSegment, end: int) -> None:
        """Queue the bytes from ``end`` of ``seg`` to the end of the prefetch window after the one ``end`` is
        in (windows of ``prefetch_bytes``, aligned), going on into the following segments. So a sequential
        reader asks for each window once, as one GET, while it reads the window before it."""
        # at most a quarter of the cache: what is fetched ahead must still be there when the reader comes
        window = max(min(self.cache.prefetch_bytes, self.cache.max_bytes // 4), self.cache.block_bytes)
        want = (end // window + 2) * window - end
        ranges: list[tuple[str, int, int, int]] = []
        segments = self._manifest.segments if self._manifest is not None else ()
        i = next((k for k, s in enumerate(segments) if s.key == seg.key), -1)
        if i < 0:
            return
        pos = end
        for s in segments[i:]:
            take = min(want, s.size - pos)
            if take > 0:
                ranges.append((s.key, s.size, pos, take))
                want -= take
            if want <= 0:
                break
            pos = 0
        self.cache.prefetch(ranges)

    def _index(self, meta: RemoteFile | None, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        if meta is None or meta.size == 0:
            return np.empty(0, dtype=dtype)
        with self._lock:
            found = self._indexes.get(meta.key)
        if found is not None:
            return found
        raw = self.cache.store.get(meta.key)
        if len(raw) != meta.size or crc32c.crc32c(raw) != meta.crc32c or len(raw) % dtype.itemsize:
            entries = np.empty(0, dtype=dtype)  # does not check: reads walk from the first batch
        else:
            entries = np.frombuffer(raw, dtype=dtype)
        with self._lock:
            if len(self._indexes) > 4096:
                self._indexes.clear()
            self._indexes[meta.key] = entries
        return entries


def _runs(numbers: list[int]) -> list[list[int]]:
    """Consecutive runs of sorted ``numbers``."""
    out: list[list[int]] = []
    for n in numbers:
        if out and out[-1][-1] + 1 == n:
            out[-1].append(n)
        else:
            out.append([n])
    return out
