"""Consumer groups: assignment (G1), rebalances, fencing (G2), static membership, committed offsets (I7), admin.

Members here live in one process; tests/fault/test_group_processes.py runs them as separate processes. Where
time matters the log has a ManualClock and heartbeats are run with ``GroupMember.heartbeat()``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import pylog
from pylog.errors import (
    CommitFailedError,
    ConfigError,
    CorruptRecordError,
    GroupNotEmptyError,
    InvalidOffsetError,
    UnknownGroupError,
)
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
    """Poll every consumer until ``done()`` (rebalances complete inside poll)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in consumers:
            c.poll(timeout_ms=5, max_records=1)
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


@pytest.mark.parametrize("strategy", ASSIGNORS)
def test_members_split_the_partitions_disjointly_and_completely(produced: pylog.Log, strategy: str) -> None:
    everything = _tps("t", 6)
    members = [_member(produced, strategy)]
    _settle(members, lambda: members[0].assignment() == everything)
    members.append(_member(produced, strategy))
    members.append(_member(produced, strategy))
    _settle(members, _balanced(members, everything))
    gens = {m._group.generation for m in members}
    assert len(gens) == 1  # G1: one generation, disjoint assignments
    members[1].close()
    rest = [members[0], members[2]]
    _settle(rest, _balanced(rest, everything))
    for m in rest:
        m.close()
    desc = produced.describe_group("g")
    assert desc.state == "Empty" and desc.members == []


def test_eager_revokes_everything_cooperative_only_what_moves(produced: pylog.Log) -> None:
    everything = _tps("t", 6)
    for strategy, protocol in (("range", "eager"), ("cooperative-sticky", "cooperative")):
        rec_a = Recorder()
        a = _member(produced, strategy, listener=rec_a, group_id=f"g-{protocol}")
        _settle([a], lambda a=a: a.assignment() == everything)  # type: ignore[misc]
        b = _member(produced, strategy, listener=Recorder(), group_id=f"g-{protocol}")
        _settle([a, b], _balanced([a, b], everything))
        revoked = [set(tps) for kind, tps in rec_a.calls if kind == "revoked"]
        kept = a.assignment()
        if protocol == "eager":
            assert revoked and revoked[0] == everything  # everything, then a new assignment
        else:
            assert all(not (r & kept) for r in revoked)  # never revoked what it kept
            assert set().union(*revoked) == everything - kept
        assert produced.describe_group(f"g-{protocol}").protocol == protocol
        a.close()
        b.close()


def test_orderly_rebalances_with_commits_on_revoke_lose_and_duplicate_nothing(produced: pylog.Log) -> None:
    seen: list[int] = []
    members: list[Any] = []

    def make() -> Any:
        holder: dict[str, Any] = {}

        class CommitOnRevoke(pylog.ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
                holder["c"].commit({tp: holder["c"].position(tp) for tp in revoked})

        c = _member(produced, enable_auto_commit=False, listener=CommitOnRevoke())
        holder["c"] = c
        return c

    members.append(make())
    step = 0
    while len(seen) < 300 and step < 5000:
        step += 1
        for c in list(members):
            for records in c.poll(timeout_ms=2, max_records=7).values():
                seen.extend(r.value for r in records)
                c.commit({TopicPartition(records[0].topic, records[0].partition): records[-1].offset + 1})
        if step in (20, 60):
            members.append(make())
        if step == 100:
            members.pop(0).close()
    assert sorted(seen) == list(range(300))
    for c in members:
        c.close()
    ends = {tp: produced.topic("t").partition(tp.partition).log_end_offset for tp in _tps("t", 6)}
    assert {tp: om.offset for tp, om in produced.group_offsets("g").items()} == ends


def test_a_member_expelled_by_its_session_is_fenced_then_rejoins(log_dir: str) -> None:
    clock = pylog.ManualClock(1_700_000_000_000)
    with pylog.open(log_dir, clock=clock) as log:
        log.create_topic("t", partitions=2)
        log.producer().send("t", 1, partition=0).get()
        rec = Recorder()
        a = _member(log, listener=rec, session_timeout_ms=10_000, heartbeat_interval_ms=1_000)
        b = _member(log, session_timeout_ms=10_000, heartbeat_interval_ms=1_000)
        _settle([a, b], _balanced([a, b], _tps("t", 2)))
        mine = a.assignment()
        # a stops heartbeating (its thread is stopped, as if the process were frozen); b's session goes on
        a._group._stop.set()
        a._group._thread.join()
        clock.advance(11_000)
        b._group._next_heartbeat_ms = 0
        b._group.heartbeat()
        assert a._group.member_id not in {m.member_id for m in log.describe_group("g").members}
        with pytest.raises(CommitFailedError, match="poll"):
            a.commit({tp: 0 for tp in mine})
        _settle([a, b], _balanced([a, b], _tps("t", 2)))
        assert ("lost", sorted(mine)) in rec.calls
        assert log.describe_group("g").generation > 1
        a.close()
        b.close()


def test_no_poll_within_max_poll_interval_leaves_the_group(log_dir: str) -> None:
    clock = pylog.ManualClock(1_700_000_000_000)
    with pylog.open(log_dir, clock=clock) as log:
        log.create_topic("t", partitions=2)
        a = _member(log, max_poll_interval_ms=5_000)
        b = _member(log, max_poll_interval_ms=5_000)
        _settle([a, b], _balanced([a, b], _tps("t", 2)))
        clock.advance(6_000)  # neither polled; b polls now, a's heartbeat notices it did not
        b.poll(timeout_ms=0)
        a._group.heartbeat()
        assert a._group._left_for_poll_interval
        _settle([b], lambda: b.assignment() == _tps("t", 2))
        _settle([a, b], _balanced([a, b], _tps("t", 2)))  # a rejoins at its next poll
        a.close()
        b.close()


def test_static_member_restart_within_its_session_keeps_its_assignment(produced: pylog.Log) -> None:
    a = _member(produced, group_instance_id="worker-a", session_timeout_ms=30_000)
    b = _member(produced, group_instance_id="worker-b", session_timeout_ms=30_000)
    _settle([a, b], _balanced([a, b], _tps("t", 6)))
    before = a.assignment()
    generation = produced.describe_group("g").generation
    a.close()  # a static member does not leave the group on close
    again = _member(produced, group_instance_id="worker-a", session_timeout_ms=30_000)
    _settle([again, b], lambda: again.assignment() == before)
    assert produced.describe_group("g").generation == generation  # no rebalance
    assert len(produced.describe_group("g").members) == 2
    again.close()
    b.close()


def test_new_partitions_and_pattern_topics_are_picked_up(produced: pylog.Log) -> None:
    c = produced.consumer(group_id="p", auto_offset_reset="earliest", heartbeat_interval_ms=100)
    c.subscribe(pattern=r"t|u\..*")
    _settle([c], lambda: c.assignment() == _tps("t", 6))
    produced.create_partitions("t", 8)
    _settle([c], lambda: c.assignment() == _tps("t", 8))
    produced.create_topic("u.extra", partitions=2)
    _settle([c], lambda: c.assignment() == _tps("t", 8) | _tps("u.extra", 2))
    c.close()


def test_auto_commit_commits_only_what_was_returned(log_dir: str) -> None:
    clock = pylog.ManualClock(1_700_000_000_000)
    with pylog.open(log_dir, clock=clock) as log:
        log.create_topic("t")
        p = log.producer()
        for i in range(50):
            p.send("t", i)
        p.close()
        c = _member(log, auto_commit_interval_ms=1_000)
        _settle([c], lambda: bool(c.assignment()))
        tp = TopicPartition("t", 0)
        c.poll(timeout_ms=0, max_records=5)
        returned = c.position(tp)  # everything poll() has returned so far
        clock.advance(1_500)
        c.poll(timeout_ms=0, max_records=3)  # auto-commit runs first: what was returned, not what was fetched
        assert c.committed(tp) == returned
        assert c.position(tp) == returned + 3
        c.close()  # commits the position on close
        assert log.group_offsets("g")[tp].offset == returned + 3


def test_commit_async_calls_back_in_a_later_poll(produced: pylog.Log) -> None:
    c = _member(produced, enable_auto_commit=False)
    _settle([c], lambda: c.assignment() == _tps("t", 6))
    results: list[tuple[dict[TopicPartition, OffsetAndMetadata], Any]] = []
    c.commit_async({TopicPartition("t", 0): 1}, callback=lambda offsets, err: results.append((offsets, err)))
    deadline = time.monotonic() + 10
    while not results and time.monotonic() < deadline:
        c.poll(timeout_ms=5)
    assert results == [({TopicPartition("t", 0): OffsetAndMetadata(1, "")}, None)]
    with pytest.raises(InvalidOffsetError):  # bad input is refused at once, not in the callback
        c.commit_async(
            {TopicPartition("t", 0): 10**9}, callback=lambda offsets, err: results.append((offsets, err))
        )
    # a consumer with assign() may not commit into a group that has live members: the callback says so
    manual = produced.consumer(group_id="g", enable_auto_commit=False)
    manual.assign([TopicPartition("t", 5)])
    failures: list[Any] = []
    manual.commit_async({TopicPartition("t", 5): 1}, callback=lambda offsets, err: failures.append(err))
    manual.close()  # delivers pending callbacks
    assert len(failures) == 1 and isinstance(failures[0], CommitFailedError)
    c.close()
    assert TopicPartition("t", 5) not in produced.group_offsets("g")


def test_committed_offsets_survive_reopen_and_lag(produced: pylog.Log, log_dir: str) -> None:
    c = _member(produced, enable_auto_commit=False)
    _settle([c], lambda: c.assignment() == _tps("t", 6))
    c.commit({TopicPartition("t", 0): OffsetAndMetadata(3, "state")})
    assert c.committed(TopicPartition("t", 0)) == 3
    assert c.committed(TopicPartition("t", 0), metadata=True) == OffsetAndMetadata(3, "state")
    lag = c.lag()
    assert all(
        v == produced.topic("t").partition(tp.partition).log_end_offset - c.position(tp)
        for tp, v in lag.items()
    )
    c.close()
    produced.close()
    with pylog.open(log_dir) as again:
        assert again.group_offsets("g")[TopicPartition("t", 0)] == OffsetAndMetadata(3, "state")
        end = again.topic("t").partition(0).log_end_offset
        assert again.group_lag("g")[TopicPartition("t", 0)] == end - 3


def test_admin_refuses_live_groups_and_unknown_ones(produced: pylog.Log) -> None:
    c = _member(produced, enable_auto_commit=False)
    _settle([c], lambda: c.assignment() == _tps("t", 6))
    c.commit({TopicPartition("t", 1): 2})
    assert produced.list_groups() == ["g"]
    with pytest.raises(GroupNotEmptyError):
        produced.reset_group_offsets("g", {TopicPartition("t", 1): 0})
    with pytest.raises(GroupNotEmptyError):
        produced.delete_group("g")
    c.close()
    produced.reset_group_offsets("g", {TopicPartition("t", 1): 0})
    assert produced.group_offsets("g")[TopicPartition("t", 1)].offset == 0
    with pytest.raises(InvalidOffsetError):
        produced.reset_group_offsets("g", {TopicPartition("t", 1): 10**6})
    produced.delete_group("g")
    assert produced.list_groups() == []
    with pytest.raises(UnknownGroupError):
        produced.describe_group("g")


def _digest(root: str) -> dict[str, bytes]:
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".lock"):
                continue
            with open(os.path.join(d, f), "rb") as fh:
                out[os.path.relpath(os.path.join(d, f), root)] = fh.read()
    return out


def test_bad_commits_and_configs_are_typed_errors_and_change_nothing(produced: pylog.Log) -> None:
    c = _member(produced, enable_auto_commit=False)
    _settle([c], lambda: c.assignment() == _tps("t", 6))
    before = _digest(os.path.join(produced.path, "__groups"))
    end = produced.topic("t").partition(0).log_end_offset
    for bad in (
        {TopicPartition("t", 0): end + 1},
        {TopicPartition("t", 0): -1},
        {TopicPartition("t", 0): "3"},
        {TopicPartition("t", 0): OffsetAndMetadata(1, 5)},
        [1, 2],
    ):
        with pytest.raises(InvalidOffsetError):
            c.commit(bad)
    assert _digest(os.path.join(produced.path, "__groups")) == before
    with pytest.raises(ConfigError):
        produced.consumer(group_id="g", no_such_setting=1)
    with pytest.raises(ConfigError):
        produced.consumer(group_id="g", heartbeat_interval_ms=5000, session_timeout_ms=5000)
    with pytest.raises(ConfigError):
        produced.consumer(group_id="", auto_offset_reset="earliest")
    other = produced.consumer(group_id="g", partition_assignment_strategy="range")
    with pytest.raises(ConfigError, match="partition_assignment_strategy"):
        other.subscribe(["t"])
    c.close()


def test_offset_store_torn_tail_is_ignored_a_flipped_bit_corrected_and_double_damage_detected(
    produced: pylog.Log,
) -> None:
    c = _member(produced, enable_auto_commit=False)
    _settle([c], lambda: c.assignment() == _tps("t", 6))
    for i in range(1, 4):
        c.commit({TopicPartition("t", 0): i})
    c.close()
    path = os.path.join(produced.path, "__groups", "g-g", "offsets.log")
    with open(path, "ab") as f:
        f.write(b"\x20\x00\x00\x00junk")  # a torn append
    assert produced.group_offsets("g")[TopicPartition("t", 0)].offset == 3
    produced.reset_group_offsets("g", {TopicPartition("t", 0): 2})  # the next append cuts the torn tail
    assert produced.group_offsets("g")[TopicPartition("t", 0)].offset == 2

    def flip(at: int) -> None:
        with open(path, "r+b") as f:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0x04]))

    with open(path, "rb") as f:
        n = int.from_bytes(f.read(4), "little")  # payload length of the first record
    flip(10)  # one copy of the first record: the other one is intact, so nothing is lost
    assert produced.group_offsets("g")[TopicPartition("t", 0)].offset == 2
    flip(12 + n + 2)  # both copies damaged, and records follow: corruption, named
    with pytest.raises(CorruptRecordError, match=r"offsets\.log"):
        produced.group_offsets("g")
