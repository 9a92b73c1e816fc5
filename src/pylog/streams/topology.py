"""The topology of an application: its nodes cut into sub-topologies, and the topics they need.

A **sub-topology** is what one task runs: the nodes reachable from a set of source topics that share a node
(a ``merge``, a join) and so must be read together, partition by partition. A repartition topic ends one
sub-topology and starts another. Task ``<sub-topology>_<partition>`` (Kafka's name) processes partition *p* of
every source topic of its sub-topology and owns partition *p* of each of its stores' changelogs.

Internal topics are named as Kafka Streams names them: ``<application_id>-<store>-repartition`` (as many
partitions as the sub-topology writing it), ``<application_id>-<store>-changelog`` (compacted, as many
partitions as the sub-topology owning the store), and a foreign-key join's
``<application_id>-<name>-subscription-registration-topic`` and ``...-subscription-response-topic`` (as many
partitions as the sub-topology reading each: :meth:`Builder.internal_source`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pylog.errors import ConfigError
from pylog.streams.handlers import DeadLetterHandler, ProcessingExceptionHandler, log_and_fail
from pylog.streams.nodes import Node, SinkNode, SourceNode
from pylog.streams.serde import MSGPACK, MSGPACK_KEY, Serde
from pylog.streams.stores import KeyValueStore
from pylog.streams.windows import JoinWindows, SessionWindows, SlidingWindows, Windows

__all__ = ["Builder", "GlobalSpec", "StoreSpec", "SubTopology", "TaskId", "Topology"]

_NAME = re.compile(r"[A-Za-z0-9._-]+")


@dataclass(frozen=True, order=True)
class TaskId:
    """A task: partition ``partition`` of sub-topology ``subtopology`` (printed ``0_3``, as Kafka)."""

    subtopology: int
    partition: int

    def __str__(self) -> str:
        return f"{self.subtopology}_{self.partition}"


@dataclass
class StoreSpec:
    name: str
    node: Node
    windows: Windows | SessionWindows | SlidingWindows | JoinWindows | None
    changelog: str
    subtopology: int = -1
    kind: str = "kv"  # "kv" (a key-value store), "suppress" (a suppression buffer), "subscriptions"


@dataclass
class GlobalSpec:
    """A global table: every partition of ``topic`` read into ``store`` by every process."""

    name: str
    topic: str
    store: KeyValueStore
    key_serde: Serde
    value_serde: Serde


@dataclass
class SubTopology:
    id: int
    sources: dict[str, SourceNode]
    stores: list[str]
    partitions: int = 0
    sinks: list[str] = field(default_factory=list)


class Builder:
    """Collects what the DSL adds; :meth:`build` turns it into a :class:`Topology`."""

    def __init__(self, application_id: str) -> None:
        self.application_id = application_id
        self.sources: dict[str, SourceNode] = {}
        self.stores: dict[str, StoreSpec] = {}
        self.sinks: list[SinkNode] = []
        self.outputs: dict[str, tuple[Serde, Serde]] = {}
        self.globals: dict[str, GlobalSpec] = {}  # by topic
        self.on_deserialization_error = "raise"
        self.dead_letter_topic: str | None = None
        self.processing_exception_handler: ProcessingExceptionHandler = log_and_fail
        self.frozen = False
        self.reader_counted: set[str] = set()  # internal topics with the partition count of their reader
        self.writes: list[tuple[Node, str]] = []  # nodes that write an internal topic themselves (describe)
        self._n = 0

    def name(self, kind: str) -> str:
        self._n += 1
        return f"{kind}-{self._n:04d}"

    def check_open(self) -> None:
        if self.frozen:
            raise ConfigError("the topology of an App cannot change once it has started or been driven")

    def add_source(self, node: SourceNode) -> None:
        self.check_open()
        if node.topic in self.sources:
            raise ConfigError(
                f"topic {node.topic!r} is already a source of this App (read it once, then branch)"
            )
        self.sources[node.topic] = node

    def store_name(self, name: str | None, kind: str) -> str:
        self.check_open()
        if name is None:
            name = self.name(kind)
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ConfigError(f"a store name is made of [A-Za-z0-9._-], got {name!r}")
        if name in self.stores:
            raise ConfigError(f"store {name!r} already exists in this App")
        return name

    def add_store(
        self,
        name: str,
        node: Node,
        windowed: Windows | SessionWindows | SlidingWindows | JoinWindows | None,
        *,
        kind: str = "kv",
    ) -> None:
        self.stores[name] = StoreSpec(
            name, node, windowed, f"{self.application_id}-{name}-changelog", kind=kind
        )

    def add_sink(self, sink: SinkNode) -> None:
        self.sinks.append(sink)
        self.add_output_topic(sink.topic, sink.key_serde, sink.value_serde)

    def add_output_topic(self, topic: str, key_serde: Serde, value_serde: Serde) -> None:
        self.outputs.setdefault(topic, (key_serde, value_serde))

    def repartition(self, parent: Node, store: str, key_serde: Serde | None = None) -> SourceNode:
        """A sink to ``<app>-<store>-repartition`` under ``parent``, and that topic's source node. Keys are
        msgpack, or ``key_serde``: a join's repartition topic encodes the keys as the table (or stream) it
        joins was partitioned, so that a key lands in the partition of that key's rows."""
        topic = f"{self.application_id}-{store}-repartition"
        serde = MSGPACK_KEY if key_serde is None else key_serde
        sink = SinkNode(self.name("repartition-sink"), topic, serde, MSGPACK, internal=True)
        parent.children.append(sink)
        self.sinks.append(sink)
        source = SourceNode(self.name("repartition-source"), topic, serde, MSGPACK, internal=True)
        self.add_source(source)
        return source

    def internal_source(self, topic: str, key_serde: Serde, *writers: Node) -> SourceNode:
        """The source of an internal topic written by nodes directly (no sink node), with as many partitions
        as the sub-topology reading it: the subscription and response topics of a foreign-key join, which
        must be co-partitioned with the table their reader looks up."""
        source = SourceNode(self.name("internal-source"), topic, key_serde, MSGPACK, internal=True)
        self.add_source(source)
        self.reader_counted.add(topic)
        self.writes.extend((node, topic) for node in writers)
        return source

    def build(self, partitions_of: Callable[[str], int]) -> Topology:
        """Cut the nodes into sub-topologies; ``partitions_of(topic)`` gives a user topic's partition count."""
        self.frozen = True
        roots = list(self.sources.values())
        reach = [_reachable(root) for root in roots]
        parent = list(range(len(roots)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        owner: dict[int, int] = {}
        for i, nodes in enumerate(reach):
            for node_id in nodes:
                ri, rj = find(i), find(owner.setdefault(node_id, i))
                if ri != rj:
                    parent[max(ri, rj)] = min(ri, rj)
        groups: dict[int, list[int]] = {}
        for i in range(len(roots)):
            groups.setdefault(find(i), []).append(i)
        subs: list[SubTopology] = []
        node_sub: dict[int, int] = {}
        for sid, (_, members) in enumerate(sorted(groups.items())):
            sub = SubTopology(sid, {roots[i].topic: roots[i] for i in members}, [])
            for i in members:
                for node_id in reach[i]:
                    node_sub[node_id] = sid
            subs.append(sub)
        for spec in self.stores.values():
            spec.subtopology = node_sub[id(spec.node)]
            subs[spec.subtopology].stores.append(spec.name)
        for node, topic in self.writes:
            if id(node) in node_sub and topic not in subs[node_sub[id(node)]].sinks:
                subs[node_sub[id(node)]].sinks.append(topic)
        writer: dict[str, int] = {}
        for sink in self.sinks:
            if id(sink) in node_sub:
                subs[node_sub[id(sink)]].sinks.append(sink.topic)
                if sink.internal:
                    writer[sink.topic] = node_sub[id(sink)]
        # partition counts: user topics as they are; a repartition topic as its writer's sub-topology (which
        # may itself read repartition topics, or even be the sub-topology reading it: a join after a new key)
        count = {t: partitions_of(t) for sub in subs for t, node in sub.sources.items() if not node.internal}
        changed = True
        while changed:
            changed = False
            for sub in subs:
                known = [count[t] for t in sub.sources if t in count]
                if known and not sub.partitions:
                    sub.partitions = max(known)
                    changed = True
            for topic, w in writer.items():
                if topic not in count and subs[w].partitions:
                    count[topic] = subs[w].partitions
                    changed = True
            for sub in subs:
                for topic in sub.sources:
                    if topic in self.reader_counted and topic not in count and sub.partitions:
                        count[topic] = sub.partitions
                        changed = True
        for sub in subs:
            counts = {t: count.get(t) for t in sub.sources}
            if len(set(counts.values())) > 1:
                raise ConfigError(
                    f"the sources of one sub-topology must have the same partition count (co-partitioned), "
                    f"got {counts}"
                )
        return Topology(
            self.application_id,
            subs,
            dict(self.stores),
            dict(self.outputs),
            self.on_deserialization_error,
            self.dead_letter_topic,
            dict(self.globals),
            self.processing_exception_handler,
        )


def _reachable(root: Node) -> set[int]:
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(node.children)
        stack.extend(node.lookups)
    return seen


@dataclass
class Topology:
    """The built topology (see the module docstring)."""

    application_id: str
    subtopologies: list[SubTopology]
    stores: dict[str, StoreSpec]
    outputs: dict[str, tuple[Serde, Serde]]
    on_deserialization_error: str = "raise"
    dead_letter_topic: str | None = None
    globals: dict[str, GlobalSpec] = field(default_factory=dict)
    processing_exception_handler: ProcessingExceptionHandler = log_and_fail

    def dead_letter_topics(self) -> set[str]:
        """The dead-letter topics of ``on_deserialization_error`` and of a
        :class:`~pylog.streams.handlers.DeadLetterHandler`."""
        topics = set() if self.dead_letter_topic is None else {self.dead_letter_topic}
        if isinstance(self.processing_exception_handler, DeadLetterHandler):
            topics.add(self.processing_exception_handler.topic)
        return topics

    def subtopology_of(self, topic: str) -> SubTopology:
        for sub in self.subtopologies:
            if topic in sub.sources:
                return sub
        raise ConfigError(f"topic {topic!r} is not a source of application {self.application_id!r}")

    @property
    def source_topics(self) -> list[str]:
        return [t for sub in self.subtopologies for t in sub.sources]

    def internal_topics(self) -> dict[str, tuple[int, dict[str, Any]]]:
        """Every internal topic: ``{name: (partitions, topic config)}``."""
        out: dict[str, tuple[int, dict[str, Any]]] = {}
        for sub in self.subtopologies:
            for topic, node in sub.sources.items():
                if node.internal:
                    out[topic] = (sub.partitions, {})
            for store in sub.stores:
                out[self.stores[store].changelog] = (sub.partitions, {"cleanup_policy": "compact"})
        return out

    def tasks(self) -> list[TaskId]:
        return [TaskId(sub.id, p) for sub in self.subtopologies for p in range(sub.partitions)]

    def describe(self) -> str:
        """A readable outline, as Kafka's ``Topology.describe()``."""
        lines = [f"Topology of {self.application_id}:"]
        for sub in self.subtopologies:
            lines.append(f"  Sub-topology {sub.id} ({sub.partitions} tasks)")
            lines.append(f"    sources: {', '.join(sub.sources)}")
            if sub.stores:
                lines.append(f"    stores: {', '.join(sub.stores)}")
            if sub.sinks:
                lines.append(f"    sinks: {', '.join(sub.sinks)}")
        return "\n".join(lines)
