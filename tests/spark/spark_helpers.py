from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import pylog

BASE_TS = 1_700_000_000_000


def _java_tool(name: str) -> str | None:
    home = os.environ.get("JAVA_HOME")
    path = os.environ.get("PATH", "")
    return shutil.which(name, path=f"{home}/bin{os.pathsep}{path}" if home else path)


#: Spark runs in a JVM; pylog's JVM reader is compiled on first use. Machines without them skip, saying why.
HAS_JAVA = _java_tool("java") is not None
HAS_JAVAC = _java_tool("javac") is not None
needs_java = pytest.mark.skipif(
    not HAS_JAVA, reason="Spark needs a Java runtime: no java on PATH or in JAVA_HOME"
)
needs_javac = pytest.mark.skipif(
    not HAS_JAVAC, reason="pylog's JVM reader is built with javac (a JDK): none on PATH or in JAVA_HOME"
)

Record = tuple[Any, ...]


def make_log(path: str, seed: int, records: int = 600) -> None:
    """A random log: topics ``a`` (3 partitions) and ``b`` (1), small segments, headers, None keys/values,
    increasing timestamps 10 ms apart. ``segment_ms=1`` rolls a segment for every batch with a newer
    timestamp (segments roll by record time), so most segments hold one batch: many segment boundaries."""
    rng = random.Random(seed)
    with pylog.open(path, segment_bytes=2048, segment_ms=1) as log:
        log.create_topic("a", partitions=3)
        log.create_topic("b", partitions=1)
        producer = log.producer(value_serializer=None, batch_size=rng.choice([300, 1500]))
        for i in range(records):
            key = None if rng.random() < 0.3 else rng.randbytes(rng.randint(0, 12))
            value = None if key is not None and rng.random() < 0.1 else rng.randbytes(rng.randint(0, 40))
            headers = None
            if rng.random() < 0.3:
                headers = [
                    (f"h{j}", None if rng.random() < 0.2 else rng.randbytes(3))
                    for j in range(rng.randint(1, 2))
                ]
            producer.send(rng.choice("aab"), value, key=key, headers=headers, timestamp_ms=BASE_TS + 10 * i)
            if i % 40 == 0:
                producer.flush()
        producer.close()


def expected(path: str, topics: tuple[str, ...] = ("a", "b")) -> list[Record]:
    """Every record as pylog's own consumer reads it: (key, value, topic, partition, offset, ts_ms, type, headers)."""
    with pylog.open(path) as log:
        tps = [tp for t in topics for tp in log.topic(t).partitions()]
        consumer = log.consumer(value_deserializer=None, auto_offset_reset="earliest", consumer_timeout_ms=0)
        consumer.assign(tps)
        out = [
            (
                r.key,
                r.value,
                r.topic,
                r.partition,
                r.offset,
                r.timestamp,
                r.timestamp_type,
                [(k, v) for k, v in r.headers],
            )
            for r in consumer
        ]
        consumer.close()
    return sorted(out, key=lambda r: (r[2], r[3], r[4]))


def rows(df: Any) -> list[Record]:
    """A DataFrame of Kafka rows as records comparable with :func:`expected`."""
    cols = ["key", "value", "topic", "partition", "offset", "unix_millis(timestamp) AS ts", "timestampType"]
    has_headers = "headers" in df.columns
    out = []
    for r in df.selectExpr(*cols, *(["headers"] if has_headers else [])).collect():
        headers = (
            [(h["key"], None if h["value"] is None else bytes(h["value"])) for h in (r["headers"] or [])]
            if has_headers
            else []
        )
        out.append(
            (
                None if r["key"] is None else bytes(r["key"]),
                None if r["value"] is None else bytes(r["value"]),
                r["topic"],
                r["partition"],
                r["offset"],
                r["ts"],
                r["timestampType"],
                headers,
            )
        )
    return sorted(out, key=lambda r: (r[2], r[3], r[4]))


def strip_headers(records: list[Record]) -> list[Record]:
    return [(*r[:7], []) for r in records]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on port {port}")


def spark_env() -> dict[str, str]:
    """The environment of the cluster's daemons and drivers: loopback only, workers run this Python."""
    import pyspark

    return {
        **os.environ,
        "SPARK_HOME": os.path.dirname(pyspark.__file__),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
    }


@contextlib.contextmanager
def standalone_cluster(
    root: Path,
    *,
    workers: int = 2,
    cores: int = 1,
    memory: str = "1g",
    worker_prefix: Sequence[str] = (),
) -> Iterator[str]:
    """A Spark standalone cluster on loopback started from the pyspark package: a master and ``workers``
    worker daemons, each a JVM of its own (``root`` holds their logs and work directories). Yields the
    master's URL; stops every daemon by its process group at the end. ``worker_prefix`` is put before each
    worker's command (a wrapper that execs it, such as ``unshare``): executors are the worker's children."""
    env = spark_env()
    spark_class = os.path.join(env["SPARK_HOME"], "bin", "spark-class")
    port = free_port()
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    files = contextlib.ExitStack()

    def start(name: str, cmd: list[str]) -> None:
        out = files.enter_context(open(logs / f"{name}.log", "wb"))  # noqa: SIM115 (the ExitStack closes it)
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        )

    try:
        start(
            "master",
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port())),
            ],
        )
        wait_for_port(port)
        url = f"spark://127.0.0.1:{port}"
        for i in range(workers):
            work = root / f"worker{i}"
            work.mkdir(exist_ok=True)
            worker = [
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                url,
                *("--host", "127.0.0.1", "--cores", str(cores), "--memory", memory),
                *("--webui-port", str(free_port()), "--work-dir", str(work)),
            ]
            start(f"worker{i}", [*worker_prefix, *worker])
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
