from __future__ import annotations

import os
from typing import Any

import pytest
from spark_helpers import expected

import pylog

pytestmark = pytest.mark.spark


def _produce(path: str, topic: str, start: int, n: int) -> None:
    with pylog.open(path) as log:
        producer = log.producer(value_serializer=None)
        producer.send_batch(
            topic,
            keys=[f"k{i}".encode() for i in range(start, start + n)],
            values=[f"v{i}".encode() for i in range(start, start + n)],
        )
        producer.close()


def _run(spark: Any, path: str, out: str, checkpoint: str, **options: Any) -> Any:
    reader = spark.readStream.format("pylog").option("subscribe", "s")
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (
        reader.load(path)
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    return query


def test_stream_restarts_from_checkpoint(spark: Any, tmp_path: Any) -> None:
    path, out, checkpoint = str(tmp_path / "log"), str(tmp_path / "out"), str(tmp_path / "ck")
    with pylog.open(path) as log:
        log.create_topic("s", partitions=2)
    _produce(path, "s", 0, 120)
    query = _run(spark, path, out, checkpoint, startingOffsets="earliest", maxOffsetsPerTrigger=50)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 120 and max(sizes) <= 50 and len(sizes) >= 3

    _produce(path, "s", 120, 30)
    with pylog.open(path) as log:
        log.create_partitions("s", 3)
    _produce(path, "s", 150, 30)
    _run(spark, path, out, checkpoint)

    got = sorted(
        (r.topic, r.partition, r.offset, bytes(r.key), bytes(r.value))
        for r in spark.read.parquet(out).collect()
    )
    want = sorted((r[2], r[3], r[4], r[0], r[1]) for r in expected(path, ("s",)))
    assert got == want
    assert {r[1] for r in got} == {0, 1, 2}


def test_write_round_trip(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "log")
    with pylog.open(path) as log:
        log.create_topic("w", partitions=3)
        log.create_topic("x", partitions=1)
    rows = [
        (f"k{i}".encode() if i % 4 else None, f"v{i}".encode(), i % 3 if i % 5 == 0 else None)
        for i in range(200)
    ]
    df = spark.createDataFrame(rows, "key binary, value binary, partition int").repartition(2)
    df.write.format("pylog").option("topic", "w").option("acks", "all").mode("append").save(path)

    with_headers = spark.createDataFrame(
        [("a", "x", [("h", b"1")]), ("b", "x", None), ("c", "x", [])],
        "value string, topic string, headers array<struct<key:string,value:binary>>",
    )
    with_headers.write.format("pylog").mode("append").save(path)

    got_w = expected(path, ("w",))
    assert sorted(((r[0], r[1]) for r in got_w), key=repr) == sorted(((k, v) for k, v, _ in rows), key=repr)
    for _, v, p in rows:
        if p is not None:
            assert any(r[1] == v and r[3] == p for r in got_w)
    got_x = expected(path, ("x",))
    assert sorted(((r[1], r[7]) for r in got_x), key=repr) == sorted(
        [(b"a", [("h", b"1")]), (b"b", []), (b"c", [])], key=repr
    )

    back = spark.read.format("pylog").option("subscribe", "w").load(path)
    assert back.count() == 200


def test_write_errors(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "log")
    with pylog.open(path) as log:
        log.create_topic("w")
    df = spark.createDataFrame([(b"k",)], "key binary")
    with pytest.raises(Exception, match="needs a 'value' column"):
        df.write.format("pylog").option("topic", "w").option("acks", "all").mode("append").save(path)
    df = spark.createDataFrame([(b"v",)], "value binary")
    with pytest.raises(Exception, match="unknown topic 'nope'"):
        df.write.format("pylog").option("topic", "nope").mode("append").save(path)
    with pytest.raises(Exception, match="does not exist"):
        df.write.format("pylog").option("topic", "w").mode("append").save(os.path.join(path, "missing"))
    with pytest.raises(Exception, match="acks must be"):
        df.write.format("pylog").option("topic", "w").option("acks", "2").mode("append").save(path)
    with pytest.raises(Exception, match="only be appended"):
        df.write.format("pylog").option("topic", "w").mode("overwrite").save(path)
