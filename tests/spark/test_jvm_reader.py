"""pylog's JVM reader (:mod:`pylog.spark.jvm`): which reads it takes, column pruning, compressed batches,
data loss after planning, and equivalence with pylog's own consumer over random logs."""

from __future__ import annotations

import os
import random
import re
from collections import Counter
from typing import Any

import pytest
from spark_helpers import BASE_TS, expected, make_log, needs_javac, rows, strip_headers

import pylog
from pylog.spark import jvm

pytestmark = [pytest.mark.spark, needs_javac]


def read(spark: Any, path: str, **options: Any) -> Any:
    reader = spark.read.format("pylog")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(path)


def plan(df: Any) -> str:
    return str(df._jdf.queryExecution().executedPlan().toString())


@pytest.fixture(scope="module")
def small_log(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("jvm-read") / "log")
    make_log(path, seed=11)
    return path


def test_takes_batch_reads_of_kafka_columns_and_prunes_them(spark: Any, small_log: str) -> None:
    df = read(spark, small_log, subscribe="a,b")
    assert "JVM reader" in plan(df)
    narrow = df.select("offset", "partition")
    assert re.search(r"BatchScan pylog\[partition#\d+, offset#\d+L\] \(JVM reader\)", plan(narrow))
    want = sorted((r[4], r[3]) for r in expected(small_log))
    assert sorted(tuple(r) for r in narrow.collect()) == want
    assert df.count() == len(want)  # no column at all: only row counts cross into Spark


def test_headers_are_read_in_the_jvm_too(spark: Any, small_log: str) -> None:
    with_headers = read(spark, small_log, subscribe="a,b", includeHeaders="true")
    assert "JVM reader" in plan(with_headers)
    want = expected(small_log)
    assert any(r[7] for r in want) and any(v is None for r in want for _, v in r[7])
    assert rows(with_headers) == want
    only = with_headers.select("offset", "headers")  # records without headers: null, as Spark's Kafka source
    assert sum(r.headers is None for r in only.collect()) == sum(not r[7] for r in want)


def test_leaves_other_reads_on_the_python_path(spark: Any, tmp_path: Any, small_log: str) -> None:
    path = str(tmp_path / "log")
    with pylog.open(path) as log:
        log.create_topic("m", partitions=1)
        producer = log.producer()
        for i in range(50):
            producer.send("m", {"n": i, "xs": [i, i + 1]})
        producer.close()
    nested = read(spark, path, subscribe="m", valueFormat="msgpack", valueSchema="n long, xs array<long>")
    assert "JVM reader" not in plan(nested)  # a value column of a nested type
    assert sorted((r.n, tuple(r.xs)) for r in nested.collect()) == [(i, (i, i + 1)) for i in range(50)]
    try:
        spark.conf.set(jvm.ENABLED, "false")
        assert "JVM reader" not in plan(read(spark, small_log, subscribe="a"))
    finally:
        spark.conf.set(jvm.ENABLED, "true")


def _random_value(rng: random.Random, i: int) -> Any:
    """A msgpack map with the schema's keys (some missing, some None), keys that are no column, nested data."""
    value: dict[Any, Any] = {}
    pool: dict[str, Any] = {
        "l": rng.choice([rng.randint(-(2**63), 2**63 - 1), rng.randint(-5, 300), 1.0 * rng.randint(-9, 9)]),
        "i": rng.randint(-(2**31), 2**31 - 1),
        "s": rng.randint(-(2**15), 2**15 - 1),
        "b": rng.randint(-128, 127),
        "d": rng.choice([rng.random() * 1e300, rng.randint(-(2**40), 2**40), True]),
        "f": rng.choice([1.5, -0.25, rng.randint(-1000, 1000)]),
        "str": rng.choice(["", "héllo", "x" * rng.randint(0, 300), b"raw"]),
        "bin": rng.choice([b"", rng.randbytes(rng.randint(0, 70)), "text"]),
        "ok": rng.choice([True, False]),
    }
    for k, v in pool.items():
        r = rng.random()
        if r < 0.15:
            continue
        value[k] = None if r < 0.25 else v
    value["other"] = {"nested": [1, {"deep": [None, 2.5, b"z"]}], "n": i}
    if rng.random() < 0.2:
        value[7] = "an int key is no column"
    return value


def test_msgpack_values_equal_the_python_path(spark: Any, tmp_path: Any) -> None:
    rng = random.Random(5)
    path = str(tmp_path / "log")
    with pylog.open(path, segment_bytes=8192) as log:
        log.create_topic("v", partitions=2)
        producer = log.producer(compression_type="zstd")
        for i in range(600):
            value = None if i % 37 == 0 else _random_value(rng, i)
            producer.send("v", value, key=b"k%d" % i)
        producer.close()
    schema = (
        "l long, i int, s short, b byte, d double, f float, str string, bin binary, ok boolean, absent long"
    )

    def collect() -> list[tuple[Any, ...]]:
        df = read(spark, path, subscribe="v", valueFormat="msgpack", valueSchema=schema)
        cols = ["partition", "offset", *(f.split()[0] for f in schema.split(", "))]
        return sorted(
            tuple(bytes(v) if isinstance(v, bytearray) else v for v in r) for r in df.select(*cols).collect()
        )

    assert "JVM reader" in plan(read(spark, path, subscribe="v", valueFormat="msgpack", valueSchema=schema))
    native = collect()
    try:
        spark.conf.set(jvm.ENABLED, "false")
        python = collect()
    finally:
        spark.conf.set(jvm.ENABLED, "true")
    assert len(native) == 600
    assert native == python
    assert sum(r[2] is None for r in native) > 50  # tombstones and missing/None keys gave nulls


def test_msgpack_value_of_the_wrong_type_is_an_error_on_both_paths(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "log")
    with pylog.open(path) as log:
        log.create_topic("w", partitions=1)
        producer = log.producer()
        for i in range(20):
            producer.send("w", {"n": "seven" if i == 13 else i})
        producer.close()
    for enabled in ("true", "false"):
        try:
            spark.conf.set(jvm.ENABLED, enabled)
            df = read(spark, path, subscribe="w", valueFormat="msgpack", valueSchema="n long")
            with pytest.raises(
                Exception, match=r"DeserializationError: msgpack values do not fit the schema"
            ):
                df.collect()
        finally:
            spark.conf.set(jvm.ENABLED, "true")


@pytest.mark.parametrize("compression", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches(spark: Any, tmp_path: Any, compression: str) -> None:
    path = str(tmp_path / "log")
    rng = random.Random(compression)
    with pylog.open(path, segment_bytes=4096) as log:
        log.create_topic("c", partitions=2)
        producer = log.producer(value_serializer=None, compression_type=compression, batch_size=2000)
        for i in range(500):
            key = None if i % 7 == 0 else rng.randbytes(rng.randint(0, 9))
            value = None if key is not None and i % 11 == 0 else bytes(rng.randint(0, 60))  # compressible
            producer.send("c", value, key=key, timestamp_ms=BASE_TS + i)
        producer.close()
    df = read(spark, path, subscribe="c")
    assert "JVM reader" in plan(df)
    assert rows(df) == strip_headers(expected(path, ("c",)))


@pytest.mark.parametrize("native", ["true", "false"])
def test_data_loss_after_planning(spark: Any, tmp_path: Any, native: str) -> None:
    """Both paths fail with pylog's OffsetOutOfRangeError, named in the driver's error as the class."""
    path = str(tmp_path / "log")
    make_log(path, seed=5, records=500)
    spark.conf.set(jvm.ENABLED, native)
    try:
        strict = read(spark, path, subscribe="b")
        lenient = read(spark, path, subscribe="b", failOnDataLoss="false")
        before = strict.collect()  # plans both offset ranges now; the DataFrame keeps its plan
        assert ("JVM reader" in plan(strict)) == (native == "true")
        assert len(lenient.collect()) == len(before)
        with pylog.open(path) as log:
            log.alter_topic("b", retention_bytes=3000, retention_ms=-1)
            assert log.topic("b").apply_retention() > 0
            start = log.topic("b").partition(0).log_start_offset
        with pytest.raises(Exception) as info:
            strict.collect()
        loss = (
            r"pylog\.errors\.OffsetOutOfRangeError: data loss reading b-0 offsets \[0, \d+\): offsets 0\.\."
        )
        assert re.search(loss, str(info.value)), str(info.value)[:2000]
        assert sorted(r.offset for r in lenient.collect()) == [r.offset for r in before if r.offset >= start]
    finally:
        spark.conf.set(jvm.ENABLED, "true")


def test_corrupt_value_byte_names_file_and_position(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "log")
    make_log(path, seed=9, records=200)
    part = os.path.join(path, "a-1")
    name = min(
        n for n in os.listdir(part) if n.endswith(".log") and os.path.getsize(os.path.join(part, n)) > 100
    )
    seg = os.path.join(part, name)
    with open(seg, "r+b") as f:
        f.seek(80)  # inside the first batch's payload
        byte = f.read(1)
        f.seek(80)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(
        Exception, match=rf"CorruptRecordError: corrupt batch in .*a-1/{name} at position 0 .*CRC"
    ):
        read(spark, path, subscribe="a").select("offset").collect()


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_equals_pylog_consumer_over_random_logs_and_plans(spark: Any, tmp_path: Any, seed: int) -> None:
    rng = random.Random(seed)
    path = str(tmp_path / "log")
    make_log(path, seed=seed, records=rng.randint(200, 700))
    if rng.random() < 0.7:  # retention: partitions start past offset 0
        with pylog.open(path) as log:
            log.alter_topic("a", retention_bytes=rng.choice([3000, 6000]), retention_ms=-1)
            log.topic("a").apply_retention()
    with_headers = expected(path)
    want = strip_headers(with_headers)
    options: dict[str, Any] = {"subscribe": "a,b", "minPartitions": rng.choice([1, 3, 8])}
    df = read(spark, path, **options)
    assert "JVM reader" in plan(df)
    assert rows(df) == want
    assert rows(read(spark, path, includeHeaders="true", **options)) == with_headers
    lo = rng.randint(0, 20)
    got = rows(read(spark, path, subscribe="a,b", startingOffsets=f'{{"a": {{"0": {lo}, "1": -2}}}}'))
    assert got == [r for r in want if not (r[2] == "a" and r[3] == 0 and r[4] < lo)]
    cols = rng.sample(["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"], 3)
    narrow = read(spark, path, subscribe="a,b").selectExpr(
        *("unix_millis(timestamp) AS timestamp" if c == "timestamp" else c for c in cols)
    )
    index = {
        "key": 0,
        "value": 1,
        "topic": 2,
        "partition": 3,
        "offset": 4,
        "timestamp": 5,
        "timestampType": 6,
    }
    got_narrow = Counter(
        tuple(bytes(v) if isinstance(v, bytearray) else v for v in r) for r in narrow.collect()
    )
    assert got_narrow == Counter(tuple(r[index[c]] for c in cols) for r in want)
