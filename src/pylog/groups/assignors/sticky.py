"""Kafka's ``StickyAssignor`` (eager protocol): balanced, and moving as few partitions as possible.

The assignment is as balanced as the subscriptions allow and, within that, keeps as many partitions as
possible with the member that owns them now (``Subscription.owned``), so a rebalance does not throw away
caches, open files and in-flight work for partitions that did not need to move. Within those two, each topic
is spread over the members that subscribe to it (:mod:`pylog.groups.assignors.topic_spread`), so no member
ends up with all of one topic's traffic and none of another's.

The algorithm, in four steps:

1. **Who owns what now.** Each member's ``owned`` partitions are claims from generation ``generation``. A
   claim on a partition that no longer exists is dropped. When several members claim a partition, the claim
   with the higher generation wins; claims tied at the highest generation cancel out and the partition is free
   (as in Kafka's constrained path, which logs "multiple consumers claiming the same partition in the same
   generation"). A winner that no longer subscribes to the partition's topic frees it too.
2. **Uniform subscriptions** (every member subscribes to the same existing topics; Kafka's "constrained"
   path). With ``P`` partitions and ``N`` members every member gets ``P // N`` partitions and ``P % N`` of
   them one more; the larger quotas go first to members that own more than ``P // N`` (in id order), then to
   the others. A member that owns at least its quota keeps that many of its partitions and gets nothing new;
   it gives up partitions of the topic where it holds the most above its fair share first, round the topics
   (as Kafka does since KAFKA-16277), so what it keeps is spread over its topics. A member that owns less keeps
   all of it. The free partitions are then dealt topic by topic, each to the member with room that holds the
   fewest of that topic, and swaps that keep every count above even out the topics further (step 4). Nothing
   that could stay moves, so when a member leaves only its partitions move, and when one joins exactly the
   minimum number needed for balance moves. With no owned partitions every topic's partitions are dealt over
   the members: each member's count of each topic differs from any other's by at most 1.
3. **Different subscriptions** (Kafka's "general" path). Members keep every valid owned partition, and each
   free partition goes to the least-loaded member subscribed to its topic (topics with the fewest subscribers
   first, since they have the least choice). Then the balance is improved along *cost-reducing paths*: a chain
   of members ``u0 -> u1 -> ... -> uk`` where each gives one partition to the next, which subscribes to its
   topic, and ``uk`` holds at least two partitions fewer than ``u0``. Shifting along it lowers ``u0`` by one,
   raises ``uk`` by one and leaves the others unchanged. An assignment without such a path minimises the sum
   of squared counts, and with it the largest count (Harvey, Ladner, Lovasz and Tamir, "Semi-matchings for
   bipartite graphs and load balancing", 2003). Kafka's balance check, like kafka-python's
   ``verify_validity_and_balance``, only asks that no *single* move helps; that local optimum can leave counts
   1, 2, 3 where 2, 2, 2 is possible.

   It runs in two stages: (a) only partitions given in this call may move, which balances as well as possible
   while every owned partition stays; (b) owned partitions may move too, which happens only when (a) could not
   reach the best balance, and partitions given in this call still move first. Because of (a), a rebalance
   whose owned partitions are part of a best-balanced assignment moves none of them; that is what lets the
   cooperative assignor finish in two rebalances. Each stage first takes cheap single moves (bulk moves within
   a topic from members above the group average to members below it, then steepest descent with lazy heaps, a
   few heap operations per move) and searches for longer paths only for what is left; a search costs
   ``O(members + topics + subscriptions)``. Among topics with the same gap, the descent moves a partition of
   the topic its receiver holds the fewest of, so a member joining a group whose members all hold what
   balance allows takes one partition of each topic in turn rather than its whole share of one topic.
4. **Spread each topic** over members with the same topics: a member holding two more partitions of a topic
   than another with the same subscription hands one over in exchange for one of another topic (a *swap*),
   whenever the swap evens out the topics (it lowers the sum of squared per-topic counts). Swaps keep every
   member's total, so balance is unchanged, and they only ever move partitions that would not have stayed
   with their owner anyway: in step 2 a member that owns at least its quota may trade a kept partition for
   one of its own freed ones, any other member only partitions it did not own; in step 3 a member only
   trades partitions it did not own. The result: no such swap is left.

**Scale.** Kafka's own large-assignment tests (2,000 members, 500 topics of 2,000 partitions: a million
partitions, then the same group again with what each member owns) are what these assignors are sized for. So
the work per partition is done on arrays (:class:`GroupArrays`: the owner and holder of each partition,
counts per member and topic), never with a Python object per member and topic: the claims are read once,
free partitions are dealt a whole topic at a time (the least-loaded subscriber takes each in turn, computed
as a level rather than one heap operation per partition), and every balancing step first checks on arrays
whether it has anything to do, so an assignment that is already balanced costs no heap at all. What remains
per partition is reading its claim and creating its ``TopicPartition``.

Worked example: three members share topic ``t0`` with six partitions, then ``C0`` leaves.

>>> from pylog.groups.assignors.base import Subscription, format_assignment
>>> t0 = frozenset({"t0"})
>>> first = StickyAssignor().assign({"t0": 6}, {m: Subscription(t0) for m in ("C0", "C1", "C2")})
>>> print(format_assignment(first))
C0: t0-0, t0-1
C1: t0-2, t0-3
C2: t0-4, t0-5
>>> survivors = {m: Subscription(t0, owned=tuple(first[m]), generation=1) for m in ("C1", "C2")}
>>> print(format_assignment(StickyAssignor().assign({"t0": 6}, survivors)))
C1: t0-0, t0-2, t0-3
C2: t0-1, t0-4, t0-5

Only C0's partitions moved. The range assignor would have answered ``C1: t0-0..2, C2: t0-3..5`` and also moved
``t0-3`` away from C1.

With two topics, a member that joins an owner of everything gets half of each topic, not one whole topic:

>>> both, owner = frozenset({"t0", "t1"}), tuple(TopicPartition(t, p) for t in ("t0", "t1") for p in range(4))
>>> joined = {"C0": Subscription(both, owned=owner, generation=1), "C1": Subscription(both)}
>>> print(format_assignment(StickyAssignor().assign({"t0": 4, "t1": 4}, joined)))
C0: t0-0, t0-1, t1-0, t1-1
C1: t0-2, t0-3, t1-2, t1-3
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from itertools import chain, repeat
from operator import itemgetter
from typing import ClassVar, Literal

import numpy as np
import numpy.typing as npt

from pylog.groups.assignors.base import Assignment, Assignor, Subscription, subscribed_topics
from pylog.groups.assignors.topic_spread import fill, spread_topics, trim
from pylog.structs import TopicPartition

__all__ = [
    "GroupArrays",
    "StickyAssignor",
    "collector_paused",
    "current_owners",
    "sticky_assignment",
    "sticky_target",
]

_Ints = npt.NDArray[np.int64]
_new_tuple = tuple.__new__
# The general path builds one member's lists of a topic with a scan of the topic; from this many on, all.
_MEMBER_LISTS = 8
_NO_LISTS: dict[int, tuple[list[int], list[int]]] = {}


class StickyAssignor(Assignor):
    """Balanced assignment that keeps owned partitions where they are whenever balance allows."""

    name: ClassVar[str] = "sticky"
    protocol: ClassVar[Literal["eager", "cooperative"]] = "eager"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> Assignment:
        return sticky_assignment(partitions_per_topic, subscriptions)


def current_owners(
    partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
) -> dict[TopicPartition, str]:
    """The member that validly owns each partition now (step 1 of the module docstring).

    Partitions that nobody owns, whose claims tie at the highest generation, or whose winner no longer
    subscribes to the topic are absent.
    """
    group = GroupArrays(partitions_per_topic, subscriptions)
    owned = np.flatnonzero(group.owner >= 0)
    topics, numbers = group.topic_of[owned], owned - group.base[group.topic_of[owned]]
    return {
        TopicPartition(group.topics[t], p): group.members[m]
        for t, p, m in zip(topics.tolist(), numbers.tolist(), group.owner[owned].tolist(), strict=True)
    }


def sticky_assignment(
    partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
) -> Assignment:
    """The eager sticky assignment; see the module docstring for the algorithm."""
    with collector_paused():
        group, assignee = sticky_target(partitions_per_topic, subscriptions)
        return group.assignment(assignee)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector (if it runs) while an assignment is built.

    A large assignment creates a ``TopicPartition`` per partition, tracked tuples that cannot form cycles;
    the collections their creation would start cost about three times the creation itself (a million of
    them: 0.7 s instead of 0.2 s), and later ones walk them all again. Nothing built here forms a cycle, so
    nothing is left for the collector to find when it resumes.
    """
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def sticky_target(
    partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
) -> tuple[GroupArrays, _Ints]:
    """The group as arrays and the sticky assignment as the member number of each partition (for the
    cooperative assignor, which holds some of them back)."""
    group = GroupArrays(partitions_per_topic, subscriptions)
    if len(group.classes) <= 1:
        return group, _assign_uniform(group)
    return group, _assign_general(group)


class GroupArrays:
    """One call's input as arrays.

    Members are numbered in id order and topics (those some member subscribes to that have partitions) in name
    order, so every tie broken by the lower number is broken by the smaller id or name. Topic ``t``'s
    partition ``p`` has the number ``base[t] + p``; arrays indexed by partition number have one entry per
    partition of those topics. Members with the same subscribed topics form a *class*.
    """

    def __init__(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> None:
        self.members = sorted(subscriptions)
        existing: dict[frozenset[str], frozenset[str]] = {}
        classes: dict[frozenset[str], int] = {}
        class_of = []
        for member in self.members:
            subscription = subscriptions[member]
            if subscription.topics not in existing:
                existing[subscription.topics] = subscribed_topics(partitions_per_topic, subscription)
            class_of.append(classes.setdefault(existing[subscription.topics], len(classes)))
        #: the distinct subscribed topic sets, in the order of their first member
        self.classes = list(classes)
        self.class_of = np.array(class_of, dtype=np.int64)
        self.topics: list[str] = sorted(frozenset().union(*self.classes))
        self.tid = {topic: t for t, topic in enumerate(self.topics)}
        self.sizes = np.array([int(partitions_per_topic[t]) for t in self.topics], dtype=np.int64)
        self.base = np.zeros(len(self.topics) + 1, dtype=np.int64)
        np.cumsum(self.sizes, out=self.base[1:])
        self.total = int(self.base[-1])
        self.topic_of = np.repeat(np.arange(len(self.topics), dtype=np.int64), self.sizes)
        self.subscribed = np.zeros((len(self.classes), len(self.topics)), dtype=bool)
        for c, topics in enumerate(self.classes):
            self.subscribed[c, [self.tid[t] for t in topics]] = True
        self._read_claims(subscriptions)

    def _read_claims(self, subscriptions: Mapping[str, Subscription]) -> None:
        """Step 1 on arrays: ``owner`` (the valid owner of each partition, or -1), ``claims`` (how many members
        claim it) and ``claimant`` (one of them), and ``objects`` (a claimed ``TopicPartition`` to reuse)."""
        members, total = len(self.members), self.total
        owned = [subscriptions[member].owned for member in self.members]
        lengths = np.fromiter(map(len, owned), dtype=np.int64, count=members)
        flat = list(chain.from_iterable(owned))
        n = len(flat)
        topic = np.fromiter(map(self.tid.get, map(itemgetter(0), flat), repeat(-1)), dtype=np.int64, count=n)
        number = _partition_numbers(flat)
        member = np.repeat(np.arange(members, dtype=np.int64), lengths)
        generations = [subscriptions[m].generation for m in self.members]
        generation = np.repeat(np.array(generations, dtype=np.int64), lengths)
        size = self.sizes[np.maximum(topic, 0)] if self.topics else np.zeros(n, dtype=np.int64)
        index = np.flatnonzero((topic >= 0) & (number >= 0) & (number < size))
        partition = self.base[topic[index]] + number[index]
        self.claims = np.bincount(partition, minlength=total)
        contested = len(partition) > 0 and self.claims.max() > 1
        if contested:  # one claim per (partition, member): a member may list a partition twice
            _, first = np.unique(partition * max(members, 1) + member[index], return_index=True)
            index, partition = index[first], partition[first]
            self.claims = np.bincount(partition, minlength=total)
            contested = self.claims.max() > 1
        claimer, claim_generation = member[index], generation[index]
        self.claimant = np.full(total, -1, dtype=np.int64)
        self.claimant[partition] = claimer
        if not contested:  # each claim wins
            order = head = np.arange(len(partition))
            tied = np.zeros(len(partition), dtype=bool)
        else:  # the highest generation wins; a tie at the highest frees the partition
            order = np.lexsort((claimer, -claim_generation, partition))
            partition, claimer, claim_generation = partition[order], claimer[order], claim_generation[order]
            head = np.flatnonzero(np.diff(partition, prepend=-1) != 0)
            after = np.minimum(head + 1, len(partition) - 1)
            tied = (after != head) & (partition[after] == partition[head])
            tied &= claim_generation[after] == claim_generation[head]
        winner, won = claimer[head], partition[head]
        valid = ~tied & self.subscribed[self.class_of[winner], self.topic_of[won]]
        self.owner = np.full(total, -1, dtype=np.int64)
        self.owner[won[valid]] = winner[valid]
        self.objects = np.empty(total, dtype=object)
        self.have_object = np.zeros(total, dtype=bool)
        if n and set(map(type, flat)) == {TopicPartition}:
            claimed = np.fromiter(flat, dtype=object, count=n)[index[order][head]]
            self.objects[won], self.have_object[won] = claimed, True

    def assignment(self, assignee: _Ints) -> Assignment:
        """``assignee`` (a member number per partition, -1 for none) as member id -> sorted partitions."""
        assigned = np.flatnonzero(assignee >= 0)
        missing = assigned[~self.have_object[assigned]]
        if len(missing):
            bounds = np.searchsorted(missing, self.base)
            for t in np.flatnonzero(np.diff(bounds)).tolist():
                numbers = (missing[bounds[t] : bounds[t + 1]] - self.base[t]).tolist()
                pairs = zip(repeat(self.topics[t]), numbers)
                created = map(_new_tuple, repeat(TopicPartition), pairs)
                self.objects[missing[bounds[t] : bounds[t + 1]]] = np.fromiter(
                    created, dtype=object, count=len(numbers)
                )
            self.have_object[missing] = True
        holders = assignee[assigned]
        # Partition numbers follow (topic name, partition), so a stable sort by member leaves each list sorted.
        ordered = self.objects[assigned[np.argsort(holders, kind="stable")]]
        sizes = np.bincount(holders, minlength=len(self.members))
        flat, ends = ordered.tolist(), np.cumsum(sizes).tolist()
        return {
            m: flat[end - size : end] for m, size, end in zip(self.members, sizes.tolist(), ends, strict=True)
        }


def _partition_numbers(claims: list[TopicPartition]) -> _Ints:
    """The partition number of each claim; -1 (never valid) for one that is not a machine-sized int."""
    numbers = map(itemgetter(1), claims)
    try:
        return np.fromiter(numbers, dtype=np.int64, count=len(claims))
    except (TypeError, ValueError, OverflowError):
        return np.array(
            [p if type(p) is int and -(2**62) < p < 2**62 else -1 for p in map(itemgetter(1), claims)],
            dtype=np.int64,
        )


def _quotas(total: int, owned: _Ints) -> _Ints:
    """Step 2's totals: ``total // members`` each; the ``total % members`` larger quotas go first to members
    that own more than the smaller one (in id order), then to the others (in id order)."""
    low, extra = divmod(total, len(owned))
    quota = np.full(len(owned), low, dtype=np.int64)
    first = np.concatenate([np.flatnonzero(owned > low), np.flatnonzero(owned <= low)])
    quota[first[:extra]] += 1
    return quota


def _assign_uniform(group: GroupArrays) -> _Ints:
    """Step 2: exact quotas, keeping owned partitions up to them, each topic spread over the members.
    Returns the member number of each partition."""
    members, topics = len(group.members), len(group.topics)
    assignee = np.full(group.total, -1, dtype=np.int64)
    if members == 0 or group.total == 0:
        return assignee
    counts, owned = _uniform_counts(group)
    # Each member keeps its lowest-numbered owned partitions of each topic up to its count...
    partition = np.flatnonzero(group.owner >= 0)
    owner = group.owner[partition]
    by_member = np.argsort(owner, kind="stable")
    partition, owner = partition[by_member], owner[by_member]
    cell = owner * topics + group.topic_of[partition]
    starts = np.flatnonzero(np.diff(cell, prepend=-1) != 0)
    rank = np.arange(len(cell)) - np.repeat(starts, np.diff(np.append(starts, len(cell))))
    keep = np.minimum(counts, owned)
    kept = rank < keep.ravel()[cell]
    assignee[partition[kept]] = owner[kept]
    # ...and the free partitions of each topic, in order, go to the members in id order, each taking the
    # rest of its count.
    need = (counts - keep).T.ravel()
    assignee[assignee < 0] = np.repeat(np.tile(np.arange(members, dtype=np.int64), topics), need)
    return assignee


def _uniform_counts(group: GroupArrays) -> tuple[_Ints, _Ints]:
    """How many partitions of each topic each member gets (step 2 on counts), and how many it owns.

    A member that owns at least its quota keeps that many of its own (trimmed round the topics) and gets
    nothing new: its bounds are 0 and what it owns. Any other member keeps all it owns and gets the rest of its
    quota: its bounds are what it owns and the topic's size.
    """
    members, topics = len(group.members), len(group.topics)
    partition = np.flatnonzero(group.owner >= 0)
    cells = group.owner[partition] * topics + group.topic_of[partition]
    owned = np.bincount(cells, minlength=members * topics).reshape(members, topics)
    owned_total = owned.sum(axis=1)
    quota = _quotas(group.total, owned_total)
    counts = owned.copy()
    for member in np.flatnonzero(owned_total > quota).tolist():
        counts[member] = trim(owned[member], int(quota[member]), group.sizes, members)
    at_quota = (owned_total >= quota)[:, None]
    lower = np.where(at_quota, 0, owned)
    upper = np.where(at_quota, owned, group.sizes[None, :])
    fill(counts, quota - counts.sum(axis=1), group.sizes - counts.sum(axis=0))
    spread_topics(counts, lower, upper)
    return counts, owned


def _assign_general(group: GroupArrays) -> _Ints:
    """Step 3 of the module docstring, then step 4 within each class of members with the same topics."""
    general = _General(group)
    general.assign()
    for c, topics in enumerate(group.classes):
        members = np.flatnonzero(group.class_of == c)
        if len(members) > 1 and len(topics) > 1:
            _spread_class(group, general.holder, members, np.flatnonzero(group.subscribed[c]))
    return general.holder


def _spread_class(group: GroupArrays, holder: _Ints, members: _Ints, topics: _Ints) -> None:
    """Step 4 after step 3, for members with the same topics: swaps move only partitions the giver did not
    own, so every member keeps all of its own that it kept (its lower bound); ``holder`` is updated."""
    position = np.full(len(group.members), -1, dtype=np.int64)
    position[members] = np.arange(len(members))
    column = np.full(len(group.topics), -1, dtype=np.int64)
    column[topics] = np.arange(len(topics))
    in_class = (holder >= 0) & (position[holder] >= 0)
    partition = np.flatnonzero(in_class & (column[group.topic_of] >= 0))
    held_by = holder[partition]
    cells = position[held_by] * len(topics) + column[group.topic_of[partition]]
    shape = (len(members), len(topics))
    before = np.bincount(cells, minlength=len(members) * len(topics)).reshape(shape)
    stays = group.owner[partition] == held_by
    lower = np.bincount(cells[stays], minlength=len(members) * len(topics)).reshape(shape)
    counts = before.copy()
    spread_topics(counts, lower, np.broadcast_to(before.sum(axis=0), shape).copy())
    change = counts - before
    for j in np.flatnonzero(change.any(axis=0)).tolist():
        t = int(topics[j])
        _move(
            holder[group.base[t] : group.base[t + 1]],
            group.owner[group.base[t] : group.base[t + 1]],
            members,
            change[:, j],
        )


def _move(holder: _Ints, owner: _Ints, members: _Ints, change: _Ints) -> None:
    """Carry out the count ``change`` of each of ``members`` for one topic (``holder`` and ``owner`` are that
    topic's, ``holder`` a view that is updated): members that lose partitions give up their highest-numbered
    ones they did not own; members that gain take back one they owned, if any, else the lowest-numbered."""
    pool: list[int] = []
    for i in np.flatnonzero(change < 0).tolist():
        member = members[i]
        movable = np.flatnonzero((holder == member) & (owner != member))
        pool.extend(movable[int(change[i]) :].tolist())
    for i in np.flatnonzero(change > 0).tolist():
        member = int(members[i])
        for _ in range(int(change[i])):
            back = [p for p in pool if owner[p] == member]
            number = back[0] if back else min(pool)
            pool.remove(number)
            holder[number] = member


class _General:
    """The general path's working state: who holds each partition, and how many each member holds.

    ``holder`` is the member number of each partition (-1 while free). ``kept[t, m]`` counts the partitions of
    topic ``t`` member ``m`` owned before this call and still holds, ``given[t, m]`` those it was given during
    this call. A member gives away the partition of a topic it was given last, else (only when
    ``include_kept``: stage (b)) its highest-numbered kept one; the lists that order needs are built for a
    member and topic the first time a partition of the topic moves to or from the member (until then
    ``holder`` and ``is_given`` say it all: what :meth:`place_free` gave, in ascending order). ``include_kept``
    says whether owned partitions may move; stage (a) runs without, stage (b) with.
    """

    def __init__(self, group: GroupArrays) -> None:
        self.group = group
        members, topics = len(group.members), len(group.topics)
        subscribed = group.subscribed[group.class_of].T  # topic x member
        self.subscribed = subscribed
        self.subscribers = [np.flatnonzero(row) for row in subscribed]
        self._subscriber_lists: dict[int, list[int]] = {}
        # Topics with the fewest subscribers first: they have the least choice.
        self.topic_order = sorted(range(topics), key=lambda t: (len(self.subscribers[t]), t))
        self.rank = [0] * topics
        for i, t in enumerate(self.topic_order):
            self.rank[t] = i
        by_rank = [
            sorted(np.flatnonzero(row).tolist(), key=self.rank.__getitem__) for row in group.subscribed
        ]
        self.topics_of: list[list[int]] = [by_rank[c] for c in group.class_of.tolist()]
        topic_sets = [frozenset(topics) for topics in by_rank]
        self.topic_sets: list[frozenset[int]] = [topic_sets[c] for c in group.class_of.tolist()]
        self.with_topics = [m for m in range(members) if self.topics_of[m]]
        self.holder = group.owner.copy()
        self.is_given = np.zeros(group.total, dtype=bool)
        owned = np.flatnonzero(group.owner >= 0)
        cells = group.topic_of[owned] * members + group.owner[owned]
        self.kept = np.bincount(cells, minlength=topics * members).reshape(topics, members)
        self.given = np.zeros((topics, members), dtype=np.int64)
        self.count: list[int] = np.bincount(group.owner[owned], minlength=members).tolist()
        self.lists: dict[int, dict[int, tuple[list[int], list[int]]]] = {}  # topic -> member -> lists
        self.complete: set[int] = set()  # topics whose every member's lists are built
        self.include_kept = False
        self.moves = 0

    def assign(self) -> None:
        count = np.array(self.count, dtype=np.int64)
        for topic in self.topic_order:
            self.place_free(topic, count)
        self.count = count.tolist()
        for include_kept in (False, True):
            self.include_kept = include_kept
            # Three ways to remove cost-reducing paths, cheapest first; only the last one finds them all.
            self.even_out()
            _Descent(self).run()
            while (path := self.cost_reducing_path()) is not None:
                for donor, topic, receiver in path:
                    self.move(topic, donor, receiver)

    def subscriber_list(self, topic: int) -> list[int]:
        """The subscribers of ``topic`` as a list (built when first needed)."""
        if topic not in self._subscriber_lists:
            self._subscriber_lists[topic] = self.subscribers[topic].tolist()
        return self._subscriber_lists[topic]

    def can_give(self, topic: int, member: int) -> bool:
        """Whether ``member`` may give away a partition of ``topic`` now."""
        return bool(self.given[topic, member] > 0 or (self.include_kept and self.kept[topic, member] > 0))

    def movable(self) -> npt.NDArray[np.bool_]:
        """:meth:`can_give` for every topic and member."""
        movable = self.given > 0
        if self.include_kept:
            movable |= self.kept > 0
        return movable

    def move(self, topic: int, donor: int, receiver: int) -> None:
        given, kept = self.lists.get(topic, _NO_LISTS).get(donor) or self.member_lists(topic, donor)
        if self.given[topic, donor] > 0:
            partition = given.pop()
            self.given[topic, donor] -= 1
        else:
            partition = kept.pop()
            self.kept[topic, donor] -= 1
        (self.lists[topic].get(receiver) or self.member_lists(topic, receiver))[0].append(partition)
        self.given[topic, receiver] += 1
        self.holder[partition] = receiver
        if topic not in self.complete:  # keeps is_given true for lists still to be built
            self.is_given[partition] = True
        self.moves += 1
        self.count[donor] -= 1
        self.count[receiver] += 1

    def member_lists(self, topic: int, member: int) -> tuple[list[int], list[int]]:
        """The partitions of ``topic`` that ``member`` was given (in the order given) and those it kept
        (ascending). The first few members of a topic are looked up one by one (a scan of the topic's
        partitions each); from the ``_MEMBER_LISTS``-th on, every member's lists are built at once."""
        lists = self.lists.get(topic)
        if lists is None:
            lists = self.lists[topic] = {}
        else:
            found = lists.get(member)
            if found is not None:
                return found
        lo, hi = int(self.group.base[topic]), int(self.group.base[topic + 1])
        holder, is_given = self.holder[lo:hi], self.is_given[lo:hi]
        if topic in self.complete:
            found = lists[member] = ([], [])
        elif len(lists) < _MEMBER_LISTS:
            mine = holder == member
            found = lists[member] = (
                (np.flatnonzero(mine & is_given) + lo).tolist(),
                (np.flatnonzero(mine & ~is_given) + lo).tolist(),
            )
        else:  # members already listed keep their lists (their given ones are in the order given)
            given, kept = _grouped(holder, is_given, lo), _grouped(holder, ~is_given & (holder >= 0), lo)
            for m in given.keys() | kept.keys():
                lists.setdefault(m, (given.get(m, []), kept.get(m, [])))
            self.complete.add(topic)
            found = lists.setdefault(member, ([], []))
        return found

    def place_free(self, topic: int, count: _Ints) -> None:
        """Give each unowned partition of ``topic`` to its least-loaded subscriber (ties: lowest number).

        One at a time, the ``j``-th partition a subscriber ``m`` takes would come at the key
        ``(count[m] + j, m)``; so the free partitions, in order, go to the smallest keys in order: every key
        below a level ``L`` where fewer than the free partitions lie, and the rest at ``L`` by member number.
        """
        lo, hi = int(self.group.base[topic]), int(self.group.base[topic + 1])
        free = np.flatnonzero(self.holder[lo:hi] < 0) + lo
        subscribers = self.subscribers[topic]
        if not len(free):
            return
        load = count[subscribers]
        taken = _in_turn(load, len(free))
        self.holder[free] = subscribers[taken]
        self.is_given[free] = True
        per_member = np.bincount(taken, minlength=len(subscribers))
        count[subscribers] += per_member
        self.given[topic, subscribers] += per_member

    def even_out(self) -> None:
        """Bulk moves within each topic (in topic order), from its most loaded holder while that is above the
        group's average to its least loaded subscriber while that is below it.

        A topic moves nothing unless one of its subscribers is below the average and one of its holders that
        can give is above it; that is checked on arrays first, and once no member at all is on either side
        (the common case) the remaining topics are skipped: without moves nothing changes.
        """
        count = self.count
        total, members = sum(count), len(self.with_topics)
        low, high = total // members, -(-total // members)
        moves = -1
        for topic in self.topic_order:
            if moves != self.moves:
                moves = self.moves
                loads = np.array(count, dtype=np.int64)
                active = loads[self.with_topics]
                if active.min() >= low or active.max() <= high:
                    return
            subscribers = self.subscribers[topic]
            if loads[subscribers].min() >= low:
                continue
            movable = self.given[topic, subscribers] > 0
            if self.include_kept:
                movable |= self.kept[topic, subscribers] > 0
            if (movable & (loads[subscribers] > high)).any():
                self.even_out_topic(topic, low, high)

    def even_out_topic(self, topic: int, low: int, high: int) -> None:
        """:meth:`even_out` for one topic. Both heaps are lazy: an entry is stale once its member's count
        changed (a fresh entry was pushed then)."""
        count, subscribers = self.count, self.subscriber_list(topic)
        lightest = [(count[member], member) for member in subscribers]
        heaviest = [(-count[member], member) for member in subscribers]
        heapq.heapify(lightest)
        heapq.heapify(heaviest)
        while lightest and heaviest:
            load, receiver = lightest[0]
            if load != count[receiver]:
                heapq.heappop(lightest)
                continue
            minus_load, donor = heaviest[0]
            if -minus_load != count[donor] or not self.can_give(topic, donor):
                heapq.heappop(heaviest)
                continue
            if count[donor] <= high or count[receiver] >= low:
                return
            self.move(topic, donor, receiver)
            for member in (donor, receiver):
                heapq.heappush(lightest, (count[member], member))
                heapq.heappush(heaviest, (-count[member], member))

    def cost_reducing_path(self) -> list[tuple[int, int, int]] | None:
        """The steps ``(donor, topic, receiver)`` of a cost-reducing path, or None if there is none.

        Member ``u`` reaches member ``v`` in one step if ``u`` can give away a partition of a topic ``v``
        subscribes to. A path from ``u`` to a ``v`` with at least two fewer partitions, shifting one partition
        along each step, lowers ``u`` by one and raises ``v`` by one. First every member is labelled with the
        least-loaded member it reaches (a search backwards from the members in increasing load order, each
        node labelled once), then the path from the member with the largest gap is found by a forward search.
        Both searches visit every member and topic at most once.
        """
        count = self.count
        loads = [count[member] for member in self.with_topics]
        if not loads or max(loads) - min(loads) < 2:
            return None  # no member has two more than another
        ascending = sorted(self.with_topics, key=lambda member: (count[member], member))
        lowest: dict[int, int] = {}
        topics_seen: set[int] = set()
        for target in ascending:
            if target in lowest:
                continue
            lowest[target] = target
            queue = [target]
            for member in queue:  # grows while iterating: breadth-first
                for topic in self.topics_of[member]:
                    if topic in topics_seen:
                        continue
                    topics_seen.add(topic)
                    for holder in self.subscriber_list(topic):
                        if holder not in lowest and self.can_give(topic, holder):
                            lowest[holder] = target
                            queue.append(holder)
        start = max(reversed(ascending), key=lambda member: count[member] - count[lowest[member]])
        if count[start] - count[lowest[start]] < 2:
            return None
        return self.path(start, lowest[start])

    def path(self, start: int, target: int) -> list[tuple[int, int, int]]:
        """A shortest path of ``(donor, topic, receiver)`` steps from ``start`` to ``target``, reachable."""
        previous: dict[int, tuple[int, int]] = {}
        queue, topics_seen = [start], set()
        for member in queue:
            if member == target:
                break
            for topic in self.topics_of[member]:
                if topic in topics_seen or not self.can_give(topic, member):
                    continue
                topics_seen.add(topic)
                for receiver in self.subscriber_list(topic):
                    if receiver != start and receiver not in previous:
                        previous[receiver] = (member, topic)
                        queue.append(receiver)
        steps = []
        member = target
        while member != start:
            donor, topic = previous[member]
            steps.append((donor, topic, member))
            member = donor
        return steps[::-1]


def _grouped(holder: _Ints, selected: npt.NDArray[np.bool_], offset: int) -> dict[int, list[int]]:
    """member -> its ``selected`` partitions (numbered from ``offset``), ascending."""
    index = np.flatnonzero(selected)
    if not len(index):
        return {}
    who = holder[index]
    order = np.argsort(who, kind="stable")
    flat, who = (index[order] + offset).tolist(), who[order]
    starts = np.flatnonzero(np.diff(who, prepend=-1) != 0).tolist()
    return {int(who[a]): flat[a:b] for a, b in zip(starts, [*starts[1:], len(flat)], strict=True)}


def _in_turn(load: _Ints, n: int) -> _Ints:
    """Which of the members with ``load`` takes each of ``n`` partitions in turn, each going to the least
    loaded (ties: lowest index) and raising its load by one (see :meth:`_General.place_free`)."""

    def below(level: int) -> int:
        return int(np.maximum(level - load, 0).sum())

    lo = int(load.min())
    hi = lo + n + 1  # below(lo) == 0 <= n < below(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if below(mid) <= n:
            lo = mid
        else:
            hi = mid
    taken = np.maximum(lo - load, 0)
    taken[np.flatnonzero(load <= lo)[: n - int(taken.sum())]] += 1
    member = np.repeat(np.arange(len(load), dtype=np.int64), taken)
    level = np.repeat(load, taken) + np.arange(n) - np.repeat(np.cumsum(taken) - taken, taken)
    return member[np.lexsort((member, level))]


class _Descent:
    """Steepest descent over single moves: while some topic has a holder with at least two more partitions
    than one of its subscribers, move one partition across the largest such gap (most loaded holder -> least
    loaded subscriber; ties: lowest member number). Among topics with the same gap, the one whose receiver
    holds the fewest of it goes first, then topic order: a member that joins a group whose members all hold
    as many as balance allows gets one partition of each topic in turn, not all of its share from one topic.

    All heaps are lazy: a change of a member's count pushes fresh entries instead of updating old ones, and an
    entry whose value no longer matches is replaced when it reaches the top. So the heap of topics only needs
    a fresh entry when a topic's key may have *improved*: after a move of topic ``t`` from ``donor`` to
    ``receiver`` that is ``t`` itself, a topic whose lightest subscriber is now the donor (its least count
    fell), one whose heaviest holder is now the receiver (its largest count rose), and one whose lightest
    subscriber was the receiver (its receiver may now hold fewer of it); any other topic's key can only have
    got worse, and its old entry is corrected when it reaches the top. A move costs
    ``O(topics of the two members x log members)``, not a scan of the group. When no topic has such a gap
    (checked on arrays first) nothing is built.
    """

    def __init__(self, state: _General) -> None:
        self.state, self.count = state, state.count
        self.light: dict[int, list[tuple[int, int]]] = {}
        self.heavy: dict[int, list[tuple[int, int]]] = {}
        self.gaps: list[tuple[int, int, int, int]] = []
        self.live: dict[int, tuple[int, int, int, int]] = {}  # topic -> its entry in gaps; others are dropped

    def has_gap(self) -> bool:
        """Whether some topic's most loaded holder that can give has two more than its least loaded
        subscriber."""
        loads = [self.count[member] for member in self.state.with_topics]
        if not loads or max(loads) - min(loads) < 2:
            return False
        count = np.array(self.count, dtype=np.int64)
        movable = self.state.movable()
        most = np.where(movable, count, np.iinfo(np.int64).min).max(axis=1)
        least = np.where(self.state.subscribed, count, np.iinfo(np.int64).max).min(axis=1)
        return bool(((most - least)[movable.any(axis=1)] >= 2).any())

    def lightest(self, topic: int) -> int:
        heap = self.light[topic]
        while heap[0][0] != self.count[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0][1]

    def heaviest(self, topic: int) -> int | None:
        heap = self.heavy[topic]
        while heap and (-heap[0][0] != self.count[heap[0][1]] or not self.state.can_give(topic, heap[0][1])):
            heapq.heappop(heap)
        return heap[0][1] if heap else None

    def key(self, topic: int) -> tuple[int, int, int, int]:
        """The topic's entry in the heap of gaps: the largest gap first, then the fewest partitions of the
        topic at its receiver, then topic order."""
        donor = self.heaviest(topic)
        if donor is None:
            return (0, 0, self.state.rank[topic], topic)
        receiver = self.lightest(topic)
        gap = self.count[donor] - self.count[receiver]
        if gap < 2:
            return (-gap, 0, self.state.rank[topic], topic)
        held = int(self.state.given[topic, receiver]) + int(self.state.kept[topic, receiver])
        return (-gap, held, self.state.rank[topic], topic)

    def run(self) -> None:
        if not self.has_gap():
            return
        state = self.state
        for topic in range(len(state.subscribers)):
            members = state.subscriber_list(topic)
            self.light[topic] = [(self.count[m], m) for m in members]
            self.heavy[topic] = [(-self.count[m], m) for m in members]
            heapq.heapify(self.light[topic])
            heapq.heapify(self.heavy[topic])
        self.live = {topic: self.key(topic) for topic in state.topic_order}
        self.gaps = list(self.live.values())
        heapq.heapify(self.gaps)
        while self.gaps:
            topic = self.gaps[0][3]
            if self.gaps[0] != self.live[topic]:
                heapq.heappop(self.gaps)  # an entry pushed since replaced it
                continue
            key = self.key(topic)
            if key != self.gaps[0]:
                self.live[topic] = key  # stale: it only got worse since (see the class docstring)
                heapq.heapreplace(self.gaps, key)
                continue
            if -key[0] < 2:
                return  # the largest gap of any topic is at most 1
            donor, receiver = self.heaviest(topic), self.lightest(topic)
            if donor is None:  # pragma: no cover - a gap >= 2 has a donor
                return
            receiving = [other for other in state.topics_of[receiver] if self.lightest(other) == receiver]
            state.move(topic, donor, receiver)
            for member in (donor, receiver):
                for other in state.topics_of[member]:
                    heapq.heappush(self.light[other], (self.count[member], member))
                    heapq.heappush(self.heavy[other], (-self.count[member], member))
            self.rekey(topic, donor, receiver, receiving)

    def rekey(self, topic: int, donor: int, receiver: int, receiving: list[int]) -> None:
        """Push fresh entries for the topics whose key may have improved by the move of a partition of
        ``topic`` from ``donor`` to ``receiver`` (``receiving``: the topics whose lightest subscriber the
        receiver was before), as the class docstring lists them."""
        state, count = self.state, self.count
        improved = {topic}
        # The receiver's topics where it is no longer the lightest: their receiver changed.
        improved.update(other for other in receiving if self.lightest(other) != receiver)
        # The donor's topics where it is now the lightest (it cannot be below the receiver's count in a topic
        # the receiver subscribes to).
        receiver_topics = state.topic_sets[receiver]
        if count[donor] <= count[receiver]:
            improved.update(other for other in state.topics_of[donor] if self.lightest(other) == donor)
        else:
            improved.update(
                other
                for other in state.topics_of[donor]
                if other not in receiver_topics and self.lightest(other) == donor
            )
        # The receiver's topics where it is now the heaviest holder (only those where it can give).
        movable = state.given[:, receiver] > 0
        if state.include_kept:
            movable |= state.kept[:, receiver] > 0
        improved.update(
            other for other in np.flatnonzero(movable).tolist() if self.heaviest(other) == receiver
        )
        for other in improved:
            key = self.key(other)
            if key != self.live[other]:
                self.live[other] = key
                heapq.heappush(self.gaps, key)
