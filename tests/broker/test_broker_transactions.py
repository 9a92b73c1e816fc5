"""Kafka transactions through pylog's broker, mapped onto pylog's: commit and abort seen the same way by
Kafka read_committed consumers and pylog's, read_uncommitted seeing everything, a consume-transform-produce
loop committing its input offsets with its output (exactly once, checked), and fencing by epoch."""

from __future__ import annotations

import confluent_kafka as ck
import pytest
from kafka import KafkaConsumer
from kafka import TopicPartition as KTP
from kafka_support import WAIT_S, confluent_values, stored_values, wait_until

import pylog
from pylog.broker.broker import Broker


def _txn_producer(broker: Broker, tid: str) -> ck.Producer:
    p = ck.Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": tid})
    p.init_transactions(WAIT_S)
    return p


def test_commit_and_abort_are_seen_alike_by_kafka_and_pylog_consumers(broker: Broker) -> None:
    broker.log.create_topic("txn", partitions=1)
    p = _txn_producer(broker, "writer")
    for batch, commit in (
        ([b"a%d" % i for i in range(10)], True),
        ([b"x%d" % i for i in range(5)], False),
        ([b"b0", b"b1", b"b2"], True),
    ):
        p.begin_transaction()
        for v in batch:
            p.produce("txn", value=v, partition=0)
        p.flush(WAIT_S)
        (p.commit_transaction if commit else p.abort_transaction)(WAIT_S)
    committed = [b"a%d" % i for i in range(10)] + [b"b0", b"b1", b"b2"]

    assert confluent_values(broker, "txn", "read_committed", 13, "r-read_committed") == committed
    everything = confluent_values(broker, "txn", "read_uncommitted", 18, "r-read_uncommitted")
    assert sorted(everything) == sorted(committed + [b"x%d" % i for i in range(5)])
    kp = KafkaConsumer(
        bootstrap_servers=broker.bootstrap_servers, isolation_level="read_committed", consumer_timeout_ms=3000
    )
    kp.assign([KTP("txn", 0)])
    kp.seek(KTP("txn", 0), 0)
    assert [r.value for r in kp] == committed
    kp.close()
    embedded = broker.log.consumer(
        "txn",
        auto_offset_reset="earliest",
        consumer_timeout_ms=0,
        value_deserializer=None,
        isolation_level="read_committed",
    )
    assert [r.value for r in embedded] == committed
    embedded.close()


def test_an_open_transaction_holds_read_committed_consumers_until_it_commits(broker: Broker) -> None:
    broker.log.create_topic("pending", partitions=1)
    p = _txn_producer(broker, "slow")
    p.begin_transaction()
    p.produce("pending", value=b"later", partition=0)
    p.flush(WAIT_S)
    c = ck.Consumer(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": "rc", "isolation.level": "read_committed"}
    )
    c.assign([ck.TopicPartition("pending", 0, 0)])
    assert c.consume(10, 2.0) == []  # open: not visible
    p.commit_transaction(WAIT_S)
    got: list[bytes] = []
    wait_until(
        lambda: got.extend(m.value() for m in c.consume(10, 0.5) if m.error() is None) or got, "the commit"
    )
    assert got == [b"later"]
    c.close()


def test_consume_transform_produce_is_exactly_once(log_dir) -> None:
    with pylog.serve(log_dir) as broker:
        broker.log.create_topic("in", partitions=1)
        broker.log.create_topic("out", partitions=1)
        src = ck.Producer({"bootstrap.servers": broker.bootstrap_servers})
        for i in range(30):
            src.produce("in", value=b"%d" % i, partition=0)
        assert src.flush(WAIT_S) == 0

        def run(tid: str, limit: int | None) -> None:
            """Transform batches of input until ``limit`` records (then abort the last transaction, as a crash
            before its commit would), or until the last input record (committing each)."""
            consumer = ck.Consumer(
                {
                    "bootstrap.servers": broker.bootstrap_servers,
                    "group.id": "transformer",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "isolation.level": "read_committed",
                }
            )
            consumer.subscribe(["in"])
            producer = _txn_producer(broker, tid)
            done = 0
            last = -1
            while last < 29:
                msgs = [m for m in consumer.consume(5, 1.0) if m.error() is None]
                if not msgs:
                    continue
                last = msgs[-1].offset()
                producer.begin_transaction()
                for m in msgs:
                    producer.produce("out", value=b"x" + m.value(), partition=0)
                positions = consumer.position(consumer.assignment())
                producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), WAIT_S)
                done += len(msgs)
                if limit is not None and done >= limit:
                    producer.abort_transaction(WAIT_S)  # a crash before the commit: redone by the next run
                    break
                producer.commit_transaction(WAIT_S)
            consumer.close()

        run("t1", 12)
        run("t1", None)
        out = confluent_values(broker, "out", "read_committed", 30, "r-read_committed")
        assert sorted(out) == sorted(b"x%d" % i for i in range(30))  # each input once, none lost
        assert broker.log.group_offsets("transformer")[pylog.TopicPartition("in", 0)].offset == 30


def test_an_older_instance_is_fenced(broker: Broker) -> None:
    broker.log.create_topic("fence", partitions=1)
    old = _txn_producer(broker, "same-id")
    old.begin_transaction()
    old.produce("fence", value=b"old", partition=0)
    old.flush(WAIT_S)
    new = _txn_producer(broker, "same-id")  # fences the old instance and aborts its transaction
    new.begin_transaction()
    new.produce("fence", value=b"new", partition=0)
    new.commit_transaction(WAIT_S)
    with pytest.raises(ck.KafkaException) as raised:
        old.commit_transaction(WAIT_S)
    assert raised.value.args[0].fatal() or raised.value.args[0].code() in (
        ck.KafkaError._FENCED,
        ck.KafkaError.PRODUCER_FENCED,
        ck.KafkaError.INVALID_PRODUCER_EPOCH,
    )
    assert confluent_values(broker, "fence", "read_committed", 1, "r-read_committed") == [b"new"]


def test_a_transaction_open_past_its_timeout_is_aborted_for_read_committed_readers(broker: Broker) -> None:
    broker.log.create_topic("stuck", partitions=1)
    p = ck.Producer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "transactional.id": "stuck",
            "transaction.timeout.ms": 1000,
        }
    )
    p.init_transactions(WAIT_S)
    p.begin_transaction()
    p.produce("stuck", value=b"never committed", partition=0)
    p.flush(WAIT_S)  # and the producer goes quiet, its transaction open
    plain = ck.Producer({"bootstrap.servers": broker.bootstrap_servers})
    plain.produce("stuck", value=b"after", partition=0)
    assert plain.flush(WAIT_S) == 0
    # held at the open transaction until its timeout passes; then it is aborted and the reader moves on
    assert confluent_values(broker, "stuck", "read_committed", 1, "r-read_committed") == [b"after"]


def test_a_transaction_timeout_above_the_maximum_is_refused(broker: Broker) -> None:
    """Kafka's transaction.max.timeout.ms (15 minutes): init_transactions() with a longer
    transaction.timeout.ms fails with INVALID_TRANSACTION_TIMEOUT (librdkafka's test 0103 checks it), and the
    maximum itself is accepted."""
    too_long = ck.Producer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "transactional.id": "long",
            "transaction.timeout.ms": 900_001,
        }
    )
    with pytest.raises(ck.KafkaException) as refused:
        too_long.init_transactions(WAIT_S)
    assert refused.value.args[0].code() == ck.KafkaError.INVALID_TRANSACTION_TIMEOUT
    longest = ck.Producer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "transactional.id": "long",
            "transaction.timeout.ms": 900_000,
        }
    )
    longest.init_transactions(WAIT_S)
    longest.begin_transaction()
    longest.produce("txn-max", b"v", partition=0)
    longest.commit_transaction(WAIT_S)
    assert stored_values(broker.log, "txn-max") == [b"v"]
