"""Kafka's ``CooperativeStickyAssignor``: the sticky assignment, reached in two rebalances (KIP-429).

Under the eager protocol every member revokes all its partitions before a rebalance, so the whole group stops
consuming until the new assignment arrives. Under the cooperative protocol members keep consuming what they
own; the price is that a partition may never be handed to a new member while its old owner still holds it. So
a partition that has to change hands moves in two steps:

1. **First rebalance.** The assignor computes the sticky assignment (:mod:`pylog.groups.assignors.sticky`) and
   then *removes* from it every partition that another member owns now, according to the subscriptions'
   ``owned`` (unless the receiving member's own claim is the one that wins by generation, as
   ``current_owners`` in the sticky module decides). Each member compares the answer with what it owns: it
   keeps what is in both, revokes what is only in ``owned`` (committing offsets first) and starts on what is
   new. The partitions held back are now owned by nobody.
2. **Follow-up rebalance.** Because some member revoked partitions, the group rebalances once more. The
   revoked partitions are free and everything still owned is part of a best-balanced assignment, which the
   sticky assignor then keeps in place (its stage (a)), so it hands the free partitions out and nothing is
   removed. With unchanged members and subscriptions the group has converged after these two rebalances; the
   property tests check this, including for members with different subscriptions.

No partition is ever assigned to two members at once, and members that keep their partitions are never
stopped. The target spreads each topic over the members as the sticky assignment does, so a member trimmed to
its quota revokes partitions of the topics it holds the most of, not the tail of one topic.

Worked example: ``C0`` owns all four partitions of ``t0``; ``C1`` joins.

>>> from pylog.groups.assignors.base import Subscription, format_assignment
>>> from pylog.structs import TopicPartition
>>> t0, assignor = frozenset({"t0"}), CooperativeStickyAssignor()
>>> everything = tuple(TopicPartition("t0", p) for p in range(4))
>>> first = assignor.assign(
...     {"t0": 4}, {"C0": Subscription(t0, owned=everything, generation=1), "C1": Subscription(t0)}
... )
>>> print(format_assignment(first))  # t0-2 and t0-3 belong to C1 but C0 must revoke them first
C0: t0-0, t0-1
C1: (none)
>>> second = assignor.assign(
...     {"t0": 4},
...     {m: Subscription(t0, owned=tuple(first[m]), generation=2) for m in ("C0", "C1")},
... )
>>> print(format_assignment(second))  # the follow-up rebalance completes the move
C0: t0-0, t0-1
C1: t0-2, t0-3
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal

import numpy as np

from pylog.groups.assignors.base import Assignment, Assignor, Subscription
from pylog.groups.assignors.sticky import collector_paused, sticky_target

__all__ = ["CooperativeStickyAssignor"]


class CooperativeStickyAssignor(Assignor):
    """The sticky assignment minus partitions another member still owns (they follow one rebalance later)."""

    name: ClassVar[str] = "cooperative-sticky"
    protocol: ClassVar[Literal["eager", "cooperative"]] = "cooperative"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> Assignment:
        with collector_paused():
            group, target = sticky_target(partitions_per_topic, subscriptions)
            # A member may take a partition it validly owns, or one that no other member claims; any other
            # partition another member holds now waits for the follow-up rebalance.
            others_claim = (group.claims >= 2) | ((group.claims == 1) & (group.claimant != target))
            held_back = (target >= 0) & (group.owner != target) & others_claim
            return group.assignment(np.where(held_back, -1, target))
