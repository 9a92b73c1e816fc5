"""The group protocol as pure functions over a group's state (see :mod:`pylog.groups.store` for its shape).

There is no coordinator process: every member runs these functions on the shared state while holding the
group lock, so whoever looks next moves the group forward. The states and transitions follow Kafka's group
coordinator:

* ``Empty``: no members. A join starts a rebalance.
* ``PreparingRebalance``: something changed (a member joined, left, died or was expelled, a subscription or the
  topics' partitions changed). Every member must *join* the rebalance (``joined == rebalance id``): under the
  eager protocol after revoking all its partitions, under the cooperative one while keeping them and reporting
  what it owns. The rebalance completes when every member joined and the debounce delay has passed, or at the
  rebalance deadline (the largest ``max_poll_interval_ms`` of the members), when members that did not join are
  removed.
* ``Stable``: completing a rebalance runs the assignor, increments ``generation`` and records each member's
  assignment with that generation. Members adopt it on their next poll. A member whose assignment took away
  partitions it owned under the cooperative protocol asks for a follow-up rebalance once it has revoked them.

Members are expelled when their heartbeat is older than their ``session_timeout_ms``, and at once when their
liveness lock is free (their process died); static members (``group_instance_id``) only by their session, so a
restart within it gets the same member entry and assignment back without a rebalance.

A member's heartbeat and the rebalance it joined last are not in the state but in its slot of the heartbeat
table (:mod:`pylog.groups.liveness`), so that neither rewrites the state: these functions get them through the
``last_heartbeat`` and ``joined`` callables. What a member owns when it joins is not recorded either: it is
the assignment of the generation it adopted, which the state holds (``members[id]["assignment"]``) until the
next completion, since a member joins a rebalance only after adopting the latest generation; under the eager
protocol it revoked everything before joining, so it owns nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pylog.groups.assignors import Subscription, get_assignor
from pylog.groups.store import compact_partitions, partitions_of

MemberFn = Callable[[str, Mapping[str, Any]], int]

__all__ = [
    "completable",
    "complete_rebalance",
    "expire_members",
    "expired",
    "maybe_complete",
    "remove_member",
    "start_rebalance",
    "wanted_topics",
]


def start_rebalance(state: dict[str, Any], now_ms: int, reason: str, delay_ms: int) -> None:
    """Enter (or extend the debounce window of) a rebalance."""
    members = state["members"]
    if state["state"] == "PreparingRebalance" and state["rebalance"] is not None:
        rb = state["rebalance"]
        rb["not_before_ms"] = min(max(rb["not_before_ms"], now_ms + delay_ms), rb["deadline_ms"])
        rb["reasons"] = (rb["reasons"] + [reason])[-8:]
        return
    timeout = max((m["rebalance_timeout_ms"] for m in members.values()), default=0)
    state["rebalance_id"] += 1
    state["state"] = "PreparingRebalance"
    state["rebalance"] = {
        "id": state["rebalance_id"],
        "started_ms": now_ms,
        "deadline_ms": now_ms + timeout,
        "not_before_ms": now_ms + delay_ms,
        "reasons": [reason],
    }


def remove_member(state: dict[str, Any], member_id: str, now_ms: int, reason: str, delay_ms: int) -> None:
    member = state["members"].pop(member_id, None)
    if member is None:
        return
    instance = member.get("instance_id")
    if instance is not None and state["static"].get(instance) == member_id:
        del state["static"][instance]
    if state["members"]:
        start_rebalance(state, now_ms, reason, delay_ms)
    else:
        _become_empty(state)


def _become_empty(state: dict[str, Any]) -> None:
    if state["state"] != "Empty":
        state["generation"] += 1
    state["state"] = "Empty"
    state["rebalance"] = None
    state["leader"] = None
    state["assignor"] = None
    state["protocol"] = None


def expire_members(
    state: dict[str, Any],
    now_ms: int,
    is_dead: Callable[[str], bool],
    last_heartbeat: MemberFn,
    skip: str | None,
    delay_ms: int,
    candidates: list[str] | None = None,
) -> list[str]:
    """Remove members whose session expired, or whose liveness lock is free (dynamic members only); only
    those of ``candidates`` when given (a scan without the lock found them, this confirms under it)."""
    gone = []
    for member_id in list(state["members"]) if candidates is None else candidates:
        m = state["members"].get(member_id)
        if m is None or member_id == skip:
            continue
        why = expired(member_id, m, now_ms, is_dead, last_heartbeat)
        if why is not None:
            remove_member(state, member_id, now_ms, f"{member_id}: {why}", delay_ms)
            gone.append(member_id)
    return gone


def expired(
    member_id: str,
    m: Mapping[str, Any],
    now_ms: int,
    is_dead: Callable[[str], bool],
    last_heartbeat: MemberFn,
) -> str | None:
    """Why the member must go (``session timeout``, ``member process gone``), or None."""
    if now_ms - last_heartbeat(member_id, m) > m["session_timeout_ms"]:
        return "session timeout"
    if m.get("instance_id") is None and is_dead(member_id):
        return "member process gone"
    return None


def wanted_topics(state: Mapping[str, Any], topics: list[str]) -> set[str]:
    """Topics (among ``topics``, the log's) that some member subscribes to, by name or pattern."""
    import re

    out: set[str] = set()
    for m in state["members"].values():
        out.update(t for t in m["topics"] if t in topics)
        if m.get("pattern"):
            rx = re.compile(m["pattern"])
            out.update(t for t in topics if rx.fullmatch(t))
    return out


def _subscribed(member: Mapping[str, Any], partitions: Mapping[str, int]) -> frozenset[str]:
    import re

    names = set(member["topics"])
    if member.get("pattern"):
        rx = re.compile(member["pattern"])
        names.update(t for t in partitions if rx.fullmatch(t))
    return frozenset(names)


def completable(
    state: Mapping[str, Any], now_ms: int, joined: MemberFn, laggards: list[str] | None = None
) -> bool:
    """True when the rebalance under way may complete now (everyone joined and the debounce delay passed, or
    the deadline passed). ``laggards``: member ids to look at first (a member that had not joined at the last
    look); the first member found not joined is put at its front, so that asking again is cheap."""
    if state["state"] != "PreparingRebalance" or state["rebalance"] is None:
        return False
    rb = state["rebalance"]
    if now_ms >= rb["deadline_ms"]:
        return True
    if now_ms < rb["not_before_ms"]:
        return False
    members = state["members"]
    hint = [mid for mid in laggards or () if mid in members]
    for mid in [*hint, *members]:
        if joined(mid, members[mid]) != rb["id"]:
            if laggards is not None:
                laggards[:] = [mid]
            return False
    return True


def maybe_complete(
    state: dict[str, Any], now_ms: int, partitions: Mapping[str, int], delay_ms: int, joined: MemberFn
) -> bool:
    """Complete the rebalance when it may; returns True if it did."""
    if not completable(state, now_ms, joined):
        return False
    rb = state["rebalance"]
    members = state["members"]
    for member_id in [mid for mid, m in members.items() if joined(mid, m) != rb["id"]]:
        # did not join within the rebalance timeout (its max_poll_interval_ms): expelled, like Kafka
        m = members.pop(member_id)
        if m.get("instance_id") is not None and state["static"].get(m["instance_id"]) == member_id:
            del state["static"][m["instance_id"]]
    if not members:
        _become_empty(state)
        return True
    complete_rebalance(state, partitions)
    return True


def complete_rebalance(state: dict[str, Any], partitions: Mapping[str, int]) -> None:
    members = state["members"]
    name = members[sorted(members)[0]]["assignor"]
    assignor = get_assignor(name)
    cooperative = state.get("protocol") == "cooperative"  # eager members own nothing when they join
    subs = {
        mid: Subscription(
            topics=_subscribed(m, partitions),
            owned=tuple(sorted(partitions_of(m["assignment"]))) if cooperative else (),
            generation=m["generation"],
            group_instance_id=m.get("instance_id"),
        )
        for mid, m in members.items()
    }
    used = {t: n for t, n in partitions.items() if any(t in s.topics for s in subs.values())}
    result = assignor.assign(used, subs)
    state["generation"] += 1
    for mid, m in members.items():
        m["assignment"] = compact_partitions(result.get(mid, []))
        m["generation"] = state["generation"]
    state["state"] = "Stable"
    state["rebalance"] = None
    state["assignor"] = name
    state["protocol"] = assignor.protocol
    state["leader"] = sorted(members)[0]
    state["topics"] = dict(sorted(used.items()))
