"""Idempotent producers through pylog's broker: InitProducerId, a retried batch written once, sequence gaps
and fenced epochs refused (raw requests), and kafka-python 3's and confluent-kafka's idempotent producers."""

from __future__ import annotations

import datetime

import confluent_kafka as ck
import pytest
from kafka import KafkaProducer
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka_support import WAIT_S
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio_client import RawClient

from pylog.broker.broker import Broker


def _batch(pid: int, epoch: int, sequence: int, values: list[bytes]) -> bytes:
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=sequence,
        batch_size=1 << 20,
    )
    for i, v in enumerate(values):
        b.append(i, timestamp=1_700_000_000_000, key=None, value=v, headers=[])
    return bytes(b.build())


def _produce(client: RawClient, topic: str, records: bytes) -> tuple[ErrorCode, int]:
    request = ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=0, records=records),)),
        ),
    )
    part = client.call(0, 9, request).responses[0].partition_responses[0]
    return part.error_code, part.base_offset


def _init(client: RawClient, pid: int = -1, epoch: int = -1) -> tuple[ErrorCode, int, int]:
    r = client.call(
        22,
        4,
        InitProducerIdRequest(
            transactional_id=None,
            transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=pid,
            producer_epoch=epoch,
        ),
    )
    return r.error_code, r.producer_id, r.producer_epoch


def _values(broker: Broker, topic: str) -> list[bytes]:
    c = broker.log.consumer(
        topic, auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None
    )
    try:
        return [r.value for r in c]
    finally:
        c.close()


def test_a_retried_batch_is_written_once_and_gaps_and_old_epochs_are_refused(broker: Broker) -> None:
    broker.log.create_topic("idem", partitions=1)
    client = RawClient(broker.host, broker.port)
    try:
        code, pid, epoch = _init(client)
        assert (code, epoch) == (ErrorCode.none, 0)
        _, other, _ = _init(client)
        assert other != pid  # ids are never shared

        first = _batch(pid, 0, 0, [b"a", b"b"])
        assert _produce(client, "idem", first) == (ErrorCode.none, 0)
        assert _produce(client, "idem", first) == (ErrorCode.none, 0)  # the retry: acknowledged, not written
        assert _produce(client, "idem", _batch(pid, 0, 2, [b"c"])) == (ErrorCode.none, 2)
        assert (
            _produce(client, "idem", _batch(pid, 0, 5, [b"gap"]))[0] == ErrorCode.out_of_order_sequence_number
        )

        code, same, bumped = _init(client, pid, 0)  # KIP-360: the producer bumps its epoch
        assert (code, same, bumped) == (ErrorCode.none, pid, 1)
        assert _produce(client, "idem", _batch(pid, 0, 3, [b"fenced"]))[0] == ErrorCode.invalid_producer_epoch
        assert _produce(client, "idem", _batch(pid, 1, 0, [b"d"])) == (ErrorCode.none, 3)
    finally:
        client.close()
    assert _values(broker, "idem") == [b"a", b"b", b"c", b"d"]


def test_kafka_python_idempotent_by_default(broker: Broker) -> None:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)  # kafka-python 3: idempotent
    futures = [producer.send("kp-idem", value=b"%d" % i, partition=0) for i in range(500)]
    producer.flush(WAIT_S)
    assert [f.get(WAIT_S).offset for f in futures] == list(range(500))
    producer.close()
    assert _values(broker, "kp-idem") == [b"%d" % i for i in range(500)]


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_confluent_idempotent_producer(broker: Broker, codec: str) -> None:
    producer = ck.Producer(
        {"bootstrap.servers": broker.bootstrap_servers, "enable.idempotence": True, "compression.type": codec}
    )
    for i in range(1000):
        producer.produce("ck-idem", value=b"%d" % i, partition=0)
    assert producer.flush(WAIT_S) == 0
    assert _values(broker, "ck-idem") == [b"%d" % i for i in range(1000)]
