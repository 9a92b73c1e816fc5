"""A damaged stored batch, read through ``pylog serve`` by real Kafka clients (confluent-kafka, kafka-python).

The log: topic ``t`` with two partitions. Partition 0 holds 5 segments of one batch of 10 records each
(offsets 0-49); the batch of offsets 20-29 (the third segment) is damaged: a flipped payload byte (its CRC
no longer matches), a flipped base offset (outside the CRC: it no longer continues the batch before it), or a
flipped control bit (inside the CRC; a read_committed reader would leave a control batch out). Partition 1
holds 50 intact records.

What a client must see, as with a Kafka broker reporting a corrupt batch: every record before the damaged
batch, then CORRUPT_MESSAGE (librdkafka's INVALID_MSG, kafka-python's CorruptRecordError) at its offset,
never a record past it; a commit never passes it; partition 1 and other clients are served as usual.
"""

from __future__ import annotations

import glob
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import kafka
import kafka.errors
import pytest
from kafka_support import WAIT_S, wait_until

import pylog
from pylog.broker.broker import Broker

DAMAGED = 20  # base offset of the damaged batch
PER_BATCH = 10
BATCHES = 5
TS = 1_700_000_000_000  # record i has timestamp TS + i


def _build(root: Path, *, compacted: bool = False) -> None:
    with pylog.open(root) as log:
        log.create_topic("t", partitions=2, **({"cleanup_policy": "compact"} if compacted else {}))
        producer = log.producer(acks=1, value_serializer=None, key_serializer=None)
        for b in range(BATCHES):
            for i in range(b * PER_BATCH, (b + 1) * PER_BATCH):
                for p in (0, 1):
                    producer.send(
                        "t", f"v{i}".encode(), key=f"k{i}".encode(), partition=p, timestamp_ms=TS + i
                    )
            producer.flush()
            log.topic("t").partition(0).roll()
        producer.close()


def _segment(root: Path, base: int) -> str:
    found = [s for s in glob.glob(os.path.join(root, "t-0", "*.log")) if s.endswith(f"{base:020d}.log")]
    assert len(found) == 1
    return found[0]


def _flip(path: str, position: int, mask: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ mask]))


HEADER = 64
DAMAGE = {
    "crc": (HEADER + 20, 0x10),  # a payload byte
    "base_offset": (0, 0x40),  # base offset 20 -> 84, outside the CRC
    "control_bit": (18, 0x20),  # the attributes' control bit, inside the CRC
}


def _damage(root: Path, kind: str) -> None:
    path = _segment(root, DAMAGED)
    with open(path, "rb") as f:
        assert struct.unpack("<q", f.read(8))[0] == DAMAGED
    at, mask = DAMAGE[kind]
    _flip(path, at, mask)


def _intact(kind: str) -> int:
    """The records of partition 0 a client receives: those before the damaged batch. A damaged base offset
    is found when the partition is opened (recovery checks that each segment's batches continue its base
    offset); the partition is then refused whole, as to pylog's own consumers, until it is repaired."""
    return 0 if kind == "base_offset" else DAMAGED


def _errors_wanted(intact: int) -> int:
    """Errors to wait for: a partition that cannot be opened fails the client's ListOffsets (its start
    offset) with KAFKA_STORAGE_ERROR, which clients retry without a word: they stall, and skip nothing."""
    return 3 if intact else 0


@pytest.fixture(params=sorted(DAMAGE))
def damaged(request: Any, log_dir: Path) -> Iterator[tuple[Broker, int]]:
    _build(log_dir)
    _damage(log_dir, request.param)
    with pylog.serve(log_dir) as b:
        yield b, _intact(request.param)


def _confluent(broker: Broker, **extra: Any) -> ck.Consumer:
    return ck.Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": "g",
            "enable.auto.commit": False,
            "fetch.error.backoff.ms": 50,
            **extra,
        }
    )


def _drain(c: ck.Consumer, errors_wanted: int = 3) -> tuple[dict[int, list[int]], list[ck.KafkaError]]:
    """Offsets received per partition and the errors, until partition 1 is read whole and ``errors_wanted``
    errors came (the client keeps retrying the damaged offset: it must not move past it)."""
    got: dict[int, list[int]] = {0: [], 1: []}
    errors: list[ck.KafkaError] = []

    def more() -> bool:
        for m in c.consume(100, 0.2):
            if m.error() is not None:
                errors.append(m.error())
            else:
                got[m.partition()].append(m.offset())
        return len(got[1]) >= BATCHES * PER_BATCH and len(errors) >= errors_wanted

    wait_until(more, "partition 1 read and the damage reported")
    return got, errors


def _check_errors(errors: list[ck.KafkaError], offset: int) -> None:
    for e in errors:
        assert e.code() == ck.KafkaError.INVALID_MSG, e  # CORRUPT_MESSAGE (2)
        assert f"at offset {offset}" in e.str(), e


def test_confluent_reads_up_to_the_damaged_batch_then_gets_corrupt_message(
    damaged: tuple[Broker, int],
) -> None:
    broker, intact = damaged
    c = _confluent(broker)
    try:
        c.assign(
            [ck.TopicPartition("t", 0, ck.OFFSET_BEGINNING), ck.TopicPartition("t", 1, ck.OFFSET_BEGINNING)]
        )
        got, errors = _drain(c, _errors_wanted(intact))
        assert got[0] == list(range(intact))  # every record before it, none past it
        assert got[1] == list(range(BATCHES * PER_BATCH))  # the intact partition, whole
        _check_errors(errors, intact)
        c.commit(asynchronous=False)
        committed = c.committed([ck.TopicPartition("t", 0), ck.TopicPartition("t", 1)], timeout=WAIT_S)
        # OffsetFetch: partition 0 at the damaged batch (nothing committed when nothing was received)
        assert [tp.offset for tp in committed] == [intact or ck.OFFSET_INVALID, BATCHES * PER_BATCH]
    finally:
        c.close()
    assert _group_offsets(broker, "g").get(pylog.TopicPartition("t", 0), 0) == intact


def _group_offsets(broker: Broker, group: str) -> dict[Any, int]:
    return {tp: int(getattr(o, "offset", o)) for tp, o in broker.log.group_offsets(group).items()}


@pytest.mark.parametrize("start", [DAMAGED, DAMAGED + 5])
def test_confluent_fetch_starting_at_the_damaged_batch_gets_corrupt_message(
    damaged: tuple[Broker, int], start: int
) -> None:
    c = _confluent(damaged[0])
    try:
        c.assign([ck.TopicPartition("t", 0, start), ck.TopicPartition("t", 1, ck.OFFSET_BEGINNING)])
        got, errors = _drain(c)
        assert got[0] == []
        assert got[1] == list(range(BATCHES * PER_BATCH))
        for e in errors:
            assert e.code() == ck.KafkaError.INVALID_MSG, e
            assert f"at offset {start}" in e.str(), e
    finally:
        c.close()


def test_confluent_group_member_never_commits_past_the_damaged_batch(damaged: tuple[Broker, int]) -> None:
    broker, intact = damaged
    auto = {"enable.auto.commit": True, "auto.commit.interval.ms": 100, "auto.offset.reset": "earliest"}
    c = _confluent(broker, **auto)
    try:
        c.subscribe(["t"])
        got, errors = _drain(c, _errors_wanted(intact))
        assert sorted(got[0]) == list(range(intact))
        _check_errors(errors, intact)
        tp0 = pylog.TopicPartition("t", 0)
        if intact:  # the automatic commits reach the damaged batch, and stop there
            wait_until(lambda: _group_offsets(broker, "g").get(tp0) == intact, "the commit of partition 0")
    finally:
        c.close()
    assert _group_offsets(broker, "g").get(pylog.TopicPartition("t", 0), 0) == intact


def test_kafka_python_reads_up_to_the_damaged_batch_then_raises(damaged: tuple[Broker, int]) -> None:
    broker, intact = damaged
    c = kafka.KafkaConsumer(
        bootstrap_servers=broker.bootstrap_servers,
        group_id="kp",
        enable_auto_commit=False,
        retry_backoff_ms=50,
    )
    tps = [kafka.TopicPartition("t", 0), kafka.TopicPartition("t", 1)]
    got: dict[int, list[int]] = {0: [], 1: []}
    raised: list[Exception] = []
    try:
        c.assign(tps)
        c.seek_to_beginning()

        def more() -> bool:
            try:
                for tp, recs in c.poll(timeout_ms=200).items():
                    got[tp.partition].extend(r.offset for r in recs)
            except kafka.errors.KafkaError as exc:
                raised.append(exc)
            return len(got[1]) >= BATCHES * PER_BATCH and len(raised) >= min(2, _errors_wanted(intact))

        wait_until(more, "partition 1 read and the damage raised")
        assert got[0] == list(range(intact))
        assert got[1] == list(range(BATCHES * PER_BATCH))
        assert all(isinstance(e, kafka.errors.CorruptRecordError) for e in raised), raised
        if intact:
            assert c.position(tps[0]) == intact
            c.commit()
            assert c.committed(tps[0]) == intact
    finally:
        c.close()


def test_another_client_of_an_intact_topic_is_served_meanwhile(damaged: tuple[Broker, int]) -> None:
    broker = damaged[0]
    c = _confluent(broker)
    try:
        c.assign([ck.TopicPartition("t", 0, 0)])
        wait_until(lambda: any(m.error() is not None for m in c.consume(100, 0.2)), "the damage reported")
        p = ck.Producer({"bootstrap.servers": broker.bootstrap_servers})
        p.produce("other", b"x")
        assert p.flush(WAIT_S) == 0
        other = _confluent(broker, **{"group.id": "o"})
        try:
            other.assign([ck.TopicPartition("other", 0, 0)])
            got: list[bytes] = []
            wait_until(
                lambda: got.extend(m.value() for m in other.consume(10, 0.2) if not m.error()) or got, "x"
            )
            assert got == [b"x"]
        finally:
            other.close()
    finally:
        c.close()


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_read_committed_reads_up_to_the_damaged_batch_and_never_leaves_it_out(
    log_dir: Path, kind: str
) -> None:
    """read_committed leaves aborted and control batches out: a damaged batch must not be among them
    unchecked (a flipped control bit made a committed batch look like a control batch)."""
    _build(log_dir)
    _damage(log_dir, kind)
    intact = _intact(kind)
    with pylog.serve(log_dir) as broker:
        c = _confluent(broker, **{"isolation.level": "read_committed"})
        try:
            c.assign([ck.TopicPartition("t", 0, 0), ck.TopicPartition("t", 1, 0)])
            got, errors = _drain(c)
            assert got[0] == list(range(intact))
            assert got[1] == list(range(BATCHES * PER_BATCH))
            _check_errors(errors, intact)
        finally:
            c.close()


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_compacted_topic_reads_up_to_the_damaged_batch(log_dir: Path, kind: str) -> None:
    """A compacted topic's offsets may skip (the cleaner removes records), so its reads check base offsets
    less strictly: a damaged batch still ends what a client receives, at its own offset."""
    _build(log_dir, compacted=True)
    _damage(log_dir, kind)
    with pylog.serve(log_dir) as broker:
        c = _confluent(broker)
        try:
            c.assign([ck.TopicPartition("t", 0, 0), ck.TopicPartition("t", 1, 0)])
            got, errors = _drain(c)
            assert got[1] == list(range(BATCHES * PER_BATCH))
            assert got[0] == list(range(len(got[0])))  # the records before the damage, in order
            assert len(got[0]) <= DAMAGED  # none past it
            _check_errors(errors, len(got[0]))
        finally:
            c.close()


def _offsets_for_times(broker: Broker, topic: str, timestamps: list[int]) -> list[int | str]:
    """ListOffsets by timestamp through confluent-kafka, one call per timestamp: the offset, or the name of
    the error the call raised."""
    c = _confluent(broker)
    out: list[int | str] = []
    try:
        for ts in timestamps:
            try:
                found = c.offsets_for_times([ck.TopicPartition(topic, 0, ts)], timeout=WAIT_S)
            except ck.KafkaException as exc:
                out.append(exc.args[0].name())
                continue
            out.append(found[0].error.name() if found[0].error else found[0].offset)
    finally:
        c.close()
    return out


def test_offsets_for_times_over_a_damaged_segment_are_right_or_an_error(
    damaged: tuple[Broker, int],
) -> None:
    broker, intact = damaged
    queries = list(range(0, BATCHES * PER_BATCH, 5))
    got = _offsets_for_times(broker, "t", [TS + i for i in queries])
    for i, answer in zip(queries, got, strict=True):
        if isinstance(answer, int):
            assert answer == i, (i, got)  # a wrong offset is never answered
        else:
            assert i >= intact, (i, got)  # an error only where the damage lies
    assert got[: intact // 5] == queries[: intact // 5]  # before the damage: answered


def _damage_time_index(root: Path) -> None:
    """Point the entries of TS + 19 and TS + 29 of the time index of ``ti``'s first segment at the batch of
    offsets 30-39 (entries still in order, so that they pass the index's load checks): the index now claims
    that every batch before offset 30 holds timestamps up to TS + 19 only."""
    path = os.path.join(root, "ti-0", f"{0:020d}.timeindex")
    raw = bytearray(Path(path).read_bytes())
    entries = [struct.unpack_from("<qI", raw, at) for at in range(0, len(raw), 12)]
    k = next(k for k, (ts, _) in enumerate(entries) if ts == TS + 19)
    assert entries[k + 2] == (TS + 39, 30)
    for j in (k, k + 1):
        struct.pack_into("<qI", raw, j * 12, entries[j][0], 30)
    Path(path).write_bytes(bytes(raw))


def test_offsets_for_times_over_a_damaged_time_index_are_right(log_dir: Path) -> None:
    with pylog.open(log_dir) as log:
        log.create_topic("ti", index_interval_bytes=1)  # every batch indexed
        producer = log.producer(acks=1, value_serializer=None)
        for b in range(BATCHES):
            for i in range(b * PER_BATCH, (b + 1) * PER_BATCH):
                producer.send("ti", f"v{i}".encode(), partition=0, timestamp_ms=TS + i)
            producer.flush()
        producer.close()
        log.topic("ti").partition(0).roll()  # a sealed segment: its indexes are loaded, not rebuilt
    _damage_time_index(log_dir)
    queries = list(range(BATCHES * PER_BATCH))
    with pylog.serve(log_dir) as broker:
        got = _offsets_for_times(broker, "ti", [TS + i for i in queries])
    assert got == queries
