"""Byte-rate quotas (KIP-13): the throttle time against Kafka's formula, and unchanged clients told to slow
down (throttle_time_ms) while every record is still delivered."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from kafka_support import WAIT_S, stored_values, wait_until

import pylog
from pylog.broker.quotas import WINDOW_MS, ByteRate
from pylog.errors import ConfigError


def test_throttle_time_against_a_model() -> None:
    """Random amounts at random times: the throttle time is (bytes in the window - quota x window) / quota,
    at most the window, computed here from all samples kept by the test."""
    rng = random.Random(3)
    rate = ByteRate(1000)
    now = 0.0
    seen: list[tuple[float, int]] = []
    for _ in range(2000):
        now += rng.choice([0, 1, 50, 400, 3000, 12000])
        amount = rng.randrange(0, 5000)
        seen.append((now, amount))
        in_window = sum(b for t, b in seen if t > now - WINDOW_MS)
        over = in_window - 1000 * WINDOW_MS / 1000
        expected = 0 if over <= 0 else min(int(over / 1000 * 1000), WINDOW_MS)
        assert rate.record("k", amount, now) == expected
    assert rate.record("other", 10, now) == 0  # per key
    with pytest.raises(ConfigError):
        ByteRate(0)


def produce_all(bootstrap: str, values: list[bytes]) -> list[Any]:
    """Produce ``values`` with confluent-kafka; the throttle reports it got."""
    throttles: list[Any] = []
    producer = ck.Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all", "throttle_cb": throttles.append}
    )
    for value in values:
        producer.produce("q", value=value, partition=0)
    assert producer.flush(WAIT_S * 2) == 0

    def reported() -> bool:
        producer.poll(0.1)
        return bool(throttles)

    wait_until(reported, "a throttle report")
    return throttles


def test_producer_is_throttled_and_delivers_everything(log_dir: Path) -> None:
    values = [bytes([i % 256]) * 1000 for i in range(150)]  # 150 kB: 15 s of quota, the window holds 10 s
    with pylog.serve(log_dir, producer_byte_rate=10_000) as broker:
        throttles = produce_all(broker.bootstrap_servers, values)
        assert max(t.throttle_time for t in throttles) > 0
        assert stored_values(broker.log, "q") == values
