"""A record with a null key and a null value, as Kafka takes it: stored on a topic that is not compacted and
read back as sent by Kafka clients and pylog's consumer; refused on a compacted topic (its key is null), with
the batch's other records left unwritten and the failure reaching the client."""

from __future__ import annotations

import confluent_kafka as ck
from kafka_support import WAIT_S

from pylog.broker.broker import Broker

Record = tuple[bytes | None, bytes | None]


def _produce(broker: Broker, topic: str, records: list[Record]) -> list[tuple[object, int]]:
    producer = ck.Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5000})
    reports: list[tuple[object, int]] = []
    for key, value in records:
        producer.produce(
            topic, key=key, value=value, partition=0, on_delivery=lambda e, m: reports.append((e, m.offset()))
        )
    assert producer.flush(WAIT_S) == 0
    return reports


def test_a_null_key_and_null_value_record_is_stored_and_read_back(broker: Broker) -> None:
    broker.log.create_topic("plain", partitions=1)
    records: list[Record] = [
        (None, None),
        (b"k", None),
        (None, b"v"),
        (None, None),
        (b"k2", b"v2"),
        (None, None),
    ]
    reports = _produce(broker, "plain", records)
    assert [e for e, _ in reports] == [None] * len(records)
    assert sorted(o for _, o in reports) == list(range(len(records)))

    consumer = ck.Consumer(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": "g", "auto.offset.reset": "earliest"}
    )
    seen: list[Record] = []
    try:
        consumer.subscribe(["plain"])
        while len(seen) < len(records):
            message = consumer.poll(WAIT_S)
            assert message is not None and message.error() is None, message and message.error()
            seen.append((message.key(), message.value()))
    finally:
        consumer.close()
    assert seen == records

    embedded = broker.log.consumer(
        value_deserializer=None, key_deserializer=None, auto_offset_reset="earliest"
    )
    embedded.assign([("plain", 0)])
    got: list[Record] = []
    while len(got) < len(records):
        got += [(r.key, r.value) for rs in embedded.poll(timeout_ms=1000).values() for r in rs]
    embedded.close()
    assert got == records


def test_a_keyless_record_to_a_compacted_topic_is_refused(broker: Broker) -> None:
    broker.log.create_topic("compacted", partitions=1, cleanup_policy="compact")
    reports = _produce(broker, "compacted", [(b"k", b"v"), (None, None)])
    errors = [e for e, _ in reports]
    assert all(e is not None for e in errors), errors  # one batch: refused as a whole, the failure reported
    assert broker.log.topic("compacted").partition(0).log_end_offset == 0
