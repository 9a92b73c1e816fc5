"""Helpers of the broker tests: a broker started as a process, bounded waits, what the log stored, a
confluent-kafka reader of partition 0, and a broker with SCRAM users and ACLs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import confluent_kafka as ck

import pylog
from pylog.broker.acls import Acl, AclStore
from pylog.broker.broker import Broker
from pylog.broker.credentials import CredentialStore

WAIT_S = 60.0  # longest any single wait may take before the test fails
SCRAM = "SCRAM-SHA-256"


class BrokerProcess:
    """``pylog --dir DIR serve`` in a child process; ``address`` is the line it printed."""

    def __init__(self, directory: Path, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pylog.cli",
                "--dir",
                str(directory),
                "serve",
                "--listen",
                "127.0.0.1:0",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=directory.parent,  # whatever a library of the child writes to its working directory stays there
        )
        assert self.proc.stdout is not None
        self.address = self.proc.stdout.readline().strip()
        if not self.address:
            self.proc.wait(WAIT_S)
            raise AssertionError(
                f"the broker did not start: {self.proc.stderr.read() if self.proc.stderr else ''}"
            )

    def stop(self, sig: int | None = None) -> int:
        if self.proc.poll() is None:
            if sig is None:
                self.proc.terminate()
            else:
                os.kill(self.proc.pid, sig)
        return self.proc.wait(WAIT_S)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(WAIT_S)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def wait_until(predicate: Callable[[], object], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def stored(log: pylog.Log, topic: str) -> list[pylog.ConsumerRecord]:
    """Every record of ``topic`` from its log start, as pylog's own consumer reads it (keys and values as
    bytes, as stored): what the Kafka clients sent through the broker."""
    consumer = log.consumer(
        topic, auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None
    )
    try:
        return list(consumer)
    finally:
        consumer.close()


def stored_values(log: pylog.Log, topic: str) -> list[Any]:
    """The values of :func:`stored`."""
    return [r.value for r in stored(log, topic)]


def confluent_values(broker: Broker, topic: str, isolation: str, n: int, group: str) -> list[bytes]:
    """The values of partition 0 of ``topic`` from offset 0 as a confluent-kafka consumer with
    ``isolation.level`` ``isolation`` reads them: ``n`` of them, then no more within a second."""
    c = ck.Consumer(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": group, "isolation.level": isolation}
    )
    c.assign([ck.TopicPartition(topic, 0, 0)])
    got: list[bytes] = []

    def more() -> bool:
        got.extend(m.value() for m in c.consume(1000, 0.5) if m.error() is None)
        return len(got) >= n

    try:
        wait_until(more, f"{n} {isolation} records")
        assert c.consume(1000, 1.0) == []  # and no more
        return got
    finally:
        c.close()


def sasl_config(broker: Broker, user: str) -> dict[str, Any]:
    """A confluent-kafka configuration that logs in to ``broker`` as ``user`` (SCRAM, password
    ``<user>-pw``, as :func:`secured_broker` creates them)."""
    return {
        "bootstrap.servers": broker.bootstrap_servers,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": SCRAM,
        "sasl.username": user,
        "sasl.password": f"{user}-pw",
    }


def kafka_python_sasl(broker: Broker, user: str) -> dict[str, Any]:
    """The same login as :func:`sasl_config` as keyword arguments of kafka-python's clients."""
    return {
        "bootstrap_servers": broker.bootstrap_servers,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": SCRAM,
        "sasl_plain_username": user,
        "sasl_plain_password": f"{user}-pw",
    }


@contextmanager
def secured_broker(log_dir: Path, users: Iterable[str], acls: Iterable[Acl]) -> Iterator[Broker]:
    """A broker over ``log_dir`` that asks for SCRAM logins of ``users`` (password ``<user>-pw``), authorizes
    by ``acls``, has ``User:admin`` as its super user and creates no topic on its own."""
    credentials = CredentialStore(str(log_dir))
    for name in users:
        credentials.add(name, f"{name}-pw", (SCRAM,))
    AclStore(str(log_dir)).add(list(acls))
    with pylog.serve(log_dir, sasl=SCRAM, super_users="User:admin", auto_create_topics=False) as b:
        yield b
