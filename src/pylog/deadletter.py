"""Poison pills and dead letters: a record that cannot be decoded or processed does not wedge a consumer.

A consumer's ``on_deserialization_error`` policy decides what happens to a record whose key or value its
deserializer cannot decode:

* ``"raise"`` (default, like kafka-python): records before it are returned; then ``poll()`` raises
  :class:`~pylog.errors.DeserializationError` naming the partition and offset, again on every poll until the
  application seeks past it (``consumer.seek(err.topic_partition, err.offset + 1)``);
* ``"skip"``: the record is skipped and counted (``records-skipped-total`` in the
  ``consumer-deserialization-metrics`` group of ``consumer.metrics()``);
* ``"dead_letter"``: the record's stored bytes are appended to ``dead_letter_topic`` with the error in its
  headers, and counted (``records-dead-lettered-total``).

For errors in the application's own processing, ``consumer.dead_letter(record, error)`` sends a record it has
already received to the dead-letter topic the same way.

A dead letter keeps the original key, value and headers byte for byte (read back from the log, not
re-encoded) and adds these headers (values UTF-8):

==============================  ==========================================================
header                          value
==============================  ==========================================================
``pylog.dlq.topic``             topic of the original record
``pylog.dlq.partition``         its partition
``pylog.dlq.offset``            its offset
``pylog.dlq.timestamp``         its timestamp (ms)
``pylog.dlq.stage``             ``deserialization`` or ``processing``
``pylog.dlq.error.class``       the exception's class name
``pylog.dlq.error.message``     the exception's message (first 1,000 characters)
==============================  ==========================================================

The dead-letter topic is created (one partition, the log's defaults) if it does not exist. Dead letters are
written with ``acks=1``: once ``poll()`` returns, they survive a crash of the process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pylog.errors import ConfigError, TopicExistsError
from pylog.producer import Producer

if TYPE_CHECKING:
    from pylog.directory import LogDirectory
    from pylog.structs import Headers

__all__ = ["POLICIES", "DeadLetters"]

POLICIES = ("raise", "skip", "dead_letter")


class DeadLetters:
    """Sends records to a dead-letter topic. Not thread-safe: belongs to one consumer."""

    def __init__(self, log: LogDirectory, topic: str | None, policy: str) -> None:
        """``topic`` and ``policy`` are checked settings (:mod:`pylog.consumer_config`)."""
        self.log = log
        self.topic = topic
        self.policy = policy
        self.skipped = 0
        self.sent = 0
        self._producer: Any = None

    def send(
        self,
        topic: str,
        partition: int,
        offset: int,
        timestamp: int,
        raw: tuple[bytes | None, bytes | None, Headers],
        error: BaseException,
        stage: str,
    ) -> None:
        if self.topic is None:
            raise ConfigError("this consumer has no dead_letter_topic")
        if self._producer is None:
            if not self.log.has_topic(self.topic):
                try:
                    self.log.create_topic(self.topic)
                except TopicExistsError:
                    pass  # created meanwhile by another consumer
            self._producer = self.log.register_producer(
                Producer(self.log, acks=1, key_serializer=None, value_serializer=None)
            )
        key, value, headers = raw
        extra = [
            ("pylog.dlq.topic", topic.encode()),
            ("pylog.dlq.partition", str(partition).encode()),
            ("pylog.dlq.offset", str(offset).encode()),
            ("pylog.dlq.timestamp", str(timestamp).encode()),
            ("pylog.dlq.stage", stage.encode()),
            ("pylog.dlq.error.class", type(error).__name__.encode()),
            ("pylog.dlq.error.message", str(error)[:1000].encode("utf-8", "replace")),
        ]
        self._producer.send(
            self.topic, value=value, key=key, headers=list(headers) + extra, timestamp_ms=timestamp
        ).get()
        self.sent += 1

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None
