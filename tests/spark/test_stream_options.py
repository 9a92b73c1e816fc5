"""Streaming reads as Spark's Kafka source: minOffsetsPerTrigger with maxTriggerDelay (Kafka's delayBatch rule,
against a model, with a manual clock), subscribed topics that do not exist yet, and both on a real SparkSession."""

from __future__ import annotations

import random
from typing import Any

import pytest
from spark_helpers import needs_java

import pylog
import pylog.spark
from pylog.clock import ManualClock
from pylog.spark.options import Options
from pylog.spark.reader import PylogStreamReader
from pylog.spark.snapshot import LogView

pytestmark = pytest.mark.spark


def _append(path: str, topic: str, n: int, partitions: int = 2) -> None:
    with pylog.open(path) as log:
        if topic not in log.topics():
            log.create_topic(topic, partitions=partitions)
        producer = log.producer(value_serializer=None)
        for i in range(n):
            producer.send(topic, b"v", key=str(i).encode())
        producer.close()


def _total(offsets: dict[str, dict[str, int]]) -> int:
    return sum(o for parts in offsets.values() for o in parts.values())


@pytest.mark.parametrize("seed", range(5))
def test_min_offsets_per_trigger_follows_kafkas_rule(tmp_path: Any, seed: int) -> None:
    """Each trigger plans a batch iff it is the first, or maxTriggerDelay has passed since the last batch was
    planned, or at least minOffsetsPerTrigger offsets are new; a skipped trigger returns the start offsets."""
    rng = random.Random(seed)
    path = str(tmp_path / "log")
    _append(path, "t", 0)
    minimum, delay = rng.randint(5, 50), rng.randint(1000, 60_000)
    clock = ManualClock(1_000_000)
    opts = Options(
        {
            "path": path,
            "subscribe": "t",
            "startingOffsets": "earliest",
            "minOffsetsPerTrigger": str(minimum),
            "maxTriggerDelay": f"{delay}ms",
        }
    )
    reader = PylogStreamReader(opts, "{}", clock=clock)
    start = reader.initialOffset()
    last_batch: int | None = None  # the model: time of the last planned batch
    for _ in range(40):
        new = rng.choice([0, rng.randint(1, minimum - 1), rng.randint(minimum, 2 * minimum)])
        _append(path, "t", new)
        clock.advance(rng.choice([0, rng.randint(1, delay - 1), delay, delay + rng.randint(0, delay)]))
        now = clock.time_ms()
        view = LogView(path)
        available = sum(view.partition("t", p).log_end_offset for p in (0, 1)) - _total(start)
        runs = last_batch is None or now - last_batch >= delay or available >= minimum
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        if runs:
            last_batch = now
            assert _total(end) == _total(start) + available
            start = end
        else:
            assert end == start


def test_min_offsets_is_ignored_by_available_now(tmp_path: Any) -> None:
    path = str(tmp_path / "log")
    _append(path, "t", 3)
    clock = ManualClock()
    opts = Options(
        {"path": path, "subscribe": "t", "startingOffsets": "earliest", "minOffsetsPerTrigger": "100"}
    )
    reader = PylogStreamReader(opts, "{}", clock=clock)
    start = reader.initialOffset()
    first = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert _total(first) == 3
    _append(path, "t", 4)
    assert reader.latestOffset(first, reader.getDefaultReadLimit()) == first  # waits for 100
    reader.prepareForTriggerAvailableNow()
    assert _total(reader.latestOffset(first, reader.getDefaultReadLimit())) == 7


def test_subscribed_topic_that_does_not_exist_yet_is_waited_for(tmp_path: Any) -> None:
    path = str(tmp_path / "log")
    _append(path, "other", 2)
    opts = Options({"path": path, "subscribe": "later,other", "startingOffsets": "earliest"})
    reader = PylogStreamReader(opts, "{}")
    start = reader.initialOffset()
    assert list(start) == ["other"]
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert list(end) == ["other"] and reader.partitions(start, end)
    _append(path, "later", 5, partitions=3)
    after = reader.latestOffset(end, reader.getDefaultReadLimit())
    assert sorted(after) == ["later", "other"] and _total({"later": after["later"]}) == 5
    assert sum(r.size for p in reader.partitions(end, after) for r in p.ranges if r.topic == "later") == 5


# -- on a real SparkSession ------------------------------------------------------------------------------


def _stream(spark: Any, path: str, **options: str) -> Any:
    reader = spark.readStream.format("pylog")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(path)


@needs_java
def test_min_offsets_per_trigger_and_missing_topic_on_a_real_session(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "log")
    _append(path, "other", 1)
    pylog.spark.register(spark)  # as pylog.spark.session() does: found even if Spark's lookup is skipped
    with pytest.raises(Exception, match="option endingOffsets is not valid in streaming queries"):
        q = _stream(spark, path, subscribe="other", endingOffsets="latest").writeStream.format("memory")
        q.queryName("refused").start().processAllAvailable()
    # a topic that does not exist yet: empty batches, then its records once it is created
    df = _stream(
        spark,
        path,
        subscribe="t",
        startingOffsets="earliest",
        minOffsetsPerTrigger="100",
        maxTriggerDelay="1h",
    )
    query = (
        df.writeStream.format("memory")
        .queryName("min_offsets")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start()
    )
    try:
        query.processAllAvailable()
        assert spark.sql("SELECT count(*) FROM min_offsets").first()[0] == 0
        _append(path, "t", 150)
        query.processAllAvailable()  # 150 new offsets >= minOffsetsPerTrigger: a batch
        assert spark.sql("SELECT count(*) FROM min_offsets").first()[0] == 150
        _append(path, "t", 50)
        query.processAllAvailable()  # 50 < 100 new offsets within maxTriggerDelay: skipped
        assert spark.sql("SELECT count(*) FROM min_offsets").first()[0] == 150
        _append(path, "t", 60)
        query.processAllAvailable()
        got = sorted(r[0] for r in spark.sql("SELECT CAST(key AS STRING) FROM min_offsets").collect())
        assert got == sorted(str(i) for n in (150, 50, 60) for i in range(n))
    finally:
        query.stop()
