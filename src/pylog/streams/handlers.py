"""What a stream application does with an input record whose processing raised (Kafka Streams' processing
exception handler, KIP-1033).

``App(processing_exception_handler=handler)``: when an operation of the topology (a user function given to
``map``, ``filter``, ``aggregate``, a join's joiner, a processor's ``process``, a sink's serde, ...) raises an
:class:`Exception` for an input record, ``handler(context, exception)`` is called with an
:class:`ErrorContext` naming the record, and answers:

* :attr:`ProcessingResponse.FAIL`: the application stops with that exception (its stream thread's open
  transaction is aborted: nothing of it is visible, and the record is processed again after a restart);
* :attr:`ProcessingResponse.CONTINUE`: the record is skipped and counted (``skipped-records``) and processing
  goes on with the next one; its offset is committed with the rest of the transaction.

Built in: :func:`log_and_fail` (the default, Kafka's ``LogAndFailProcessingExceptionHandler``),
:func:`log_and_continue` (``LogAndContinueProcessingExceptionHandler``) and :class:`DeadLetterHandler`, which
writes the record's input bytes to a dead-letter topic with pylog's dead-letter headers (``pylog.dlq.stage``
``processing``, see :mod:`pylog.deadletter`) in the same transaction as the record's offset, so exactly once,
and continues (counted: ``dead-lettered-records``). A handler of its own may call
:meth:`ErrorContext.dead_letter` for some errors and fail for others.

What the record's operations did before the one that raised stays done, as in Kafka Streams: records already
forwarded to a sink are written, store updates already made are kept. Exceptions that are not the record's
fault are never handed to the handler and always stop the application: a failure to write (the producer, a
fenced transaction), a :class:`~pylog.errors.DeserializationError` raised by ``on_deserialization_error="raise"``,
and exceptions of punctuators.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable

from pylog.errors import ConfigError

__all__ = [
    "DeadLetterHandler",
    "ErrorContext",
    "ProcessingExceptionHandler",
    "ProcessingResponse",
    "dead_letter_headers",
    "log_and_continue",
    "log_and_fail",
]

_log = logging.getLogger("pylog.streams")


class ProcessingResponse(enum.Enum):
    """A processing exception handler's answer."""

    CONTINUE = "continue"
    FAIL = "fail"


def dead_letter_headers(
    topic: str, partition: int, offset: int, timestamp_ms: int, stage: str, error: BaseException
) -> list[tuple[str, bytes]]:
    """pylog's dead-letter headers (:mod:`pylog.deadletter`) for the input record ``topic-partition@offset``."""
    return [
        ("pylog.dlq.topic", topic.encode()),
        ("pylog.dlq.partition", str(partition).encode()),
        ("pylog.dlq.offset", str(offset).encode()),
        ("pylog.dlq.timestamp", str(timestamp_ms).encode()),
        ("pylog.dlq.stage", stage.encode()),
        ("pylog.dlq.error.class", type(error).__name__.encode()),
        ("pylog.dlq.error.message", str(error)[:1000].encode("utf-8", "replace")),
    ]


class ErrorContext:
    """The input record whose processing raised: ``topic``, ``partition``, ``offset`` (-1 and -1 in the
    :class:`~pylog.streams.driver.TestDriver`), ``timestamp_ms``, its stored ``key`` and ``value`` bytes, and
    ``task_id`` (``"1_3"``) of the task that ran it. Valid only during the handler's call."""

    __slots__ = ("_send", "key", "offset", "partition", "task_id", "timestamp_ms", "topic", "value")

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        task_id: str,
        send: Callable[[str, bytes | None, bytes | None, int, list[tuple[str, bytes]]], None],
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.timestamp_ms = timestamp_ms
        self.key = key
        self.value = value
        self.task_id = task_id
        self._send = send

    def dead_letter(self, topic: str, error: BaseException) -> None:
        """Write the record's key and value bytes to ``topic`` (which must exist) with pylog's dead-letter
        headers naming ``error``, in the transaction that commits the record's offset."""
        headers = dead_letter_headers(
            self.topic, self.partition, self.offset, self.timestamp_ms, "processing", error
        )
        self._send(topic, self.key, self.value, self.timestamp_ms, headers)

    def __repr__(self) -> str:
        return f"ErrorContext({self.topic}-{self.partition}@{self.offset}, task {self.task_id})"


ProcessingExceptionHandler = Callable[[ErrorContext, Exception], ProcessingResponse]
"""``handler(context, exception) -> ProcessingResponse``."""


def log_and_fail(context: ErrorContext, exception: Exception) -> ProcessingResponse:
    """Log the error and stop the application (the default)."""
    _log.error("processing %r failed: %r; the application stops", context, exception)
    return ProcessingResponse.FAIL


def log_and_continue(context: ErrorContext, exception: Exception) -> ProcessingResponse:
    """Log the error and skip the record."""
    _log.warning("processing %r failed: %r; the record is skipped", context, exception)
    return ProcessingResponse.CONTINUE


class DeadLetterHandler:
    """Write the failing record to the dead-letter topic ``topic`` (created by the application if missing;
    one partition) and continue."""

    def __init__(self, topic: str) -> None:
        if not isinstance(topic, str) or not topic:
            raise ConfigError(f"DeadLetterHandler needs a topic name, got {topic!r}")
        self.topic = topic

    def __call__(self, context: ErrorContext, exception: Exception) -> ProcessingResponse:
        _log.warning("processing %r failed: %r; the record goes to %s", context, exception, self.topic)
        context.dead_letter(self.topic, exception)
        return ProcessingResponse.CONTINUE

    def __repr__(self) -> str:
        return f"DeadLetterHandler({self.topic!r})"
