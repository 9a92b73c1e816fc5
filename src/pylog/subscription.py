"""What a consumer reads: its subscription, its assigned partitions and a position in each.

A :class:`Subscription` is shared by a :class:`~pylog.consumer.Consumer` and, when the consumer has a
``group_id``, its :class:`~pylog.groups.member.GroupMember`: the member changes the assignment through
:meth:`Subscription.assign` and reads the positions to commit through :meth:`Subscription.consumed_positions`;
neither reaches into the other. It holds:

* the subscribed topic names or regular expression (empty and None under ``assign()``), and the rebalance
  listener given to ``subscribe()``;
* the assigned partitions, sorted, and per assigned partition the next offset to fetch (None until the first
  fetch resets it from the committed offset or ``auto_offset_reset``);
* the paused partitions (always assigned ones).

The consumer may hold records fetched and not yet returned: it binds two hooks, ``drop`` (forget them, run for
every partition that leaves the assignment) and ``consumed`` (the offset of the next record to return, or
None when no position is known yet), so that the subscription answers for them without knowing them.

Thread-safety: not thread-safe; it belongs to the consumer's (user's) thread, like the consumer itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from pylog.errors import ConfigError
from pylog.structs import TopicPartition

__all__ = ["LISTENER_METHODS", "Subscription"]

#: The methods a rebalance listener must have (``on_partitions_lost`` is optional).
LISTENER_METHODS = ("on_partitions_revoked", "on_partitions_assigned")


def _nothing(tp: TopicPartition) -> None:
    return None


class Subscription:
    """See the module docstring."""

    __slots__ = ("_consumed", "_drop", "assigned", "listener", "pattern", "paused", "positions", "topics")

    def __init__(self) -> None:
        self.topics: set[str] = set()
        self.pattern: re.Pattern[str] | None = None
        self.listener: Any = None
        self.assigned: list[TopicPartition] = []
        self.positions: dict[TopicPartition, int | None] = {}
        self.paused: set[TopicPartition] = set()
        self._drop: Callable[[TopicPartition], None] = _nothing
        self._consumed: Callable[[TopicPartition], int | None] = self.positions.get

    def bind(
        self, drop: Callable[[TopicPartition], None], consumed: Callable[[TopicPartition], int | None]
    ) -> None:
        """The owner's hooks: ``drop(tp)`` forgets records fetched for ``tp``, ``consumed(tp)`` is the offset of
        the next record to return for ``tp`` (None when no position is known yet)."""
        self._drop = drop
        self._consumed = consumed

    # -- subscription -----------------------------------------------------------------------------------

    @property
    def subscribed(self) -> bool:
        """True after ``subscribe()`` (topics or a pattern), False under ``assign()`` or nothing."""
        return bool(self.topics) or self.pattern is not None

    @property
    def pattern_text(self) -> str | None:
        return None if self.pattern is None else self.pattern.pattern

    def subscribe(
        self, topics: Iterable[str], pattern: re.Pattern[str] | None, listener: Any
    ) -> tuple[set[str], re.Pattern[str] | None, Any]:
        """Replace the subscription; returns the previous one (to give back with :meth:`restore`)."""
        previous = (self.topics, self.pattern, self.listener)
        self.topics, self.pattern, self.listener = set(topics), pattern, listener
        return previous

    def restore(self, previous: tuple[set[str], re.Pattern[str] | None, Any]) -> None:
        self.topics, self.pattern, self.listener = previous

    def unsubscribe(self) -> None:
        self.topics, self.pattern = set(), None

    def check_listener(self) -> None:
        listener = self.listener
        for name in LISTENER_METHODS:
            if listener is not None and not callable(getattr(listener, name, None)):
                raise ConfigError(f"listener must have an {name}() method (see ConsumerRebalanceListener)")

    def call_listener(self, name: str, partitions: Iterable[TopicPartition]) -> None:
        """Run the listener's ``name`` callback with the sorted ``partitions`` (``on_partitions_lost`` falls
        back on ``on_partitions_revoked``, as Kafka's default does). Its exception is the caller's to keep."""
        listener = self.listener
        if listener is None:
            return
        method = getattr(listener, name, None)
        if method is None and name == "on_partitions_lost":
            method = getattr(listener, "on_partitions_revoked", None)
        if method is not None:
            method(sorted(partitions))

    # -- assignment -------------------------------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Make ``partitions`` the assignment. Partitions kept keep their positions; those that leave it lose
        their position, their pause and (through the ``drop`` hook) the records fetched for them."""
        keep = set(partitions)
        for tp in list(self.positions):
            if tp not in keep:
                self.positions.pop(tp)
                self._drop(tp)
                self.paused.discard(tp)
        for tp in keep:
            self.positions.setdefault(tp, None)
        self.assigned = sorted(keep)

    def revoke_all(self) -> None:
        self.assign(())

    def is_assigned(self, tp: TopicPartition) -> bool:
        return tp in self.positions

    def seek(self, tp: TopicPartition, offset: int | None) -> None:
        """Fetch ``tp`` from ``offset`` next (None: reset at the next fetch); fetched records are dropped."""
        self.positions[tp] = offset
        self._drop(tp)

    def fetchable(self) -> list[TopicPartition]:
        """The assigned partitions that are not paused, in order."""
        paused = self.paused
        if not paused:
            return list(self.assigned)
        return [tp for tp in self.assigned if tp not in paused]

    def consumed_positions(self) -> dict[TopicPartition, int]:
        """The offset of the next record to return, per assigned partition whose position is known (what a
        commit without explicit offsets commits)."""
        out = {}
        for tp in self.assigned:
            pos = self._consumed(tp)
            if pos is not None:
                out[tp] = pos
        return out
