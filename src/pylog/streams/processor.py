"""The processor API (Kafka Streams' ``Processor``): custom per-record logic with stores and punctuators.

``stream.process(MyProcessor, stores=["name"])`` runs one ``MyProcessor()`` per task. Its ``init(context)`` gets a
:class:`ProcessorContext`: the task's stores (the ones named are created for it, logged to changelogs like
any other), ``forward()`` to send records downstream, and ``schedule()`` for punctuators:

* ``kind="stream_time"``: ``callback(stream_time)`` runs when the task's stream time (the largest event time of
  its input records) has moved at least ``interval_ms`` past the last call (the first time: past the stream
  time when its first record came). Stream time only moves with records: no input, no call. If it jumps by
  several intervals, one call.
* ``kind="wall_clock"``: ``callback(now_ms)`` runs when the application's clock (the log's injected
  :class:`~pylog.clock.Clock`; the test driver's ManualClock) has moved ``interval_ms`` past the last call
  (the first time: past when the task started), checked after every poll of the thread, so within
  ``poll_ms`` of being due when idle.

What a punctuator forwards or stores is part of the current transaction, as what ``process`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pylog.errors import ConfigError
from pylog.streams.nodes import Context, Node

if TYPE_CHECKING:
    from pylog.streams.stores import KeyValueStore
    from pylog.streams.task import Task

__all__ = ["ProcessNode", "Processor", "ProcessorContext"]

_KINDS = ("stream_time", "wall_clock")


class Processor:
    """Subclass and override :meth:`process` (and :meth:`init`, :meth:`close` if needed)."""

    context: ProcessorContext

    def init(self, context: ProcessorContext) -> None:
        """Called once per task before any record; keep ``context`` (the default does)."""
        self.context = context

    def process(self, key: Any, value: Any, timestamp: int) -> None:
        """One record; forward results with ``self.context.forward(key, value)``."""
        raise NotImplementedError

    def close(self) -> None:
        """Called when the task closes."""


class ProcessorContext:
    """What a processor of one task may use (see the module docstring)."""

    def __init__(self, task: Task, node: ProcessNode) -> None:
        self._task = task
        self._node = node
        self.timestamp = 0  # of the record being processed (or the punctuation time)
        self.schedules: list[list[Any]] = []  # [kind, interval_ms, callback, next_due or None]

    @property
    def task_id(self) -> str:
        return str(self._task.task_id)

    @property
    def stream_time(self) -> int:
        """The task's stream time (-1 before its first record)."""
        return self._task.stream_time

    @property
    def wall_clock_ms(self) -> int:
        return self._task.clock.time_ms()

    def store(self, name: str) -> KeyValueStore:
        return self._task.store(name)

    def forward(self, key: Any, value: Any, timestamp: int | None = None) -> None:
        """Send a record to the processor's children (timestamp: the current record's by default)."""
        self._node.forward(self._task, key, value, self.timestamp if timestamp is None else timestamp)

    def schedule(self, interval_ms: int, callback: Callable[[int], Any], kind: str = "stream_time") -> None:
        """Call ``callback(time_ms)`` every ``interval_ms`` of ``kind`` time (``"stream_time"`` or
        ``"wall_clock"``)."""
        if isinstance(interval_ms, bool) or not isinstance(interval_ms, int) or interval_ms < 1:
            raise ConfigError(f"interval_ms must be an int >= 1, got {interval_ms!r}")
        if kind not in _KINDS:
            raise ConfigError(f"kind must be one of {_KINDS}, got {kind!r}")
        start = self.wall_clock_ms if kind == "wall_clock" else None
        self.schedules.append([kind, interval_ms, callback, None if start is None else start + interval_ms])

    def punctuate(self, kind: str, now: int) -> None:
        """Run the due punctuators of ``kind`` at time ``now``."""
        for schedule in self.schedules:
            if schedule[0] != kind or now < 0:
                continue
            if schedule[3] is None:
                schedule[3] = now + schedule[1]
            elif now >= schedule[3]:
                schedule[3] = now + schedule[1]
                self.timestamp = now
                schedule[2](now)


class ProcessNode(Node):
    """Runs a :class:`Processor` (one instance per task, made by ``factory``)."""

    def __init__(self, name: str, factory: Callable[[], Processor], stores: list[str]) -> None:
        super().__init__(name)
        self.factory = factory
        self.stores = stores

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        context, processor = ctx.processor(self)  # type: ignore[attr-defined]
        context.timestamp = timestamp
        processor.process(key, value, timestamp)
