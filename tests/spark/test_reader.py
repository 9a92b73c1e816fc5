from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from spark_helpers import BASE_TS, HAS_JAVAC, expected, make_log, rows, strip_headers

import pylog

pytestmark = pytest.mark.spark


@pytest.fixture(autouse=True, params=["python", "jvm"])
def reader_path(request: pytest.FixtureRequest, spark: Any) -> Iterator[str]:
    """Every test here runs on both read paths: the Python data source alone, and with pylog's JVM reader
    (which takes the reads it supports; the others stay on the Python path)."""
    from pylog.spark import jvm

    if request.param == "jvm" and not HAS_JAVAC:
        pytest.skip("pylog's JVM reader is built with javac (a JDK): none on PATH or in JAVA_HOME")
    spark.conf.set(jvm.ENABLED, "true" if request.param == "jvm" else "false")
    yield request.param
    spark.conf.set(jvm.ENABLED, "true")


@pytest.fixture(scope="module")
def random_log(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("spark-read") / "log")
    make_log(path, seed=7)
    return path


def read(spark: Any, path: str, **options: Any) -> Any:
    reader = spark.read.format("pylog")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(path)


def test_schema_is_kafkas(spark: Any, random_log: str) -> None:
    df = read(spark, random_log, subscribe="a")
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>"
    )
    df = read(spark, random_log, subscribe="a", includeHeaders="true")
    assert df.schema.simpleString().endswith(",headers:array<struct<key:string,value:binary>>>")


@pytest.mark.parametrize("seed", [1, 2])
def test_equals_pylog_consumer(spark: Any, tmp_path: Any, seed: int) -> None:
    path = str(tmp_path / "log")
    make_log(path, seed=seed, records=400 + 100 * seed)
    assert len(os.listdir(os.path.join(path, "a-0"))) > 6  # rolled into several segments
    if seed == 2:  # retention deleted the oldest segments: every partition of a starts past offset 0
        with pylog.open(path) as log:
            log.alter_topic("a", retention_bytes=4000, retention_ms=-1)
            assert log.topic("a").apply_retention() > 0
            assert all(log.topic("a").partition(p).log_start_offset > 0 for p in range(3))
    df = read(spark, path, subscribe="a,b", includeHeaders="true")
    assert df.rdd.getNumPartitions() == 1  # four small topic partitions share one Spark partition
    assert rows(df) == expected(path)


def test_without_headers_and_by_pattern_and_assign(spark: Any, random_log: str) -> None:
    want = strip_headers(expected(random_log))
    assert rows(read(spark, random_log, subscribePattern="[ab]")) == want
    got = rows(read(spark, random_log, assign=json.dumps({"a": [0, 2]})))
    assert got == [r for r in want if r[2] == "a" and r[3] in (0, 2)]


def test_offsets_options(spark: Any, random_log: str) -> None:
    want = strip_headers(expected(random_log, ("a",)))
    start = {"a": {"0": 5, "1": -2}}
    end = {"a": {"0": 20, "2": 3}}
    got = rows(
        read(
            spark, random_log, subscribe="a", startingOffsets=json.dumps(start), endingOffsets=json.dumps(end)
        )
    )
    assert got == [r for r in want if (r[3] == 0 and 5 <= r[4] < 20) or r[3] == 1 or (r[3] == 2 and r[4] < 3)]
    assert rows(read(spark, random_log, subscribe="a", endingOffsets="latest")) == want


def test_timestamp_options(spark: Any, random_log: str) -> None:
    want = strip_headers(expected(random_log))
    lo, hi = BASE_TS + 1000, BASE_TS + 3000
    got = rows(read(spark, random_log, subscribe="a,b", startingTimestamp=lo, endingTimestamp=hi))
    assert got == [r for r in want if lo <= r[5] < hi]
    by_part = json.dumps({"b": {"0": lo}})
    got = rows(read(spark, random_log, subscribe="b", startingOffsetsByTimestamp=by_part))
    assert got == [r for r in want if r[2] == "b" and r[5] >= lo]
    got = rows(read(spark, random_log, subscribe="b", endingOffsetsByTimestamp=json.dumps({"b": {"0": hi}})))
    assert got == [r for r in want if r[2] == "b" and r[5] < hi]
    with pytest.raises(Exception, match="no record at or after timestamp"):
        read(spark, random_log, subscribe="b", startingTimestamp=BASE_TS * 2).collect()
    df = read(
        spark,
        random_log,
        subscribe="b",
        startingTimestamp=BASE_TS * 2,
        startingOffsetsByTimestampStrategy="latest",
    )
    assert df.count() == 0


def test_columns_option_and_user_schema_build_only_those_columns(spark: Any, random_log: str) -> None:
    want = [(r[4], r[3], r[2]) for r in expected(random_log)]
    df = read(spark, random_log, subscribe="a,b", columns="offset, PARTITION,topic")
    assert df.columns == ["offset", "partition", "topic"]
    assert sorted(tuple(r) for r in df.collect()) == sorted(want)
    df = spark.read.format("pylog").schema("offset long").option("subscribe", "a,b").load(random_log)
    assert df.count() == len(want)
    assert df.agg({"offset": "sum"}).collect()[0][0] == sum(r[0] for r in want)
    df = read(spark, random_log, subscribe="b", columns="headers,key")
    assert [f.dataType.simpleString() for f in df.schema] == [
        "array<struct<key:string,value:binary>>",
        "binary",
    ]
    with pytest.raises(Exception, match="option columns must name some of"):
        read(spark, random_log, subscribe="a", columns="offset,nope")


def test_min_partitions_splits_proportionally(spark: Any, random_log: str) -> None:
    df = read(spark, random_log, subscribe="a,b", minPartitions=10)
    assert df.rdd.getNumPartitions() >= 10
    assert rows(df) == strip_headers(expected(random_log))


def test_msgpack_values_to_columns(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "log")
    with pylog.open(path) as log:
        log.create_topic("clicks", partitions=2)
        producer = log.producer()
        for i in range(300):
            value = None if i % 50 == 7 else {"user": i, "page": f"/p{i % 7}", "extra": [1, 2]}
            producer.send("clicks", value, key=f"u{i}")
        producer.close()
    df = read(spark, path, subscribe="clicks", valueFormat="msgpack", valueSchema="user long, page string")
    assert df.columns[-2:] == ["user", "page"]
    got = sorted(((r.user, r.page) for r in df.collect()), key=repr)
    want = sorted(((None, None) if i % 50 == 7 else (i, f"/p{i % 7}") for i in range(300)), key=repr)
    assert got == want
    df = (
        spark.read.format("pylog")
        .schema("offset long, user long, missing string")
        .option("subscribe", "clicks")
        .option("valueFormat", "msgpack")
        .load(path)
    )
    assert sorted(r.user for r in df.collect() if r.user is not None) == [
        i for i in range(300) if i % 50 != 7
    ]
    assert {r.missing for r in df.collect()} == {None}


def test_filter_pushdown_gives_exact_results(spark: Any, random_log: str) -> None:
    from pyspark.sql import functions as F

    want = strip_headers(expected(random_log))
    df = read(spark, random_log, subscribe="a,b")
    ts_lo = BASE_TS + 2000
    got = rows(
        df.where((F.col("partition") == 1) & (F.col("offset") >= 10) & (F.col("offset") < 40))
        .where(F.col("timestamp") >= F.timestamp_millis(F.lit(ts_lo)))
        .where(F.col("topic") == "a")
    )
    assert got == [r for r in want if r[2] == "a" and r[3] == 1 and 10 <= r[4] < 40 and r[5] >= ts_lo]
    got = rows(df.where(F.col("offset").isin(3, 7, 1000) & (F.col("key").isNotNull())))
    assert got == [r for r in want if r[4] in (3, 7) and r[0] is not None]


def test_errors_are_readable(spark: Any, random_log: str, tmp_path: Any) -> None:
    with pytest.raises(Exception, match="unknown topic 'nope'"):
        read(spark, random_log, subscribe="nope").collect()
    with pytest.raises(Exception, match="does not exist"):
        read(spark, str(tmp_path / "missing"), subscribe="a")
    with pytest.raises(Exception, match="exactly one of"):
        read(spark, random_log, subscribe="a", assign='{"a": [0]}')
    with pytest.raises(Exception, match="outside the log"):
        read(spark, random_log, subscribe="a", startingOffsets='{"a": {"0": 100000}}').collect()
    with pytest.raises(Exception, match="cannot be latest"):
        read(spark, random_log, subscribe="a", startingOffsets="latest").collect()


def test_corrupt_batch_names_file_and_position(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "log")
    make_log(path, seed=3, records=200)
    seg = os.path.join(path, "b-0", "00000000000000000000.log")
    with open(seg, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(Exception, match=r"corrupt batch in .*00000000000000000000\.log at position 0"):
        read(spark, path, subscribe="b").collect()


def test_timestamp_filter_skips_segments_and_batches_unread(spark: Any, tmp_path: Any) -> None:
    """Segments whose time index ends before a timestamp filter, and batches whose header's timestamp span
    misses it, are never decoded: damage inside them does not fail the filtered read (it fails the full one)."""
    import struct

    from pyspark.sql import functions as F

    path = str(tmp_path / "log")
    with pylog.open(path, segment_bytes=1024) as log:
        log.create_topic("t", partitions=1)
        producer = log.producer(value_serializer=None)
        for i in range(300):
            producer.send("t", b"v%d" % i, key=b"k", timestamp_ms=BASE_TS + 10 * i)
            if i % 10 == 9:
                producer.flush()
        producer.close()
    want = strip_headers(expected(path, ("t",)))
    pdir = os.path.join(path, "t-0")
    segs = sorted(f for f in os.listdir(pdir) if f.endswith(".log"))
    assert len(segs) > 4
    first_next = int(segs[1][:-4])
    first_max_ts = max(r[5] for r in want if r[4] < first_next)
    with open(os.path.join(pdir, segs[0]), "r+b") as f:
        f.seek(16)
        f.write(b"\x7f")  # the first batch's magic: the segment cannot even be walked
    with open(os.path.join(pdir, segs[-1]), "r+b") as f:
        data = f.read()
        pos = 0
        while pos + struct.unpack_from("<i", data, pos + 8)[0] < len(data):
            pos += struct.unpack_from("<i", data, pos + 8)[0]
        last_base_ts = struct.unpack_from("<q", data, pos + 24)[0]
        f.seek(pos + 64 + 8)
        f.write(bytes([data[pos + 64 + 8] ^ 0xFF]))  # the last batch's payload: its CRC fails
    with pytest.raises(Exception, match=r"t-0.00000000000000000000\.log.*format version 127"):
        read(spark, path, subscribe="t").collect()
    with pytest.raises(Exception, match=rf"corrupt batch in .*{segs[-1]} at position {pos}"):
        read(spark, path, subscribe="t").where(F.col("offset") >= first_next).collect()
    df = read(spark, path, subscribe="t").where(
        (F.col("timestamp") > F.timestamp_millis(F.lit(first_max_ts)))
        & (F.col("timestamp") < F.timestamp_millis(F.lit(last_base_ts)))
    )
    got = rows(df)
    assert got == [r for r in want if first_max_ts < r[5] < last_base_ts]
    assert len(got) > 100


def test_pushdown_setting_off_and_on(spark: Any, random_log: str, reader_path: str) -> None:
    from pyspark.sql import functions as F

    want = [r for r in strip_headers(expected(random_log, ("b",))) if r[4] >= 50]
    key = "spark.sql.python.filterPushdown.enabled"
    try:
        spark.conf.set(key, "false")
        df = read(spark, random_log, subscribe="b").where(F.col("offset") >= 50)
        assert rows(df) == want
        assert ">= 50" in df._jdf.queryExecution().executedPlan().toString()
    finally:
        spark.conf.set(key, "true")
    df = read(spark, random_log, subscribe="b").where(F.col("offset") >= 50)
    assert rows(df) == want
    plan = df._jdf.queryExecution().executedPlan().toString()
    # handled by the Python source; the JVM reader narrows the same ranges and leaves the filter to Spark
    assert (">= 50" in plan) == (reader_path == "jvm")
