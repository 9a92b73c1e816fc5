"""How each member's partitions split over its topics, for the sticky assignors.

The sticky assignors first settle how many partitions each member gets and how many of its owned ones it
keeps. Many assignments meet those totals; they differ in how each member's share splits over the topics. A
member holding all of ``t0`` and none of ``t1`` carries all of ``t0``'s traffic and none of ``t1``'s, so the
sticky assignors also spread each topic over the members (Kafka fixed the same lopsided result in
KAFKA-16277). This module works on counts only: ``counts[member][topic]``, the number of partitions of
``topic`` the member gets, for members that all subscribe to the same topics.

* :func:`trim`: a member that owns more than it may keep gives up partitions of the topic where it holds the
  most above its fair share (``partitions / members``), one at a time, so what it keeps is spread too.
* :func:`fill`: free partitions are dealt topic by topic, each to the member with room that holds the fewest
  of that topic (then the one with the most room left). With nothing owned this deals every topic's
  partitions round the members.
* :func:`spread_topics`: improves the result by **swaps**: one partition of topic ``t`` from member ``a`` to
  ``b`` and one of topic ``u`` from ``b`` back to ``a``. A swap keeps every member's total and every topic's
  total. Bounds per member and topic (``lower <= counts <= upper``) say which swaps keep stickiness: the
  caller sets them so that no swap lowers the number of partitions that stay with their owner.

A swap is taken when it lowers the sum of squared counts, that is when
``(counts[a][t] - counts[b][t]) + (counts[b][u] - counts[a][u]) >= 3``; each one lowers that sum by at least
2, so the search ends, and it ends with no swap within the bounds left that would even out the topics.
Without bounds (a fresh assignment) and with totals that differ by at most 1, every topic's counts then
differ by at most 1: if ``a`` holds two more of ``t`` than ``b`` and at most one more partition in all, ``b``
holds more than ``a`` of some other topic ``u``, and swapping ``t`` for ``u`` would have a gap of 3.

>>> lopsided = {"a": {"t0": 2, "t1": 0}, "b": {"t0": 0, "t1": 2}}
>>> nothing, everything = ({m: {"t0": n, "t1": n} for m in "ab"} for n in (0, 2))
>>> spread_topics(lopsided, nothing, everything)
>>> lopsided
{'a': {'t0': 1, 't1': 1}, 'b': {'t0': 1, 't1': 1}}

When ``a`` must keep both of its ``t0`` partitions (they stay with their owner), nothing can move:

>>> lopsided = {"a": {"t0": 2, "t1": 0}, "b": {"t0": 0, "t1": 2}}
>>> spread_topics(lopsided, {"a": {"t0": 2, "t1": 0}, "b": {"t0": 0, "t1": 0}}, everything)
>>> lopsided
{'a': {'t0': 2, 't1': 0}, 'b': {'t0': 0, 't1': 2}}
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

__all__ = ["Counts", "fill", "spread_topics", "trim"]

#: member id -> topic -> number of partitions.
Counts = dict[str, dict[str, int]]


def trim(
    owned: Mapping[str, int], keep: int, partitions_per_topic: Mapping[str, int], members: int
) -> dict[str, int]:
    """How many of its owned partitions of each topic a member keeps when it may keep only ``keep``.

    It gives up one partition at a time from the topic where it holds the most above its fair share
    (``owned[t] * members - partitions_per_topic[t]``, largest first; ties: topic name).
    """
    counts = dict(owned)
    heap = [(partitions_per_topic[t] - n * members, t) for t, n in counts.items() if n > 0]
    heapq.heapify(heap)
    for _ in range(sum(counts.values()) - keep):
        _, topic = heapq.heappop(heap)
        counts[topic] -= 1
        if counts[topic]:
            heapq.heappush(heap, (partitions_per_topic[topic] - counts[topic] * members, topic))
    return counts


def fill(counts: Counts, room: Mapping[str, int], free: Mapping[str, int]) -> None:
    """Deal ``free[t]`` partitions of each topic to the members, at most ``room[m]`` to member ``m``.

    Topics go in name order; each partition goes to the member with room that holds the fewest of its topic,
    then to the one with the most room left, then to the lowest id. ``counts`` is updated in place; the rooms
    must add up to the free partitions.
    """
    left = dict(room)
    for topic in sorted(free):
        heap = [(counts[m][topic], -left[m], m) for m in counts if left[m] > 0]
        heapq.heapify(heap)
        for _ in range(free[topic]):
            held, _, member = heapq.heappop(heap)
            counts[member][topic] = held + 1
            left[member] -= 1
            if left[member]:
                heapq.heappush(heap, (held + 1, -left[member], member))


def spread_topics(counts: Counts, lower: Counts, upper: Counts) -> None:
    """Swap partitions between members until no swap within the bounds evens out the topics (in place).

    Every member in ``counts`` has an entry for every topic. Nothing runs when each topic's counts already
    differ by at most 1, as after a fresh assignment; otherwise a pass costs ``O(topics^2 x members^2)``.
    """
    members = sorted(counts)
    topics = sorted({topic for row in counts.values() for topic in row})
    if all(_spread(counts, members, topic) <= 1 for topic in topics):
        return
    improved = True
    while improved:
        improved = False
        for topic in topics:
            improved |= _swap_topic(counts, lower, upper, members, topic)


def _spread(counts: Counts, members: list[str], topic: str) -> int:
    values = [counts[m][topic] for m in members]
    return max(values) - min(values)


def _swap_topic(counts: Counts, lower: Counts, upper: Counts, members: list[str], topic: str) -> bool:
    """Take every improving swap that moves a partition of ``topic`` from a member holding at least two more
    of it than the receiver. True if any was taken."""
    swapped = False
    descending = sorted(members, key=lambda m: (-counts[m][topic], m))
    for giver in descending:
        for receiver in reversed(descending):
            gap = counts[giver][topic] - counts[receiver][topic]
            if gap < 2:
                break
            if (
                counts[giver][topic] <= lower[giver][topic]
                or counts[receiver][topic] >= upper[receiver][topic]
            ):
                continue
            back = _swap_back(counts, lower, upper, (giver, receiver, topic))
            if back is not None and gap + counts[receiver][back] - counts[giver][back] >= 3:
                for member, gives, gets in ((giver, topic, back), (receiver, back, topic)):
                    counts[member][gives] -= 1
                    counts[member][gets] += 1
                swapped = True
    return swapped


def _swap_back(counts: Counts, lower: Counts, upper: Counts, move: tuple[str, str, str]) -> str | None:
    """For ``move = (giver, receiver, topic)``: the other topic ``receiver`` best gives back to ``giver`` (the
    largest ``receiver - giver`` gap) within the bounds, or None. Ties: topic name."""
    giver, receiver, topic = move
    best: tuple[int, str] | None = None
    for other in sorted(counts[giver]):
        if other == topic or counts[receiver][other] <= lower[receiver][other]:
            continue
        if counts[giver][other] >= upper[giver][other]:
            continue
        gap = counts[receiver][other] - counts[giver][other]
        if best is None or gap > best[0]:
            best = (gap, other)
    return None if best is None else best[1]
