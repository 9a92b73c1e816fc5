"""Invariants of the partition assignors over random groups (after kafka-python's validity and balance check).

Groups have 1-20 members, 1-5 topics of 1-50 partitions, random (or identical) subscriptions, sometimes a
subscribed topic that does not exist, static members, and random prior ownership: overlapping claims from
different and equal generations, claims on unsubscribed topics and on partitions that no longer exist.

Rebalances (last section) start from a *valid* previous generation instead (nobody, random subscribers, one
subscriber per whole topic, or the sticky assignment of the previous members owns each partition), with members
leaving and joining: they check stickiness against a reference count and how each topic is spread.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from random import Random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pylog.groups.assignors import (
    ASSIGNORS,
    Assignment,
    Assignor,
    CooperativeStickyAssignor,
    RangeAssignor,
    RoundRobinAssignor,
    StickyAssignor,
    Subscription,
)
from pylog.groups.assignors.topic_spread import fill, spread_topics, trim
from pylog.structs import TopicPartition

SETTINGS = settings(max_examples=100, deadline=None)
MISSING_TOPIC = "gone"  # subscribed to by some members, absent from partitions_per_topic


@dataclass(frozen=True)
class Group:
    partitions_per_topic: dict[str, int]
    subscriptions: dict[str, Subscription]

    def with_subscriptions(self, subscriptions: dict[str, Subscription]) -> Group:
        return replace(self, subscriptions=subscriptions)

    def topic_partitions(self, topics: frozenset[str] | set[str]) -> set[TopicPartition]:
        return {
            TopicPartition(topic, p)
            for topic in topics
            if topic in self.partitions_per_topic
            for p in range(self.partitions_per_topic[topic])
        }

    def is_uniform(self) -> bool:
        return len({s.topics & set(self.partitions_per_topic) for s in self.subscriptions.values()}) <= 1


@st.composite
def groups(
    draw: st.DrawFn,
    *,
    uniform: bool = False,
    owned: bool = True,
    max_members: int = 20,
    max_topics: int = 5,
    max_partitions: int = 50,
) -> Group:
    """A random group; with ``uniform`` every member subscribes to the same (existing) topics."""
    topic_count = draw(st.integers(1, max_topics))
    partitions_per_topic = {f"t{i}": draw(st.integers(1, max_partitions)) for i in range(topic_count)}
    names = sorted(partitions_per_topic)
    member_ids = draw(
        st.lists(st.text("abcxyz", min_size=1, max_size=3), min_size=1, max_size=max_members, unique=True)
    )
    common = draw(st.frozensets(st.sampled_from(names), min_size=1))
    rng = draw(st.randoms(use_true_random=False))
    claimable = [TopicPartition(t, p) for t in names for p in range(partitions_per_topic[t])]
    claimable += [TopicPartition(names[0], 999), TopicPartition(MISSING_TOPIC, 0)]
    fair_share = len(claimable) // len(member_ids) + 2
    subscriptions = {}
    for member_id in member_ids:
        if uniform:
            topics = common | ({MISSING_TOPIC} if rng.random() < 0.2 else set())
        else:
            topics = frozenset(t for t in [*names, MISSING_TOPIC] if rng.random() < 0.6)
        claims = rng.sample(claimable, rng.randint(0, min(len(claimable), 2 * fair_share))) if owned else []
        instance_id = f"i-{rng.randint(0, 9)}" if rng.random() < 0.3 else None
        subscriptions[member_id] = Subscription(topics, tuple(claims), rng.randint(-1, 3), instance_id)
    return Group(partitions_per_topic, subscriptions)


# --- the invariants -----------------------------------------------------------------------------------------


def verify_validity(group: Group, assignment: Assignment, *, complete: bool) -> None:
    """Every member present, lists sorted, only subscribed existing partitions, none twice; with ``complete``
    (eager assignors) every partition of a subscribed topic is assigned."""
    assert set(assignment) == set(group.subscriptions)
    seen: Counter[TopicPartition] = Counter()
    for member_id, partitions in assignment.items():
        assert partitions == sorted(set(partitions)), "sorted, without duplicates"
        assert set(partitions) <= group.topic_partitions(group.subscriptions[member_id].topics)
        seen.update(partitions)
    assert all(n == 1 for n in seen.values()), "a partition assigned to two members"
    if complete:
        subscribed = set().union(*(s.topics for s in group.subscriptions.values()))
        assert set(seen) == group.topic_partitions(subscribed)


def verify_balance(group: Group, assignment: Assignment) -> None:
    """kafka-python's balance criterion: a member with 2+ more partitions than another holds no partition of a
    topic the other subscribes to (otherwise moving one would improve the balance)."""
    for member_id, partitions in assignment.items():
        for other_id, other in assignment.items():
            if len(partitions) > len(other) + 1:
                topics = {tp.topic for tp in partitions}
                assert not topics & group.subscriptions[other_id].topics, (member_id, other_id)


def verify_best_balance(group: Group, assignment: Assignment) -> None:
    """No cost-reducing path: no member reaches a member with 2+ fewer partitions through steps "holds a
    partition of a topic the next one subscribes to". By Harvey et al. (2003) the sum of squared counts is
    then minimal. This implies kafka-python's criterion (the one-step paths)."""
    counts = {m: len(parts) for m, parts in assignment.items()}
    held = {m: {tp.topic for tp in parts} for m, parts in assignment.items()}
    for start in assignment:
        reached, frontier = {start}, [start]
        while frontier:
            member = frontier.pop()
            for other, subscription in group.subscriptions.items():
                if other not in reached and held[member] & subscription.topics:
                    reached.add(other)
                    frontier.append(other)
        lightest = min(reached, key=counts.__getitem__)
        assert counts[start] <= counts[lightest] + 1, f"{start} could shift a partition to {lightest}"


def spread(counts: Mapping[str, int] | list[int]) -> int:
    values = list(counts.values()) if isinstance(counts, Mapping) else counts
    return max(values) - min(values) if values else 0


def next_generation(group: Group, assignment: Assignment) -> Group:
    """The group after every member took up ``assignment`` (what a member reports after a rebalance)."""
    generation = max(s.generation for s in group.subscriptions.values()) + 1
    return group.with_subscriptions(
        {
            m: replace(s, owned=tuple(assignment[m]), generation=generation)
            for m, s in group.subscriptions.items()
        }
    )


def verify_no_partition_taken_from_a_holder(group: Group, assignment: Assignment) -> None:
    """A partition new to a member must not be held (claimed in ``owned``) by any other member right now."""
    for member_id, partitions in assignment.items():
        for tp in set(partitions) - set(group.subscriptions[member_id].owned):
            holders = [m for m, s in group.subscriptions.items() if m != member_id and tp in s.owned]
            assert not holders, f"{tp} given to {member_id} while {holders} still hold it"


# --- properties ---------------------------------------------------------------------------------------------


@SETTINGS
@given(groups())
def test_every_assignor_is_valid_and_deterministic(group: Group) -> None:
    for cls in ASSIGNORS.values():
        assignor: Assignor = cls()
        result = assignor.assign(group.partitions_per_topic, group.subscriptions)
        verify_validity(group, result, complete=cls.protocol == "eager")
        reordered = dict(reversed(group.subscriptions.items()))
        assert assignor.assign(group.partitions_per_topic, reordered) == result


@SETTINGS
@given(groups(uniform=True))
def test_uniform_subscriptions_are_balanced(group: Group) -> None:
    ppt, subscriptions = group.partitions_per_topic, group.subscriptions
    for cls in ASSIGNORS.values():
        if cls.protocol != "eager":
            continue  # the cooperative result is balanced after its follow-up rebalance (tested below)
        result = cls().assign(ppt, subscriptions)
        verify_validity(group, result, complete=True)
        if cls is RangeAssignor:  # range balances each topic on its own
            for topic in ppt:
                per_topic = {m: sum(tp.topic == topic for tp in parts) for m, parts in result.items()}
                if topic in next(iter(subscriptions.values())).topics:
                    assert spread(per_topic) <= 1, topic
        else:
            assert spread({m: len(parts) for m, parts in result.items()}) <= 1, cls.name


@SETTINGS
@given(groups())
def test_sticky_is_balanced_for_any_subscriptions(group: Group) -> None:
    result = StickyAssignor().assign(group.partitions_per_topic, group.subscriptions)
    verify_validity(group, result, complete=True)
    verify_balance(group, result)
    verify_best_balance(group, result)


@settings(max_examples=100, deadline=None)
@given(groups(max_members=4, max_topics=3, max_partitions=5))
def test_sticky_balance_matches_brute_force_on_small_groups(group: Group) -> None:
    result = StickyAssignor().assign(group.partitions_per_topic, group.subscriptions)
    members = sorted(group.subscriptions)
    subscribed = set().union(*(s.topics for s in group.subscriptions.values()))
    # Every reachable vector of counts, by placing the partitions one at a time on any subscriber.
    states = {tuple(0 for _ in members)}
    for tp in sorted(group.topic_partitions(subscribed)):
        eligible = [i for i, m in enumerate(members) if tp.topic in group.subscriptions[m].topics]
        states = {(*state[:i], state[i] + 1, *state[i + 1 :]) for state in states for i in eligible}
    counts = [len(result[m]) for m in members]
    assert sum(c * c for c in counts) == min(sum(c * c for c in state) for state in states)
    assert max(counts) == min(max(state) for state in states)


@SETTINGS
@given(groups())
def test_sticky_keeps_a_balanced_assignment_as_it_is(group: Group) -> None:
    first = StickyAssignor().assign(group.partitions_per_topic, group.subscriptions)
    again = StickyAssignor().assign(group.partitions_per_topic, next_generation(group, first).subscriptions)
    assert again == first


@SETTINGS
@given(groups(uniform=True, owned=False), st.data())
def test_sticky_member_leaving_moves_only_its_partitions(group: Group, data: st.DataObject) -> None:
    ppt = group.partitions_per_topic
    before = StickyAssignor().assign(ppt, group.subscriptions)
    members = sorted(before)
    if len(members) < 2:
        return
    leaving = data.draw(st.sampled_from(members))
    survivors = next_generation(group, before).subscriptions
    del survivors[leaving]
    after = StickyAssignor().assign(ppt, survivors)
    verify_validity(group.with_subscriptions(survivors), after, complete=True)
    assert spread({m: len(p) for m, p in after.items()}) <= 1
    for member_id, partitions in after.items():
        assert set(before[member_id]) <= set(partitions), f"{member_id} lost a partition"
    moved = {tp for m, parts in after.items() for tp in parts if tp not in before[m]}
    assert moved == set(before[leaving])


@SETTINGS
@given(groups(uniform=True, owned=False), st.text("abcxyz", min_size=1, max_size=4))
def test_sticky_member_joining_moves_the_minimum(group: Group, newcomer: str) -> None:
    ppt = group.partitions_per_topic
    if newcomer in group.subscriptions:
        return
    before = StickyAssignor().assign(ppt, group.subscriptions)
    joined = next_generation(group, before).subscriptions
    joined[newcomer] = Subscription(next(iter(joined.values())).topics)
    after = StickyAssignor().assign(ppt, joined)
    verify_validity(group.with_subscriptions(joined), after, complete=True)
    assert spread({m: len(p) for m, p in after.items()}) <= 1
    moved = sum(len(set(before[m]) - set(after[m])) for m in before)
    # Fewest moves any balanced assignment allows: with P partitions over N members, each holds P // N or one
    # more, and exactly P % N hold one more, so member i keeps at most min(c_i, quota_i) of its c_i
    # partitions; the larger quota only helps members that hold more than P // N.
    total, members = sum(len(p) for p in before.values()), len(joined)
    low, extra = divmod(total, members)
    counts = [len(p) for p in before.values()]
    can_keep = sum(min(c, low) for c in counts) + min(extra, sum(c > low for c in counts))
    assert moved == total - can_keep
    assert len(after[newcomer]) == moved  # what moved went to the newcomer; nobody else gained
    for member_id in before:
        assert set(after[member_id]) <= set(before[member_id])


@SETTINGS
@given(groups())
def test_cooperative_converges_in_two_rebalances_without_double_ownership(group: Group) -> None:
    ppt = group.partitions_per_topic
    cooperative = CooperativeStickyAssignor()

    # Phase 1: the sticky target minus partitions another member must revoke first.
    target = StickyAssignor().assign(ppt, group.subscriptions)
    first = cooperative.assign(ppt, group.subscriptions)
    verify_validity(group, first, complete=False)
    verify_no_partition_taken_from_a_holder(group, first)
    for member_id, partitions in first.items():
        assert set(partitions) <= set(target[member_id])
        for tp in set(target[member_id]) - set(partitions):
            assert any(tp in s.owned for m, s in group.subscriptions.items() if m != member_id)

    # Phase 2: members revoked what phase 1 did not give them and took up the rest.
    after_first = next_generation(group, first)
    second = cooperative.assign(ppt, after_first.subscriptions)
    verify_no_partition_taken_from_a_holder(after_first, second)
    assert second == StickyAssignor().assign(ppt, after_first.subscriptions), "something still held back"
    verify_validity(group, second, complete=True)
    verify_best_balance(group, second)
    if group.is_uniform():
        assert spread({m: len(p) for m, p in second.items()}) <= 1

    # Converged: a third rebalance changes nothing.
    assert cooperative.assign(ppt, next_generation(after_first, second).subscriptions) == second


def test_generated_groups_cover_the_interesting_cases() -> None:
    """Guard the generator: it must produce contested claims, stale claims and different subscriptions."""
    seen: Counter[str] = Counter()

    @settings(max_examples=100, deadline=None)
    @given(groups())
    def sample(group: Group) -> None:
        claims = Counter(tp for s in group.subscriptions.values() for tp in s.owned)
        seen["contested"] += any(n > 1 for n in claims.values())
        seen["non-uniform"] += not group.is_uniform()
        seen["missing topic"] += any(MISSING_TOPIC in s.topics for s in group.subscriptions.values())
        seen["static"] += any(s.group_instance_id for s in group.subscriptions.values())

    sample()
    assert all(seen[key] > 0 for key in ("contested", "non-uniform", "missing topic", "static")), seen


# --- rebalances from a valid previous generation: per-topic spread and stickiness ---------------------------


@dataclass(frozen=True)
class Rebalance:
    """A group whose members took part in a valid previous generation (each partition owned at most once, by
    a subscriber), after some members left and others joined. ``owner`` is the previous owner of each
    partition, members that left included."""

    group: Group
    owner: dict[TopicPartition, str]

    @property
    def fresh(self) -> bool:
        return not any(s.owned for s in self.group.subscriptions.values())


PREVIOUS_OWNERSHIP = ["fresh", "random", "whole topics", "sticky"]


@st.composite
def rebalances(draw: st.DrawFn, *, uniform: bool) -> Rebalance:
    """2-10 members now, 1-5 topics of 1-30 partitions; the previous owners are nobody, random subscribers,
    one subscriber per whole topic, or the sticky assignment of the previous members."""
    partitions_per_topic = {f"t{i}": draw(st.integers(1, 30)) for i in range(draw(st.integers(1, 5)))}
    names = sorted(partitions_per_topic)
    rng = draw(st.randoms(use_true_random=False))
    common = frozenset(rng.sample(names, rng.randint(1, len(names))))

    def topics() -> frozenset[str]:
        if uniform:
            return common
        return frozenset(t for t in names if rng.random() < 0.6) or frozenset({rng.choice(names)})

    previous = {f"m{i}": topics() for i in range(draw(st.integers(1, 10)))}
    staying = [m for m in previous if rng.random() < 0.8]
    joining = draw(st.integers(max(0, 2 - len(staying)), min(3, 10 - len(staying))))
    owner = _previous_owners(draw(st.sampled_from(PREVIOUS_OWNERSHIP)), partitions_per_topic, previous, rng)
    owned: dict[str, list[TopicPartition]] = {m: [] for m in previous}
    for tp, member in sorted(owner.items()):
        owned[member].append(tp)
    subscriptions = {m: Subscription(previous[m], tuple(owned[m]), 1) for m in staying}
    subscriptions.update({f"n{i}": Subscription(topics()) for i in range(joining)})
    return Rebalance(Group(partitions_per_topic, subscriptions), owner)


def _previous_owners(
    how: str, partitions_per_topic: dict[str, int], previous: dict[str, frozenset[str]], rng: Random
) -> dict[TopicPartition, str]:
    subscribers = {t: [m for m in sorted(previous) if t in previous[m]] for t in partitions_per_topic}
    if how == "sticky":
        assignment = StickyAssignor().assign(
            partitions_per_topic, {m: Subscription(t) for m, t in previous.items()}
        )
        return {tp: m for m, parts in assignment.items() for tp in parts}
    owner = {}
    for topic, count in partitions_per_topic.items():
        whole = rng.choice(subscribers[topic]) if subscribers[topic] else None
        for p in range(count):
            if how == "random" and subscribers[topic] and rng.random() < 0.85:
                owner[TopicPartition(topic, p)] = rng.choice(subscribers[topic])
            elif how == "whole topics" and whole is not None:
                owner[TopicPartition(topic, p)] = whole
    return owner


def per_topic_counts(group: Group, assignment: Assignment) -> dict[str, Counter[str]]:
    return {m: Counter(tp.topic for tp in parts) for m, parts in assignment.items()}


def same_subscription_classes(group: Group) -> list[list[str]]:
    classes: dict[frozenset[str], list[str]] = {}
    for member, subscription in sorted(group.subscriptions.items()):
        classes.setdefault(subscription.topics & set(group.partitions_per_topic), []).append(member)
    return list(classes.values())


def stays(rebalance: Rebalance, assignment: Assignment) -> int:
    """Partitions assigned to their previous owner."""
    return sum(rebalance.owner.get(tp) == m for m, parts in assignment.items() for tp in parts)


def most_that_can_stay(rebalance: Rebalance) -> int:
    """Reference for identical subscriptions: with P partitions over N members each gets P // N or one more,
    and exactly P % N get one more, so member m keeps at most min(owned_m, its quota); the larger quotas only
    help members that own more than P // N."""
    group = rebalance.group
    owned = Counter(m for m in rebalance.owner.values() if m in group.subscriptions)
    total = len(group.topic_partitions(next(iter(group.subscriptions.values())).topics))
    low, extra = divmod(total, len(group.subscriptions))
    counts = [owned[m] for m in group.subscriptions]
    return sum(min(c, low) for c in counts) + min(extra, sum(c > low for c in counts))


def verify_no_swap_evens_out_topics(
    rebalance: Rebalance, assignment: Assignment, *, trade_kept: bool
) -> None:
    """No stickiness-neutral swap between two members with the same subscription evens out the topics.

    A swap gives a partition ``p`` of topic ``t`` from ``a`` to ``b`` and a partition ``q`` of another topic
    ``u`` from ``b`` to ``a``. It keeps both totals (so balance), and it evens out the topics (lowers the sum of
    squared per-topic counts) iff ``(c[a][t] - c[b][t]) + (c[b][u] - c[a][u]) >= 3``. It is neutral when it
    does not lower the number of partitions that stay with their previous owner. With ``trade_kept`` any
    neutral swap counts (a member may trade a partition it owned for another it owned); without, only swaps
    of partitions neither giver owned.
    """
    counts = per_topic_counts(rebalance.group, assignment)
    owner = rebalance.owner
    for members in same_subscription_classes(rebalance.group):
        for a, b in ((a, b) for a in members for b in members if a != b):
            for p, q in ((p, q) for p in assignment[a] for q in assignment[b] if p.topic != q.topic):
                gap = counts[a][p.topic] - counts[b][p.topic] + counts[b][q.topic] - counts[a][q.topic]
                if gap < 3:
                    continue
                before = (owner.get(p) == a) + (owner.get(q) == b)
                after = (owner.get(p) == b) + (owner.get(q) == a)
                neutral = after >= before if trade_kept else before == 0
                assert not neutral, f"swapping {p} of {a} for {q} of {b} evens out the topics"


def verify_fresh_topics_dealt(rebalance: Rebalance, assignment: Assignment) -> None:
    """Fresh assignment: among members with the same subscription each topic's counts differ by at most 1."""
    counts = per_topic_counts(rebalance.group, assignment)
    for members in same_subscription_classes(rebalance.group):
        for topic in rebalance.group.partitions_per_topic:
            assert spread([counts[m][topic] for m in members]) <= 1, (topic, {m: counts[m] for m in members})


REBALANCE_SETTINGS = settings(max_examples=60, deadline=None)


@REBALANCE_SETTINGS
@given(rebalances(uniform=True))
def test_sticky_rebalance_with_identical_subscriptions(rebalance: Rebalance) -> None:
    """Validity, total balance (max - min <= 1), the most stickiness any balanced assignment allows (the
    reference count above), and the per-topic spread.

    The per-topic invariant chosen: no stickiness-neutral swap evens out the topics. Balance fixes each
    member's total and stickiness how many of its owned partitions it keeps, not which; the swaps are the
    smallest changes that keep both, so an assignment one of them improves spreads a topic worse than
    stickiness requires. A fresh assignment has no owners, every swap is neutral, and the invariant implies
    that each topic's counts differ by at most 1: checked directly, and against the round-robin assignor, whose
    per-topic counts for identical subscriptions are the reference.
    """
    group = rebalance.group
    result = StickyAssignor().assign(group.partitions_per_topic, group.subscriptions)
    verify_validity(group, result, complete=True)
    assert spread({m: len(p) for m, p in result.items()}) <= 1
    assert stays(rebalance, result) == most_that_can_stay(rebalance)
    verify_no_swap_evens_out_topics(rebalance, result, trade_kept=True)
    if rebalance.fresh:
        verify_fresh_topics_dealt(rebalance, result)
        reference = RoundRobinAssignor().assign(group.partitions_per_topic, group.subscriptions)
        for topic in group.partitions_per_topic:
            ours, theirs = per_topic_counts(group, result), per_topic_counts(group, reference)
            assert sorted(c[topic] for c in ours.values()) == sorted(c[topic] for c in theirs.values())


@REBALANCE_SETTINGS
@given(rebalances(uniform=True))
def test_cooperative_rebalance_with_identical_subscriptions(rebalance: Rebalance) -> None:
    """The first rebalance revokes exactly what the sticky target moves; after the follow-up the assignment is
    valid, balanced, as sticky as possible, and no neutral swap evens out its topics."""
    group, ppt = rebalance.group, rebalance.group.partitions_per_topic
    cooperative = CooperativeStickyAssignor()
    target = StickyAssignor().assign(ppt, group.subscriptions)
    first = cooperative.assign(ppt, group.subscriptions)
    verify_no_partition_taken_from_a_holder(group, first)
    for member, subscription in group.subscriptions.items():
        assert set(subscription.owned) - set(first[member]) == set(subscription.owned) - set(target[member])
    after_first = next_generation(group, first)
    second = cooperative.assign(ppt, after_first.subscriptions)
    verify_no_partition_taken_from_a_holder(after_first, second)
    verify_validity(group, second, complete=True)
    assert spread({m: len(p) for m, p in second.items()}) <= 1
    assert stays(rebalance, second) == most_that_can_stay(rebalance)
    owners_now = {tp: m for m, parts in first.items() for tp in parts}
    verify_no_swap_evens_out_topics(Rebalance(after_first, owners_now), second, trade_kept=True)
    if rebalance.fresh:
        verify_fresh_topics_dealt(rebalance, second)


@REBALANCE_SETTINGS
@given(rebalances(uniform=False))
def test_sticky_rebalance_with_different_subscriptions(rebalance: Rebalance) -> None:
    """Validity and best balance; among members with the same subscription no swap of partitions that
    neither giver owned evens out the topics (moving them keeps every partition that stayed with its owner),
    and on a fresh assignment each topic's counts differ by at most 1 between such members."""
    group = rebalance.group
    result = StickyAssignor().assign(group.partitions_per_topic, group.subscriptions)
    verify_validity(group, result, complete=True)
    verify_best_balance(group, result)
    verify_no_swap_evens_out_topics(rebalance, result, trade_kept=False)
    if rebalance.fresh:
        verify_fresh_topics_dealt(rebalance, result)


# --- the per-topic counts of the sticky assignors, against one-at-a-time models ------------------------------


def model_trim(owned: list[int], keep: int, sizes: list[int], members: int) -> list[int]:
    """One partition at a time, from the topic most above its fair share (ties: lower topic number)."""
    counts = list(owned)
    for _ in range(sum(counts) - keep):
        topic = min(
            (t for t in range(len(counts)) if counts[t]), key=lambda t: (sizes[t] - counts[t] * members, t)
        )
        counts[topic] -= 1
    return counts


def model_fill(counts: list[list[int]], room: list[int], free: list[int]) -> list[list[int]]:
    """Topic by topic, one partition at a time, to the member with room holding the fewest of the topic, then
    the most room left, then the lowest number."""
    counts, left = [list(row) for row in counts], list(room)
    for topic, n in enumerate(free):
        for _ in range(n):
            member = min(
                (m for m in range(len(counts)) if left[m]), key=lambda m: (counts[m][topic], -left[m], m)
            )
            counts[member][topic] += 1
            left[member] -= 1
    return counts


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_trim_gives_up_what_one_at_a_time_would(data: st.DataObject) -> None:
    """trim computes the cut at once above a few partitions and pops a heap below: both equal the model."""
    topics = data.draw(st.integers(1, 8))
    members = data.draw(st.integers(1, 40))
    sizes = data.draw(st.lists(st.integers(1, 200), min_size=topics, max_size=topics))
    owned = [data.draw(st.integers(0, size)) for size in sizes]
    keep = data.draw(st.integers(0, sum(owned)))
    got = trim(np.array(owned), keep, np.array(sizes), members)
    assert got.tolist() == model_trim(owned, keep, sizes, members)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fill_deals_what_one_at_a_time_would(data: st.DataObject) -> None:
    members, topics = data.draw(st.integers(1, 12)), data.draw(st.integers(1, 6))
    counts = [[data.draw(st.integers(0, 5)) for _ in range(topics)] for _ in range(members)]
    free = [data.draw(st.integers(0, 30)) for _ in range(topics)]
    # rooms adding up to the free partitions
    cuts = sorted(data.draw(st.lists(st.integers(0, sum(free)), min_size=members - 1, max_size=members - 1)))
    room = [b - a for a, b in zip([0, *cuts], [*cuts, sum(free)], strict=True)]
    got = np.array(counts, dtype=np.int64).reshape(members, topics)
    fill(got, np.array(room), np.array(free))
    assert got.tolist() == model_fill(counts, room, free)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_spread_topics_leaves_no_improving_swap_within_the_bounds(data: st.DataObject) -> None:
    """After spread_topics, every member and topic total is unchanged, the bounds hold, and no swap within
    them lowers the sum of squared counts."""
    members, topics = data.draw(st.integers(1, 8)), data.draw(st.integers(1, 5))
    shape = (members, topics)
    counts = np.array(
        data.draw(st.lists(st.integers(0, 9), min_size=members * topics, max_size=members * topics))
    )
    counts = counts.reshape(shape)
    lower = np.minimum(
        counts,
        np.array(data.draw(st.lists(st.integers(0, 9), min_size=counts.size, max_size=counts.size))).reshape(
            shape
        ),
    )
    upper = np.maximum(
        counts,
        np.array(data.draw(st.lists(st.integers(0, 12), min_size=counts.size, max_size=counts.size))).reshape(
            shape
        ),
    )
    result = counts.copy()
    spread_topics(result, lower, upper)
    assert (result.sum(axis=0) == counts.sum(axis=0)).all() and (
        result.sum(axis=1) == counts.sum(axis=1)
    ).all()
    assert (lower <= result).all() and (result <= upper).all()
    for a in range(members):
        for b in range(members):
            for t in range(topics):
                for u in range(topics):
                    if a == b or t == u:
                        continue
                    allowed = result[a, t] > lower[a, t] and result[b, t] < upper[b, t]
                    allowed &= result[b, u] > lower[b, u] and result[a, u] < upper[a, u]
                    gap = result[a, t] - result[b, t] + result[b, u] - result[a, u]
                    assert not (allowed and gap >= 3), (a, b, t, u, result.tolist())
