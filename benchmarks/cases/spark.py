"""Spark cases (suite ``spark``): count and sum over the same records stored three ways.

The records are written once, untimed: Parquet (pyarrow), JSON lines, and a pylog topic, each split in two
(two files, or two partitions) so that ``local[2]`` reads them in parallel. Each case starts its own
``local[2]`` SparkSession (untimed), runs the query once to warm the JVM (untimed, reported as
``warmup_seconds``), then times the same query three times and reports the median: ``count()`` and
``sum(offset), sum(length(value))``. Each repetition plans the read again (``spark.read...`` included).
"""

from __future__ import annotations

import base64
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.cases import Compare, case
from benchmarks.cases.workload import VALUE_SIZE, arrays, byte_lists, result, settle, skipped

__all__: list[str] = []

_FSYNC = "n/a (read)"
_SCHEMA = "key binary, value binary, offset long"
_PARTS = 2
_REPEATS = 3


@contextmanager
def _session(workdir: Path) -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(f"local[{_PARTS}]")
        .appName("pylog-benchmarks")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(_PARTS))
        .config("spark.driver.memory", "4g")
        .config("spark.sql.warehouse.dir", str(workdir / "warehouse"))
        .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={workdir}")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()


def _query(df: Any) -> tuple[int, int, int]:
    from pyspark.sql import functions as F

    n = df.count()
    row = df.agg(F.sum("offset").alias("offsets"), F.sum(F.length("value")).alias("bytes")).collect()[0]
    return n, int(row["offsets"]), int(row["bytes"])


def _measure(records: int, workdir: Path, load: Callable[[Any], Any]) -> dict[str, Any]:
    if importlib.util.find_spec("pyspark") is None:
        return skipped("pyspark is not installed (pip install 'pylog[spark]')")
    settle([workdir])
    with _session(workdir) as spark:
        t0 = time.perf_counter()
        _query(load(spark))
        warmup = time.perf_counter() - t0
        timings = []
        for _ in range(_REPEATS):
            t0 = time.perf_counter()
            n, _, value_bytes = _query(load(spark))
            timings.append(time.perf_counter() - t0)
            if n != records or value_bytes != records * VALUE_SIZE:
                raise RuntimeError(f"query saw {n} records and {value_bytes} value bytes, expected {records}")
        version = spark.version
    return result(
        records,
        statistics.median(timings),
        warmup_seconds=round(warmup, 3),
        query_seconds=[round(t, 3) for t in timings],
        spark=version,
    )


def _halves(records: int) -> list[tuple[int, int]]:
    cut = records // _PARTS
    return [(0, cut), (cut, records)]


@case(
    "spark_parquet_count_sum",
    suite="spark",
    group="spark",
    kind="peer",
    fsync=_FSYNC,
    description="`spark.read.parquet` (2 files written by pyarrow): count + sum(offset) + sum(length(value))",
    timeout_s=900,
)
def spark_parquet_count_sum(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    keys, values = byte_lists(records, seed)
    out = workdir / "parquet"
    out.mkdir()
    for i, (lo, hi) in enumerate(_halves(records)):
        table = pa.table(
            {
                "key": pa.array(keys[lo:hi], pa.binary()),
                "value": pa.array(values[lo:hi], pa.binary()),
                "offset": pa.array(np.arange(lo, hi, dtype=np.int64)),
            }
        )
        pq.write_table(table, out / f"part-{i}.parquet")
    del keys, values
    return _measure(records, workdir, lambda spark: spark.read.parquet(str(out)))


@case(
    "spark_json_count_sum",
    suite="spark",
    group="spark",
    kind="peer",
    fsync=_FSYNC,
    description="`spark.read.json` with a schema (2 JSON-lines files, base64 binary): the same query",
    timeout_s=900,
)
def spark_json_count_sum(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    keys, values = byte_lists(records, seed)
    out = workdir / "json"
    out.mkdir()
    b64 = base64.b64encode
    for i, (lo, hi) in enumerate(_halves(records)):
        with open(out / f"part-{i}.json", "w") as f:
            for off in range(lo, hi):
                key, value = b64(keys[off]).decode(), b64(values[off]).decode()
                f.write(f'{{"key":"{key}","value":"{value}","offset":{off}}}\n')
    del keys, values
    return _measure(records, workdir, lambda spark: spark.read.schema(_SCHEMA).json(str(out)))


@case(
    "spark_pylog_count_sum",
    suite="spark",
    group="spark",
    kind="pylog",
    fsync=_FSYNC,
    description='`spark.read.format("pylog")` of a 2-partition topic: the same query',
    compare=(Compare("spark_parquet_count_sum"), Compare("spark_json_count_sum")),
    timeout_s=900,
)
def spark_pylog_count_sum(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    import pylog

    keys, values = arrays(records, seed)
    path = str(workdir / "log")
    with pylog.open(path) as log:
        log.create_topic("bench", partitions=_PARTS)
        producer = log.producer(acks=1, value_serializer=None)
        for p, (lo, hi) in enumerate(_halves(records)):
            producer.send_batch("bench", keys=keys[lo:hi], values=values[lo:hi], partition=p)
        producer.close()
    del keys, values

    def load(spark: Any) -> Any:
        from pylog.spark import register

        register(spark)
        return spark.read.format("pylog").option("subscribe", "bench").load(path)

    return _measure(records, workdir, load)


@case(
    "spark_pylog_plan_1000_partitions",
    suite="spark",
    group="spark",
    kind="pylog",
    fsync=_FSYNC,
    description=(
        '`spark.read.format("pylog").load(...).rdd.getNumPartitions()` on a topic of 1,000 partitions '
        "(10 records each): the time to plan a query; rec/s = partitions planned per second"
    ),
    timeout_s=900,
)
def spark_pylog_plan_1000_partitions(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    if importlib.util.find_spec("pyspark") is None:
        return skipped("pyspark is not installed (pip install 'pylog[spark]')")
    import pylog

    partitions = 1000
    path = str(workdir / "log")
    with pylog.open(path) as log:
        log.create_topic("wide", partitions=partitions)
        producer = log.producer(acks=1, value_serializer=None)
        for p in range(partitions):
            producer.send_batch("wide", values=[b"v%d" % i for i in range(10)], partition=p)
        producer.close()
    with _session(workdir) as spark:
        from pylog.spark import register

        register(spark)
        spark.read.format("pylog").option("subscribe", "wide").load(path).rdd.getNumPartitions()  # warm-up
        timings = []
        for _ in range(_REPEATS):
            t0 = time.perf_counter()
            splits = spark.read.format("pylog").option("subscribe", "wide").load(path).rdd.getNumPartitions()
            timings.append(time.perf_counter() - t0)
    return result(
        partitions, statistics.median(timings), 0, splits=splits, plan_seconds=[round(t, 3) for t in timings]
    )
