"""A Hypothesis state machine of a consumer group: several consumers in one process, a ManualClock.

Steps: consumers join (subscribe) and close, poll (some of them, with small batches), commit what they have
read, run one heartbeat each (their heartbeat threads are off, so the machine decides when heartbeats happen and
when they do not: sessions expire, members leave for not polling), the clock moves, one member freezes while
the others' heartbeats expel it, records are produced and partitions added. Every member commits what it has
read when its partitions are revoked, some also by auto-commit. All members share one assignor, drawn per
example.

Invariants after every step:

* G1: no partition is held by two consumers that are both members of the group, and no partition by two
  consumers holding the same generation (each consumer's adopted ``assignment`` and ``generation``);
* I7: committed offsets never go backwards and never exceed the log end;
* G2: a commit by a consumer the group has expelled fails with ``CommitFailedError`` and writes nothing; a
  commit that succeeds is by a member, for partitions no other member holds;
* polls return records only from the consumer's current assignment;
* once everyone heartbeats and polls until the group is quiet (a step of its own, and at the end), the
  assignment covers every partition exactly once and every member holds the group's generation.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import pylog
from pylog.errors import CommitFailedError, RebalanceInProgressError
from pylog.groups.member import GroupMember
from pylog.structs import TopicPartition

ASSIGNORS = ["range", "roundrobin", "sticky", "cooperative-sticky"]
SLOTS = 4
SESSION_MS = 10_000
MAX_POLL_MS = 30_000


class CommitOnRevoke(pylog.ConsumerRebalanceListener):
    """Commits what was read from partitions about to be revoked."""

    def __init__(self) -> None:
        self.consumer: Any = None

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.consumer.commit({tp: self.consumer.position(tp) for tp in revoked})

    def on_partitions_lost(self, lost: list[TopicPartition]) -> None:
        pass


class GroupMachine(RuleBasedStateMachine):
    slots = SLOTS
    partitions = 3
    max_partitions = 6

    def __init__(self) -> None:
        super().__init__()
        self._start_heartbeats = GroupMember._start_heartbeats
        GroupMember._start_heartbeats = lambda self: None  # type: ignore[method-assign]
        self.dir = tempfile.mkdtemp(prefix="pylog-group-machine-")
        self.clock = pylog.ManualClock()
        self.log = pylog.open(self.dir, clock=self.clock)
        self.log.create_topic("t", partitions=self.partitions)
        self.producer = self.log.producer()
        self.consumers: dict[int, Any] = {}
        self.committed: dict[TopicPartition, int] = {}
        self.strategy = "range"

    def teardown(self) -> None:
        try:
            if self.consumers:
                self.settle()
            for slot in list(self.consumers):
                self.consumers.pop(slot).close()
            self.producer.close()
            self.log.close()
        finally:
            GroupMember._start_heartbeats = self._start_heartbeats  # type: ignore[method-assign]
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers ---------------------------------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        if not self.consumers:
            return {"members": {}, "state": "Empty", "generation": 0}
        store = next(iter(self.consumers.values()))._group.store
        with store.lock():
            return store.read_state()  # type: ignore[no-any-return]

    def _live(self) -> dict[int, Any]:
        """Consumers that are members of the group now (not expelled, not left)."""
        members = self._state()["members"]
        return {s: c for s, c in self.consumers.items() if c._group.member_id in members}

    def _zombies(self) -> list[int]:
        """Consumers the group expelled that still hold partitions (they have not polled since)."""
        live = self._live()
        return sorted(s for s, c in self.consumers.items() if s not in live and c.assignment())

    def _partitions(self) -> set[TopicPartition]:
        return set(self.log.topic("t").partitions())

    def _quiet(self) -> bool:
        state = self._state()
        live = self._live()
        if state["state"] != "Stable" or len(live) != len(self.consumers):
            return False
        if any(c._group.generation != state["generation"] for c in live.values()):
            return False
        sets = [c.assignment() for c in live.values()]
        return sum(map(len, sets)) == len(self._partitions()) and set().union(*sets) == self._partitions()

    def _commit(self, slot: int) -> None:
        """Commit what ``slot`` has read of every partition it holds, and check who may."""
        consumer = self.consumers[slot]
        held = sorted(consumer.assignment())
        if not held:
            return
        offsets = {tp: consumer.position(tp) for tp in held}
        me = self._state()["members"].get(consumer._group.member_id)
        before = self.log.group_offsets("g") if "g" in self.log.list_groups() else {}
        try:
            consumer.commit(offsets)
        except CommitFailedError:
            assert self.log.group_offsets("g") == before, "a refused commit wrote offsets"
            assert me is None, "a member's commit of the partitions it holds was refused"
            return
        except RebalanceInProgressError:
            assert me is not None and me["generation"] < 0
            return
        assert me is not None, "G2: a consumer the group expelled committed"
        others = [c for s, c in self._live().items() if s != slot]
        for tp in held:
            assert all(tp not in c.assignment() for c in others), (
                f"committed {tp}, which another member holds"
            )

    # -- rules -----------------------------------------------------------------------------------------------

    @initialize(strategy=st.sampled_from(ASSIGNORS), records=st.integers(0, 30))
    def setup(self, strategy: str, records: int) -> None:
        self.strategy = strategy
        for i in range(records):
            self.producer.send("t", i, partition=i % self.partitions)
        self.producer.flush()

    @precondition(lambda self: len(self.consumers) < self.slots)
    @rule(slot=st.integers(0, SLOTS - 1), auto_commit=st.booleans())
    def join(self, slot: int, auto_commit: bool) -> None:
        if slot in self.consumers:
            return
        self._join(slot, auto_commit)

    def _join(self, slot: int, auto_commit: bool) -> None:
        listener = CommitOnRevoke()
        consumer = self.log.consumer(
            group_id="g",
            client_id=f"m{slot}",
            auto_offset_reset="earliest",
            partition_assignment_strategy=self.strategy,
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=1_000,
            max_poll_interval_ms=MAX_POLL_MS,
            enable_auto_commit=auto_commit,
            auto_commit_interval_ms=5_000,
        )
        listener.consumer = consumer
        consumer.subscribe(["t"], listener=listener)
        self.consumers[slot] = consumer

    @precondition(lambda self: bool(self.consumers))
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        slot = data.draw(st.sampled_from(sorted(self.consumers)))
        self.consumers.pop(slot).close()

    @precondition(lambda self: bool(self.consumers))
    @rule(data=st.data(), max_records=st.integers(1, 5))
    def poll(self, data: st.DataObject, max_records: int) -> None:
        slots = data.draw(
            st.lists(st.sampled_from(sorted(self.consumers)), min_size=1, max_size=SLOTS, unique=True)
        )
        for slot in slots:
            consumer = self.consumers[slot]
            got = consumer.poll(timeout_ms=0, max_records=max_records)
            assert set(got) <= consumer.assignment(), "a poll returned records of a partition not assigned"

    @precondition(lambda self: bool(self.consumers))
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        slot = data.draw(st.sampled_from(sorted(self.consumers)))
        self.consumers[slot]._group.heartbeat()

    @rule(ms=st.sampled_from([0, 500, 1_000, 4_000, 6_000, 11_000, 31_000]))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @precondition(lambda self: len(self.consumers) >= 2)
    @rule(data=st.data())
    def freeze_one(self, data: st.DataObject) -> None:
        """One member stops heartbeating past its session; the others' heartbeats expel it."""
        frozen = data.draw(st.sampled_from(sorted(self.consumers)))
        self.clock.advance(SESSION_MS + 1)
        for slot, consumer in self.consumers.items():
            if slot != frozen:
                consumer.poll(timeout_ms=0, max_records=1)  # they keep polling: no max_poll_interval exit
                consumer._group.heartbeat()

    @precondition(lambda self: bool(self.consumers))
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        self._commit(data.draw(st.sampled_from(sorted(self.consumers))))

    @precondition(lambda self: bool(self._zombies()))
    @rule(data=st.data())
    def zombie_commit(self, data: st.DataObject) -> None:
        """G2, directly: an expelled consumer that still holds partitions commits them."""
        self._commit(data.draw(st.sampled_from(self._zombies())))

    @precondition(lambda self: self.log.topic("t").num_partitions < self.max_partitions)
    @rule()
    def add_partition(self) -> None:
        self.log.create_partitions("t", self.log.topic("t").num_partitions + 1)

    @rule(n=st.integers(1, 10), partition=st.integers(0, 299))
    def produce(self, n: int, partition: int) -> None:
        partition %= self.log.topic("t").num_partitions
        for i in range(n):
            self.producer.send("t", i, partition=partition)
        self.producer.flush()

    @precondition(lambda self: bool(self.consumers))
    @rule()
    def settle(self) -> None:
        """Everyone heartbeats and polls until the group is quiet: then each partition has one owner."""
        for _ in range(40):
            if self._quiet():
                return
            for consumer in self.consumers.values():
                consumer._group.heartbeat()
                consumer.poll(timeout_ms=0, max_records=1)
        assert self._quiet(), f"the group did not settle: {self._state()}"

    # -- invariants ------------------------------------------------------------------------------------------

    @invariant()
    def g1_one_owner_per_partition(self) -> None:
        held: dict[TopicPartition, int] = {}
        for slot, consumer in self._live().items():
            for tp in consumer.assignment():
                assert tp not in held, f"G1: {tp} held by members m{held[tp]} and m{slot}"
                held[tp] = slot
        by_generation: dict[tuple[int, TopicPartition], int] = {}
        for slot, consumer in self.consumers.items():
            for tp in consumer.assignment():
                key = (consumer._group.generation, tp)
                assert key not in by_generation, f"G1: {tp} held twice in generation {key[0]}"
                by_generation[key] = slot

    @invariant()
    def i7_committed_offsets_move_forward_within_the_log(self) -> None:
        if "g" not in self.log.list_groups():
            return
        for tp, om in self.log.group_offsets("g").items():
            end = self.log.topic(tp.topic).partition(tp.partition).log_end_offset
            assert om.offset <= end, f"I7: {tp} committed {om.offset} past the log end {end}"
            assert om.offset >= self.committed.get(tp, 0), f"I7: {tp} went back from {self.committed[tp]}"
            self.committed[tp] = om.offset


GroupMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_group_machine = GroupMachine.TestCase


class HundredMembers(GroupMachine):
    """The same machine with up to 100 members on 120 partitions: members join and close by the dozen."""

    slots = 100
    partitions = 120
    max_partitions = 125

    @precondition(lambda self: len(self.consumers) < self.slots)
    @rule(n=st.integers(10, 100), auto_commit=st.booleans())
    def join_many(self, n: int, auto_commit: bool) -> None:
        free = [s for s in range(self.slots) if s not in self.consumers][:n]
        for slot in free:
            self._join(slot, auto_commit)

    @precondition(lambda self: len(self.consumers) > 10)
    @rule(data=st.data())
    def close_many(self, data: st.DataObject) -> None:
        slots = data.draw(
            st.lists(st.sampled_from(sorted(self.consumers)), min_size=1, max_size=10, unique=True)
        )
        for slot in slots:
            self.consumers.pop(slot).close()


HundredMembers.TestCase.settings = settings(
    max_examples=4,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_hundred_members = HundredMembers.TestCase
