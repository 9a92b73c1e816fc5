"""The test driver (Kafka's ``TopologyTestDriver``): run an application's topology record by record, with no
log, no threads and no waiting.

Records piped into a source topic go through the same nodes and stores as in a running application, encoded
and decoded by the same serdes. What the topology writes is kept per topic until read: output topics, late
records, and the changelog of every store (flushed after each piped record, as if every record were a
commit). Repartition topics are fed back at once, in the order written. Each sub-topology runs as a single
task (partition 0), so every key's state is in one store.

With the application's ``state_dir``, every store is a SQLite file under it here too, as in the running
application (:mod:`pylog.streams.sqlite`, :mod:`pylog.streams.sqlite_buffers`), checkpointed after each piped
record; files left by an earlier driver of the same application are used as they are.

Time: a record's event time is its ``timestamp_ms``, by default the driver's :class:`~pylog.clock.ManualClock`
(which only moves with :meth:`TestDriver.advance_wall_clock`).
"""

from __future__ import annotations

import os
from collections import Counter, deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from pylog.clock import ManualClock
from pylog.errors import ConfigError
from pylog.streams.serde import BYTES, MSGPACK, MSGPACK_KEY, Serde
from pylog.streams.sqlite_buffers import make_sqlite_store
from pylog.streams.stores import KeyValueStore
from pylog.streams.task import Task
from pylog.streams.topology import StoreSpec, TaskId

if TYPE_CHECKING:
    from pylog.streams.app import App

__all__ = ["TestDriver", "TestRecord"]


class TestRecord(NamedTuple):
    """A record the topology wrote: decoded key and value, and its timestamp."""

    key: Any
    value: Any
    timestamp_ms: int


class TestDriver:
    """Drives ``app``'s topology (see the module docstring). The app's topology cannot change afterwards."""

    __test__ = False  # not a pytest test class

    def __init__(self, app: App, *, clock: ManualClock | None = None) -> None:
        self.app = app
        self.clock = clock if clock is not None else ManualClock(0)
        self.topology = app.builder.build(lambda topic: 1)
        self._changelog_records: Counter[str] = Counter()  # per changelog: the offset a checkpoint reaches
        make_store = None if app.state_dir is None else self._make_store
        self._tasks = {
            sub.id: Task(self.topology, TaskId(sub.id, 0), self, self.clock, make_store)
            for sub in self.topology.subtopologies
        }
        for task in self._tasks.values():
            task.start()
        self._internal = {
            t for sub in self.topology.subtopologies for t, n in sub.sources.items() if n.internal
        }
        self._changelogs = {spec.changelog for spec in self.topology.stores.values()}
        self._queue: deque[tuple[str, bytes | None, bytes | None, int]] = deque()
        self._outputs: dict[str, list[tuple[bytes | None, bytes | None, int]]] = {}
        self._processed = 0
        self._dead_letters: set[str] = set()

    # -- input ----------------------------------------------------------------------------------------

    def pipe(self, topic: str, value: Any, key: Any = None, timestamp_ms: int | None = None) -> None:
        """Feed one record to source ``topic`` (encoded with its serdes) and run it through the topology."""
        spec = self.topology.globals.get(topic)
        if spec is not None:  # a global table's topic: its store takes the record at once
            k = spec.key_serde.deserialize(spec.key_serde.serialize(key))
            if k is not None:
                spec.store.put(k, spec.value_serde.deserialize(spec.value_serde.serialize(value)))
                spec.store.take_changes()
            return
        source = self.topology.subtopology_of(topic).sources[topic]
        if source.internal:
            raise ConfigError(f"{topic} is an internal topic: pipe records into the application's inputs")
        ts = self.clock.time_ms() if timestamp_ms is None else timestamp_ms
        self._queue.append((topic, source.key_serde.serialize(key), source.value_serde.serialize(value), ts))
        self._drain()

    def pipe_raw(
        self, topic: str, value: bytes | None, key: bytes | None = None, timestamp_ms: int | None = None
    ) -> None:
        """Feed one record of stored bytes, as a producer with other serializers (or a bug) wrote it: the
        source's serdes decode it, or fail to (see ``on_deserialization_error``)."""
        source = self.topology.subtopology_of(topic).sources[topic]
        if source.internal:
            raise ConfigError(f"{topic} is an internal topic: pipe records into the application's inputs")
        ts = self.clock.time_ms() if timestamp_ms is None else timestamp_ms
        self._queue.append((topic, key, value, ts))
        self._drain()

    def pipe_many(self, topic: str, records: Iterable[tuple[Any, Any] | tuple[Any, Any, int]]) -> None:
        """Feed ``(key, value)`` or ``(key, value, timestamp_ms)`` records one after the other."""
        for record in records:
            self.pipe(topic, record[1], key=record[0], timestamp_ms=record[2] if len(record) > 2 else None)

    def advance_wall_clock(self, ms: int) -> None:
        """Move the driver's clock forward (the default timestamp of piped records), and run the wall-clock
        punctuators that are due."""
        self.clock.advance(ms)
        for task in self._tasks.values():
            task.punctuate("wall_clock", self.clock.time_ms())
        self._drain()

    def _drain(self) -> None:
        while self._queue:
            t, k, v, at = self._queue.popleft()
            self._tasks[self.topology.subtopology_of(t).id].process(t, k, v, at)
            self._processed += 1
        for task in self._tasks.values():
            task.flush_changelogs()
            for store in task.stores.values():
                store.checkpoint(self._changelog_records[store.changelog or ""])

    def _make_store(self, spec: StoreSpec, task_id: TaskId) -> KeyValueStore | None:
        if self.app.state_dir is None:
            return None
        path = os.path.join(self.app.state_dir, self.app.application_id, str(task_id), f"{spec.name}.sqlite")
        return make_sqlite_store(spec, path, "test-driver")

    def close(self) -> None:
        """Close the stores (their files, with a ``state_dir``)."""
        for task in self._tasks.values():
            task.close()

    # -- Collector ------------------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int,
        partition: int | None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        if topic in self._changelogs:
            self._changelog_records[topic] += 1
        if headers is not None and any(name == "pylog.dlq.stage" for name, _ in headers):
            self._dead_letters.add(topic)  # a handler's own dead-letter topic: read as bytes
        if topic in self._internal:
            self._queue.append((topic, key, value, timestamp_ms))
        else:
            self._outputs.setdefault(topic, []).append((key, value, timestamp_ms))

    def send_batch(
        self, topic: str, keys: list[bytes], values: list[bytes | None], timestamp_ms: int, partition: int
    ) -> None:
        for key, value in zip(keys, values, strict=True):
            self.send(topic, key, value, timestamp_ms, partition)

    # -- output ---------------------------------------------------------------------------------------

    def _serdes(self, topic: str) -> tuple[Serde, Serde]:
        if topic in self._changelogs:
            return MSGPACK_KEY, MSGPACK
        if topic in self.topology.dead_letter_topics() or topic in self._dead_letters:
            return BYTES, BYTES
        if topic in self.topology.outputs:
            return self.topology.outputs[topic]
        raise ConfigError(
            f"the application writes no topic {topic!r} (its outputs: {sorted(self.topology.outputs)})"
        )

    def read_output(self, topic: str) -> list[TestRecord]:
        """The records written to ``topic`` since the last read of it, decoded, in the order written."""
        key_serde, value_serde = self._serdes(topic)
        records = self._outputs.pop(topic, [])
        return [TestRecord(key_serde.deserialize(k), value_serde.deserialize(v), ts) for k, v, ts in records]

    def read_key_values(self, topic: str) -> list[tuple[Any, Any]]:
        """``(key, value)`` of :meth:`read_output`."""
        return [(r.key, r.value) for r in self.read_output(topic)]

    def read_values(self, topic: str) -> list[Any]:
        """The values of :meth:`read_output`."""
        return [r.value for r in self.read_output(topic)]

    def store(self, name: str) -> KeyValueStore:
        """The store ``name`` (its single task's instance)."""
        for global_spec in self.topology.globals.values():
            if global_spec.name == name:
                return global_spec.store
        spec = self.topology.stores.get(name)
        if spec is None:
            raise ConfigError(f"no store {name!r} (stores: {sorted(self.topology.stores)})")
        return self._tasks[spec.subtopology].stores[name]

    def metrics(self) -> dict[str, int]:
        """Counters summed over the tasks: ``processed-records``, ``dropped-records``, ``late-records``."""
        total: Counter[str] = Counter({"processed-records": self._processed})
        for task in self._tasks.values():
            total.update(task.metrics)
        return dict(total)
