"""What every partition assignor sees and returns.

An assignor is a pure, deterministic function from *(partitions per topic, member subscriptions)* to *member
-> partitions*. It does no I/O and keeps no state between calls: whatever it needs from the previous
generation (the partitions a member owns now) arrives in the member's :class:`Subscription`.

The contract every :meth:`Assignor.assign` keeps (checked by ``tests/property/test_assignor_properties.py``):

* the result has an entry for **every** member id, possibly an empty list, and each list is sorted;
* a member only receives partitions of topics it subscribes to;
* a partition goes to at most one member;
* topics a member subscribes to but that are missing from ``partitions_per_topic`` are ignored;
* the same input gives the same output, whatever the iteration order of the input mappings.

Eager assignors (``protocol == "eager"``) assign every partition of every subscribed topic. The cooperative
one may hold some back for one rebalance; see :mod:`pylog.groups.assignors.cooperative_sticky`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

from pylog.structs import TopicPartition

__all__ = [
    "Assignment",
    "Assignor",
    "Subscription",
    "empty_assignment",
    "format_assignment",
    "kafka_member_order",
    "subscribed_topics",
]

#: What :meth:`Assignor.assign` returns: member id -> sorted partitions.
Assignment = dict[str, list[TopicPartition]]


@dataclass(frozen=True)
class Subscription:
    """One member's side of a rebalance: what it wants and what it holds now.

    ``owned`` and ``generation`` describe the partitions the member owns from the previous generation; only
    the sticky assignors look at them. ``group_instance_id`` is set for static members (KIP-345); the range
    and round-robin assignors order static members by it, as Kafka does.
    """

    topics: frozenset[str]
    owned: tuple[TopicPartition, ...] = ()
    generation: int = -1
    group_instance_id: str | None = None


class Assignor(ABC):
    """A partition assignment strategy (Kafka's ``ConsumerPartitionAssignor``)."""

    #: The strategy name, as in Kafka's ``partition.assignment.strategy``.
    name: ClassVar[str]
    #: ``"eager"``: members revoke everything before each rebalance. ``"cooperative"``: members keep what they
    #: still own and revoke only what the new assignment takes away (KIP-429).
    protocol: ClassVar[Literal["eager", "cooperative"]]

    @abstractmethod
    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> Assignment:
        """Map every member id in ``subscriptions`` to its sorted list of partitions."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def subscribed_topics(partitions_per_topic: Mapping[str, int], subscription: Subscription) -> frozenset[str]:
    """The member's topics that exist and have at least one partition."""
    return frozenset(topic for topic in subscription.topics if partitions_per_topic.get(topic, 0) > 0)


def kafka_member_order(subscriptions: Mapping[str, Subscription]) -> list[str]:
    """Member ids in the order Kafka's ``MemberInfo.compareTo`` gives.

    Static members (with a ``group_instance_id``) come first, ordered by instance id; then dynamic members,
    ordered by member id. The member id breaks ties between equal instance ids so the order is always total.
    """

    def key(member_id: str) -> tuple[int, str, str]:
        instance_id = subscriptions[member_id].group_instance_id
        if instance_id is None:
            return (1, "", member_id)
        return (0, instance_id, member_id)

    return sorted(subscriptions, key=key)


def empty_assignment(member_ids: Iterable[str]) -> Assignment:
    """An entry for every member, in member id order (so results print and compare predictably)."""
    return {member_id: [] for member_id in sorted(member_ids)}


def format_assignment(assignment: Mapping[str, Iterable[TopicPartition]]) -> str:
    """One line per member, ``member: topic-partition, ...`` (Kafka's ``t0-1`` notation), for logs and docs.

    >>> print(format_assignment({"C0": [TopicPartition("t0", 0), TopicPartition("t0", 1)], "C1": []}))
    C0: t0-0, t0-1
    C1: (none)
    """
    lines = []
    for member_id in sorted(assignment):
        partitions = ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(assignment[member_id]))
        lines.append(f"{member_id}: {partitions or '(none)'}")
    return "\n".join(lines)
