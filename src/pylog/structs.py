"""Small immutable value types with kafka-python 3's names, fields and field order.

Each named tuple has exactly the fields of its kafka-python 3 namesake, in the same order, so that unpacking
by position gives the same values (``topic, partition, leader_epoch, offset, *rest = record``). Fields that
have no meaning without a broker hold kafka-python's "unknown" value: ``leader_epoch`` is -1 and
``checksum`` None (as kafka-python reports for Kafka's current record format).
"""

from __future__ import annotations

from typing import Any, NamedTuple, NoReturn, SupportsIndex

__all__ = [
    "ConsumerGroupMetadata",
    "ConsumerRecord",
    "Headers",
    "MemberState",
    "NO_HEADERS",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "RecordMetadata",
    "TopicPartition",
]

#: ``timestamp_type`` values, as in Kafka.
CREATE_TIME = 0
LOG_APPEND_TIME = 1


#: A record's headers: ``(key, value)`` pairs, value bytes or None.
Headers = list[tuple[str, "bytes | None"]]


class _NoHeaders(list[tuple[str, "bytes | None"]]):
    """The ``headers`` of every consumed record that has none: an empty list (kafka-python gives ``[]``), one
    object shared by all such records, so it refuses changes (copy it first: ``list(record.headers)``)."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(
            "the headers of a record without headers are a shared empty list and cannot be changed; "
            "build a new list: list(record.headers) + [(key, value)]"
        )

    append = extend = insert = remove = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse

    def pop(self, index: SupportsIndex = -1) -> NoReturn:
        self._refuse()

    def __reduce__(self) -> tuple[type[list[Any]], tuple[()]]:
        return (list, ())  # pickles (to a Spark worker, a process pool) as a plain empty list


NO_HEADERS: Headers = _NoHeaders()


class TopicPartition(NamedTuple):
    """A partition of a topic. Hashable and ordered (by topic, then partition)."""

    topic: str
    partition: int


class OffsetAndMetadata(NamedTuple):
    """A committed offset (the next offset to read), user metadata, and the leader epoch of the record before
    it (-1: unknown, as pylog has no partition leaders)."""

    offset: int
    metadata: str = ""
    leader_epoch: int = -1


class OffsetAndTimestamp(NamedTuple):
    """Answer of ``offsets_for_times``: the earliest offset whose timestamp is >= the asked time, that
    record's timestamp, and its leader epoch (-1: unknown)."""

    offset: int
    timestamp: int
    leader_epoch: int = -1


class RecordMetadata(NamedTuple):
    """Where an acknowledged record was written. ``serialized_*_size`` are the bytes of the serialized key,
    value and headers (-1 for a null key or value, or no headers); ``checksum`` is None."""

    topic: str
    partition: int
    topic_partition: TopicPartition
    offset: int
    timestamp: int
    checksum: int | None = None
    serialized_key_size: int = -1
    serialized_value_size: int = -1
    serialized_header_size: int = -1


class ConsumerRecord(NamedTuple):
    """One record as a consumer returns it. ``headers`` is a list of ``(str, bytes)`` pairs (the shared
    :data:`NO_HEADERS` when there are none); ``leader_epoch`` is -1 and ``checksum`` None."""

    topic: str
    partition: int
    leader_epoch: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: Any
    value: Any
    headers: Headers
    checksum: int | None = None
    serialized_key_size: int = -1
    serialized_value_size: int = -1
    serialized_header_size: int = -1


class MemberState:
    """The ``state`` of a :class:`ConsumerGroupMetadata`, with kafka-python's values."""

    UNJOINED = "<unjoined>"  # not a member of a group (no group_id, or not joined yet)
    REBALANCING = "<rebalancing>"  # joined; the group's assignment is being settled
    STABLE = "<stable>"  # a member of the group's current generation, with its assignment


class ConsumerGroupMetadata(NamedTuple):
    """A snapshot of a consumer's group membership (``consumer.group_metadata()``), for
    ``producer.send_offsets_to_transaction(offsets, group_metadata)``: the transaction's offsets are committed
    only if this member still belongs to that generation of the group."""

    group_id: str | None = None
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None
    state: str = MemberState.UNJOINED
