"""Kafka's ``RangeAssignor``: contiguous ranges, topic by topic.

For each topic on its own, the members subscribed to it are put in order (static members by
``group_instance_id`` first, then the rest by member id, as Kafka's ``MemberInfo`` sorts) and the topic's
partitions are cut into contiguous ranges: each member gets ``partitions // members`` of them, and the first
``partitions % members`` members get one more. Balance is per topic, so with many topics the first members can
end up well ahead (two members, ten topics of three partitions: 20 against 10). Co-partitioned topics land
together, which is what joins need.

Worked example: two members, topics ``t0`` and ``t1`` with three partitions each (Kafka's javadoc example).

>>> from pylog.groups.assignors.base import Subscription, format_assignment
>>> both = frozenset({"t0", "t1"})
>>> members = {"C0": Subscription(both), "C1": Subscription(both)}
>>> print(format_assignment(RangeAssignor().assign({"t0": 3, "t1": 3}, members)))
C0: t0-0, t0-1, t1-0, t1-1
C1: t0-2, t1-2
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

__all__ = ["RangeAssignor"]


class RangeAssignor(Assignor):
    """Per topic, contiguous ranges over the ordered subscribers; the first ones get one extra partition."""

    name: ClassVar[str] = "range"
    protocol: ClassVar[Literal["eager", "cooperative"]] = "eager"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> Assignment:
        result = empty_assignment(subscriptions)
        order = kafka_member_order(subscriptions)
        topics_of = {
            member: subscribed_topics(partitions_per_topic, subscriptions[member]) for member in order
        }
        for topic in sorted(set().union(*topics_of.values())):
            consumers = [member for member in order if topic in topics_of[member]]
            per_member, extra = divmod(partitions_per_topic[topic], len(consumers))
            for i, member in enumerate(consumers):
                start = per_member * i + min(i, extra)
                length = per_member + (1 if i < extra else 0)
                result[member].extend(TopicPartition(topic, p) for p in range(start, start + length))
        return result
