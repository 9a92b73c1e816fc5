"""Fixtures of the broker tests: a broker over a fresh log directory, and one started as a process.

Every test talks to it with unchanged Kafka clients (kafka-python, confluent-kafka). Waits are bounded by
generous timeouts only; no test asserts how long something took.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka_support import BrokerProcess

import pylog
from pylog.broker.broker import Broker


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "log"


@pytest.fixture
def broker(log_dir: Path) -> Iterator[Broker]:
    with pylog.serve(log_dir) as b:
        yield b


@pytest.fixture
def broker_process(log_dir: Path) -> Iterator[BrokerProcess]:
    p = BrokerProcess(log_dir)
    try:
        yield p
    finally:
        p.close()
