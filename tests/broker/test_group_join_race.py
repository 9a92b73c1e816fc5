"""Kafka clients joining a new consumer group at the same moment: every one of them joins (the group's claim
for Kafka members, taken by the first join, is the broker's own and does not refuse the others), while a
group with a live pylog consumer still refuses them."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.join_group.v5.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.types import GroupId
from kio_client import RawClient

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
