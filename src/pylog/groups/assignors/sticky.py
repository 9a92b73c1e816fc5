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
   ``O(members + topics + subscriptions)``.
4. **Spread each topic** over members with the same topics: a member holding two more partitions of a topic
   than another with the same subscription hands one over in exchange for one of another topic (a *swap*),
   whenever the swap evens out the topics (it lowers the sum of squared per-topic counts). Swaps keep every
   member's total, so balance is unchanged, and they only ever move partitions that would not have stayed
   with their owner anyway: in step 2 a member that owns at least its quota may trade a kept partition for
   one of its own freed ones, any other member only partitions it did not own; in step 3 a member only
   trades partitions it did not own. The result: no such swap is left.

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

import heapq
from collections.abc import Mapping
from typing import ClassVar, Literal

from pylog.groups.assignors.base import Assignment, Assignor, Subscription, subscribed_topics
from pylog.groups.assignors.topic_spread import Counts, fill, spread_topics, trim
from pylog.structs import TopicPartition

__all__ = ["StickyAssignor", "current_owners", "sticky_assignment"]

# topic -> member id -> partition numbers the member holds in the assignment being built. The general path
# keeps two of these: the partitions a member owned before this call and still holds ("kept", sorted), and the
# ones it was given during this call ("given").
_Holdings = dict[str, dict[str, list[int]]]


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
    best: dict[TopicPartition, tuple[int, str | None]] = {}  # tp -> (generation, claimant or None if tied)
    for member_id, subscription in subscriptions.items():
        generation = subscription.generation
        for tp in set(subscription.owned):
            if not 0 <= tp.partition < partitions_per_topic.get(tp.topic, 0):
                continue
            claim = best.get(tp)
            if claim is None or generation > claim[0]:
                best[tp] = (generation, member_id)
            elif generation == claim[0] and claim[1] != member_id:
                best[tp] = (generation, None)
    return {
        tp: member_id
        for tp, (_, member_id) in best.items()
        if member_id is not None and tp.topic in subscriptions[member_id].topics
    }


def sticky_assignment(
    partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
) -> Assignment:
    """The eager sticky assignment; see the module docstring for the algorithm."""
    members = sorted(subscriptions)
    topics_of = {member: subscribed_topics(partitions_per_topic, subscriptions[member]) for member in members}
    owned: dict[str, list[TopicPartition]] = {member: [] for member in members}
    for tp, member in current_owners(partitions_per_topic, subscriptions).items():
        owned[member].append(tp)
    for partitions in owned.values():
        partitions.sort()
    if len(set(topics_of.values())) <= 1:
        topics = topics_of[members[0]] if members else frozenset()
        result = _assign_uniform(partitions_per_topic, topics, members, owned)
    else:
        result = _assign_general(partitions_per_topic, topics_of, owned)
    return {member: sorted(result[member]) for member in members}


def _by_topic(partitions: list[TopicPartition], topics: list[str]) -> dict[str, list[int]]:
    """Partition numbers per topic, in the order given."""
    numbers: dict[str, list[int]] = {topic: [] for topic in topics}
    for tp in partitions:
        numbers[tp.topic].append(tp.partition)
    return numbers


def _quotas(total: int, members: list[str], owned: Mapping[str, int]) -> dict[str, int]:
    """Step 2's totals: ``total // len(members)`` each; the ``total % len(members)`` larger quotas go first to
    members that own more than the smaller one (in id order), then to the others (in id order)."""
    min_quota, extra = divmod(total, len(members))
    quota = dict.fromkeys(members, min_quota)
    for member in [m for m in members if owned[m] > min_quota] + [
        m for m in members if owned[m] <= min_quota
    ]:
        if extra == 0:
            break
        quota[member] += 1
        extra -= 1
    return quota


def _assign_uniform(
    partitions_per_topic: Mapping[str, int],
    topics: frozenset[str],
    members: list[str],
    owned: Mapping[str, list[TopicPartition]],
) -> dict[str, list[TopicPartition]]:
    """Step 2: exact quotas, keeping owned partitions up to them, each topic spread over the members."""
    if not members:
        return {}
    names = sorted(topics)
    mine = {m: _by_topic(owned[m], names) for m in members}
    counts = _uniform_counts(partitions_per_topic, names, members, mine)
    result: dict[str, list[TopicPartition]] = {member: [] for member in members}
    for topic in names:
        kept = {m: mine[m][topic][: counts[m][topic]] for m in members}
        taken = {p for numbers in kept.values() for p in numbers}
        free = iter([p for p in range(partitions_per_topic[topic]) if p not in taken])
        for member in members:
            given = [next(free) for _ in range(counts[member][topic] - len(kept[member]))]
            result[member].extend(TopicPartition(topic, p) for p in kept[member] + given)
    return result


def _uniform_counts(
    partitions_per_topic: Mapping[str, int],
    topics: list[str],
    members: list[str],
    mine: Mapping[str, dict[str, list[int]]],
) -> Counts:
    """How many partitions of each topic each member gets (step 2 on counts).

    A member that owns at least its quota keeps that many of its own (trimmed round the topics) and gets
    nothing new: its bounds are 0 and what it owns. Any other member keeps all it owns and gets the rest of its
    quota: its bounds are what it owns and the topic's size.
    """
    owned = {m: {topic: len(mine[m][topic]) for topic in topics} for m in members}
    quota = _quotas(
        sum(partitions_per_topic[t] for t in topics), members, {m: sum(owned[m].values()) for m in members}
    )
    counts: Counts = {}
    lower: Counts = {}
    upper: Counts = {}
    for member in members:
        if sum(owned[member].values()) >= quota[member]:
            counts[member] = trim(owned[member], quota[member], partitions_per_topic, len(members))
            lower[member], upper[member] = dict.fromkeys(topics, 0), owned[member]
        else:
            counts[member] = dict(owned[member])
            lower[member], upper[member] = owned[member], {t: partitions_per_topic[t] for t in topics}
    free = {t: partitions_per_topic[t] - sum(row[t] for row in counts.values()) for t in topics}
    fill(counts, {m: quota[m] - sum(counts[m].values()) for m in members}, free)
    spread_topics(counts, lower, upper)
    return counts


def _assign_general(
    partitions_per_topic: Mapping[str, int],
    topics_of: Mapping[str, frozenset[str]],
    owned: Mapping[str, list[TopicPartition]],
) -> dict[str, list[TopicPartition]]:
    """Step 3 of the module docstring, then step 4 within each group of members with the same topics."""
    result = _General(partitions_per_topic, topics_of, owned).assign()
    classes: dict[frozenset[str], list[str]] = {}
    for member in sorted(topics_of):
        classes.setdefault(topics_of[member], []).append(member)
    for topics, members in classes.items():
        if len(members) > 1 and len(topics) > 1:
            _spread_class(sorted(topics), members, owned, result)
    return result


def _spread_class(
    topics: list[str],
    members: list[str],
    owned: Mapping[str, list[TopicPartition]],
    result: dict[str, list[TopicPartition]],
) -> None:
    """Step 4 after step 3, for members with the same topics: swaps move only partitions the giver did not
    own, so every member keeps all of its own that it kept (its lower bound); ``result`` is updated."""
    held = {m: _by_topic(sorted(result[m]), topics) for m in members}
    previous = {tp: m for m in members for tp in owned[m]}
    before = {m: {t: len(held[m][t]) for t in topics} for m in members}
    lower = {
        m: {t: sum(previous.get(TopicPartition(t, p)) == m for p in held[m][t]) for t in topics}
        for m in members
    }
    everything = {t: sum(before[m][t] for m in members) for t in topics}
    counts = {m: dict(row) for m, row in before.items()}
    spread_topics(counts, lower, {m: dict(everything) for m in members})
    for topic in topics:
        owner = {tp.partition: m for tp, m in previous.items() if tp.topic == topic}
        _move(topic, {m: counts[m][topic] - before[m][topic] for m in members}, held, owner)
    for member in members:
        result[member] = [TopicPartition(t, p) for t in topics for p in held[member][t]]


def _move(
    topic: str, change: Mapping[str, int], held: dict[str, dict[str, list[int]]], owner: Mapping[int, str]
) -> None:
    """Carry out the count ``change`` of each member for ``topic``: members that lose partitions give up their
    highest-numbered ones they did not own; members that gain take back one they owned, if any, else the
    lowest-numbered."""
    pool: list[int] = []
    for member, delta in change.items():
        if delta < 0:
            movable = [p for p in held[member][topic] if owner.get(p) != member]
            for number in movable[delta:]:
                held[member][topic].remove(number)
                pool.append(number)
    for member, delta in change.items():
        for _ in range(max(delta, 0)):
            back = [p for p in pool if owner.get(p) == member]
            number = back[0] if back else min(pool)
            pool.remove(number)
            held[member][topic].append(number)


class _General:
    """The general path's working state: who holds what (owned and kept vs given now) and how many.

    ``include_kept`` says whether owned partitions may move; stage (a) runs without, stage (b) with.
    """

    def __init__(
        self,
        partitions_per_topic: Mapping[str, int],
        topics_of: Mapping[str, frozenset[str]],
        owned: Mapping[str, list[TopicPartition]],
    ) -> None:
        self.partitions_per_topic = partitions_per_topic
        self.subscribers: dict[str, list[str]] = {}  # topic -> its subscribers, sorted
        for member in sorted(topics_of):
            for topic in topics_of[member]:
                self.subscribers.setdefault(topic, []).append(member)
        # Topics with the fewest subscribers first: they have the least choice.
        self.topic_order = sorted(self.subscribers, key=lambda topic: (len(self.subscribers[topic]), topic))
        self.rank = {topic: i for i, topic in enumerate(self.topic_order)}
        self.topics_of = {
            member: sorted(topics, key=self.rank.__getitem__)
            for member, topics in topics_of.items()
            if topics
        }
        self.kept: _Holdings = {t: {m: [] for m in members} for t, members in self.subscribers.items()}
        self.given: _Holdings = {t: {m: [] for m in members} for t, members in self.subscribers.items()}
        for member, partitions in owned.items():
            for tp in partitions:  # sorted, so every kept list is sorted
                self.kept[tp.topic][member].append(tp.partition)
        self.count = {member: len(partitions) for member, partitions in owned.items()}
        self.include_kept = False

    def assign(self) -> dict[str, list[TopicPartition]]:
        for topic in self.topic_order:
            self.place_free(topic)
        for include_kept in (False, True):
            self.include_kept = include_kept
            # Three ways to remove cost-reducing paths, cheapest first; only the last one finds them all.
            for topic in self.topic_order:
                self.even_out_topic(topic)
            _Descent(self).run()
            while (path := self.cost_reducing_path()) is not None:
                for donor, topic, receiver in path:
                    self.move(topic, donor, receiver)
        result: dict[str, list[TopicPartition]] = {member: [] for member in self.count}
        for topic, members in self.subscribers.items():
            for member in members:
                numbers = self.kept[topic][member] + self.given[topic][member]
                result[member].extend(TopicPartition(topic, p) for p in numbers)
        return result

    def source(self, topic: str, member: str) -> list[int] | None:
        """The list ``member`` gives partitions of ``topic`` away from (given ones first), or None."""
        given = self.given[topic][member]
        if given:
            return given
        kept = self.kept[topic][member]
        return kept if kept and self.include_kept else None

    def move(self, topic: str, donor: str, receiver: str) -> None:
        source = self.source(topic, donor)
        assert source is not None
        self.given[topic][receiver].append(source.pop())
        self.count[donor] -= 1
        self.count[receiver] += 1

    def place_free(self, topic: str) -> None:
        """Give each unowned partition of ``topic`` to its least-loaded subscriber (ties: lowest id)."""
        taken = {p for numbers in self.kept[topic].values() for p in numbers}
        lightest = [(self.count[member], member) for member in self.subscribers[topic]]
        heapq.heapify(lightest)
        for partition in range(self.partitions_per_topic[topic]):
            if partition not in taken:
                load, member = heapq.heappop(lightest)
                self.given[topic][member].append(partition)
                self.count[member] = load + 1
                heapq.heappush(lightest, (load + 1, member))

    def even_out_topic(self, topic: str) -> None:
        """Bulk moves within one topic, from its most loaded holder while that is above the group's average to
        its least loaded subscriber while that is below it. Both heaps are lazy: an entry is stale once its
        member's count changed (a fresh entry was pushed then)."""
        total, members = sum(self.count.values()), len(self.topics_of)
        low, high = total // members, -(-total // members)
        lightest = [(self.count[member], member) for member in self.subscribers[topic]]
        heaviest = [(-self.count[member], member) for member in self.subscribers[topic]]
        heapq.heapify(lightest)
        heapq.heapify(heaviest)
        while lightest and heaviest:
            load, receiver = lightest[0]
            if load != self.count[receiver]:
                heapq.heappop(lightest)
                continue
            minus_load, donor = heaviest[0]
            if -minus_load != self.count[donor] or self.source(topic, donor) is None:
                heapq.heappop(heaviest)
                continue
            if self.count[donor] <= high or self.count[receiver] >= low:
                return
            self.move(topic, donor, receiver)
            for member in (donor, receiver):
                heapq.heappush(lightest, (self.count[member], member))
                heapq.heappush(heaviest, (-self.count[member], member))

    def cost_reducing_path(self) -> list[tuple[str, str, str]] | None:
        """The steps ``(donor, topic, receiver)`` of a cost-reducing path, or None if there is none.

        Member ``u`` reaches member ``v`` in one step if ``u`` can give away a partition of a topic ``v``
        subscribes to. A path from ``u`` to a ``v`` with at least two fewer partitions, shifting one partition
        along each step, lowers ``u`` by one and raises ``v`` by one. First every member is labelled with the
        least-loaded member it reaches (a search backwards from the members in increasing load order, each
        node labelled once), then the path from the member with the largest gap is found by a forward search.
        Both searches visit every member and topic at most once.
        """
        count = self.count
        ascending = sorted(self.topics_of, key=lambda member: (count[member], member))
        lowest: dict[str, str] = {}
        topics_seen: set[str] = set()
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
                    for holder in self.subscribers[topic]:
                        if holder not in lowest and self.source(topic, holder) is not None:
                            lowest[holder] = target
                            queue.append(holder)
        start = max(reversed(ascending), key=lambda member: count[member] - count[lowest[member]])
        if count[start] - count[lowest[start]] < 2:
            return None
        return self.path(start, lowest[start])

    def path(self, start: str, target: str) -> list[tuple[str, str, str]]:
        """A shortest path of ``(donor, topic, receiver)`` steps from ``start`` to ``target``, reachable."""
        previous: dict[str, tuple[str, str]] = {}
        queue, topics_seen = [start], set()
        for member in queue:
            if member == target:
                break
            for topic in self.topics_of[member]:
                if topic in topics_seen or self.source(topic, member) is None:
                    continue
                topics_seen.add(topic)
                for receiver in self.subscribers[topic]:
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


class _Descent:
    """Steepest descent over single moves: while some topic has a holder with at least two more partitions
    than one of its subscribers, move one partition across the largest such gap (most loaded holder -> least
    loaded subscriber; ties: topic order, then lowest member id).

    All heaps are lazy: a change of a member's count pushes fresh entries instead of updating old ones, and an
    entry whose value no longer matches is dropped when it reaches the top. A move costs
    ``O(topics of the two members x log members)``, not a scan of the group.
    """

    def __init__(self, state: _General) -> None:
        self.state, self.count = state, state.count
        subscribers = state.subscribers
        # topic -> (load, member) of its subscribers / (-load, member) of its holders
        self.light = {t: [(self.count[m], m) for m in members] for t, members in subscribers.items()}
        self.heavy = {t: [(-self.count[m], m) for m in members] for t, members in subscribers.items()}
        for heap in (*self.light.values(), *self.heavy.values()):
            heapq.heapify(heap)
        self.gaps = [(-self.gap(topic), state.rank[topic], topic) for topic in state.topic_order]
        heapq.heapify(self.gaps)

    def lightest(self, topic: str) -> str:
        heap = self.light[topic]
        while heap[0][0] != self.count[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0][1]

    def heaviest(self, topic: str) -> str | None:
        heap = self.heavy[topic]
        while heap and (
            -heap[0][0] != self.count[heap[0][1]] or self.state.source(topic, heap[0][1]) is None
        ):
            heapq.heappop(heap)
        return heap[0][1] if heap else None

    def gap(self, topic: str) -> int:
        donor = self.heaviest(topic)
        return 0 if donor is None else self.count[donor] - self.count[self.lightest(topic)]

    def run(self) -> None:
        while self.gaps:
            stored, _, topic = self.gaps[0]
            gap = self.gap(topic)
            if -stored != gap:
                heapq.heappop(self.gaps)  # stale: a fresher entry for this topic is in the heap
                continue
            if gap < 2:
                return  # the largest gap of any topic is at most 1
            donor, receiver = self.heaviest(topic), self.lightest(topic)
            assert donor is not None
            self.state.move(topic, donor, receiver)
            touched = set()
            for member in (donor, receiver):
                for other in self.state.topics_of[member]:
                    heapq.heappush(self.light[other], (self.count[member], member))
                    heapq.heappush(self.heavy[other], (-self.count[member], member))
                    touched.add(other)
            for other in touched:
                heapq.heappush(self.gaps, (-self.gap(other), self.state.rank[other], other))
