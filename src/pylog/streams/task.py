"""A task: one partition of one sub-topology, with its own stores, running records through the nodes.

The task does not know where records come from or go: it is handed the input records of its partitions and a
:class:`Collector` for what it writes (output, repartition and changelog records). The runtime's collector is a
transactional producer; the test driver's keeps the records in memory.

Thread-safety: a task runs on one thread.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from pylog.clock import Clock
from pylog.errors import ConfigError, DeserializationError
from pylog.streams.handlers import ErrorContext, ProcessingResponse, dead_letter_headers
from pylog.streams.nodes import Node
from pylog.streams.processor import ProcessNode, Processor, ProcessorContext
from pylog.streams.stores import (
    JoinBufferStore,
    KeyValueStore,
    SessionStore,
    SlidingStore,
    SubscriptionStore,
    SuppressBuffer,
    WindowStore,
)
from pylog.streams.topology import StoreSpec, TaskId, Topology
from pylog.streams.windows import JoinWindows, SessionWindows, SlidingWindows

__all__ = ["Collector", "Task"]


class Collector(Protocol):
    """Where a task's records go. ``partition`` None: by the key's hash (Kafka's partitioner)."""

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int,
        partition: int | None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None: ...

    def send_batch(
        self, topic: str, keys: list[bytes], values: list[bytes | None], timestamp_ms: int, partition: int
    ) -> None: ...


class Task:
    """Task ``task_id`` of ``topology`` (see the module docstring)."""

    def __init__(
        self,
        topology: Topology,
        task_id: TaskId,
        collector: Collector,
        clock: Clock,
        make_store: Callable[[StoreSpec, TaskId], KeyValueStore | None] | None = None,
    ) -> None:
        self.topology = topology
        self.task_id = task_id
        self.collector = collector
        self.clock = clock
        self.stream_time = -1
        sub = topology.subtopologies[task_id.subtopology]
        self.sources = sub.sources
        self.stores: dict[str, KeyValueStore] = {}
        for name in sub.stores:
            spec = topology.stores[name]
            made = make_store(spec, task_id) if make_store is not None else None
            if made is not None:
                self.stores[name] = made
            elif spec.kind == "suppress":
                self.stores[name] = SuppressBuffer(name, spec.changelog)
            elif spec.kind == "subscriptions":
                self.stores[name] = SubscriptionStore(name, spec.changelog)
            elif isinstance(spec.windows, SlidingWindows):
                self.stores[name] = SlidingStore(name, spec.changelog, spec.windows.time_difference_ms)
            elif isinstance(spec.windows, JoinWindows):
                self.stores[name] = JoinBufferStore(name, spec.changelog)
            elif isinstance(spec.windows, SessionWindows):
                self.stores[name] = SessionStore(name, spec.changelog, spec.windows.gap_ms)
            elif spec.windows is not None:
                self.stores[name] = WindowStore(name, spec.changelog, spec.windows.size_ms)
            else:
                self.stores[name] = KeyValueStore(name, spec.changelog)
        self.metrics: Counter[str] = Counter()
        self.last_timestamp = 0  # of the last input record: what changelog records are stamped with
        self._processors: dict[int, tuple[ProcessorContext, Processor]] = {}
        self._fatal: BaseException | None = None  # raised by the collector or on_deserialization_error
        self._dead_lettered = False

    def start(self) -> None:
        """Create and ``init`` the task's processors (after its stores are restored)."""
        sub = self.topology.subtopologies[self.task_id.subtopology]
        for node in _nodes(sub.sources.values()):
            if isinstance(node, ProcessNode) and id(node) not in self._processors:
                context = ProcessorContext(self, node)
                processor = node.factory()
                self._processors[id(node)] = (context, processor)
                processor.init(context)

    # -- Context (what nodes use) ---------------------------------------------------------------------

    def store(self, name: str) -> KeyValueStore:
        return self.stores[name]

    @property
    def partition(self) -> int:
        """The task's partition (of each of its source topics and changelogs)."""
        return self.task_id.partition

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        try:
            self.collector.send(topic, key, value, timestamp_ms, partition, headers)
        except BaseException as exc:  # a failure to write is not the record's fault: never handled
            self._fatal = exc
            raise

    def count(self, metric: str) -> None:
        self.metrics[metric] += 1

    def undecodable(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        error: DeserializationError,
    ) -> None:
        """An input record its source's serdes cannot decode: the application's ``on_deserialization_error``
        policy raises ``error``, skips the record, or writes it to the dead-letter topic (in the transaction:
        exactly once), with pylog's dead-letter headers (:mod:`pylog.deadletter`)."""
        policy = self.topology.on_deserialization_error
        if policy == "raise":
            self._fatal = error
            raise error
        if policy == "dead_letter" and self.topology.dead_letter_topic is not None:
            cause = error.__cause__ or error
            headers = dead_letter_headers(topic, partition, offset, timestamp, "deserialization", cause)
            self.send(self.topology.dead_letter_topic, key, value, timestamp, None, headers)
            self.metrics["dead-lettered-records"] += 1
        else:
            self.metrics["skipped-records"] += 1

    def advance_stream_time(self, timestamp: int) -> None:
        if timestamp > self.stream_time:
            self.stream_time = timestamp

    def processor(self, node: ProcessNode) -> tuple[ProcessorContext, Processor]:
        return self._processors[id(node)]

    # -- running --------------------------------------------------------------------------------------

    def process(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int,
        partition: int = -1,
        offset: int = -1,
    ) -> None:
        """Run one input record of ``topic`` through the sub-topology; an exception of its processing goes to
        the application's processing exception handler (:mod:`pylog.streams.handlers`)."""
        self.last_timestamp = timestamp_ms
        try:
            self.sources[topic].receive(self, key, value, timestamp_ms, partition, offset)
        except Exception as exc:
            if exc is self._fatal:
                raise
            self._handle(exc, topic, partition, offset, key, value, timestamp_ms)
        if self._processors:
            self.punctuate("stream_time", self.stream_time)

    def _handle(
        self,
        exc: Exception,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int,
    ) -> None:
        """Ask the processing exception handler about ``exc``: raise it again (FAIL), or skip the record."""
        self._dead_lettered = False
        context = ErrorContext(
            topic, partition, offset, timestamp_ms, key, value, str(self.task_id), self._send_dead_letter
        )
        response = self.topology.processing_exception_handler(context, exc)
        if response is ProcessingResponse.FAIL:
            exc.add_note(f"while processing {topic}-{partition}@{offset} in task {self.task_id}")
            raise exc
        if response is not ProcessingResponse.CONTINUE:
            raise ConfigError(
                f"the processing exception handler returned {response!r}, not a ProcessingResponse"
            ) from exc
        self.metrics["dead-lettered-records" if self._dead_lettered else "skipped-records"] += 1

    def _send_dead_letter(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int,
        headers: list[tuple[str, bytes]],
    ) -> None:
        self.send(topic, key, value, timestamp_ms, None, headers)
        self._dead_lettered = True

    def punctuate(self, kind: str, now: int) -> None:
        """Run the due punctuators of ``kind`` (``"stream_time"`` or ``"wall_clock"``) at ``now``."""
        for context, _ in self._processors.values():
            context.punctuate(kind, now)

    def close(self) -> None:
        try:
            for _, processor in self._processors.values():
                processor.close()
        finally:
            for store in self.stores.values():
                store.close()

    def flush_changelogs(self) -> int:
        """Send the changelog records of every store's changes since the last flush; returns how many."""
        n = 0
        for store in self.stores.values():
            if store.changelog is None:
                continue
            changes = store.take_changes()
            if changes:
                keys, values = zip(*changes, strict=True)
                self.collector.send_batch(
                    store.changelog, list(keys), list(values), self.last_timestamp, self.task_id.partition
                )
                n += len(changes)
        return n

    def __repr__(self) -> str:
        return f"Task({self.task_id})"


def _nodes(roots: Any) -> list[Node]:
    seen: dict[int, Node] = {}
    stack = list(roots)
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen[id(node)] = node
            stack.extend(node.children)
    return list(seen.values())
