"""Public API behaviour: topics, producer, consumer, bad input (typed errors that change nothing)."""

from __future__ import annotations

import os

import msgpack
import numpy as np
import pytest

import pylog
from pylog import errors
from pylog.partitioner import partition_for_key
from pylog.structs import TopicPartition


def _disk_state(path: str) -> dict[str, int]:
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            full = os.path.join(root, f)
            out[os.path.relpath(full, path)] = os.path.getsize(full)
    return out


def test_all_is_sorted_and_complete() -> None:
    assert pylog.__all__ == sorted(pylog.__all__)
    for name in pylog.__all__:
        assert hasattr(pylog, name)
    assert errors.__all__ == sorted(errors.__all__)
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.PylogError) or issubclass(cls, UserWarning), name


def test_round_trip_keys_values_headers_timestamps(log: pylog.Log) -> None:
    log.create_topic("t", partitions=3)
    p = log.producer()
    sent = []
    for i in range(300):
        key = None if i % 5 == 0 else f"k{i % 17}"
        value = None if i % 11 == 0 and key is not None else {"i": i, "s": "x" * (i % 50)}
        headers = [("h", str(i).encode())] if i % 3 == 0 else None
        sent.append(
            (key, value, headers, p.send("t", value, key=key, headers=headers, timestamp_ms=1000 + i))
        )
    p.flush()
    c = log.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0)
    got = {(r.partition, r.offset): r for r in c.iterate()}
    assert len(got) == len(sent)
    for key, value, headers, fut in sent:
        meta = fut.get()
        rec = got[(meta.partition, meta.offset)]
        assert rec.key == (None if key is None else key.encode())
        assert rec.value == value
        assert list(rec.headers) == (headers or [])
        assert rec.timestamp == meta.timestamp
        if key is not None:
            assert meta.partition == partition_for_key(key.encode(), 3)


def test_offsets_are_dense_and_ordered_per_partition(log: pylog.Log) -> None:
    log.create_topic("t", partitions=2)
    p = log.producer()
    metas = [p.send("t", i, key=str(i % 4)).get() for i in range(200)]
    per: dict[int, list[int]] = {}
    for m in metas:
        per.setdefault(m.partition, []).append(m.offset)
    for offsets in per.values():
        assert offsets == list(range(len(offsets)))


def test_keyless_records_spread_over_partitions(log: pylog.Log) -> None:
    log.create_topic("t", partitions=4)
    p = log.producer(batch_size=1024)
    for i in range(4000):
        p.send("t", i)
    p.flush()
    ends = log.topic("t").end_offsets()
    assert sum(ends.values()) == 4000
    assert min(ends.values()) > 0.15 * 4000


def test_send_batch_matches_send(log: pylog.Log) -> None:
    log.create_topic("a", partitions=5)
    log.create_topic("b", partitions=5)
    keys = [f"key-{i:06d}".encode() for i in range(2000)]
    values = [msgpack.packb(i) for i in range(2000)]
    p = log.producer()
    res = p.send_batch("a", keys=keys, values=values)
    futures = [p.send("b", i, key=k) for i, k in enumerate(keys)]
    p.flush()
    for i, f in enumerate(futures):
        m = f.get()
        assert (int(res.partitions[i]), int(res.offsets[i])) == (m.partition, m.offset)
    fixed = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(2000, -1)
    res2 = p.send_batch("a", keys=fixed, values=values)
    assert (res2.partitions == res.partitions).all()


def test_seek_position_pause_and_offsets_for_times(log: pylog.Log, clock: pylog.ManualClock) -> None:
    log.create_topic("t")
    p = log.producer()
    for i in range(100):
        p.send("t", i, timestamp_ms=10_000 + i * 10)
    p.flush()
    tp = TopicPartition("t", 0)
    c = log.consumer(consumer_timeout_ms=0)
    c.assign([tp])
    c.seek(tp, 42)
    assert c.position(tp) == 42
    assert c.poll(max_records=1)[tp][0].value == 42
    assert c.position(tp) == 43
    assert c.offsets_for_times({tp: 10_000 + 55 * 10 - 3})[tp] == (55, 10_550, -1)
    assert c.offsets_for_times({tp: 99_999_999})[tp] is None
    c.pause(tp)
    assert c.poll() == {}
    c.resume(tp)
    assert c.poll(max_records=1)[tp][0].offset == 43
    c.seek_to_end(tp)
    assert c.position(tp) == 100
    c.seek_to_beginning(tp)
    assert c.position(tp) == 0
    assert c.beginning_offsets([tp]) == {tp: 0}
    assert c.end_offsets([tp]) == {tp: 100}


def test_auto_offset_reset_latest_and_none(log: pylog.Log) -> None:
    log.create_topic("t")
    p = log.producer()
    for i in range(10):
        p.send("t", i)
    p.flush()
    latest = log.consumer("t", consumer_timeout_ms=0)
    assert latest.poll() == {}
    p.send("t", 10).get()
    assert [r.value for recs in latest.poll().values() for r in recs] == [10]
    strict = log.consumer("t", auto_offset_reset="none")
    with pytest.raises(errors.NoOffsetForPartitionError):
        strict.poll()


def test_reader_sees_other_log_instance_appends(log_dir: str) -> None:
    with pylog.open(log_dir) as writer_log, pylog.open(log_dir) as reader_log:
        writer_log.create_topic("t", partitions=1)
        c = reader_log.consumer("t", auto_offset_reset="earliest")
        p = writer_log.producer()
        for i in range(50):
            p.send("t", i)
        p.flush()
        got = [r.value for r in c.iterate(timeout_ms=0)]
        assert got == list(range(50))
        p.send("t", 50).get()
        assert [r.value for recs in c.poll(timeout_ms=1000).values() for r in recs] == [50]


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "x" * 250, "sp ace", "ü", None, 5])
def test_invalid_topic_names_create_nothing(log: pylog.Log, name: object) -> None:
    before = _disk_state(log.path)
    with pytest.raises(errors.InvalidTopicError):
        log.create_topic(name)  # type: ignore[arg-type]
    assert isinstance(errors.InvalidTopicError(""), ValueError)
    assert _disk_state(log.path) == before


def test_bad_input_is_typed_and_loses_nothing(log: pylog.Log) -> None:
    log.create_topic("t", partitions=2, max_message_bytes=4096)
    p = log.producer()
    p.send("t", "keep", key="k").get()
    end = log.topic("t").end_offsets()  # opens every partition (a partition's files appear on first use)
    before = _disk_state(log.path)
    cases = [
        (errors.UnknownTopicError, lambda: p.send("nope", 1)),
        (errors.InvalidRecordError, lambda: p.send("t", None, key=None)),
        (errors.UnknownPartitionError, lambda: p.send("t", 1, partition=2)),
        (errors.UnknownPartitionError, lambda: p.send("t", 1, partition=-1)),
        (errors.SerializationError, lambda: p.send("t", object())),
        (errors.SerializationError, lambda: p.send("t", 1, key=3.5)),
        (errors.RecordTooLargeError, lambda: p.send("t", b"x" * 5000)),
        (errors.InvalidTimestampError, lambda: p.send("t", 1, timestamp_ms=-5)),
        (errors.InvalidTimestampError, lambda: p.send("t", 1, timestamp_ms=2**63)),
        (errors.InvalidTimestampError, lambda: p.send("t", 1, timestamp_ms=1.5)),  # type: ignore[arg-type]
        (errors.ConfigError, lambda: log.create_topic("u", segment_bytes=-1)),
        (errors.ConfigError, lambda: log.create_topic("u", no_such_config=1)),
        (errors.ConfigError, lambda: log.create_topic("u", partitions=0)),
        (errors.TopicExistsError, lambda: log.create_topic("t")),
        (errors.UnknownPartitionError, lambda: log.topic("t").partition(7)),
        (errors.OffsetOutOfRangeError, lambda: log.topic("t").partition(0).read(99)),
        (errors.InvalidOffsetError, lambda: log.topic("t").partition(0).read(-1)),
        (errors.ConfigError, lambda: log.producer(acks=2)),
    ]
    for exc_type, call in cases:
        with pytest.raises(exc_type):
            call()
    p.flush()
    assert log.topic("t").end_offsets() == end
    assert _disk_state(log.path) == before


def test_closed_log_raises(log_dir: str) -> None:
    log = pylog.open(log_dir)
    log.create_topic("t")
    log.close()
    with pytest.raises(errors.LogClosedError):
        log.topic("t")
    with pytest.raises(errors.LogClosedError):
        log.producer()


def test_compression_round_trip(log: pylog.Log) -> None:
    for codec in ("gzip", "zstd", "lz4"):
        log.create_topic(codec, compression_type=codec)
        p = log.producer()
        for i in range(500):
            p.send(codec, {"i": i, "pad": "abc" * 20})
        p.flush()
        c = log.consumer(codec, auto_offset_reset="earliest", consumer_timeout_ms=0)
        assert [r.value["i"] for r in c.iterate()] == list(range(500))
        header = log.topic(codec).partition(0).read(0)[0].header
        assert header.compression == codec


def test_log_append_time(log: pylog.Log, clock: pylog.ManualClock) -> None:
    log.create_topic("t", message_timestamp_type="LogAppendTime")
    meta = log.producer().send("t", 1, timestamp_ms=5).get()
    assert meta.timestamp == clock.time_ms()
    rec = next(iter(log.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0)))
    assert rec.timestamp == clock.time_ms() and rec.timestamp_type == 1


def test_create_partitions_and_delete_topic(log: pylog.Log) -> None:
    log.create_topic("t", partitions=2)
    log.producer().send("t", 1, partition=1).get()
    log.create_partitions("t", 4)
    assert log.topic("t").num_partitions == 4
    assert log.topic("t").end_offsets() == {0: 0, 1: 1, 2: 0, 3: 0}
    with pytest.raises(errors.ConfigError):
        log.create_partitions("t", 3)
    log.delete_topic("t")
    assert log.topics() == []
    assert not any(e.startswith("t-") for e in os.listdir(log.path))
    with pytest.raises(errors.UnknownTopicError):
        log.topic("t")


def test_acks_all_advances_recovery_point(log: pylog.Log) -> None:
    log.create_topic("t")
    p = log.producer(acks="all")
    meta = p.send("t", 1).get()
    assert log.topic("t").partition(0).recovery_point >= meta.offset + 1


def test_error_docs_list_every_error() -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "errors.md")) as f:
        text = f.read()
    for name in errors.__all__:
        assert f"`{name}`" in text, name


def test_verify_reports_a_flipped_bit_and_changes_nothing(log: pylog.Log) -> None:
    log.create_topic("t", segment_bytes=4096, index_interval_bytes=256)
    p = log.producer(batch_size=500)
    for i in range(2000):
        p.send("t", {"i": i})
    p.flush()
    assert log.verify() == {}
    seg = log.topic("t").partition(0).segments[1]
    with open(seg.path, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0x10]))
    before = _disk_state(log.path)
    report = log.verify()
    assert list(report) == ["t-0"]
    assert "CRC mismatch" in report["t-0"][0] and seg.path in report["t-0"][0]
    assert _disk_state(log.path) == before


def test_open_files_stay_bounded_with_many_partitions(log_dir: str) -> None:
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    baseline = open_fds()
    with pylog.open(log_dir, max_open_partitions=20, max_open_maps=20) as log:
        log.create_topic("many", partitions=300)
        p = log.producer()
        for i in range(3000):
            p.send("many", i, key=str(i))
        p.flush()
        peak = open_fds() - baseline
        c = log.consumer("many", auto_offset_reset="earliest", consumer_timeout_ms=0)
        values = sorted(r.value for r in c.iterate())
        peak = max(peak, open_fds() - baseline)
    assert values == list(range(3000))
    assert peak <= 20 * 3 + 20 + 10, peak


def test_poll_arrow_equals_poll(log: pylog.Log) -> None:
    log.create_topic("t", partitions=3, segment_bytes=8192)
    p = log.producer(value_serializer=None, batch_size=2000)
    rng = np.random.default_rng(3)
    for i in range(3000):
        key = None if i % 7 == 0 else rng.bytes(int(rng.integers(0, 20)))
        value = None if i % 13 == 0 and key is not None else rng.bytes(int(rng.integers(0, 200)))
        p.send("t", value, key=key, headers=[("n", str(i).encode())] if i % 5 == 0 else None)
    p.flush()
    plain = log.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None)
    expected = {(r.partition, r.offset): r for r in plain.iterate()}
    arrow = log.consumer("t", auto_offset_reset="earliest", value_deserializer=None)
    tp0 = TopicPartition("t", 0)
    arrow.poll(max_records=5)  # the Arrow path continues exactly where poll() stopped
    seen: dict[tuple[int, int], dict[str, object]] = {}
    while True:
        got = arrow.poll_arrow(max_bytes=3000, include_headers=True)
        if not got:
            break
        for rb in got.values():
            for row in rb.to_pylist():
                seen[(row["partition"], row["offset"])] = row
    assert min(o for (part, o) in seen if part == tp0.partition) == 5
    for (part, off), row in seen.items():
        rec = expected[(part, off)]
        assert (row["key"], row["value"], row["topic"]) == (rec.key, rec.value, "t")
        assert int(row["timestamp"].timestamp() * 1000) == rec.timestamp
        assert [(h["key"], h["value"]) for h in row["headers"]] == list(rec.headers)
    assert len(seen) == len(expected) - 5


def test_corruption_below_recovery_point_is_a_read_error_until_repair(log_dir: str) -> None:
    with pylog.open(log_dir) as log:
        log.create_topic("t", segment_bytes=4096)
        p = log.producer(acks="all", batch_size=600)
        for i in range(400):
            p.send("t", {"i": i, "pad": "x" * 40})
        p.flush()
        plog = log.topic("t").partition(0)
        segs = plog.segments
        assert len(segs) >= 3
        assert plog.recovery_point == plog.log_end_offset
        victim = segs[1]
        dropped_from = victim.base_offset
    with open(victim.path, "r+b") as f:
        f.seek(70)
        byte = f.read(1)
        f.seek(70)
        f.write(bytes([byte[0] ^ 0x01]))
    os.unlink(os.path.join(log_dir, ".clean-shutdown"))  # as after a power cut
    with pylog.open(log_dir) as log:  # below the recovery point: not truncated, not revalidated at open
        plog = log.topic("t").partition(0)
        assert plog.log_end_offset == 400
        with pytest.raises(errors.CorruptRecordError) as info:
            plog.read(dropped_from)
        assert info.value.position == 0
        assert [b.offsets[0] for b in plog.read(0, 1)] == [0]
        assert victim.path in log.verify()["t-0"][0]
        with pytest.raises(errors.LockError):
            pylog.repair(log_dir)
    report = pylog.repair(log_dir)
    assert list(report) == ["t-0"] and f"offsets >= {dropped_from}" in report["t-0"][0]
    with pylog.open(log_dir) as log:
        c = log.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0)
        assert [r.value["i"] for r in c.iterate()] == list(range(dropped_from))
        assert log.verify() == {}
    assert pylog.repair(log_dir) == {}


def test_partitions_added_by_another_log_instance_are_seen_within_a_second(
    log: pylog.Log, clock: pylog.ManualClock
) -> None:
    log.create_topic("t", partitions=2)
    producer = log.producer()
    consumer = log.consumer("t", auto_offset_reset="earliest")
    assert len(consumer.assignment()) == 2
    with pylog.open(log.path) as other:  # as another process would
        other.create_partitions("t", 4)
    clock.advance(1_500)
    partitions = {producer.send("t", i, key=f"k{i}").get().partition for i in range(64)}
    assert partitions == {0, 1, 2, 3}
    clock.advance(1_500)
    consumer.poll(timeout_ms=0)
    assert len(consumer.assignment()) == 4
    producer.close()
    consumer.close()


def test_unknown_producer_configs_are_config_errors(log: pylog.Log) -> None:
    with pytest.raises(errors.ConfigError, match="bootstrap_servers"):
        log.producer(bootstrap_servers="localhost:9092")
    with pytest.raises(errors.ConfigError, match="enable_idempotence"):
        log.producer(retries=3)


def test_records_sent_without_waiting_reach_the_log_by_themselves(log: pylog.Log) -> None:
    """The background sender drains fire-and-forget sends: while it polls (records keep coming) and after it
    went idle and must be woken by the next send."""
    import time

    from pylog import producer as producer_module

    log.create_topic("t")
    plog = log.topic("t").partition(0)
    p = log.producer(value_serializer=None)

    def wait_for(end: int) -> None:
        deadline = time.monotonic() + 10
        while plog.log_end_offset < end:
            assert time.monotonic() < deadline, f"end offset {plog.log_end_offset}, expected {end}"
            time.sleep(0.001)

    for i in range(5):
        p.send("t", b"%d" % i)
        wait_for(i + 1)  # the sender is polling: no wake-up needed
    idle_after = producer_module._SENDER_IDLE_S
    deadline = time.monotonic() + 10
    while not p._sender_idle:
        assert time.monotonic() < deadline
        time.sleep(idle_after / 10)
    future = p.send("t", b"after idle")
    wait_for(6)
    assert future.is_done or future.get(timeout=5).offset == 5
    p.close()
    assert [
        r.value
        for r in log.consumer(
            "t", auto_offset_reset="earliest", value_deserializer=None, consumer_timeout_ms=0
        )
    ] == [b"0", b"1", b"2", b"3", b"4", b"after idle"]
