"""``kafka.isolation.level`` on Spark reads: batch (Python path and JVM reader) and streaming, compared with
pylog's own consumer at the same isolation level over a log of committed, aborted and still open
transactions mixed with plain records."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from spark_helpers import HAS_JAVAC

import pylog
from pylog.errors import ConfigError
from pylog.spark import jvm
from pylog.spark.options import OffsetRange, Options, split_ranges

pytestmark = pytest.mark.spark

Row = tuple[str, int, int, bytes | None, bytes | None]


def _write(log: pylog.Log, seed: int) -> Any:
    """Topic ``t`` (2 partitions, small segments): transactions committed and aborted in both partitions,
    plain records between them; then, in partition 0 only, a transaction left open and plain records after
    it. Returns the producer of the open transaction."""
    rng = random.Random(seed)
    log.create_topic("t", partitions=2)
    tx = log.producer(transactional_id="tx", value_serializer=None)
    tx.init_transactions()
    plain = log.producer(value_serializer=None)
    n = 0
    for _ in range(24):
        kind = rng.choice(["commit", "abort", "plain"])
        count = rng.randint(1, 12)
        if kind == "plain":
            for _ in range(count):
                plain.send("t", b"p%d" % n, key=b"k%d" % (n % 7), partition=rng.randint(0, 1))
                n += 1
            plain.flush()
            continue
        tx.begin_transaction()
        for i in range(count):
            tx.send(
                "t",
                (b"c%d" if kind == "commit" else b"x%d") % n,
                key=b"k%d" % (n % 7),
                partition=rng.randint(0, 1),
            )
            n += 1
            if i == count // 2:
                tx.flush()
        if kind == "commit":
            tx.commit_transaction()
        else:
            tx.abort_transaction()
    stuck = log.producer(transactional_id="stuck", value_serializer=None, transaction_timeout_ms=3_600_000)
    stuck.init_transactions()
    stuck.begin_transaction()
    for i in range(5):
        stuck.send("t", b"open%d" % i, partition=0)
    stuck.flush()
    for i in range(6):
        plain.send("t", b"after%d" % i, partition=i % 2)
    plain.close()
    tx.close()
    return stuck


def _reference(log: pylog.Log, isolation_level: str) -> list[Row]:
    consumer = log.consumer(
        value_deserializer=None,
        auto_offset_reset="earliest",
        consumer_timeout_ms=0,
        isolation_level=isolation_level,
    )
    consumer.assign(log.topic("t").partitions())
    out = [(r.topic, r.partition, r.offset, r.key, r.value) for r in consumer]
    consumer.close()
    return sorted(out)


def _rows(df: Any) -> list[Row]:
    return sorted(
        (r.topic, r.partition, r.offset, None if r.key is None else bytes(r.key), bytes(r.value))
        for r in df.select("topic", "partition", "offset", "key", "value").collect()
    )


def _read(spark: Any, path: str, **options: str) -> Any:
    reader = spark.read.format("pylog").option("subscribe", "t")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(path)


def _plan(df: Any) -> str:
    return str(df._jdf.queryExecution().executedPlan().toString())


@pytest.fixture(scope="module")
def txn_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, pylog.Log, Any]]:
    """The log, kept open (the transaction in partition 0 stays open), and its open transaction's producer."""
    path = str(tmp_path_factory.mktemp("read-committed") / "log")
    with pylog.open(path, segment_bytes=1024) as log:
        stuck = _write(log, seed=5)
        yield path, log, stuck
        stuck.close()


@pytest.fixture
def python_path(spark: Any) -> Iterator[None]:
    spark.conf.set(jvm.ENABLED, "false")
    try:
        yield
    finally:
        spark.conf.set(jvm.ENABLED, "true")


def test_the_log_has_what_the_tests_need(txn_log: tuple[str, pylog.Log, Any]) -> None:
    _, log, _ = txn_log
    committed, everything = _reference(log, "read_committed"), _reference(log, "read_uncommitted")
    values = [r[4] for r in everything]
    assert any(v.startswith(b"x") for v in values) and any(v.startswith(b"c") for v in values)
    assert {r[1] for r in committed if r[4].startswith(b"after")} == {1}  # partition 0 is held at the LSO
    assert not any(r[4].startswith((b"x", b"open")) for r in committed)
    assert len(log.topic("t").partition(0).segments) > 3  # reads start inside segments and cross them


@pytest.mark.parametrize("min_partitions", [None, "5"])
def test_batch_python_path_matches_the_consumer(
    spark: Any, python_path: None, txn_log: tuple[str, pylog.Log, Any], min_partitions: str | None
) -> None:
    path, log, _ = txn_log
    extra = {"minPartitions": min_partitions} if min_partitions else {}
    committed = _read(spark, path, **{"kafka.isolation.level": "read_committed"}, **extra)
    assert "JVM reader" not in _plan(committed)
    assert _rows(committed) == _reference(log, "read_committed")
    uncommitted = _read(spark, path, **{"kafka.isolation.level": "read_uncommitted"}, **extra)
    assert _rows(uncommitted) == _reference(log, "read_uncommitted")
    assert _rows(_read(spark, path, **extra)) == _reference(log, "read_uncommitted")  # the default


@pytest.mark.skipif(not HAS_JAVAC, reason="pylog's JVM reader is built with javac: none found")
@pytest.mark.parametrize("min_partitions", [None, "5"])
def test_batch_jvm_reader_matches_the_consumer(
    spark: Any, txn_log: tuple[str, pylog.Log, Any], min_partitions: str | None
) -> None:
    path, log, _ = txn_log
    extra = {"minPartitions": min_partitions} if min_partitions else {}
    committed = _read(spark, path, **{"kafka.isolation.level": "read_committed"}, **extra)
    assert "JVM reader" in _plan(committed)
    assert _rows(committed) == _reference(log, "read_committed")
    assert committed.count() == len(_reference(log, "read_committed"))  # no column: only row counts
    uncommitted = _read(spark, path, **{"kafka.isolation.level": "read_uncommitted"}, **extra)
    assert _rows(uncommitted) == _reference(log, "read_uncommitted")


def _stream(spark: Any, path: str, out: str, checkpoint: str, level: str) -> Any:
    query = (
        spark.readStream.format("pylog")
        .option("subscribe", "t")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "40")
        .option("kafka.isolation.level", level)
        .load(path)
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None
    return query


def test_stream_reads_committed_records_and_those_of_a_transaction_once_it_commits(
    spark: Any, tmp_path: Any
) -> None:
    path = str(tmp_path / "log")
    committed_out, committed_ck = str(tmp_path / "c-out"), str(tmp_path / "c-ck")
    all_out, all_ck = str(tmp_path / "u-out"), str(tmp_path / "u-ck")
    with pylog.open(path, segment_bytes=1024) as log:
        stuck = _write(log, seed=9)
        _stream(spark, path, committed_out, committed_ck, "read_committed")
        _stream(spark, path, all_out, all_ck, "read_uncommitted")
        assert _rows(spark.read.parquet(committed_out)) == _reference(log, "read_committed")
        assert _rows(spark.read.parquet(all_out)) == _reference(log, "read_uncommitted")

        stuck.commit_transaction()  # what was held back at the LSO is read now, nothing skipped
        stuck.close()
        _stream(spark, path, committed_out, committed_ck, "read_committed")
        got = _rows(spark.read.parquet(committed_out))
        assert got == _reference(log, "read_committed")
        assert any(r[4] == b"open0" for r in got) and any(r[4] == b"after0" for r in got)


def test_a_bad_isolation_level_is_a_config_error(spark: Any, txn_log: tuple[str, pylog.Log, Any]) -> None:
    with pytest.raises(
        ConfigError, match=r"kafka\.isolation\.level must be one of read_uncommitted, read_committed"
    ):
        Options({"subscribe": "t", "kafka.isolation.level": "read_commited"})
    assert Options({"subscribe": "t", "Kafka.Isolation.Level": "READ_COMMITTED"}).read_committed
    path = txn_log[0]
    with pytest.raises(Exception, match=r"(?s)ConfigError.*kafka\.isolation\.level must be one of"):
        _read(spark, path, **{"kafka.isolation.level": "serializable"}).collect()
    with pytest.raises(Exception, match=r"kafka\.isolation\.level must be one of"):
        spark.readStream.format("pylog").option("subscribe", "t").option(
            "kafka.isolation.level", "nope"
        ).load(path)


def test_splitting_a_range_keeps_its_skipped_offsets() -> None:
    r = OffsetRange("t", 0, 0, 100, ((10, 20), (30, 31), (90, 100)))
    parts = split_ranges([r], 4)
    assert [(p.start, p.end, p.skipped) for p in parts] == [
        (0, 25, ((10, 20),)),
        (25, 50, ((30, 31),)),
        (50, 75, ()),
        (75, 100, ((90, 100),)),
    ]


def test_stream_end_offsets_stop_at_the_last_stable_offset(txn_log: tuple[str, pylog.Log, Any]) -> None:
    """latestOffset never passes the first batch of the open transaction; a batch planned past it (a
    checkpoint of a read_uncommitted query) is refused rather than returned without those records."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from pylog.spark.reader import PylogStreamReader

    path, log, _ = txn_log
    everything = _reference(log, "read_uncommitted")
    lso = min(r[2] for r in everything if r[1] == 0 and r[4].startswith(b"open"))
    ends = {
        1: max(r[2] for r in everything if r[1] == 1) + 1,
        0: max(r[2] for r in everything if r[1] == 0) + 1,
    }
    options = {"path": path, "subscribe": "t", "startingOffsets": "earliest"}
    committed = PylogStreamReader(Options({**options, "kafka.isolation.level": "read_committed"}), "{}")
    start = committed.initialOffset()
    assert committed.latestOffset(start, ReadAllAvailable()) == {"t": {"0": lso, "1": ends[1]}}
    uncommitted = PylogStreamReader(Options(options), "{}")
    assert uncommitted.latestOffset(start, ReadAllAvailable()) == {"t": {"0": ends[0], "1": ends[1]}}
    with pytest.raises(ConfigError, match="past the last stable offset"):
        committed.partitions(start, {"t": {"0": ends[0], "1": ends[1]}})
