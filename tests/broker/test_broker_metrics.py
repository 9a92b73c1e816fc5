"""The broker's Prometheus endpoint (--metrics): requests, bytes per topic, connections, authentications,
errors, with Kafka's metric names."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import confluent_kafka as ck
import pytest
from kafka_support import WAIT_S, wait_until

import pylog
from pylog.broker.credentials import CredentialStore


def scrape(address: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=WAIT_S) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_metrics(log_dir: Path) -> None:
    CredentialStore(str(log_dir)).add("alice", "pw", ("SCRAM-SHA-256",))
    with pylog.serve(
        log_dir, sasl="SCRAM-SHA-256", super_users="User:alice", metrics="127.0.0.1:0"
    ) as broker:
        assert broker.metrics_address is not None
        conf = {
            "bootstrap.servers": broker.bootstrap_servers,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "alice",
        }
        producer = ck.Producer({**conf, "sasl.password": "pw", "acks": "all"})
        for _ in range(10):
            producer.produce("m", value=b"x" * 100, partition=0)
        assert producer.flush(WAIT_S) == 0
        bad = ck.Producer({**conf, "sasl.password": "wrong", "message.timeout.ms": 2000})
        bad.produce("m", value=b"y")
        address = broker.metrics_address
        wait_until(
            lambda: (
                scrape(address).get("kafka_server_socket_server_metrics_failed_authentication_total", 0) >= 1
            ),
            "a failed authentication counted",
        )
        bad.purge()
        got = scrape(address)
        assert got['kafka_network_requestmetrics_requests_total{request="Produce"}'] >= 1
        assert got['kafka_network_requestmetrics_totaltime_seconds_count{request="Produce"}'] >= 1
        assert (
            got['kafka_server_brokertopicmetrics_bytesin_total{topic="m"}'] > 1000
        )  # 10 records of 100 bytes
        assert got["kafka_server_socket_server_metrics_successful_authentication_total"] >= 1
        assert got["kafka_server_socket_server_metrics_failed_authentication_total"] >= 1
        assert got["kafka_server_socket_server_metrics_connection_count"] >= 1
        del producer, bad
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://{broker.metrics_address}/other", timeout=WAIT_S)
