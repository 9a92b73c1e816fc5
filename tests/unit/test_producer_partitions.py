"""Where the producer's records land: keyed records in Kafka's murmur2 partition, records with a partition of their
own in it, keyless ones in sticky runs, each partition in send order, whatever the size of the drain that writes
them (a drain of a few records, as when each ``send().get()`` waits, is partitioned and encoded without numpy;
a larger one with it) and whatever ``acks``."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pylog
from pylog import accumulator, partitioner
from pylog.partitioner import StickyPartitioner, partition_for_key
from pylog.structs import RecordMetadata

PARTITIONS = 8
_topics = itertools.count()


@dataclass(frozen=True)
class Rec:
    key: bytes | None
    value: bytes
    partition: int | None = None
    timestamp: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the vectorized path ran for a drain of a few records")


def _send(producer: Any, topic: str, r: Rec) -> Any:
    return producer.send(
        topic,
        value=r.value,
        key=r.key,
        partition=r.partition,
        timestamp_ms=r.timestamp,
        headers=list(r.headers) or None,
    )


def _read(log: pylog.Log, topic: str) -> dict[int, list[Any]]:
    c = log.consumer(
        topic,
        auto_offset_reset="earliest",
        consumer_timeout_ms=0,
        key_deserializer=None,
        value_deserializer=None,
    )
    out: dict[int, list[Any]] = {}
    for r in c:
        out.setdefault(r.partition, []).append(r)
    c.close()
    return out


def _check(
    log: pylog.Log, topic: str, sent: list[tuple[Rec, RecordMetadata]], now: int, acks: int | str
) -> None:
    """Every record is where its metadata says, keyed ones in Kafka's partition, each partition in send order,
    with its key, value, headers and timestamp; with acks="all" every acknowledged record is fsynced."""
    expected: dict[int, list[tuple[Rec, RecordMetadata]]] = {}
    for r, md in sent:
        if r.partition is not None:
            assert md.partition == r.partition
        elif r.key is not None:
            assert md.partition == partition_for_key(r.key, PARTITIONS)
        expected.setdefault(md.partition, []).append((r, md))
    written = _read(log, topic)
    assert sorted(written) == sorted(expected)
    for part, records in expected.items():
        got = written[part]
        assert [(g.key, g.value) for g in got] == [(r.key, r.value) for r, _ in records]  # send order
        assert [g.offset for g in got] == [md.offset for _, md in records]
        assert [g.timestamp for g in got] == [now if r.timestamp is None else r.timestamp for r, _ in records]
        assert [g.timestamp for g in got] == [md.timestamp for _, md in records]
        assert [tuple(g.headers) for g in got] == [r.headers for r, _ in records]
        if acks == "all":
            assert log.topic(topic).partition(part).flushed_offset >= records[-1][1].offset + 1


@pytest.mark.parametrize("acks", [1, "all"])
def test_a_drain_of_a_few_records_on_a_multi_partition_topic_does_not_use_numpy_paths(
    log: pylog.Log, monkeypatch: pytest.MonkeyPatch, acks: int | str
) -> None:
    """``send().get()`` one record at a time, and a drain of a few records to several partitions, on an
    8-partition topic: partitioned with the scalar murmur2 and the sticky partitioner's record loop, encoded
    per partition without grouping arrays (numpy's per-call cost made such a call 6x the one-partition one);
    the records land where Kafka puts them, in order."""
    monkeypatch.setattr(partitioner, "_hash_sorted", _refuse)
    monkeypatch.setattr(StickyPartitioner, "partitions", _refuse)
    monkeypatch.setattr(accumulator, "group", _refuse)
    log.create_topic("t", partitions=PARTITIONS)
    producer = log.producer(acks=acks, value_serializer=None, key_serializer=None)
    now = log.clock.time_ms()
    sent: list[tuple[Rec, RecordMetadata]] = []
    one_by_one = [
        Rec(b"21", b"v0"),
        Rec(b"foobar", b"v1"),
        Rec(None, b"v2"),
        Rec(b"abc", b"v3", partition=5),
        Rec(None, b"v4", headers=(("h", b"x"),)),
        Rec(b"a-little-bit-long-string", b"v5", timestamp=1_699_999_000_000),
    ]
    for r in one_by_one:
        sent.append((r, _send(producer, "t", r).get(timeout=30)))
    few = [Rec(b"key-%d" % i, b"w%d" % i, headers=(("i", b"%d" % i),) if i % 2 else ()) for i in range(10)]
    futures = [_send(producer, "t", r) for r in few]
    sent += [(r, f.get(timeout=30)) for r, f in zip(few, futures, strict=True)]
    assert len({md.partition for r, md in sent if r in few}) > 1  # a drain of records to several partitions
    producer.close()
    _check(log, "t", sent, now, acks)


_records = st.builds(
    Rec,
    key=st.one_of(st.none(), st.binary(max_size=24)),
    value=st.binary(max_size=60),
    partition=st.one_of(st.none(), st.none(), st.integers(0, PARTITIONS - 1)),
    timestamp=st.one_of(st.none(), st.none(), st.integers(1_699_990_000_000, 1_700_000_000_000)),
    headers=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.binary(max_size=8)), max_size=2).map(tuple),
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    drains=st.lists(
        st.one_of(st.lists(_records, min_size=1, max_size=4), st.lists(_records, min_size=30, max_size=50)),
        min_size=1,
        max_size=8,
    ),
    acks=st.sampled_from([1, "all"]),
)
def test_records_land_in_their_partitions_in_order_whatever_the_drain_size(
    log: pylog.Log, drains: list[list[Rec]], acks: int | str
) -> None:
    """Drains of 1-4 records (the path without numpy) and of 30-50 (more than one small batch: the vectorized
    path), mixed keyed, keyless, with a partition, a timestamp or headers of their own: every record lands
    in its partition (Kafka's for a keyed one), each partition in send order, with its fields."""
    topic = f"t{next(_topics)}"
    log.create_topic(topic, partitions=PARTITIONS)
    producer = log.producer(acks=acks, value_serializer=None, key_serializer=None)
    now = log.clock.time_ms()
    sent: list[tuple[Rec, RecordMetadata]] = []
    for drain in drains:
        futures = [_send(producer, topic, r) for r in drain]
        futures[-1].get(timeout=30)  # drains them all, in this thread
        sent += [(r, f.get(timeout=0)) for r, f in zip(drain, futures, strict=True)]
    producer.close()
    _check(log, topic, sent, now, acks)
