"""The runtime: stream threads, each a consumer-group member and a transactional producer running tasks.

Every thread of every process of an application is a member of the consumer group ``application_id``
subscribed to all source topics (user topics and repartition topics). The group's ``range`` assignor gives
partition *p* of every topic with the same partition count to the same member, so the source partitions of a
task always land together (co-partitioning). Each assigned partition set ``{topic-p for each source of
sub-topology s}`` becomes task ``s_p``.

**Exactly-once** (``processing_guarantee="exactly_once"``, the default; Kafka Streams' EOS v2): each thread has
one transactional producer (``transactional_id = <application_id>-<instance_id>-<thread>``). The first record
processed after a commit opens a transaction; output and repartition records are sent into it as they are
produced; every ``commit_interval_ms`` (and before partitions are revoked, and on close) the thread sends each
task's changelog records (the latest value of every key changed), then the input offsets with the consumer's
group metadata (a zombie of an older generation is refused), then commits. A crash at any point leaves either
all of it or none of it visible to ``read_committed`` readers, and the group's offsets where the state is.
A failed commit aborts the transaction, drops the tasks' state and resumes from the committed offsets. A thread
fenced (its transaction outlived ``transaction_timeout_ms`` and a reader aborted it, or a process with the same
``instance_id`` took over) does the same with a new producer of the same transactional id, instead of stopping.

**Restore**: a task assigned to a thread rebuilds each store from its changelog partition, read
``read_committed`` from the store's offset (the beginning for an in-memory store; a SQLite store's checkpoint,
:mod:`pylog.streams.sqlite`) up to the end offset seen when the task was assigned, in Arrow batches (or lists of
records without pyarrow) decoded by column. A task handed back to
the thread that committed it last (an eager rebalance takes everything away and gives most of it back) keeps
its stores when their changelog partitions have not grown since that commit. Nothing is wiped after an unclean
stop: the changelog's committed transactions are the state.

A dead process's open transaction stays open until ``transaction_timeout_ms`` (10 s, as Kafka Streams sets it),
and holds back ``read_committed`` readers of the partitions it wrote (the restore of its tasks, its outputs)
until then. A process restarted with the same ``instance_id`` aborts it at once (``init_transactions``).

Global tables are kept by a :class:`GlobalThread` of their own, outside the group and the transactions.

``processing_guarantee="at_least_once"``: no transactions. Records are written as they are produced
(``acks=1``: to the operating system, so they survive a crash of the process); at each commit every partition
written since the last one is fsynced, then the offsets are committed, so no committed offset passes an output
that a power loss could take back (one fsync per partition per commit interval, as a transaction's commit
does, rather than one per batch). After a crash, records since the last commit are processed again, and their
state updates may count twice.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from pylog.errors import CommitFailedError, ProducerFencedError
from pylog.streams.serde import MSGPACK, MSGPACK_KEY, Serde
from pylog.streams.sqlite_buffers import make_sqlite_store
from pylog.streams.stores import KeyValueStore
from pylog.streams.task import Task
from pylog.streams.topology import GlobalSpec, StoreSpec, TaskId, Topology
from pylog.structs import TopicPartition

if TYPE_CHECKING:
    from pylog.consumer import Consumer
    from pylog.log import Log
    from pylog.producer import Producer
    from pylog.streams.app import App

__all__ = ["GlobalThread", "StateRestoreListener", "StreamThread", "restore_tasks"]

_log = logging.getLogger("pylog.streams")
_RESTORE_POLL_MS = 100


class StateRestoreListener:
    """Told about each store's restore (Kafka Streams' ``StateRestoreListener``): give an instance to
    ``App(restore_listener=...)`` and override the methods wanted (each does nothing here).

    ``changelog`` is the changelog partition read (its partition is the task's), ``store`` the store's name.
    The methods run on the stream thread doing the restore, inside its rebalance: a slow one delays the
    restore, and one that raises stops the application (nothing is committed by a restore)."""

    def on_restore_start(
        self, changelog: TopicPartition, store: str, start_offset: int, end_offset: int
    ) -> None:
        """Before the first record: the store is rebuilt from ``start_offset`` up to ``end_offset``."""

    def on_batch_restored(
        self, changelog: TopicPartition, store: str, batch_end_offset: int, num_restored: int
    ) -> None:
        """After a batch of ``num_restored`` records reached the store; the next one starts at
        ``batch_end_offset``."""

    def on_restore_end(self, changelog: TopicPartition, store: str, total_restored: int) -> None:
        """The store holds its changelog's committed state (``total_restored`` records read)."""


class StreamThread(threading.Thread):
    """One member of the application's group (see the module docstring)."""

    def __init__(self, app: App, log: Log, topology: Topology, index: int) -> None:
        super().__init__(name=f"{app.application_id}-StreamThread-{index}", daemon=True)
        self.app = app
        self.log = log
        self.topology = topology
        self.index = index
        self.eos = app.processing_guarantee == "exactly_once"
        self.tasks: dict[TaskId, Task] = {}
        self.error: BaseException | None = None
        self.metrics: Counter[str] = Counter()
        self._suspended: dict[TaskId, tuple[Task, dict[TopicPartition, int]]] = {}
        self._sub_of = {t: sub.id for sub in topology.subtopologies for t in sub.sources}
        self._offsets: dict[TopicPartition, int] = {}
        self._written: set[tuple[str, int | None]] = set()  # at-least-once: fsynced before the commit
        self._in_txn = False
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # tasks, for interactive queries from other threads
        self.consumer: Consumer = log.consumer(
            group_id=app.application_id,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            value_deserializer=None,
            partition_assignment_strategy="range",
            max_poll_records=app.max_poll_records,
        )
        self.producer: Producer = self._new_producer()

    def _new_producer(self) -> Producer:
        if self.eos:
            producer = self.log.producer(
                transactional_id=f"{self.app.application_id}-{self.app.instance_id}-{self.index}",
                transaction_timeout_ms=self.app.transaction_timeout_ms,
                value_serializer=None,
            )
            producer.init_transactions()  # type: ignore[attr-defined]
            return producer
        return self.log.producer(value_serializer=None, acks=1)

    # -- the loop -------------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        clock = self.log.clock
        try:
            self.consumer.subscribe(self.topology.source_topics, listener=_Listener(self))
            next_commit = clock.monotonic_ms() + self.app.commit_interval_ms
            while not self._stopping.is_set():
                records = self.consumer.poll(timeout_ms=self.app.poll_ms)
                try:
                    if records:
                        self._process(records)
                    now = clock.time_ms()
                    for task in list(self.tasks.values()):
                        task.punctuate("wall_clock", now)
                except ProducerFencedError as exc:  # the transaction timed out, or a newer instance took over
                    _log.warning(
                        "stream thread %s: fenced (%s); resuming from the committed state", self.name, exc
                    )
                    self._renew_producer()
                    self._reset()
                    continue
                if clock.monotonic_ms() >= next_commit:
                    if not self.commit():
                        self._reset()
                    next_commit = clock.monotonic_ms() + self.app.commit_interval_ms
            if not self.commit():
                _log.warning("stream thread %s: its last commit was refused (fenced)", self.name)
            self.drop_all()
        except BaseException as exc:
            self.error = exc
            _log.exception("stream thread %s failed", self.name)
            self._abort()
            self.app._thread_failed(self, exc)
        finally:
            try:
                self.consumer.close(autocommit=False)
            finally:
                self.producer.close()

    def _begin(self) -> None:
        if self.eos and not self._in_txn:
            self.producer.begin_transaction()  # type: ignore[attr-defined]
            self._in_txn = True

    def _process(self, records: dict[TopicPartition, list[Any]]) -> None:
        for tp, recs in records.items():
            task = self.tasks[TaskId(self._sub_of[tp.topic], tp.partition)]
            process, topic, partition = task.process, tp.topic, tp.partition
            for r in recs:
                process(topic, r.key, r.value, r.timestamp, partition, r.offset)
            self._offsets[tp] = recs[-1].offset + 1
            self.metrics["processed-records"] += len(recs)

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
        self._begin()
        if not self.eos:
            self._written.add((topic, partition))
        self.producer.send(
            topic, value, key=key, partition=partition, timestamp_ms=timestamp_ms, headers=headers
        )

    def send_batch(
        self, topic: str, keys: list[bytes], values: list[bytes | None], timestamp_ms: int, partition: int
    ) -> None:
        self._begin()
        if not self.eos:
            self._written.add((topic, partition))
        self.producer.send_batch(
            topic, keys, values, partition=partition, timestamps=[timestamp_ms] * len(keys), wait=False
        )

    # -- commits --------------------------------------------------------------------------------------

    def commit(self) -> bool:
        """Commit what was processed since the last commit (see the module docstring). False when the commit
        was refused (this member was fenced): the transaction is aborted, and the tasks' state is no longer
        the committed one (the caller drops it)."""
        try:
            for task in self.tasks.values():
                task.flush_changelogs()  # begins the transaction if a store changed
            if not self._offsets and not self._in_txn:
                return True
            self._begin()
            if self.eos:
                producer: Any = self.producer
                if self._offsets:
                    producer.send_offsets_to_transaction(dict(self._offsets), self.consumer.group_metadata())
                producer.commit_transaction()
            else:
                self.producer.flush()
                self._sync_written()
                self.consumer.commit(dict(self._offsets))
        except (CommitFailedError, ProducerFencedError) as exc:
            _log.warning(
                "stream thread %s: commit failed (%s); resuming from the committed state", self.name, exc
            )
            if isinstance(exc, ProducerFencedError):
                self._renew_producer()  # its transaction is over (aborted by whoever fenced it)
            else:
                self._abort()
            return False
        finally:
            self._in_txn = False
            self._offsets = {}
        self._checkpoint()
        self.metrics["commits"] += 1
        return True

    def _sync_written(self) -> None:
        """At-least-once: fsync every partition written since the last commit (a partition chosen by the
        partitioner is not known here: its whole topic, as opened by this process)."""
        written, self._written = self._written, set()
        for topic, partition in written:
            if partition is None:
                self.log.topic(topic).flush()
            else:
                self.log.topic(topic).partition(partition).flush()

    def _abort(self) -> None:
        if self.eos and self._in_txn:
            try:
                self.producer.abort_transaction()  # type: ignore[attr-defined]
            except ProducerFencedError:
                self._renew_producer()
            except Exception:  # the thread is failing anyway; its transaction times out
                _log.exception("stream thread %s: abort failed", self.name)
        self._in_txn = False
        self._offsets = {}

    def _renew_producer(self) -> None:
        """A fenced producer cannot be used again (its epoch is old): close it and take a new one with the same
        transactional id (whose ``init_transactions`` aborts any transaction of the id still open)."""
        self._in_txn = False
        self._offsets = {}
        try:
            self.producer.close()
        except Exception:  # a fenced producer may fail to flush what it holds: it is aborted anyway
            _log.exception("stream thread %s: closing the fenced producer failed", self.name)
        self.producer = self._new_producer()

    def _reset(self) -> None:
        """Drop every task's state and read again from the committed offsets."""
        assigned = self.consumer.assignment()
        self.drop_all()
        for tp in assigned:
            committed = self.consumer.committed(tp)
            if committed is None:
                self.consumer.seek_to_beginning(tp)
            else:
                self.consumer.seek(tp, committed)
        self.assign(assigned)

    def _make_store(self, spec: StoreSpec, task_id: TaskId) -> KeyValueStore | None:
        """A SQLite store for a key-value, tumbling/hopping window or session store when the application has
        a ``state_dir``."""
        if self.app.state_dir is None:
            return None
        path = os.path.join(self.app.state_dir, self.app.application_id, str(task_id), f"{spec.name}.sqlite")
        return make_sqlite_store(spec, path, str(self.log.topic(spec.changelog).topic_id))

    def _checkpoint(self) -> None:
        """After a commit: persistent stores record their state as of the changelog's end."""
        ends: dict[str, dict[int, int]] = {}
        for task in self.tasks.values():
            for store in task.stores.values():
                if store.persistent and store.changelog is not None:
                    if store.changelog not in ends:
                        ends[store.changelog] = self.log.topic(store.changelog).end_offsets()
                    store.checkpoint(ends[store.changelog][task.task_id.partition])

    # -- assignment (called by the listener, inside poll) ---------------------------------------------

    def assign(self, partitions: set[TopicPartition]) -> None:
        wanted = {TaskId(self._sub_of[tp.topic], tp.partition) for tp in partitions}
        fresh: list[Task] = []
        tasks = dict(self.tasks)
        for task_id in sorted(wanted - set(tasks)):
            kept = self._suspended.pop(task_id, None)
            if kept is not None and _changelog_ends(self.log, kept[0]) == kept[1]:
                tasks[task_id] = kept[0]
                self.metrics["tasks-resumed"] += 1
                continue
            task = Task(self.topology, task_id, self, self.log.clock, self._make_store)
            tasks[task_id] = task
            fresh.append(task)
        self._drop(list(self._suspended.values()))
        restored = restore_tasks(self.log, fresh, self.app.restore_listener)
        for task in fresh:
            task.start()
        self.metrics["restored-records"] += restored
        self.metrics["tasks-restored"] += len(fresh)
        with self._lock:
            self.tasks = tasks

    def _drop(self, suspended: list[tuple[Task, Any]]) -> None:
        """Close the suspended tasks given (their state is forgotten)."""
        self._suspended = {}
        for task, _ in suspended:
            task.close()

    def drop_all(self) -> None:
        """Close every task, running or suspended (their state is forgotten)."""
        with self._lock:
            tasks, self.tasks = list(self.tasks.values()), {}
        self._drop([*self._suspended.values(), *((t, None) for t in tasks)])

    def revoke(self, partitions: set[TopicPartition], lost: bool = False) -> None:
        if lost:
            self._abort()
            self.drop_all()
            return
        if not self.commit():
            self.drop_all()
            return
        gone = {TaskId(self._sub_of[tp.topic], tp.partition) for tp in partitions}
        with self._lock:
            for task_id in gone & set(self.tasks):
                task = self.tasks.pop(task_id)
                self._suspended[task_id] = (task, _changelog_ends(self.log, task))

    def snapshot_tasks(self) -> dict[TaskId, Task]:
        with self._lock:
            return dict(self.tasks)


class _Listener:
    """The group's rebalance callbacks, run inside the thread's own ``poll()``."""

    def __init__(self, thread: StreamThread) -> None:
        self.thread = thread

    def on_partitions_revoked(self, revoked: Any) -> None:
        self.thread.revoke(set(revoked))

    def on_partitions_assigned(self, assigned: Any) -> None:
        self.thread.assign(self.thread.consumer.assignment())

    def on_partitions_lost(self, lost: Any) -> None:
        self.thread.revoke(set(lost), lost=True)


def _changelog_ends(log: Log, task: Task) -> dict[TopicPartition, int]:
    p = task.task_id.partition
    return {
        TopicPartition(s.changelog, p): log.topic(s.changelog).end_offsets()[p]
        for s in task.stores.values()
        if s.changelog is not None
    }


def restore_tasks(log: Log, tasks: list[Task], listener: StateRestoreListener | None = None) -> int:
    """Rebuild the stores of ``tasks`` from their changelog partitions (read_committed, up to the end offsets
    of now), telling ``listener``; returns the number of changelog records read."""
    where: dict[TopicPartition, Any] = {}
    for task in tasks:
        for store in task.stores.values():
            if store.changelog is not None:
                where[TopicPartition(store.changelog, task.task_id.partition)] = store
    if not where:
        return 0
    try:
        import pyarrow  # noqa: F401

        arrow = True
    except ImportError:  # pragma: no cover - pyarrow is an optional dependency
        arrow = False
    reader = log.consumer(
        isolation_level="read_committed",
        enable_auto_commit=False,
        value_deserializer=None,
        max_poll_records=100_000,
    )
    read = 0
    listener = listener if listener is not None else _NO_LISTENER
    count = dict.fromkeys(where, 0)
    try:
        reader.assign(list(where))
        ends = reader.end_offsets(list(where))
        starts = reader.beginning_offsets(list(where))
        for tp, store in where.items():
            if store.offset > ends[tp]:  # a file ahead of its changelog: rebuild it
                store.clear()
            reader.seek(tp, max(store.offset, starts[tp]))
            listener.on_restore_start(tp, store.name, reader.position(tp), ends[tp])
        pending = {tp for tp in where if reader.position(tp) < ends[tp]}
        while pending:
            done: dict[TopicPartition, int] = {}
            if arrow:
                got = reader.poll_arrow(timeout_ms=_RESTORE_POLL_MS)
                for tp, batch in got.items():
                    keys = _decode_column(batch.column("key"), MSGPACK_KEY)
                    where[tp].restore_decoded(keys, _decode_column(batch.column("value"), MSGPACK))
                    done[tp] = batch.num_rows
            else:
                for tp, recs in reader.poll(timeout_ms=_RESTORE_POLL_MS).items():
                    where[tp].restore([r.key for r in recs], [r.value for r in recs])
                    done[tp] = len(recs)
            for tp, n in done.items():
                read += n
                count[tp] += n
                listener.on_batch_restored(tp, where[tp].name, reader.position(tp), n)
            pending = {tp for tp in pending if reader.position(tp) < ends[tp]}
        for tp, store in where.items():
            store.restored(reader.position(tp))
            listener.on_restore_end(tp, store.name, count[tp])
    finally:
        reader.close(autocommit=False)
    return read


_NO_LISTENER = StateRestoreListener()


def _decode_column(column: Any, serde: Serde) -> list[Any]:
    """The msgpack objects of an Arrow binary column (None for a null), decoded by one ``msgpack.Unpacker``
    over the column's data buffer (no bytes object per row) when every row holds exactly one object (what the
    changelog's writer wrote: checked row by row against the column's offsets), else row by row."""
    n = len(column)
    if column.null_count == 0 and n:
        _, offsets_buf, data = column.buffers()
        offsets = np.frombuffer(offsets_buf, dtype=np.int32)[column.offset : column.offset + n + 1]
        unpacker = msgpack.Unpacker(
            raw=False, use_list=serde is not MSGPACK_KEY, strict_map_key=False, max_buffer_size=0
        )
        unpacker.feed(memoryview(data)[int(offsets[0]) : int(offsets[-1])])
        ends = (offsets[1:] - offsets[0]).tolist()
        unpack, tell = unpacker.unpack, unpacker.tell
        out = []
        try:
            for end in ends:
                out.append(unpack())
                if tell() != end:  # not one object per row: decode row by row
                    break
            else:
                return out
        except (ValueError, msgpack.UnpackException):
            pass
    return [None if raw is None else serde.decode(raw) for raw in column.to_pylist()]


class GlobalThread(threading.Thread):
    """Keeps the application's global tables: reads every partition of their topics (``read_committed``, no
    group) into their stores; :meth:`bootstrap` reads them to their end first, on the caller's thread."""

    def __init__(self, app: App, log: Log, specs: list[GlobalSpec]) -> None:
        super().__init__(name=f"{app.application_id}-GlobalThread", daemon=True)
        self.app = app
        self.specs = {spec.topic: spec for spec in specs}
        self._stopping = threading.Event()
        self.consumer: Consumer = log.consumer(
            isolation_level="read_committed", enable_auto_commit=False, value_deserializer=None
        )
        tps = [TopicPartition(t, p) for t in self.specs for p in range(log.topic(t).num_partitions)]
        self.consumer.assign(tps)
        self.consumer.seek_to_beginning(*tps)
        self._tps = tps

    def bootstrap(self) -> None:
        ends = self.consumer.end_offsets(self._tps)
        pending = {tp for tp in self._tps if self.consumer.position(tp) < ends[tp]}
        while pending:
            self._apply(self.consumer.poll(timeout_ms=100, max_records=10_000))
            pending = {tp for tp in pending if self.consumer.position(tp) < ends[tp]}

    def _apply(self, records: dict[TopicPartition, list[Any]]) -> None:
        for tp, recs in records.items():
            spec = self.specs[tp.topic]
            for r in recs:
                key = spec.key_serde.deserialize(r.key)
                if key is not None:
                    spec.store.put(key, spec.value_serde.deserialize(r.value))
            spec.store.take_changes()  # not logged: the topic is the changelog

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._apply(self.consumer.poll(timeout_ms=self.app.poll_ms))
        except BaseException as exc:
            _log.exception("global thread %s failed", self.name)
            self.app._thread_failed(self, exc)
        finally:
            self.consumer.close(autocommit=False)
