"""A Spark standalone cluster whose worker cannot see the writing log's directory reads the log from the
object store it was tiered to (``load("s3://...")``, ``load("file:///...")``, and a ``readStream``).

A writer process produces to a log directory whose topic has ``remote_storage_enable=True`` and tiers it to
the moto S3 server on loopback and to a ``file://`` store. The cluster's worker daemon (and so its executors
and their Python workers, its children) runs in a mount namespace of its own in which the writer's
directory is covered by an empty tmpfs (``unshare -m``; "namespace" mode). A machine that does not allow
that (no ``unshare``, or mounts refused) runs the "rename" mode instead: the writer's log directory is
renamed away for the Spark job and back after. Either way a task on the executors reports what it sees at
the writer's path, and the test asserts that it sees nothing; the mode that ran is printed and recorded as
the test's ``hidden_by`` property (``PYLOG_CLUSTER_HIDE=rename`` runs the fallback on any machine).

The reads run on the Python path and, when a JDK builds it, on pylog's JVM reader too (the executors' JVMs
map the ``file://`` store's objects and fetch the S3 ones through URLs the driver presigned): both must give
the writer's rows.

The driver runs in a subprocess (one Python process holds one SparkContext, and the session fixture of the
other Spark tests holds it here). The ``file://`` store's directory is visible to the worker, as a store
shared by the machines of a cluster is.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from spark_helpers import HAS_JAVAC, needs_java, spark_env, standalone_cluster

pyspark = pytest.importorskip("pyspark")
pytestmark = [pytest.mark.spark, needs_java]

TOPIC = "events"
RECORDS = 3_000

WRITER = textwrap.dedent(
    """
    import json, sys
    import pylog
    from pylog.clock import ManualClock
    path, s3_url, s3_options, file_url, acked_path = sys.argv[1:6]
    rows = {}
    for url, options in ((s3_url, json.loads(s3_options)), (file_url, {})):
        with pylog.open(path, clock=ManualClock(1_700_010_000_000), remote_storage=url,
                        remote_storage_options=options, remote_log_manager_task_interval_ms=-1) as log:
            if not rows:
                log.create_topic("events", 3, segment_bytes=8192, remote_storage_enable=True)
                producer = log.producer(value_serializer=None, key_serializer=None, batch_size=1000)
                sent = []
                for i in range(int(sys.argv[6])):
                    key = None if i % 11 == 0 else b"k%d" % (i % 17)
                    value = b"v%d-" % i + bytes(i % 29)
                    sent.append((producer.send("events", value, key=key, timestamp_ms=1_700_000_000_000 + i),
                                 key, value))
                producer.flush()
                for future, key, value in sent:
                    meta = future.get()
                    rows[(meta.partition, meta.offset)] = [
                        meta.partition, meta.offset, None if key is None else key.hex(), value.hex()]
                producer.close()
                for p in range(3):
                    log.topic("events").partition(p).roll()
            log.tier()  # to this store: every segment (all sealed)
    with open(acked_path, "w") as f:
        json.dump(sorted(rows.values()), f)
    """
)

DRIVER = textwrap.dedent(
    """
    import json, os, sys, time
    from pyspark.sql import SparkSession, functions as F
    started = time.monotonic()
    master, s3_url, s3_options, file_url, hidden, out_dir, checkpoint, jvm_path = sys.argv[1:9]
    builder = (SparkSession.builder.master(master).appName("pylog-cluster-remote-test")
               .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.executor.memory", "512m")
               .config("spark.cores.max", "2"))
    if jvm_path == "jvm":
        from pylog.spark import jvm
        builder = jvm.configure(builder)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    def probe(_):  # on an executor: what a task sees at the writer's log directory
        parent = os.path.dirname(hidden)
        listing = sorted(os.listdir(parent)) if os.path.isdir(parent) else None
        yield [os.getpid(), os.path.exists(hidden), listing]

    timings = {"session": time.monotonic() - started}
    out = {"timings": timings, "driver_pid": os.getpid(), "probe": spark.sparkContext.parallelize(range(4), 4).mapPartitions(probe).collect()}

    def summary(df):
        per = df.groupBy("partition").agg(F.count("*"), F.min("offset"), F.max("offset"), F.sum("offset"))
        rows = df.selectExpr("partition", "offset", "hex(key)", "hex(value)").collect()
        count, total = df.agg(F.count("*"), F.sum("offset")).first()
        return {
            "count": count,
            "sum": total,
            "partitions": sorted([list(r) for r in per.collect()]),
            "rows": sorted([r[0], r[1], None if r[2] is None else r[2].lower(), r[3].lower()] for r in rows),
        }

    stores = [("s3", s3_url, json.loads(s3_options)), ("file", file_url, {})]
    paths = ["python", "jvm"] if jvm_path == "jvm" else ["python"]
    for reader in paths:  # pylog's JVM reader reads file:// and presigned s3:// objects in the executors' JVMs
        spark.conf.set("spark.pylog.native.enabled", "true" if reader == "jvm" else "false")
        for name, url, options in stores:
            df = (spark.read.format("pylog").options(**options).option("subscribe", "events")
                  .option("minPartitions", 4).load(url))
            t = time.monotonic()
            out[name + "_" + reader] = summary(df)
            timings[name + "_" + reader] = time.monotonic() - t
            out[name + "_" + reader + "_plan"] = df._jdf.queryExecution().executedPlan().toString()

    query = (spark.readStream.format("pylog").options(**stores[0][2]).option("subscribe", "events")
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 1000).load(s3_url)
             .selectExpr("partition", "offset", "key", "value")
             .writeStream.format("parquet").option("path", out_dir).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    t = time.monotonic()
    query.awaitTermination()
    timings["stream"] = time.monotonic() - t
    out["stream_batches"] = [p["numInputRows"] for p in query.recentProgress]
    out["probe_after"] = spark.sparkContext.parallelize(range(2), 2).mapPartitions(probe).collect()
    print(json.dumps(out))
    spark.stop()
    """
)


def _namespaces_work(tmp: Path) -> bool:
    """Whether this machine lets a process cover a directory with a tmpfs in a mount namespace of its own."""
    if shutil.which("unshare") is None:
        return False
    probe = tmp / "probe"
    probe.mkdir()
    (probe / "visible").touch()
    r = subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            'mount -t tmpfs none "$0" && ls -A "$0"',
            probe,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return r.returncode == 0 and r.stdout.strip() == "" and (probe / "visible").exists()


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str]]:
    """``(root, mode, master URL)``: the writer's directory is ``root/writer/log``; in namespace mode the
    worker starts with ``root/writer`` covered by an empty tmpfs."""
    root = tmp_path_factory.mktemp("cluster-remote")
    (root / "writer").mkdir()
    mode = os.environ.get("PYLOG_CLUSTER_HIDE") or ("namespace" if _namespaces_work(root) else "rename")
    if mode not in ("namespace", "rename"):
        raise ValueError(f"PYLOG_CLUSTER_HIDE must be namespace or rename, got {mode!r}")
    prefix: list[str] = []
    if mode == "namespace":
        cover = 'mount -t tmpfs none "$0" && exec "$@"'
        prefix = ["unshare", "-m", "--propagation", "private", "sh", "-c", cover, str(root / "writer")]
    with standalone_cluster(root / "cluster", workers=1, cores=2, worker_prefix=prefix) as url:
        yield root, mode, url


def _s3(moto: tuple[str, dict[str, Any]], prefix: str) -> tuple[str, dict[str, Any], dict[str, str]]:
    """``(url, pylog options, Spark reader options)`` of the moto bucket (JSON-friendly: default retries)."""
    bucket, options = moto
    opts = {k: options[k] for k in ("endpoint", "region", "access_key_id", "secret_access_key")}
    spark_opts = {f"remoteStorage.{k}": str(v) for k, v in opts.items()}
    spark_opts["remoteStorage.client_options.allow_http"] = "true"
    return f"s3://{bucket}/{prefix}", {**opts, "client_options": {"allow_http": True}}, spark_opts


def test_a_cluster_that_cannot_see_the_log_directory_reads_its_object_store(
    layout: tuple[Path, str, str],
    moto_s3: tuple[str, dict[str, Any]],
    request: pytest.FixtureRequest,
) -> None:
    root, mode, master = layout
    request.node.user_properties.append(("hidden_by", mode))
    print(f"the writer's directory is hidden from the worker by: {mode}")
    log_dir = root / "writer" / "log"
    s3_url, s3_options, s3_spark = _s3(moto_s3, "cluster-remote")
    file_url = (root / "remote").as_uri()
    acked_path = root / "acked.json"
    env = spark_env()
    w = subprocess.run(
        [
            sys.executable,
            "-c",
            WRITER,
            log_dir,
            s3_url,
            json.dumps(s3_options),
            file_url,
            acked_path,
            str(RECORDS),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert w.returncode == 0, w.stderr[-3000:]
    acked = [list(r) for r in json.loads(acked_path.read_text())]
    assert len(acked) == RECORDS and {r[0] for r in acked} == {0, 1, 2}

    away = root / "log-away"
    if mode == "rename":
        os.rename(log_dir, away)
    try:
        assert log_dir.exists() == (mode == "namespace")  # namespace mode: only the worker's view is covered
        jvm = "jvm" if _jvm_reads_urls() else "python"
        request.node.user_properties.append(("readers", jvm))
        r = subprocess.run(
            [
                sys.executable,
                "-c",
                DRIVER,
                master,
                s3_url,
                json.dumps(s3_spark),
                file_url,
                str(log_dir),
                str(root / "stream-out"),
                str(root / "checkpoint"),
                jvm,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
    finally:
        if mode == "rename":
            os.rename(away, log_dir)
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    print("driver seconds:", {k: round(v, 1) for k, v in out["timings"].items()})

    # the executors run in other processes and see nothing at the writer's directory
    for pid, exists, listing in out["probe"] + out["probe_after"]:
        assert pid != out["driver_pid"]
        assert exists is False, (mode, listing)
        assert listing == []  # the writer's parent: an empty tmpfs, or emptied by the rename

    want_partitions = []
    for p in range(3):
        offsets = [r[1] for r in acked if r[0] == p]
        assert offsets == list(range(len(offsets)))
        want_partitions.append([p, len(offsets), 0, len(offsets) - 1, sum(offsets)])
    for name in ("s3", "file"):
        for reader in ("python", "jvm") if jvm == "jvm" else ("python",):
            got = out[f"{name}_{reader}"]
            assert got["rows"] == acked, (name, reader)  # exact rows: partition, offset, key, value
            assert got["count"] == RECORDS
            assert got["sum"] == sum(r[1] for r in acked)
            assert got["partitions"] == want_partitions
            assert ("(JVM reader)" in out[f"{name}_{reader}_plan"]) == (reader == "jvm")

    table = pq.read_table(root / "stream-out").to_pylist()  # written by the executors
    streamed = sorted(
        [t["partition"], t["offset"], None if t["key"] is None else t["key"].hex(), t["value"].hex()]
        for t in table
    )
    assert streamed == acked
    assert sum(out["stream_batches"]) == RECORDS and max(out["stream_batches"]) <= 1000


def _jvm_reads_urls() -> bool:
    """Whether the job also reads on pylog's JVM reader (it reads file:// and s3:// stores): a JDK builds it.
    Without one the job runs on the Python path only, and says so."""
    if not HAS_JAVAC:
        print("no javac: the cluster job reads on the Python path only (pylog's JVM reader is not built)")
    return HAS_JAVAC
