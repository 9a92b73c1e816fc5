"""App: a stream processing application over a :class:`~pylog.Log` (Kafka Streams' ``KafkaStreams`` and
``StreamsBuilder`` in one object).

Define the topology with :meth:`App.stream` and :meth:`App.table` and the DSL they return, then
:meth:`App.start` (background threads) or :meth:`App.run` (until :meth:`App.close`, Ctrl-C or SIGTERM).
Several processes running the same ``application_id`` on the same log directory share the work: each thread
of each process is a member of the consumer group ``application_id`` (see :mod:`pylog.streams.runtime`).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pylog.errors import ConfigError, IllegalStateError, TopicExistsError
from pylog.streams.dsl import GlobalTable, Stream, Table
from pylog.streams.handlers import ProcessingExceptionHandler, log_and_fail
from pylog.streams.nodes import SourceNode, TableSourceNode
from pylog.streams.runtime import GlobalThread, StateRestoreListener, StreamThread
from pylog.streams.serde import MSGPACK, STRING, Serde
from pylog.streams.stores import KeyValueStore
from pylog.streams.topology import Builder, GlobalSpec, Topology
from pylog.structs import TopicPartition

if TYPE_CHECKING:
    from pylog.log import Log

__all__ = ["App"]

_ID = re.compile(r"[A-Za-z0-9._-]{1,200}")
_GUARANTEES = ("exactly_once", "at_least_once")
_ABSENT: Any = object()


class App:
    """A stream application (see the module docstring).

    ``log``: the log it reads and writes (None: a topology for :class:`~pylog.streams.driver.TestDriver`
    only). ``application_id``: its consumer group, the prefix of its internal topics and transactional ids.
    ``key_serde``/``value_serde``: defaults of sources and sinks (str keys, msgpack values: what
    ``log.producer()`` writes by default). ``processing_guarantee``: ``"exactly_once"`` (default) or
    ``"at_least_once"``. ``commit_interval_ms``: how often a thread commits (100 ms, Kafka Streams' default
    under exactly-once). ``instance_id``: names this process in transactional ids (default random); a process
    restarted with the same one aborts its predecessor's open transactions at once, instead of after
    ``transaction_timeout_ms`` (never give two live processes the same one). ``state_dir``: keep every store
    in a SQLite file there (:mod:`pylog.streams.sqlite`, :mod:`pylog.streams.sqlite_buffers`: state
    larger than memory, restarts that read only the changelog written since the last commit); default: in
    memory. ``on_deserialization_error``: what
    an input record the source's serdes cannot decode does, as a consumer's setting of that name (Kafka's
    deserialization exception handler): ``"raise"`` (default: the application stops with a
    :class:`~pylog.errors.DeserializationError` naming it), ``"skip"`` (counted: ``skipped-records``) or
    ``"dead_letter"`` (its bytes written to ``dead_letter_topic``, created if missing, with pylog's dead-letter
    headers, in the same transaction as the rest: exactly once; counted: ``dead-lettered-records``).
    ``restore_listener``: a :class:`~pylog.streams.runtime.StateRestoreListener` told when each store's restore
    starts, progresses and ends (Kafka Streams' global state restore listener).
    ``processing_exception_handler``: what an input record whose processing raised does (Kafka's processing
    exception handler, :mod:`pylog.streams.handlers`): ``handler(context, exception)`` answers
    ``ProcessingResponse.FAIL`` (the default :func:`~pylog.streams.handlers.log_and_fail`: the application
    stops with the exception, nothing of its open transaction visible) or ``CONTINUE`` (the record is skipped,
    counted: ``skipped-records``; :class:`~pylog.streams.handlers.DeadLetterHandler` writes it to a dead-letter
    topic first, created if missing, in the same transaction: ``dead-lettered-records``). Thread-safety: define the
    topology on one thread; ``start``, ``close``, ``store``, ``metrics`` may be called from any thread."""

    def __init__(
        self,
        log: Log | None,
        application_id: str,
        *,
        key_serde: Serde = STRING,
        value_serde: Serde = MSGPACK,
        processing_guarantee: str = "exactly_once",
        commit_interval_ms: int = 100,
        instance_id: str | None = None,
        transaction_timeout_ms: int = 10_000,
        poll_ms: int = 100,
        max_poll_records: int = 1000,
        state_dir: str | os.PathLike[str] | None = None,
        on_deserialization_error: str = "raise",
        dead_letter_topic: str | None = None,
        restore_listener: StateRestoreListener | None = None,
        processing_exception_handler: ProcessingExceptionHandler = log_and_fail,
    ) -> None:
        if not isinstance(application_id, str) or not _ID.fullmatch(application_id):
            raise ConfigError(
                f"application_id must be 1-200 characters of [A-Za-z0-9._-], got {application_id!r}"
            )
        if processing_guarantee not in _GUARANTEES:
            raise ConfigError(
                f"processing_guarantee must be one of {_GUARANTEES}, got {processing_guarantee!r}"
            )
        for name, value in (
            ("commit_interval_ms", commit_interval_ms),
            ("transaction_timeout_ms", transaction_timeout_ms),
            ("poll_ms", poll_ms),
            ("max_poll_records", max_poll_records),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
        if instance_id is not None and (not isinstance(instance_id, str) or not _ID.fullmatch(instance_id)):
            raise ConfigError(f"instance_id must be 1-200 characters of [A-Za-z0-9._-], got {instance_id!r}")
        for name, serde in (("key_serde", key_serde), ("value_serde", value_serde)):
            if not isinstance(serde, Serde):
                raise ConfigError(f"{name} must be a pylog.streams Serde, got {serde!r}")
        self.log = log
        self.application_id = application_id
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.processing_guarantee = processing_guarantee
        self.commit_interval_ms = commit_interval_ms
        self.instance_id = instance_id if instance_id is not None else uuid.uuid4().hex[:12]
        self.transaction_timeout_ms = transaction_timeout_ms
        self.poll_ms = poll_ms
        self.max_poll_records = max_poll_records
        self.state_dir = None if state_dir is None else os.fspath(state_dir)
        if on_deserialization_error not in ("raise", "skip", "dead_letter"):
            raise ConfigError(
                f"on_deserialization_error must be 'raise', 'skip' or 'dead_letter', got {on_deserialization_error!r}"
            )
        if (on_deserialization_error == "dead_letter") != (dead_letter_topic is not None):
            raise ConfigError(
                'dead_letter_topic goes with on_deserialization_error="dead_letter" (both or neither)'
            )
        if restore_listener is not None and not isinstance(restore_listener, StateRestoreListener):
            raise ConfigError(
                f"restore_listener must be a pylog.streams StateRestoreListener, got {restore_listener!r}"
            )
        if not callable(processing_exception_handler):
            raise ConfigError(
                "processing_exception_handler must be a callable (context, exception) -> ProcessingResponse, "
                f"got {processing_exception_handler!r}"
            )
        self.restore_listener = restore_listener
        self.builder = Builder(application_id)
        self.builder.processing_exception_handler = processing_exception_handler
        self.builder.on_deserialization_error = on_deserialization_error
        self.builder.dead_letter_topic = dead_letter_topic
        self.state = "CREATED"
        self.error: BaseException | None = None
        self._topology: Topology | None = None
        self._threads: list[StreamThread] = []
        self._global: GlobalThread | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    # -- the topology ---------------------------------------------------------------------------------

    def stream(
        self,
        topic: str,
        *,
        key_serde: Serde | None = None,
        value_serde: Serde | None = None,
        timestamp: Callable[[Any, Any, int], int] | None = None,
    ) -> Stream:
        """The records of ``topic`` as a :class:`~pylog.streams.dsl.Stream`. ``timestamp(key, value,
        record_timestamp) -> ms`` extracts the event time (default: the record's timestamp); a record whose
        event time is not an int >= 0 is skipped and counted (``dropped-records``)."""
        node = SourceNode(
            self.builder.name("source"),
            topic,
            key_serde or self.key_serde,
            value_serde or self.value_serde,
            timestamp,
        )
        self.builder.add_source(node)
        return Stream(self, node, key_serde=node.key_serde)

    def table(
        self,
        topic: str,
        *,
        name: str | None = None,
        key_serde: Serde | None = None,
        value_serde: Serde | None = None,
        timestamp: Callable[[Any, Any, int], int] | None = None,
    ) -> Table:
        """``topic`` read as a :class:`~pylog.streams.dsl.Table`: the latest value of each key (a None value
        deletes it), materialized in the store ``name`` (default ``<topic>-table``)."""
        source = self.stream(topic, key_serde=key_serde, value_serde=value_serde, timestamp=timestamp)
        store = self.builder.store_name(name if name is not None else f"{topic}-table", "table")
        node = TableSourceNode(self.builder.name("table"), store)
        source.node.children.append(node)
        self.builder.add_store(store, node, windowed=None)
        return Table(self, node, store, key_serde=source.key_serde)

    def global_table(
        self,
        topic: str,
        *,
        name: str | None = None,
        key_serde: Serde | None = None,
        value_serde: Serde | None = None,
    ) -> GlobalTable:
        """``topic`` read whole by every process, as a :class:`~pylog.streams.dsl.GlobalTable` (store ``name``,
        default ``<topic>-global``), for :meth:`~pylog.streams.dsl.Stream.join_global`."""
        self.builder.check_open()
        if topic in self.builder.sources or topic in self.builder.globals:
            raise ConfigError(f"topic {topic!r} is already a source of this App")
        store_name = self.builder.store_name(name if name is not None else f"{topic}-global", "global")
        store = KeyValueStore(store_name, None)
        self.builder.globals[topic] = GlobalSpec(
            store_name, topic, store, key_serde or self.key_serde, value_serde or self.value_serde
        )
        return GlobalTable(self, store_name, store)

    def topology(self) -> Topology:
        """The built topology (its sub-topologies, stores and internal topics); the App's definition cannot
        change afterwards. Needs the log (for the partition counts of its source topics)."""
        log = self._need_log()
        if self._topology is None:
            self._topology = self.builder.build(lambda topic: log.topic(topic).num_partitions)
        return self._topology

    def _need_log(self) -> Log:
        if self.log is None:
            raise IllegalStateError("this App has no log (App(None, ...) is for the TestDriver only)")
        return self.log

    # -- running --------------------------------------------------------------------------------------

    def create_topics(self) -> None:
        """Create the internal topics that do not exist yet (``start`` does); an existing one with another
        partition count is a :class:`~pylog.errors.ConfigError`. Output topics must exist."""
        log = self._need_log()
        topology = self.topology()
        for name, (partitions, config) in topology.internal_topics().items():
            if not log.has_topic(name):
                try:
                    log.create_topic(name, partitions=partitions, **config)
                except TopicExistsError:
                    pass  # another instance starting at the same moment created it
            have = log.topic(name).num_partitions
            if have != partitions:
                raise ConfigError(
                    f"internal topic {name} has {have} partitions, the topology needs {partitions} (reset "
                    "the application, or change its source topics back)"
                )
        for name in topology.outputs:
            log.topic(name)  # UnknownTopicError now, not from a thread later
        for name in sorted(topology.dead_letter_topics()):
            if not log.has_topic(name):
                try:
                    log.create_topic(name)
                except TopicExistsError:
                    pass  # created meanwhile by another instance

    def start(self, threads: int = 1) -> None:
        """Start ``threads`` stream threads in the background."""
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ConfigError(f"threads must be an int >= 1, got {threads!r}")
        with self._lock:
            if self.state != "CREATED":
                raise IllegalStateError(f"an App starts once (it is {self.state})")
            log = self._need_log()
            self.create_topics()
            topology = self.topology()
            if topology.globals:
                self._global = GlobalThread(self, log, list(topology.globals.values()))
                self._global.bootstrap()  # the whole tables before any stream record is processed
                self._global.start()
            self._threads = [StreamThread(self, log, topology, i) for i in range(threads)]
            self.state = "RUNNING"
        for t in self._threads:
            t.start()

    def run(self, threads: int = 1) -> None:
        """Start, then wait until :meth:`close` (from another thread), Ctrl-C or SIGTERM; a thread's failure
        stops the application and is raised here."""
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, lambda *_: self._stopped.set())
        try:
            self.start(threads)
            try:
                while not self._stopped.wait(0.5):
                    pass
            except KeyboardInterrupt:
                pass
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            self.close()
        if self.error is not None:
            raise self.error

    def close(self, timeout: float | None = None) -> None:
        """Stop the threads (each commits what it processed) and wait for them."""
        self._stopped.set()
        with self._lock:
            if self.state in ("CREATED", "NOT_RUNNING"):
                self.state = "NOT_RUNNING"
                return
            threads = list(self._threads)
        for t in threads:
            t.stop()
        for t in threads:
            if t is not threading.current_thread():
                t.join(timeout)
        if self._global is not None:
            self._global.stop()
            self._global.join(timeout)
        with self._lock:
            self.state = "ERROR" if self.error is not None else "NOT_RUNNING"

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _thread_failed(self, thread: threading.Thread, exc: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = exc
            self.state = "ERROR"
        self._stopped.set()
        for t in self._threads:
            t.stop()
        if self._global is not None:
            self._global.stop()

    # -- queries --------------------------------------------------------------------------------------

    def metrics(self) -> dict[str, int]:
        """Counters summed over the threads and their tasks: ``processed-records``, ``commits``,
        ``dropped-records``, ``late-records``, ``skipped-records``, ``dead-lettered-records``,
        ``tasks-restored``, ``restored-records``, ``tasks-resumed``."""
        total: Counter[str] = Counter()
        for t in self._threads:
            total.update(dict(t.metrics))  # a copy first: the thread may add a counter meanwhile
            for task in t.snapshot_tasks().values():
                total.update(dict(task.metrics))
        return dict(total)

    def task_metrics(self) -> dict[str, dict[str, int]]:
        """Per task this process runs (``"0_3"``): its counters (``dropped-records``, ``late-records``,
        ``skipped-records``, ``dead-lettered-records``) and its stores' sizes (``store:<name>``: keys held)."""
        out = {}
        for t in self._threads:
            for task_id, task in t.snapshot_tasks().items():
                counters = dict(task.metrics)
                counters.update({f"store:{name}": len(store) for name, store in task.stores.items()})
                out[str(task_id)] = counters
        return out

    def lag(self) -> dict[TopicPartition, int]:
        """Per source partition (user and repartition topics): records between the application's committed
        offset (the log start when none) and the log end, as the group's committed offsets say (any process of
        the application commits them). 0 everywhere: everything written so far is processed and committed
        (records of an aborted transaction at a partition's very end count until a record follows them)."""
        log = self._need_log()
        committed = log.group_offsets(self.application_id)
        out = {}
        for name in self.topology().source_topics:
            topic = log.topic(name)
            starts, ends = topic.beginning_offsets(), topic.end_offsets()
            for p, end in ends.items():
                tp = TopicPartition(name, p)
                at = committed[tp].offset if tp in committed else starts[p]
                out[tp] = max(end - max(at, starts[p]), 0)
        return out

    def tasks(self) -> dict[str, str]:
        """The tasks running in this process: ``{task id: thread name}``."""
        return {str(tid): t.name for t in self._threads for tid in t.snapshot_tasks()}

    def query(self, name: str, key: Any, default: Any = None) -> Any:
        """The current value of ``key`` in store ``name``, if one of this process's tasks holds it (for a window
        store, ``key`` is ``(key, window_start)``), else ``default``. It includes changes not committed yet;
        :func:`pylog.streams.admin.read_store` reads the committed state from any process."""
        for store in self.store(name):
            value = store.get(key, _ABSENT)
            if value is not _ABSENT:
                return value
        return default

    def store(self, name: str) -> list[KeyValueStore]:
        """The instances of store ``name`` held by this process's tasks (one per task it runs now)."""
        topology = self.topology()
        for spec in topology.globals.values():
            if spec.name == name:
                return [spec.store]
        if name not in topology.stores:
            raise ConfigError(f"no store {name!r} (stores: {sorted(topology.stores)})")
        return [
            task.stores[name]
            for t in self._threads
            for task in t.snapshot_tasks().values()
            if name in task.stores
        ]
