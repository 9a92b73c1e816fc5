"""``df.writeStream.format("pylog")``: an exactly-once streaming sink built on pylog's transactions.

Input: the columns of the batch writer (:mod:`pylog.spark.writer`, Spark's Kafka sink): ``value``, and
optionally ``key``, ``topic`` (or the ``topic`` option), ``partition``, ``headers``.

Spark's Kafka sink is at-least-once; this one is exactly-once: every micro-batch becomes visible to
``read_committed`` readers at once, exactly once, whatever fails and whenever.

Protocol (query ``Q`` = the streaming query's id, which its checkpoint keeps across restarts; batch ``N``):

1. Each task (executor, ``write``) opens a transactional producer with the id ``spark-sink:Q:<partition>``
   and calls ``init_transactions()``: that bumps the id's epoch, which fences every older attempt of the
   same partition (a failed attempt, a speculative duplicate, an attempt of a crashed earlier run) and
   aborts its open transaction. It begins a transaction, appends its rows to their partitions (tagged with
   ``(producer id, epoch, txn)``), fsyncs them, closes the producer with the transaction still OPEN, and
   returns a commit message naming the transaction. An empty task still fences, then opens no transaction.
2. The driver (``commit(messages, N)``), holding the transaction lock of the log directory:

   a. reads the last batch this query committed: the highest ``batch`` in the metadata of the committed
      offsets of the group ``spark-sink:Q``. If ``N`` is not above it, the batch was committed before (a
      replay after a crash between step 2d and Spark's own commit log): it aborts the tasks'
      transactions and returns, writing nothing.
   b. opens a transaction of its own (id ``spark-sink:Q:commit``, init fencing an older driver);
   c. stages, in that transaction, an offset for the group ``spark-sink:Q`` on partition 0 of a topic the
      batch wrote, whose metadata is ``{"query": Q, "batch": N}``: the durable marker of the batch;
   d. commits the tasks' transactions and its own with ONE decision record
      (:meth:`pylog.transactions.TxnLog.commit_many`). That record is the batch's commit point.

3. ``abort(messages, N)`` (a task failed) aborts the named transactions and fences the partitions that
   returned no message, so nothing of the batch is ever visible.

Crash analysis (what a restart from the checkpoint sees):

* a task dies (its worker killed, the executor lost) before returning: its records belong to an open
  transaction nobody will commit. The retry of the task (or of the batch, after a restart) initialises the
  same transactional id, which aborts it; a zombie attempt still writing is fenced (its epoch is old, so
  its batches count as aborted) and cannot commit;
* two attempts of one task (retry, speculation): only the epoch the driver names can be committed, and
  commit_many refuses (deciding nothing) a transaction that is no longer open: at most one attempt of each
  partition becomes visible;
* the driver dies before 2d: nothing of batch N is visible; Spark replays N from its offset log, the tasks
  fence the old attempts and write again, and the new driver commits;
* the driver dies after 2d, before Spark writes its commit log: N is visible, once; Spark replays N, and
  step 2a recognises it from the marker (committed by the same record as the data) and aborts the replay;
* the decision record is torn (power loss during 2d): it was never acknowledged and counts as absent,
  which is the case "before 2d".

Visibility: ``read_committed`` readers see a batch all at once or not at all and stop at the first batch
still being written (its transactions are open): a reader never sees half a batch. ``read_uncommitted``
readers (the default, as in Kafka) see every record as it is appended, including those of attempts that
failed or were replayed: duplicates are possible there, as with any Kafka transactional producer.

A task's transaction stays open from its first row to the driver's commit, so a batch must finish within
``kafka.transaction.timeout.ms`` (default 15 minutes): past it a ``read_committed`` pylog consumer waiting
on it aborts it, and the driver's commit then fails (the query stops; a restart replays the batch). If a
restarted query runs fewer tasks than the one that crashed, the surplus partitions' open transactions are
aborted by the timeout only; ``read_committed`` readers wait at them until then.

Options: ``path``, ``topic``, ``checkpointLocation`` (Spark's), ``acks`` (only ``all``: transactions wait for
fsync), ``kafka.transaction.timeout.ms``. See ``docs/spark-sink.md``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

import pylog
from pylog.errors import ConfigError, IllegalStateError, ProducerFencedError, UnknownGroupError
from pylog.groups.admin import group_offsets, stage_transactional_offsets
from pylog.idempotent import IdempotentProducer
from pylog.spark.options import check_write_options
from pylog.spark.snapshot import check_log_dir
from pylog.spark.writer import append_record_batch, check_write_schema
from pylog.structs import OffsetAndMetadata, TopicPartition
from pylog.transactions import TxnLog

__all__ = [
    "DEFAULT_TRANSACTION_TIMEOUT_MS",
    "PylogStreamWriter",
    "SinkCommitMessage",
    "commit_transactional_id",
    "last_committed_batch",
    "make_stream_writer",
    "marker_group",
    "task_transactional_id",
]

DEFAULT_TRANSACTION_TIMEOUT_MS = 900_000
TIMEOUT_OPTION = "kafka.transaction.timeout.ms"
#: Spark local properties of a streaming query's tasks (StreamExecution.QUERY_ID_KEY, BATCH_ID_KEY).
_QUERY_ID_KEY = "sql.streaming.queryId"
_BATCH_ID_KEY = "streaming.sql.batchId"


def task_transactional_id(query_id: str, partition: int) -> str:
    """The transactional id a task of ``query_id`` writes partition ``partition`` of each batch with."""
    return f"spark-sink:{query_id}:{partition}"


def commit_transactional_id(query_id: str) -> str:
    """The transactional id the driver's commit of a batch of ``query_id`` writes the batch marker with."""
    return f"spark-sink:{query_id}:commit"


def marker_group(query_id: str) -> str:
    """The group whose committed offsets hold the marker of the last batch ``query_id`` committed."""
    return f"spark-sink:{query_id}"


def last_committed_batch(log: pylog.Log, query_id: str) -> int:
    """The last batch id the sink committed for ``query_id`` (-1: none), read from the marker group."""
    last = -1
    try:
        offsets = group_offsets(log, marker_group(query_id))
    except UnknownGroupError:
        return last  # no batch committed yet
    for om in offsets.values():
        try:
            meta = json.loads(om.metadata or "")
        except ValueError:
            continue
        if isinstance(meta, dict) and meta.get("query") == query_id and isinstance(meta.get("batch"), int):
            last = max(last, meta["batch"])
    return last


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What one task attempt wrote: its open transaction (None when it had no rows) and the topics it wrote."""

    query_id: str
    batch_id: int
    partition: int
    records: int
    transactional_id: str
    transaction: tuple[int, int, int] | None
    topics: tuple[str, ...]


def make_stream_writer(raw_options: Mapping[str, Any], schema: Any) -> PylogStreamWriter:
    """The sink for ``writeStream.format("pylog")`` with these options (checked: ConfigError for a bad one)."""
    opts = check_write_options(raw_options, extra=("checkpointLocation", TIMEOUT_OPTION))
    path = check_log_dir(opts.get("path", ""))
    topic = opts.get("topic")
    check_write_schema(schema, topic, path)
    acks = opts.get("acks", "all")
    if acks not in ("all", "-1"):
        raise ConfigError(
            f"the streaming sink writes transactions, which wait for fsync: acks must be all, not {acks!r}"
        )
    raw_timeout = opts.get(TIMEOUT_OPTION, str(DEFAULT_TRANSACTION_TIMEOUT_MS))
    try:
        timeout_ms = int(raw_timeout)
    except ValueError:
        timeout_ms = 0
    if timeout_ms < 1:
        raise ConfigError(
            f"{TIMEOUT_OPTION} must be a whole number of milliseconds >= 1, got {raw_timeout!r}"
        )
    return PylogStreamWriter(path, topic, timeout_ms)


class PylogStreamWriter(DataSourceStreamArrowWriter):
    """Writes each micro-batch as pylog transactions committed together by the driver (module docstring)."""

    def __init__(self, path: str, topic: str | None, transaction_timeout_ms: int) -> None:
        self.path = path
        self.topic = topic
        self.transaction_timeout_ms = transaction_timeout_ms

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        import pyarrow.compute as pc
        from pyspark import TaskContext

        context = TaskContext.get()
        query_id = context.getLocalProperty(_QUERY_ID_KEY) if context is not None else None
        batch = context.getLocalProperty(_BATCH_ID_KEY) if context is not None else None
        if context is None or query_id is None or batch is None:
            raise IllegalStateError("the pylog streaming sink runs in the tasks of a streaming query only")
        partition = context.partitionId()
        tid = task_transactional_id(query_id, partition)
        written, topics = 0, set()
        with pylog.open(self.path) as log:
            producer = log.producer(
                transactional_id=tid,
                value_serializer=None,
                transaction_timeout_ms=self.transaction_timeout_ms,
            )
            if not isinstance(producer, IdempotentProducer):  # what log.producer(transactional_id=...) makes
                producer.close()
                raise IllegalStateError("log.producer(transactional_id=...) gave no transactional producer")
            try:
                producer.init_transactions()  # fences older attempts of this partition, aborts their transaction
                for rb in iterator:
                    if rb.num_rows == 0:
                        continue
                    if producer.open_transaction is None:
                        producer.begin_transaction()
                    written += append_record_batch(producer, self.topic, rb)
                    if self.topic is not None:
                        topics.add(self.topic)
                    else:
                        topics.update(pc.unique(rb.column(rb.schema.names.index("topic"))).to_pylist())
                transaction = producer.open_transaction
                producer.flush()  # acks=all: every record of the transaction is fsynced
            except BaseException:
                if producer.open_transaction is not None:
                    try:
                        producer.abort_transaction()
                    except Exception:
                        pass  # the next attempt's init_transactions() aborts it
                raise
            finally:
                producer.close()  # leaves the transaction open: the driver decides it
        return SinkCommitMessage(
            query_id, int(batch), partition, written, tid, transaction, tuple(sorted(t for t in topics if t))
        )

    def commit(self, messages: list[Any], batchId: int) -> None:
        """Make the batch visible: one decision record for every task's transaction and the batch marker,
        unless the marker says this query committed ``batchId`` already (a replay): then abort them."""
        done = [m for m in messages if isinstance(m, SinkCommitMessage)]
        if not done:
            return
        query_id = done[0].query_id
        with pylog.open(self.path) as log:
            txns = log.transactions()
            with txns.lock():
                tasks = [(m.transactional_id, *m.transaction) for m in done if m.transaction is not None]
                if batchId <= last_committed_batch(log, query_id):
                    _abort(txns, tasks)
                    return
                if not tasks:
                    return
                tid = commit_transactional_id(query_id)
                pid, epoch = txns.init(tid)
                txn = txns.begin(tid, pid, epoch, log.clock.time_ms(), self.transaction_timeout_ms)
                topic = min(t for m in done for t in m.topics)
                end = log.topic(topic).partition(0).log_end_offset
                marker = json.dumps({"query": query_id, "batch": batchId}, sort_keys=True)
                stage_transactional_offsets(
                    log,
                    marker_group(query_id),
                    {TopicPartition(topic, 0): OffsetAndMetadata(end, marker)},
                    (pid, epoch, txn),
                )
                txns.commit_many([*tasks, (tid, pid, epoch, txn)])

    def abort(self, messages: list[Any], batchId: int) -> None:
        """Abort the transactions of the tasks that returned, and fence the partitions that did not (their
        attempts may have left a transaction open); nothing of the batch becomes visible."""
        done = [m for m in messages if isinstance(m, SinkCommitMessage)]
        if not done:
            return  # no task returned: the next attempt of each partition fences it, or the timeout aborts it
        query_id = done[0].query_id
        with pylog.open(self.path) as log:
            txns = log.transactions()
            with txns.lock():
                _abort(
                    txns, [(m.transactional_id, *m.transaction) for m in done if m.transaction is not None]
                )
                for index, message in enumerate(messages):
                    if not isinstance(message, SinkCommitMessage):
                        txns.init(task_transactional_id(query_id, index))


def _abort(txns: TxnLog, tasks: list[tuple[str, int, int, int]]) -> None:
    for tid, pid, epoch, txn in tasks:
        try:
            txns.end(tid, pid, epoch, txn, commit=False)
        except ProducerFencedError:
            pass  # already fenced (and so aborted) by a newer attempt
