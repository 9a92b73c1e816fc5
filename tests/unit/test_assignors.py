"""Worked cases for the partition assignors, most of them from Kafka's javadoc and ``*AssignorTest`` classes.

The invariants over random groups live in ``tests/property/test_assignor_properties.py``.
"""

from __future__ import annotations

import doctest
import gc
import importlib
import os
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

import pylog.groups.assignors as assignors_package
from pylog.errors import ConfigError
from pylog.groups.assignors import (
    ASSIGNORS,
    DEFAULT_ASSIGNOR,
    Assignment,
    Assignor,
    CooperativeStickyAssignor,
    RangeAssignor,
    RoundRobinAssignor,
    StickyAssignor,
    Subscription,
    format_assignment,
    get_assignor,
)
from pylog.structs import TopicPartition


def tps(spec: str) -> list[TopicPartition]:
    """``"t0-0 t0-1 t1-2"`` -> partitions, in the order given."""
    items = [item.rpartition("-") for item in spec.split()]
    return [TopicPartition(topic, int(number)) for topic, _, number in items]


def sub(*topics: str, owned: str = "", generation: int = -1, instance: str | None = None) -> Subscription:
    return Subscription(frozenset(topics), tuple(tps(owned)), generation, instance)


def show(assignment: Assignment) -> dict[str, str]:
    return {
        member: " ".join(f"{tp.topic}-{tp.partition}" for tp in parts) for member, parts in assignment.items()
    }


ALL_ASSIGNORS = [RangeAssignor, RoundRobinAssignor, StickyAssignor, CooperativeStickyAssignor]


# --- range --------------------------------------------------------------------------------------------------


def test_range_kafka_javadoc_example() -> None:
    members = {"C0": sub("t0", "t1"), "C1": sub("t0", "t1")}
    result = RangeAssignor().assign({"t0": 3, "t1": 3}, members)
    assert show(result) == {"C0": "t0-0 t0-1 t1-0 t1-1", "C1": "t0-2 t1-2"}


def test_range_uneven_split_gives_first_members_one_extra() -> None:
    members = {name: sub("t") for name in ("c", "a", "b")}
    result = RangeAssignor().assign({"t": 8}, members)
    assert show(result) == {"a": "t-0 t-1 t-2", "b": "t-3 t-4 t-5", "c": "t-6 t-7"}


def test_range_more_members_than_partitions() -> None:
    members = {name: sub("t") for name in ("a", "b", "c")}
    assert show(RangeAssignor().assign({"t": 2}, members)) == {"a": "t-0", "b": "t-1", "c": ""}


def test_range_only_counts_the_topic_subscribers() -> None:
    members = {"a": sub("t0"), "b": sub("t0", "t1"), "c": sub("t1")}
    result = RangeAssignor().assign({"t0": 3, "t1": 2}, members)
    assert show(result) == {"a": "t0-0 t0-1", "b": "t0-2 t1-0", "c": "t1-1"}


def test_range_orders_static_members_first_by_instance_id() -> None:
    # Kafka's MemberInfo.compareTo: members with a group.instance.id first, by it; then the rest by member id.
    members = {
        "a": sub("t"),
        "b": sub("t", instance="zz"),
        "c": sub("t", instance="aa"),
    }
    result = RangeAssignor().assign({"t": 3}, members)
    assert show(result) == {"a": "t-2", "b": "t-1", "c": "t-0"}


# --- roundrobin ---------------------------------------------------------------------------------------------


def test_roundrobin_kafka_javadoc_example() -> None:
    members = {"C0": sub("t0", "t1"), "C1": sub("t0", "t1")}
    result = RoundRobinAssignor().assign({"t0": 3, "t1": 3}, members)
    assert show(result) == {"C0": "t0-0 t0-2 t1-1", "C1": "t0-1 t1-0 t1-2"}


def test_roundrobin_kafka_javadoc_example_with_different_subscriptions() -> None:
    members = {"C0": sub("t0"), "C1": sub("t0", "t1"), "C2": sub("t0", "t1", "t2")}
    result = RoundRobinAssignor().assign({"t0": 1, "t1": 2, "t2": 3}, members)
    assert show(result) == {"C0": "t0-0", "C1": "t1-0", "C2": "t1-1 t2-0 t2-1 t2-2"}


def test_roundrobin_orders_static_members_first() -> None:
    members = {"a": sub("t"), "b": sub("t", instance="x")}
    assert show(RoundRobinAssignor().assign({"t": 3}, members)) == {"a": "t-1", "b": "t-0 t-2"}


# --- contract shared by all ---------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL_ASSIGNORS)
def test_every_member_gets_an_entry_and_missing_topics_are_ignored(cls: type[Assignor]) -> None:
    members = {"a": sub("t0", "gone"), "b": sub("gone"), "c": sub()}
    result = cls().assign({"t0": 2, "empty": 0}, members)
    assert list(result) == ["a", "b", "c"]
    assert show(result) == {"a": "t0-0 t0-1", "b": "", "c": ""}


@pytest.mark.parametrize("cls", ALL_ASSIGNORS)
def test_no_members_gives_an_empty_assignment(cls: type[Assignor]) -> None:
    assert cls().assign({"t0": 4}, {}) == {}


@pytest.mark.parametrize("cls", ALL_ASSIGNORS)
def test_result_does_not_depend_on_input_order(cls: type[Assignor]) -> None:
    members = {
        f"m{i}": sub(*(["t0", "t1", "t2"][: 1 + i % 3]), owned=f"t0-{i} t1-{i}", generation=i % 2)
        for i in range(7)
    }
    topics = {"t0": 9, "t1": 7, "t2": 5}
    forward = cls().assign(topics, members)
    backward = cls().assign(dict(reversed(topics.items())), dict(reversed(members.items())))
    assert forward == backward
    assert all(parts == sorted(parts) for parts in forward.values())


SRC = str(Path(assignors_package.__file__).parents[3])  # .../src, so the child process imports this pylog
HASH_SEED_SCRIPT = """
from pylog.groups.assignors import ASSIGNORS, Subscription
from pylog.structs import TopicPartition
topics = {"orders": 7, "payments": 5, "audit": 3}
members = {
    f"consumer-{i}": Subscription(
        topics=frozenset(list(topics)[: 1 + i % 3]),
        owned=(TopicPartition("orders", i),),
        generation=i % 2,
        group_instance_id=f"id-{i % 2}" if i % 3 else None,
    )
    for i in range(6)
}
print([cls().assign(topics, members) for cls in ASSIGNORS.values()])
"""


def test_results_do_not_depend_on_the_string_hash_seed() -> None:
    # Frozensets of topic names iterate in hash order, which changes from process to process.
    outputs = set()
    for seed in ("1", "2", "3"):
        env = {
            **os.environ,
            "PYTHONHASHSEED": seed,
            "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
        run = subprocess.run(
            [sys.executable, "-c", HASH_SEED_SCRIPT], env=env, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        outputs.add(run.stdout)
    assert len(outputs) == 1


@pytest.mark.parametrize("cls", ALL_ASSIGNORS)
def test_100_members_1000_partitions_assign_every_partition_once(cls: type[Assignor]) -> None:
    """The group-size case of the scale benchmarks (whose time is measured in benchmarks/, not here): every
    partition goes to exactly one member subscribed to its topic, uniform and skewed subscriptions alike."""
    topics = {f"t{i}": 100 for i in range(10)}
    members = [f"member-{i:03d}" for i in range(100)]
    uniform = {m: Subscription(frozenset(topics)) for m in members}
    # Worst case for the sticky general path: one member owns everything, subscriptions differ slightly.
    everything = tuple(TopicPartition(t, p) for t in topics for p in range(100))
    skewed = {
        m: Subscription(frozenset(topics) - {f"t{i % 10}"}, everything if i == 0 else (), 1)
        for i, m in enumerate(members)
    }
    for subscriptions in (uniform, skewed):
        assignment = cls().assign(topics, subscriptions)
        owned = [(tp, m) for m, tps in assignment.items() for tp in tps]
        assert len({tp for tp, _ in owned}) == len(owned)  # none twice
        assert all(tp.topic in subscriptions[m].topics for tp, m in owned)
        missing = set(everything) - {tp for tp, _ in owned}
        if cls.name == "cooperative-sticky":  # withholds, for one generation, what another member must revoke
            assert missing <= {tp for sub in subscriptions.values() for tp in sub.owned}
        else:
            assert not missing


# --- sticky -------------------------------------------------------------------------------------------------


def test_sticky_fresh_group_is_balanced() -> None:
    members = {name: sub("t0", "t1") for name in ("C0", "C1", "C2")}
    result = StickyAssignor().assign({"t0": 4, "t1": 3}, members)
    assert sorted(len(parts) for parts in result.values()) == [2, 2, 3]


def test_sticky_keeps_balanced_ownership_unchanged() -> None:
    members = {
        "C0": sub("t0", "t1", owned="t0-2 t1-0", generation=3),
        "C1": sub("t0", "t1", owned="t0-0 t1-2", generation=3),
        "C2": sub("t0", "t1", owned="t0-1 t1-1", generation=3),
    }
    result = StickyAssignor().assign({"t0": 3, "t1": 3}, members)
    assert show(result) == {"C0": "t0-2 t1-0", "C1": "t0-0 t1-2", "C2": "t0-1 t1-1"}


def test_sticky_member_leaving_only_moves_its_partitions() -> None:
    # Kafka's testAddRemoveConsumerOneTopic, the remove half.
    members = {
        "C1": sub("t", owned="t-1 t-3", generation=1),
        "C2": sub("t", owned="t-4 t-5", generation=1),
    }
    result = StickyAssignor().assign({"t": 6}, members)
    assert set(tps("t-1 t-3")) <= set(result["C1"])
    assert set(tps("t-4 t-5")) <= set(result["C2"])
    assert sorted(len(parts) for parts in result.values()) == [3, 3]


def test_sticky_member_joining_takes_the_minimum() -> None:
    members = {"C0": sub("t", owned="t-0 t-1 t-2 t-3 t-4 t-5", generation=2), "C1": sub("t")}
    result = StickyAssignor().assign({"t": 6}, members)
    assert show(result) == {"C0": "t-0 t-1 t-2", "C1": "t-3 t-4 t-5"}


def test_sticky_higher_generation_wins_a_contested_partition() -> None:
    members = {
        "C0": sub("t", owned="t-0", generation=1),  # stale: C1 took t-0 in generation 2
        "C1": sub("t", owned="t-0", generation=2),
    }
    result = StickyAssignor().assign({"t": 2}, members)
    assert show(result) == {"C0": "t-1", "C1": "t-0"}


def test_sticky_same_generation_claims_cancel_out() -> None:
    # Tied claims on t-2 free it: it is placed like any free partition, not kept by either claimant.
    members = {
        "C0": sub("t", owned="t-2", generation=4),
        "C1": sub("t", owned="t-2", generation=4),
        "C2": sub("t"),
    }
    assert show(StickyAssignor().assign({"t": 3}, members)) == {"C0": "t-0", "C1": "t-1", "C2": "t-2"}
    # Only the contested partition is freed: C0 keeps t-1, the fresh t-0 goes to C1.
    members = {"C0": sub("t", owned="t-0 t-1", generation=4), "C1": sub("t", owned="t-0", generation=4)}
    assert show(StickyAssignor().assign({"t": 2}, members)) == {"C0": "t-1", "C1": "t-0"}


def test_sticky_frees_partitions_of_unsubscribed_topics_and_vanished_partitions() -> None:
    members = {
        "C0": sub("t1", owned="t0-0 t0-1 t1-0 t1-9", generation=1),  # left t0; t1-9 no longer exists
        "C1": sub("t0", "t1", owned="", generation=1),
    }
    result = StickyAssignor().assign({"t0": 2, "t1": 2}, members)
    # Only C1 may take t0; the free t1-1 goes to the less loaded C0.
    assert show(result) == {"C0": "t1-0 t1-1", "C1": "t0-0 t0-1"}


def test_sticky_general_path_balances_and_keeps_ownership() -> None:
    # Kafka's testPoorRoundRobinAssignmentScenario shape: different subscriptions, balanced by moves.
    members = {
        "C0": sub("t0", "t1", owned="t0-0 t0-1 t0-2 t0-3 t1-0 t1-1", generation=1),
        "C1": sub("t1"),
        "C2": sub("t0"),
    }
    result = StickyAssignor().assign({"t0": 4, "t1": 2}, members)
    assert sorted(len(parts) for parts in result.values()) == [2, 2, 2]
    assert set(result["C0"]) <= set(members["C0"].owned)
    assert [tp.topic for tp in result["C1"]] == ["t1", "t1"]


def test_sticky_general_path_shifts_along_a_chain_when_no_single_move_helps() -> None:
    # After C0 hands one t0 partition to C1 the counts are C0=2, C1=1, C2=3: no single move helps (C2 holds
    # only t1, which C1 does not take). Shifting C2 -> C0 (a t1 partition) and C0 -> C1 (a t0 partition) gives
    # 2, 2, 2.
    members = {"C0": sub("t0", "t1", owned="t0-0 t0-1", generation=1), "C1": sub("t0"), "C2": sub("t1")}
    result = StickyAssignor().assign({"t0": 2, "t1": 4}, members)
    assert show(result)["C1"] == "t0-0 t0-1"
    assert sorted(len(parts) for parts in result.values()) == [2, 2, 2]


def per_topic(assignment: Assignment, topics: dict[str, int]) -> dict[str, dict[str, int]]:
    """member -> topic -> how many of the topic's partitions the member got."""
    return {m: {t: sum(tp.topic == t for tp in parts) for t in topics} for m, parts in assignment.items()}


def everything(topics: dict[str, int], *only: str) -> str:
    """All partitions of ``topics`` (or of the ``only`` ones), in the notation of :func:`tps`."""
    return " ".join(f"{t}-{p}" for t in (only or topics) for p in range(topics[t]))


def topic_spreads(assignment: Assignment, topics: dict[str, int]) -> dict[str, int]:
    counts = per_topic(assignment, topics)
    return {
        t: max(row[t] for row in counts.values()) - min(row[t] for row in counts.values()) for t in topics
    }


STICKY_ASSIGNORS = [StickyAssignor, CooperativeStickyAssignor]


def settle(cls: type[Assignor], topics: dict[str, int], members: dict[str, Subscription]) -> Assignment:
    """Rebalance until the assignment stops changing (one rebalance for sticky, two for cooperative)."""
    result = cls().assign(topics, members)
    for generation in range(2, 5):
        members = {m: replace(s, owned=tuple(result[m]), generation=generation) for m, s in members.items()}
        again = cls().assign(topics, members)
        if again == result:
            return result
        result = again
    raise AssertionError(f"{cls.name} did not settle")


@pytest.mark.parametrize("cls", STICKY_ASSIGNORS)
def test_sticky_joining_member_gets_half_of_each_topic_not_a_whole_topic(cls: type[Assignor]) -> None:
    # consumer1 owns both topics; trimming it to its quota keeps half of each, not all of topic1.
    topics = {"topic1": 12, "topic2": 12}
    members = {"consumer1": sub(*topics, owned=everything(topics), generation=1), "consumer2": sub(*topics)}
    first = cls().assign(topics, members)
    assert per_topic(first, topics)["consumer1"] == {"topic1": 6, "topic2": 6}
    result = settle(cls, topics, members)
    assert per_topic(result, topics) == {m: {"topic1": 6, "topic2": 6} for m in members}
    assert set(result["consumer1"]) == set(first["consumer1"])  # only the revoked half moved


@pytest.mark.parametrize("cls", STICKY_ASSIGNORS)
@pytest.mark.parametrize("sizes", [(12, 12), (13, 7), (5, 9, 10)])
def test_sticky_two_members_join_an_owner_of_everything(cls: type[Assignor], sizes: tuple[int, ...]) -> None:
    topics = {f"topic{i + 1}": n for i, n in enumerate(sizes)}
    members = {
        "consumer1": sub(*topics, owned=everything(topics), generation=1),
        "consumer2": sub(*topics),
        "consumer3": sub(*topics),
    }
    result = settle(cls, topics, members)
    low, extra = divmod(sum(sizes), 3)
    assert sorted(len(parts) for parts in result.values()) == [low] * (3 - extra) + [low + 1] * extra
    assert len(result["consumer1"]) == low + (extra > 0)  # it kept all it could
    assert all(spread <= 1 for spread in topic_spreads(result, topics).values()), per_topic(result, topics)


@pytest.mark.parametrize("cls", STICKY_ASSIGNORS)
@pytest.mark.parametrize(("sizes", "names"), [((4, 4), "AB"), ((13, 7), "ABC"), ((1, 3, 8, 2), "ABCDE")])
def test_sticky_fresh_assignment_deals_every_topic_over_the_members(
    cls: type[Assignor], sizes: tuple[int, ...], names: str
) -> None:
    topics = {f"t{i}": n for i, n in enumerate(sizes)}
    result = cls().assign(topics, {name: sub(*topics) for name in names})
    assert sorted(tp for parts in result.values() for tp in parts) == tps(everything(topics))
    assert all(spread <= 1 for spread in topic_spreads(result, topics).values()), per_topic(result, topics)


def numbered(topic: str, numbers: range) -> str:
    return " ".join(f"{topic}-{p}" for p in numbers)


@pytest.mark.parametrize("cls", STICKY_ASSIGNORS)
def test_sticky_spreads_topics_of_different_sizes_by_their_share(cls: type[Assignor]) -> None:
    # Quotas are 8. C1 owns only big partitions, so it keeps 8 of them. C0 and C2 share the other 12 big and
    # the 4 small ones: 6 and 2 each. C0 keeps only partitions it owned.
    topics = {"big": 20, "small": 4}
    members = {
        "C0": sub(
            *topics, owned=numbered("big", range(10)) + " " + numbered("small", range(4)), generation=1
        ),
        "C1": sub(*topics, owned=numbered("big", range(10, 20)), generation=1),
        "C2": sub(*topics),
    }
    result = settle(cls, topics, members)
    assert per_topic(result, topics) == {
        "C0": {"big": 6, "small": 2},
        "C1": {"big": 8, "small": 0},
        "C2": {"big": 6, "small": 2},
    }
    for member in ("C0", "C1"):
        assert set(result[member]) <= set(members[member].owned)


def test_sticky_member_joining_takes_owned_partitions_of_each_topic_in_turn() -> None:
    # Different subscriptions (C3 reads only a), so the general path: every member holds what balance allows,
    # and the partitions C4 needs must leave their owners one at a time. They come from b and c in turn, not
    # all from b (which left C0 without b and C4 with three).
    topics = {"a": 6, "b": 6, "c": 6}
    members = {m: sub("a", "b", "c") for m in ("C0", "C1", "C2")} | {"C3": sub("a")}
    first = StickyAssignor().assign(topics, members)
    assert show(first) == {
        "C0": "a-4 b-0 b-3 c-0 c-3",
        "C1": "a-5 b-1 b-4 c-1 c-4",
        "C2": "b-2 b-5 c-2 c-5",
        "C3": "a-0 a-1 a-2 a-3",
    }
    joined = {m: replace(s, owned=tuple(first[m]), generation=1) for m, s in members.items()}
    joined["C4"] = sub("a", "b", "c")
    result = StickyAssignor().assign(topics, joined)
    assert sorted(len(parts) for parts in result.values()) == [3, 3, 4, 4, 4]
    assert all(set(result[m]) <= set(first[m]) for m in first)
    same_topics = {m: parts for m, parts in result.items() if m != "C3"}
    assert all(spread <= 1 for spread in topic_spreads(same_topics, topics).values()), per_topic(
        result, topics
    )


def test_sticky_members_with_the_same_topics_share_each_topic() -> None:
    # Different subscriptions (the general path). C0 and C3 subscribe to the same three topics and get 5
    # partitions each; between them each topic splits as evenly as it can, instead of C0 taking 3 of t0 and
    # none of t1 while C3 takes 2 of t1.
    topics = {"t0": 7, "t1": 7, "t2": 6}
    members = {
        "C0": sub("t0", "t1", "t2"),
        "C1": sub("t0", "t2"),
        "C2": sub("t1"),
        "C3": sub("t0", "t1", "t2"),
    }
    result = StickyAssignor().assign(topics, members)
    assert sorted(len(parts) for parts in result.values()) == [5, 5, 5, 5]
    counts = per_topic(result, topics)
    assert all(abs(counts["C0"][t] - counts["C3"][t]) <= 1 for t in topics), counts


# --- large groups ------------------------------------------------------------------------------------------


def kafka_large_group(
    topics: int, partitions: int, members: int, *, non_equal: bool
) -> tuple[dict[str, int], dict[str, Subscription]]:
    """The shape of Kafka's ``testLargeAssignmentAndGroupWith{Uniform,NonEqual}Subscription`` (whose full size,
    500 topics of 2,000 partitions and 2,000 members, is a benchmark case): every member subscribes to every
    topic, except, with ``non_equal``, the last one, which subscribes to the first topic only."""
    names = [f"t{i:03d}" for i in range(topics)]
    only_first = frozenset(names[:1])
    return {t: partitions for t in names}, {
        f"c{i:04d}": Subscription(only_first if non_equal and i == members - 1 else frozenset(names))
        for i in range(members)
    }


def worst_topic_spread(assignment: Assignment, subscriptions: dict[str, Subscription]) -> int:
    """The largest difference, over topics, between two members with the same topics in how many partitions
    of the topic they hold."""
    classes: dict[frozenset[str], list[str]] = {}
    for member, subscription in subscriptions.items():
        classes.setdefault(subscription.topics, []).append(member)
    worst = 0
    for topics, members in classes.items():
        counts = [Counter(tp.topic for tp in assignment[m]) for m in members]
        for topic in topics:
            worst = max(worst, max(c[topic] for c in counts) - min(c[topic] for c in counts))
    return worst


def verify_complete_and_balanced(
    ppt: dict[str, int], subscriptions: dict[str, Subscription], result: Assignment
) -> None:
    assert set(result) == set(subscriptions)
    held = [(tp, m) for m, parts in result.items() for tp in parts]
    assert sorted(tp for tp, _ in held) == [TopicPartition(t, p) for t in sorted(ppt) for p in range(ppt[t])]
    assert all(tp.topic in subscriptions[m].topics for tp, m in held)
    assert all(parts == sorted(parts) for parts in result.values())
    sizes = [len(parts) for parts in result.values()]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("cls", STICKY_ASSIGNORS)
@pytest.mark.parametrize("non_equal", [False, True], ids=["uniform", "non-equal"])
def test_sticky_large_group_spreads_every_topic(cls: type[Assignor], non_equal: bool) -> None:
    """Kafka's large-assignment scenario at 1/170 of its partitions (40 topics of 150 partitions, 120
    members): the fresh assignment deals every topic over the members with the same topics (counts differ by
    at most 1); Kafka's second rebalance (every member but the first reports what it owns) gives the same
    assignment back; a member leaving moves only its partitions and keeps every topic dealt; a member joining
    takes partitions only from the others and gets at most 2 of any topic (never a whole topic's share of
    the group)."""
    ppt, subscriptions = kafka_large_group(40, 150, 120, non_equal=non_equal)
    fresh = cls().assign(ppt, subscriptions)
    verify_complete_and_balanced(ppt, subscriptions, fresh)
    assert worst_topic_spread(fresh, subscriptions) <= 1
    owning = {m: replace(s, owned=tuple(fresh[m]), generation=1) for m, s in subscriptions.items()}
    kafka_second = {**owning, "c0000": subscriptions["c0000"]}
    assert cls().assign(ppt, kafka_second) == fresh

    left = {m: s for m, s in owning.items() if m != "c0005"}
    after_leave = settle(cls, ppt, left)
    verify_complete_and_balanced(ppt, left, after_leave)
    assert worst_topic_spread(after_leave, left) <= 1
    moved = {tp for m, parts in after_leave.items() for tp in parts if tp not in fresh[m]}
    assert moved == set(fresh["c0005"])

    joined = {**owning, "c9999": Subscription(frozenset(ppt))}
    after_join = settle(cls, ppt, joined)
    verify_complete_and_balanced(ppt, joined, after_join)
    assert all(set(after_join[m]) <= set(fresh[m]) for m in owning)  # only the newcomer gained
    assert max(Counter(tp.topic for tp in after_join["c9999"]).values()) <= 2


def test_assignment_holds_topic_partitions_whatever_the_claims_were() -> None:
    """Claims given as plain tuples, or with partition numbers beyond any machine integer, are read like
    ``TopicPartition`` claims (the latter never valid); the result holds ``TopicPartition`` objects."""
    members = {
        "C0": Subscription(frozenset({"t"}), (("t", 0), ("t", 1)), 1),  # type: ignore[arg-type]
        "C1": Subscription(frozenset({"t"}), (TopicPartition("t", 2**70), TopicPartition("t", 2)), 1),
    }
    for cls in STICKY_ASSIGNORS:
        result = cls().assign({"t": 4}, members)
        assert show(result) == {"C0": "t-0 t-1", "C1": "t-2 t-3"}
        assert all(type(tp) is TopicPartition for parts in result.values() for tp in parts)


@pytest.mark.parametrize("enabled", [True, False])
def test_sticky_assignors_leave_the_garbage_collector_as_they_found_it(enabled: bool) -> None:
    members = {m: sub("t0", "t1") for m in ("C0", "C1")}
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        for cls in STICKY_ASSIGNORS:
            cls().assign({"t0": 3, "t1": 2}, members)
            assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


# --- cooperative-sticky -------------------------------------------------------------------------------------


def test_cooperative_holds_back_partitions_owned_by_others_until_the_follow_up() -> None:
    topics = {"t0": 3, "t1": 3}
    before = {
        "C0": sub("t0", "t1", owned="t0-0 t0-1 t0-2 t1-0 t1-1 t1-2", generation=1),
        "C1": sub("t0", "t1"),
    }
    target = StickyAssignor().assign(topics, before)
    first = CooperativeStickyAssignor().assign(topics, before)
    assert first["C0"] == target["C0"]  # C0 keeps its half at once
    assert first["C1"] == []  # C1's half is still owned by C0, which revokes it first
    after = {m: Subscription(frozenset(topics), tuple(first[m]), 2) for m in before}
    second = CooperativeStickyAssignor().assign(topics, after)
    assert second == target
    assert set(second["C0"]) | set(second["C1"]) == {TopicPartition(t, p) for t in topics for p in range(3)}


def test_cooperative_only_holds_back_what_moves() -> None:
    # C2 joins a group of two; C0 gives up one partition, C1 keeps all of its own.
    members = {
        "C0": sub("t", owned="t-0 t-1 t-2 t-3", generation=5),
        "C1": sub("t", owned="t-4 t-5", generation=5),
        "C2": sub("t"),
    }
    eager = StickyAssignor().assign({"t": 6}, members)
    coop = CooperativeStickyAssignor().assign({"t": 6}, members)
    assert show(eager) == {"C0": "t-0 t-1", "C1": "t-4 t-5", "C2": "t-2 t-3"}
    assert show(coop) == {"C0": "t-0 t-1", "C1": "t-4 t-5", "C2": ""}


def test_cooperative_gives_unowned_partitions_at_once() -> None:
    members = {"C0": sub("t", owned="t-0", generation=1), "C1": sub("t")}
    assert show(CooperativeStickyAssignor().assign({"t": 4}, members)) == {"C0": "t-0 t-1", "C1": "t-2 t-3"}


def test_cooperative_holds_back_a_partition_freed_by_an_unsubscribing_owner() -> None:
    members = {"C0": sub("t1", owned="t0-0 t1-0", generation=1), "C1": sub("t0", "t1")}
    first = CooperativeStickyAssignor().assign({"t0": 1, "t1": 1}, members)
    assert show(first) == {"C0": "t1-0", "C1": ""}  # C0 still holds t0-0 until it revokes it


def test_cooperative_stale_claim_does_not_block_the_valid_owner() -> None:
    members = {"C0": sub("t", owned="t-0", generation=1), "C1": sub("t", owned="t-0 t-1", generation=2)}
    result = CooperativeStickyAssignor().assign({"t": 2}, members)
    # C1's generation-2 claim wins t-0, but C1 must give one partition to C0: t-1 moves (via a revocation).
    assert show(StickyAssignor().assign({"t": 2}, members)) == {"C0": "t-1", "C1": "t-0"}
    assert show(result) == {"C0": "", "C1": "t-0"}


# --- registry -----------------------------------------------------------------------------------------------


def test_registry_names_and_protocols() -> None:
    assert {name: cls.protocol for name, cls in ASSIGNORS.items()} == {
        "range": "eager",
        "roundrobin": "eager",
        "sticky": "eager",
        "cooperative-sticky": "cooperative",
    }
    for name, cls in ASSIGNORS.items():
        assignor = get_assignor(name)
        assert type(assignor) is cls and assignor.name == name


def test_default_assignor_is_cooperative_sticky() -> None:
    assert DEFAULT_ASSIGNOR == "cooperative-sticky"
    assert isinstance(get_assignor(DEFAULT_ASSIGNOR), CooperativeStickyAssignor)


def test_unknown_assignor_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        get_assignor("RoundRobin")
    message = str(info.value)
    assert "'RoundRobin'" in message
    for name in ASSIGNORS:
        assert name in message
    assert isinstance(info.value, ValueError)


def test_format_assignment() -> None:
    text = format_assignment({"b": [], "a": tps("t-1 t-0")})
    assert text == "a: t-0, t-1\nb: (none)"


# --- doctests -----------------------------------------------------------------------------------------------

DOCUMENTED = ["", ".base", ".range", ".roundrobin", ".sticky", ".cooperative_sticky", ".topic_spread"]


@pytest.mark.parametrize("suffix", DOCUMENTED)
def test_worked_examples_in_docstrings_run(suffix: str) -> None:
    module: ModuleType = importlib.import_module("pylog.groups.assignors" + suffix)
    failed, attempted = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert attempted > 0, f"{module.__name__} has no doctest"
    assert failed == 0
