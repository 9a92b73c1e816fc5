"""Kafka's ``RoundRobinAssignor``: deal every partition like cards.

All partitions of all subscribed topics are sorted (by topic, then partition) and dealt one by one to the
members in a circle (static members by ``group_instance_id`` first, then the rest by member id, as Kafka's
``MemberInfo`` sorts). A member that does not subscribe to a partition's topic is skipped for that partition,
and the circle moves on past it. With identical subscriptions the counts differ by at most one; with different
subscriptions the result can be unbalanced, as in Kafka.

Worked example: two members, topics ``t0`` and ``t1`` with three partitions each (Kafka's javadoc example).

>>> from pylog.groups.assignors.base import Subscription, format_assignment
>>> both = frozenset({"t0", "t1"})
>>> members = {"C0": Subscription(both), "C1": Subscription(both)}
>>> print(format_assignment(RoundRobinAssignor().assign({"t0": 3, "t1": 3}, members)))
C0: t0-0, t0-2, t1-1
C1: t0-1, t1-0, t1-2
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal

from pylog.groups.assignors.base import (
    Assignment,
    Assignor,
    Subscription,
    empty_assignment,
    kafka_member_order,
    subscribed_topics,
)
from pylog.structs import TopicPartition

__all__ = ["RoundRobinAssignor"]


class RoundRobinAssignor(Assignor):
    """All partitions, sorted, dealt in a circle over the ordered members, skipping non-subscribers."""

    name: ClassVar[str] = "roundrobin"
    protocol: ClassVar[Literal["eager", "cooperative"]] = "eager"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> Assignment:
        result = empty_assignment(subscriptions)
        order = kafka_member_order(subscriptions)
        topics_of = [subscribed_topics(partitions_per_topic, subscriptions[member]) for member in order]
        cursor = 0  # the member the circle points at
        for topic in sorted(set().union(*topics_of)):
            for partition in range(partitions_per_topic[topic]):
                # Someone subscribes to `topic`, so this loop ends within one turn of the circle.
                while topic not in topics_of[cursor]:
                    cursor = (cursor + 1) % len(order)
                result[order[cursor]].append(TopicPartition(topic, partition))
                cursor = (cursor + 1) % len(order)
        return result
