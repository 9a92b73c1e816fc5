"""How each member's partitions split over its topics, for the sticky assignors.

The sticky assignors first settle how many partitions each member gets and how many of its owned ones it
keeps. Many assignments meet those totals; they differ in how each member's share splits over the topics. A
member holding all of ``t0`` and none of ``t1`` carries all of ``t0``'s traffic and none of ``t1``'s, so the
sticky assignors also spread each topic over the members (Kafka fixed the same lopsided result in
KAFKA-16277). This module works on counts only: ``counts[i, j]``, the number of partitions of topic ``j`` that
member ``i`` gets, for members that all subscribe to the same topics. Members are numbered in id order and
topics in name order; every tie below goes to the lower number, as it would to the smaller id or name.

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
``(counts[a, t] - counts[b, t]) + (counts[b, u] - counts[a, u]) >= 3``; each one lowers that sum by at least
2, so the search ends, and it ends with no swap within the bounds left that would even out the topics.
Without bounds (a fresh assignment) and with totals that differ by at most 1, every topic's counts then
differ by at most 1: if ``a`` holds two more of ``t`` than ``b`` and at most one more partition in all, ``b``
holds more than ``a`` of some other topic ``u``, and swapping ``t`` for ``u`` would have a gap of 3.

Costs: :func:`trim` and :func:`fill` compute a whole topic (or member) at once, ``O(members)`` numpy work per
topic (``O(topics)`` per trimmed member) instead of one heap operation per partition; :func:`spread_topics`
returns at once when each topic's counts already differ by at most 1 (a fresh assignment, and any rebalance
that only hands out free partitions), and otherwise only looks at topics whose counts differ by 2 or more.

>>> import numpy as np
>>> lopsided = np.array([[2, 0], [0, 2]])  # a: two of t0; b: two of t1
>>> nothing, everything = np.zeros((2, 2), dtype=int), np.full((2, 2), 2)
>>> spread_topics(lopsided, nothing, everything)
>>> lopsided.tolist()
[[1, 1], [1, 1]]

When ``a`` must keep both of its ``t0`` partitions (they stay with their owner), nothing can move:

>>> lopsided = np.array([[2, 0], [0, 2]])
>>> spread_topics(lopsided, np.array([[2, 0], [0, 0]]), everything)
>>> lopsided.tolist()
[[2, 0], [0, 2]]
"""

from __future__ import annotations

import heapq

import numpy as np
import numpy.typing as npt

__all__ = ["Counts", "fill", "spread_topics", "trim"]

#: ``counts[member, topic]``: number of partitions (members in id order, topics in name order).
Counts = npt.NDArray[np.int64]

# Below this many partitions to give up, :func:`trim` pops a heap; above, it computes the cut at once.
_HEAP_TRIM = 32


def trim(owned: Counts, keep: int, sizes: Counts, members: int) -> Counts:
    """How many of its owned partitions of each topic a member keeps when it may keep only ``keep``.

    ``owned`` and ``sizes`` are per topic (the member's partitions and the topic's). It gives up one partition
    at a time from the topic where it holds the most above its fair share (``owned[t] * members - sizes[t]``,
    largest first; ties: the lower topic number).

    >>> trim(np.array([3, 1, 0]), 2, np.array([4, 4, 4]), 2).tolist()
    [1, 1, 0]
    """
    counts = np.array(owned, dtype=np.int64)
    remove = int(counts.sum()) - keep
    if remove <= 0:
        return counts
    if remove <= _HEAP_TRIM:
        return _trim_heap(counts, remove, sizes, members)
    return _trim_cut(counts, remove, np.asarray(sizes, dtype=np.int64), members)


def _trim_heap(counts: Counts, remove: int, sizes: Counts, members: int) -> Counts:
    held = counts.tolist()
    size = np.asarray(sizes).tolist()
    heap = [(size[t] - n * members, t) for t, n in enumerate(held) if n > 0]
    heapq.heapify(heap)
    for _ in range(remove):
        _, topic = heapq.heappop(heap)
        held[topic] -= 1
        if held[topic]:
            heapq.heappush(heap, (size[topic] - held[topic] * members, topic))
    return np.array(held, dtype=np.int64)


def _trim_cut(counts: Counts, remove: int, sizes: Counts, members: int) -> Counts:
    """:func:`trim` at once. Giving up the ``i``-th last partition of topic ``t`` has the key
    ``sizes[t] - i * members`` (the heap's), so the heap gives up the ``remove`` smallest keys of all topics
    (ties: topic number): every key below a cut ``k``, and at ``k`` itself the lowest-numbered topics."""

    def at_most(k: int) -> Counts:
        # per topic, how many of its keys are <= k: i >= ceil((sizes - k) / members), 1 <= i <= counts
        first = np.maximum(-((k - sizes) // members), 1)
        return np.clip(counts - first + 1, 0, counts)

    live = counts > 0
    lo = int((sizes - counts * members)[live].min()) - 1  # at_most(lo) sums to 0 < remove
    hi = int((sizes - members)[live].max())  # at_most(hi) sums to everything >= remove
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if int(at_most(mid).sum()) >= remove:
            hi = mid
        else:
            lo = mid
    below = at_most(hi - 1)
    ties = np.flatnonzero(at_most(hi) > below)[: remove - int(below.sum())]
    below[ties] += 1
    result: Counts = counts - below
    return result


def fill(counts: Counts, room: Counts, free: Counts) -> None:
    """Deal ``free[t]`` partitions of each topic to the members, at most ``room[m]`` to member ``m``.

    Topics go in order; each partition goes to the member with room that holds the fewest of its topic, then
    to the one with the most room left, then to the lowest number. ``counts`` is updated in place; the rooms
    must add up to the free partitions.

    One topic at once: member ``m``'s ``j``-th partition of the topic would be taken at the key
    ``(counts[m] + j, -(left[m] - j), m)``, increasing in ``j``, so dealing one at a time takes the smallest
    keys of all members: everything below a level ``L`` (where fewer than the free partitions lie below) and
    the rest at ``L`` in the order of the other two fields.

    >>> counts = np.zeros((3, 2), dtype=np.int64)  # three members, two topics of 3 and 2 free partitions
    >>> fill(counts, np.array([2, 2, 1]), np.array([3, 2]))
    >>> counts.tolist()
    [[1, 1], [1, 1], [1, 0]]
    """
    left = np.array(room, dtype=np.int64)
    for topic in np.flatnonzero(np.asarray(free) > 0).tolist():
        active = np.flatnonzero(left > 0)
        held, room_left = counts[active, topic], left[active]
        taken = _deal(held, room_left, int(free[topic]))
        counts[active, topic] += taken
        left[active] -= taken


def _deal(held: Counts, room: Counts, n: int) -> Counts:
    """How many of ``n`` partitions each member takes in :func:`fill` (``room`` bounds each)."""

    def below(level: int) -> int:
        return int(np.clip(level - held, 0, room).sum())

    lo, hi = int(held.min()), int((held + room).max())  # below(lo) == 0 <= n, below(hi) == room.sum() >= n
    while hi - lo > 1:  # the largest level with below(level) <= n
        mid = (lo + hi) // 2
        if below(mid) <= n:
            lo = mid
        else:
            hi = mid
    if below(hi) <= n:
        lo = hi
    taken = np.clip(lo - held, 0, room)
    rest = n - int(taken.sum())
    if rest:
        at_level = np.flatnonzero((held <= lo) & (lo < held + room))
        # at level lo the key is (lo, -(room - (lo - held)), member): the most room left first
        order = np.lexsort((at_level, -(room[at_level] - (lo - held[at_level]))))
        taken[at_level[order[:rest]]] += 1
    return taken


def spread_topics(counts: Counts, lower: Counts, upper: Counts) -> None:
    """Swap partitions between members until no swap within the bounds evens out the topics (in place).

    ``counts``, ``lower`` and ``upper`` are ``members x topics``. Nothing runs when each topic's counts
    already differ by at most 1, as after a fresh assignment; otherwise a pass looks at each topic whose
    counts differ by 2 or more, ``O(members x topics)`` for each.
    """
    if counts.size == 0 or int((counts.max(axis=0) - counts.min(axis=0)).max()) <= 1:
        return
    # Topic-major nested lists: the swaps read and write single counts, which lists do fastest.
    held, low, high = counts.T.tolist(), lower.T.tolist(), upper.T.tolist()
    improved = True
    while improved:
        improved = False
        for topic in range(len(held)):
            improved |= _swap_topic(held, low, high, topic)
    counts[:] = np.array(held, dtype=counts.dtype).T


def _swap_topic(held: list[list[int]], low: list[list[int]], high: list[list[int]], topic: int) -> bool:
    """Take every improving swap that moves a partition of ``topic`` from a member holding at least two more
    of it than the receiver. True if any was taken."""
    column = held[topic]
    if max(column) - min(column) < 2:
        return False  # the first giver and the last receiver are already less than 2 apart
    swapped = False
    descending = sorted(range(len(column)), key=lambda m: (-column[m], m))
    for giver in descending:
        for receiver in reversed(descending):
            gap = column[giver] - column[receiver]
            if gap < 2:
                break
            if column[giver] <= low[topic][giver] or column[receiver] >= high[topic][receiver]:
                continue
            back = _swap_back(held, low, high, (giver, receiver, topic))
            if back is not None and gap + held[back][receiver] - held[back][giver] >= 3:
                column[giver] -= 1
                column[receiver] += 1
                held[back][receiver] -= 1
                held[back][giver] += 1
                swapped = True
    return swapped


def _swap_back(
    held: list[list[int]], low: list[list[int]], high: list[list[int]], move: tuple[int, int, int]
) -> int | None:
    """For ``move = (giver, receiver, topic)``: the other topic ``receiver`` best gives back to ``giver`` (the
    largest ``receiver - giver`` gap) within the bounds, or None. Ties: the lower topic number."""
    giver, receiver, topic = move
    best: tuple[int, int] | None = None
    for other, column in enumerate(held):
        if other == topic or column[receiver] <= low[other][receiver]:
            continue
        if column[giver] >= high[other][giver]:
            continue
        gap = column[receiver] - column[giver]
        if best is None or gap > best[0]:
            best = (gap, other)
    return None if best is None else best[1]
