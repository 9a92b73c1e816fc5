"""Kafka's classic consumer group protocol, for Kafka clients: FindCoordinator, JoinGroup, SyncGroup,
Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch; and the group admin APIs DeleteGroups and OffsetDelete.

The broker is every group's coordinator. Membership lives in the broker's memory, as in Kafka (a broker
restart makes members rejoin); committed offsets are pylog's: they are written to the group's
``offsets.log`` (:class:`pylog.groups.store.GroupStore`, fsynced before the answer), so ``pylog groups
describe``, ``log.group_offsets()``, lag and ``pylog groups reset-offsets`` see them, and they survive a
restart of the broker.

The protocol, as Kafka's ``GroupCoordinator`` runs it (simplified to one node):

- JoinGroup adds the member (a new member id when it has none) and starts a rebalance (PreparingRebalance).
  The rebalance completes when every known member has sent its JoinGroup, or when the longest rebalance
  timeout has passed (members that did not rejoin are removed): the generation is incremented, a protocol
  every member supports is chosen (the leader's first such), and every JoinGroup is answered; the leader's
  answer carries every member's metadata (CompletingRebalance).
- SyncGroup of the leader stores the assignments it computed (client-side assignors, cooperative-sticky
  included) and answers every member's SyncGroup with its own (Stable).
- Heartbeat answers REBALANCE_IN_PROGRESS during a rebalance (the member rejoins), ILLEGAL_GENERATION or
  UNKNOWN_MEMBER_ID to a fenced member. A member whose last heartbeat is older than its session timeout is
  removed, which starts a rebalance. A session counts only the time the broker was able to hear the member:
  a member waiting in JoinGroup or SyncGroup cannot expire, and its session restarts when it is answered (a
  rebalance may wait for a slow member up to the rebalance timeout, longer than a session); an OffsetCommit
  counts as a heartbeat (as in Kafka), and the member cannot expire while one is being stored (its next
  heartbeat waits behind it on the connection); a stretch in which the broker's event loop did not run (a
  long synchronous step, the process descheduled on a loaded machine) is added to every session, since the
  heartbeats sent meanwhile wait unread in the sockets.
- OffsetCommit checks the member and generation (a commit with generation -1 and no member id is a
  "simple" commit of a consumer that uses ``assign()``); a partition that does not exist is answered
  UNKNOWN_TOPIC_OR_PARTITION and its offset is not stored. OffsetFetch reads the committed offsets.

DeleteGroups deletes a group with no member (neither Kafka clients nor live pylog consumers: NON_EMPTY_GROUP)
and its committed offsets, the files ``pylog groups delete`` removes (GROUP_ID_NOT_FOUND for a group that
does not exist). OffsetDelete removes committed offsets of some partitions of a group, but not of a topic a
member of the group subscribes to (GROUP_SUBSCRIBED_TO_TOPIC for those partitions: the member would read it
from its reset position), as Kafka does.

Static membership (KIP-345, ``group.instance.id``): a static member that comes back (a restarted process)
while the group is stable, within its session timeout, takes its earlier entry and assignment under a new
member id, without a rebalance (its older incarnation is fenced: UNKNOWN_MEMBER_ID). A static member does
not send LeaveGroup when it closes; its session timeout removes it. A returning leader, or a member whose
protocols changed, rejoins with a rebalance.

Mixed groups: a group's members are either pylog consumers or Kafka clients, never both (two coordinators
would each hand out every partition, and records would be read twice). A Kafka client joining a group with
live pylog consumers is refused with INCONSISTENT_GROUP_PROTOCOL, and the broker logs why, naming the group;
while a group has Kafka members the broker holds the group's ``kafka.lock`` (taken under the group's lock,
after checking that no pylog consumer is a member), and a pylog consumer joining it is refused with
:class:`~pylog.errors.ConfigError` naming the group (:meth:`pylog.groups.store.GroupStore.kafka_clients`).

Thread-safety: the groups' state is used by the event loop alone; committed offsets are read and written in
the context's thread pool.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import struct
import uuid
from dataclasses import dataclass, field
from typing import Any

from pylog.broker.context import NODE_ID, Context
from pylog.broker.protocol import ErrorCode, Request
from pylog.errors import ConfigError, GroupNotEmptyError, PylogError, UnknownGroupError
from pylog.groups.store import GroupStore, group_ids, groups_root, validate_group_id

__all__ = ["Coordinator"]

_log = logging.getLogger("pylog.broker")
_CHECK_S = 0.5  # how often session timeouts are checked


@dataclass(eq=False)
class Member:
    member_id: str
    client_id: str
    host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    instance_id: str | None = None
    assignment: bytes = b""
    last_seen: float = 0.0
    join: asyncio.Future[dict[str, Any]] | None = None
    sync: asyncio.Future[dict[str, Any]] | None = None
    busy: int = 0  # requests of the member being handled (an OffsetCommit being stored): it is alive


@dataclass(eq=False)
class Group:
    group_id: str
    state: str = "Empty"  # Empty, PreparingRebalance, CompletingRebalance, Stable
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    deadline: asyncio.TimerHandle | None = None


class Coordinator:
    """The groups of one broker (created in the event loop)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.groups: dict[str, Group] = {}
        self._ids = itertools.count(1)
        self._expiry: asyncio.Task[None] | None = None
        # group id -> descriptor holding the group's kafka.lock while Kafka clients are its members
        self._claims: dict[str, int] = {}
        self._deleting: set[str] = set()  # groups being deleted: a JoinGroup waits for the deletion
        self._claiming: dict[str, asyncio.Future[ErrorCode]] = {}  # group id -> its claim being taken

    def _group(self, group_id: str) -> Group:
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        if self._expiry is None:
            self._expiry = asyncio.get_running_loop().create_task(self._expire_loop())
        return group

    def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        for fd in self._claims.values():
            os.close(fd)
        self._claims.clear()

    def _release(self, group: Group) -> None:
        """The group has no Kafka member left: pylog consumers may join it again."""
        fd = self._claims.pop(group.group_id, None)
        if fd is not None:
            os.close(fd)

    # -- FindCoordinator ----------------------------------------------------------------------------------

    async def find_coordinator(self, ctx: Context, request: Request) -> dict[str, Any]:
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "error_message": None,
            "node_id": NODE_ID,
            "host": ctx.options.host,
            "port": ctx.options.port,
        }

    # -- JoinGroup ---------------------------------------------------------------------------------------

    async def join_group(self, ctx: Context, request: Request) -> dict[str, Any]:
        body = request.body
        group_id = str(body.group_id)
        try:
            validate_group_id(group_id)
        except ConfigError:
            return _join_error(ErrorCode.invalid_group_id)
        session_ms = _ms(body.session_timeout)
        if not 1000 <= session_ms <= 30 * 60_000:
            return _join_error(ErrorCode.invalid_session_timeout)
        if group_id in self._deleting:  # the client retries (a retriable error, as for a group unloading)
            return _join_error(ErrorCode.coordinator_load_in_progress)
        if group_id not in self._claims:
            # joins of the group that arrive together share one claim: a second claim would find the first's
            # kafka.lock held and take it for another broker's
            claiming = self._claiming.get(group_id)
            if claiming is None:
                claiming = self._claiming[group_id] = asyncio.ensure_future(self._take_claim(ctx, group_id))
                claiming.add_done_callback(lambda _: self._claiming.pop(group_id, None))
            code = await asyncio.shield(claiming)
            if code != ErrorCode.none:
                return _join_error(code)
        group = self._group(group_id)
        if group.protocol_type is not None and group.members and body.protocol_type != group.protocol_type:
            return _join_error(ErrorCode.inconsistent_group_protocol)
        protocols = [(str(p.name), bytes(p.metadata)) for p in body.protocols]
        member_id = str(body.member_id)
        instance_id = getattr(body, "group_instance_id", None)
        if instance_id is not None and not member_id and instance_id in group.static:
            back = self._static_rejoin(group, instance_id, request, protocols, session_ms)
            if back is not None:
                return back
        if member_id and member_id not in group.members:
            if not group.members:
                self._release(group)  # claimed for this join, which failed: no Kafka member
            return _join_error(ErrorCode.unknown_member_id, member_id)
        if not member_id:
            member_id = f"{request.client_id or 'client'}-{uuid.uuid4()}"
        if instance_id is not None:
            old = group.static.get(instance_id)
            if old is not None and old != member_id and old in group.members:
                self._drop(group, old)  # its earlier incarnation, fenced
            group.static[instance_id] = member_id
        loop = asyncio.get_running_loop()
        member = group.members.get(member_id)
        if member is None:
            member = group.members[member_id] = Member(
                member_id,
                request.client_id or "",
                "/127.0.0.1",
                session_ms,
                _ms(getattr(body, "rebalance_timeout", body.session_timeout)),
                str(body.protocol_type),
                protocols,
                instance_id,
            )
        else:
            member.protocols = protocols
            member.session_timeout_ms = session_ms
        member.last_seen = loop.time()
        if member.join is not None and not member.join.done():
            member.join.cancel()
        member.join = joined = loop.create_future()
        group.protocol_type = member.protocol_type
        self._prepare_rebalance(group)
        self._maybe_complete_join(group)
        try:
            answer: dict[str, Any] = await joined
            return answer
        except asyncio.CancelledError:
            return _join_error(ErrorCode.rebalance_in_progress, member_id)

    async def _take_claim(self, ctx: Context, group_id: str) -> ErrorCode:
        """Claim the group for Kafka members (see :func:`_claim`): NONE, or INCONSISTENT_GROUP_PROTOCOL while
        it has live pylog consumers."""
        if group_id in self._claims:
            return ErrorCode.none
        fd, embedded = await ctx.run(_claim, ctx, group_id)
        if fd is None:
            _log.warning(
                "refusing a Kafka client in consumer group %r: it has %d live pylog consumer(s) (%s); a "
                "group's members are either pylog consumers or Kafka clients",
                group_id,
                len(embedded),
                ", ".join(embedded[:3]),
            )
            return ErrorCode.inconsistent_group_protocol
        self._claims[group_id] = fd
        return ErrorCode.none

    def _static_rejoin(
        self,
        group: Group,
        instance_id: str,
        request: Request,
        protocols: list[tuple[str, bytes]],
        session_ms: int,
    ) -> dict[str, Any] | None:
        """A static member back (KIP-345): in a stable group, with the same protocols, it takes its earlier
        entry (its assignment and generation) under a new member id, the old id is fenced, and nothing is
        rebalanced; the member then reads its assignment with SyncGroup. None: join as usual."""
        old_id = group.static[instance_id]
        old = group.members.get(old_id)
        if old is None or group.state != "Stable" or old.protocols != protocols or old_id == group.leader:
            return None
        new_id = f"{request.client_id or 'client'}-{uuid.uuid4()}"
        del group.members[old_id]
        for fut in (old.join, old.sync):
            if fut is not None and not fut.done():
                fut.cancel()
        old.member_id = new_id
        old.session_timeout_ms = session_ms
        old.last_seen = asyncio.get_running_loop().time()
        old.join = old.sync = None
        group.members[new_id] = old
        group.static[instance_id] = new_id
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "generation_id": group.generation,
            "protocol_type": group.protocol_type,
            "protocol_name": group.protocol,
            "leader": group.leader,
            "member_id": new_id,
            "members": [],
        }

    def _drop(self, group: Group, member_id: str) -> None:
        """Remove a member without starting a rebalance (a static member's fenced incarnation)."""
        member = group.members.pop(member_id)
        for fut in (member.join, member.sync):
            if fut is not None and not fut.done():
                fut.cancel()

    def _prepare_rebalance(self, group: Group) -> None:
        if group.state == "PreparingRebalance":
            return
        now = asyncio.get_running_loop().time()
        for m in group.members.values():  # a member waiting in SyncGroup rejoins
            if m.sync is not None and not m.sync.done():
                m.last_seen = now
                m.sync.set_result(_sync_answer(ErrorCode.rebalance_in_progress))
        group.state = "PreparingRebalance"
        timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0) / 1000
        loop = asyncio.get_running_loop()
        if group.deadline is not None:
            group.deadline.cancel()
        group.deadline = loop.call_later(max(timeout, 0.001), self._complete_join, group, True)

    def _maybe_complete_join(self, group: Group) -> None:
        if group.state == "PreparingRebalance" and all(
            m.join is not None and not m.join.done() for m in group.members.values()
        ):
            self._complete_join(group, False)

    def _complete_join(self, group: Group, timed_out: bool) -> None:
        if group.state != "PreparingRebalance":
            return
        if group.deadline is not None:
            group.deadline.cancel()
            group.deadline = None
        for member_id, m in list(group.members.items()):
            if m.join is None or m.join.done():  # did not rejoin in time
                del group.members[member_id]
        if not group.members:
            group.state, group.leader, group.protocol = "Empty", None, None
            group.generation += 1
            self._release(group)
            return
        group.generation += 1
        group.protocol = _choose_protocol(group)
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.state = "CompletingRebalance"
        everyone = [
            {
                "member_id": m.member_id,
                "group_instance_id": m.instance_id,
                "metadata": dict(m.protocols)[group.protocol],
            }
            for m in group.members.values()
        ]
        now = asyncio.get_running_loop().time()
        for m in group.members.values():
            assert m.join is not None
            m.last_seen = now  # it could not heartbeat while its JoinGroup waited (Kafka restarts it too)
            m.join.set_result(
                {
                    "throttle_time": 0,
                    "error_code": ErrorCode.none,
                    "generation_id": group.generation,
                    "protocol_type": group.protocol_type,
                    "protocol_name": group.protocol,
                    "leader": group.leader,
                    "member_id": m.member_id,
                    "members": everyone if m.member_id == group.leader else [],
                }
            )
            m.join = None

    # -- SyncGroup ---------------------------------------------------------------------------------------

    async def sync_group(self, ctx: Context, request: Request) -> dict[str, Any]:
        body = request.body
        group = self.groups.get(str(body.group_id))
        member = None if group is None else group.members.get(str(body.member_id))
        if group is None or member is None:
            return _sync_answer(ErrorCode.unknown_member_id)
        if int(body.generation_id) != group.generation:
            return _sync_answer(ErrorCode.illegal_generation)
        if group.state == "PreparingRebalance":
            return _sync_answer(ErrorCode.rebalance_in_progress)
        member.last_seen = asyncio.get_running_loop().time()
        if group.state == "Stable":
            return _sync_answer(ErrorCode.none, member.assignment, group)
        if member.member_id == group.leader:
            given = {str(a.member_id): bytes(a.assignment) for a in body.assignments}
            for m in group.members.values():
                m.assignment = given.get(m.member_id, b"")
            group.state = "Stable"
            now = asyncio.get_running_loop().time()
            for m in group.members.values():
                if m.sync is not None and not m.sync.done():
                    m.last_seen = now  # it could not heartbeat while its SyncGroup waited
                    m.sync.set_result(_sync_answer(ErrorCode.none, m.assignment, group))
                m.sync = None
            return _sync_answer(ErrorCode.none, member.assignment, group)
        member.sync = synced = asyncio.get_running_loop().create_future()
        try:
            synced_answer: dict[str, Any] = await synced
            return synced_answer
        except asyncio.CancelledError:  # the member left, or the broker is stopping
            return _sync_answer(ErrorCode.rebalance_in_progress)

    # -- Heartbeat, LeaveGroup ---------------------------------------------------------------------------

    async def heartbeat(self, ctx: Context, request: Request) -> dict[str, Any]:
        body = request.body
        group = self.groups.get(str(body.group_id))
        member = None if group is None else group.members.get(str(body.member_id))
        if group is None or member is None:
            code = ErrorCode.unknown_member_id
        elif int(body.generation_id) != group.generation:
            code = ErrorCode.illegal_generation
        elif group.state == "PreparingRebalance":
            code = ErrorCode.rebalance_in_progress
        else:
            code = ErrorCode.none
        if member is not None:
            member.last_seen = asyncio.get_running_loop().time()
        return {"throttle_time": 0, "error_code": code}

    async def leave_group(self, ctx: Context, request: Request) -> dict[str, Any]:
        body = request.body
        group = self.groups.get(str(body.group_id))
        leaving = (
            [str(m.member_id) for m in body.members] if hasattr(body, "members") else [str(body.member_id)]
        )
        results = []
        if hasattr(body, "members") and group is not None:  # v3+: a static member may leave by instance id
            leaving = [
                str(m.member_id) or group.static.get(str(m.group_instance_id or ""), "") for m in body.members
            ]
        for member_id in leaving:
            if group is not None and member_id in group.members:
                self._remove(group, member_id)
                results.append(
                    {"member_id": member_id, "group_instance_id": None, "error_code": ErrorCode.none}
                )
            else:
                results.append(
                    {
                        "member_id": member_id,
                        "group_instance_id": None,
                        "error_code": ErrorCode.unknown_member_id,
                    }
                )
        code = (
            ErrorCode.none
            if hasattr(body, "members") or results[0]["error_code"] == 0
            else ErrorCode.unknown_member_id
        )
        return {"throttle_time": 0, "error_code": code, "members": results}

    def _remove(self, group: Group, member_id: str) -> None:
        member = group.members.pop(member_id)
        if member.instance_id is not None and group.static.get(member.instance_id) == member_id:
            del group.static[member.instance_id]
        for fut in (member.join, member.sync):
            if fut is not None and not fut.done():
                fut.cancel()
        if group.members:
            self._prepare_rebalance(group)
            self._maybe_complete_join(group)
        else:
            if group.deadline is not None:
                group.deadline.cancel()
                group.deadline = None
            group.state, group.leader, group.protocol = "Empty", None, None
            group.generation += 1
            self._release(group)

    async def _expire_loop(self) -> None:
        loop = asyncio.get_running_loop()
        checked = loop.time()
        while True:
            await asyncio.sleep(_CHECK_S)
            now = loop.time()
            self.expire(now, now - checked - _CHECK_S)
            checked = now

    def expire(self, now: float, late: float) -> list[tuple[str, str]]:
        """Remove the members whose session expired at ``now`` (loop time); ``late``: how much later than
        planned this check runs. That delay is the broker's, not the members': while the event loop did
        not run, heartbeats waited unread in the sockets, and a check right after such a stall would expire
        every member at once. It is added to every session. Returns the (group, member) removed."""
        gone = []
        if late > _CHECK_S:
            _log.info("the event loop did not run for %.1f s: added to every member's session", late)
        for group in list(self.groups.values()):
            for member_id, m in list(group.members.items()):
                if late > 0:
                    m.last_seen += late
                waiting = m.busy > 0 or any(f is not None and not f.done() for f in (m.join, m.sync))
                if not waiting and now - m.last_seen > m.session_timeout_ms / 1000:
                    _log.info("member %s of group %r: session expired", member_id, group.group_id)
                    self._remove(group, member_id)
                    gone.append((group.group_id, member_id))
        return gone

    # -- OffsetCommit, OffsetFetch -----------------------------------------------------------------------

    async def offset_commit(self, ctx: Context, request: Request) -> dict[str, Any]:
        body = request.body
        group_id = str(body.group_id)
        generation = int(getattr(body, "generation_id_or_member_epoch", getattr(body, "generation_id", -1)))
        member_id = str(body.member_id)
        code = self._check_commit(group_id, generation, member_id)
        codes: dict[tuple[str, int], ErrorCode] = {}
        if code == ErrorCode.none:
            entries = [
                (str(t.name), int(p.partition_index), int(p.committed_offset), p.committed_metadata or "")
                for t in body.topics
                for p in t.partitions
            ]
            # the commit is the member's sign of life (Kafka's too), and while the thread pool stores it the
            # member's next heartbeat waits behind it on the connection: no expiry until it is answered
            group = self.groups.get(group_id)
            member = group.members.get(member_id) if group is not None and member_id else None
            loop = asyncio.get_running_loop()
            if member is not None:
                member.last_seen = loop.time()
                member.busy += 1
            try:
                codes = await ctx.run(_commit, ctx, group_id, entries, generation, member_id)
            except PylogError as exc:
                _log.warning("commit of group %r failed: %s", group_id, exc)
                code = ErrorCode.kafka_storage_error
            finally:
                if member is not None:
                    member.busy -= 1
                    member.last_seen = loop.time()
        return {
            "throttle_time": 0,
            "topics": [
                {
                    "name": t.name,
                    "partitions": [
                        {
                            "partition_index": p.partition_index,
                            "error_code": codes.get((str(t.name), int(p.partition_index)), code),
                        }
                        for p in t.partitions
                    ],
                }
                for t in body.topics
            ],
        }

    def _check_commit(self, group_id: str, generation: int, member_id: str) -> ErrorCode:
        try:
            validate_group_id(group_id)
        except ConfigError:
            return ErrorCode.invalid_group_id
        group = self.groups.get(group_id)
        if generation < 0 and not member_id:
            if group is not None and group.members:
                return ErrorCode.unknown_member_id  # Kafka refuses simple commits to a group with members
            return ErrorCode.none
        if group is None or member_id not in group.members:
            return ErrorCode.unknown_member_id
        if generation != group.generation:
            return ErrorCode.illegal_generation
        if group.state == "PreparingRebalance":
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    async def offset_fetch(self, ctx: Context, request: Request) -> dict[str, Any]:
        body = request.body
        group_id = str(body.group_id)
        committed = await ctx.run(_committed, ctx, group_id)
        if body.topics is None:
            wanted: dict[str, list[int]] = {}
            for topic, partition in sorted(committed):
                wanted.setdefault(topic, []).append(partition)
        else:
            wanted = {str(t.name): [int(p) for p in t.partition_indexes] for t in body.topics}
        topics = []
        for topic, partitions in wanted.items():
            parts = []
            for p in partitions:
                offset, metadata = committed.get((topic, p), (-1, ""))
                parts.append(
                    {
                        "partition_index": p,
                        "committed_offset": offset,
                        "committed_leader_epoch": -1,
                        "metadata": metadata,
                        "error_code": ErrorCode.none,
                    }
                )
            topics.append({"name": topic, "partitions": parts})
        return {"throttle_time": 0, "topics": topics, "error_code": ErrorCode.none}

    # -- DeleteGroups, OffsetDelete ------------------------------------------------------------------------

    async def delete_groups(self, ctx: Context, request: Request) -> dict[str, Any]:
        results = []
        for group_id in dict.fromkeys(str(g) for g in request.body.groups_names):
            results.append({"group_id": group_id, "error_code": await self._delete_group(ctx, group_id)})
        return {"throttle_time": 0, "results": results}

    async def _delete_group(self, ctx: Context, group_id: str) -> ErrorCode:
        try:
            validate_group_id(group_id)
        except ConfigError:
            return ErrorCode.invalid_group_id
        group = self.groups.get(group_id)
        if group is not None and group.members:
            return ErrorCode.non_empty_group
        self._deleting.add(group_id)
        try:
            code = await ctx.run(_delete_group, ctx, group_id)
        finally:
            self._deleting.discard(group_id)
        if group is not None and not group.members:
            self.groups.pop(group_id, None)  # an empty Kafka group: it is gone
            if code == ErrorCode.group_id_not_found:  # never committed: it existed in memory only
                code = ErrorCode.none
        return code

    async def offset_delete(self, ctx: Context, request: Request) -> dict[str, Any]:
        body = request.body
        group_id = str(body.group_id)
        wanted = [(str(t.name), int(p.partition_index)) for t in body.topics for p in t.partitions]
        try:
            validate_group_id(group_id)
        except ConfigError:
            return _offset_delete_answer(ErrorCode.invalid_group_id, [])
        group = self.groups.get(group_id)
        members = list(group.members.values()) if group is not None else []
        if any(m.protocol_type != "consumer" for m in members):
            return _offset_delete_answer(ErrorCode.non_empty_group, [])  # another protocol: topics unknown
        subscribed = {t for m in members for _, metadata in m.protocols for t in _subscription(metadata)}
        try:
            codes = await ctx.run(_delete_offsets, ctx, group_id, wanted, subscribed, bool(members))
        except _GroupError as exc:
            return _offset_delete_answer(exc.code, [])
        except (UnknownGroupError, ConfigError):  # deleted meanwhile
            return _offset_delete_answer(ErrorCode.group_id_not_found, [])
        return _offset_delete_answer(ErrorCode.none, [(t, p, codes[t, p]) for t, p in wanted])


class _GroupError(Exception):
    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.name)
        self.code = code


def _delete_group(ctx: Context, group_id: str) -> ErrorCode:
    """Delete the group's files (committed offsets, state) as ``pylog groups delete`` does."""
    try:
        ctx.log.delete_group(group_id)
    except UnknownGroupError:
        return ErrorCode.group_id_not_found
    except GroupNotEmptyError:
        return ErrorCode.non_empty_group
    except PylogError as exc:
        _log.warning("deleting group %r failed: %s", group_id, exc)
        return ErrorCode.kafka_storage_error
    return ErrorCode.none


def _delete_offsets(
    ctx: Context, group_id: str, wanted: list[tuple[str, int]], subscribed: set[str], kafka_members: bool
) -> dict[tuple[str, int], ErrorCode]:
    """Remove the committed offsets ``wanted`` of ``group_id``, but not of the topics its members (Kafka
    clients: ``subscribed``; live pylog consumers: read under the group's lock) subscribe to."""
    codes: dict[tuple[str, int], ErrorCode] = {}
    for topic, partition in wanted:
        if not ctx.log.has_topic(topic) or not 0 <= partition < ctx.log.topic(topic).num_partitions:
            codes[topic, partition] = ErrorCode.unknown_topic_or_partition
    root = groups_root(ctx.log)
    if group_id not in group_ids(root):
        if not kafka_members:
            raise _GroupError(ErrorCode.group_id_not_found)
        return {tp: codes.get(tp, _subscribed_code(tp[0], subscribed)) for tp in wanted}  # nothing committed
    ctx.log.describe_group(group_id)  # expels pylog consumers that died or whose session expired
    store = GroupStore(root, group_id, create=False)
    try:
        with store.lock():
            members = store.state_view()["members"]
            subscribed = subscribed | {t for m in members.values() for t in m.get("topics", ())}
            for tp in wanted:
                codes.setdefault(tp, _subscribed_code(tp[0], subscribed))
            entries = [(t, p, -1, "") for (t, p), code in codes.items() if code == ErrorCode.none]
            if entries:
                store.append_offsets(entries, generation=-1, member_id="", now_ms=ctx.log.clock.time_ms())
    finally:
        store.close()
    return codes


def _subscribed_code(topic: str, subscribed: set[str]) -> ErrorCode:
    return ErrorCode.group_subscribed_to_topic if topic in subscribed else ErrorCode.none


_I16, _I32 = struct.Struct(">h"), struct.Struct(">i")


def _subscription(metadata: bytes | None) -> list[str]:
    """The topics of a consumer's ConsumerProtocolSubscription (its JoinGroup metadata: version i16, then
    the topics as an array of i16-length strings, in every version). A malformed one names no topic."""
    if not metadata:
        return []
    try:
        (count,) = _I32.unpack_from(metadata, 2)
        topics, at = [], 6
        for _ in range(count):
            (size,) = _I16.unpack_from(metadata, at)
            topics.append(metadata[at + 2 : at + 2 + size].decode())
            at += 2 + size
        return topics
    except (struct.error, UnicodeDecodeError):
        return []


def _offset_delete_answer(code: ErrorCode, results: list[tuple[str, int, ErrorCode]]) -> dict[str, Any]:
    topics: dict[str, list[dict[str, Any]]] = {}
    for topic, partition, error in results:
        topics.setdefault(topic, []).append({"partition_index": partition, "error_code": error})
    return {
        "error_code": code,
        "throttle_time": 0,
        "topics": [{"name": t, "partitions": parts} for t, parts in topics.items()],
    }


def _commit(
    ctx: Context, group_id: str, entries: list[tuple[str, int, int, str]], generation: int, member_id: str
) -> dict[tuple[str, int], ErrorCode]:
    """Store the committed offsets ``entries`` of partitions that exist; UNKNOWN_TOPIC_OR_PARTITION for the
    others (not stored), as Kafka answers."""
    counts: dict[str, int] = {}  # topic -> its partition count (0: no such topic)
    for topic, _, _, _ in entries:
        if topic not in counts:
            counts[topic] = ctx.log.topic(topic).num_partitions if ctx.log.has_topic(topic) else 0
    unknown = {
        (topic, partition): ErrorCode.unknown_topic_or_partition
        for topic, partition, _, _ in entries
        if not 0 <= partition < counts[topic]
    }
    known = [e for e in entries if (e[0], e[1]) not in unknown]
    if known:
        store = GroupStore(groups_root(ctx.log), group_id)
        try:
            store.append_offsets(
                known, generation=generation, member_id=member_id, now_ms=ctx.log.clock.time_ms()
            )
        finally:
            store.close()
    return unknown


def _committed(ctx: Context, group_id: str) -> dict[tuple[str, int], tuple[int, str]]:
    try:
        offsets = ctx.log.group_offsets(group_id)
    except (UnknownGroupError, ConfigError):
        return {}
    return {(tp.topic, tp.partition): (om.offset, om.metadata or "") for tp, om in offsets.items()}


def _claim(ctx: Context, group_id: str) -> tuple[int | None, list[str]]:
    """Take the group's ``kafka.lock`` for the broker's Kafka members (pylog consumers then refuse to join),
    under the group's lock and only if it has no live pylog consumer: (descriptor, []), or (None, the live
    pylog consumers' member ids)."""
    try:
        live = [m.member_id for m in ctx.log.describe_group(group_id).members]  # expires dead members first
    except (UnknownGroupError, ConfigError):
        live = []
    if live:
        return None, live
    store = GroupStore(groups_root(ctx.log), group_id)
    try:
        with store.lock():
            members = list(store.state_view()["members"])
            if members:
                return None, members
            fd = store.hold_kafka_lock()
            return fd, [] if fd is not None else ["another broker"]
    finally:
        store.close()


def _choose_protocol(group: Group) -> str:
    members = list(group.members.values())
    common = set.intersection(*({name for name, _ in m.protocols} for m in members))
    leader = group.members.get(group.leader or "", members[0])
    for name, _ in leader.protocols:
        if name in common:
            return name
    return members[0].protocols[0][0]


def _sync_answer(code: ErrorCode, assignment: bytes = b"", group: Group | None = None) -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "error_code": code,
        "protocol_type": None if group is None else group.protocol_type,
        "protocol_name": None if group is None else group.protocol,
        "assignment": assignment,
    }


def _join_error(code: ErrorCode, member_id: str = "") -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "error_code": code,
        "generation_id": -1,
        "protocol_type": None,
        "protocol_name": None,
        "leader": "",
        "member_id": member_id,
        "members": [],
    }


def _ms(value: Any) -> int:
    return int(value.total_seconds() * 1000) if hasattr(value, "total_seconds") else int(value)
