"""The exactly-once streaming sink (``writeStream.format("pylog")``, pylog.spark.sink).

The protocol tests drive the sink's commit and abort as Spark would, without Spark (fast); the Spark tests
run real streaming queries on the session fixture: a round trip with restarts, a replay of a batch that was
committed before Spark recorded it, and the kill test (Python workers SIGKILLed and the query stopped at
random points, then restarted from its checkpoint: every input record must be in the output once, read
with read_committed). ``PYLOG_TORTURE=1`` runs the kill test longer.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import pylog
from pylog.errors import ConfigError, ProducerFencedError
from pylog.spark.sink import (
    PylogStreamWriter,
    SinkCommitMessage,
    last_committed_batch,
    make_stream_writer,
    task_transactional_id,
)

TORTURE = os.environ.get("PYLOG_TORTURE") == "1"


# -- the protocol, without Spark ------------------------------------------------------------------------------


def _task(path: str, query: str, batch: int, partition: int, values: list[bytes]) -> SinkCommitMessage:
    """What a task of the sink does in write(): fence, write in a transaction left open, describe it."""
    tid = task_transactional_id(query, partition)
    with pylog.open(path) as log:
        producer = log.producer(transactional_id=tid, value_serializer=None)
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_batch("out", values=values, partition=partition % 2)
        producer.flush()
        txn = producer.open_transaction
        producer.close()
    return SinkCommitMessage(query, batch, partition, len(values), tid, txn, ("out",))


def _committed(path: str) -> list[bytes]:
    with pylog.open(path) as log:
        consumer = log.consumer(
            "out",
            auto_offset_reset="earliest",
            consumer_timeout_ms=0,
            isolation_level="read_committed",
            value_deserializer=None,
        )
        values = [r.value for r in consumer]
        consumer.close()
    return values


@pytest.fixture
def out_log(tmp_path: Path) -> str:
    path = str(tmp_path / "log")
    with pylog.open(path) as log:
        log.create_topic("out", partitions=2)
    return path


def test_commit_is_atomic_and_a_replayed_batch_is_recognised(out_log: str) -> None:
    writer = PylogStreamWriter(out_log, "out", 60_000)
    batch0 = [_task(out_log, "q", 0, p, [b"0-%d-%d" % (p, i) for i in range(5)]) for p in range(2)]
    assert _committed(out_log) == []  # written, not visible before the driver's commit
    writer.commit(list(batch0), 0)
    assert sorted(_committed(out_log)) == sorted(b"0-%d-%d" % (p, i) for p in range(2) for i in range(5))
    with pylog.open(out_log) as log:
        assert last_committed_batch(log, "q") == 0
        assert last_committed_batch(log, "other") == -1
    # the driver died after its commit, before Spark's commit log: Spark replays batch 0
    replay = [_task(out_log, "q", 0, p, [b"0-%d-%d" % (p, i) for i in range(5)]) for p in range(2)]
    writer.commit(list(replay), 0)
    assert Counter(_committed(out_log)) == Counter(b"0-%d-%d" % (p, i) for p in range(2) for i in range(5))
    with pylog.open(out_log) as log:
        statuses = {log.transactions().status(*m.transaction) for m in replay if m.transaction}
    assert statuses == {"aborted"}
    # the next batch, where one partition's first attempt was fenced by its retry
    first = _task(out_log, "q", 1, 0, [b"1-zombie"])
    retry = _task(out_log, "q", 1, 0, [b"1-0"])
    other = _task(out_log, "q", 1, 1, [b"1-1"])
    with pytest.raises(ProducerFencedError):
        writer.commit([first, other], 1)  # the fenced attempt cannot commit: nothing of batch 1 is decided
    assert b"1-1" not in _committed(out_log)
    writer.commit([retry, other], 1)
    assert Counter(_committed(out_log))[b"1-0"] == 1 and b"1-zombie" not in _committed(out_log)


def test_abort_hides_the_batch_and_fences_tasks_without_a_message(out_log: str) -> None:
    writer = PylogStreamWriter(out_log, "out", 60_000)
    ok = _task(out_log, "q", 0, 0, [b"a"])
    lost = _task(out_log, "q", 0, 1, [b"b"])  # its task "died" after writing: Spark has no message from it
    writer.abort([ok, None], 0)
    with pylog.open(out_log) as log:
        txns = log.transactions()
        assert ok.transaction is not None and lost.transaction is not None
        assert txns.status(*ok.transaction) == "aborted"
        assert txns.status(*lost.transaction) == "aborted"  # fenced by abort's init of partition 1's id
    assert _committed(out_log) == []
    writer.commit([_task(out_log, "q", 0, p, [b"x%d" % p]) for p in range(2)], 0)
    assert sorted(_committed(out_log)) == [b"x0", b"x1"]


def test_options_are_checked(out_log: str) -> None:
    from pyspark.sql.types import BinaryType, StructField, StructType

    schema = StructType([StructField("value", BinaryType())])
    base = {"path": out_log, "topic": "out"}
    assert make_stream_writer({**base, "checkpointLocation": "/x"}, schema).transaction_timeout_ms == 900_000
    assert (
        make_stream_writer({**base, "kafka.transaction.timeout.ms": "5000"}, schema).transaction_timeout_ms
        == 5000
    )
    for bad, message in (
        ({"topc": "out"}, "did you mean 'topic'"),
        ({"kafka.bootstrap.servers": "h:9092"}, "no brokers"),
        ({"kafka.linger.ms": "5"}, "the only kafka.* option is kafka.transaction.timeout.ms"),
        ({"acks": "1"}, "acks must be all"),
        ({"kafka.transaction.timeout.ms": "soon"}, "whole number of milliseconds"),
        ({"topic": "nope"}, "unknown topic 'nope'"),
    ):
        with pytest.raises(Exception, match=message) as info:
            make_stream_writer({**base, **bad}, schema)
        assert isinstance(info.value, (ConfigError, pylog.errors.PylogError))


# -- real streaming queries -----------------------------------------------------------------------------------


def _produce(path: str, topic: str, start: int, n: int) -> None:
    with pylog.open(path) as log:
        producer = log.producer(value_serializer=None)
        producer.send_batch(
            topic,
            keys=[b"k%d" % i for i in range(start, start + n)],
            values=[b"v%d" % i for i in range(start, start + n)],
        )
        producer.close()


def _output(path: str, isolation: str = "read_committed") -> Counter[bytes]:
    with pylog.open(path) as log:
        consumer = log.consumer(
            "out",
            auto_offset_reset="earliest",
            consumer_timeout_ms=0,
            isolation_level=isolation,
            value_deserializer=None,
        )
        got = Counter(r.value for r in consumer)
        consumer.close()
    return got


def _start(spark: Any, path: str, checkpoint: str, per_trigger: int, transform: Any = None) -> Any:
    df = (
        spark.readStream.format("pylog")
        .option("subscribe", "in")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", per_trigger)
        .load(path)
        .selectExpr("key", "value")
    )
    if transform is not None:
        df = transform(df)
    return (
        df.writeStream.format("pylog")
        .option("topic", "out")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(path)
    )


@pytest.fixture
def stream_log(tmp_path: Path) -> str:
    path = str(tmp_path / "log")
    with pylog.open(path) as log:
        log.create_topic("in", partitions=2)
        log.create_topic("out", partitions=3)
    return path


@pytest.mark.spark
def test_stream_to_pylog_restart_and_replay(spark: Any, stream_log: str, tmp_path: Path) -> None:
    path, checkpoint = stream_log, str(tmp_path / "ck")
    _produce(path, "in", 0, 300)
    query = _start(spark, path, checkpoint, 100)
    query.awaitTermination(180)
    assert query.exception() is None
    batches = [p["batchId"] for p in query.recentProgress if p["numInputRows"]]
    assert len(batches) >= 3
    want = Counter(b"v%d" % i for i in range(300))
    assert _output(path) == want

    # restart with more input: only the new records are written
    _produce(path, "in", 300, 50)
    query = _start(spark, path, checkpoint, 100)
    query.awaitTermination(180)
    assert query.exception() is None
    want.update(b"v%d" % i for i in range(300, 350))
    assert _output(path) == want

    # the driver "died" after the sink committed the last batch but before Spark wrote its commit log:
    # Spark runs that batch again; the sink recognises it and nothing is written twice
    commits = Path(checkpoint) / "commits"
    last = max(int(name) for name in os.listdir(commits) if name.isdigit())
    (commits / str(last)).unlink()
    with contextlib.suppress(FileNotFoundError):
        (commits / f".{last}.crc").unlink()
    before = sum(_output(path, "read_uncommitted").values())
    query = _start(spark, path, checkpoint, 100)
    query.awaitTermination(180)
    assert query.exception() is None
    assert any(p["batchId"] == last and p["numInputRows"] for p in query.recentProgress), "no replay"
    assert sum(_output(path, "read_uncommitted").values()) > before  # the replay wrote (and aborted) again
    assert _output(path) == want
    with pylog.open(path) as log:
        assert last_committed_batch(log, str(query.id)) == last

    # Spark's own reader agrees: read_committed gives each record once, read_uncommitted the replay too
    def read(isolation: str) -> Any:
        reader = spark.read.format("pylog").option("subscribe", "out")
        return reader.option("kafka.isolation.level", isolation).load(path)

    assert Counter(bytes(r.value) for r in read("read_committed").select("value").collect()) == want
    everything = sum(_output(path, "read_uncommitted").values())
    assert read("read_uncommitted").count() == everything > sum(want.values())


# -- the kill test ----------------------------------------------------------------------------------------------


def _descendant_workers() -> list[int]:
    """Pids of the Python workers of this process's Spark (children of a pyspark daemon under this process)."""
    parent: dict[int, int] = {}
    cmdline: dict[int, bytes] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline[int(entry)] = f.read()
        except OSError:
            continue
        parent[int(entry)] = int(stat.rsplit(b")", 1)[1].split()[1])
    mine = {os.getpid()}
    changed = True
    while changed:
        changed = False
        for pid, ppid in parent.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                changed = True
    return sorted(
        pid
        for pid in mine
        if parent.get(pid) in mine
        and b"pyspark.daemon" in cmdline.get(parent[pid], b"")
        and b"pyspark.daemon" in cmdline.get(pid, b"")  # a forked worker, not the daemon itself
    )


def _chaos(
    query: Any,
    action: str,
    delay: float,
    stop: threading.Event,
    acted: threading.Event,
    rng: random.Random,
    figures: Counter[str],
) -> None:
    """After ``delay`` seconds (unless ``stop`` is set first): stop the query, or SIGKILL one of its workers."""
    if stop.wait(delay) or action == "none":
        return
    if action == "stop":
        query.stop()
        figures["query stops"] += 1
        acted.set()
        return
    workers = _descendant_workers()
    if workers:
        os.kill(rng.choice(workers), signal.SIGKILL)
        figures["worker SIGKILLs"] += 1
        acted.set()


@pytest.mark.spark
def test_kill_workers_and_query_at_random_points_every_record_once(
    spark: Any, stream_log: str, tmp_path: Path
) -> None:
    """Python workers die (a UDF that os._exit()s at chosen records, once each; SIGKILLs of random workers at
    random moments, which hit the reader, the UDF, the sink's tasks and its driver-side commit) and the query
    is stopped at random moments; each time it is restarted from its checkpoint, until a run completes.
    Then every input record is in the output exactly once for read_committed readers."""
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import functions as F

    seed = int(os.environ.get("PYLOG_SEED", "18"))
    rng = random.Random(seed)
    records, rounds, chaos_runs, per_trigger = (20000, 25, 60, 2000) if TORTURE else (600, 1, 2, 300)
    path, checkpoint, tokens = stream_log, str(tmp_path / "ck"), tmp_path / "kill-at"
    tokens.mkdir()
    _produce(path, "in", 0, records)
    for i in rng.sample(range(records), rounds):
        (tokens / f"v{i}").touch()  # the UDF exits its worker once when it meets this value
    token_dir = str(tokens)

    def die_at(value: bytes) -> bytes:
        try:
            os.unlink(os.path.join(token_dir, value.decode()))
        except FileNotFoundError:
            return value
        os._exit(1)

    udf = F.udf(die_at, "binary", useArrow=False)
    figures = Counter[str]()
    started = time.monotonic()
    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "7")  # several writes per task
    try:
        for run in range(200):
            query = _start(
                spark, path, checkpoint, per_trigger, lambda df: df.withColumn("value", udf("value"))
            )
            figures["runs"] += 1
            action = rng.choice(["sigkill", "sigkill", "stop", "none"]) if run < chaos_runs else "none"
            stop_event, acted = threading.Event(), threading.Event()
            run_started = time.monotonic()

            delay = rng.uniform(0.5, 6.0)
            killer = threading.Thread(
                target=_chaos, args=(query, action, delay, stop_event, acted, rng, figures)
            )
            killer.start()
            try:
                finished = query.awaitTermination(240)
            except StreamingQueryException:
                finished, failed = True, True
            else:
                failed = query.exception() is not None
            stop_event.set()
            killer.join()
            if not finished:
                query.stop()
                figures["hung runs stopped"] += 1
                continue
            if failed:
                figures["failed runs"] += 1
                print(f"run {run}: failed after {time.monotonic() - run_started:.1f}s")
                continue
            print(
                f"run {run}: {action} after {delay:.1f}s, failed={failed}, {time.monotonic() - run_started:.1f}s"
            )
            if acted.is_set():
                continue  # stopped or a worker killed: maybe before the end, run again
            # an availableNow run that ends by itself has read everything there was when it started, and the
            # input does not change: every record went through a committed batch
            break
        else:
            pytest.fail(f"the query never completed: {dict(figures)}")
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
    figures["UDF exits"] = rounds - len(os.listdir(tokens))
    got = _output(path)
    want = Counter(b"v%d" % i for i in range(records))
    duplicates = sum(n - 1 for n in got.values() if n > 1)
    missing = sum(1 for v in want if v not in got)
    extra = sum(1 for v in got if v not in want)
    figures.update(records=records, duplicates=duplicates, missing=missing, unknown=extra)
    figures["written incl. aborted"] = sum(_output(path, "read_uncommitted").values())
    figures["seconds"] = round(time.monotonic() - started)
    print(f"\nexactly-once kill test, seed {seed}: {dict(figures)}")
    assert (duplicates, missing, extra) == (0, 0, 0), dict(figures)
    assert got == want
