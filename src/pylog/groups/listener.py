"""The rebalance listener interface (Kafka's ``ConsumerRebalanceListener``)."""

from __future__ import annotations

from pylog.structs import TopicPartition

__all__ = ["ConsumerRebalanceListener"]


class ConsumerRebalanceListener:
    """Callbacks a group consumer runs on the user's thread, inside ``poll()``, when its partitions change.

    * ``on_partitions_revoked(revoked)``: before partitions are taken away in an orderly rebalance (all of
      them under an eager assignor, only those that move under ``cooperative-sticky``) or on ``close()``.
      Offsets may still be committed here: this is the place to commit what was processed.
    * ``on_partitions_assigned(assigned)``: after a rebalance, with the new partitions (the whole assignment
      under an eager assignor, only the added ones under ``cooperative-sticky``, possibly none).
    * ``on_partitions_lost(lost)``: the member was expelled (session timeout, or no ``poll()`` within
      ``max_poll_interval_ms``) and the partitions already belong to others: committing is no longer
      possible. The default calls ``on_partitions_revoked``, as Kafka's does.

    Subclass it and override what you need; any object with these methods works as well.
    """

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        """Partitions about to be taken away (commit their offsets here)."""

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        """Partitions now assigned to this member."""

    def on_partitions_lost(self, lost: list[TopicPartition]) -> None:
        """Partitions that already belong to other members."""
        self.on_partitions_revoked(lost)
