"""A Kafka client's session counts only the time the broker could hear it.

Two ways the broker itself used to expire healthy members: (1) after a stretch in which its event loop did
not run (a long synchronous step, the process descheduled on a loaded machine), the session check ran
before the heartbeats waiting unread in the sockets, and expired every member of every group at once;
(2) a member whose OffsetCommit waited in the broker's thread pool could not heartbeat (its heartbeat
waits behind the commit on the coordinator connection) and was expired for the broker's slowness.

The stall is simulated exactly as the event loop sees one: its clock jumps ahead while it does not run
(the loop's ``time`` is offset), so nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.heartbeat.v3.request import HeartbeatRequest
from kio.schema.join_group.v5.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.offset_commit.v7.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.sync_group.v3.request import SyncGroupRequest
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i32, i64
from kio_client import RawClient

import pylog
from pylog.broker import groups as broker_groups
from pylog.broker.broker import Broker

SESSION_S = 10
WAIT_S = 60.0  # bound of every wait on the broker


class _Member:
    """A Kafka consumer-group member speaking the classic protocol over its own connection."""

    def __init__(self, broker: Broker, group: str, *, join: bool = True) -> None:
        self.group = group
        self.client = RawClient(broker.host, broker.port)
        self.member_id, self.generation = "", -1
        if join:
            assert self.join() == ErrorCode.none
            assert self.sync() == ErrorCode.none

    def join(self) -> ErrorCode:
        answer = self.client.call(
            11,
            5,
            JoinGroupRequest(
                group_id=GroupId(self.group),
                session_timeout=timedelta(seconds=SESSION_S),
                rebalance_timeout=timedelta(seconds=SESSION_S),
                member_id=self.member_id,
                group_instance_id=None,
                protocol_type="consumer",
                protocols=(JoinGroupRequestProtocol(name="range", metadata=b""),),
            ),
        )
        self.member_id, self.generation = str(answer.member_id), int(answer.generation_id)
        return ErrorCode(answer.error_code)

    def sync(self) -> ErrorCode:
        answer = self.client.call(
            14,
            3,
            SyncGroupRequest(
                group_id=GroupId(self.group),
                generation_id=i32(self.generation),
                member_id=self.member_id,
                group_instance_id=None,
                assignments=(),
            ),
        )
        return ErrorCode(answer.error_code)

    def heartbeat(self) -> ErrorCode:
        answer = self.client.call(
            12,
            3,
            HeartbeatRequest(
                group_id=GroupId(self.group),
                generation_id=i32(self.generation),
                member_id=self.member_id,
                group_instance_id=None,
            ),
        )
        return ErrorCode(answer.error_code)

    def commit(self, topic: str, offset: int) -> ErrorCode:
        answer = self.client.call(
            8,
            7,
            OffsetCommitRequest(
                group_id=GroupId(self.group),
                generation_id_or_member_epoch=i32(self.generation),
                member_id=self.member_id,
                group_instance_id=None,
                topics=(
                    OffsetCommitRequestTopic(
                        name=TopicName(topic),
                        partitions=(
                            OffsetCommitRequestPartition(
                                partition_index=i32(0),
                                committed_offset=i64(offset),
                                committed_leader_epoch=i32(-1),
                                committed_metadata=None,
                            ),
                        ),
                    ),
                ),
            ),
        )
        return ErrorCode(answer.topics[0].partitions[0].error_code)


def _in_loop(broker: Broker, fn: Callable[[], Any]) -> Any:
    """``fn()`` run in the broker's event loop; its result."""

    async def call() -> Any:
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), broker._server._loop).result(WAIT_S)


def _sleep_in_loop(broker: Broker, seconds: float) -> None:
    """Wait until the broker's loop clock passed ``seconds`` more (every timer due by then has run)."""
    asyncio.run_coroutine_threadsafe(asyncio.sleep(seconds), broker._server._loop).result(WAIT_S)


@pytest.fixture
def stalling_broker(tmp_path: Any) -> Iterator[tuple[Broker, Callable[[float], None]]]:
    """A broker whose event loop can be made to see a stall: ``stall(s)`` moves its clock ``s`` ahead."""
    with pylog.serve(tmp_path / "log") as broker:
        loop = broker._server._loop
        offset = [0.0]
        real = loop.time

        def stall(seconds: float) -> None:
            offset[0] += seconds

        loop.time = lambda: real() + offset[0]  # type: ignore[method-assign]
        yield broker, stall


def _group(broker: Broker, group: str) -> Any:
    coordinator = broker._server.coordinator
    assert coordinator is not None
    return coordinator.groups.get(group)


def _members(broker: Broker, group: str) -> set[str]:
    def members() -> set[str]:
        found = _group(broker, group)
        return set() if found is None else set(found.members)

    return set(_in_loop(broker, members))


def _expire(broker: Broker, later_s: float) -> list[tuple[str, str]]:
    """A session check ``later_s`` from now, on time (the loop did not stall): the members it removed."""
    coordinator = broker._server.coordinator
    assert coordinator is not None
    loop = broker._server._loop
    return list(_in_loop(broker, lambda: coordinator.expire(loop.time() + later_s, 0.0)))


def test_a_stall_of_the_broker_expires_no_member(
    stalling_broker: tuple[Broker, Callable[[float], None]],
) -> None:
    broker, stall = stalling_broker
    members = [_Member(broker, "first"), _Member(broker, "second")]
    try:
        for m in members:
            assert m.heartbeat() == ErrorCode.none
        # the loop does not run for six sessions: the heartbeats the members sent meanwhile wait unread
        _in_loop(broker, lambda: stall(6 * SESSION_S))
        _sleep_in_loop(broker, 2 * broker_groups._CHECK_S)  # the session check after the stall has run
        for m in members:
            assert _members(broker, m.group) == {m.member_id}
            assert m.heartbeat() == ErrorCode.none
    finally:
        for m in members:
            m.client.close()


def test_a_member_whose_commit_waits_in_the_broker_is_not_expired(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker.log.create_topic("work", partitions=1)
    committing, idle = _Member(broker, "committing"), _Member(broker, "idle")
    entered, release = threading.Event(), threading.Event()
    commit = broker_groups._commit

    def slow_commit(*args: Any) -> Any:  # the thread pool is busy: this commit waits
        entered.set()
        release.wait(WAIT_S)
        return commit(*args)

    monkeypatch.setattr(broker_groups, "_commit", slow_commit)
    answer: list[ErrorCode] = []
    sender = threading.Thread(target=lambda: answer.append(committing.commit("work", 7)))
    try:
        sender.start()
        assert entered.wait(WAIT_S)
        # a session check an hour later, on time: the member that said nothing goes, the committing one stays
        gone = _expire(broker, 3600)
        assert gone == [("idle", idle.member_id)]
        release.set()
        sender.join(WAIT_S)
        assert answer == [ErrorCode.none]
        assert _members(broker, "committing") == {committing.member_id}
        assert committing.heartbeat() == ErrorCode.none
        offsets = broker.log.group_offsets("committing")
        assert [om.offset for om in offsets.values()] == [7]
    finally:
        release.set()
        sender.join(WAIT_S)
        committing.client.close()
        idle.client.close()


def test_members_that_waited_in_a_long_rebalance_are_not_expired_when_it_completes(broker: Broker) -> None:
    """A rebalance may wait for a slow member up to the rebalance timeout (librdkafka: max.poll.interval.ms,
    5 min), longer than a session (45 s). The members waiting in JoinGroup and SyncGroup meanwhile cannot
    heartbeat (their heartbeats wait behind those requests on the coordinator connection): when the
    rebalance completes, they must not be expired for it, all at once."""
    first, second = _Member(broker, "slow"), _Member(broker, "slow", join=False)
    answers: dict[str, ErrorCode] = {}
    joining = threading.Thread(target=lambda: answers.update(join=second.join()))
    syncing: threading.Thread | None = None
    try:
        joining.start()
        _wait_in_loop(broker, lambda: _group(broker, "slow").state == "PreparingRebalance")
        # it has waited an hour for the first member to rejoin (its session is much shorter)
        _in_loop(broker, lambda: _set_waiting_long_ago(broker, "slow", 3600))
        assert first.join() == ErrorCode.none
        joining.join(WAIT_S)
        assert answers == {"join": ErrorCode.none}
        assert first.generation == second.generation
        assert _expire(broker, 0) == []  # the session of the member that waited restarted with its answer
        follower = (
            second if first.member_id == _in_loop(broker, lambda: _group(broker, "slow").leader) else first
        )
        leader = first if follower is second else second
        syncing = threading.Thread(target=lambda: answers.update(sync=follower.sync()))
        syncing.start()
        _wait_in_loop(broker, lambda: _group(broker, "slow").members[follower.member_id].sync is not None)
        # the follower has waited an hour in SyncGroup for the leader's: it is alive all the same
        _in_loop(broker, lambda: _set_waiting_long_ago(broker, "slow", 3600))
        assert _expire(broker, 0) == []
        assert leader.sync() == ErrorCode.none
        syncing.join(WAIT_S)
        assert answers["sync"] == ErrorCode.none
        assert _expire(broker, SESSION_S / 2) == []  # every session restarted with the answers
        assert _members(broker, "slow") == {first.member_id, second.member_id}
        for m in (first, second):
            assert m.heartbeat() == ErrorCode.none
    finally:
        for t in (joining, syncing):
            if t is not None and t.ident is not None:
                t.join(WAIT_S)
        first.client.close()
        second.client.close()


def _set_waiting_long_ago(broker: Broker, group: str, seconds: float) -> None:
    """Members waiting in JoinGroup or SyncGroup: as if they had been heard last ``seconds`` ago."""
    for m in _group(broker, group).members.values():
        if any(f is not None and not f.done() for f in (m.join, m.sync)):
            m.last_seen -= seconds


def _wait_in_loop(broker: Broker, condition: Callable[[], bool]) -> None:
    """Wait (bounded by WAIT_S) until ``condition()``, evaluated in the broker's loop, holds."""
    for _ in range(int(WAIT_S / 0.01)):
        if _in_loop(broker, condition):
            return
        _sleep_in_loop(broker, 0.01)
    raise AssertionError("the broker never reached the expected state")
