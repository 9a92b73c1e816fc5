"""A task: one partition of one sub-topology, with its own stores, running records through the nodes.

The task does not know where records come from or go: it is handed the input records of its partitions and a
:class:`Collector` for what it writes (output, repartition and changelog records). The runtime's collector is a
transactional producer; the test driver's keeps the records in memory.

Thread-safety: a task runs on one thread.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

from pylog.streams.stores import KeyValueStore, SessionStore, WindowStore
from pylog.streams.topology import TaskId, Topology
from pylog.streams.windows import SessionWindows

__all__ = ["Collector", "Task"]


class Collector(Protocol):
    """Where a task's records go. ``partition`` None: by the key's hash (Kafka's partitioner)."""

    def send(
        self, topic: str, key: bytes | None, value: bytes | None, timestamp_ms: int, partition: int | None
    ) -> None: ...


class Task:
    """Task ``task_id`` of ``topology`` (see the module docstring)."""

    def __init__(self, topology: Topology, task_id: TaskId, collector: Collector) -> None:
        self.topology = topology
        self.task_id = task_id
        self.collector = collector
        sub = topology.subtopologies[task_id.subtopology]
        self.sources = sub.sources
        self.stores: dict[str, KeyValueStore] = {}
        for name in sub.stores:
            spec = topology.stores[name]
            if isinstance(spec.windows, SessionWindows):
                self.stores[name] = SessionStore(name, spec.changelog, spec.windows.gap_ms)
            elif spec.windows is not None:
                self.stores[name] = WindowStore(name, spec.changelog, spec.windows.size_ms)
            else:
                self.stores[name] = KeyValueStore(name, spec.changelog)
        self.metrics: Counter[str] = Counter()
        self.last_timestamp = 0  # of the last input record: what changelog records are stamped with

    # -- Context (what nodes use) ---------------------------------------------------------------------

    def store(self, name: str) -> KeyValueStore:
        return self.stores[name]

    def send(self, topic: str, key: bytes | None, value: bytes | None, timestamp_ms: int) -> None:
        self.collector.send(topic, key, value, timestamp_ms, None)

    def count(self, metric: str) -> None:
        self.metrics[metric] += 1

    # -- running --------------------------------------------------------------------------------------

    def process(
        self, topic: str, key: bytes | None, value: bytes | None, timestamp_ms: int, where: str = ""
    ) -> None:
        """Run one input record of ``topic`` through the sub-topology."""
        self.metrics["processed-records"] += 1
        self.last_timestamp = timestamp_ms
        self.sources[topic].receive(self, key, value, timestamp_ms, where)

    def flush_changelogs(self) -> int:
        """Send the changelog records of every store's changes since the last flush; returns how many."""
        n = 0
        for store in self.stores.values():
            if store.changelog is None:
                continue
            for key, value in store.take_changes():
                self.collector.send(store.changelog, key, value, self.last_timestamp, self.task_id.partition)
                n += 1
        return n

    def __repr__(self) -> str:
        return f"Task({self.task_id})"
