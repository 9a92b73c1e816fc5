"""The sticky assignors at the size of Kafka's own large-assignment tests.

Kafka's ``AbstractStickyAssignorTest.testLargeAssignmentAndGroupWithUniformSubscription`` and
``testLargeAssignmentAndGroupWithNonEqualSubscription`` (run for ``StickyAssignor`` and
``CooperativeStickyAssignor``; the cases here are their variants without racks) build 500 topics
``t000``..``t499`` of 2,000 partitions each (a million partitions) and 2,000 consumers ``c0000``..``c1999``
subscribed to every topic, except that in the non-equal test the last consumer subscribes to ``t000`` only.
They assign once, then give every consumer but the first (the loop starts at 1) its assignment as owned
partitions with generation 1, and assign again. Kafka times the test out after 30 s (uniform) and 90 s
(non-equal); the goal here is 10 s for the same work (both assignments and the subscriptions rebuilt between
them), on the benchmark machine.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.cases import Goal, case
from benchmarks.cases.workload import result

__all__: list[str] = []

TOPICS, PARTITIONS, MEMBERS = 500, 2_000, 2_000


def _names(prefix: str, count: int) -> list[str]:
    """Kafka's ``getCanonicalName``: the prefix and the number, zero-padded to the digits of ``count``."""
    return [f"{prefix}{i:0{len(str(count))}d}" for i in range(count)]


def _large_assignment(assignor_name: str, *, non_equal: bool) -> dict[str, Any]:
    from pylog.groups.assignors import Subscription, get_assignor

    topics = _names("t", TOPICS)
    members = _names("c", MEMBERS)
    partitions_per_topic = dict.fromkeys(topics, PARTITIONS)

    def topics_of(i: int) -> frozenset[str]:
        return frozenset(topics[:1] if non_equal and i == MEMBERS - 1 else topics)

    assignor = get_assignor(assignor_name)
    t0 = time.perf_counter()
    subscriptions = {member: Subscription(topics_of(i)) for i, member in enumerate(members)}
    first = assignor.assign(partitions_per_topic, subscriptions)
    t1 = time.perf_counter()
    for i, member in enumerate(members[1:], start=1):
        subscriptions[member] = Subscription(topics_of(i), owned=tuple(first[member]), generation=1)
    t2 = time.perf_counter()
    second = assignor.assign(partitions_per_topic, subscriptions)
    seconds = time.perf_counter() - t0
    total = TOPICS * PARTITIONS
    for assignment in (first, second):  # untimed: every partition once, counts balanced
        sizes = [len(parts) for parts in assignment.values()]
        if sum(sizes) != total or len({tp for parts in assignment.values() for tp in parts}) != total:
            raise RuntimeError(
                f"{assignor_name}: {sum(sizes):,} partitions assigned, not {total:,} once each"
            )
        if max(sizes) - min(sizes) > 1:
            raise RuntimeError(f"{assignor_name}: member counts from {min(sizes)} to {max(sizes)}")
    return result(
        total,
        seconds,
        nbytes=0,
        total_s=round(seconds, 2),
        first_assign_s=round(t1 - t0, 2),
        second_assign_s=round(seconds - (t2 - t0), 2),
    )


for _assignor in ("sticky", "cooperative-sticky"):
    for _non_equal, _kafka_test, _kafka_timeout in (
        (True, "testLargeAssignmentAndGroupWithNonEqualSubscription", 90),
        (False, "testLargeAssignmentAndGroupWithUniformSubscription", 30),
    ):

        def _fn(
            records: int, seed: int, workdir: Path, name: str = _assignor, non_equal: bool = _non_equal
        ) -> dict[str, Any]:
            return _large_assignment(name, non_equal=non_equal)

        case(
            f"pylog_assign_large_{_assignor.replace('-', '_')}_{'nonequal' if _non_equal else 'uniform'}",
            group="assignors",
            kind="pylog",
            fsync="none (in memory)",
            description=(
                f"Kafka's `{_kafka_test}` (no racks; Kafka's timeout {_kafka_timeout} s) with the "
                f"`{_assignor}` assignor: 2,000 members, 500 topics x 2,000 partitions"
                + (", the last member subscribed to the first topic only" if _non_equal else "")
                + "; timed: assign, every member but the first reports its partitions as owned, assign again "
                "(`records` = partitions; --records is ignored)"
            ),
            goal=Goal("total_s", "<=", 10, "s"),
            timeout_s=900.0,
        )(_fn)
