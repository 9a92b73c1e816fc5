"""Consumer groups: assignment (G1), rebalances, fencing (G2), static membership, committed offsets (I7), admin.

Members here live in one process; tests/fault/test_group_processes.py runs them as separate processes. Where
time matters the log has a ManualClock and heartbeats are run with ``GroupMember.heartbeat()``: the heartbeat
thread does the same work on its own schedule, and running it first makes each poll see the group's latest
state, so listener call sequences are exact.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest

import pylog
from pylog import journal
from pylog.cli import main as cli_main
from pylog.errors import (
    CommitFailedError,
    ConfigError,
    CorruptRecordError,
    GroupNotEmptyError,
    IllegalStateError,
    InvalidOffsetError,
    UnknownGroupError,
    UnknownPartitionError,
    UnknownTopicError,
    UnsupportedFormatError,
)
from pylog.groups.liveness import HEADER_SIZE, SLOT_SIZE, Slot, member_tag
from pylog.groups.store import GroupStore
from pylog.record import crc32c
from pylog.structs import OffsetAndMetadata, TopicPartition

ASSIGNORS = ["range", "roundrobin", "sticky", "cooperative-sticky"]


class Recorder(pylog.ConsumerRebalanceListener):
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[TopicPartition]]] = []

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.calls.append(("revoked", revoked))

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.calls.append(("assigned", assigned))

    def on_partitions_lost(self, lost: list[TopicPartition]) -> None:
        self.calls.append(("lost", lost))


def _tps(topic: str, n: int) -> set[TopicPartition]:
    return {TopicPartition(topic, p) for p in range(n)}


def _settle(consumers: list[Any], done: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll every consumer until ``done()`` (rebalances complete inside poll); positions do not move."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in consumers:
            c._group.heartbeat()
            c.poll(timeout_ms=1, max_records=1, update_offsets=False)
        if done():
            return
    raise AssertionError("the group did not settle")


def _balanced(consumers: list[Any], everything: set[TopicPartition]) -> Callable[[], bool]:
    def check() -> bool:
        if len({c._group.generation for c in consumers}) != 1:
            return False  # someone has not adopted the latest assignment yet
        sets = [c.assignment() for c in consumers]
        union = set().union(*sets)
        disjoint = sum(len(s) for s in sets) == len(union)
        sizes = [len(s) for s in sets]
        return union == everything and disjoint and max(sizes) - min(sizes) <= 1

    return check


def _step(*consumers: Any) -> None:
    """One deterministic round: each consumer runs a heartbeat, then polls."""
    for c in consumers:
        c._group.heartbeat()
        c.poll(timeout_ms=0)


@pytest.fixture
def produced(log_dir: str) -> Iterator[pylog.Log]:
    with pylog.open(log_dir) as log:
        log.create_topic("t", partitions=6)
        p = log.producer()
        for i in range(300):
            p.send("t", i, key=str(i))
        p.close()
        yield log


def _member(log: pylog.Log, strategy: str = "cooperative-sticky", **kw: Any) -> Any:
    listener = kw.pop("listener", None)
    c = log.consumer(
        group_id=kw.pop("group_id", "g"),
        auto_offset_reset="earliest",
        partition_assignment_strategy=strategy,
        heartbeat_interval_ms=kw.pop("heartbeat_interval_ms", 100),
        **kw,
    )
    c.subscribe(["t"], listener=listener)
    return c


def _ends(log: pylog.Log, topic: str = "t") -> dict[TopicPartition, int]:
    return {
        tp: log.topic(topic).partition(tp.partition).log_end_offset for tp in log.topic(topic).partitions()
    }


def _offsets_or_none(log: pylog.Log) -> dict[TopicPartition, OffsetAndMetadata]:
    return log.group_offsets("g") if "g" in log.list_groups() else {}


# -- assignment -----------------------------------------------------------------------------------------------


def test_a_single_member_gets_every_partition(log: pylog.Log) -> None:
    log.create_topic("t", partitions=4)
    rec = Recorder()
    c = _member(log, listener=rec)
    _step(c)
    assert c.assignment() == _tps("t", 4)
    assert rec.calls == [("assigned", sorted(_tps("t", 4)))]
    desc = log.describe_group("g")
    assert (desc.state, desc.generation, desc.protocol, desc.assignor) == (
        "Stable",
        1,
        "cooperative",
        "cooperative-sticky",
    )
    assert [(m.member_id, set(m.assignment)) for m in desc.members] == [(c._group.member_id, _tps("t", 4))]
    c.close()


@pytest.mark.parametrize("strategy", ASSIGNORS)
def test_members_split_the_partitions_disjointly_and_completely(produced: pylog.Log, strategy: str) -> None:
    everything = _tps("t", 6)
    members = [_member(produced, strategy)]
    _settle(members, lambda: members[0].assignment() == everything)
    members.append(_member(produced, strategy))
    _settle(members, _balanced(members, everything))  # two members: G1, 3 + 3
    members.append(_member(produced, strategy))
    _settle(members, _balanced(members, everything))  # three members: 2 + 2 + 2
    described = {m.member_id: set(m.assignment) for m in produced.describe_group("g").members}
    assert described == {m._group.member_id: m.assignment() for m in members}
    members[1].close()
    rest = [members[0], members[2]]
    _settle(rest, _balanced(rest, everything))
    rest[0].close()
    _settle([rest[1]], lambda: rest[1].assignment() == everything)  # the last one gets everything
    rest[1].close()
    desc = produced.describe_group("g")
    assert desc.state == "Empty" and desc.members == []


def test_eager_revokes_everything_and_reassigns(log: pylog.Log) -> None:
    log.create_topic("t", partitions=6)
    rec_a, rec_b = Recorder(), Recorder()
    a = _member(log, "range", listener=rec_a)
    _step(a)
    b = _member(log, "range", listener=rec_b)
    for _ in range(3):
        _step(a, b)
    mine, theirs = a.assignment(), b.assignment()
    assert mine | theirs == _tps("t", 6) and not mine & theirs and len(mine) == 3
    everything = sorted(_tps("t", 6))
    assert rec_a.calls == [("assigned", everything), ("revoked", everything), ("assigned", sorted(mine))]
    assert rec_b.calls == [("assigned", sorted(theirs))]
    assert a._group.generation == b._group.generation == 2  # one rebalance
    assert log.describe_group("g").protocol == "eager"
    a.close()
    b.close()


def test_cooperative_only_moves_what_must_move(log: pylog.Log) -> None:
    log.create_topic("t", partitions=6)
    rec_a, rec_b = Recorder(), Recorder()
    a = _member(log, listener=rec_a)
    _step(a)
    b = _member(log, listener=rec_b)
    for _ in range(4):
        _step(a, b)
    kept, moved = a.assignment(), b.assignment()
    assert kept | moved == _tps("t", 6) and not kept & moved and len(kept) == 3
    # a keeps consuming what it keeps: it only revokes what moves, then the follow-up rebalance hands it over
    assert rec_a.calls == [
        ("assigned", sorted(_tps("t", 6))),
        ("revoked", sorted(moved)),
        ("assigned", []),
        ("assigned", []),
    ]
    assert rec_b.calls == [("assigned", []), ("assigned", sorted(moved))]
    assert a._group.generation == b._group.generation == 3  # two rebalances
    assert log.describe_group("g").protocol == "cooperative"
    a.close()
    b.close()


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_orderly_rebalances_with_commits_on_revoke_lose_and_duplicate_nothing(
    produced: pylog.Log, strategy: str
) -> None:
    """Members commit only in on_partitions_revoked (which close() also runs): every record is processed
    exactly once across two joins and a leave."""
    seen: list[tuple[int, int]] = []
    members: list[Any] = []

    class CommitOnRevoke(pylog.ConsumerRebalanceListener):
        def __init__(self) -> None:
            self.consumer: Any = None

        def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
            self.consumer.commit({tp: self.consumer.position(tp) for tp in revoked})

        def on_partitions_lost(self, lost: list[TopicPartition]) -> None:
            raise AssertionError(f"orderly rebalances lose nothing: {lost}")

    def make() -> Any:
        listener = CommitOnRevoke()
        listener.consumer = _member(produced, strategy, enable_auto_commit=False, listener=listener)
        return listener.consumer

    members.append(make())
    step = 0
    while len(seen) < 300 and step < 5000:
        step += 1
        for c in list(members):
            c._group.heartbeat()  # each poll sees a rebalance at once
            for tp, records in c.poll(timeout_ms=0, max_records=2).items():
                seen.extend((tp.partition, r.offset) for r in records)
        if step in (10, 25):
            members.append(make())
        if step == 40:
            members.pop(0).close()
    assert step > 40  # the joins and the leave happened while records were being consumed
    assert len(seen) == len(set(seen)) == 300  # exactly once
    for c in members:
        c.close()
    assert {tp: om.offset for tp, om in produced.group_offsets("g").items()} == _ends(produced)


# -- fencing, liveness ----------------------------------------------------------------------------------------


def _two_members_one_frozen(
    log: pylog.Log, clock: pylog.ManualClock, rec: Recorder, **kw: Any
) -> tuple[Any, Any]:
    """a and b share two partitions; then a's heartbeats stop and b's heartbeat expels a by its session."""
    log.create_topic("t", partitions=2)
    p = log.producer()
    for i in range(10):
        p.send("t", i, partition=i % 2)
    p.close()
    a = _member(log, listener=rec, session_timeout_ms=10_000, heartbeat_interval_ms=1_000, **kw)
    b = _member(log, session_timeout_ms=10_000, heartbeat_interval_ms=1_000)
    _settle([a, b], _balanced([a, b], _tps("t", 2)))
    assert a.poll(timeout_ms=0)  # a was consuming
    a._group._stop_heartbeats()  # a freezes; b's session goes on
    clock.advance(11_000)
    b._group.heartbeat()
    assert a._group.member_id not in {m.member_id for m in log.describe_group("g").members}
    return a, b


def test_a_member_expelled_by_its_session_is_fenced_then_rejoins(
    log: pylog.Log, clock: pylog.ManualClock
) -> None:
    rec = Recorder()
    a, b = _two_members_one_frozen(log, clock, rec, enable_auto_commit=False)
    mine, generation = a.assignment(), a._group.generation
    before = _offsets_or_none(log)
    with pytest.raises(CommitFailedError, match=r"poll\(\)"):
        a.commit({tp: 1 for tp in mine})
    assert _offsets_or_none(log) == before  # G2: nothing written
    calls = len(rec.calls)
    a.poll(timeout_ms=0)  # the next poll reports the loss and rejoins
    assert rec.calls[calls] == ("lost", sorted(mine))
    _settle([a, b], _balanced([a, b], _tps("t", 2)))
    assert a._group.generation > generation
    a.commit({tp: 1 for tp in a.assignment()})  # a member again: its commits count
    assert all(log.group_offsets("g")[tp].offset == 1 for tp in a.assignment())
    a.close()
    b.close()


def test_closing_an_expelled_member_reports_its_partitions_lost_and_commits_nothing(
    log: pylog.Log, clock: pylog.ManualClock
) -> None:
    rec = Recorder()
    a, b = _two_members_one_frozen(log, clock, rec)  # auto-commit on
    mine = a.assignment()
    before = _offsets_or_none(log)
    a.close()  # a is no longer a member: its partitions are lost, not revoked, and nothing is committed
    assert rec.calls[-1] == ("lost", sorted(mine))
    assert _offsets_or_none(log) == before
    b.close()


def test_no_poll_within_max_poll_interval_leaves_the_group(log: pylog.Log, clock: pylog.ManualClock) -> None:
    log.create_topic("t", partitions=2)
    rec = Recorder()
    a = _member(log, listener=rec, max_poll_interval_ms=5_000)
    b = _member(log, max_poll_interval_ms=5_000)
    _settle([a, b], _balanced([a, b], _tps("t", 2)))
    mine = a.assignment()
    clock.advance(6_000)  # neither polled; b polls now, a's heartbeat notices that a did not
    b.poll(timeout_ms=0)
    a._group.heartbeat()
    assert a._group.member_id not in {m.member_id for m in log.describe_group("g").members}
    _step(b)
    assert b.assignment() == _tps("t", 2)  # the other member takes over
    calls = len(rec.calls)
    a.poll(timeout_ms=0)
    assert rec.calls[calls] == ("lost", sorted(mine))
    _settle([a, b], _balanced([a, b], _tps("t", 2)))  # a rejoined at that poll
    a.close()
    b.close()


def test_static_member_restart_within_its_session_keeps_its_assignment(log: pylog.Log) -> None:
    log.create_topic("t", partitions=6)
    a = _member(log, group_instance_id="worker-a", session_timeout_ms=30_000)
    b = _member(log, group_instance_id="worker-b", session_timeout_ms=30_000)
    _settle([a, b], _balanced([a, b], _tps("t", 6)))
    before, theirs = a.assignment(), b.assignment()
    generation = log.describe_group("g").generation
    a.close()  # a static member does not leave the group on close
    assert len(log.describe_group("g").members) == 2
    rec = Recorder()
    again = _member(log, group_instance_id="worker-a", session_timeout_ms=30_000, listener=rec)
    _step(again, b)
    assert again.assignment() == before and b.assignment() == theirs
    assert rec.calls == [("assigned", sorted(before))]
    assert log.describe_group("g").generation == generation == again._group.generation  # no rebalance
    assert {m.group_instance_id for m in log.describe_group("g").members} == {"worker-a", "worker-b"}
    again.close()
    b.close()


def test_a_static_member_that_stays_away_past_its_session_is_replaced(
    log: pylog.Log, clock: pylog.ManualClock
) -> None:
    log.create_topic("t", partitions=4)
    a = _member(log, group_instance_id="worker-a", session_timeout_ms=10_000, heartbeat_interval_ms=1_000)
    b = _member(log, session_timeout_ms=10_000, heartbeat_interval_ms=1_000)
    _settle([a, b], _balanced([a, b], _tps("t", 4)))
    a.close()
    clock.advance(11_000)
    _settle([b], lambda: b.assignment() == _tps("t", 4))
    assert [m.member_id for m in log.describe_group("g").members] == [b._group.member_id]
    b.close()


def test_new_partitions_and_pattern_topics_are_picked_up(produced: pylog.Log) -> None:
    a = produced.consumer(group_id="p", auto_offset_reset="earliest", heartbeat_interval_ms=100)
    a.subscribe(pattern=r"t|u\..*")
    b = produced.consumer(group_id="p", auto_offset_reset="earliest", heartbeat_interval_ms=100)
    b.subscribe(pattern=r"t|u\..*")
    _settle([a, b], _balanced([a, b], _tps("t", 6)))
    produced.create_partitions("t", 8)
    _settle([a, b], _balanced([a, b], _tps("t", 8)))
    produced.create_topic("u.extra", partitions=2)
    produced.create_topic("v", partitions=2)  # does not match
    _settle([a, b], _balanced([a, b], _tps("t", 8) | _tps("u.extra", 2)))
    a.close()
    b.close()


# -- commits --------------------------------------------------------------------------------------------------


def test_auto_commit_commits_only_what_was_returned(log: pylog.Log, clock: pylog.ManualClock) -> None:
    log.create_topic("t")
    p = log.producer()
    for i in range(50):
        p.send("t", i)
    p.close()
    c = _member(log, auto_commit_interval_ms=1_000)
    tp = TopicPartition("t", 0)
    _settle([c], lambda: c.assignment() == {tp})
    assert [r.offset for r in c.poll(timeout_ms=0, max_records=5)[tp]] == [0, 1, 2, 3, 4]
    clock.advance(500)
    c.poll(timeout_ms=0, max_records=3)  # not yet due
    assert c.committed(tp) is None
    clock.advance(1_000)
    c.poll(timeout_ms=0, max_records=3)  # auto-commit runs first: what was returned, not what was fetched
    assert c.committed(tp) == 8
    assert c.position(tp) == 11
    c.close()  # commits the position on close
    assert log.group_offsets("g")[tp].offset == 11


def test_commit_async_calls_back_in_a_later_poll(produced: pylog.Log) -> None:
    c = _member(produced, enable_auto_commit=False)
    _settle([c], lambda: c.assignment() == _tps("t", 6))
    results: list[tuple[dict[TopicPartition, OffsetAndMetadata], Any]] = []
    c.commit_async({TopicPartition("t", 0): 1}, callback=lambda offsets, err: results.append((offsets, err)))
    deadline = time.monotonic() + 20
    while not results and time.monotonic() < deadline:
        c.poll(timeout_ms=5)
    assert results == [({TopicPartition("t", 0): OffsetAndMetadata(1, "")}, None)]
    assert c.committed(TopicPartition("t", 0)) == 1
    # an offset the commit refuses reaches the callback and the returned future, as in kafka-python
    refused = c.commit_async(
        {TopicPartition("t", 0): 10**9}, callback=lambda offsets, err: results.append((offsets, err))
    )
    assert refused.failed() and isinstance(refused.exception, InvalidOffsetError)
    c.poll(timeout_ms=0)
    assert results[1][0] == {TopicPartition("t", 0): 10**9} and isinstance(results[1][1], InvalidOffsetError)
    assert c.committed(TopicPartition("t", 0)) == 1
    # a consumer with assign() may not commit into a group that has live members: the callback says so
    manual = produced.consumer(group_id="g", enable_auto_commit=False)
    manual.assign([TopicPartition("t", 5)])
    failures: list[Any] = []
    manual.commit_async(
        {TopicPartition("t", 5): 1}, callback=lambda offsets, err: failures.append((offsets, err))
    )
    manual.close()  # delivers pending callbacks
    assert len(failures) == 1
    assert failures[0][0] == {TopicPartition("t", 5): OffsetAndMetadata(1, "")}
    assert isinstance(failures[0][1], CommitFailedError)
    c.close()
    assert TopicPartition("t", 5) not in produced.group_offsets("g")


def test_committed_offsets_survive_reopen_and_lag(produced: pylog.Log, log_dir: str) -> None:
    c = _member(produced, enable_auto_commit=False)
    _settle([c], lambda: c.assignment() == _tps("t", 6))
    c.commit({TopicPartition("t", 0): OffsetAndMetadata(3, "state")})
    c.commit({TopicPartition("t", 1): 4})
    assert c.committed(TopicPartition("t", 0)) == 3
    assert c.committed(TopicPartition("t", 0), metadata=True) == OffsetAndMetadata(3, "state")
    assert c.committed(TopicPartition("t", 2)) is None
    c.poll(timeout_ms=0, max_records=10)
    ends = _ends(produced)
    assert c.lag() == {tp: ends[tp] - c.position(tp) for tp in _tps("t", 6)}
    c.close(autocommit=False)
    produced.close()
    with pylog.open(log_dir) as again:
        assert again.group_offsets("g") == {
            TopicPartition("t", 0): OffsetAndMetadata(3, "state"),
            TopicPartition("t", 1): OffsetAndMetadata(4, ""),
        }
        assert again.group_lag("g") == {
            TopicPartition("t", 0): ends[TopicPartition("t", 0)] - 3,
            TopicPartition("t", 1): ends[TopicPartition("t", 1)] - 4,
        }
        c2 = _member(again, enable_auto_commit=False)
        _settle([c2], lambda: c2.assignment() == _tps("t", 6))
        assert c2.position(TopicPartition("t", 0)) == 3  # a new member starts from the committed offset
        assert c2.committed(TopicPartition("t", 0), metadata=True) == OffsetAndMetadata(3, "state")
        c2.close()


def test_a_raising_listener_does_not_stall_the_rebalance(log: pylog.Log) -> None:
    log.create_topic("t", partitions=4)

    class Raises(Recorder):
        def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
            super().on_partitions_assigned(assigned)
            if len(self.calls) > 1:
                raise RuntimeError("listener bug")

    rec = Raises()
    a = _member(log, listener=rec)
    _step(a)
    b = _member(log)
    raised = 0
    for _ in range(6):
        for c in (a, b):
            c._group.heartbeat()
            try:
                c.poll(timeout_ms=0)
            except RuntimeError:
                raised += 1
    assert raised >= 1  # the listener's error reaches the caller of poll() ...
    assert _balanced([a, b], _tps("t", 4))()  # ... and the partitions a revoked still reached b
    a.close()
    b.close()


# -- admin and CLI --------------------------------------------------------------------------------------------


def test_admin_refuses_live_groups_and_unknown_ones(produced: pylog.Log) -> None:
    c = _member(produced, enable_auto_commit=False)
    _settle([c], lambda: c.assignment() == _tps("t", 6))
    c.commit({TopicPartition("t", 1): 2})
    assert produced.list_groups() == ["g"]
    desc = produced.describe_group("g")
    assert desc.state == "Stable" and [m.member_id for m in desc.members] == [c._group.member_id]
    assert desc.members[0].pid == os.getpid()
    assert produced.group_lag("g") == {TopicPartition("t", 1): _ends(produced)[TopicPartition("t", 1)] - 2}
    with pytest.raises(GroupNotEmptyError):
        produced.reset_group_offsets("g", {TopicPartition("t", 1): 0})
    with pytest.raises(GroupNotEmptyError):
        produced.delete_group("g")
    assert produced.group_offsets("g")[TopicPartition("t", 1)].offset == 2
    c.close(autocommit=False)
    produced.reset_group_offsets("g", {TopicPartition("t", 1): 0})  # an explicit reset may go backwards
    assert produced.group_offsets("g")[TopicPartition("t", 1)].offset == 0
    with pytest.raises(InvalidOffsetError):
        produced.reset_group_offsets("g", {TopicPartition("t", 1): 10**6})
    produced.delete_group("g")
    assert produced.list_groups() == []
    for call in (produced.describe_group, produced.group_offsets, produced.group_lag, produced.delete_group):
        with pytest.raises(UnknownGroupError):
            call("g")


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    code = cli_main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if "--json" in argv and code == 0 else out), err


def test_groups_cli_against_a_real_group(produced: pylog.Log, capsys: pytest.CaptureFixture[str]) -> None:
    d = ["--dir", produced.path, "--json"]
    c = _member(produced, enable_auto_commit=False)
    _settle([c], lambda: c.assignment() == _tps("t", 6))
    c.commit({TopicPartition("t", 0): 5, TopicPartition("t", 3): 7})
    ends = _ends(produced)

    code, out, _ = _cli(capsys, "groups", "list", *d)
    assert code == 0 and [g["group"] for g in out] == ["g"]
    code, out, _ = _cli(capsys, "groups", "describe", "g", *d)
    assert code == 0
    (group,) = out
    assert group["state"] == "Stable" and len(group["members"]) == 1
    rows = {row["partition"]: row for row in group["partitions"]}
    assert set(rows) == set(range(6))
    assert rows[0]["current_offset"] == 5 and rows[0]["lag"] == ends[TopicPartition("t", 0)] - 5
    assert rows[3]["current_offset"] == 7 and rows[1]["current_offset"] is None
    assert {row["consumer_id"] for row in rows.values()} == {c._group.member_id}

    # while the member is live, reset and delete are refused and change nothing
    code, _, err = _cli(
        capsys, "groups", "reset-offsets", "g", "--all-topics", "--to-earliest", "--execute", *d
    )
    assert code != 0 and "live members" in err
    code, _, err = _cli(capsys, "groups", "delete", "g", *d)
    assert code != 0 and "live members" in err
    assert {tp.partition: om.offset for tp, om in produced.group_offsets("g").items()} == {0: 5, 3: 7}
    c.close(autocommit=False)

    code, out, _ = _cli(capsys, "groups", "reset-offsets", "g", "--topic", "t:0", "--shift-by", "-2", *d)
    assert code == 0 and out["executed"] is False and out["partitions"][0]["new_offset"] == 3
    assert produced.group_offsets("g")[TopicPartition("t", 0)].offset == 5  # a dry run
    code, out, _ = _cli(
        capsys, "groups", "reset-offsets", "g", "--all-topics", "--to-latest", "--execute", *d
    )
    assert code == 0 and out["executed"] is True
    assert {tp: om.offset for tp, om in produced.group_offsets("g").items()} == {
        TopicPartition("t", 0): ends[TopicPartition("t", 0)],
        TopicPartition("t", 3): ends[TopicPartition("t", 3)],
    }
    code, out, _ = _cli(capsys, "groups", "describe", "g", *d)
    assert (
        code == 0 and out[0]["state"] == "Empty" and all(r["lag"] in (0, None) for r in out[0]["partitions"])
    )
    code, _, _ = _cli(capsys, "groups", "delete", "g", *d)
    assert code == 0 and produced.list_groups() == []
    code, _, err = _cli(capsys, "groups", "describe", "g", *d)
    assert code != 0 and "unknown consumer group" in err


# -- bad input ------------------------------------------------------------------------------------------------


def _digest(root: str) -> dict[str, bytes]:
    out = {}
    for d, _, files in os.walk(root):
        out[os.path.relpath(d, root) + "/"] = b""
        for f in files:
            if f.endswith(".lock"):
                continue
            with open(os.path.join(d, f), "rb") as fh:
                out[os.path.relpath(os.path.join(d, f), root)] = fh.read()
    return out


def test_bad_commits_are_typed_errors_and_change_nothing(produced: pylog.Log) -> None:
    c = _member(produced, enable_auto_commit=False)
    _settle([c], lambda: c.assignment() == _tps("t", 6))
    c.commit({TopicPartition("t", 0): 1})
    before = _digest(produced.path)
    end = produced.topic("t").partition(0).log_end_offset
    for bad in (
        {TopicPartition("t", 0): end + 1},
        {TopicPartition("t", 0): -1},
        {TopicPartition("t", 0): "3"},
        {TopicPartition("t", 0): 1.0},
        {TopicPartition("t", 0): True},
        {TopicPartition("t", 0): OffsetAndMetadata(1, 5)},  # type: ignore[arg-type]
        {("t", "0"): 1},
        {"t0": 1},
        {5: 1},
        {TopicPartition("t", 1): 1, TopicPartition("t", 0): end + 1},  # all or nothing
        [1, 2],
    ):
        with pytest.raises(InvalidOffsetError):
            c.commit(bad)  # type: ignore[arg-type]
    with pytest.raises(UnknownTopicError):
        c.commit({TopicPartition("nope", 0): 0})
    with pytest.raises(UnknownPartitionError):
        c.commit({TopicPartition("t", 6): 0})
    for bad_reset in ({TopicPartition("t", 0): -1}, {("t", None): 0}, [(TopicPartition("t", 0), 0)]):
        with pytest.raises(InvalidOffsetError):
            produced.reset_group_offsets("g", bad_reset)  # type: ignore[arg-type]
    assert _digest(produced.path) == before
    assert c.committed(TopicPartition("t", 0)) == 1
    c.close(autocommit=False)


def test_bad_configs_are_typed_errors_and_change_nothing(produced: pylog.Log) -> None:
    c = _member(produced, enable_auto_commit=False)
    _settle([c], lambda: c.assignment() == _tps("t", 6))
    before = _digest(produced.path)
    for bad in (
        {"group_id": "g", "no_such_setting": 1},
        {"group_id": "g", "heartbeat_interval_ms": 5000, "session_timeout_ms": 5000},
        {"group_id": "g", "session_timeout_ms": -1},
        {"group_id": "g", "session_timeout_ms": "10"},
        {"group_id": "g", "enable_auto_commit": "yes"},
        {"group_id": "g", "partition_assignment_strategy": "fastest"},
        {"group_id": "g", "partition_assignment_strategy": []},
        {"group_id": "g", "group_instance_id": ""},
        {"group_id": ""},
        {"group_id": 7},
        {"group_id": "x" * 201},
    ):
        with pytest.raises(ConfigError):
            produced.consumer(**bad)
    with pytest.raises(ConfigError):
        produced.consumer(group_id="g").subscribe(pattern="(unclosed")
    # a member asking for another assignor than the group's is refused; the consumer stays unsubscribed
    other = produced.consumer(group_id="g", partition_assignment_strategy="range")
    with pytest.raises(ConfigError, match="partition_assignment_strategy"):
        other.subscribe(["t"])
    assert other.subscription() == set()
    other.poll(timeout_ms=0)  # and its polls do not try to join
    assert _digest(produced.path) == before
    other.assign([TopicPartition("t", 0)])  # it may still read without the group
    other.close()
    with pytest.raises(IllegalStateError):
        produced.consumer().commit()
    c.close(autocommit=False)


# -- the committed-offset store -------------------------------------------------------------------------------


def _offsets_path(log: pylog.Log, group: str = "g") -> str:
    return os.path.join(log.path, "__groups", f"g-{group}", "offsets.log")


def _commits(log: pylog.Log, *offsets: int) -> None:
    c = _member(log, enable_auto_commit=False)
    _settle([c], lambda: c.assignment() == _tps("t", 6))
    for offset in offsets:
        c.commit({TopicPartition("t", 0): offset})
    c.close(autocommit=False)


def test_offset_store_torn_tail_is_ignored_then_cut_by_the_next_commit(produced: pylog.Log) -> None:
    _commits(produced, 1, 2, 3)
    path = _offsets_path(produced)
    with open(path, "rb") as f:
        good = f.read()
    record = journal.encode(msgpack.packb([0, 1, "m", [["t", 0, 9, ""]]]))
    with open(path, "ab") as f:
        f.write(record[: len(record) // 2])  # an append cut short by a crash
    assert produced.group_offsets("g")[TopicPartition("t", 0)].offset == 3
    produced.reset_group_offsets("g", {TopicPartition("t", 0): 2})  # the next append cuts the torn tail
    assert produced.group_offsets("g")[TopicPartition("t", 0)].offset == 2
    with open(path, "rb") as f:
        raw = f.read()
    records, used = journal.parse(raw, 0, path)
    assert raw.startswith(good) and used == len(raw)  # the torn bytes are gone, the new record follows
    assert [msgpack.unpackb(payload)[3] for _, payload in records[-2:]] == [
        [["t", 0, 3, ""]],
        [["t", 0, 2, ""]],
    ]


def test_offset_store_flipped_bit_is_corrected_and_double_damage_is_named(produced: pylog.Log) -> None:
    _commits(produced, 1, 2, 3)
    path = _offsets_path(produced)

    def flip(at: int) -> None:
        with open(path, "r+b") as f:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0x04]))

    with open(path, "rb") as f:
        n = int.from_bytes(f.read(4), "little")  # payload length of the first record
    flip(10)  # one copy of the first record: the other copy is intact, so nothing is lost
    assert produced.group_offsets("g")[TopicPartition("t", 0)].offset == 3
    flip(12 + n + 2)  # both copies damaged, and records follow: corruption, named
    with pytest.raises(CorruptRecordError, match=r"offsets\.log") as info:
        produced.group_offsets("g")
    assert info.value.path == path  # type: ignore[attr-defined]
    with pytest.raises(CorruptRecordError):  # and a commit does not write past it
        produced.reset_group_offsets("g", {TopicPartition("t", 0): 0})


def test_offset_store_is_compacted_when_large_and_loses_nothing(produced: pylog.Log) -> None:
    c = _member(produced, enable_auto_commit=False)
    _settle([c], lambda: c.assignment() == _tps("t", 6))
    path = _offsets_path(produced)
    c.commit({TopicPartition("t", 1): OffsetAndMetadata(4, "kept")})
    reader = GroupStore(produced.path, "g")  # another reader, which had read the file before it was rewritten
    assert reader.offsets()[TopicPartition("t", 1)] == OffsetAndMetadata(4, "kept")
    sizes = []
    for i in range(80):
        c.commit({TopicPartition("t", 0): OffsetAndMetadata(i % 40, f"{i:03d}" + "x" * 3000)})
        sizes.append(os.path.getsize(path))
    shrank = [k for k in range(1, len(sizes)) if sizes[k] < sizes[k - 1]]
    assert shrank, "the offsets file was never rewritten"
    assert max(sizes) < 512 << 10
    expected = {
        TopicPartition("t", 0): OffsetAndMetadata(79 % 40, "079" + "x" * 3000),
        TopicPartition("t", 1): OffsetAndMetadata(4, "kept"),
    }
    assert c._group.store.offsets() == expected
    assert reader.offsets() == expected
    reader.close()
    c.close(autocommit=False)
    assert produced.group_offsets("g") == expected


def test_offset_reader_is_not_fooled_by_a_reused_inode(produced: pylog.Log) -> None:
    """A rewritten offsets file may get the inode number of the one a reader read last: the reader must read
    it from the start, not resume in the middle of a record of the new file."""
    _commits(produced, 1, 2, 3)
    path = _offsets_path(produced)
    reader = GroupStore(produced.path, "g")
    assert reader.offsets()[TopicPartition("t", 0)].offset == 3
    other = journal.encode(msgpack.packb([0, -1, "", [["t", 2, 9, "m" * 500], ["t", 0, 1, ""]]]))
    assert len(other) > os.path.getsize(path)
    with open(path, "r+b") as f:  # same inode, other contents, longer than what the reader read
        f.write(other)
    assert reader.offsets() == {
        TopicPartition("t", 2): OffsetAndMetadata(9, "m" * 500),
        TopicPartition("t", 0): OffsetAndMetadata(1, ""),
    }
    reader.close()


def test_state_reader_reuses_its_copy_only_while_that_version_is_published(log_dir: str) -> None:
    """A reader keeps the state it decoded while the heartbeat table publishes its version; every write
    publishes a new one (same size, same mtime or not); a writer that died between replacing the file and
    publishing leaves the sequence odd, and readers then read the file."""
    os.makedirs(log_dir)
    writer, reader = GroupStore(log_dir, "s"), GroupStore(log_dir, "s")
    state = writer.read_state()
    state["generation"] = 1
    writer.write_state(state)
    first = reader.state_view()
    assert first["generation"] == 1 and reader.state_view() is first  # cached: no read of the file
    assert reader.state_seq() == 2 * first["version"]
    state = writer.read_state()
    state["generation"] = 2
    writer.write_state(state)
    assert reader.state_view()["generation"] == 2
    # a writer killed after the rename, before publishing: the sequence stays odd, the file is the truth
    state = writer.read_state()
    state["generation"] = 3
    writer.write_state(state)
    writer.table.set_state_seq(2 * state["version"] - 1)
    assert reader.state_view()["generation"] == 3
    copy = reader.read_state()
    copy["generation"] = 99  # a copy: the cached view does not change
    assert reader.state_view()["generation"] == 3
    writer.close()
    reader.close()


def test_a_group_directory_of_the_previous_format_is_read_and_converted(log: pylog.Log) -> None:
    """A group whose state is format 1 (JSON, heartbeats inside) and has no heartbeat table: describe reads
    it, a new member joins (the old member, dead, is expelled), the committed offsets are kept."""
    log.create_topic("t", partitions=2)
    c = _member(log)
    _settle([c], lambda: len(c.assignment()) == 2)
    c.close()
    committed = log.group_offsets("g")
    assert committed == {tp: OffsetAndMetadata(0, "") for tp in _tps("t", 2)}
    directory = os.path.join(log.path, "__groups", "g-g")
    os.unlink(os.path.join(directory, "heartbeats"))
    old = {
        "group_id": "g",
        "state": "Stable",
        "generation": 7,
        "assignor": "cooperative-sticky",
        "protocol": "cooperative",
        "leader": "old-1",
        "rebalance": None,
        "rebalance_id": 3,
        "topics": {"t": 2},
        "static": {},
        "members": {
            "old-1": {
                "instance_id": None,
                "client_id": "old",
                "host": "h",
                "pid": 1,
                "topics": ["t"],
                "pattern": None,
                "assignor": "cooperative-sticky",
                "session_timeout_ms": 45_000,
                "rebalance_timeout_ms": 300_000,
                "heartbeat_ms": log.clock.time_ms(),
                "joined": 3,
                "owned": [["t", 0], ["t", 1]],
                "assignment": [["t", 0], ["t", 1]],
                "generation": 7,
            }
        },
    }
    body = json.dumps(old, sort_keys=True, separators=(",", ":")).encode()
    with open(os.path.join(directory, "state"), "wb") as f:
        f.write(b"pylog-group 1 " + f"{crc32c(body):08x}\n".encode() + body)
    described = log.describe_group("g")  # old-1's liveness lock is free: it is expelled
    assert (described.state, described.generation, described.members) == ("Empty", 8, [])
    d = _member(log)
    _settle([d], lambda: len(d.assignment()) == 2)
    assert d._group.generation == 9
    assert log.group_offsets("g") == committed
    with open(os.path.join(directory, "state"), "rb") as f:
        assert f.read().startswith(b"pylog-group 2 ")
    d.close()


def test_a_state_of_an_unknown_format_is_a_typed_error(log: pylog.Log) -> None:
    log.create_topic("t")
    _member(log).close()
    with open(os.path.join(log.path, "__groups", "g-g", "state"), "wb") as f:
        f.write(b"pylog-group 3 00000000\n{}")
    store = GroupStore(log.path, "g")
    store.table.set_state_seq(-1)  # what a writer does while it replaces the state
    store.close()
    with pytest.raises(UnsupportedFormatError, match="newer pylog"):
        log.describe_group("g")


def test_heartbeat_table_slots_are_seqlocked_tagged_and_grow(log_dir: str) -> None:
    """A slot reads back as written; a slot whose owner stays mid-write (seq odd) reads as nothing; a slot
    whose tag is another member's is not that member's; a table grown by another process is remapped."""
    os.makedirs(log_dir)
    a, b = GroupStore(log_dir, "s"), GroupStore(log_dir, "s")
    a.table.write(3, Slot(member_tag("m1"), 1234, 7, 42))
    assert b.table.read(3) == Slot(member_tag("m1"), 1234, 7, 42)
    member = {"slot": 3, "since_ms": 1000}
    assert b.last_heartbeat("m1", member) == 1234 and b.joined("m1", member) == 7
    assert b.slot_of("m2", member) is None and b.last_heartbeat("m2", member) == 1000
    at = HEADER_SIZE + SLOT_SIZE * 3
    with open(os.path.join(a.directory, "heartbeats"), "r+b") as f:
        f.seek(at)
        f.write(struct.pack("<q", 5))  # odd: a writer died in the middle of its write
    assert b.table.read(3) is None and b.joined("m1", member) == -1
    a.table.write(3, Slot(member_tag("m1"), 2000, 8, 42))  # the owner's next write repairs it
    assert b.table.read(3) == Slot(member_tag("m1"), 2000, 8, 42)
    a.table.ensure_capacity(1000)
    a.table.write(999, Slot(member_tag("m9"), 5, 1, 1))
    assert b.table.read(999) == Slot(member_tag("m9"), 5, 1, 1)
    a.close()
    b.close()


def test_a_heartbeat_takes_no_group_lock_and_rewrites_no_state(
    log: pylog.Log, clock: pylog.ManualClock
) -> None:
    log.create_topic("t", partitions=2)
    kw: dict[str, Any] = {"heartbeat_interval_ms": 1_000, "enable_auto_commit": False}  # a commit would wait
    a, b = _member(log, **kw), _member(log, **kw)
    _settle([a, b], _balanced([a, b], _tps("t", 2)))
    store = a._group.store
    version = store.state_view()["version"]
    me = store.state_view()["members"][a._group.member_id]
    clock.advance(5_000)
    other = GroupStore(log.path, "g")
    with other.lock():  # another process holds the group lock
        done = threading.Event()
        worker = threading.Thread(target=lambda: (a._group.heartbeat(), b.poll(timeout_ms=0), done.set()))
        worker.start()
        worker.join(10)
        assert done.is_set(), "a heartbeat or a settled poll waited for the group lock"
    other.close()
    assert store.state_view()["version"] == version
    assert store.last_heartbeat(a._group.member_id, me) == clock.time_ms()
    a.close()
    b.close()


def test_commits_share_the_group_lock_and_wait_only_for_a_change_of_the_state(produced: pylog.Log) -> None:
    """A commit checks fencing under the shared group lock: other commits (shared holders) do not stop it;
    a change of the state (an exclusive holder: a rebalance that may fence it) does, until it is written."""
    a = _member(produced, enable_auto_commit=False)
    _settle([a], lambda: len(a.assignment()) == 6)
    tp = TopicPartition("t", 0)
    other = GroupStore(produced.path, "g")

    def commit_in_thread(offset: int) -> threading.Thread:
        worker = threading.Thread(target=a.commit, args=({tp: offset},))
        worker.start()
        worker.join(2)
        return worker

    with other.lock(shared=True):
        assert not commit_in_thread(1).is_alive()
    assert produced.group_offsets("g")[tp].offset == 1
    with other.lock():
        worker = commit_in_thread(2)
        assert worker.is_alive(), "a commit went on while the state was being changed"
    worker.join(10)
    assert produced.group_offsets("g")[tp].offset == 2
    other.close()
    a.close()


# -- topics deleted under a consumer (by another Log object on the same directory) ---------------------------


def _fill(log: pylog.Log, topic: str, partitions: int, n: int) -> dict[TopicPartition, int]:
    log.create_topic(topic, partitions=partitions)
    producer = log.producer()
    for i in range(n):
        producer.send(topic, i, key=str(i))
    producer.close()
    return _ends(log, topic)


def _drain(consumer: Any, ends: dict[TopicPartition, int]) -> dict[TopicPartition, list[Any]]:
    """Poll (running heartbeats) until the consumer's position reached ``ends`` on every partition in it."""
    got: dict[TopicPartition, list[Any]] = {tp: [] for tp in ends}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        consumer._group.heartbeat()
        for tp, records in consumer.poll(timeout_ms=5).items():
            got.setdefault(tp, []).extend(r.value for r in records)
        assigned = consumer.assignment()
        if set(ends) <= assigned and all(consumer.position(tp) >= end for tp, end in ends.items()):
            return got
    raise AssertionError("the consumer did not reach the log end")


def test_a_deleted_topic_leaves_the_assignment_and_comes_back_with_its_new_partitions(log_dir: str) -> None:
    with pylog.open(log_dir) as mine, pylog.open(log_dir) as other:
        old_t, u = _fill(mine, "t", 3, 60), _fill(mine, "u", 2, 20)
        rec = Recorder()
        c = mine.consumer(group_id="g", auto_offset_reset="earliest", heartbeat_interval_ms=100)
        c.subscribe(["t", "u"], listener=rec)
        _drain(c, old_t | u)
        other.delete_topic("t")
        _settle([c], lambda: c.assignment() == set(u))  # polls go on without an error
        assert {tp for name, tps in rec.calls if name == "revoked" for tp in tps} == set(old_t)
        new_t = _fill(other, "t", 1, 5)
        assert set(new_t) < set(old_t)
        got = _drain(c, new_t)  # the new topic is read from its beginning (auto_offset_reset="earliest")
        assert sorted(got[TopicPartition("t", 0)]) == list(range(5))
        assert c.assignment() == set(u) | set(new_t)
        c.close()
        offsets = {tp: om.offset for tp, om in mine.group_offsets("g").items()}
        assert {tp: offsets[tp] for tp in u} == u
        assert offsets[TopicPartition("t", 0)] == new_t[TopicPartition("t", 0)]


def test_close_commits_what_it_can_after_a_topic_is_deleted_and_created_again(log_dir: str) -> None:
    with pylog.open(log_dir) as mine, pylog.open(log_dir) as other:
        old_t, u = _fill(mine, "t", 3, 60), _fill(mine, "u", 2, 20)
        c = mine.consumer(group_id="g", auto_offset_reset="earliest", heartbeat_interval_ms=100)
        c.subscribe(["t", "u"])
        _drain(c, old_t | u)
        other.delete_topic("t")
        c._group.heartbeat()  # this process notices the deletion
        other.create_topic("t", partitions=1)
        c.close()  # the positions of t's old partitions are not committed: they do not exist any more
        offsets = {tp: om.offset for tp, om in mine.group_offsets("g").items()}
        assert offsets == u


def test_polling_assigned_partitions_of_a_deleted_topic_is_unknown_topic_error(log_dir: str) -> None:
    with pylog.open(log_dir) as mine, pylog.open(log_dir) as other:
        _fill(mine, "t", 2, 40)
        c = mine.consumer(auto_offset_reset="earliest", max_partition_fetch_bytes=1)
        c.assign(sorted(_tps("t", 2)))
        assert c.poll(timeout_ms=100, max_records=1)
        other.delete_topic("t")
        for _ in range(3):
            with pytest.raises(UnknownTopicError):
                c.poll(timeout_ms=0)
        c.close()


def test_deleting_a_topic_forgets_its_committed_offsets(log: pylog.Log) -> None:
    """As Kafka's group coordinator does: a topic created again under the same name is read from its
    start, not from the deleted topic's committed positions (which would skip its first records)."""
    log.create_topic("t")
    log.create_topic("kept")
    p = log.producer()
    for i in range(20):
        p.send("t", {"old": i})
    p.send("kept", {"kept": 0})
    p.flush()
    first = log.consumer(group_id="g", auto_offset_reset="earliest", enable_auto_commit=False)
    first.subscribe(["t", "kept"])
    got = 0
    while got < 21:
        got += sum(len(r) for r in first.poll(timeout_ms=50).values())
    first.commit({TopicPartition("t", 0): 5, TopicPartition("kept", 0): 1})
    first.close(autocommit=False)
    log.delete_topic("t")
    assert log.group_offsets("g") == {TopicPartition("kept", 0): OffsetAndMetadata(1, "")}
    log.create_topic("t")
    for i in range(10):
        p.send("t", {"new": i})
    p.flush()
    second = log.consumer(group_id="g", auto_offset_reset="earliest", consumer_timeout_ms=500)
    second.subscribe(["t", "kept"])
    values = [r.value for r in second]
    second.close()
    assert values == [{"new": i} for i in range(10)]
