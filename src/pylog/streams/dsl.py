"""The DSL: :class:`Stream` (every record is an event), :class:`Table` (the latest value per key),
:class:`GroupedStream` and :class:`WindowedStream` (a stream grouped by key, before an aggregation).

Every method adds a node to the application's topology and returns a new object; nothing runs until the
application is started (or driven by :class:`~pylog.streams.driver.TestDriver`). Functions take the record's
``(key, value)`` as Kafka Streams' do, except ``map_values`` and ``flat_map_values`` which take the value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, overload

from pylog.errors import ConfigError
from pylog.streams.nodes import (
    AggregateNode,
    Aggregator,
    BranchNode,
    FilterNode,
    FlatMapNode,
    ForeignKeyResponseNode,
    ForeignKeyRightChangeNode,
    ForeignKeySubscribeNode,
    ForeignKeySubscriptionNode,
    Getter,
    GlobalJoinNode,
    MapNode,
    MapValuesNode,
    Node,
    PeekNode,
    SelectKeyNode,
    SessionAggregateNode,
    SinkNode,
    SlidingAggregateNode,
    StreamStreamJoinNode,
    StreamTableJoinNode,
    SuppressNode,
    TableAggregateNode,
    TableGroupByNode,
    TableJoinNode,
    TableSourceNode,
    TableViewNode,
    WindowAggregateNode,
    WindowCloseNode,
    WindowedNode,
)
from pylog.streams.processor import ProcessNode, Processor
from pylog.streams.serde import MSGPACK, MSGPACK_KEY, Serde
from pylog.streams.stores import MISSING, KeyValueStore
from pylog.streams.windows import WINDOWED, JoinWindows, SessionWindows, SlidingWindows, Windows, to_ms

if TYPE_CHECKING:
    from pylog.streams.app import App

__all__ = [
    "GlobalTable",
    "GroupedStream",
    "GroupedTable",
    "SessionWindowedStream",
    "Stream",
    "Table",
    "WindowedStream",
]


class Stream:
    """A record stream (Kafka's ``KStream``). ``key_changed``: an operation since the source may have changed
    the key, so grouping goes through a repartition topic. ``key_serde``: the serde whose encoding of the keys
    placed the records in their partitions, when known (what a foreign-key join needs of a table)."""

    def __init__(
        self,
        app: App,
        node: Node,
        *,
        key_changed: bool = False,
        windowed: bool = False,
        key_serde: Serde | None = None,
    ) -> None:
        self.app = app
        self.node = node
        self.key_changed = key_changed
        self.windowed = windowed
        self.key_serde = None if key_changed else key_serde

    def _then(self, node: Node, *, key_changed: bool | None = None) -> Stream:
        self.app.builder.check_open()
        self.node.children.append(node)
        changed = self.key_changed if key_changed is None else key_changed
        return Stream(
            self.app,
            node,
            key_changed=changed,
            windowed=self.windowed and not changed,
            key_serde=self.key_serde,
        )

    # -- stateless --------------------------------------------------------------------------------------

    def map(self, fn: Callable[[Any, Any], tuple[Any, Any]]) -> Stream:
        """``fn(key, value) -> (new_key, new_value)`` for each record."""
        return self._then(MapNode(self.app.builder.name("map"), fn), key_changed=True)

    def map_values(self, fn: Callable[[Any], Any]) -> Stream:
        """``fn(value) -> new_value``; the key is kept (no repartition needed to group by it)."""
        return self._then(MapValuesNode(self.app.builder.name("map-values"), fn))

    def select_key(self, fn: Callable[[Any, Any], Any]) -> Stream:
        """``fn(key, value) -> new_key``; the value is kept."""
        return self._then(SelectKeyNode(self.app.builder.name("select-key"), fn), key_changed=True)

    def filter(self, predicate: Callable[[Any, Any], bool]) -> Stream:
        """Keep the records for which ``predicate(key, value)`` is true."""
        return self._then(FilterNode(self.app.builder.name("filter"), predicate))

    def filter_not(self, predicate: Callable[[Any, Any], bool]) -> Stream:
        """Drop the records for which ``predicate(key, value)`` is true."""
        return self.filter(lambda k, v: not predicate(k, v))

    def flat_map(self, fn: Callable[[Any, Any], Iterable[tuple[Any, Any]]]) -> Stream:
        """``fn(key, value) -> iterable of (key, value)``: zero, one or many records for each."""
        return self._then(FlatMapNode(self.app.builder.name("flat-map"), fn), key_changed=True)

    def flat_map_values(self, fn: Callable[[Any], Iterable[Any]]) -> Stream:
        """``fn(value) -> iterable of values``, each with the record's key."""
        node = FlatMapNode(self.app.builder.name("flat-map-values"), lambda k, v: ((k, x) for x in fn(v)))
        return self._then(node)

    def peek(self, fn: Callable[[Any, Any], Any]) -> Stream:
        """Call ``fn(key, value)`` for each record (a side effect: logging, metrics) and pass it on.
        Under exactly-once, records of an aborted transaction are processed again: ``fn`` may see them twice."""
        return self._then(PeekNode(self.app.builder.name("peek"), fn))

    def branch(self, *predicates: Callable[[Any, Any], bool]) -> list[Stream]:
        """One stream per predicate: each record goes to the first whose ``predicate(key, value)`` is true,
        and is dropped when none is (end with ``lambda k, v: True`` for a default branch)."""
        if not predicates:
            raise ConfigError("branch() needs at least one predicate")
        node = BranchNode(self.app.builder.name("branch"), list(predicates))
        self._then(node)
        out = []
        for _ in predicates:
            child = Node(self.app.builder.name("branch-child"))
            node.children.append(child)
            out.append(
                Stream(
                    self.app,
                    child,
                    key_changed=self.key_changed,
                    windowed=self.windowed,
                    key_serde=self.key_serde,
                )
            )
        return out

    def merge(self, *others: Stream) -> Stream:
        """One stream of the records of this one and ``others`` (their sources must be co-partitioned: same
        partition count)."""
        node = Node(self.app.builder.name("merge"))
        changed = self.key_changed
        serdes = set()
        for s in (self, *others):
            if s.app is not self.app:
                raise ConfigError("merge() needs streams of the same App")
            s.node.children.append(node)
            changed = changed or s.key_changed
            serdes.add(s.key_serde)
        return Stream(
            self.app, node, key_changed=changed, key_serde=serdes.pop() if len(serdes) == 1 else None
        )

    def to(self, topic: str, *, key_serde: Serde | None = None, value_serde: Serde | None = None) -> None:
        """Write every record to ``topic`` (it must exist), with the application's serdes unless given
        (a windowed stream's keys, :class:`~pylog.streams.windows.Windowed`, default to
        :data:`~pylog.streams.windows.WINDOWED`: msgpack ``[key, start, end]``)."""
        default_key = WINDOWED if self.windowed else self.app.key_serde
        sink = SinkNode(
            self.app.builder.name("sink"),
            topic,
            key_serde or default_key,
            value_serde or self.app.value_serde,
        )
        self._then(sink)
        self.app.builder.add_sink(sink)

    def process(self, processor: Callable[[], Processor], *, stores: Sequence[str] = ()) -> Stream:
        """Run ``processor()`` (a :class:`~pylog.streams.processor.Processor` subclass or factory), one instance
        per task, with the key-value stores named in ``stores`` (created for it, logged to changelogs) and
        punctuators (:mod:`pylog.streams.processor`). Returns the stream of what it forwards (which may have
        new keys)."""
        builder = self.app.builder
        names = [builder.store_name(name, "store") for name in stores]
        node = ProcessNode(builder.name("process"), processor, names)
        out = self._then(node, key_changed=True)
        for name in names:
            builder.add_store(name, node, windowed=None)
        return out

    # -- joins ------------------------------------------------------------------------------------------

    def join(
        self,
        table: Table | Stream,
        joiner: Callable[[Any, Any], Any],
        windows: JoinWindows | None = None,
        *,
        left: bool = False,
        name: str | None = None,
    ) -> Stream:
        """Join each record with ``table``'s current value for its key (Kafka's KStream-KTable join):
        ``joiner(value, table_value)``; a record whose key is not in the table is dropped, or joined with
        None when ``left``. Only stream records trigger a join; a table update does not. The stream and the
        table's source must be co-partitioned (same partition count, same keys in the same partitions); a
        stream whose key may have changed goes through a repartition topic first.

        With another :class:`Stream` and ``windows`` (:class:`~pylog.streams.windows.JoinWindows`): Kafka's
        KStream-KStream join, ``joiner(value, other_value)`` for every pair of records with the same key
        and event times at most ``time_difference`` apart (see
        :class:`~pylog.streams.nodes.StreamStreamJoinNode`); each side's recent records are kept in the stores
        ``<name>-left`` and ``<name>-right``, logged to changelogs. With ``left``, each record of this stream
        that joined nothing gives ``joiner(value, None)`` once no later record can join it (Kafka's
        ``leftJoin``; :meth:`outer_join` for both sides)."""
        if isinstance(table, Stream):
            return self._join_stream(table, joiner, windows, (left, False), name)
        if isinstance(table, GlobalTable):
            raise ConfigError("a global table is joined with join_global(table, key, joiner)")
        if not isinstance(table, Table) or table.app is not self.app:
            raise ConfigError("join() takes a Table or a Stream of the same App")
        if table.windowed:
            raise ConfigError("join() with a windowed table is not supported")
        builder = self.app.builder
        name = builder.name("join")
        node = StreamTableJoinNode(name, _lookup(table), joiner, left)
        parent = builder.repartition(self.node, name, table.key_serde) if self.key_changed else self.node
        builder.check_open()
        parent.children.append(node)
        table.node.lookups.append(node)
        serde = (table.key_serde or MSGPACK_KEY) if self.key_changed else self.key_serde
        return Stream(self.app, node, key_serde=serde)

    def outer_join(
        self,
        other: Stream,
        joiner: Callable[[Any, Any], Any],
        windows: JoinWindows,
        *,
        name: str | None = None,
    ) -> Stream:
        """Kafka's KStream-KStream outer join: as :meth:`join` with ``left=True``, and a record of ``other``
        that joined nothing gives ``joiner(None, other_value)`` too."""
        if not isinstance(other, Stream):
            raise ConfigError("outer_join() takes a Stream (and JoinWindows)")
        return self._join_stream(other, joiner, windows, (True, True), name)

    def _join_stream(
        self,
        other: Stream,
        joiner: Callable[[Any, Any], Any],
        windows: JoinWindows | None,
        unjoined: tuple[bool, bool],
        name: str | None,
    ) -> Stream:
        if other.app is not self.app:
            raise ConfigError("join() takes a Stream of the same App")
        if not isinstance(windows, JoinWindows):
            raise ConfigError("a stream-stream join needs windows=JoinWindows(time_difference, grace)")
        builder = self.app.builder
        base = builder.store_name(name, "join")
        stores = (builder.store_name(f"{base}-left", "join"), builder.store_name(f"{base}-right", "join"))
        nodes = (
            StreamStreamJoinNode(
                builder.name("join-left"),
                stores[0],
                stores[1],
                windows,
                joiner,
                is_left=True,
                unjoined=unjoined,
            ),
            StreamStreamJoinNode(
                builder.name("join-right"),
                stores[1],
                stores[0],
                windows,
                joiner,
                is_left=False,
                unjoined=unjoined,
            ),
        )
        out = Node(builder.name("join-merge"))
        for side, node, store, suffix, partner in (
            (self, nodes[0], stores[0], "left", other),
            (other, nodes[1], stores[1], "right", self),
        ):
            # a side that is not repartitioned keeps its partitioning: the other follows it
            serde = None if partner.key_changed else partner.key_serde
            parent = (
                builder.repartition(side.node, f"{base}-{suffix}", serde) if side.key_changed else side.node
            )
            parent.children.append(node)
            node.children.append(out)
            builder.add_store(store, node, windowed=windows)
        nodes[0].lookups.append(nodes[1])  # one task holds both buffers
        return Stream(self.app, out)

    def join_global(
        self,
        table: GlobalTable,
        key: Callable[[Any, Any], Any],
        joiner: Callable[[Any, Any], Any],
        *,
        left: bool = False,
    ) -> Stream:
        """Join each record with a :class:`GlobalTable` (Kafka's KStream-GlobalKTable join): look up
        ``key(record_key, value)`` and forward ``joiner(value, table_value)``; with ``left``, also when nothing
        is found (``table_value`` None). No co-partitioning and no repartition: every process holds the whole
        table. The record's key is kept."""
        if not isinstance(table, GlobalTable) or table.app is not self.app:
            raise ConfigError("join_global() takes a GlobalTable of the same App")
        node = GlobalJoinNode(self.app.builder.name("global-join"), table.store, key, joiner, left)
        return self._then(node)

    def left_join(self, table: Table, joiner: Callable[[Any, Any], Any]) -> Stream:
        """:meth:`join` with ``left=True``: records whose key is not in the table are joined with None."""
        return self.join(table, joiner, left=True)

    # -- grouping ---------------------------------------------------------------------------------------

    def group_by_key(self) -> GroupedStream:
        """Group by the current key, through a repartition topic only if an operation may have changed it."""
        return GroupedStream(self, repartition=self.key_changed)

    def group_by(self, fn: Callable[[Any, Any], Any]) -> GroupedStream:
        """Group by ``fn(key, value)``: records are written to the repartition topic
        ``<application_id>-<store>-repartition`` keyed by it, so that each key is aggregated by one task."""
        return GroupedStream(self.select_key(fn), repartition=True)


class GroupedStream:
    """A stream grouped by key (Kafka's ``KGroupedStream``): aggregate it, or window it first."""

    def __init__(self, stream: Stream, *, repartition: bool) -> None:
        self.stream = stream
        self.repartition = repartition

    @overload
    def windowed_by(
        self, windows: Windows, *, emit: str = "update", late_topic: str | None = None
    ) -> WindowedStream: ...

    @overload
    def windowed_by(
        self, windows: SessionWindows, *, emit: str = "update", late_topic: str | None = None
    ) -> SessionWindowedStream: ...

    @overload
    def windowed_by(
        self, windows: SlidingWindows, *, emit: str = "update", late_topic: str | None = None
    ) -> WindowedStream: ...

    def windowed_by(
        self,
        windows: Windows | SessionWindows | SlidingWindows,
        *,
        emit: str = "update",
        late_topic: str | None = None,
    ) -> WindowedStream | SessionWindowedStream:
        """Aggregate per window (:class:`~pylog.streams.windows.TumblingWindows`,
        :class:`~pylog.streams.windows.HoppingWindows`, :class:`~pylog.streams.windows.SessionWindows`).
        ``emit="update"`` forwards the aggregate after every record, ``"final"`` once per window when it
        closes. Late records are counted, and written to ``late_topic`` when given."""
        if emit not in ("update", "final"):
            raise ConfigError(f"emit must be 'update' or 'final', got {emit!r}")
        if isinstance(windows, SessionWindows):
            return SessionWindowedStream(self, windows, emit, late_topic)
        if not isinstance(windows, Windows | SlidingWindows):
            raise ConfigError(
                "windowed_by() takes TumblingWindows, HoppingWindows, SlidingWindows or SessionWindows, got "
                f"{windows!r}"
            )
        return WindowedStream(self, windows, emit, late_topic)

    def _node_input(self, store: str) -> Node:
        """Where the aggregation node attaches: the stream itself, or the source of its repartition topic."""
        if not self.repartition:
            return self.stream.node
        return self.stream.app.builder.repartition(self.stream.node, store)

    def _aggregate(self, aggregator: Callable[[Any, Any, Any], Any], name: str | None) -> Table:
        builder = self.stream.app.builder
        store = builder.store_name(name, "aggregate")
        node = AggregateNode(builder.name("aggregate"), store, aggregator)
        self._node_input(store).children.append(node)
        builder.add_store(store, node, windowed=None)
        return Table(
            self.stream.app, node, store, key_serde=MSGPACK_KEY if self.repartition else self.stream.key_serde
        )

    def count(self, name: str | None = None) -> Table:
        """The number of records per key (records with a None key or value are skipped)."""
        return self._aggregate(_count, name)

    def reduce(self, reducer: Callable[[Any, Any], Any], name: str | None = None) -> Table:
        """``reducer(aggregate, value) -> aggregate``; a key's first value is its first aggregate."""
        return self._aggregate(_reducer(reducer), name)

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        name: str | None = None,
    ) -> Table:
        """``aggregator(key, value, aggregate) -> aggregate``, starting from ``initializer()`` per key."""
        return self._aggregate(_aggregator(initializer, aggregator), name)


class WindowedStream:
    """A grouped stream cut into time windows (Kafka's ``TimeWindowedKStream``)."""

    def __init__(
        self, grouped: GroupedStream, windows: Windows | SlidingWindows, emit: str, late_topic: str | None
    ) -> None:
        self.grouped = grouped
        self.windows = windows
        self.emit = emit
        self.late_topic = late_topic

    def _aggregate(self, aggregator: Callable[[Any, Any, Any], Any], name: str | None) -> Table:
        builder = self.grouped.stream.app.builder
        store = builder.store_name(name, "window-aggregate")
        node: Node
        if isinstance(self.windows, SlidingWindows):
            node = SlidingAggregateNode(
                builder.name("sliding-aggregate"), store, self.windows, aggregator, self.late_topic
            )
        else:
            node = WindowAggregateNode(
                builder.name("window-aggregate"), store, self.windows, aggregator, self.late_topic
            )
        self.grouped._node_input(store).children.append(node)
        builder.add_store(store, node, windowed=self.windows)
        if self.late_topic is not None:
            builder.add_output_topic(self.late_topic, MSGPACK, MSGPACK)
        return _emitted(Table(self.grouped.stream.app, node, store, windowed=True), self.emit)

    def count(self, name: str | None = None) -> Table:
        """Records per key and window."""
        return self._aggregate(_count, name)

    def reduce(self, reducer: Callable[[Any, Any], Any], name: str | None = None) -> Table:
        return self._aggregate(_reducer(reducer), name)

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        name: str | None = None,
    ) -> Table:
        return self._aggregate(_aggregator(initializer, aggregator), name)


class SessionWindowedStream:
    """A grouped stream cut into session windows (Kafka's ``SessionWindowedKStream``); keys of the result are
    :class:`~pylog.streams.windows.Windowed` with an inclusive ``end`` (the session's last event time)."""

    def __init__(self, grouped: GroupedStream, windows: SessionWindows, emit: str, late_topic: str | None):
        self.grouped = grouped
        self.windows = windows
        self.emit = emit
        self.late_topic = late_topic

    def _aggregate(
        self,
        aggregator: Callable[[Any, Any, Any], Any],
        merger: Callable[[Any, Any, Any], Any],
        name: str | None,
    ) -> Table:
        builder = self.grouped.stream.app.builder
        store = builder.store_name(name, "session-aggregate")
        node = SessionAggregateNode(
            builder.name("session-aggregate"),
            store,
            self.windows,
            aggregator,
            merger,
            self.late_topic,
        )
        self.grouped._node_input(store).children.append(node)
        builder.add_store(store, node, windowed=self.windows)
        if self.late_topic is not None:
            builder.add_output_topic(self.late_topic, MSGPACK, MSGPACK)
        return _emitted(Table(self.grouped.stream.app, node, store, windowed=True), self.emit)

    def count(self, name: str | None = None) -> Table:
        """Records per key and session."""
        return self._aggregate(_count, lambda k, a, b: a + b, name)

    def reduce(self, reducer: Callable[[Any, Any], Any], name: str | None = None) -> Table:
        """``reducer(aggregate, value)``; merging sessions combines their aggregates with it too."""
        return self._aggregate(_reducer(reducer), lambda k, a, b: reducer(a, b), name)

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        merger: Callable[[Any, Any, Any], Any],
        name: str | None = None,
    ) -> Table:
        """As :meth:`GroupedStream.aggregate`; ``merger(key, aggregate1, aggregate2)`` combines the aggregates
        of sessions a record merges (in order of their start)."""
        return self._aggregate(_aggregator(initializer, aggregator), merger, name)


class GlobalTable:
    """A table read from every partition of a topic by every process of the application (Kafka's
    ``GlobalKTable``): a bootstrap reads the topic to its end before the stream threads start, then a global
    thread keeps applying new records. Its store is not logged (the topic is its own changelog) and is not
    part of transactions: a join sees the table as last read. Read it with ``app.query(name, key)``."""

    def __init__(self, app: App, name: str, store: KeyValueStore) -> None:
        self.app = app
        self.name = name
        self.store = store


class Table:
    """A table (Kafka's ``KTable``): the latest value per key. A table read from a topic or made by an
    aggregation is held in the store ``name`` (read with ``app.query``, ``app.store`` or the test driver); a
    table derived from others (:meth:`filter`, :meth:`map_values`, :meth:`join`) has no store of its own
    (``name`` None): its value for a key is computed from theirs. Its changes, as a stream, are
    :meth:`to_stream`."""

    def __init__(
        self,
        app: App,
        node: Node,
        name: str | None,
        *,
        windowed: bool = False,
        getter: Getter | None = None,
        key_serde: Serde | None = None,
    ) -> None:
        self.app = app
        self.node = node
        self.name = name
        self.windowed = windowed
        self.key_serde = key_serde  # how the keys were partitioned, when known (see Stream)
        if getter is None:
            store = name

            def getter(ctx: Any, key: Any) -> Any:
                return ctx.stores[store].get(key)

        self.getter: Getter = getter

    def _derived(self, fn: Callable[[Any, Any], Any], kind: str) -> Table:
        if self.windowed:
            raise ConfigError(f"{kind}() of a windowed table is not supported")
        node = TableViewNode(self.app.builder.name(kind), fn)
        self.app.builder.check_open()
        self.node.children.append(node)
        parent = self.getter
        if parent is _no_lookup:
            return Table(self.app, node, None, getter=_no_lookup, key_serde=self.key_serde)

        def getter(ctx: Any, key: Any) -> Any:
            value = parent(ctx, key)
            return None if value is None else fn(key, value)

        return Table(self.app, node, None, getter=getter, key_serde=self.key_serde)

    def filter(self, predicate: Callable[[Any, Any], bool]) -> Table:
        """The rows for which ``predicate(key, value)`` is true; a row that stops matching is deleted."""
        return self._derived(lambda k, v: v if predicate(k, v) else None, "table-filter")

    def map_values(self, fn: Callable[[Any], Any]) -> Table:
        """Each row's value through ``fn(value)`` (None deletes the row)."""
        return self._derived(lambda k, v: fn(v), "table-map-values")

    def join(
        self,
        other: Table,
        joiner: Callable[[Any, Any], Any],
        *,
        left: bool = False,
        foreign_key: Callable[[Any], Any] | None = None,
        name: str | None = None,
    ) -> Table:
        """Kafka's KTable-KTable join: the table of ``joiner(value, other_value)`` for the keys in both (with
        ``left``, every key of this table, ``other_value`` None when it is not in ``other``), updated when
        either side changes (a key that no longer joins is deleted). Both must be co-partitioned.

        With ``foreign_key``, Kafka's foreign-key join (KIP-213): each row of this table joins the row of
        ``other`` whose key is ``foreign_key(value)``, many rows to one; the result is keyed by this table's
        keys. See :meth:`_foreign_key_join`."""
        if not isinstance(other, Table) or other.app is not self.app:
            raise ConfigError("join() takes a Table of the same App")
        if self.windowed or other.windowed:
            raise ConfigError("join() of windowed tables is not supported")
        if foreign_key is not None:
            return self._foreign_key_join(other, foreign_key, joiner, left, name)
        if name is not None:
            raise ConfigError("name= is for a foreign-key join (foreign_key=...): a table join has no store")
        builder = self.app.builder
        builder.check_open()
        out = Node(builder.name("table-join"))
        left_node = TableJoinNode(
            builder.name("table-join-left"), _lookup(other), joiner, is_left=True, outer=left
        )
        right_node = TableJoinNode(
            builder.name("table-join-right"), _lookup(self), joiner, is_left=False, outer=left
        )
        for side, node, looked_up in ((self, left_node, other), (other, right_node, self)):
            side.node.children.append(node)
            looked_up.node.lookups.append(node)
            node.children.append(out)
        mine, theirs = self.getter, other.getter

        def getter(ctx: Any, key: Any) -> Any:
            lv = mine(ctx, key)
            if lv is None:
                return None
            rv = theirs(ctx, key)
            return joiner(lv, rv) if rv is not None or left else None

        return Table(self.app, out, None, getter=getter, key_serde=self.key_serde)

    def left_join(
        self,
        other: Table,
        joiner: Callable[[Any, Any], Any],
        *,
        foreign_key: Callable[[Any], Any] | None = None,
        name: str | None = None,
    ) -> Table:
        """:meth:`join` with ``left=True``."""
        return self.join(other, joiner, left=True, foreign_key=foreign_key, name=name)

    def _foreign_key_join(
        self,
        other: Table,
        foreign_key: Callable[[Any], Any],
        joiner: Callable[[Any, Any], Any],
        left: bool,
        name: str | None,
    ) -> Table:
        """The foreign-key join, as Kafka Streams builds it (KIP-213), named ``name``:

        * The left table's side (the task of the left row) keeps each row's foreign key in the store
          ``<name>-foreign-keys`` and writes, on every change of a row, a subscription to
          ``<application_id>-<name>-subscription-registration-topic``, keyed by the foreign key (encoded with
          ``other``'s key serde, so it lands in the partition of the right row; that topic has as many
          partitions as ``other``): subscribe (with a hash of the row's value and the row's partition) to the
          new foreign key, unsubscribe from the old one when it changed. A deleted row, or one whose
          foreign key is None, gets its result at once (a deletion; ``joiner(value, None)`` for a left join).
        * The right table's side records the subscriptions in ``<name>-subscriptions`` (indexed by foreign
          key) and answers each with the right row's current value on
          ``<application_id>-<name>-subscription-response-topic`` (as many partitions as this table), in the
          subscriber's partition; a change of a right row answers every subscriber again.
        * The left side drops a response whose hash is not that of the row's current value (it answers an
          older version of the row: a newer answer is on its way), and otherwise forwards ``joiner(value,
          right_value)``, or without a right row a deletion (inner) or ``joiner(value, None)`` (left).

        So a row that changes its foreign key leaves the old one's row (no later change of it reaches the
        row) and gets the new one's; once both sides are quiet the result is the join of the two tables.
        The result is materialized in the store ``name`` (a table that can be queried and joined). Every
        store is logged and both internal topics are written in the application's transactions: under
        exactly-once, nothing of a crash shows. The left table's value must be msgpack-encodable (its hash);
        ``other`` must have a known key serde (a table read from a topic, an aggregation, or derived from
        them)."""
        if other.key_serde is None:
            raise ConfigError(
                "a foreign-key join needs to know how the right table is partitioned: join a table read with "
                "app.table(), an aggregation, or a table derived from them"
            )
        builder = self.app.builder
        builder.check_open()
        store = builder.store_name(name, "fk-join")
        fk_store = builder.store_name(f"{store}-foreign-keys", "fk-join")
        subscriptions = builder.store_name(f"{store}-subscriptions", "fk-join")
        app_id = self.app.application_id
        registration = f"{app_id}-{store}-subscription-registration-topic"
        response = f"{app_id}-{store}-subscription-response-topic"
        result = TableSourceNode(builder.name("fk-join-result"), store)
        subscribe = ForeignKeySubscribeNode(
            builder.name("fk-join-subscribe"),
            fk_store,
            foreign_key,
            joiner,
            left,
            registration,
            other.key_serde,
        )
        self.node.children.append(subscribe)
        subscribe.children.append(result)
        builder.add_store(fk_store, subscribe, windowed=None)
        builder.add_store(store, result, windowed=None)
        receive = ForeignKeySubscriptionNode(
            builder.name("fk-join-subscription"), subscriptions, _lookup(other), response
        )
        builder.internal_source(registration, other.key_serde, subscribe).children.append(receive)
        other.node.lookups.append(receive)  # the subscriptions and the right table: one task
        builder.add_store(subscriptions, receive, windowed=None, kind="subscriptions")
        changed = ForeignKeyRightChangeNode(builder.name("fk-join-right"), subscriptions, response)
        other.node.children.append(changed)
        answer = ForeignKeyResponseNode(builder.name("fk-join-response"), _lookup(self), joiner, left)
        builder.internal_source(response, MSGPACK_KEY, receive, changed).children.append(answer)
        self.node.lookups.append(answer)  # the responses and the left table: one task
        answer.children.append(result)
        return Table(self.app, result, store, key_serde=self.key_serde)

    def group_by(self, selector: Callable[[Any, Any], tuple[Any, Any]]) -> GroupedTable:
        """Regroup the table's rows (Kafka's ``KTable.groupBy``): ``selector(key, value) -> (group,
        group_value)`` for each row; aggregate the groups with :class:`GroupedTable`'s ``count``, ``reduce``
        or ``aggregate``, which take an update of a row out of its old group (a *subtractor*) and put it in
        its new one (an *adder*). Always through a repartition topic, keyed by group, whose records carry
        ``[old, new]`` pairs of group values."""
        if self.windowed:
            raise ConfigError("group_by() of a windowed table is not supported")
        return GroupedTable(self, selector)

    def suppress(
        self,
        *,
        until_window_closes: bool = False,
        until_time_limit: int | timedelta | None = None,
        max_records: int | None = None,
        max_bytes: int | None = None,
        when_full: str = "emit_early",
        name: str | None = None,
    ) -> Table:
        """Hold the table's changes back (Kafka's ``suppress``), and return the table of what comes out.

        ``until_window_closes=True`` (a windowed table): each window once, when it closes (``end + grace``
        reached by the stream time), stamped with its latest record's time: Kafka's
        ``Suppressed.untilWindowCloses``, what ``windowed_by(emit="final")`` gives. The window store holds the
        windows until then anyway (logged), so nothing more is kept.

        ``until_time_limit=ms`` (int ms or ``timedelta``; a windowed table's keys are windows): Kafka's
        ``Suppressed.untilTimeLimit``: a key's changes are held in the buffer store ``name`` (default
        generated), each replacing the last, and the latest is forwarded once the stream time (the largest
        event time this operation has seen) reaches the key's first held time plus the limit. The buffer is
        logged to ``<application_id>-<name>-changelog``, so under exactly-once a crash neither loses nor
        repeats what it held. ``max_records`` / ``max_bytes`` (msgpack keys and values) bound it: when over,
        the oldest keys are forwarded early (``when_full="emit_early"``, Kafka's ``emitEarlyWhenFull``) or the
        application stops with :class:`~pylog.errors.IllegalStateError` (``"shutdown"``).

        A suppressed table's rows lag behind on purpose: it cannot be joined."""
        if until_window_closes == (until_time_limit is not None):
            raise ConfigError(
                "suppress() takes until_window_closes=True or until_time_limit=..., one of them"
            )
        if until_window_closes:
            if not self.windowed:
                raise ConfigError("suppress(until_window_closes=True) needs a windowed table")
            if max_records is not None or max_bytes is not None or name is not None:
                raise ConfigError(
                    "suppress(until_window_closes=True) keeps the windows in the window store: no buffer "
                    "bounds or name"
                )
            if isinstance(self.node, WindowCloseNode):
                return self
            if not isinstance(self.node, WindowedNode):
                raise ConfigError("suppress(until_window_closes=True) follows a windowed aggregation")
            self.app.builder.check_open()
            close = WindowCloseNode(self.app.builder.name("suppress-until-window-closes"))
            self.node.children.append(close)
            return Table(self.app, close, self.name, windowed=True, getter=self.getter)
        limit = to_ms("until_time_limit", until_time_limit)  # type: ignore[arg-type]
        for what, bound in (("max_records", max_records), ("max_bytes", max_bytes)):
            if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 1):
                raise ConfigError(f"{what} must be an int >= 1 or None, got {bound!r}")
        if when_full not in ("emit_early", "shutdown"):
            raise ConfigError(f"when_full must be 'emit_early' or 'shutdown', got {when_full!r}")
        builder = self.app.builder
        store = builder.store_name(name, "suppress")
        node = SuppressNode(
            builder.name("suppress"),
            store,
            limit,
            max_records,
            max_bytes,
            when_full == "shutdown",
            windowed=self.windowed,
        )
        self.node.children.append(node)
        builder.add_store(store, node, windowed=None, kind="suppress")
        return Table(
            self.app, node, None, windowed=self.windowed, getter=_no_lookup, key_serde=self.key_serde
        )

    def to_stream(self) -> Stream:
        """The table's changelog stream: ``(key, new_value)`` for every update (None for a deletion); keys of
        a windowed table are :class:`~pylog.streams.windows.Windowed`."""
        node = Node(self.app.builder.name("to-stream"))
        self.node.children.append(node)
        return Stream(self.app, node, windowed=self.windowed, key_serde=self.key_serde)


class GroupedTable:
    """A table regrouped by :meth:`Table.group_by` (Kafka's ``KGroupedTable``), before its aggregation.

    The aggregation ``name`` owns two stores: ``name`` (the aggregates, by group) and ``name-group-by``
    (each row's current ``[group, group_value]``, on the side of the grouped table, so that an update or a
    deletion of a row is taken out of the group it was in); both are logged to changelogs, and the records
    between them go through the repartition topic ``<application_id>-<name>-repartition``."""

    def __init__(self, table: Table, selector: Callable[[Any, Any], tuple[Any, Any]]) -> None:
        self.table = table
        self.selector = selector

    def _aggregate(self, adder: Aggregator, subtractor: Aggregator, name: str | None) -> Table:
        app = self.table.app
        builder = app.builder
        store = builder.store_name(name, "table-aggregate")
        mapped = builder.store_name(f"{store}-group-by", "table-aggregate")
        select = TableGroupByNode(builder.name("table-group-by"), mapped, self.selector)
        self.table.node.children.append(select)
        builder.add_store(mapped, select, windowed=None)
        node = TableAggregateNode(builder.name("table-aggregate"), store, adder, subtractor)
        builder.repartition(select, store).children.append(node)
        builder.add_store(store, node, windowed=None)
        return Table(app, node, store, key_serde=MSGPACK_KEY)

    def count(self, name: str | None = None) -> Table:
        """The number of rows per group (a group whose rows all left keeps its row, with 0, as in Kafka)."""
        return self._aggregate(_count, lambda key, value, agg: agg - 1, name)

    def reduce(
        self,
        adder: Callable[[Any, Any], Any],
        subtractor: Callable[[Any, Any], Any],
        name: str | None = None,
    ) -> Table:
        """``adder(aggregate, value)`` for a value entering the group (its first value is its first
        aggregate), ``subtractor(aggregate, value)`` for one leaving it; None from either deletes the group's
        row."""
        return self._aggregate(_reducer(adder), lambda key, value, agg: subtractor(agg, value), name)

    def aggregate(
        self,
        initializer: Callable[[], Any],
        adder: Callable[[Any, Any, Any], Any],
        subtractor: Callable[[Any, Any, Any], Any],
        name: str | None = None,
    ) -> Table:
        """``adder(group, value, aggregate)`` for a value entering the group (starting from
        ``initializer()``), ``subtractor(group, value, aggregate)`` for one leaving it; None from either
        deletes the group's row."""
        return self._aggregate(_aggregator(initializer, adder), subtractor, name)


def _emitted(table: Table, emit: str) -> Table:
    """A windowed aggregation's table as ``windowed_by(emit=...)`` asked: every update, or final results."""
    return table.suppress(until_window_closes=True) if emit == "final" else table


def _no_lookup(ctx: Any, key: Any) -> Any:
    raise ConfigError("a suppressed table cannot be looked up (joined): join the table it suppresses")


def _lookup(table: Table) -> Getter:
    """``table``'s getter, for a join; a ConfigError for a table whose rows cannot be looked up."""
    if table.getter is _no_lookup:
        raise ConfigError(
            "a suppressed table cannot be joined (its rows lag behind on purpose): join the table it suppresses"
        )
    return table.getter


def _count(key: Any, value: Any, agg: Any) -> Any:
    return 1 if agg is MISSING else agg + 1


def _reducer(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any, Any], Any]:
    def reduce(key: Any, value: Any, agg: Any) -> Any:
        return value if agg is MISSING else fn(agg, value)

    return reduce


def _aggregator(
    initializer: Callable[[], Any], fn: Callable[[Any, Any, Any], Any]
) -> Callable[[Any, Any, Any], Any]:
    def aggregate(key: Any, value: Any, agg: Any) -> Any:
        return fn(key, value, initializer() if agg is MISSING else agg)

    return aggregate
