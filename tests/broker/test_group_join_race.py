"""Kafka clients joining a new consumer group at the same moment: every one of them joins (the group's claim
for Kafka members, taken by the first join, is the broker's own and does not refuse the others), while a
group with a live pylog consumer still refuses them; and offsets committed for partitions that do not exist
answered UNKNOWN_TOPIC_OR_PARTITION and not stored, as Kafka does."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from kio.schema.end_txn.v3.request import EndTxnRequest
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v3.request import InitProducerIdRequest
from kio.schema.join_group.v5.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.offset_commit.v7.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.txn_offset_commit.v3.request import (
    TxnOffsetCommitRequest,
    TxnOffsetCommitRequestPartition,
    TxnOffsetCommitRequestTopic,
)
from kio.schema.types import GroupId, ProducerId, TopicName, TransactionalId
from kio.static.primitive import i16, i32, i64
from kio_client import RawClient

import pylog
from pylog.broker.broker import Broker

MEMBERS = 4
ROUNDS = 5


def _join_request(group: str) -> JoinGroupRequest:
    return JoinGroupRequest(
        group_id=GroupId(group),
        session_timeout=timedelta(seconds=10),
        rebalance_timeout=timedelta(seconds=1),
        member_id="",
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(JoinGroupRequestProtocol(name="range", metadata=b""),),
    )


def _join_together(broker: Broker, group: str, n: int) -> list[Any]:
    """``n`` connections send a JoinGroup of ``group`` at once; their answers."""
    clients = [RawClient(broker.host, broker.port) for _ in range(n)]
    start = threading.Barrier(n)
    answers: list[Any] = [None] * n
    failures: list[BaseException] = []

    def join(i: int) -> None:
        try:
            start.wait()
            answers[i] = clients[i].call(11, 5, _join_request(group))
        except BaseException as exc:  # reported by the test below
            failures.append(exc)

    threads = [threading.Thread(target=join, args=(i,)) for i in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for c in clients:
            c.close()
    assert not failures, failures
    return answers


def test_kafka_clients_joining_a_new_group_at_once_all_join(broker: Broker) -> None:
    for round_ in range(ROUNDS):
        answers = _join_together(broker, f"fresh-{round_}", MEMBERS)
        codes = [a.error_code for a in answers]
        assert codes == [ErrorCode.none] * MEMBERS, f"round {round_}: {codes}"
        assert len({a.member_id for a in answers}) == MEMBERS


def test_kafka_clients_joining_at_once_are_refused_by_a_group_of_pylog_consumers(broker: Broker) -> None:
    broker.log.create_topic("work", partitions=1)
    embedded = broker.log.consumer("work", group_id="mixed", auto_offset_reset="earliest")
    try:
        embedded.poll(timeout_ms=100)  # joined
        answers = _join_together(broker, "mixed", MEMBERS)
        assert [a.error_code for a in answers] == [ErrorCode.inconsistent_group_protocol] * MEMBERS
    finally:
        embedded.close()


def _commit(
    broker: Broker, group: str, offsets: dict[tuple[str, int], int]
) -> dict[tuple[str, int], ErrorCode]:
    """A simple commit (generation -1, no member) of ``offsets``: each partition's answered error."""
    topics: dict[str, list[OffsetCommitRequestPartition]] = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append(
            OffsetCommitRequestPartition(
                partition_index=i32(partition),
                committed_offset=i64(offset),
                committed_leader_epoch=i32(-1),
                committed_metadata="",
            )
        )
    request = OffsetCommitRequest(
        group_id=GroupId(group),
        generation_id_or_member_epoch=i32(-1),
        member_id="",
        group_instance_id=None,
        topics=tuple(
            OffsetCommitRequestTopic(name=TopicName(t), partitions=tuple(ps)) for t, ps in topics.items()
        ),
    )
    client = RawClient(broker.host, broker.port)
    try:
        answer = client.call(8, 7, request)
    finally:
        client.close()
    return {(str(t.name), int(p.partition_index)): p.error_code for t in answer.topics for p in t.partitions}


def test_a_commit_for_a_partition_that_does_not_exist_is_refused(broker: Broker) -> None:
    broker.log.create_topic("work", partitions=2)
    codes = _commit(
        broker, "g", {("work", 0): 3, ("work", 1): 5, ("work", 2): 7, ("work", -1): 1, ("nope", 0): 9}
    )
    assert codes == {
        ("work", 0): ErrorCode.none,
        ("work", 1): ErrorCode.none,
        ("work", 2): ErrorCode.unknown_topic_or_partition,
        ("work", -1): ErrorCode.unknown_topic_or_partition,
        ("nope", 0): ErrorCode.unknown_topic_or_partition,
    }
    committed = {(tp.topic, tp.partition): om.offset for tp, om in broker.log.group_offsets("g").items()}
    assert committed == {("work", 0): 3, ("work", 1): 5}  # the unknown partitions' offsets are not stored
    assert not broker.log.has_topic("nope")  # a commit does not create a topic


def test_a_commit_of_unknown_partitions_only_stores_nothing(broker: Broker) -> None:
    codes = _commit(broker, "g", {("nope", 0): 9})
    assert codes == {("nope", 0): ErrorCode.unknown_topic_or_partition}
    with pytest.raises(pylog.errors.UnknownGroupError):
        broker.log.group_offsets("g")


def test_a_transactional_commit_for_a_partition_that_does_not_exist_is_refused(broker: Broker) -> None:
    broker.log.create_topic("work", partitions=1)
    broker.log.create_topic("ahead", partitions=1)
    with broker.log.producer() as producer:
        producer.send("ahead", b"only").get()
    client = RawClient(broker.host, broker.port)
    try:
        init = client.call(
            22,
            3,
            InitProducerIdRequest(
                transactional_id=TransactionalId("t"),
                transaction_timeout=timedelta(seconds=60),
                producer_id=ProducerId(-1),
                producer_epoch=i16(-1),
            ),
        )
        assert init.error_code == ErrorCode.none
        ids = {"transactional_id": TransactionalId("t"), "producer_id": init.producer_id}
        ids["producer_epoch"] = init.producer_epoch

        def partition(index: int, offset: int) -> TxnOffsetCommitRequestPartition:
            return TxnOffsetCommitRequestPartition(
                partition_index=i32(index),
                committed_offset=i64(offset),
                committed_leader_epoch=i32(-1),
                committed_metadata="",
            )

        answer = client.call(
            28,
            3,
            TxnOffsetCommitRequest(
                group_id=GroupId("g"),
                generation_id=i32(-1),
                member_id="",
                group_instance_id=None,
                topics=(
                    TxnOffsetCommitRequestTopic(
                        name=TopicName("work"), partitions=(partition(0, 0), partition(1, 2))
                    ),
                    TxnOffsetCommitRequestTopic(name=TopicName("ahead"), partitions=(partition(0, 5),)),
                    TxnOffsetCommitRequestTopic(name=TopicName("nope"), partitions=(partition(0, 9),)),
                ),
                **ids,
            ),
        )
        codes = {
            (str(t.name), int(p.partition_index)): p.error_code for t in answer.topics for p in t.partitions
        }
        assert codes == {
            ("work", 0): ErrorCode.none,
            ("work", 1): ErrorCode.unknown_topic_or_partition,
            ("nope", 0): ErrorCode.unknown_topic_or_partition,
            ("ahead", 0): ErrorCode.offset_out_of_range,  # past its end (1 record): it would fail the commit
        }
        assert client.call(26, 3, EndTxnRequest(committed=True, **ids)).error_code == ErrorCode.none
    finally:
        client.close()
    committed = {(tp.topic, tp.partition): om.offset for tp, om in broker.log.group_offsets("g").items()}
    assert committed == {("work", 0): 0}
