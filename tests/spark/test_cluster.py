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
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest
from spark_helpers import needs_java, needs_javac

import pylog

pyspark = pytest.importorskip("pyspark")
pytestmark = [pytest.mark.spark, needs_java, needs_javac]

SPARK_HOME = os.path.dirname(pyspark.__file__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on port {port}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = {
        **os.environ,
        "SPARK_HOME": SPARK_HOME,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
    }
    spark_class = os.path.join(SPARK_HOME, "bin", "spark-class")
    port = _free_port()
    logs = tmp_path_factory.mktemp("cluster-logs")
    procs: list[subprocess.Popen[bytes]] = []
    files = contextlib.ExitStack()
    try:
        master = [
            spark_class,
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(_free_port()),
        ]
        procs.append(
            subprocess.Popen(
                master,
                env=env,
                stdout=files.enter_context(open(logs / "master.log", "wb")),  # noqa: SIM115 (the ExitStack closes it)
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        _wait_for_port(port)
        url = f"spark://127.0.0.1:{port}"
        for i in range(2):
            work = tmp_path_factory.mktemp(f"worker{i}")
            worker = [
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                url,
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                "1g",
                "--webui-port",
                str(_free_port()),
                "--work-dir",
                str(work),
            ]
            procs.append(
                subprocess.Popen(
                    worker,
                    env=env,
                    stdout=files.enter_context(open(logs / f"worker{i}.log", "wb")),  # noqa: SIM115
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        yield url
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        files.close()


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
