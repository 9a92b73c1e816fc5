"""Spark cases (suite ``spark``): count and sum over the same records stored three ways, and planning.

The records are written once, untimed: Parquet (pyarrow), JSON lines, and a pylog topic, each split in two
(two files, or two partitions) so that ``local[2]`` reads them in parallel. Each case starts its own
``local[2]`` SparkSession (untimed), runs the query once to warm the JVM (untimed, reported as
``warmup_seconds``), then times the same query three times and reports the median. Each repetition plans the
read again (``spark.read...`` included). Two queries:

- ``*_count_sum``: ``count()``, then ``sum(offset), sum(length(value))`` (needs the values);
- ``*_count_offset``: ``count()``, then ``sum(offset)``. Spark prunes Parquet's columns by itself but gives a
  Python data source no column pruning, so ``spark_pylog_count_offset`` names the one column it needs with
  the ``columns`` option, and ``spark_pylog_count_offset_all_columns`` shows the same query without it.

The ``spark_pylog_jvm_*`` cases run the same queries with pylog's JVM reader installed
(:mod:`pylog.spark.jvm`): planned by the Python data source, read into Spark's column vectors by the executor
JVM, with Spark's own column pruning (no ``columns`` option needed).

``spark_python_source_floor_count_sum`` runs the ``count_sum`` query over a Python data source that reads
nothing: it yields slices of one prebuilt Arrow batch of the Kafka row schema. Spark's side of a Python data
source (the Arrow stream from the worker, then one row per record of every column: Spark gives a Python
source no column pruning) is the same as for pylog's Python path, so this is the floor that path can reach;
``spark_pylog_count_sum`` is compared with it.

The ``*_typed_sum`` / ``*_msgpack_sum`` cases store other records: a user id, an amount and a page path,
as typed Parquet columns and as msgpack maps in a pylog topic read with ``valueFormat=msgpack``; the query
sums the three decoded columns.

``spark_pylog_remote_count_sum`` runs the ``count_sum`` query over the same records tiered to a ``file://``
object store (16 MiB segments, the log directory deleted), read by its URL on the Python path
(:mod:`pylog.spark.remote`); parquet is its baseline (Spark here has no S3 file system to read parquet from an
S3 store). Each Python worker keeps a 64 MiB block cache of the store across queries: with partitions smaller
than that, the repetitions after the warm-up read from it. ``spark_pylog_remote_jvm_count_sum`` reads the same
store with pylog's JVM reader (the executor JVM reads the pinned segment objects as files).

``spark_pylog_plan_1000_partitions`` reads a topic of 1,000 small partitions: the time to plan the read
(``load`` and ``rdd.getNumPartitions()``) and to count it.
"""

from __future__ import annotations

import base64
import importlib.util
import itertools
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.cases import Compare, Goal, case
from benchmarks.cases.workload import VALUE_SIZE, arrays, byte_lists, result, settle, skipped

__all__: list[str] = []

_FSYNC = "n/a (read)"
_SCHEMA = "key binary, value binary, offset long"
_PARTS = 2
_REPEATS = 3


@contextmanager
def _session(workdir: Path, jvm: bool = False) -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(f"local[{_PARTS}]")
        .appName("pylog-benchmarks")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(_PARTS))
        .config("spark.driver.memory", "4g")
        .config("spark.sql.warehouse.dir", str(workdir / "warehouse"))
        .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={workdir}")
    )
    if jvm:
        from pylog.spark import jvm as pylog_jvm

        builder = pylog_jvm.configure(builder)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()


def _count_sum(df: Any, records: int) -> None:
    from pyspark.sql import functions as F

    n = df.count()
    row = df.agg(F.sum("offset").alias("offsets"), F.sum(F.length("value")).alias("bytes")).collect()[0]
    value_bytes = int(row["bytes"])
    if n != records or value_bytes != records * VALUE_SIZE:
        raise RuntimeError(f"query saw {n} records and {value_bytes} value bytes, expected {records}")


def _count_offset(df: Any, records: int) -> None:
    from pyspark.sql import functions as F

    n = df.count()
    total = df.agg(F.sum("offset")).collect()[0][0]
    if n != records or total is None:
        raise RuntimeError(f"query saw {n} records, expected {records}")


Query = Callable[[Any, int], None]


def _timed(spark: Any, records: int, load: Callable[[Any], Any], query: Query) -> tuple[float, list[float]]:
    """(untimed warm-up seconds, timed repetitions) of ``query`` over a fresh ``load`` each time."""
    t0 = time.perf_counter()
    query(load(spark), records)
    warmup = time.perf_counter() - t0
    timings = []
    for _ in range(_REPEATS):
        t0 = time.perf_counter()
        query(load(spark), records)
        timings.append(time.perf_counter() - t0)
    return warmup, timings


def _measure(
    records: int, workdir: Path, load: Callable[[Any], Any], query: Query = _count_sum, jvm: bool = False
) -> dict[str, Any]:
    if importlib.util.find_spec("pyspark") is None:
        return skipped("pyspark is not installed (pip install 'pylog[spark]')")
    settle([workdir])
    with _session(workdir, jvm) as spark:
        warmup, timings = _timed(spark, records, load, query)
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


def _write_parquet(records: int, seed: int, workdir: Path) -> Path:
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
    return out


def _write_pylog(records: int, seed: int, workdir: Path) -> str:
    import pylog

    keys, values = arrays(records, seed)
    path = str(workdir / "log")
    with pylog.open(path) as log:
        log.create_topic("bench", partitions=_PARTS)
        producer = log.producer(acks=1, value_serializer=None)
        for p, (lo, hi) in enumerate(_halves(records)):
            producer.send_batch("bench", keys=keys[lo:hi], values=values[lo:hi], partition=p)
        producer.close()
    return path


def _pylog_load(path: str, topic: str = "bench", **options: str) -> Callable[[Any], Any]:
    def load(spark: Any) -> Any:
        from pylog.spark import register

        register(spark)
        reader = spark.read.format("pylog").option("subscribe", topic)
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load(path)

    return load


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
    out = _write_parquet(records, seed, workdir)
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
    description='`spark.read.format("pylog")` of a 2-partition topic, Python data source only: the same query',
    compare=(
        Compare("spark_parquet_count_sum", at_least=0.5),
        Compare("spark_json_count_sum"),
        Compare("spark_python_source_floor_count_sum", at_least=0.8),
    ),
    timeout_s=900,
)
def spark_pylog_count_sum(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    path = _write_pylog(records, seed, workdir)
    return _measure(records, workdir, _pylog_load(path))


def _floor_source(records: int) -> Any:
    """A Python data source that reads nothing: each of its two partitions yields slices of one prebuilt
    Arrow batch of the Kafka row schema (16-byte keys, 100-byte values, the column types pylog gives) until
    it has given ``records / 2`` rows. What a query over it costs is the floor of any Python data source
    (Spark's side: the Arrow stream from the worker, one UnsafeRow per row for all seven columns, as there is
    no column pruning). Defined in a function, so Spark pickles the classes by value and its workers need
    not import this module."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from pylog.spark.options import KAFKA_FIELDS

    ddl = ", ".join(f"{name} {type_name}" for name, type_name in KAFKA_FIELDS)
    rows = 65_536

    class Half(InputPartition):
        def __init__(self, n: int) -> None:
            self.n = n

    def prebuilt(schema: Any) -> Any:
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        keys, values = arrays(rows, 1)
        ramp = np.arange(rows + 1, dtype=np.int32)

        def binary(data: Any, width: int) -> Any:
            buffers = [None, pa.py_buffer(ramp * width), pa.py_buffer(data.tobytes())]
            return pa.Array.from_buffers(pa.binary(), rows, buffers, null_count=0)

        columns = [
            binary(keys, keys.shape[1]),
            binary(values, values.shape[1]),
            pa.array(["floor"] * rows, pa.string()),
            pa.array(np.zeros(rows, dtype=np.int32)),
            pa.array(np.arange(rows, dtype=np.int64)),
            pa.array(np.arange(rows, dtype=np.int64) * 1000, pa.timestamp("us", tz="UTC")),
            pa.array(np.zeros(rows, dtype=np.int32)),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=to_arrow_schema(schema, timezone="UTC"))

    class Reader(DataSourceReader):
        def __init__(self, schema: Any) -> None:
            self.schema = schema

        def partitions(self) -> list[Any]:
            return [Half(records // _PARTS), Half(records - records // _PARTS)]

        def read(self, partition: Any) -> Iterator[Any]:
            rb = prebuilt(self.schema)
            left = partition.n
            while left > 0:
                take = min(left, rows)
                yield rb if take == rows else rb.slice(0, take)
                left -= take

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "pylog-bench-floor"

        def schema(self) -> str:
            return ddl

        def reader(self, schema: Any) -> Any:
            return Reader(schema)

    return FloorSource


@case(
    "spark_python_source_floor_count_sum",
    suite="spark",
    group="spark",
    kind="peer",
    fsync=_FSYNC,
    description="a Python data source that reads nothing (yields one prebuilt Arrow batch of the Kafka "
    "schema): the same query; the floor of the Python data source path",
    timeout_s=900,
)
def spark_python_source_floor_count_sum(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    if importlib.util.find_spec("pyspark") is None:
        return skipped("pyspark is not installed (pip install 'pylog[spark]')")
    source = _floor_source(records)

    def load(spark: Any) -> Any:
        spark.dataSource.register(source)
        return spark.read.format(source.name()).load()

    return _measure(records, workdir, load)


@case(
    "spark_pylog_jvm_count_sum",
    suite="spark",
    group="spark",
    kind="pylog",
    fsync=_FSYNC,
    description='`format("pylog")` with pylog\'s JVM reader installed (`pylog.spark.jvm.configure`): the same query',
    compare=(Compare("spark_parquet_count_sum", at_least=0.5), Compare("spark_json_count_sum")),
    timeout_s=900,
)
def spark_pylog_jvm_count_sum(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    path = _write_pylog(records, seed, workdir)
    return _measure(records, workdir, _pylog_load(path), jvm=True)


@case(
    "spark_parquet_count_offset",
    suite="spark",
    group="spark",
    kind="peer",
    fsync=_FSYNC,
    description="`spark.read.parquet` (2 files): count + sum(offset) (Spark reads only the offset column)",
    timeout_s=900,
)
def spark_parquet_count_offset(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    out = _write_parquet(records, seed, workdir)
    return _measure(records, workdir, lambda spark: spark.read.parquet(str(out)), _count_offset)


@case(
    "spark_pylog_count_offset",
    suite="spark",
    group="spark",
    kind="pylog",
    fsync=_FSYNC,
    description='`format("pylog")` with `columns=offset`: count + sum(offset)',
    compare=(Compare("spark_parquet_count_offset", at_least=1 / 1.5),),
    timeout_s=900,
)
def spark_pylog_count_offset(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    path = _write_pylog(records, seed, workdir)
    return _measure(records, workdir, _pylog_load(path, columns="offset"), _count_offset)


@case(
    "spark_pylog_count_offset_all_columns",
    suite="spark",
    group="spark",
    kind="pylog",
    fsync=_FSYNC,
    description='`format("pylog")` without `columns`: count + sum(offset) over rows of every Kafka column',
    compare=(Compare("spark_parquet_count_offset"),),
    timeout_s=900,
)
def spark_pylog_count_offset_all_columns(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    path = _write_pylog(records, seed, workdir)
    return _measure(records, workdir, _pylog_load(path), _count_offset)


@case(
    "spark_pylog_jvm_count_offset",
    suite="spark",
    group="spark",
    kind="pylog",
    fsync=_FSYNC,
    description='`format("pylog")` with the JVM reader, no `columns` option: count + sum(offset) (Spark prunes)',
    compare=(Compare("spark_parquet_count_offset", at_least=1 / 1.5),),
    timeout_s=900,
)
def spark_pylog_jvm_count_offset(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    path = _write_pylog(records, seed, workdir)
    return _measure(records, workdir, _pylog_load(path), _count_offset, jvm=True)


# -- msgpack values decoded into typed columns -------------------------------------------------------------

_TYPED_SCHEMA = "user long, amount double, page string"


def _typed_columns(lo: int, hi: int, seed: int) -> tuple[Any, Any, list[str]]:
    """Records ``[lo, hi)`` of the typed workload: a user id, an amount and a page path."""
    rng = np.random.default_rng([seed, lo])
    users = rng.integers(0, 1_000_000, size=hi - lo, dtype=np.int64)
    amounts = np.round(rng.random(hi - lo) * 100, 2)
    pages = [f"/page/{i % 1000}" for i in range(lo, hi)]
    return users, amounts, pages


def _typed_chunks(records: int) -> Iterator[tuple[int, int, int]]:
    """(partition, lo, hi) chunks of at most 500,000 records."""
    for p, (lo, hi) in enumerate(_halves(records)):
        for a in range(lo, hi, 500_000):
            yield p, a, min(a + 500_000, hi)


def _typed_sum(df: Any, records: int) -> None:
    from pyspark.sql import functions as F

    n = df.count()
    row = df.agg(
        F.sum("user").alias("users"), F.sum("amount").alias("amount"), F.sum(F.length("page")).alias("chars")
    ).collect()[0]
    if n != records or row["users"] is None or row["chars"] is None:
        raise RuntimeError(f"query saw {n} records, expected {records}")


def _typed_bytes(records: int) -> int:
    """What the typed columns hold: 8 + 8 bytes and the page string of each record."""
    full, rest = divmod(records, 1000)
    return 16 * records + sum(len(f"/page/{i}") * (full + (i < rest)) for i in range(1000))


def _measure_typed(
    records: int, workdir: Path, load: Callable[[Any], Any], jvm: bool = False
) -> dict[str, Any]:
    out = _measure(records, workdir, load, _typed_sum, jvm)
    if out["status"] == "ok":
        out["bytes"] = _typed_bytes(records)
    return out


@case(
    "spark_parquet_typed_sum",
    suite="spark",
    group="spark-typed",
    kind="peer",
    fsync=_FSYNC,
    description="`spark.read.parquet` of typed columns (user long, amount double, page string; 2 files): "
    "count + sum(user) + sum(amount) + sum(length(page))",
    timeout_s=900,
)
def spark_parquet_typed_sum(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = workdir / "parquet"
    out.mkdir()
    writers: dict[int, Any] = {}
    schema = pa.schema([("user", pa.int64()), ("amount", pa.float64()), ("page", pa.string())])
    for p, lo, hi in _typed_chunks(records):
        users, amounts, pages = _typed_columns(lo, hi, seed)
        if p not in writers:
            writers[p] = pq.ParquetWriter(out / f"part-{p}.parquet", schema)
        writers[p].write_table(pa.table({"user": users, "amount": amounts, "page": pages}, schema=schema))
    for w in writers.values():
        w.close()
    return _measure_typed(records, workdir, lambda spark: spark.read.parquet(str(out)))


def _write_typed_pylog(records: int, seed: int, workdir: Path) -> str:
    import msgpack

    import pylog

    path = str(workdir / "log")
    packb = msgpack.packb
    with pylog.open(path) as log:
        log.create_topic("typed", partitions=_PARTS)
        producer = log.producer(acks=1, value_serializer=None)
        for p, lo, hi in _typed_chunks(records):
            users, amounts, pages = _typed_columns(lo, hi, seed)
            values = [
                packb({"user": u, "amount": a, "page": g})
                for u, a, g in zip(users.tolist(), amounts.tolist(), pages, strict=True)
            ]
            producer.send_batch("typed", values=values, partition=p)
        producer.close()
    return path


@case(
    "spark_pylog_msgpack_sum",
    suite="spark",
    group="spark-typed",
    kind="pylog",
    fsync=_FSYNC,
    description='`format("pylog")` with `valueFormat=msgpack` (the same records as msgpack maps), Python data '
    "source only: the same query on the decoded columns",
    compare=(Compare("spark_parquet_typed_sum"),),
    timeout_s=900,
)
def spark_pylog_msgpack_sum(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    path = _write_typed_pylog(records, seed, workdir)
    load = _pylog_load(path, "typed", valueFormat="msgpack", valueSchema=_TYPED_SCHEMA)
    return _measure_typed(records, workdir, load)


@case(
    "spark_pylog_jvm_msgpack_sum",
    suite="spark",
    group="spark-typed",
    kind="pylog",
    fsync=_FSYNC,
    description="the same `valueFormat=msgpack` query with pylog's JVM reader installed",
    compare=(Compare("spark_parquet_typed_sum"), Compare("spark_pylog_msgpack_sum")),
    timeout_s=900,
)
def spark_pylog_jvm_msgpack_sum(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    path = _write_typed_pylog(records, seed, workdir)
    load = _pylog_load(path, "typed", valueFormat="msgpack", valueSchema=_TYPED_SCHEMA)
    return _measure_typed(records, workdir, load, jvm=True)


_MANY = 1_000


@case(
    "spark_pylog_plan_1000_partitions",
    suite="spark",
    group="spark",
    kind="pylog",
    fsync=_FSYNC,
    description='`format("pylog")` of a topic with 1,000 partitions (a tenth of the records): plan + count()',
    goal=Goal("plan_seconds", "<=", 1.0, "s to plan"),
    timeout_s=900,
)
def spark_pylog_plan_1000_partitions(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    """Timed per repetition: ``load(...)`` + ``rdd.getNumPartitions()`` (planning), then ``count()``."""
    if importlib.util.find_spec("pyspark") is None:
        return skipped("pyspark is not installed (pip install 'pylog[spark]')")
    import pylog

    total = max(records // 10, _MANY)
    keys, values = arrays(total, seed)
    path = str(workdir / "log")
    with pylog.open(path) as log:
        log.create_topic("many", partitions=_MANY)
        producer = log.producer(acks=1, value_serializer=None)
        bounds = np.linspace(0, total, _MANY + 1).astype(int)
        for p, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            producer.send_batch("many", keys=keys[lo:hi], values=values[lo:hi], partition=p)
        producer.close()
    del keys, values
    load = _pylog_load(path, "many")
    settle([workdir])
    with _session(workdir) as spark:
        t0 = time.perf_counter()
        load(spark).count()
        warmup = time.perf_counter() - t0
        plans, counts, splits = [], [], 0
        for _ in range(_REPEATS):
            t0 = time.perf_counter()
            df = load(spark)
            splits = df.rdd.getNumPartitions()
            t1 = time.perf_counter()
            n = df.count()
            counts.append(time.perf_counter() - t1)
            plans.append(t1 - t0)
            if n != total:
                raise RuntimeError(f"count() saw {n} records, expected {total}")
        version = spark.version
    return result(
        total,
        statistics.median(p + c for p, c in zip(plans, counts, strict=True)),
        plan_seconds=round(statistics.median(plans), 3),
        count_seconds=round(statistics.median(counts), 3),
        spark_partitions=splits,
        warmup_seconds=round(warmup, 3),
        query_seconds=[round(p + c, 3) for p, c in zip(plans, counts, strict=True)],
        spark=version,
    )


# -- streaming: readStream -> writeStream, pylog to pylog (exactly-once) against pylog to Parquet ---------------

_STREAM_BATCHES = 4  # micro-batches per run (maxOffsetsPerTrigger = records / this)


def _measure_stream(records: int, seed: int, workdir: Path, sink: str) -> dict[str, Any]:
    """Records/s of ``readStream.format("pylog")`` of a 2-partition topic -> ``writeStream`` (``sink``: pylog's
    exactly-once sink into a 2-partition topic, or Parquet files) with ``trigger(availableNow=True)``, timed from
    ``start()`` to the query's end; a first run over a small topic warms the JVM and the workers (untimed)."""
    if importlib.util.find_spec("pyspark") is None:
        return skipped("pyspark is not installed (pip install 'pylog[spark]')")
    import pylog

    path = _write_pylog(records, seed, workdir)
    with pylog.open(path) as log:
        log.create_topic("warm", partitions=_PARTS)
        for i in range(_REPEATS + 1):
            log.create_topic(f"out-{i}", partitions=_PARTS)
        producer = log.producer(acks=1, value_serializer=None)
        producer.send_batch("warm", values=[b"w%d" % i for i in range(1000)])
        producer.close()
    settle([workdir])

    def run(spark: Any, topic: str, n: int, i: int) -> float:
        stream = (
            spark.readStream.format("pylog")
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", max(1, n // _STREAM_BATCHES))
            .load(path)
            .selectExpr("key", "value")
            .writeStream.option("checkpointLocation", str(workdir / f"ck-{i}"))
            .trigger(availableNow=True)
        )
        t0 = time.perf_counter()
        if sink == "pylog":
            query = stream.format("pylog").option("topic", f"out-{i}").start(path)
        else:
            query = stream.format("parquet").start(str(workdir / f"parquet-{i}"))
        query.awaitTermination()
        elapsed = time.perf_counter() - t0
        if query.exception() is not None:
            raise RuntimeError(f"streaming query failed: {query.exception()}")
        written = sum(p["numInputRows"] for p in query.recentProgress)
        if written != n:
            raise RuntimeError(f"the query wrote {written} records, expected {n}")
        return elapsed

    with _session(workdir) as spark:
        from pylog.spark import register

        register(spark)
        warmup = run(spark, "warm", 1000, 0)
        timings = [run(spark, "bench", records, i) for i in range(1, _REPEATS + 1)]
        version = spark.version
    if sink == "pylog":
        with pylog.open(path) as log:
            for i in range(1, _REPEATS + 1):
                consumer = log.consumer(
                    f"out-{i}",
                    isolation_level="read_committed",
                    auto_offset_reset="earliest",
                    consumer_timeout_ms=0,
                    value_deserializer=None,
                )
                seen = sum(1 for _ in consumer)
                consumer.close()
                if seen != records:
                    raise RuntimeError(f"read_committed sees {seen} records in out-{i}, expected {records}")
    return result(
        records,
        statistics.median(timings),
        warmup_seconds=round(warmup, 3),
        query_seconds=[round(t, 3) for t in timings],
        micro_batches=_STREAM_BATCHES,
        spark=version,
    )


@case(
    "spark_stream_parquet_sink",
    suite="spark",
    group="spark-stream",
    kind="peer",
    fsync="Spark's file sink (no fsync)",
    description='`readStream.format("pylog")` -> `writeStream.format("parquet")`, availableNow, 4 micro-batches',
    timeout_s=900,
)
def spark_stream_parquet_sink(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _measure_stream(records, seed, workdir, "parquet")


@case(
    "spark_stream_pylog_sink",
    suite="spark",
    group="spark-stream",
    kind="pylog",
    fsync="every micro-batch (transactions: acks=all)",
    description='the same stream -> `writeStream.format("pylog")`: exactly-once, one transaction commit per batch',
    compare=(Compare("spark_stream_parquet_sink"),),
    timeout_s=900,
)
def spark_stream_pylog_sink(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _measure_stream(records, seed, workdir, "pylog")


def _write_tiered_pylog(records: int, seed: int, workdir: Path) -> str:
    """The records of ``_write_pylog``, tiered to a ``file://`` object store under ``workdir`` (16 MiB
    segments, every one sealed and uploaded), then the log directory deleted: only the store is left."""
    import shutil

    import pylog

    keys, values = arrays(records, seed)
    url = (workdir / "store" / "log").as_uri()
    path = workdir / "tiered-log"
    with pylog.open(path, remote_storage=url, remote_log_manager_task_interval_ms=-1) as log:
        log.create_topic("bench", partitions=_PARTS, segment_bytes=16 << 20, remote_storage_enable=True)
        producer = log.producer(acks=1, value_serializer=None)
        for p, (lo, hi) in enumerate(_halves(records)):
            producer.send_batch("bench", keys=keys[lo:hi], values=values[lo:hi], partition=p)
        producer.close()
        for p in range(_PARTS):
            log.topic("bench").partition(p).roll()
        log.tier()
    shutil.rmtree(path)
    return url


@case(
    "spark_pylog_remote_count_sum",
    suite="spark",
    group="spark",
    kind="pylog",
    fsync=_FSYNC,
    description=(
        '`format("pylog").load("file://...")`: the topic read from a `file://` object store it was tiered to '
        "(no log directory left; Python path, 16 MiB segments): count + sum(offset) + sum(length(value))"
    ),
    compare=(Compare("spark_parquet_count_sum", at_least=0.5), Compare("spark_pylog_count_sum")),
    timeout_s=900,
)
def spark_pylog_remote_count_sum(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    url = _write_tiered_pylog(records, seed, workdir)
    return _measure(records, workdir, _pylog_load(url))


@case(
    "spark_pylog_remote_jvm_count_sum",
    suite="spark",
    group="spark",
    kind="pylog",
    fsync=_FSYNC,
    description=(
        '`format("pylog").load("file://...")` with pylog\'s JVM reader installed: the records of '
        "`spark_pylog_remote_count_sum` (a `file://` object store, 16 MiB segments, no log directory) read by "
        "the executor JVM from the pinned segment objects: count + sum(offset) + sum(length(value))"
    ),
    compare=(
        Compare("spark_parquet_count_sum", at_least=0.5),
        Compare("spark_pylog_remote_count_sum"),
        Compare("spark_pylog_jvm_count_sum"),
    ),
    timeout_s=900,
)
def spark_pylog_remote_jvm_count_sum(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    url = _write_tiered_pylog(records, seed, workdir)
    return _measure(records, workdir, _pylog_load(url), jvm=True)
