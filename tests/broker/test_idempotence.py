"""Idempotent producers through pylog's broker: InitProducerId, a retried batch written once, sequence gaps
and fenced epochs refused (raw requests), and kafka-python 3's and confluent-kafka's idempotent producers."""

from __future__ import annotations

import confluent_kafka as ck
import pytest
from kafka import KafkaProducer
from kafka_support import WAIT_S, stored_values
from kio.schema.errors import ErrorCode
from kio_client import RawClient
from kio_client import idempotent_batch as _batch
from kio_client import init_producer_id as _init
from kio_client import produce as _produce

from pylog.broker.broker import Broker


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
    assert stored_values(broker.log, "idem") == [b"a", b"b", b"c", b"d"]


def test_kafka_python_idempotent_by_default(broker: Broker) -> None:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)  # kafka-python 3: idempotent
    futures = [producer.send("kp-idem", value=b"%d" % i, partition=0) for i in range(500)]
    producer.flush(WAIT_S)
    assert [f.get(WAIT_S).offset for f in futures] == list(range(500))
    producer.close()
    assert stored_values(broker.log, "kp-idem") == [b"%d" % i for i in range(500)]


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_confluent_idempotent_producer(broker: Broker, codec: str) -> None:
    producer = ck.Producer(
        {"bootstrap.servers": broker.bootstrap_servers, "enable.idempotence": True, "compression.type": codec}
    )
    for i in range(1000):
        producer.produce("ck-idem", value=b"%d" % i, partition=0)
    assert producer.flush(WAIT_S) == 0
    assert stored_values(broker.log, "ck-idem") == [b"%d" % i for i in range(1000)]
