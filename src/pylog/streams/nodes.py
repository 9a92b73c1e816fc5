"""Processor nodes: the operations of a topology, each a small object that takes ``(key, value, timestamp)``
and forwards what it produces to its children.

Nodes hold no per-task data: what a task owns (its stores, its stream time, where records are sent) comes in
the :class:`Context` handed to :meth:`Node.process`, so one topology serves every task of every thread.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from pylog.errors import DeserializationError, IllegalStateError
from pylog.streams.serde import MSGPACK, Serde
from pylog.streams.stores import (
    MISSING,
    JoinBufferStore,
    KeyValueStore,
    SessionStore,
    SlidingStore,
    SubscriptionStore,
    SuppressBuffer,
    WindowStore,
    encode_key,
)
from pylog.streams.windows import JoinWindows, SessionWindows, SlidingWindows, Windowed, Windows

__all__ = [
    "AggregateNode",
    "BranchNode",
    "Context",
    "FilterNode",
    "FlatMapNode",
    "ForeignKeyResponseNode",
    "ForeignKeyRightChangeNode",
    "ForeignKeySubscribeNode",
    "ForeignKeySubscriptionNode",
    "Node",
    "PeekNode",
    "SessionAggregateNode",
    "SinkNode",
    "SlidingAggregateNode",
    "SourceNode",
    "StreamStreamJoinNode",
    "SuppressNode",
    "TableAggregateNode",
    "TableGroupByNode",
    "GlobalJoinNode",
    "StreamTableJoinNode",
    "TableJoinNode",
    "TableSourceNode",
    "TableViewNode",
    "WindowAggregateNode",
    "WindowCloseNode",
    "WindowedNode",
]

Aggregator = Callable[[Any, Any, Any], Any]  # (key, value, aggregate or MISSING) -> new aggregate
Getter = Callable[["Context", Any], Any]  # a table's current value of a key in a task (None: absent)


class Context(Protocol):
    """What a node may use of the task running it."""

    stores: dict[str, KeyValueStore]

    def store(self, name: str) -> KeyValueStore: ...

    @property
    def partition(self) -> int: ...

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int,
        partition: int | None = None,
    ) -> None: ...

    def undecodable(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        error: DeserializationError,
    ) -> None: ...

    def count(self, metric: str) -> None: ...

    def advance_stream_time(self, timestamp: int) -> None: ...


class Node:
    """One operation. ``children`` receive what it forwards."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.children: list[Node] = []
        self.lookups: list[Node] = []  # nodes that read this one's store (joins): same sub-topology

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        self.forward(ctx, key, value, timestamp)

    def forward(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        for child in self.children:
            child.process(ctx, key, value, timestamp)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class SourceNode(Node):
    """Reads a topic: decodes key and value with its serdes and picks the event time (the timestamp extractor,
    ``(key, value, record_timestamp) -> ms``, or the record's timestamp)."""

    def __init__(
        self,
        name: str,
        topic: str,
        key_serde: Serde,
        value_serde: Serde,
        timestamp: Callable[[Any, Any, int], int] | None = None,
        *,
        internal: bool = False,
    ) -> None:
        super().__init__(name)
        self.topic = topic
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.timestamp = timestamp
        self.internal = internal

    def receive(
        self,
        ctx: Context,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        partition: int = -1,
        offset: int = -1,
    ) -> None:
        try:
            k = self.key_serde.deserialize(key)
            v = self.value_serde.deserialize(value)
        except Exception as exc:
            where = f"{self.topic}-{partition}@{offset}" if offset >= 0 else f"of {self.topic}"
            error = DeserializationError(
                f"record {where} cannot be decoded (key serde {self.key_serde.name}, value serde "
                f"{self.value_serde.name}): {exc}"
            )
            if offset >= 0:
                error.topic_partition = (self.topic, partition)
                error.offset = offset
            error.__cause__ = exc
            ctx.undecodable(self.topic, partition, offset, key, value, timestamp, error)
            return
        if self.timestamp is None:
            ts = timestamp
        else:
            ts = self.timestamp(k, v, timestamp)
            if type(ts) is not int:
                ts = -1
        if ts < 0:
            ctx.count("dropped-records")  # as Kafka Streams: a record without a valid event time is skipped
            return
        ctx.advance_stream_time(ts)
        for child in self.children:
            child.process(ctx, k, v, ts)


class MapNode(Node):
    """``fn(key, value) -> (key, value)``."""

    def __init__(self, name: str, fn: Callable[[Any, Any], tuple[Any, Any]]) -> None:
        super().__init__(name)
        self.fn = fn

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        k, v = self.fn(key, value)
        self.forward(ctx, k, v, timestamp)


class MapValuesNode(Node):
    def __init__(self, name: str, fn: Callable[[Any], Any]) -> None:
        super().__init__(name)
        self.fn = fn

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        self.forward(ctx, key, self.fn(value), timestamp)


class SelectKeyNode(Node):
    def __init__(self, name: str, fn: Callable[[Any, Any], Any]) -> None:
        super().__init__(name)
        self.fn = fn

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        self.forward(ctx, self.fn(key, value), value, timestamp)


class FilterNode(Node):
    def __init__(self, name: str, predicate: Callable[[Any, Any], bool]) -> None:
        super().__init__(name)
        self.predicate = predicate

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        if self.predicate(key, value):
            self.forward(ctx, key, value, timestamp)


class FlatMapNode(Node):
    """``fn(key, value) -> iterable of (key, value)``."""

    def __init__(self, name: str, fn: Callable[[Any, Any], Iterable[tuple[Any, Any]]]) -> None:
        super().__init__(name)
        self.fn = fn

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        for k, v in self.fn(key, value):
            self.forward(ctx, k, v, timestamp)


class PeekNode(Node):
    def __init__(self, name: str, fn: Callable[[Any, Any], Any]) -> None:
        super().__init__(name)
        self.fn = fn

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        self.fn(key, value)
        self.forward(ctx, key, value, timestamp)


class BranchNode(Node):
    """Sends each record to the child of the first predicate it matches (and nowhere if none does)."""

    def __init__(self, name: str, predicates: list[Callable[[Any, Any], bool]]) -> None:
        super().__init__(name)
        self.predicates = predicates

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        for predicate, child in zip(self.predicates, self.children, strict=True):
            if predicate(key, value):
                child.process(ctx, key, value, timestamp)
                return


class SinkNode(Node):
    """Writes to a topic, partitioned by the serialized key (Kafka's partitioner)."""

    def __init__(
        self, name: str, topic: str, key_serde: Serde, value_serde: Serde, *, internal: bool = False
    ):
        super().__init__(name)
        self.topic = topic
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.internal = internal

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        ctx.send(self.topic, self.key_serde.serialize(key), self.value_serde.serialize(value), timestamp)


class TableSourceNode(Node):
    """Materializes a topic as a table: each record upserts its key (a None value deletes it) and is
    forwarded as the table's change."""

    def __init__(self, name: str, store: str) -> None:
        super().__init__(name)
        self.store = store

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        if key is None:
            ctx.count("dropped-records")
            return
        ctx.store(self.store).put(key, value)
        self.forward(ctx, key, value, timestamp)


class AggregateNode(Node):
    """Folds each record into its key's aggregate (``aggregator(key, value, old or MISSING)``), stores it and
    forwards ``(key, new aggregate)``. Records with a None key or value are skipped, as in Kafka Streams."""

    def __init__(self, name: str, store: str, aggregator: Aggregator) -> None:
        super().__init__(name)
        self.store = store
        self.aggregator = aggregator

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        if key is None or value is None:
            ctx.count("dropped-records")
            return
        store = ctx.store(self.store)
        agg = self.aggregator(key, value, store.get(key, MISSING))
        store.put(key, agg)
        self.forward(ctx, key, agg, timestamp)


class TableGroupByNode(Node):
    """The first half of a table's ``group_by`` (Kafka's ``KTableRepartitionMap``): each change of a row maps
    to ``selector(key, value) -> (group, group_value)``. A table forwards new values only, so the row's
    previous mapping is kept in the store ``store`` (``key -> [group, group_value]``, logged) to be taken out
    of its group. Forwards ``(group, [old, new])`` pairs, for the repartition topic: one record when the row
    stays in its group, else ``[old, None]`` to the old group and then ``[None, new]`` to the new one. A row
    deleted (None), or mapped to a None group or value, leaves its group."""

    def __init__(self, name: str, store: str, selector: Callable[[Any, Any], tuple[Any, Any]]) -> None:
        super().__init__(name)
        self.store = store
        self.selector = selector

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        if key is None:
            ctx.count("dropped-records")
            return
        store = ctx.store(self.store)
        old = store.get(key)
        new = None
        if value is not None:
            group, group_value = self.selector(key, value)
            if group is not None and group_value is not None:
                new = [group, group_value]
        store.put(key, new)
        if old is not None and new is not None and old[0] == new[0]:
            self.forward(ctx, new[0], [old[1], new[1]], timestamp)
            return
        if old is not None:
            self.forward(ctx, old[0], [old[1], None], timestamp)
        if new is not None:
            self.forward(ctx, new[0], [None, new[1]], timestamp)


class TableAggregateNode(Node):
    """The second half of a table's ``group_by`` (Kafka's ``KTableAggregate``): for each ``(group, [old,
    new])``, ``subtractor(group, old, aggregate)`` takes the old value out, then ``adder(group, new, aggregate
    or MISSING)`` puts the new one in; the result is stored and forwarded. An aggregate that becomes None
    deletes the group's row (a later value starts again from MISSING)."""

    def __init__(self, name: str, store: str, adder: Aggregator, subtractor: Aggregator) -> None:
        super().__init__(name)
        self.store = store
        self.adder = adder
        self.subtractor = subtractor

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        if key is None or not isinstance(value, list | tuple) or len(value) != 2:
            ctx.count("dropped-records")
            return
        old, new = value
        store = ctx.store(self.store)
        before = agg = store.get(key, MISSING)
        if old is not None and agg is not MISSING:
            agg = self.subtractor(key, old, agg)
            if agg is None:
                agg = MISSING
        if new is not None:
            agg = self.adder(key, new, agg)
        result = None if agg is MISSING else agg
        if result is None and before is MISSING:
            return  # nothing was there, nothing is
        store.put(key, result)
        self.forward(ctx, key, result, timestamp)


class WindowCloseNode(Node):
    """Takes a windowed aggregation's windows once each, when they close (``emit="final"``, Kafka's
    ``suppress(untilWindowCloses)``): the aggregation sends its updates to its other children and each closed
    window, stamped with its latest record's time, to these. The window store is the buffer: a window is held
    there until it closes anyway, logged, so nothing more is kept (nor logged) for the suppression."""


class WindowedNode(Node):
    """A windowed aggregation: :meth:`forward` sends updates to the children that are not
    :class:`WindowCloseNode`, :meth:`forward_final` closed windows to those that are."""

    _split: tuple[list[Node], list[Node]] | None = None

    def _children(self) -> tuple[list[Node], list[Node]]:
        # the topology is frozen before the first record: split once
        split = self._split
        if split is None:
            final: list[Node] = [c for c in self.children if isinstance(c, WindowCloseNode)]
            split = self._split = ([c for c in self.children if c not in final], final)
        return split

    def forward(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        for child in self._children()[0]:
            child.process(ctx, key, value, timestamp)

    def forward_final(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        for child in self._children()[1]:
            child.process(ctx, key, value, timestamp)


class SuppressNode(Node):
    """Kafka's ``suppress(untilTimeLimit(...))`` of a table: each change is held in the buffer ``store``
    (:class:`~pylog.streams.stores.SuppressBuffer`, logged: under exactly-once what is held survives a crash
    exactly as committed), a later change of the same key replacing it in place, and forwarded (the key's
    latest value, with its timestamp) once the stream time of the operation has reached the key's first held
    time plus ``time_limit_ms``, oldest first. When the buffer holds more than ``max_records`` keys or
    ``max_bytes`` bytes, the oldest are forwarded early (``when_full="emit_early"``) or the application
    stops (``"shutdown"``: :class:`~pylog.errors.IllegalStateError`). By event time, as Kafka: nothing is
    forwarded while no record comes."""

    def __init__(
        self,
        name: str,
        store: str,
        time_limit_ms: int,
        max_records: int | None,
        max_bytes: int | None,
        shutdown_when_full: bool,
        windowed: bool = False,
    ) -> None:
        super().__init__(name)
        self.store = store
        self.time_limit_ms = time_limit_ms
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.shutdown_when_full = shutdown_when_full
        self.windowed = windowed  # keys are Windowed (held as plain tuples after a restore)

    def _emit(self, ctx: Context, buffer: SuppressBuffer) -> None:
        key, value, timestamp = buffer.evict()
        self.forward(ctx, Windowed(*key) if self.windowed else key, value, timestamp)

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        if key is None:
            ctx.count("dropped-records")
            return
        buffer: SuppressBuffer = ctx.stores[self.store]  # type: ignore[assignment]
        expiry = buffer.advance(timestamp) - self.time_limit_ms
        buffer.buffer(key, value, timestamp)
        while (oldest := buffer.oldest()) is not None and oldest <= expiry:
            self._emit(ctx, buffer)
        while (self.max_records is not None and len(buffer) > self.max_records) or (
            self.max_bytes is not None and buffer.bytes > self.max_bytes
        ):
            if self.shutdown_when_full:
                raise IllegalStateError(
                    f"the suppression buffer {self.store} is full ({len(buffer)} keys, {buffer.bytes} bytes; "
                    f"max_records {self.max_records}, max_bytes {self.max_bytes}) and when_full='shutdown'"
                )
            self._emit(ctx, buffer)


class WindowAggregateNode(WindowedNode):
    """Folds each record into every open window holding its event time (see :mod:`pylog.streams.windows`),
    keyed :class:`~pylog.streams.windows.Windowed`. A record none of whose windows is open is late: counted
    (``late-records``) and, with ``late_topic``, written there (key and value as msgpack, its timestamp)."""

    def __init__(
        self,
        name: str,
        store: str,
        windows: Windows,
        aggregator: Aggregator,
        late_topic: str | None,
    ) -> None:
        super().__init__(name)
        self.store = store
        self.windows = windows
        self.aggregator = aggregator
        self.late_topic = late_topic

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        if key is None or value is None:
            ctx.count("dropped-records")
            return
        store: WindowStore = ctx.stores[self.store]  # type: ignore[assignment]
        size, grace = self.windows.size_ms, self.windows.grace_ms
        stream_time = store.advance(timestamp)
        update = bool(self._children()[0])
        taken = False
        for start in self.windows.starts(timestamp):
            if start + size + grace <= stream_time:
                continue  # closed
            agg = store.fold((key, start), timestamp, key, value, self.aggregator)
            taken = True
            if update:
                self.forward(ctx, Windowed(key, start, start + size), agg, timestamp)
        if not taken:
            ctx.count("late-records")
            if self.late_topic is not None:
                ctx.send(self.late_topic, MSGPACK.serialize(key), MSGPACK.serialize(value), timestamp)
        if store.closes_by(stream_time - grace):
            final = self._children()[1]
            for k, start, (agg, max_ts) in store.closing(stream_time - grace):
                if final:
                    self.forward_final(ctx, Windowed(k, start, start + size), agg, max_ts)


class StreamTableJoinNode(Node):
    """Joins each stream record with the table's current value for its key: ``joiner(value, table_value)``;
    ``left``: also when the key is not in the table (``table_value`` None). Records with a None key or value
    are skipped, as in Kafka Streams."""

    def __init__(self, name: str, getter: Getter, joiner: Callable[[Any, Any], Any], left: bool) -> None:
        super().__init__(name)
        self.getter = getter
        self.joiner = joiner
        self.left = left

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        if key is None or value is None:
            ctx.count("dropped-records")
            return
        other = self.getter(ctx, key)
        if other is None and not self.left:
            return
        self.forward(ctx, key, self.joiner(value, other), timestamp)


class TableViewNode(Node):
    """A table derived from another (``filter``, ``map_values``): each change ``(key, value)`` is forwarded as
    ``(key, fn(key, value))``, a deletion (None) as a deletion; ``fn`` returns None to drop the key."""

    def __init__(self, name: str, fn: Callable[[Any, Any], Any]) -> None:
        super().__init__(name)
        self.fn = fn

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        self.forward(ctx, key, None if value is None else self.fn(key, value), timestamp)


class TableJoinNode(Node):
    """One side of a table-table join: a change on this side looks the key up on the other side
    (``other``) and forwards ``(key, joiner(left_value, right_value))``, or a deletion when the join has no
    result (inner: either side missing; left: the left side missing)."""

    def __init__(
        self, name: str, other: Getter, joiner: Callable[[Any, Any], Any], *, is_left: bool, outer: bool
    ) -> None:
        super().__init__(name)
        self.other = other
        self.joiner = joiner
        self.is_left = is_left
        self.outer = outer

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        if key is None:
            return
        other = self.other(ctx, key)
        lv, rv = (value, other) if self.is_left else (other, value)
        joined = None
        if lv is not None and (rv is not None or self.outer):
            joined = self.joiner(lv, rv)
        self.forward(ctx, key, joined, timestamp)


class SessionAggregateNode(WindowedNode):
    """Session windows (see :mod:`pylog.streams.windows`): each record opens a session ``[t, t]`` or merges
    with its key's open sessions within ``gap`` (their aggregates combined by ``merger``). Updates: each
    merged-away session is forwarded with a None value (a tombstone), then the new one; to a
    :class:`WindowCloseNode`, each session once, when it closes. Late records as in
    :class:`WindowAggregateNode`."""

    def __init__(
        self,
        name: str,
        store: str,
        windows: SessionWindows,
        aggregator: Aggregator,
        merger: Callable[[Any, Any, Any], Any],
        late_topic: str | None,
    ) -> None:
        super().__init__(name)
        self.store = store
        self.windows = windows
        self.aggregator = aggregator
        self.merger = merger
        self.late_topic = late_topic

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        if key is None or value is None:
            ctx.count("dropped-records")
            return
        store = ctx.store(self.store)
        if not isinstance(store, SessionStore):
            raise TypeError(f"store {self.store} is not a session store")
        gap = self.windows.gap_ms
        stream_time = store.advance(timestamp)
        close_before = stream_time - gap - self.windows.grace_ms  # a session ending before this is closed
        found = [
            (s, e, a)
            for s, e, a in store.sessions(key)
            if e >= timestamp - gap and s <= timestamp + gap and e >= close_before
        ]
        start = min([timestamp, *(s for s, _, _ in found)])
        end = max([timestamp, *(e for _, e, _ in found)])
        if end < close_before:
            ctx.count("late-records")
            if self.late_topic is not None:
                ctx.send(self.late_topic, MSGPACK.serialize(key), MSGPACK.serialize(value), timestamp)
        else:
            agg = MISSING
            for s, e, a in found:
                store.delete((key, s))
                self.forward(ctx, Windowed(key, s, e), None, timestamp)
                agg = a if agg is MISSING else self.merger(key, agg, a)
            agg = self.aggregator(key, value, agg)
            store.put((key, start), (agg, end))
            self.forward(ctx, Windowed(key, start, end), agg, timestamp)
        for k, s, (agg, e) in store.closing(close_before):
            self.forward_final(ctx, Windowed(k, s, e), agg, e)


class StreamStreamJoinNode(Node):
    """One side of a stream-stream join (Kafka's KStream-KStream join): each record is kept in this side's
    buffer and joined with every record of the other side's buffer with the same key and an event time within
    ``time_difference``, in their arrival order; the result, ``joiner(left_value, right_value)``, is stamped
    with the later of the two times. Both sides share the join's stream time (the later of their buffers'); a
    record more than ``time_difference + grace`` behind it is late (counted, not joined); records that can no
    longer join anything are dropped from the buffers, and for a left (outer) join those of the left (either)
    side that joined nothing are then forwarded as ``joiner(value, None)`` (``joiner(None, value)``), stamped
    with their own time: the left side's first, by time and arrival."""

    def __init__(
        self,
        name: str,
        mine: str,
        theirs: str,
        windows: JoinWindows,
        joiner: Callable[[Any, Any], Any],
        *,
        is_left: bool,
        unjoined: tuple[bool, bool] = (False, False),
    ) -> None:
        super().__init__(name)
        self.mine = mine
        self.theirs = theirs
        self.windows = windows
        self.joiner = joiner
        self.is_left = is_left
        self.unjoined = unjoined  # (left, right): forward the records of that side that joined nothing

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        if key is None or value is None:
            ctx.count("dropped-records")
            return
        mine: JoinBufferStore = ctx.stores[self.mine]  # type: ignore[assignment]
        theirs: JoinBufferStore = ctx.stores[self.theirs]  # type: ignore[assignment]
        diff, grace = self.windows.time_difference_ms, self.windows.grace_ms
        stream_time = max(mine.advance(timestamp), theirs.stream_time)
        if timestamp < stream_time - diff - grace:
            ctx.count("late-records")
            return
        met = False
        for ts, seq, other in theirs.matches(key, timestamp - diff, timestamp + diff):
            joined = self.joiner(value, other) if self.is_left else self.joiner(other, value)
            self.forward(ctx, key, joined, max(timestamp, ts))
            theirs.mark(key, ts, seq)
            met = True
        mine.add(key, timestamp, value, met)
        horizon = stream_time - 2 * diff - grace  # a record older than this cannot meet a record not late
        left, right = (mine, theirs) if self.is_left else (theirs, mine)
        for k, ts, v in left.purge(horizon):
            if self.unjoined[0]:
                self.forward(ctx, k, self.joiner(v, None), ts)
        for k, ts, v in right.purge(horizon):
            if self.unjoined[1]:
                self.forward(ctx, k, self.joiner(None, v), ts)


class SlidingAggregateNode(WindowedNode):
    """Sliding windows (:class:`~pylog.streams.windows.SlidingWindows`): a record updates every open window of
    its key that holds it, and creates the windows it defines that do not exist yet (the one ending at it, the
    one starting just after it when a later record is in it, and those starting just after earlier records
    now followed by it), each folded from the key's kept records in arrival order. Updates: every window
    the record created or changed, by start; to a :class:`WindowCloseNode`, each window once, when it
    closes. Keys are :class:`~pylog.streams.windows.Windowed` with an inclusive ``end``."""

    def __init__(
        self,
        name: str,
        store: str,
        windows: SlidingWindows,
        aggregator: Aggregator,
        late_topic: str | None,
    ) -> None:
        super().__init__(name)
        self.store = store
        self.windows = windows
        self.aggregator = aggregator
        self.late_topic = late_topic

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        if key is None or value is None:
            ctx.count("dropped-records")
            return
        store: SlidingStore = ctx.stores[self.store]  # type: ignore[assignment]
        d = self.windows.time_difference_ms
        close_before = store.advance(timestamp) - self.windows.grace_ms  # a window ending before is closed
        if timestamp + d < close_before:
            ctx.count("late-records")
            if self.late_topic is not None:
                ctx.send(self.late_topic, MSGPACK.serialize(key), MSGPACK.serialize(value), timestamp)
        else:
            self._take(ctx, store, key, value, timestamp, d, close_before)
        for k, start, agg, max_ts in store.closing(close_before):
            self.forward_final(ctx, Windowed(k, start, start + d), agg, max_ts)
        store.purge(
            close_before - d - 1
        )  # a record also defines the window just after it: [t + 1, t + 1 + d]

    def _take(
        self, ctx: Context, store: SlidingStore, key: Any, value: Any, ts: int, d: int, close_before: int
    ) -> None:
        changed: dict[int, Any] = {}
        for start in store.window_starts(key):
            if start <= ts <= start + d and start + d >= close_before:
                agg, max_ts, created = store.window(key, start)  # type: ignore[misc]
                agg = self.aggregator(key, value, agg)
                store.set_window(key, start, agg, max(max_ts, ts), created)
                changed[start] = agg
        store.add_record(key, ts, value)
        candidates = {ts - d}
        if store.records(key, ts + 1, ts + 1 + d):
            candidates.add(ts + 1)
        candidates.update(t + 1 for t, _ in store.records(key, ts - 1 - d, ts - 1))
        for start in sorted(candidates):
            if start + d < close_before or store.window(key, start) is not None:
                continue
            agg, max_ts = MISSING, -1
            for t, v in store.records(key, start, start + d):
                agg, max_ts = self.aggregator(key, v, agg), max(max_ts, t)
            store.set_window(key, start, agg, max_ts, store.next_created())
            changed[start] = agg
        if self._children()[0]:
            for start in sorted(changed):
                self.forward(ctx, Windowed(key, start, start + d), changed[start], ts)


def value_hash(value: Any) -> bytes:
    """A digest of a value as msgpack, the same in every process (Python's ``hash`` of a str is not)."""
    return hashlib.blake2b(MSGPACK.encode(value), digest_size=12).digest()


UNSUBSCRIBE, SUBSCRIBE = 0, 1


class ForeignKeySubscribeNode(Node):
    """The left side of a foreign-key join (Kafka's ``SubscriptionSendProcessor``). Each change of a left row
    ``(key, value)`` extracts ``foreign_key(value)``; the row's previous foreign key is kept in the store
    ``store`` (``key -> foreign_key``, logged), since a table forwards new values only. A row that leaves a
    foreign key unsubscribes from it; a row with a foreign key subscribes to it, which the right side answers
    with its current row. Records to ``subscription_topic`` are keyed by the foreign key, encoded with the
    right table's key serde so that they land in the partition of the right row; their value is
    ``[encoded_key, value_hash, SUBSCRIBE or UNSUBSCRIBE, this task's partition]``. A row deleted, or
    without a foreign key, has its result forwarded here at once: a deletion, or for a left join
    ``joiner(value, None)``."""

    def __init__(
        self,
        name: str,
        store: str,
        foreign_key: Callable[[Any], Any],
        joiner: Callable[[Any, Any], Any],
        left: bool,
        subscription_topic: str,
        foreign_key_serde: Serde,
    ) -> None:
        super().__init__(name)
        self.store = store
        self.foreign_key = foreign_key
        self.joiner = joiner
        self.left = left
        self.subscription_topic = subscription_topic
        self.foreign_key_serde = foreign_key_serde

    def _subscription(
        self, ctx: Context, fk: Any, key: bytes, digest: bytes | None, op: int, ts: int
    ) -> None:
        value = MSGPACK.serialize([key, digest, op, ctx.partition])
        ctx.send(self.subscription_topic, self.foreign_key_serde.serialize(fk), value, ts)

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        if key is None:
            ctx.count("dropped-records")
            return
        store = ctx.store(self.store)
        old_fk = store.get(key)
        new_fk = None if value is None else self.foreign_key(value)
        store.put(key, new_fk)
        encoded = encode_key(key)
        if old_fk is not None and old_fk != new_fk:
            self._subscription(ctx, old_fk, encoded, None, UNSUBSCRIBE, timestamp)
        if new_fk is not None:
            self._subscription(ctx, new_fk, encoded, value_hash(value), SUBSCRIBE, timestamp)
        elif value is not None and self.left:
            self.forward(ctx, key, self.joiner(value, None), timestamp)
        else:
            self.forward(ctx, key, None, timestamp)


class ForeignKeySubscriptionNode(Node):
    """The right side of a foreign-key join, for the subscription topic (Kafka's
    ``SubscriptionReceiveProcessor`` and ``SubscriptionJoinProcessor``): records the subscription in the
    :class:`~pylog.streams.stores.SubscriptionStore` ``store`` (or removes it) and answers a subscription with
    the right table's current row for the foreign key (``right``), written to ``response_topic`` keyed by the
    left row's encoded key, in the left row's partition: ``[value_hash, right_value or None]``."""

    def __init__(self, name: str, store: str, right: Getter, response_topic: str) -> None:
        super().__init__(name)
        self.store = store
        self.right = right
        self.response_topic = response_topic

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        if key is None or not isinstance(value, list | tuple) or len(value) != 4:
            ctx.count("dropped-records")
            return
        left_key, digest, op, partition = value
        store = ctx.store(self.store)
        if op == UNSUBSCRIBE:
            store.delete((key, left_key))
            return
        store.put((key, left_key), [digest, partition])
        answer = MSGPACK.serialize([digest, self.right(ctx, key)])
        ctx.send(self.response_topic, left_key, answer, timestamp, partition)


class ForeignKeyRightChangeNode(Node):
    """A change of a right row of a foreign-key join: every left row subscribed to its key gets a response
    (as :class:`ForeignKeySubscriptionNode`'s) with the new right value (None when deleted)."""

    def __init__(self, name: str, store: str, response_topic: str) -> None:
        super().__init__(name)
        self.store = store
        self.response_topic = response_topic

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        if key is None:
            return
        store: SubscriptionStore = ctx.stores[self.store]  # type: ignore[assignment]
        for left_key, (digest, partition) in store.subscribers(key):
            ctx.send(self.response_topic, left_key, MSGPACK.serialize([digest, value]), timestamp, partition)


class ForeignKeyResponseNode(Node):
    """The left side of a foreign-key join, for the response topic (Kafka's
    ``ResponseJoinProcessor``): a response whose value hash is not the hash of the left row's current value
    (``left``) answers an older version of the row and is dropped; otherwise it forwards ``joiner(value,
    right_value)``, or when there is no right row a deletion (inner join) or ``joiner(value, None)`` (left
    join)."""

    def __init__(self, name: str, left: Getter, joiner: Callable[[Any, Any], Any], left_join: bool) -> None:
        super().__init__(name)
        self.left = left
        self.joiner = joiner
        self.left_join = left_join

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        if key is None or not isinstance(value, list | tuple) or len(value) != 2:
            ctx.count("dropped-records")
            return
        digest, right_value = value
        left_value = self.left(ctx, key)
        if left_value is None or value_hash(left_value) != digest:
            ctx.count("stale-join-responses")
            return
        if right_value is not None:
            self.forward(ctx, key, self.joiner(left_value, right_value), timestamp)
        elif self.left_join:
            self.forward(ctx, key, self.joiner(left_value, None), timestamp)
        else:
            self.forward(ctx, key, None, timestamp)


class GlobalJoinNode(Node):
    """Joins each stream record with a global table (every partition of its topic, in every process): the
    lookup key is ``key_fn(key, value)``, the result ``joiner(value, table_value)``; ``left``: also when the
    lookup finds nothing (``table_value`` None)."""

    def __init__(
        self,
        name: str,
        store: KeyValueStore,
        key_fn: Callable[[Any, Any], Any],
        joiner: Callable[[Any, Any], Any],
        left: bool,
    ) -> None:
        super().__init__(name)
        self.store = store
        self.key_fn = key_fn
        self.joiner = joiner
        self.left = left

    def process(self, ctx: Context, key: Any, value: Any, timestamp: int) -> None:
        if value is None:
            ctx.count("dropped-records")
            return
        lookup = self.key_fn(key, value)
        other = None if lookup is None else self.store.get(lookup)
        if other is None and not self.left:
            return
        self.forward(ctx, key, self.joiner(value, other), timestamp)
