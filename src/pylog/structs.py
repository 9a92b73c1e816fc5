"""Small immutable value types with kafka-python's names and field order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

__all__ = [
    "ConsumerRecord",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "RecordMetadata",
    "TopicPartition",
]

#: ``timestamp_type`` values, as in Kafka.
CREATE_TIME = 0
LOG_APPEND_TIME = 1


class TopicPartition(NamedTuple):
    """A partition of a topic. Hashable and ordered (by topic, then partition)."""

    topic: str
    partition: int


class OffsetAndMetadata(NamedTuple):
    """A committed offset (the next offset to read) with optional user metadata."""

    offset: int
    metadata: str = ""


class OffsetAndTimestamp(NamedTuple):
    """Answer of ``offsets_for_times``: the earliest offset whose timestamp is >= the asked time."""

    offset: int
    timestamp: int


class RecordMetadata(NamedTuple):
    """Where an acknowledged record was written. ``offset`` is -1 for ``acks=0``."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    serialized_key_size: int = -1
    serialized_value_size: int = -1

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class ConsumerRecord(NamedTuple):
    """One record as a consumer returns it."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: Any
    value: Any
    headers: Sequence[tuple[str, bytes]]
    serialized_key_size: int = -1
    serialized_value_size: int = -1
