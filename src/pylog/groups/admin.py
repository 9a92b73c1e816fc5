"""Group administration on a log directory: list, describe, committed offsets and lag, reset, delete.

These back :meth:`pylog.Log.list_groups` and its siblings, and the ``pylog groups`` command. Reading is
allowed at any time; changing committed offsets and deleting a group need a group with no live members
(:class:`~pylog.errors.GroupNotEmptyError` otherwise), as with ``kafka-consumer-groups``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pylog.errors import (
    CommitFailedError,
    ConfigError,
    GroupNotEmptyError,
    InvalidOffsetError,
    UnknownGroupError,
)
from pylog.groups import coordinator
from pylog.groups.store import (
    GroupStore,
    group_ids,
    groups_root,
    partitions_of,
    to_topic_partition,
    validate_group_id,
)
from pylog.structs import OffsetAndMetadata, TopicPartition

if TYPE_CHECKING:
    from pylog.directory import LogDirectory

__all__ = ["GroupDescription", "MemberDescription", "describe_group", "list_groups"]


@dataclass(frozen=True)
class MemberDescription:
    """One member of a group, as ``describe_group`` reports it."""

    member_id: str
    client_id: str
    host: str
    pid: int
    group_instance_id: str | None
    assignment: list[TopicPartition] = field(default_factory=list)


@dataclass(frozen=True)
class GroupDescription:
    """A group's state: Kafka's ``state`` names (``Empty``, ``PreparingRebalance``, ``Stable``)."""

    group_id: str
    state: str
    generation: int
    protocol: str | None
    assignor: str | None
    members: list[MemberDescription] = field(default_factory=list)


def list_groups(log: LogDirectory) -> list[str]:
    return group_ids(groups_root(log))


def _store(log: LogDirectory, group_id: str) -> GroupStore:
    validate_group_id(group_id)
    root = groups_root(log)
    if group_id not in group_ids(root):
        raise UnknownGroupError(f"unknown consumer group {group_id!r}")
    return GroupStore(root, group_id, create=False)


def _live_state(log: LogDirectory, store: GroupStore) -> dict[str, Any]:
    """The state after expelling members that died or whose session expired (under the lock)."""
    with store.lock():
        state = store.read_state()
        gone = coordinator.expire_members(
            state, log.clock.time_ms(), store.member_is_dead, store.last_heartbeat, None, 0
        )
        if gone:
            store.write_state(state)
            for member_id in gone:
                store.remove_member_lock(member_id)
    return state


def describe_group(log: LogDirectory, group_id: str) -> GroupDescription:
    store = _store(log, group_id)
    try:
        state = _live_state(log, store)
    finally:
        store.close()
    members = [
        MemberDescription(
            member_id=mid,
            client_id=m["client_id"],
            host=m["host"],
            pid=m["pid"],
            group_instance_id=m.get("instance_id"),
            assignment=sorted(partitions_of(m["assignment"])),
        )
        for mid, m in sorted(state["members"].items())
    ]
    return GroupDescription(
        group_id=group_id,
        state=state["state"],
        generation=state["generation"],
        protocol=state["protocol"],
        assignor=state["assignor"],
        members=members,
    )


def group_offsets(log: LogDirectory, group_id: str) -> dict[TopicPartition, OffsetAndMetadata]:
    store = _store(log, group_id)
    try:
        return dict(sorted(store.offsets().items()))
    finally:
        store.close()


def group_lag(log: LogDirectory, group_id: str) -> dict[TopicPartition, int]:
    """Per partition with a committed offset: log end offset minus committed offset."""
    out = {}
    for tp, om in group_offsets(log, group_id).items():
        end = log.topic(tp.topic).partition(tp.partition).log_end_offset
        out[tp] = max(end - om.offset, 0)
    return out


def reset_group_offsets(log: LogDirectory, group_id: str, offsets: dict[TopicPartition, int]) -> None:
    """Set committed offsets (clamped to nothing: each must lie within its partition's offsets)."""
    validate_group_id(group_id)
    if not isinstance(offsets, Mapping):
        raise InvalidOffsetError(f"offsets must be a dict of TopicPartition -> offset, got {offsets!r}")
    entries = []
    for key, value in offsets.items():
        tp = to_topic_partition(key)
        offset = value.offset if isinstance(value, OffsetAndMetadata) else value
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise InvalidOffsetError(f"offset for {tp} must be an int, got {offset!r}")
        plog = log.topic(tp.topic).partition(tp.partition)
        if not plog.log_start_offset <= offset <= plog.log_end_offset:
            raise InvalidOffsetError(
                f"offset {offset} for {tp} is outside [{plog.log_start_offset}, {plog.log_end_offset}]"
            )
        entries.append((tp.topic, tp.partition, offset, ""))
    store = GroupStore(groups_root(log), group_id)
    try:
        with store.lock():
            state = _live_state(log, store)
            if state["members"]:
                raise GroupNotEmptyError(
                    f"group {group_id!r} has {len(state['members'])} live members; stop them before resetting offsets"
                )
            store.append_offsets(
                entries, generation=state["generation"], member_id="", now_ms=log.clock.time_ms()
            )
    finally:
        store.close()


def forget_topic_offsets(root: str, topic: str, now_ms: int) -> int:
    """Remove every group's committed offsets of ``topic`` (deleted: as Kafka's group coordinator does), so
    that a topic created again under the name is not read from the old topic's positions. Returns how many
    committed offsets were removed."""
    removed = 0
    for group_id in group_ids(root):
        try:
            store = GroupStore(root, group_id, create=False)
        except ConfigError:
            continue  # deleted meanwhile
        try:
            with store.lock():
                entries = [(tp.topic, tp.partition, -1, "") for tp in store.offsets() if tp.topic == topic]
                if entries:
                    store.append_offsets(entries, generation=-1, member_id="", now_ms=now_ms)
                    removed += len(entries)
        finally:
            store.close()
    return removed


def delete_group(log: LogDirectory, group_id: str) -> None:
    store = _store(log, group_id)
    try:
        with store.lock():
            state = _live_state(log, store)
            if state["members"]:
                raise GroupNotEmptyError(
                    f"group {group_id!r} has {len(state['members'])} live members; stop them before deleting it"
                )
            store.delete_files()
    finally:
        store.close()


def check_group_member(state: Mapping[str, Any], group_id: str, member: tuple[str, int]) -> None:
    """Kafka's fencing of a transaction's offsets (KIP-447): ``member`` (member id, generation), taken from a
    consumer's ``group_metadata()``, must still be a member of the group in that generation; else
    :class:`~pylog.errors.CommitFailedError` (the member was fenced by a rebalance: abort the transaction,
    poll to rejoin, and process the records again)."""
    member_id, generation = member
    me = state["members"].get(member_id)
    if me is None:
        raise CommitFailedError(
            f"transaction offsets refused: {member_id!r} is no longer a member of group {group_id!r} "
            "(its session expired or it left); abort the transaction and poll() to rejoin"
        )
    if me["generation"] != generation:
        raise CommitFailedError(
            f"transaction offsets refused: group {group_id!r} moved from generation {generation} to "
            f"{me['generation']} for member {member_id!r} since its group_metadata() was taken; abort the "
            "transaction and poll() to complete the rebalance"
        )


def check_transaction_member(log: LogDirectory, group_id: str, member: tuple[str, int]) -> None:
    """:func:`check_group_member` against the group's current state."""
    validate_group_id(group_id)
    store = GroupStore(groups_root(log), group_id)
    try:
        check_group_member(store.state_view(), group_id, member)
    finally:
        store.close()


def stage_transactional_offsets(
    log: LogDirectory,
    group_id: str,
    offsets: dict[TopicPartition, OffsetAndMetadata],
    txn: tuple[int, int, int],
    member: tuple[str, int] | None = None,
) -> None:
    """Write a transaction's offsets for ``group_id``, durably, tagged with the transaction: they count once
    its commit decision is written (see :mod:`pylog.groups.store`). Each offset must lie within its partition.
    With ``member`` (member id, generation), the member must still be in that generation of the group
    (:func:`check_group_member`), checked under the group's lock."""
    validate_group_id(group_id)
    entries = []
    for tp, om in sorted(offsets.items()):
        plog = log.topic(tp.topic).partition(tp.partition)
        if (
            isinstance(om.offset, bool)
            or not isinstance(om.offset, int)
            or not 0 <= om.offset <= plog.log_end_offset
        ):
            raise InvalidOffsetError(f"offset {om.offset!r} for {tp} is outside [0, {plog.log_end_offset}]")
        entries.append((tp.topic, tp.partition, om.offset, om.metadata))
    store = GroupStore(groups_root(log), group_id)
    try:
        with store.lock(shared=True):
            state = store.state_view()
            if member is not None:
                check_group_member(state, group_id, member)
            generation = state["generation"]
            pending = store.write_offsets(
                entries, generation=generation, member_id="", now_ms=log.clock.time_ms(), txn=txn
            )
        pending.sync()
    finally:
        store.close()
