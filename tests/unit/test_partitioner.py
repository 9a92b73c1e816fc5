"""Tests of pylog.partitioner: Kafka-compatible murmur2 (scalar and vectorized) and the sticky partitioner."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pylog import partitioner
from pylog.partitioner import (
    StickyPartitioner,
    murmur2,
    murmur2_fixed,
    murmur2_many,
    partition_for_key,
    partitions_for_keys,
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
)
def test_murmur2_many_matches_reference(
    keys: list[bytes], chunk_rows: int, budget: int, min_vector_rows: int
) -> None:
    expected = [reference_murmur2(k) for k in keys]
    # Default tuning, then small chunks, tiny matrix budgets, and the scalar fallback switched on or off.
    assert murmur2_many(keys).tolist() == expected
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(partitioner, "_CHUNK_ROWS", chunk_rows)
        mp.setattr(partitioner, "_MATRIX_BUDGET", budget)
        mp.setattr(partitioner, "_MIN_VECTOR_ROWS", min_vector_rows)
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
)
def test_murmur2_fixed_matches_reference(
    length: int, rows: int, offset: int, seed: int, chunk_rows: int
) -> None:
    rng = np.random.default_rng(seed)
    wide = rng.integers(0, 256, size=(rows, length + offset), dtype=np.uint8)
    matrix = wide[:, offset:]  # not C-contiguous when offset > 0
    expected = [reference_murmur2(bytes(row)) for row in matrix]
    assert murmur2_fixed(matrix).tolist() == expected
    assert murmur2_fixed(np.ascontiguousarray(matrix)).tolist() == expected
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(partitioner, "_CHUNK_ROWS", chunk_rows)
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


# --- StickyPartitioner -------------------------------------------------------------------------------------


def test_sticky_sticks_for_a_batch_then_moves_round_robin() -> None:
    p = StickyPartitioner(batch_size=1000)
    got = [p.next_partition("t", 3, 100) for _ in range(70)]
    # 10 records of 100 bytes fill a 1000-byte batch; the 10th record still goes to the current partition.
    expected = [(i // 10) % 3 for i in range(70)]
    assert got == expected


def test_sticky_record_crossing_the_threshold_stays() -> None:
    p = StickyPartitioner(batch_size=250)
    sizes = [100, 100, 100, 10, 300, 1, 249]
    got = [p.next_partition("t", 4, s) for s in sizes]
    # 100+100 < 250; +100 crosses -> switch after it; 10 -> p1; 300 crosses -> switch; 1 -> p2; 1+249 -> switch.
    assert got == [0, 0, 0, 1, 1, 2, 2]
    assert p.next_partition("t", 4, 1) == 3


def test_sticky_oversized_records_each_move_on() -> None:
    p = StickyPartitioner(batch_size=100, start=2)
    assert [p.next_partition("t", 5, 1000) for _ in range(7)] == [2, 3, 4, 0, 1, 2, 3]


@settings(max_examples=50, deadline=None)
@given(
    num_partitions=st.integers(1, 20),
    batch_size=st.integers(1, 5000),
    record_bytes=st.integers(1, 600),
    n_records=st.integers(0, 3000),
    start=st.integers(0, 100),
)
def test_sticky_counts_differ_by_at_most_one_batch(
    num_partitions: int, batch_size: int, record_bytes: int, n_records: int, start: int
) -> None:
    p = StickyPartitioner(batch_size=batch_size, start=start)
    got = [p.next_partition("t", num_partitions, record_bytes) for _ in range(n_records)]
    counts = Counter(got)
    assert all(0 <= q < num_partitions for q in counts)
    per_batch = -(-batch_size // record_bytes)  # records that fill one batch
    per_partition = [counts.get(q, 0) for q in range(num_partitions)]
    assert max(per_partition) - min(per_partition) <= per_batch
    # Sticky: the partition changes only after a full batch, so runs have exactly per_batch records.
    if got:
        assert got[0] == start % num_partitions
        runs = [len(list(run)) for run in _runs(got)] if num_partitions > 1 else []
        assert all(r == per_batch for r in runs[:-1])
        assert runs == [] or 1 <= runs[-1] <= per_batch


def _runs(seq: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for x in seq:
        if out and out[-1][0] == x:
            out[-1].append(x)
        else:
            out.append([x])
    return out


@settings(max_examples=50, deadline=None)
@given(
    num_partitions=st.integers(2, 12),
    batch_size=st.integers(1, 4000),
    sizes=st.lists(st.integers(0, 1500), max_size=400),
)
def test_sticky_stints_hold_one_batch_of_bytes(
    num_partitions: int, batch_size: int, sizes: list[int]
) -> None:
    p = StickyPartitioner(batch_size=batch_size)
    got = [p.next_partition("t", num_partitions, s) for s in sizes]
    # Split the records into stints (maximal runs on one partition) and check Kafka's switching rule: a stint
    # ends with the record that brings it to >= batch_size bytes, and not before.
    stints: list[tuple[int, list[int]]] = []
    for q, s in zip(got, sizes, strict=True):
        if stints and stints[-1][0] == q:
            stints[-1][1].append(s)
        else:
            stints.append((q, [s]))
    for i, (q, stint) in enumerate(stints):
        if i > 0:
            assert q == (stints[i - 1][0] + 1) % num_partitions  # round-robin
        assert sum(stint[:-1]) < batch_size  # did not switch early
        if i < len(stints) - 1:
            assert sum(stint) >= batch_size  # switched once full


def test_sticky_is_deterministic_and_per_topic() -> None:
    rng = random.Random(5)
    calls = [(rng.choice(["a", "b", "c"]), rng.randint(0, 900)) for _ in range(2000)]
    runs = []
    for _ in range(2):
        p = StickyPartitioner(batch_size=1500, start=4)
        runs.append([p.next_partition(topic, 6, size) for topic, size in calls])
    assert runs[0] == runs[1]
    # Each topic has its own stint: interleaving does not change a topic's sequence.
    for topic in "abc":
        alone = StickyPartitioner(batch_size=1500, start=4)
        solo = [alone.next_partition(topic, 6, size) for t, size in calls if t == topic]
        assert solo == [q for (t, _), q in zip(calls, runs[0], strict=True) if t == topic]


def test_sticky_start_index() -> None:
    assert StickyPartitioner(start=0).next_partition("t", 4, 1) == 0
    assert StickyPartitioner(start=3).next_partition("t", 4, 1) == 3
    assert StickyPartitioner(start=9).next_partition("t", 4, 1) == 1
    assert StickyPartitioner().batch_size == 16384


def test_sticky_follows_partition_count_changes() -> None:
    p = StickyPartitioner(batch_size=10, start=7)
    assert p.next_partition("t", 8, 5) == 7
    # The topic shrank to 4 partitions: the current partition no longer exists.
    q = p.next_partition("t", 4, 5)
    assert 0 <= q < 4
    assert p.next_partition("t", 4, 10) == (q + 1) % 4
    # It grew: round-robin continues over the new count.
    seen = {p.next_partition("t", 16, 10) for _ in range(16)}
    assert seen == set(range(16))


def test_sticky_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        StickyPartitioner(batch_size=0)
    with pytest.raises(ValueError):
        StickyPartitioner(start=-1)
    p = StickyPartitioner()
    with pytest.raises(ValueError):
        p.next_partition("t", 0, 10)
    with pytest.raises(ValueError):
        p.next_partition("t", 3, -1)
