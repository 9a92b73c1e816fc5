"""Unchanged Kafka clients (kafka-python, confluent-kafka) against pylog's broker: produce and consume with
every codec, null keys and values, headers, mixed embedded and Kafka access, offsets, topic auto-creation."""

from __future__ import annotations

import random
from pathlib import Path

import confluent_kafka as ck
import confluent_kafka.admin
import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.structs import TopicPartition as KTP
from kafka_support import WAIT_S, wait_until
from kafka_support import stored as embedded_read

import pylog
from pylog.broker.broker import Broker

Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def model_records(n: int, seed: int, null_headers: bool = True) -> list[Record]:
    """Keys, values and headers with nulls (header values too, unless not ``null_headers``: kafka-python
    refuses them), empty bytes and binary data."""
    rng = random.Random(seed)
    out: list[Record] = []
    for i in range(n):
        key = None if i % 7 == 3 else rng.randbytes(rng.randrange(0, 20))
        value = None if i % 11 == 5 and key is not None else rng.randbytes(rng.randrange(0, 300))
        headers: list[tuple[str, bytes | None]] = [
            (f"h{j}", None if j == 1 and null_headers else rng.randbytes(rng.randrange(0, 9)))
            for j in range(i % 3)
        ]
        out.append((key, value, headers))
    return out


def confluent_consume(bootstrap: str, topic: str, n: int, partition: int = 0) -> list[ck.Message]:
    consumer = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        consumer.assign([ck.TopicPartition(topic, partition, 0)])
        got: list[ck.Message] = []

        def more() -> bool:
            for m in consumer.consume(1000, 0.5):
                assert m.error() is None, m.error()
                got.append(m)
            return len(got) >= n

        wait_until(more, f"{n} records from {topic}")
        return got
    finally:
        consumer.close()


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_produce_consume_every_codec(broker: Broker, codec: str) -> None:
    records = model_records(300, seed=hash(codec) & 0xFFFF)
    producer = ck.Producer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "compression.type": codec,
            "linger.ms": 5,
            "acks": "all",
        }
    )
    for key, value, headers in records:
        producer.produce("events", key=key, value=value, headers=headers, partition=0)
    assert producer.flush(WAIT_S) == 0

    got = confluent_consume(broker.bootstrap_servers, "events", len(records))
    assert [m.offset() for m in got] == list(range(len(records)))
    assert [(m.key(), m.value(), [tuple(h) for h in m.headers() or []]) for m in got] == records

    stored = embedded_read(broker.log, "events")  # the same bytes, read by pylog's own consumer
    assert [(r.key, r.value, list(r.headers)) for r in stored] == records


@pytest.mark.parametrize("codec", [None, "gzip", "lz4", "zstd"])
def test_kafka_python_produce_consume(broker: Broker, codec: str | None) -> None:
    records = model_records(200, seed=7, null_headers=False)
    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap_servers, compression_type=codec, enable_idempotence=False, acks=1
    )
    futures = [producer.send("kp", key=k, value=v, headers=h, partition=0) for k, v, h in records]
    producer.flush(WAIT_S)
    assert [f.get(WAIT_S).offset for f in futures] == list(range(len(records)))
    producer.close()

    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap_servers, auto_offset_reset="earliest", consumer_timeout_ms=3000
    )
    consumer.assign([KTP("kp", 0)])
    got: list = []
    wait_until(
        lambda: got.extend(r for rs in consumer.poll(500).values() for r in rs) or len(got) >= len(records),
        "records",
    )
    consumer.close()
    assert [(r.key, r.value, [tuple(h) for h in r.headers]) for r in got] == records


def test_embedded_records_read_by_kafka_clients(broker: Broker) -> None:
    """A record written by pylog's producer is read by a Kafka client as the bytes pylog stored (msgpack by
    default, the caller's bytes with value_serializer=None)."""
    log = broker.log
    log.create_topic("mixed", partitions=1)
    raw = log.producer(value_serializer=None)
    raw.send("mixed", b"\x00\xffraw", key=b"k1", headers=[("a", b"1")]).get()
    raw.close()
    packed = log.producer()
    packed.send("mixed", {"n": 1}, key="k2").get()
    packed.close()
    got = confluent_consume(broker.bootstrap_servers, "mixed", 2)
    import msgpack

    assert (got[0].key(), got[0].value(), got[0].headers()) == (b"k1", b"\x00\xffraw", [("a", b"1")])
    assert got[1].key() == b"k2" and msgpack.unpackb(got[1].value()) == {"n": 1}


def test_same_key_same_partition_both_ways(broker: Broker) -> None:
    """murmur2 on both sides: kafka-python's default partitioner and confluent-kafka's murmur2_random put a
    key in the partition pylog's producer puts it in."""
    log = broker.log
    log.create_topic("keyed", partitions=6)
    keys = [f"user-{i}".encode() for i in range(60)]
    embedded = log.producer(value_serializer=None)
    mine = {k: embedded.send("keyed", b"e", key=k).get().partition for k in keys}
    embedded.close()

    kp = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, enable_idempotence=False)
    theirs = {k: kp.send("keyed", key=k, value=b"kp").get(WAIT_S).partition for k in keys}
    kp.close()
    assert theirs == mine

    cp = ck.Producer({"bootstrap.servers": broker.bootstrap_servers, "partitioner": "murmur2_random"})
    delivered: dict[bytes, int] = {}
    for k in keys:
        cp.produce(
            "keyed",
            key=k,
            value=b"ck",
            on_delivery=lambda err, m: delivered.__setitem__(m.key(), m.partition()),
        )
    assert cp.flush(WAIT_S) == 0
    assert delivered == mine


def test_offsets_earliest_latest_and_by_timestamp(broker: Broker) -> None:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, enable_idempotence=False)
    base = 1_700_000_000_000
    for i in range(10):
        producer.send("times", value=b"%d" % i, timestamp_ms=base + 1000 * i, partition=0)
    producer.flush(WAIT_S)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers)
    tp = KTP("times", 0)
    assert consumer.beginning_offsets([tp]) == {tp: 0}
    assert consumer.end_offsets([tp]) == {tp: 10}
    found = consumer.offsets_for_times({tp: base + 4500})
    assert (found[tp].offset, found[tp].timestamp) == (5, base + 5000)
    assert consumer.offsets_for_times({tp: base + 99_000}) == {tp: None}
    consumer.close()


def test_topic_auto_creation(log_dir: Path) -> None:
    with pylog.serve(log_dir, num_partitions=3) as b:
        admin = ck.admin.AdminClient({"bootstrap.servers": b.bootstrap_servers})
        meta = admin.list_topics("fresh", timeout=WAIT_S)
        assert len(meta.topics["fresh"].partitions) == 3
        assert b.log.topic("fresh").num_partitions == 3
    with pylog.serve(log_dir, auto_create_topics=False) as b:
        admin = ck.admin.AdminClient({"bootstrap.servers": b.bootstrap_servers})
        meta = admin.list_topics("absent", timeout=WAIT_S)
        assert meta.topics["absent"].error.code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART
        assert not b.log.has_topic("absent")


def test_long_poll_is_woken_by_a_write(broker: Broker) -> None:
    """A consumer waiting in a fetch of 30 s gets a record written by an embedded producer well before the
    fetch's wait ends (the doorbell wakes it; a timer would hold the record for 30 s, past the poll's 20 s)."""
    broker.log.create_topic("bell", partitions=1)
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap_servers,
        fetch_max_wait_ms=30_000,
        request_timeout_ms=40_000,
        fetch_min_bytes=1,
    )
    consumer.assign([KTP("bell", 0)])
    consumer.seek(KTP("bell", 0), 0)
    assert consumer.poll(200) == {}  # the long poll is under way
    p = broker.log.producer(value_serializer=None)
    p.send("bell", b"ding", key=b"k").get()
    p.close()
    got = consumer.poll(20_000)
    consumer.close()
    assert [r.value for rs in got.values() for r in rs] == [b"ding"]


def test_log_append_time_topics_report_the_logs_timestamps(broker: Broker) -> None:
    broker.log.create_topic("appended", message_timestamp_type="LogAppendTime")
    reports: list[tuple[int, int]] = []
    producer = ck.Producer({"bootstrap.servers": broker.bootstrap_servers})
    producer.produce(
        "appended",
        value=b"v",
        partition=0,
        timestamp=1000,
        on_delivery=lambda err, m: reports.append(m.timestamp()),
    )
    assert producer.flush(WAIT_S) == 0
    [(kind, stamped)] = reports
    assert kind == ck.TIMESTAMP_LOG_APPEND_TIME and stamped > 1000  # the log's time, not the client's
    [m] = confluent_consume(broker.bootstrap_servers, "appended", 1)
    assert m.timestamp() == (ck.TIMESTAMP_LOG_APPEND_TIME, stamped)
    [r] = embedded_read(broker.log, "appended")
    assert r.timestamp == stamped


def test_list_offsets_max_timestamp(broker: Broker) -> None:
    from confluent_kafka.admin import OffsetSpec

    producer = ck.Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})
    base = 1_700_000_000_000
    for i, shift in enumerate([5, 9, 2, 9, 1]):  # the largest timestamp first at offset 1
        producer.produce("maxts", value=b"%d" % i, partition=0, timestamp=base + shift)
        producer.flush(WAIT_S)  # one batch each
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    tp = ck.TopicPartition("maxts", 0)
    result = admin.list_offsets({tp: OffsetSpec.max_timestamp()})[tp].result(WAIT_S)
    assert (result.offset, result.timestamp) == (1, base + 9)
    latest = admin.list_offsets({tp: OffsetSpec.latest()})[tp].result(WAIT_S)
    assert latest.offset == 5
