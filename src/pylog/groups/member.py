"""A consumer's membership in its group: joining, heartbeats, rebalances, and committed offsets.

A :class:`GroupMember` belongs to one consumer (created for it when the consumer has a ``group_id``), and
shares with it one :class:`~pylog.subscription.Subscription`: the member reads the subscribed topics and the
rebalance listener from it, changes its assignment (:meth:`~pylog.subscription.Subscription.assign`) and
commits its positions (:meth:`~pylog.subscription.Subscription.consumed_positions`); it knows nothing else of
the consumer. Members in the same process and members in other processes that opened the same log
directory (or the same object-store URL with the same ``groups_dir``) are the same thing to the group: they meet in the group's files (:mod:`pylog.groups.store`) and
move the group forward with the functions of :mod:`pylog.groups.coordinator`.

Two threads touch a member:

* a **heartbeat thread** (a daemon shared by the process's members of the group: :mod:`pylog.groups.ticker`)
  wakes every 50 ms: it writes the member's heartbeat into its slot of the group's heartbeat table every
  ``heartbeat_interval_ms`` (shared memory: no lock, no state rewrite), looks at the state's published version
  (one memory read) and raises ``wants_poll`` when the user's thread has something to do, and leaves the group
  when the user has not polled for ``max_poll_interval_ms`` (like Kafka's client). At most every 200 ms across
  the whole group, one member also *scans*: it expels members whose session expired or whose process died,
  notices new partitions and topics, and completes a rebalance whose debounce delay or deadline passed. Only
  what it finds takes the group lock. It never calls user code.
* the **user's thread**, inside ``Consumer.poll()``, joins rebalances (in its slot: no lock), adopts new
  assignments and runs the :class:`~pylog.groups.listener.ConsumerRebalanceListener` callbacks, commits
  (auto-commit included), and delivers ``commit_async`` callbacks. The member whose join completes a
  rebalance runs the assignor, under the group lock. A settled member's ``poll()`` compares the published
  state version with the one it saw and returns.

Thread-safety: the public methods are meant for the consumer's (user's) thread; the heartbeat thread only
shares the store (which has its own locks), the member's slot (written under the table's lock) and the
flags. Crash contract: a member that dies holds nothing that survives it: its liveness lock is released by
the kernel, and the others' liveness scan expels it within about 200 ms; commits it acknowledged are durable
(:mod:`pylog.groups.store`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import socket
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pylog.consumer_config import GroupConfig
from pylog.errors import (
    CommitFailedError,
    ConfigError,
    InvalidOffsetError,
    LogClosedError,
    PylogError,
    RebalanceInProgressError,
    UnknownPartitionError,
    UnknownTopicError,
)
from pylog.future import Future
from pylog.groups import coordinator, ticker
from pylog.groups.assignors import Assignor
from pylog.groups.liveness import Slot, member_tag
from pylog.groups.store import GroupStore, groups_root, partitions_of, to_topic_partition
from pylog.structs import ConsumerGroupMetadata, MemberState, OffsetAndMetadata, TopicPartition
from pylog.subscription import Subscription

if TYPE_CHECKING:
    from pylog.directory import LogDirectory

__all__ = ["GroupMember", "topic_names"]

_SCAN_MS = 200  # how often (at most, group-wide) a member scans the group for dead members and new topics
_COUNTER = itertools.count(1)
_LAGGARDS: dict[str, list[str]] = {}  # group directory -> see coordinator.completable


def topic_names(log: LogDirectory) -> list[str]:
    """``log.topics()``, which also refreshes the Log's view of topics changed by other processes. Closing a
    topic that another process deleted can fail to flush its (removed) files: the topic is dropped all the
    same, so the second look succeeds."""
    try:
        return log.topics()
    except FileNotFoundError:
        return log.topics()


class GroupMember:
    """See the module docstring. ``config`` holds the checked settings (:class:`~pylog.consumer_config.GroupConfig`);
    ``group_initial_rebalance_delay_ms`` is also the debounce window: each join during a rebalance extends the
    wait for more members by this much, up to the rebalance deadline."""

    def __init__(
        self, log: LogDirectory, subscription: Subscription, group_id: str, config: GroupConfig
    ) -> None:
        self.config = config
        self.log = log
        self.clock = log.clock
        self.subscription = subscription
        self.store = GroupStore(groups_root(log), group_id)
        self.group_id = group_id
        self.member_id: str | None = None
        self.generation = -1
        self.assignment: set[TopicPartition] = set()
        #: Set when the user's thread has group work to do in its next poll.
        self.wants_poll = False
        self._subscribed = False
        self._lock_fd: int | None = None
        self._thread: threading.Thread | None = None  # the ticker's (pylog.groups.ticker)
        self._ticking = False
        self._retry_at_ms = 0.0
        self._error: BaseException | None = None
        self._last_poll_ms = self.clock.monotonic_ms()
        self._next_heartbeat_ms = 0.0
        self._next_autocommit_ms = self.clock.monotonic_ms() + config.auto_commit_interval_ms
        self._last_committed: dict[TopicPartition, int] = {}
        self._probes = 0  # liveness scans done (which member of each process to probe)
        self._seen_seq = -2  # the published state version (store.state_seq()) this member last acted on
        self._slot = -1
        self._joined = -1  # the rebalance this member joined last (also in its slot)
        # a member found not joined at the last look, shared by this process's members of the group
        self._laggards = _LAGGARDS.setdefault(self.store.directory, [])
        self._left_for_poll_interval = False
        self._async: (
            queue.Queue[tuple[dict[TopicPartition, OffsetAndMetadata], Any, Future] | None] | None
        ) = None
        self._async_thread: threading.Thread | None = None
        self._callbacks: deque[tuple[Callable[..., Any], dict[TopicPartition, OffsetAndMetadata], Any]] = (
            deque()
        )
        self._listener_errors: list[BaseException] = []
        self._closed = False

    @property
    def assignor(self) -> Assignor:
        return self.config.partition_assignment_strategy

    @property
    def _delay_ms(self) -> int:
        """``group_initial_rebalance_delay_ms``: how long a rebalance waits for more members to join."""
        return self.config.group_initial_rebalance_delay_ms

    # -- subscription -----------------------------------------------------------------------------------

    def subscribe(self) -> None:
        """Join the group with the subscription's topics or pattern (or tell it they changed). A refusal
        (another assignor in the group, an I/O error) leaves this member as it was, and raises."""
        self._check_open()
        self.subscription.check_listener()
        previous = self._subscribed
        self._subscribed = True
        self._last_poll_ms = self.clock.monotonic_ms()  # max_poll_interval_ms counts from here
        topics, pattern = self._wanted()
        try:
            with self.store.lock():
                state = self.store.read_state()
                me = state["members"].get(self.member_id) if self.member_id else None
                if me is None:
                    self._join(state)
                elif sorted(me["topics"]) != topics or me.get("pattern") != pattern:
                    me["topics"], me["pattern"] = topics, pattern
                    coordinator.start_rebalance(
                        state, self.clock.time_ms(), "subscription changed", self._delay_ms
                    )
                    self.store.write_state(state)
        except BaseException:
            self._subscribed = previous
            raise
        self.wants_poll = True
        self._start_heartbeats()

    def _wanted(self) -> tuple[list[str], str | None]:
        """The subscribed topic names (sorted) and pattern, as the group's state records them."""
        return sorted(self.subscription.topics), self.subscription.pattern_text

    def unsubscribe(self) -> None:
        if not self._subscribed:
            return
        try:
            self._give_up_assignment(commit=self.config.enable_auto_commit)
        finally:
            self._stop_heartbeats()
            self._leave("unsubscribed")
            self._subscribed = False
            self.subscription.unsubscribe()
        self._raise_listener_error()

    def _join(self, state: dict[str, Any]) -> None:
        """Enter the group (under the lock): a static member takes its old entry back, others start a rebalance
        and join it at once (a new member owns nothing, so it has nothing to report first)."""
        now = self.clock.time_ms()
        if self.store.kafka_clients():
            raise ConfigError(
                f"group {self.group_id!r} has Kafka clients as members (through pylog serve); a group's members "
                "are either pylog consumers or Kafka clients: use another group_id"
            )
        others = [m for mid, m in state["members"].items() if mid != self.member_id]
        if others and any(m["assignor"] != self.assignor.name for m in others):
            theirs = sorted({m["assignor"] for m in others})
            raise ConfigError(
                f"group {self.group_id!r} uses partition_assignment_strategy {theirs[0]!r}; "
                f"this consumer asks for {self.assignor.name!r} (every member must use the same)"
            )
        member_id = f"{self.config.client_id}-{next(_COUNTER)}-{uuid.uuid4().hex[:12]}"
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            if self.member_id is not None:
                self.store.remove_member_lock(self.member_id)
        self._lock_fd = self.store.hold_member_lock(member_id)
        topics, pattern = self._wanted()
        record: dict[str, Any] = {
            "slot": None,
            "instance_id": self.config.group_instance_id,
            "client_id": self.config.client_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "topics": topics,
            "pattern": pattern,
            "assignor": self.assignor.name,
            "session_timeout_ms": self.config.session_timeout_ms,
            "rebalance_timeout_ms": self.config.max_poll_interval_ms,
            "since_ms": now,
            "assignment": {},
            "generation": -1,
        }
        previous = (
            state["static"].get(self.config.group_instance_id) if self.config.group_instance_id else None
        )
        joined = -1
        if previous is not None and previous in state["members"]:
            # a static member back within its session: same assignment, no rebalance (KIP-345)
            old = state["members"].pop(previous)
            same = old["topics"] == record["topics"] and old.get("pattern") == record["pattern"]
            joined = self.store.joined(previous, old)
            record.update(assignment=old["assignment"], generation=old["generation"])
            state["members"][member_id] = record
            if state.get("leader") == previous:
                state["leader"] = member_id
            if not same:
                coordinator.start_rebalance(state, now, f"{member_id}: subscription changed", self._delay_ms)
        else:
            state["members"][member_id] = record
            coordinator.start_rebalance(state, now, f"{member_id} joined", self._delay_ms)
            joined = state["rebalance"]["id"] if state["rebalance"] is not None else -1
        if self.config.group_instance_id is not None:
            state["static"][self.config.group_instance_id] = member_id
        record["slot"] = self.store.free_slot(state)
        self.member_id = member_id
        self.generation = -1
        self._slot, self._joined = record["slot"], joined
        self._beat(now, check=False)
        # the last member the rebalance waited for may be this one (the first of a group always is)
        if coordinator.completable(state, now, self._joined_of, self._laggards):
            coordinator.maybe_complete(state, now, self._partitions(state), self._delay_ms, self._joined_of)
        self.store.write_state(state)

    def _leave(self, reason: str) -> None:
        if self.member_id is None:
            return
        with self.store.lock():
            state = self.store.read_state()
            if self.member_id in state["members"] and (
                self.config.group_instance_id is None or reason != "closed"
            ):
                coordinator.remove_member(
                    state,
                    self.member_id,
                    self.clock.time_ms(),
                    f"{self.member_id} {reason}",
                    self._delay_ms,
                )
                self.store.write_state(state)
        self._release_member_lock(remove=self.config.group_instance_id is None or reason != "closed")
        self.generation = -1
        self.member_id = None
        self._slot, self._joined = -1, -1

    def _release_member_lock(self, *, remove: bool) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None
            if remove and self.member_id is not None:
                self.store.remove_member_lock(self.member_id)

    # -- the heartbeat thread ---------------------------------------------------------------------------

    def _stop_heartbeats(self) -> None:
        ticker.unregister(self, self.store.directory)
        self._ticking = False

    def _start_heartbeats(self) -> None:
        thread = self._thread
        if self._ticking and thread is not None and thread.is_alive():
            return
        self._thread = ticker.register(self, self.store.directory, f"pylog-heartbeat-{self.group_id}")
        self._ticking = True

    def scan_due(self) -> bool:
        """Whether this process should scan the group now (at most every 200 ms for the whole group)."""
        return self.store.table.scan_due(_SCAN_MS)

    def background_tick(self, scan: bool) -> bool:
        """The heartbeat thread's step (:mod:`pylog.groups.ticker`); False once the log is closed. An error
        is reported to the user's thread at its next poll, and the next step waits a while."""
        now = self.clock.monotonic_ms()
        if now < self._retry_at_ms:
            return True
        try:
            self._tick(scan=scan)
        except LogClosedError:
            return False
        except Exception as exc:
            self._error = exc
            self.wants_poll = True
            self._retry_at_ms = now + min(self.config.heartbeat_interval_ms, 1000)
        return True

    def heartbeat(self) -> None:
        """One heartbeat (normally run by the heartbeat thread; callable directly, for tests with a
        ManualClock): refresh this member's heartbeat, expel dead members, notice topic changes, complete a
        rebalance that may complete."""
        self._tick(scan=True)

    def _tick(self, *, scan: bool) -> None:
        if self.member_id is None or self._closed:
            return
        mono = self.clock.monotonic_ms()
        if mono - self._last_poll_ms > self.config.max_poll_interval_ms:
            self._leave_for_poll_interval()
            return
        if mono >= self._next_heartbeat_ms:
            self._next_heartbeat_ms = mono + self.config.heartbeat_interval_ms
            self._beat(self.clock.time_ms())
        if scan:
            self._scan()
        self._notice(self.store.state_view())

    def _beat(self, now_ms: int, *, check: bool = True) -> None:
        """Write this member's slot: its heartbeat and the rebalance it joined last (no lock). Unless the
        caller knows better (``check=False``: joining, under the lock), only while the state still gives this
        member that slot: an expelled member's slot may belong to a newcomer already."""
        if self.member_id is None or self._slot < 0:
            return
        if check:
            me = self.store.state_view()["members"].get(self.member_id)
            if me is None or me.get("slot") != self._slot:
                return
        self.store.table.write(
            self._slot, Slot(member_tag(self.member_id), now_ms, self._joined, os.getpid())
        )

    def _leave_for_poll_interval(self) -> None:
        member_id = self.member_id
        with self.store.lock():
            state = self.store.read_state()
            if member_id is not None and member_id in state["members"]:
                coordinator.remove_member(
                    state,
                    member_id,
                    self.clock.time_ms(),
                    f"{member_id} left: no poll() within max_poll_interval_ms",
                    self._delay_ms,
                )
                self.store.write_state(state)
        self._left_for_poll_interval = True
        self.wants_poll = True

    def _notice(self, view: Mapping[str, Any]) -> None:
        """Raise ``wants_poll`` when the state asks something of this member (adopt, join, rejoin)."""
        me = view["members"].get(self.member_id)
        if (
            me is None
            or me["generation"] != self.generation
            or (view["state"] == "PreparingRebalance" and self._joined != view["rebalance"]["id"])
        ):
            self.wants_poll = True

    def _scan(self) -> None:
        """Expel members whose session expired or whose process died, start a rebalance when the topics'
        partitions changed, complete a rebalance that may complete. Looks without the lock; takes it only
        for what it found."""
        view = self.store.state_view()
        now = self.clock.time_ms()
        store = self.store
        suspects = self._suspects(view, now)
        partitions = self._partitions(view) if view["members"] else {}
        moved = view["state"] == "Stable" and partitions != view["topics"]
        if not (suspects or moved or coordinator.completable(view, now, self._joined_of, self._laggards)):
            return
        with store.lock():
            state = store.read_state()
            gone = coordinator.expire_members(
                state,
                now,
                store.member_is_dead,
                store.last_heartbeat,
                self.member_id,
                self._delay_ms,
                suspects,
            )
            changed = bool(gone)
            if state["state"] == "Stable" and state["members"] and self._partitions(state) != state["topics"]:
                coordinator.start_rebalance(state, now, "topic metadata changed", self._delay_ms)
                changed = True
            partitions = self._partitions(state)
            changed = (
                coordinator.maybe_complete(state, now, partitions, self._delay_ms, self._joined_of) or changed
            )
            if changed:
                store.write_state(state)
        for member_id in gone:
            store.remove_member_lock(member_id)

    def _suspects(self, view: Mapping[str, Any], now: int) -> list[str]:
        """Members that look expired (by their slot's heartbeat: no system call) or dead. Liveness locks are
        probed one member per process and scan (in turn), and every member of a process only once one of its
        locks is free: each probe is three system calls, and each system call gives the GIL away to the
        threads doing the user's work, which a scan must not wait for a hundred times."""
        store = self.store
        out: list[str] = []
        by_pid: dict[object, list[str]] = {}
        for mid, m in view["members"].items():
            if mid == self.member_id:
                continue
            if coordinator.expired(mid, m, now, _not_dead, store.last_heartbeat) is not None:
                out.append(mid)
            elif m.get("instance_id") is None:
                by_pid.setdefault((m.get("host"), m.get("pid")), []).append(mid)
        self._probes += 1
        for mids in by_pid.values():
            if store.member_is_dead(mids[self._probes % len(mids)]):
                out.extend(mid for mid in mids if store.member_is_dead(mid))
        return out

    def _joined_of(self, member_id: str, member: Mapping[str, Any]) -> int:
        """The rebalance a member joined last: this member's own from memory, the others' from their slots."""
        return self._joined if member_id == self.member_id else self.store.joined(member_id, member)

    def _partitions(self, state: Mapping[str, Any]) -> dict[str, int]:
        names = topic_names(self.log)
        wanted = coordinator.wanted_topics(state, names)
        out = {}
        for name in sorted(wanted):
            with contextlib.suppress(UnknownTopicError):
                out[name] = self.log.topic(name).num_partitions
        return out

    # -- the user's thread ------------------------------------------------------------------------------

    def poll(self) -> None:
        """Called by ``Consumer.poll()`` on every turn: group work, auto-commit, async commit callbacks. A
        settled member compares the published state version with the one it saw, and has nothing to do."""
        self._last_poll_ms = now = self.clock.monotonic_ms()
        if self._callbacks:
            self._deliver_callbacks()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        thread = self._thread
        if self._subscribed and (thread is None or not thread.is_alive()):
            # heartbeats stopped (after fork, or an error): check the group and restart them
            self.wants_poll = True
        if self.wants_poll or (self._subscribed and self.store.state_seq() != self._seen_seq):
            try:
                self._sync()
            finally:
                self._raise_listener_error()
        if self.config.enable_auto_commit and now >= self._next_autocommit_ms:
            self._next_autocommit_ms = now + self.config.auto_commit_interval_ms
            self._auto_commit()

    def _sync(self) -> None:
        self.wants_poll = False
        if not self._subscribed:
            return
        for _ in range(8):
            seq = self.store.state_seq()
            state = self.store.state_view()
            me = state["members"].get(self.member_id) if self.member_id else None
            if me is None:
                lost, self.assignment = self.assignment, set()
                self.subscription.revoke_all()
                if lost:
                    self._call("on_partitions_lost", lost)
                if self._left_for_poll_interval:
                    self._left_for_poll_interval = False
                with self.store.lock():
                    self._join(self.store.read_state())
                continue
            if me["generation"] > self.generation:
                self._adopt(me, state)
                continue
            rebalance = state["rebalance"]
            if state["state"] == "PreparingRebalance" and self._joined != rebalance["id"]:
                if state_protocol(state, self.assignor) == "eager" and self.assignment:
                    self._revoke_all(commit=self.config.enable_auto_commit)
                self._join_rebalance(rebalance["id"])
                continue
            if state["state"] == "PreparingRebalance" and self._try_complete(state):
                continue
            self._seen_seq = seq
            break
        else:
            self.wants_poll = True  # still moving: look again at the next poll
        self._start_heartbeats()

    def _join_rebalance(self, rebalance_id: int) -> None:
        """Join the rebalance: record it in this member's slot (no lock). What it owns is the assignment it
        adopted, which the state holds. If this was the last join the group waited for, complete it now."""
        self._joined = rebalance_id
        self._beat(self.clock.time_ms())
        self._try_complete(self.store.state_view())

    def _try_complete(self, view: Mapping[str, Any]) -> bool:
        """Complete the rebalance under way if it may complete now; True if this member did."""
        now = self.clock.time_ms()
        if not coordinator.completable(view, now, self._joined_of, self._laggards):
            return False
        with self.store.lock():
            state = self.store.read_state()
            done = coordinator.maybe_complete(
                state, now, self._partitions(state), self._delay_ms, self._joined_of
            )
            if done:
                self.store.write_state(state)
        return done

    def _adopt(self, me: Mapping[str, Any], state: Mapping[str, Any]) -> None:
        new = partitions_of(me["assignment"])
        old = self.assignment
        revoked, added = old - new, new - old
        cooperative = state_protocol(state, self.assignor) == "cooperative"
        if revoked:
            if self.config.enable_auto_commit:
                self._commit_quietly(
                    {tp: p for tp, p in self.subscription.consumed_positions().items() if tp in revoked}
                )
            self._call("on_partitions_revoked", revoked)
        self.assignment = new
        self.generation = me["generation"]
        self.subscription.assign(new)
        self._call("on_partitions_assigned", added if cooperative else new)
        if cooperative and revoked:
            # KIP-429: partitions given up in this round go to their new owners in a follow-up rebalance (one
            # under way already serves: this member joins it after this, owning only what it kept)
            if self.store.state_view()["state"] == "PreparingRebalance":
                return
            with self.store.lock():
                state = self.store.read_state()
                if self.member_id in state["members"] and state["state"] != "PreparingRebalance":
                    coordinator.start_rebalance(
                        state, self.clock.time_ms(), f"{self.member_id} revoked partitions", 0
                    )
                    self.store.write_state(state)

    def _revoke_all(self, *, commit: bool) -> None:
        """Eager protocol, before joining a rebalance: commit and revoke everything. The listener runs while
        the partitions are still assigned (it may call ``position()`` and commit them); they are taken away
        even if it raises."""
        if not self.assignment:
            return
        if commit:
            self._commit_quietly(self.subscription.consumed_positions())
        self._call("on_partitions_revoked", self.assignment)
        self.assignment = set()
        self.subscription.revoke_all()

    def _give_up_assignment(self, *, commit: bool) -> None:
        """On ``close()`` or ``unsubscribe()``: revoke the partitions (committing them first) while still a
        member; if the group already expelled this member they are lost instead, and nothing is committed."""
        if not self.assignment:
            return
        member = self.member_id is not None and self.member_id in self.store.state_view()["members"]
        if member:
            if commit:
                self._commit_quietly(self.subscription.consumed_positions())
            self._call("on_partitions_revoked", self.assignment)
        else:
            self._call("on_partitions_lost", self.assignment)
        self.assignment = set()

    def _call(self, name: str, partitions: Iterable[TopicPartition]) -> None:
        """Run a listener callback. An exception from it does not stop the protocol step under way (the
        assignment still changes, a follow-up rebalance is still requested); the first one is raised to the
        caller of ``poll()``, ``unsubscribe()`` or ``close()`` once the step is complete."""
        try:
            self.subscription.call_listener(name, partitions)
        except Exception as exc:
            self._listener_errors.append(exc)

    def _raise_listener_error(self) -> None:
        if self._listener_errors:
            first = self._listener_errors[0]
            self._listener_errors.clear()
            raise first

    # -- commits ----------------------------------------------------------------------------------------

    def _auto_commit(self) -> None:
        if self._subscribed and self.member_id is None:
            return
        positions = {
            tp: p
            for tp, p in self.subscription.consumed_positions().items()
            if self._last_committed.get(tp) != p
        }
        if positions:
            self._commit_quietly(positions)

    def _commit_quietly(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit what can be committed (auto-commit, revocation, close): partitions of deleted topics are
        left out, and a refusal (fenced, rebalancing, a topic deleted or re-created meanwhile) is not an
        error here: the records are delivered again, nothing is lost."""
        alive = self._committable(offsets)
        with contextlib.suppress(
            CommitFailedError,
            RebalanceInProgressError,
            UnknownTopicError,
            UnknownPartitionError,
            InvalidOffsetError,
        ):
            self.commit(alive)

    def _committable(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """``offsets`` without the partitions that no longer exist (their topic was deleted, or created again
        with fewer partitions or a shorter log)."""
        names = set(topic_names(self.log))
        out = {}
        for tp, offset in offsets.items():
            if tp.topic not in names:
                continue
            try:
                end = self.log.topic(tp.topic).partition(tp.partition).log_end_offset
            except (UnknownTopicError, UnknownPartitionError):
                continue
            if offset <= end:
                out[tp] = offset
        return out

    def check_topics(self) -> None:
        """Called from the user's thread when a subscribed topic or partition vanished under a fetch: start the
        rebalance that takes it out of the assignment now, instead of at the next heartbeat."""
        if self.member_id is None or self._closed:
            return
        view = self.store.state_view()
        if view["state"] != "Stable" or self._partitions(view) == view["topics"]:
            self.wants_poll = True
            return
        with self.store.lock():
            state = self.store.read_state()
            if state["state"] == "Stable" and self._partitions(state) != state["topics"]:
                reason = f"{self.member_id}: topic metadata changed"
                coordinator.start_rebalance(state, self.clock.time_ms(), reason, self._delay_ms)
                self.store.write_state(state)
        self.wants_poll = True

    def _normalize(self, offsets: Mapping[Any, Any] | None) -> dict[TopicPartition, OffsetAndMetadata]:
        if offsets is None:  # the positions of the assigned partitions that still exist
            return {
                tp: OffsetAndMetadata(p)
                for tp, p in self._committable(self.subscription.consumed_positions()).items()
            }
        if not isinstance(offsets, Mapping):
            raise InvalidOffsetError(f"offsets must be a dict of TopicPartition -> offset, got {offsets!r}")
        out = {}
        for key, value in offsets.items():
            tp = to_topic_partition(key)
            if isinstance(value, OffsetAndMetadata):
                offset, metadata = value.offset, value.metadata
            else:
                offset, metadata = value, ""
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise InvalidOffsetError(f"offset for {tp} must be an int >= 0, got {offset!r}")
            if not isinstance(metadata, str):
                raise InvalidOffsetError(f"metadata for {tp} must be a str, got {metadata!r}")
            end = self.log.topic(tp.topic).partition(tp.partition).log_end_offset
            if offset > end:
                raise InvalidOffsetError(f"cannot commit offset {offset} for {tp}: the log ends at {end}")
            out[tp] = OffsetAndMetadata(offset, metadata)
        return out

    def commit(self, offsets: Mapping[Any, Any] | None = None) -> None:
        """Durably commit ``offsets`` (default: the position of every assigned partition); returns after the
        fsync. A member fenced by a newer generation gets :class:`CommitFailedError`."""
        self._check_open()
        normalized = self._normalize(offsets)
        if not normalized:
            return
        with self.store.lock(shared=True):  # no fencing (a state change) until the record is written
            state = self.store.state_view()
            if self._subscribed:
                me = state["members"].get(self.member_id) if self.member_id else None
                if me is None:
                    raise CommitFailedError(
                        f"commit failed: this consumer is no longer a member of group {self.group_id!r} "
                        "(its session expired, or it did not poll() within max_poll_interval_ms, and its "
                        "partitions were given to other members). Call poll() to rejoin; records processed "
                        "since the last commit may be delivered again."
                    )
                if me["generation"] < 0:
                    raise RebalanceInProgressError(
                        f"group {self.group_id!r} is rebalancing and this member has no assignment yet; "
                        "call poll() to complete the rebalance, then commit again"
                    )
                allowed = partitions_of(me["assignment"]) | self.assignment
                foreign = sorted(tp for tp in normalized if tp not in allowed)
                if foreign:
                    raise CommitFailedError(
                        f"commit failed: {', '.join(f'{tp.topic}-{tp.partition}' for tp in foreign)} not "
                        f"assigned to this member in generation {state['generation']} of group "
                        f"{self.group_id!r}; call poll() to get the current assignment"
                    )
            elif state["members"]:
                raise CommitFailedError(
                    f"group {self.group_id!r} has active members; a consumer using assign() may only "
                    "commit to a group that has none"
                )
            entries = [
                (tp.topic, tp.partition, om.offset, om.metadata) for tp, om in sorted(normalized.items())
            ]
            pending = self.store.write_offsets(
                entries,
                generation=state["generation"],
                member_id=self.member_id or "",
                now_ms=self.clock.time_ms(),
            )
        pending.sync()  # acknowledged after the fsync, which runs outside the group's locks
        for tp, om in normalized.items():
            self._last_committed[tp] = om.offset

    def commit_async(self, offsets: Mapping[Any, Any] | None = None, callback: Any = None) -> Future:
        """Commit in the background, as kafka-python does: returns a :class:`~pylog.future.Future` resolved
        (None, or the commit's error) by the committing thread once the commit is durable or refused;
        ``callback(offsets, exception_or_None)`` runs on the user's thread in a later ``poll()``, ``commit()``
        or ``close()``. Offsets the commit refuses (not a valid offset, past the log end) fail the future and
        reach the callback: they are not raised here."""
        self._check_open()
        if callback is not None and not callable(callback):
            raise ConfigError("callback must be callable")
        future = Future()
        try:
            normalized = self._normalize(offsets)
        except PylogError as exc:
            self._completed(callback, offsets, exc)
            return future.failure(exc)
        if self._async is None:
            self._async = queue.Queue()
            self._async_thread = threading.Thread(
                target=self._async_loop, name=f"pylog-commit-{self.group_id}", daemon=True
            )
            self._async_thread.start()
        self._async.put((normalized, callback, future))
        return future

    def _async_loop(self) -> None:
        assert self._async is not None
        while True:
            item = self._async.get()
            if item is None:
                return
            offsets, callback, future = item
            result: Exception | None = None
            try:
                self.commit(offsets)
            except Exception as exc:
                result = exc
            self._completed(callback, offsets, result)
            if result is None:
                future.success(None)
            else:
                future.failure(result)

    def _completed(self, callback: Any, offsets: Any, result: Exception | None) -> None:
        """Queue ``callback(offsets, result)`` of a finished async commit for the user's next poll."""
        if callback is not None:
            self._callbacks.append((callback, offsets, result))
        self.wants_poll = True

    def _deliver_callbacks(self) -> None:
        while self._callbacks:
            callback, offsets, result = self._callbacks.popleft()
            callback(offsets, result)

    def group_metadata(self) -> ConsumerGroupMetadata:
        """This member's place in the group now: kafka-python's ``ConsumerGroupMetadata`` (``state``: not
        joined, rebalancing, or stable with the group's current assignment)."""
        instance = self.config.group_instance_id
        if not self._subscribed or self.member_id is None:
            return ConsumerGroupMetadata(self.group_id, -1, "", instance, MemberState.UNJOINED)
        view = self.store.state_view()
        me = view["members"].get(self.member_id)
        if me is None:  # expelled: the next poll joins again
            return ConsumerGroupMetadata(self.group_id, -1, "", instance, MemberState.UNJOINED)
        stable = view["state"] == "Stable" and self.generation >= 0 and me["generation"] == self.generation
        state = MemberState.STABLE if stable else MemberState.REBALANCING
        return ConsumerGroupMetadata(self.group_id, self.generation, self.member_id, instance, state)

    def committed(self, tp: TopicPartition) -> int | None:
        found = self.store.offsets().get(tp)
        return None if found is None else found.offset

    def committed_metadata(self, tp: TopicPartition) -> OffsetAndMetadata | None:
        return self.store.offsets().get(tp)

    def committed_position(self, tp: TopicPartition) -> int | None:
        return self.committed(tp)

    # -- lifecycle --------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError("the consumer is closed")

    def close(self, autocommit: bool = True) -> None:
        if self._closed:
            return
        self._stop_heartbeats()
        try:
            if self._async is not None:
                self._async.put(None)
                if self._async_thread is not None:
                    self._async_thread.join()
                self._deliver_callbacks()
            if self._subscribed and self.member_id is not None:
                try:
                    self._give_up_assignment(commit=autocommit and self.config.enable_auto_commit)
                finally:
                    self._leave("closed")
        except PylogError:
            self._release_member_lock(remove=self.config.group_instance_id is None)
            raise
        finally:
            self._closed = True
            self.store.close()
        self._raise_listener_error()


def _not_dead(member_id: str) -> bool:
    """An ``is_dead`` that says no: the session check alone (liveness locks are probed apart)."""
    return False


def state_protocol(state: Mapping[str, Any], assignor: Assignor) -> str:
    protocol = state.get("protocol")
    return protocol if isinstance(protocol, str) else assignor.protocol
