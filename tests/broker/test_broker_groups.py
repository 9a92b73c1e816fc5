"""Kafka clients in consumer groups served by pylog's broker: rebalances as members join and leave,
commits stored in pylog's group store (seen by log.group_offsets and `pylog groups`), commits surviving a
broker restart, and groups mixing pylog consumers and Kafka clients refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import confluent_kafka as ck
import pytest
from kafka import KafkaConsumer
from kafka import TopicPartition as KTP
from kafka_support import WAIT_S, wait_until

import pylog
from pylog.broker.broker import Broker
from pylog.errors import ConfigError


def _produce(bootstrap: str, topic: str, n: int) -> None:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    for i in range(n):
        producer.produce(topic, key=b"key-%d" % i, value=b"value-%d" % i)
    assert producer.flush(WAIT_S) == 0


def _member(bootstrap: str, group: str, strategy: str) -> ck.Consumer:
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "partition.assignment.strategy": strategy,
            "session.timeout.ms": 10_000,
        }
    )
    c.subscribe(["work"])
    return c


def _owned(c: ck.Consumer) -> set[int]:
    """The partitions ``c`` holds, after serving its callbacks (rebalances happen inside poll)."""
    c.poll(0.1)
    return {tp.partition for tp in c.assignment()}


@pytest.mark.parametrize("strategy", ["range", "roundrobin", "cooperative-sticky"])
def test_a_member_joining_and_leaving_rebalances(log_dir: Path, strategy: str) -> None:
    with pylog.serve(log_dir, num_partitions=4) as broker:
        _produce(broker.bootstrap_servers, "work", 40)
        first = _member(broker.bootstrap_servers, "g", strategy)
        wait_until(lambda: _owned(first) == {0, 1, 2, 3}, "first owns all")
        second = _member(broker.bootstrap_servers, "g", strategy)

        def split() -> bool:
            a, b = _owned(first), _owned(second)
            return bool(a) and bool(b) and not a & b and a | b == {0, 1, 2, 3}

        wait_until(split, "the partitions split between the two members")
        second.close()  # LeaveGroup: the first member gets everything back
        wait_until(lambda: _owned(first) == {0, 1, 2, 3}, "first owns all again")
        first.close()


def test_commits_go_to_pylogs_group_store_and_survive_a_restart(log_dir: Path) -> None:
    with pylog.serve(log_dir, num_partitions=2) as broker:
        _produce(broker.bootstrap_servers, "work", 50)
        consumer = _member(broker.bootstrap_servers, "readers", "range")
        seen: list[bytes] = []

        def read(n: int) -> bool:
            m = consumer.poll(0.2)
            if m is not None and m.error() is None:
                seen.append(m.value())
            return len(seen) >= n

        wait_until(lambda: read(30), "30 records")
        consumer.commit(asynchronous=False)
        positions = {tp.partition: tp.offset for tp in consumer.position(consumer.assignment())}
        consumer.close()
        committed = broker.log.group_offsets("readers")
        assert {tp.partition: om.offset for tp, om in committed.items()} == positions
        lag = broker.log.group_lag("readers")
        assert sum(lag.values()) == 50 - 30
    out = subprocess.run(
        [sys.executable, "-m", "pylog.cli", "--dir", str(log_dir), "--json", "groups", "describe", "readers"],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        cwd=log_dir.parent,
    )
    assert out.returncode == 0, out.stderr
    assert '"readers"' in out.stdout and "20" in out.stdout  # its committed offsets and lag

    with pylog.serve(log_dir) as broker:  # a new broker: the group resumes at its commits
        consumer = _member(broker.bootstrap_servers, "readers", "range")
        rest: list[bytes] = []

        def read_rest() -> bool:
            m = consumer.poll(0.2)
            if m is not None and m.error() is None:
                rest.append(m.value())
            return len(rest) >= 20

        wait_until(read_rest, "the 20 records after the commits")
        assert consumer.poll(1.0) is None
        consumer.close()
    assert sorted(seen + rest) == sorted(b"value-%d" % i for i in range(50))


def test_kafka_python_group_and_simple_commits(broker: Broker) -> None:
    _produce(broker.bootstrap_servers, "work", 10)
    consumer = KafkaConsumer(
        "work",
        bootstrap_servers=broker.bootstrap_servers,
        group_id="kp",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=5000,
    )
    values = [r.value for r in consumer]
    consumer.commit()
    assert consumer.committed(KTP("work", 0)) == 10
    consumer.close()
    assert sorted(values) == sorted(b"value-%d" % i for i in range(10))
    assert broker.log.group_offsets("kp")[pylog.TopicPartition("work", 0)].offset == 10

    simple = KafkaConsumer(
        bootstrap_servers=broker.bootstrap_servers, group_id="assigned", enable_auto_commit=False
    )
    simple.assign([KTP("work", 0)])
    simple.seek(KTP("work", 0), 4)
    simple.commit()  # generation -1, no member: a simple commit
    simple.close()
    assert broker.log.group_offsets("assigned")[pylog.TopicPartition("work", 0)].offset == 4


def test_a_group_mixing_pylog_consumers_and_kafka_clients_is_refused(broker: Broker) -> None:
    broker.log.create_topic("work", partitions=1)
    embedded = broker.log.consumer("work", group_id="shared", auto_offset_reset="earliest")
    embedded.poll(timeout_ms=100)  # joined
    kafka = ck.Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "shared"})
    kafka.subscribe(["work"])
    errors: list[ck.KafkaError] = []

    def refused() -> bool:
        m = kafka.poll(0.2)
        if m is not None and m.error() is not None:
            errors.append(m.error())
        return bool(errors)

    wait_until(refused, "the Kafka client's join to be refused")
    assert errors[0].code() == ck.KafkaError.INCONSISTENT_GROUP_PROTOCOL
    assert kafka.assignment() == []
    kafka.close()
    embedded.close()


def test_a_pylog_consumer_cannot_join_a_group_of_kafka_clients(broker: Broker) -> None:
    broker.log.create_topic("work", partitions=1)
    kafka = ck.Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "kafka-only"})
    kafka.subscribe(["work"])
    wait_until(lambda: kafka.poll(0.1) is None and bool(kafka.assignment()), "the Kafka member's assignment")
    with pytest.raises(ConfigError, match="'kafka-only' has Kafka clients"):
        broker.log.consumer("work", group_id="kafka-only")  # refused when it subscribes
    assert broker.log.describe_group("kafka-only").members == []
    kafka.close()  # the last Kafka member leaves: pylog consumers may use the group again

    def joins() -> bool:
        try:
            c = broker.log.consumer("work", group_id="kafka-only")
        except ConfigError:
            return False
        c.close()
        return True

    wait_until(joins, "a pylog consumer to join after the Kafka member left")


def test_a_static_member_back_within_its_session_keeps_its_partitions_without_a_rebalance(
    broker: Broker,
) -> None:
    broker.log.create_topic("work", partitions=4)
    revoked: list[list[int]] = []

    def static(instance: str, **callbacks: object) -> ck.Consumer:
        c = ck.Consumer(
            {
                "bootstrap.servers": broker.bootstrap_servers,
                "group.id": "static",
                "group.instance.id": instance,
                "session.timeout.ms": 30_000,
                "partition.assignment.strategy": "range",
            }
        )
        c.subscribe(["work"], **callbacks)
        return c

    a = static("a", on_revoke=lambda c, ps: revoked.append([p.partition for p in ps]))
    wait_until(lambda: _owned(a) == {0, 1, 2, 3}, "a to own every partition")  # a leads the group
    b = static("b")  # a returning leader rebalances (as in Kafka); b is not the leader

    def split() -> bool:
        x, y = _owned(a), _owned(b)
        return bool(x) and bool(y) and x | y == {0, 1, 2, 3}

    wait_until(split, "the two static members to split the partitions")
    before_a, before_b = _owned(a), _owned(b)
    revoked.clear()
    b.close()  # a static member sends no LeaveGroup
    b2 = static("b")
    wait_until(lambda: _owned(b2) == before_b and _owned(a) == before_a, "the returning member's partitions")
    for _ in range(10):  # a while of polling: no rebalance comes
        assert _owned(a) == before_a
    assert revoked == []
    b2.close()
    a.close()
