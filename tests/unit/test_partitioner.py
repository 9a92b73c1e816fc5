"""Tests of pylog.partitioner: Kafka-compatible murmur2 (scalar and vectorized) and the sticky partitioner."""

from __future__ import annotations

import multiprocessing
import random
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pylog
from pylog import partitioner
from pylog.cli import main
from pylog.errors import ConfigError, InvalidRecordError
from pylog.partitioner import (
    KEYLESS_RUN_BYTES,
    SCAN_ALL,
    PartitionLoads,
    StickyPartitioner,
    murmur2,
    murmur2_fixed,
    murmur2_many,
    partition_for_key,
    partition_list,
    partitions_for_keys,
    shared_loads,
    to_positive,
)

# Apache Kafka, clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java, testMurmur2.
KAFKA_VECTORS: dict[bytes, int] = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


# --- Reference model ---------------------------------------------------------------------------------------
# A literal transcription of Kafka's Java Utils.murmur2, emulating Java's signed 32-bit int and signed byte
# arithmetic one byte at a time. Deliberately unlike the module (which works on unsigned words).


def _int(x: int) -> int:
    """Java's (int) narrowing: wrap to a signed 32-bit value."""
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x


def _ushr(x: int, n: int) -> int:
    """Java's ``x >>> n`` on an int."""
    return (x & 0xFFFFFFFF) >> n


def reference_murmur2(raw: bytes) -> int:
    data = [b - 256 if b > 127 else b for b in raw]  # Java bytes are signed
    length = len(data)
    seed = _int(0x9747B28C)
    m = 0x5BD1E995
    r = 24
    h = _int(seed ^ length)
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = _int(
            (data[i4 + 0] & 0xFF)
            + ((data[i4 + 1] & 0xFF) << 8)
            + ((data[i4 + 2] & 0xFF) << 16)
            + ((data[i4 + 3] & 0xFF) << 24)
        )
        k = _int(k * m)
        k = _int(k ^ _ushr(k, r))
        k = _int(k * m)
        h = _int(h * m)
        h = _int(h ^ k)
    rem = length % 4
    # switch (length % 4) with fall-through: case 3 -> case 2 -> case 1.
    if rem >= 3:
        h = _int(h ^ ((data[(length & ~3) + 2] & 0xFF) << 16))
    if rem >= 2:
        h = _int(h ^ ((data[(length & ~3) + 1] & 0xFF) << 8))
    if rem >= 1:
        h = _int(h ^ (data[length & ~3] & 0xFF))
        h = _int(h * m)
    h = _int(h ^ _ushr(h, 13))
    h = _int(h * m)
    h = _int(h ^ _ushr(h, 15))
    return h


def test_reference_model_matches_kafka_vectors() -> None:
    for key, expected in KAFKA_VECTORS.items():
        assert reference_murmur2(key) == expected, key


# --- Kafka vectors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "expected"), KAFKA_VECTORS.items(), ids=[k.decode() for k in KAFKA_VECTORS])
def test_murmur2_kafka_vectors(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected
    assert murmur2_fixed(np.frombuffer(key, dtype=np.uint8).reshape(1, -1)).tolist() == [expected]


def test_murmur2_many_kafka_vectors() -> None:
    keys = list(KAFKA_VECTORS)
    result = murmur2_many(keys)
    assert result.dtype == np.int32
    assert result.tolist() == list(KAFKA_VECTORS.values())
    # Enough copies for the vectorized path (not the scalar fallback for tiny chunks), shuffled.
    many = keys * 50
    random.Random(7).shuffle(many)
    assert murmur2_many(many).tolist() == [KAFKA_VECTORS[k] for k in many]


@pytest.mark.parametrize("scalar_keys", [0, 16, 1000])
def test_kafka_vectors_one_key_at_a_time_on_every_path(
    monkeypatch: pytest.MonkeyPatch, scalar_keys: int
) -> None:
    # One key per call, as a drain of one record hashes it: vectorized (0), the scalar path of calls with a few
    # keys (16, the default), scalar for any call (1000).
    monkeypatch.setattr(partitioner, "_SCALAR_KEYS", scalar_keys)
    for key, expected in KAFKA_VECTORS.items():
        assert murmur2_many([key]).tolist() == [expected]
        assert murmur2_fixed(np.frombuffer(key, dtype=np.uint8).reshape(1, -1)).tolist() == [expected]
        for n in (2, 7, 8, 10, 1000):
            assert partitions_for_keys([key], n).tolist() == [to_positive(expected) % n]
            assert partition_list([key], n) == [to_positive(expected) % n]
    keys = list(KAFKA_VECTORS)
    assert murmur2_many(keys).tolist() == list(KAFKA_VECTORS.values())
    assert partition_list(keys, 12) == [to_positive(h) % 12 for h in KAFKA_VECTORS.values()]


def test_murmur2_is_signed_32_bit() -> None:
    # Kafka's vectors include negative results: the hash is Java's signed int, not an unsigned value.
    assert murmur2(b"21") < 0 < murmur2(b"abc")
    for i in range(2000):
        assert -(2**31) <= murmur2(i.to_bytes(4, "big")) < 2**31


def test_to_positive_clears_the_sign_bit() -> None:
    assert to_positive(0) == 0
    assert to_positive(5) == 5
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-(2**31)) == 0  # unlike abs(), which Kafka avoids because it overflows here
    assert to_positive(2**31 - 1) == 2**31 - 1
    assert to_positive(-973932308) == 1173551340


@pytest.mark.parametrize(
    ("key", "num_partitions", "expected"),
    [
        # to_positive(murmur2(key)) % n, worked out by hand from Kafka's vectors.
        (b"21", 1, 0),
        (b"21", 10, 0),  # 1173551340
        (b"21", 7, 1173551340 % 7),
        (b"foobar", 10, 6),  # 2**31 - 790332482 = 1357151166
        (b"foobar", 3, 1357151166 % 3),
        (b"abc", 10, 7),  # 479470107
        (b"abc", 1000, 107),
        (b"a-little-bit-long-string", 100, 12),  # 2**31 - 985981536 = 1161502112
    ],
)
def test_partition_for_key_kafka_vectors(key: bytes, num_partitions: int, expected: int) -> None:
    assert partition_for_key(key, num_partitions) == expected
    assert partitions_for_keys([key] * 70, num_partitions).tolist() == [expected] * 70


# --- Agreement with the reference model --------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=80))
def test_murmur2_matches_reference(key: bytes) -> None:
    assert murmur2(key) == reference_murmur2(key)


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(st.binary(max_size=80), max_size=150),
    chunk_rows=st.sampled_from([1, 3, 17, 65536]),
    budget=st.sampled_from([4, 64, 1 << 24]),
    min_vector_rows=st.sampled_from([0, 2, 64]),
    scalar_keys=st.sampled_from([0, 16, 1000]),
)
def test_murmur2_many_matches_reference(
    keys: list[bytes], chunk_rows: int, budget: int, min_vector_rows: int, scalar_keys: int
) -> None:
    expected = [reference_murmur2(k) for k in keys]
    # Default tuning, then small chunks, tiny matrix budgets, the scalar fallback switched on or off, and
    # calls of a few keys vectorized (0) or every call scalar (1000).
    assert murmur2_many(keys).tolist() == expected
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(partitioner, "_CHUNK_ROWS", chunk_rows)
        mp.setattr(partitioner, "_MATRIX_BUDGET", budget)
        mp.setattr(partitioner, "_MIN_VECTOR_ROWS", min_vector_rows)
        mp.setattr(partitioner, "_SCALAR_KEYS", scalar_keys)
        result = murmur2_many(keys)
    assert result.dtype == np.int32
    assert result.shape == (len(keys),)
    assert result.tolist() == expected


@settings(max_examples=60, deadline=None)
@given(
    length=st.integers(0, 40),
    rows=st.integers(0, 100),
    offset=st.integers(0, 3),
    seed=st.integers(0, 2**32 - 1),
    chunk_rows=st.sampled_from([1, 7, 65536]),
    scalar_keys=st.sampled_from([0, 16, 1000]),
)
def test_murmur2_fixed_matches_reference(
    length: int, rows: int, offset: int, seed: int, chunk_rows: int, scalar_keys: int
) -> None:
    rng = np.random.default_rng(seed)
    wide = rng.integers(0, 256, size=(rows, length + offset), dtype=np.uint8)
    matrix = wide[:, offset:]  # not C-contiguous when offset > 0
    expected = [reference_murmur2(bytes(row)) for row in matrix]
    assert murmur2_fixed(matrix).tolist() == expected
    assert murmur2_fixed(np.ascontiguousarray(matrix)).tolist() == expected
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(partitioner, "_CHUNK_ROWS", chunk_rows)
        mp.setattr(partitioner, "_SCALAR_KEYS", scalar_keys)
        assert murmur2_fixed(matrix).tolist() == expected
        # All keys the same length: murmur2_many takes the fixed-length path.
        assert murmur2_many([bytes(row) for row in matrix]).tolist() == expected


def test_murmur2_many_edge_cases() -> None:
    assert murmur2_many([]).tolist() == []
    assert murmur2_many([]).dtype == np.int32
    empty = reference_murmur2(b"")
    assert murmur2(b"") == empty
    assert murmur2_many([b""] * 100).tolist() == [empty] * 100
    assert murmur2_fixed(np.zeros((5, 0), dtype=np.uint8)).tolist() == [empty] * 5
    # Every tail length next to the empty key, in one vectorized call.
    keys = [bytes(range(i % 9)) for i in range(200)]
    assert murmur2_many(keys).tolist() == [reference_murmur2(k) for k in keys]
    # Bytes >= 0x80 (negative Java bytes) in full words and in the tail.
    keys = [bytes([0xFF] * n) for n in range(12)] * 10
    assert murmur2_many(keys).tolist() == [reference_murmur2(k) for k in keys]


def test_murmur2_many_long_and_short_keys_mixed() -> None:
    rng = random.Random(3)
    keys = [rng.randbytes(rng.randint(0, 40)) for _ in range(3000)]
    # A few very long keys (scalar fallback) and a group of long ones (vectorized).
    keys += [rng.randbytes(rng.randint(1025, 5000)) for _ in range(5)]
    keys += [rng.randbytes(rng.randint(1100, 1200)) for _ in range(100)]
    rng.shuffle(keys)
    result = murmur2_many(keys)
    assert result.tolist() == [murmur2(k) for k in keys]
    long_key = max(keys, key=len)
    assert murmur2(long_key) == reference_murmur2(long_key)


def test_murmur2_many_more_rows_than_one_chunk() -> None:
    rng = np.random.default_rng(11)
    n = 70_000  # > _CHUNK_ROWS
    lengths = rng.integers(0, 24, size=n)
    blob = rng.bytes(int(lengths.sum()))
    ends = np.cumsum(lengths).tolist()
    keys = [blob[e - ln : e] for e, ln in zip(ends, lengths.tolist(), strict=True)]
    assert murmur2_many(keys).tolist() == [murmur2(k) for k in keys]
    fixed = np.frombuffer(rng.bytes(n * 16), dtype=np.uint8).reshape(n, 16)
    fixed_keys = [fixed[i].tobytes() for i in range(n)]
    assert murmur2_fixed(fixed).tolist() == [murmur2(k) for k in fixed_keys]
    assert murmur2_many(fixed_keys).tolist() == murmur2_fixed(fixed).tolist()


def test_murmur2_fixed_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        murmur2_fixed(np.zeros(8, dtype=np.uint8))
    with pytest.raises(ValueError):
        murmur2_fixed(np.zeros((2, 8), dtype=np.int64))


# --- Partition ranges --------------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(keys=st.lists(st.binary(max_size=40), min_size=1, max_size=100), n=st.integers(1, 10_000))
def test_partitions_are_in_range_and_agree(keys: list[bytes], n: int) -> None:
    scalar = [partition_for_key(k, n) for k in keys]
    assert all(0 <= p < n for p in scalar)
    assert scalar == [to_positive(reference_murmur2(k)) % n for k in keys]
    vector = partitions_for_keys(keys, n)
    assert vector.dtype == np.int32
    assert vector.tolist() == scalar


@settings(max_examples=150, deadline=None)
@given(
    keys=st.lists(st.binary(max_size=70), max_size=40),
    n=st.integers(1, 5000),
    scalar_keys=st.sampled_from([0, 1000]),
)
def test_scalar_and_vectorized_partitions_agree(keys: list[bytes], n: int, scalar_keys: int) -> None:
    expected = [to_positive(reference_murmur2(k)) % n for k in keys]
    assert partition_list(keys, n) == expected  # the scalar path, whatever the number of keys
    assert partitions_for_keys(keys, n).tolist() == expected  # default: scalar below 16 keys
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(partitioner, "_SCALAR_KEYS", scalar_keys)  # every call vectorized (0) or scalar (1000)
        vector = partitions_for_keys(keys, n)
        assert vector.dtype == np.int32
        assert vector.tolist() == expected
        assert murmur2_many(keys).tolist() == [reference_murmur2(k) for k in keys]


def test_partitions_use_every_partition() -> None:
    keys = [b"order-%d" % i for i in range(10_000)]
    counts = np.bincount(partitions_for_keys(keys, 12), minlength=12)
    assert counts.size == 12
    assert counts.min() > 700  # ~833 expected per partition: the hash spreads keys


def test_partition_count_must_be_positive() -> None:
    with pytest.raises(ValueError):
        partition_for_key(b"k", 0)
    with pytest.raises(ValueError):
        partitions_for_keys([b"k"], 0)
    with pytest.raises(ValueError):
        partition_list([b"k"], 0)


# --- StickyPartitioner: the rule, against a model --------------------------------------------------------
# Model: Kafka's switching rule splits the keyless records of a topic into runs (a run ends with the record that
# brings it to >= batch_size bytes, over all calls); each run goes to one partition, chosen when it starts among
# the partitions whose log end offset was read, as one of least load = log end offset seen first + records
# assigned since.


class _Scope:
    """Stands for an open topic: partitioners given the same scope share their loads."""


def _model_runs(sizes: list[int], batch_size: int) -> list[range]:
    runs: list[range] = []
    start, acc = 0, 0
    for i, size in enumerate(sizes):
        acc += size
        if acc >= batch_size:
            runs.append(range(start, i + 1))
            start, acc = i + 1, 0
    if start < len(sizes):
        runs.append(range(start, len(sizes)))
    return runs


class _Topic:
    """A topic of the model: log end offsets, a record of which were read, and deferred writes."""

    def __init__(self, initial: list[int]) -> None:
        self.leo = list(initial)
        self.reads: list[int] = []
        self.unwritten: list[int] = []

    def log_end_offset(self, partition: int) -> int:
        self.reads.append(partition)
        return self.leo[partition]

    def write(self) -> None:
        for q in self.unwritten:
            self.leo[q] += 1
        self.unwritten = []


def _assign_in_chunks(
    sticky: StickyPartitioner, topic: _Topic, n: int, sizes: list[int], cuts: list[int], write_every: int
) -> tuple[list[int], list[list[int]]]:
    """Assign ``sizes`` in chunks ending at ``cuts``, writing the assigned records after every
    ``write_every``-th chunk; returns the partitions and the log end offsets read during each chunk."""
    scope = _Scope()
    got: list[int] = []
    reads: list[list[int]] = []
    bounds = sorted({c for c in cuts if 0 < c < len(sizes)} | {len(sizes)})
    start = 0
    for k, stop in enumerate(bounds):
        topic.reads = []
        parts = sticky.partitions("t", n, sizes[start:stop], topic.log_end_offset, scope).tolist()
        got += parts
        reads.append(topic.reads)
        topic.unwritten += parts
        if k % write_every == 0:
            topic.write()
        start = stop
    return got, reads


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, SCAN_ALL),
    batch_size=st.integers(1, 3000),
    sizes=st.lists(st.integers(0, 900), max_size=300),
    initial=st.lists(st.integers(0, 40), min_size=SCAN_ALL, max_size=SCAN_ALL),
    cuts=st.lists(st.integers(0, 300), max_size=20),
    write_every=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_sticky_runs_go_to_a_least_loaded_partition(
    n: int,
    batch_size: int,
    sizes: list[int],
    initial: list[int],
    cuts: list[int],
    write_every: int,
    seed: int,
) -> None:
    topic = _Topic(initial[:n])
    sticky = StickyPartitioner(batch_size, rng=random.Random(seed))
    got, reads = _assign_in_chunks(sticky, topic, n, sizes, cuts, write_every)
    runs = _model_runs(sizes, batch_size)
    assigned = [0] * n
    for run in runs:
        chosen = got[run[0]]
        assert {got[i] for i in run} == {chosen}  # one partition per run, across calls
        loads = [initial[q] + assigned[q] for q in range(n)]
        assert loads[chosen] == min(loads)  # with at most SCAN_ALL partitions, all are candidates
        assigned[chosen] += len(run)
    # Each run read every partition's log end offset once, and nothing else did.
    assert sorted(q for chunk in reads for q in chunk) == sorted(list(range(n)) * len(runs))


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 3 * SCAN_ALL),  # every partition a candidate, or two random ones
    batch_size=st.integers(1, 400),
    # Sizes of a few values, so that runs often reach batch_size exactly.
    calls=st.lists(st.lists(st.sampled_from([0, 1, 10, 50, 100]), max_size=40), max_size=25),
    initial=st.lists(st.integers(0, 40), min_size=3 * SCAN_ALL, max_size=3 * SCAN_ALL),
    seed=st.integers(0, 2**32 - 1),
)
def test_sticky_record_loop_and_vectorized_runs_agree(
    n: int, batch_size: int, calls: list[list[int]], initial: list[int], seed: int
) -> None:
    # partition_list (a loop over a few records, without numpy) and partitions (numpy, forced for every call)
    # make the same runs and choices: with the same seed and loads, the same partitions from the same reads.
    results = []
    for vectorized in (True, False):
        topic = _Topic(initial[:n])
        sticky = StickyPartitioner(batch_size, rng=random.Random(seed))
        scope = _Scope()
        got = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(partitioner, "_SCALAR_KEYS", 0)
            for k, sizes in enumerate(calls):
                if vectorized:
                    parts = sticky.partitions("t", n, sizes, topic.log_end_offset, scope).tolist()
                else:
                    parts = sticky.partition_list("t", n, sizes, topic.log_end_offset, scope)
                got.append(parts)
                topic.unwritten += parts
                if k % 2 == 0:
                    topic.write()
        results.append((got, topic.reads))
    assert results[0] == results[1]


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, SCAN_ALL),
    batch_size=st.integers(1, 3000),
    sizes=st.lists(st.integers(1, 900), max_size=400),
    seed=st.integers(0, 2**32 - 1),
)
def test_sticky_keeps_partitions_within_one_run(n: int, batch_size: int, sizes: list[int], seed: int) -> None:
    # Each run starts on a least loaded partition and adds at most R records (R = the longest run), so the
    # fullest partition never holds more than R records more than the emptiest (greedy balancing).
    sticky = StickyPartitioner(batch_size, rng=random.Random(seed))
    got = sticky.partitions("t", n, sizes, lambda q: 0, _Scope()).tolist()
    runs = _model_runs(sizes, batch_size)
    counts = [got.count(q) for q in range(n)]
    longest = max((len(r) for r in runs), default=0)
    assert max(counts) - min(counts) <= longest
    assert min(counts) > 0 or len(runs) < n  # every partition gets a run once there are enough runs


def test_sticky_large_topics_use_two_random_candidates() -> None:
    n, runs = 4 * SCAN_ALL, 40 * SCAN_ALL
    for seed in range(3):
        topic = _Topic([0] * n)
        sticky = StickyPartitioner(100, rng=random.Random(seed))
        scope = _Scope()
        assigned = [0] * n
        for _ in range(runs):
            topic.reads = []
            (chosen,) = sticky.partitions("t", n, [100], topic.log_end_offset, scope).tolist()
            candidates = topic.reads
            assert len(candidates) == 2 and len(set(candidates)) == 2  # two distinct reads per choice
            assert chosen in candidates
            assert assigned[chosen] == min(assigned[q] for q in candidates)
            assigned[chosen] += 1
        # Power of two choices keeps the gap at O(log log n) runs; a uniformly random choice would leave
        # a gap of about 2 * sqrt(2 * runs / n * ln n) ~ 17 runs here.
        assert max(assigned) - min(assigned) <= 6


def test_sticky_ties_are_broken_at_random() -> None:
    # On an empty topic every partition is least loaded: the first choice depends on the random source only.
    firsts = Counter(
        StickyPartitioner(rng=random.Random(seed)).partitions("t", 8, [1], lambda q: 0, _Scope())[0]
        for seed in range(200)
    )
    assert set(firsts) == set(range(8))
    same = [
        StickyPartitioner(rng=random.Random(7)).partitions("t", 8, [1] * 5, lambda q: 0, _Scope()).tolist()
        for _ in range(2)
    ]
    assert same[0] == same[1]  # seeded: deterministic


def test_sticky_partitioners_of_one_scope_see_each_others_assignments() -> None:
    # Nothing is written (log end offsets stay 0): only the shared loads tell the partitioners apart.
    scope = _Scope()
    firsts = [
        StickyPartitioner(rng=random.Random(seed)).partitions("t", 8, [1], lambda q: 0, scope)[0]
        for seed in range(8)
    ]
    assert sorted(firsts) == list(range(8))


def test_sticky_is_per_topic() -> None:
    rng = random.Random(5)
    calls = [(rng.choice("abc"), rng.randint(0, 900)) for _ in range(600)]
    sticky = StickyPartitioner(1500, rng=random.Random(1))
    scopes = {t: _Scope() for t in "abc"}
    got = [sticky.partitions(t, 6, [size], lambda q: 0, scopes[t])[0] for t, size in calls]
    for topic in "abc":
        sizes = [size for t, size in calls if t == topic]
        parts = [q for (t, _), q in zip(calls, got, strict=True) if t == topic]
        for run in _model_runs(sizes, 1500):
            assert len({parts[i] for i in run}) == 1


def test_sticky_follows_partition_count_changes() -> None:
    sticky = StickyPartitioner(10, rng=random.Random(3))
    scope = _Scope()
    leo = [5] * 4 + [0] * 8
    first = sticky.partitions("t", 8, [1], leo.__getitem__, scope)[0]
    assert 4 <= first < 8  # the least loaded
    # The run's partition no longer exists when the topic has 4 partitions: a new run starts below 4.
    assert 0 <= sticky.partitions("t", 4, [1], leo.__getitem__, scope)[0] < 4
    # Grown to 12 with the first 8 loaded: the run ends, the next one goes to a new, empty partition.
    leo[:8] = [50] * 8
    assert sticky.partitions("t", 12, [10, 10], leo.__getitem__, scope).tolist()[1] >= 8


def test_next_partition_balances_its_own_assignments() -> None:
    sticky = StickyPartitioner(100, rng=random.Random(2))
    got = [sticky.next_partition("t", 8, 50) for _ in range(64)]
    for run in _model_runs([50] * 64, 100):
        assert len({got[i] for i in run}) == 1
    assert Counter(got) == dict.fromkeys(range(8), 8)  # 32 runs of 2 records, 4 runs per partition


def test_partition_loads_count_unwritten_records_and_restart_after_truncation() -> None:
    loads = PartitionLoads()
    assert loads.estimate(0, 100) == 100
    loads.add(0, 30)
    assert loads.estimate(0, 100) == 130  # 30 assigned, not written yet
    assert loads.estimate(0, 120) == 130  # 20 of them written
    assert loads.estimate(0, 500) == 500  # another process wrote more
    assert loads.estimate(0, 40) == 40  # truncated below what was first seen: counted afresh
    loads.add(0, 5)
    assert loads.estimate(0, 40) == 45
    assert shared_loads(scope := _Scope()) is shared_loads(scope)
    assert shared_loads(scope) is not shared_loads(_Scope())


def test_sticky_rejects_bad_arguments() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigError):
            StickyPartitioner(bad)  # type: ignore[arg-type]
    sticky = StickyPartitioner()
    assert sticky.batch_size == KEYLESS_RUN_BYTES
    with pytest.raises(ConfigError):
        sticky.partitions("t", 0, [10], lambda q: 0, _Scope())
    with pytest.raises(InvalidRecordError):
        sticky.partitions("t", 3, [10, -1], lambda q: 0, _Scope())
    with pytest.raises(InvalidRecordError):
        sticky.partitions("t", 3, [[10]], lambda q: 0, _Scope())
    assert sticky.partitions("t", 3, [], lambda q: 0, _Scope()).tolist() == []
    with pytest.raises(ConfigError):
        sticky.partition_list("t", 0, [10], lambda q: 0, _Scope())
    with pytest.raises(InvalidRecordError):
        sticky.partition_list("t", 3, [10, -1], lambda q: 0, _Scope())
    assert sticky.partition_list("t", 3, [], lambda q: 0, _Scope()) == []


# --- Keyless records through the producer, on a real log ------------------------------------------------
# Loads are log end offsets, so these bounds hold whatever the random tie-breaks: a producer's runs (and
# short-lived producers that follow one another) always start on a least loaded partition.

PARTITIONS = 8
VALUE = b"v" * 32
# Records per run at most: a run holds KEYLESS_RUN_BYTES of records and a record counts at least its value's
# bytes.
RUN = -(-KEYLESS_RUN_BYTES // len(VALUE))


def _end_offsets(log: pylog.Log, topic: str = "t") -> list[int]:
    ends = log.topic(topic).end_offsets()
    return [ends[p] for p in range(PARTITIONS)]


def _check_greedy_spread(counts: list[int], run: int) -> None:
    """Greedy balancing: max - min <= one run; with more runs than partitions, every partition has one."""
    total = sum(counts)
    assert max(counts) - min(counts) <= run, counts
    assert min(counts) >= (total - (PARTITIONS - 1) * run) / PARTITIONS, counts


def test_one_producer_spreads_small_keyless_records(tmp_path: Path) -> None:
    n = 8000
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("t", partitions=PARTITIONS)
        producer = log.producer(value_serializer=None)
        futures = [producer.send("t", VALUE) for _ in range(n)]
        producer.close()
        counts = _end_offsets(log)
        assert Counter(f.get().partition for f in futures) == dict(enumerate(counts))
    # min >= (8000 - 7 * 128) / 8 = 888 and max <= min + 128, hence max / min < 2.
    _check_greedy_spread(counts, RUN)
    assert min(counts) > 0
    assert max(counts) < 2 * min(counts)


def _produce_keyless(path: str, records: int) -> list[int]:
    """One short-lived producer: ``records`` keyless records, then close; returns their partitions."""
    with pylog.open(path) as log:
        producer = log.producer(value_serializer=None)
        futures = [producer.send("t", VALUE) for _ in range(records)]
        producer.close()
        return [f.get().partition for f in futures]


def _create_topic(path: Path) -> None:
    with pylog.open(path) as log:
        log.create_topic("t", partitions=PARTITIONS)


def test_short_lived_producers_one_after_another(tmp_path: Path) -> None:
    _create_topic(tmp_path / "log")
    for _ in range(10):
        parts = _produce_keyless(str(tmp_path / "log"), 100)
        assert len(set(parts)) == 1  # 100 small records are one run
    with pylog.open(tmp_path / "log") as log:
        counts = _end_offsets(log)
    # Each producer's run of 100 went to a least loaded partition: 8 partitions get 100, two get 200.
    _check_greedy_spread(counts, 100)
    assert min(counts) == 100


def test_short_lived_producers_in_threads_share_their_loads(tmp_path: Path) -> None:
    # Producers of one Log see each other's assignments before they are written, so even when all start at
    # once the first 8 runs go to 8 different partitions; the other two land anywhere.
    start = threading.Barrier(10)
    results: list[list[int]] = []
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("t", partitions=PARTITIONS)

        def produce() -> None:
            producer = log.producer(value_serializer=None)
            start.wait()
            futures = [producer.send("t", VALUE) for _ in range(100)]
            producer.close()
            results.append([f.get().partition for f in futures])

        threads = [threading.Thread(target=produce) for _ in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        counts = _end_offsets(log)
    assert len(results) == 10 and all(len(set(parts)) == 1 for parts in results)
    assert min(counts) >= 100 and max(counts) <= 300
    assert sum(counts) == 1000


def test_short_lived_producers_in_separate_processes(tmp_path: Path) -> None:
    # A producer in another process sees what the earlier ones wrote (their log end offsets) and starts on
    # the emptiest partition: producers that follow one another take distinct partitions while one is empty.
    # Each runs in a process of its own, forked from a server process that imported this module.
    _create_topic(tmp_path / "log")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    with ctx.Pool(1, maxtasksperchild=1) as pool:
        runs = [pool.apply(_produce_keyless, (str(tmp_path / "log"), 100)) for _ in range(4)]
    assert all(len(set(parts)) == 1 for parts in runs)
    assert len({parts[0] for parts in runs}) == 4
    with pylog.open(tmp_path / "log") as log:
        counts = _end_offsets(log)
    assert sorted(counts) == [0] * (PARTITIONS - 4) + [100] * 4


@pytest.mark.parametrize("form", ["list", "array"])
def test_send_batch_spreads_keyless_records(tmp_path: Path, form: str) -> None:
    n = 8000
    values: Any = [VALUE] * n if form == "list" else np.frombuffer(VALUE * n, np.uint8).reshape(n, -1)
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("t", partitions=PARTITIONS)
        with log.producer() as producer:
            result = producer.send_batch("t", values=values)
        counts = _end_offsets(log)
    assert np.bincount(result.partitions, minlength=PARTITIONS).tolist() == counts
    _check_greedy_spread(counts, RUN)
    assert min(counts) > 0


def test_send_batch_mixed_keys(tmp_path: Path) -> None:
    n = 8000
    keys = [None if i % 2 else b"key-%d" % i for i in range(n)]
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("t", partitions=PARTITIONS)
        with log.producer() as producer:
            result = producer.send_batch("t", keys=keys, values=[VALUE] * n)
    parts = result.partitions.tolist()
    for key, part in zip(keys, parts, strict=True):
        if key is not None:
            assert part == partition_for_key(key, PARTITIONS)
    keyless = [0] * PARTITIONS
    for key, part in zip(keys, parts, strict=True):
        if key is None:
            keyless[part] += 1
    _check_greedy_spread(keyless, RUN)
    assert min(keyless) > 0


def test_cli_produce_runs_spread_keyless_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log_dir = str(tmp_path / "log")
    _create_topic(tmp_path / "log")
    lines = tmp_path / "lines.txt"
    lines.write_bytes((VALUE + b"\n") * 100)
    for _ in range(10):
        assert main(["--dir", log_dir, "produce", "t", "--file", str(lines), "--no-progress"]) == 0
    capsys.readouterr()
    with pylog.open(log_dir) as log:
        counts = _end_offsets(log)
    # Each run of `pylog produce` is a short-lived producer whose 100 records are one run.
    _check_greedy_spread(counts, 100)
    assert min(counts) == 100
    lines.write_bytes((VALUE + b"\n") * 8000)
    assert main(["--dir", log_dir, "produce", "t", "--file", str(lines), "--no-progress"]) == 0
    with pylog.open(log_dir) as log:
        more = [b - a for a, b in zip(counts, _end_offsets(log), strict=True)]
    assert sum(more) == 8000
    assert min(more) > 0
