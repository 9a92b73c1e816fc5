"""A real Spark standalone cluster on loopback (a master and two workers as separate JVMs, started from the
pyspark package): the exactly-once streaming sink through worker and driver kills, then the batch read (both
paths) and the batch writer, against a log directory on the shared local file system. One test, so the
cluster runs one driver session after the killed one (each driver start costs tens of seconds).

The driver runs in a subprocess (one Python process can hold only one SparkContext, and the session fixture
of the other Spark tests holds it here).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest
from spark_helpers import needs_java, needs_javac, standalone_cluster

import pylog

pyspark = pytest.importorskip("pyspark")
pytestmark = [pytest.mark.spark, needs_java, needs_javac]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with standalone_cluster(tmp_path_factory.mktemp("cluster"), workers=2) as url:
        yield url


STREAM_DRIVER = textwrap.dedent(
    """
    import json, os, sys
    from pyspark.sql import SparkSession, functions as F
    from pylog.spark import jvm
    url, path, checkpoint, tokens, batch = sys.argv[1:6]
    builder = (SparkSession.builder.master(url).appName("pylog-cluster-test")
               .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.executor.memory", "512m")
               .config("spark.cores.max", "2"))
    spark = jvm.configure(builder).getOrCreate()  # the JVM reader's jar is shipped to the executors
    spark.sparkContext.setLogLevel("ERROR")

    def die_at(value):
        try:
            os.unlink(os.path.join(tokens, value.decode()))  # once per token: the executor's worker dies
        except FileNotFoundError:
            return value
        os._exit(1)

    udf = F.udf(die_at, "binary", useArrow=False)
    query = (spark.readStream.format("pylog").option("subscribe", "clicks").option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", 750).load(path)
             .select("key", udf("value").alias("value"))
             .writeStream.format("pylog").option("topic", "stream-out").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start(path))
    query.awaitTermination()
    out = {"rows": sum(p["numInputRows"] for p in query.recentProgress)}
    if batch == "batch":  # batch reads on both paths (Python, JVM reader) and the batch writer
        by_path = {}
        for enabled in ("false", "true"):
            spark.conf.set(jvm.ENABLED, enabled)
            df = spark.read.format("pylog").option("subscribe", "clicks").option("minPartitions", "4").load(path)
            assert ("JVM reader" in df._jdf.queryExecution().executedPlan().toString()) == (enabled == "true")
            got = df.groupBy("partition").agg(F.count("*").alias("n"), F.sum("offset").alias("s")).collect()
            by_path[enabled] = {r["partition"]: [r["n"], r["s"]] for r in got}
        assert by_path["false"] == by_path["true"], by_path
        out["batch_rows"] = by_path["true"]
        out["executors"] = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
        df.selectExpr("key", "value").write.format("pylog").option("topic", "copy").mode("append").save(path)
    print(json.dumps(out))
    spark.stop()
    """
)


def _stream_out(path: str, isolation: str) -> list[bytes]:
    with pylog.open(path) as log:
        c = log.consumer(
            "stream-out",
            value_deserializer=None,
            auto_offset_reset="earliest",
            consumer_timeout_ms=0,
            isolation_level=isolation,
        )
        values = [r.value for r in c]
        c.close()
    return values


def test_streaming_sink_and_batch_reads_on_a_standalone_cluster_survive_worker_and_driver_kills(
    cluster: str, tmp_path: object
) -> None:
    """The exactly-once sink with executors in other JVMs: Python workers of the executors die at two chosen
    records (Spark retries the tasks there), the driver process (with its JVM) is SIGKILLed after the first
    committed batch and started again from the checkpoint; read_committed readers see every record once.
    The restarted driver then reads the input on both batch paths (Python, JVM reader) and copies it with
    the batch writer, on the executors: the counts and offset sums per partition equal the log's."""
    root = str(tmp_path)
    path, checkpoint, tokens = os.path.join(root, "log"), os.path.join(root, "ck"), os.path.join(root, "kill")
    os.mkdir(tokens)
    with pylog.open(path) as log:
        log.create_topic("clicks", partitions=3, segment_bytes=8_192)
        log.create_topic("stream-out", partitions=2)
        log.create_topic("copy", partitions=2)
        producer = log.producer(value_serializer=None)
        for i in range(3_000):
            producer.send("clicks", b"v%d" % i, key=b"k%d" % (i % 17))
        producer.close()
        want = {}
        for tp in log.topic("clicks").partitions():
            end = log.topic("clicks").partition(tp.partition).log_end_offset
            want[str(tp.partition)] = [end, end * (end - 1) // 2]
    for i in (150, 2_100):
        open(os.path.join(tokens, f"v{i}"), "wb").close()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    args = [sys.executable, "-c", STREAM_DRIVER, cluster, path, checkpoint, tokens]

    first = subprocess.Popen(
        [*args, "stream"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not _stream_out(path, "read_committed") and first.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError("no batch was committed")
            time.sleep(0.2)
        killed = first.poll() is None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)  # the driver and its JVM, mid-stream
        first.wait()
    visible_at_kill = len(_stream_out(path, "read_committed"))

    r = subprocess.run([*args, "batch"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = _stream_out(path, "read_committed")
    assert sorted(got) == sorted(b"v%d" % i for i in range(3_000)), (len(got), len(set(got)))
    assert os.listdir(tokens) == []  # both worker deaths happened
    assert killed and 0 < visible_at_kill < 3_000  # the kill came mid-stream
    assert len(_stream_out(path, "read_uncommitted")) >= len(got)

    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["batch_rows"] == want
    assert out["executors"] == 2  # the work ran on the two worker JVMs
    with pylog.open(path) as log:
        c = log.consumer("copy", value_deserializer=None, auto_offset_reset="earliest", consumer_timeout_ms=0)
        copied = sorted(r.value for r in c)
        c.close()
    assert copied == sorted(b"v%d" % i for i in range(3_000))  # the writer, from the executors
