"""Record-to-partition assignment, compatible with Apache Kafka's Java producer.

Keyed records
-------------
A record with a key goes to ``to_positive(murmur2(key)) % num_partitions``, exactly what the Java client does
(``BuiltInPartitioner.partitionForKey``, formerly ``DefaultPartitioner``) with the serialized key bytes.
:func:`murmur2` is a byte-for-byte port of ``org.apache.kafka.common.utils.Utils.murmur2`` (MurmurHash2, seed
``0x9747b28c``, little-endian 4-byte words) and returns the same *signed* 32-bit ``int`` as Java; the test
vectors of Kafka's ``UtilsTest.testMurmur2`` are part of this project's tests. So a key written by pylog and
the same key written by a Java producer land in the same partition, provided both serialize the key to the
same bytes (e.g. UTF-8 for ``StringSerializer``) and the topic has the same number of partitions.

Known mismatch with librdkafka: the default partitioner of librdkafka and of the clients built on it
(confluent-kafka-python, the Go/.NET Confluent clients, ...) is ``consistent_random``, a CRC32 of the key,
which sends keys to *different* partitions than the Java client and pylog. Such producers must be configured
with ``partitioner=murmur2_random`` to agree with pylog.

An empty key (``b""``) is a key like any other and is hashed. A *missing* key (``None``) is not hashed:
keyless records are spread by :class:`StickyPartitioner`.

Keyless records
---------------
Like Kafka's uniform sticky partitioner (KIP-794), a producer sends a topic's keyless records to one partition
until they add up to ``batch_size`` bytes (the producer's ``batch_size`` up to :data:`KEYLESS_RUN_BYTES`,
4 KiB; a record counts its value, its headers and 8 bytes), so that they are written in full batches, then
moves to another partition. Kafka's runs are its 16 KiB ``batch.size``, sized for network requests; an
embedded append costs the same for 4 KiB as for 16, and 4 KiB runs still hold a hundred or more small
records, so pylog uses shorter runs: a script that sends a few thousand small records covers every partition
of a topic. Kafka starts
at a random partition and moves to a random one, weighted by its queues to each broker. pylog sees the
partitions themselves, so it chooses each new partition by load (:class:`PartitionLoads`): the partition's log
end offset, or more if the producers of this process have assigned records to it that are not written yet.
It takes the least loaded partition when the topic has at most :data:`SCAN_ALL` partitions (one log end
offset read per partition and per run of keyless records, a few microseconds each), else the less loaded of
two distinct random partitions ("power of two choices": two reads, and the gap between the fullest and the
emptiest partition stays within a few runs). Ties are broken at random. So from its first records on, each
producer, and each short-lived producer after another, in this process or another one, fills the emptiest
partitions; a single producer keeps every partition within one run (``batch_size`` bytes of records) of the
others. Producers of one process that run at the same time see each other's assignments; producers of
different processes running at the same time see only what the others wrote, so their first runs may land on
the same partition.

Loads count all records of a partition, keyed ones and those written before: after ``create_partitions``, the
new (empty) partitions receive the keyless records first, until they catch up with the others.

Batch hashing
-------------
:func:`murmur2_many`, :func:`murmur2_fixed` and :func:`partitions_for_keys` compute the same hash for many
keys with numpy, looping in Python over 4-byte word *positions* rather than over keys. All arithmetic is done
in ``uint32`` arrays, which wrap on overflow like Java's ``int`` (numpy does not warn for array overflow).
numpy costs tens of microseconds per call whatever the array size, so calls with fewer than 16 keys (a
producer's drain of one record, when each ``send().get()`` waits) use the scalar :func:`murmur2`
(:func:`partition_list`); both give the same results, checked against Kafka's vectors and a transcription of
the Java code.
"""

from __future__ import annotations

import random
import struct
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Final

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray

from pylog.errors import ConfigError, InvalidRecordError
from pylog.speedups import core as _core

__all__ = [
    "KEYLESS_RUN_BYTES",
    "SCAN_ALL",
    "PartitionLoads",
    "StickyPartitioner",
    "murmur2",
    "murmur2_py",
    "murmur2_fixed",
    "murmur2_many",
    "partition_for_key",
    "partition_list",
    "partitions_for_keys",
    "shared_loads",
    "to_positive",
]

#: Topics with at most this many partitions choose each keyless run's partition among all of them.
SCAN_ALL: Final = 16
#: Bytes of keyless records sent to one partition before the next run starts elsewhere (at most).
KEYLESS_RUN_BYTES: Final = 4096

_SEED: Final = 0x9747B28C
_M: Final = 0x5BD1E995
_R: Final = 24

_U32_SEED: Final = np.uint32(_SEED)
_U32_M: Final = np.uint32(_M)
# Mask of the valid bytes of the (zero-padded) tail word, by ``length % 4``.
_TAIL_MASKS: Final = np.array([0, 0xFF, 0xFFFF, 0xFFFFFF], dtype=np.uint32)
_LE_U32: Final = np.dtype("<u4")

# Rows hashed together: the per-word temporaries stay in cache and memory stays bounded.
_CHUNK_ROWS: Final = 65536
# Upper bound, in bytes, of the padded key matrix built for one chunk.
_MATRIX_BUDGET: Final = 1 << 24
# A chunk with fewer rows than this is hashed with the scalar function: with so few rows, numpy's per-call
# overhead for every word position costs more than the pure-Python loop (this is what handles a few very long
# keys among short ones).
_MIN_VECTOR_ROWS: Final = 64
# A call with fewer keys than this hashes them with the scalar function, whatever their lengths: numpy costs
# about 25 us per call plus 3-5 us per word position, the scalar loop about 0.6 us per key plus 0.4 us per
# word, so numpy wins from about 15 keys (long keys) to 30 (short ones) on. A producer's drain of a record
# or two (``send().get()``) hashes one key: 3 us instead of 100.
_SCALAR_KEYS: Final = 16

_UNPACK_CACHE_WORDS: Final = 256
_unpackers: dict[int, Callable[[bytes], tuple[int, ...]]] = {}


def _unpacker(words: int) -> Callable[[bytes], tuple[int, ...]]:
    """Reader of ``words`` little-endian uint32 at the start of a buffer (cached for short keys)."""
    unpack = _unpackers.get(words)
    if unpack is None:
        unpack = struct.Struct(f"<{words}I").unpack_from
        if words <= _UNPACK_CACHE_WORDS:
            _unpackers[words] = unpack
    return unpack


def murmur2_py(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` of ``data``, as a signed 32-bit int (``-2**31 <= result < 2**31``): the
    definition, and the pure-Python path of :func:`murmur2`."""
    # The constants are written out (seed 0x9747B28C, m 0x5BD1E995, r 24): a literal costs less than a lookup
    # of a module global, and this loop runs for every key of a small drain. Products are masked once per
    # word: ``(a & M) ^ (b & M) == (a ^ b) & M``.
    length = len(data)
    h = 0x9747B28C ^ length
    words = length >> 2
    if words:
        for k in _unpacker(words)(data):
            k = (k * 0x5BD1E995) & 0xFFFFFFFF
            h = ((h * 0x5BD1E995) ^ ((k ^ (k >> 24)) * 0x5BD1E995)) & 0xFFFFFFFF
    tail = length & 3
    if tail:
        # Java's fall-through switch XORs bytes 2, 1, 0 of the tail at bits 16, 8, 0: a little-endian int.
        h = ((h ^ int.from_bytes(data[length - tail :], "little")) * 0x5BD1E995) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0x5BD1E995) & 0xFFFFFFFF
    h ^= h >> 15
    return h - 0x100000000 if h & 0x80000000 else h


#: Kafka's ``Utils.murmur2`` (see :func:`murmur2_py`): compiled in ``pylog._speedups`` when it is in use
#: (:mod:`pylog.speedups`), about 0.1 us a key against 2-4 us in Python; the same ints either way.
murmur2: Callable[[bytes], int] = _core.murmur2 if _core is not None else murmur2_py


def to_positive(h: int) -> int:
    """Kafka's ``Utils.toPositive``: clear the sign bit (not ``abs``, which overflows for ``-2**31``)."""
    return h & 0x7FFFFFFF


def _check_partitions(num_partitions: int) -> None:
    if num_partitions < 1:
        raise ConfigError(f"num_partitions must be >= 1, got {num_partitions}")


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """Partition of a keyed record, as the Java producer computes it."""
    _check_partitions(num_partitions)
    return to_positive(murmur2(key)) % num_partitions


def partition_list(keys: Iterable[bytes], num_partitions: int) -> list[int]:
    """:func:`partition_for_key` of every key, as a list, with the scalar :func:`murmur2`: for a few keys
    (see :func:`partitions_for_keys` for many)."""
    _check_partitions(num_partitions)
    return [(murmur2(k) & 0x7FFFFFFF) % num_partitions for k in keys]


def _hash_sorted(words: NDArray[np.uint32], lengths: NDArray[np.int64]) -> NDArray[np.uint32]:
    """Hash the rows of ``words``, row ``i`` holding a key of ``lengths[i]`` bytes (lengths ascending).

    ``words[i, j]`` is the little-endian word at bytes ``[4j, 4j + 4)`` of key ``i``; it needs at least
    ``ceil(lengths[i] / 4)`` valid columns, bytes past the key's end may hold anything (they are masked).
    """
    full = lengths >> 2
    h = lengths.astype(np.uint32) ^ _U32_SEED
    n_cols = int(full[-1]) if full.size else 0
    # Lengths are ascending, so the rows with a full word at column j are a suffix, starting at firsts[j].
    firsts = np.searchsorted(full, np.arange(n_cols), side="right")
    for j in range(n_cols):
        first = int(firsts[j])
        k = words[first:, j].astype(np.uint32)
        k *= _U32_M
        k ^= k >> _R
        k *= _U32_M
        hs = h[first:]
        hs *= _U32_M
        hs ^= k
    rem = lengths & 3
    rows = np.flatnonzero(rem)
    if rows.size:
        tail = words[rows, full[rows]] & _TAIL_MASKS[rem[rows]]
        h[rows] = (h[rows] ^ tail) * _U32_M
    h ^= h >> 13
    h *= _U32_M
    h ^= h >> 15
    return h


def _as_words(matrix: NDArray[np.uint8]) -> NDArray[np.uint32]:
    """``(n, 4w)`` uint8 matrix viewed (copied first if not contiguous) as ``(n, w)`` little-endian words."""
    if not matrix.flags.c_contiguous:
        matrix = np.ascontiguousarray(matrix)
    return matrix.view(_LE_U32)


def murmur2_fixed(matrix: NDArray[np.uint8]) -> NDArray[np.int32]:
    """``murmur2`` of every row of a ``(n, L)`` uint8 matrix (``n`` keys of ``L`` bytes), as int32."""
    if matrix.ndim != 2 or matrix.dtype != np.uint8:
        raise InvalidRecordError(f"expected a 2-D uint8 matrix, got {matrix.ndim}-D {matrix.dtype}")
    n, length = matrix.shape
    if n < _SCALAR_KEYS:
        return np.array([murmur2(row.tobytes()) for row in matrix], dtype=np.int32)
    out = np.empty(n, dtype=np.int32)
    width = (length + 3) & ~3
    step = max(1, min(_CHUNK_ROWS, _MATRIX_BUDGET // max(width, 1)))
    lengths = np.full(min(n, step), length, dtype=np.int64)
    for lo in range(0, n, step):
        chunk = matrix[lo : lo + step]
        if width != length:
            padded = np.zeros((chunk.shape[0], width), dtype=np.uint8)
            padded[:, :length] = chunk
            chunk = padded
        rows = chunk.shape[0]
        out[lo : lo + rows] = _hash_sorted(_as_words(chunk), lengths[:rows]).view(np.int32)
    return out


def murmur2_many(keys: Sequence[bytes]) -> NDArray[np.int32]:
    """``murmur2`` of every key (any mix of lengths), as int32, vectorized with numpy.

    Keys are sorted by length and hashed in chunks of rows whose zero-padded matrix is bounded by
    ``_MATRIX_BUDGET`` bytes; a few keys, and tiny chunks (very long keys), are hashed with the scalar
    :func:`murmur2`.
    """
    n = len(keys)
    if n < _SCALAR_KEYS:
        return np.array([murmur2(k) for k in keys], dtype=np.int32)
    out = np.empty(n, dtype=np.int32)
    if n == 0:
        return out
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=n)
    max_len = int(lengths.max())
    min_len = int(lengths.min())
    if min_len == max_len:
        buf = np.frombuffer(b"".join(keys), dtype=np.uint8)
        return murmur2_fixed(buf.reshape(n, max_len))

    pad = (max_len + 3) & ~3
    # Padding at the end, so that a window of `pad` bytes can start at any key.
    buf = np.frombuffer(b"".join(chain(keys, (bytes(pad),))), dtype=np.uint8)
    starts = np.cumsum(lengths) - lengths
    # A stable radix sort when the lengths fit in 16 bits.
    sort_keys = lengths.astype(np.uint16) if max_len <= 0xFFFF else lengths
    order = np.argsort(sort_keys, kind="stable")
    sorted_lengths = lengths[order]

    lo = 0
    while lo < n:
        hi = min(lo + _CHUNK_ROWS, n)
        width = (int(sorted_lengths[hi - 1]) + 3) & ~3
        hi = min(hi, lo + max(1, _MATRIX_BUDGET // max(width, 4)))
        width = (int(sorted_lengths[hi - 1]) + 3) & ~3
        rows = order[lo:hi]
        if hi - lo < _MIN_VECTOR_ROWS:
            out[rows] = [murmur2(keys[i]) for i in rows.tolist()]
        elif width == 0:
            out[rows] = murmur2(b"")
        else:
            # Row i of the window view is buf[i : i + width]; fancy indexing copies only the rows needed.
            matrix = sliding_window_view(buf, width)[starts[rows]]
            out[rows] = _hash_sorted(_as_words(matrix), sorted_lengths[lo:hi]).view(np.int32)
        lo = hi
    return out


def partitions_for_keys(keys: Sequence[bytes], num_partitions: int) -> NDArray[np.int32]:
    """:func:`partition_for_key` of every key, vectorized (a few keys: :func:`partition_list`)."""
    _check_partitions(num_partitions)
    if len(keys) < _SCALAR_KEYS:
        return np.array(partition_list(keys, num_partitions), dtype=np.int32)
    hashes = murmur2_many(keys)
    hashes &= np.int32(0x7FFFFFFF)
    hashes %= np.int32(num_partitions)
    return hashes


class PartitionLoads:
    """Estimated number of records in each partition of one topic, shared by the producers of a process.

    A partition's load is ``max(log_end_offset, first_seen + assigned)``: its log end offset (what every
    process has written) or, if more, the log end offset this table first saw plus the records assigned to
    the partition since then by the producers using this table, written or not yet. So a producer sees the
    records other producers of this process have assigned but not written yet, and records another process
    wrote; records that failed to be written only make the partition look a little busier. A log end offset
    below ``first_seen`` (the partition was truncated) starts the count afresh.

    Thread-safe: :attr:`lock` is held by the caller around a choice and the assignments that follow, so that
    two producers cannot both pick the same idle partition.
    """

    __slots__ = ("__weakref__", "_assigned", "_first_seen", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._first_seen: dict[int, int] = {}
        self._assigned: dict[int, int] = {}

    def estimate(self, partition: int, log_end_offset: int) -> int:
        """Load of ``partition`` whose log end offset is ``log_end_offset`` now (call with :attr:`lock`)."""
        first = self._first_seen.get(partition)
        if first is None or log_end_offset < first:
            self._first_seen[partition] = first = log_end_offset
            self._assigned[partition] = 0
        return max(log_end_offset, first + self._assigned[partition])

    def add(self, partition: int, records: int) -> None:
        """Count ``records`` more assigned to ``partition`` (call with :attr:`lock`, after an estimate)."""
        self._assigned[partition] = self._assigned.get(partition, 0) + records


_shared_loads: weakref.WeakKeyDictionary[object, PartitionLoads] = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def shared_loads(scope: object) -> PartitionLoads:
    """The :class:`PartitionLoads` of ``scope`` (an open topic), created on first use and dropped with it."""
    with _shared_lock:
        loads = _shared_loads.get(scope)
        if loads is None:
            loads = _shared_loads[scope] = PartitionLoads()
        return loads


def _nothing_written(partition: int) -> int:
    return 0


@dataclass(slots=True)
class _Stint:
    partition: int
    produced: int


class StickyPartitioner:
    """Partitions for *keyless* records: sticky runs of ``batch_size`` bytes on the least loaded partition.

    Records of a topic all go to one partition until at least ``batch_size`` bytes have been assigned to it
    (the record that crosses the threshold still goes there, as in Kafka's uniform sticky partitioner,
    KIP-794), so that they form full batches; then the next run starts on a partition chosen by load (see
    :class:`PartitionLoads`): the least loaded of all partitions when the topic has at most
    :data:`SCAN_ALL` of them, else the less loaded of two distinct random partitions ("power of two
    choices"). Ties are broken at random with ``rng``. Choosing reads the log end offsets of the candidates,
    once per run, never per record.

    Thread-safe: :meth:`partitions` holds its own lock and the topic's :attr:`PartitionLoads.lock`.
    """

    __slots__ = ("__weakref__", "_batch_size", "_lock", "_rng", "_stints")

    def __init__(self, batch_size: int = KEYLESS_RUN_BYTES, *, rng: random.Random | None = None) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self._batch_size = batch_size
        self._rng = rng if rng is not None else random.Random()
        self._stints: dict[str, _Stint] = {}
        self._lock = threading.Lock()

    @property
    def batch_size(self) -> int:
        return self._batch_size

    def partitions(
        self,
        topic: str,
        num_partitions: int,
        sizes: npt.ArrayLike,
        log_end_offset: Callable[[int], int],
        scope: object,
    ) -> NDArray[np.int32]:
        """Partitions of the next keyless records of ``topic``, in order; record ``i`` adds ``sizes[i]`` bytes
        to its batch. ``log_end_offset(p)`` is partition ``p``'s log end offset; ``scope`` is the open topic
        (any object that supports weak references): partitioners given the same one share its
        :func:`shared_loads`."""
        _check_partitions(num_partitions)
        loads = shared_loads(scope)
        nbytes = np.asarray(sizes, dtype=np.int64)
        if nbytes.ndim != 1 or (nbytes < 0).any():
            raise InvalidRecordError("record sizes must be a 1-D sequence of ints >= 0")
        if len(nbytes) < _SCALAR_KEYS:
            return np.array(
                self._few(topic, num_partitions, nbytes.tolist(), log_end_offset, loads), np.int32
            )
        out = np.empty(len(nbytes), dtype=np.int32)
        ends = np.cumsum(nbytes)
        with self._lock, loads.lock:
            start = 0
            while start < len(ends):
                stint = self._stint(topic, num_partitions, log_end_offset, loads)
                before = int(ends[start - 1]) if start else 0
                # The run ends with the first record that brings it to batch_size bytes, inclusive.
                last = int(np.searchsorted(ends, before + self._batch_size - stint.produced, side="left"))
                stop = min(last + 1, len(ends))
                out[start:stop] = stint.partition
                stint.produced += int(ends[stop - 1]) - before
                loads.add(stint.partition, stop - start)
                start = stop
        return out

    def partition_list(
        self,
        topic: str,
        num_partitions: int,
        sizes: Sequence[int],
        log_end_offset: Callable[[int], int],
        scope: object,
    ) -> list[int]:
        """:meth:`partitions` of a few records (sizes given as ints), as a list, without numpy (whose per-call
        cost would dominate): the same runs and choices."""
        _check_partitions(num_partitions)
        if any(size < 0 for size in sizes):
            raise InvalidRecordError("record sizes must be ints >= 0")
        return self._few(topic, num_partitions, sizes, log_end_offset, shared_loads(scope))

    def _few(
        self,
        topic: str,
        num_partitions: int,
        sizes: Sequence[int],
        log_end_offset: Callable[[int], int],
        loads: PartitionLoads,
    ) -> list[int]:
        """:meth:`partitions`' runs record by record: a run ends with the record that brings it to
        ``batch_size`` bytes (the next record starts another, on a partition chosen then)."""
        out: list[int] = []
        with self._lock, loads.lock:
            stint: _Stint | None = None
            for size in sizes:
                if stint is None:
                    stint = self._stint(topic, num_partitions, log_end_offset, loads)
                out.append(stint.partition)
                loads.add(stint.partition, 1)
                stint.produced += size
                if stint.produced >= self._batch_size:
                    stint = None
        return out

    def next_partition(self, topic: str, num_partitions: int, record_bytes: int) -> int:
        """Partition of one keyless record, for callers that cannot read log end offsets: loads are the
        records this partitioner assigned itself."""
        return self.partition_list(topic, num_partitions, [record_bytes], _nothing_written, self)[0]

    def _stint(
        self, topic: str, num_partitions: int, log_end_offset: Callable[[int], int], loads: PartitionLoads
    ) -> _Stint:
        """The run of ``topic`` to continue, or a new one on a freshly chosen partition."""
        stint = self._stints.get(topic)
        if stint is None or stint.partition >= num_partitions or stint.produced >= self._batch_size:
            stint = self._stints[topic] = _Stint(self._choose(num_partitions, log_end_offset, loads), 0)
        return stint

    def _choose(
        self, num_partitions: int, log_end_offset: Callable[[int], int], loads: PartitionLoads
    ) -> int:
        """The least loaded candidate partition, ties broken uniformly at random."""
        if num_partitions <= SCAN_ALL:
            candidates: Sequence[int] = range(num_partitions)
        else:
            candidates = self._rng.sample(range(num_partitions), 2)
        best, best_load, ties = 0, -1, 0
        for q in candidates:
            load = loads.estimate(q, log_end_offset(q))
            if best_load < 0 or load < best_load:
                best, best_load, ties = q, load, 1
            elif load == best_load:
                ties += 1
                if self._rng.randrange(ties) == 0:
                    best = q
        return best
