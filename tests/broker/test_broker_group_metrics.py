"""The broker's Prometheus endpoint, strictly parsed: group states and lag per group and partition (computed
at scrape time), and quota counters per entity (one client id throttled, another not)."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from kafka_support import WAIT_S, wait_until

import pylog
from pylog.broker.metrics import BrokerMetrics, group_series
from pylog.broker.quota_store import QuotaStore
from pylog.broker.quotas import QuotaEntity
from pylog.structs import TopicPartition

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*"'
_SAMPLE = re.compile(rf"^({_NAME})(?:\{{((?:{_LABEL})(?:,{_LABEL})*)?\}})? (\S+)$")
_TYPE = re.compile(rf"^# TYPE ({_NAME}) (counter|gauge|histogram|summary|untyped)$")
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("",), "gauge": ("",)}

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Series:
    """Prometheus text format 0.0.4, strictly: every sample belongs to the family whose TYPE line came
    before it (same name, or a histogram's suffixes), label syntax and escapes are valid, a value is a
    float, no series appears twice, a family is declared once, counters end in _total."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    out: Series = {}
    current: str | None = None
    for line in text.splitlines():
        assert line, "an empty line"
        if line.startswith("#"):
            m = _TYPE.match(line)
            if m is None:
                assert line.startswith("# HELP "), line
                continue
            name, kind = m.groups()
            assert name not in types, f"{name} declared twice"
            if kind == "counter":
                assert name.endswith("_total"), name
            types[name] = kind
            current = name
            continue
        m = _SAMPLE.match(line)
        assert m is not None, f"not a sample line: {line!r}"
        name, labels, value = m.groups()
        assert current is not None and any(name == current + s for s in _SUFFIXES[types[current]]), (
            f"{name} outside its family {current}"
        )
        pairs = frozenset(
            (k, _unescape(v))
            for k, v in re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels or "")
        )
        key = (name, pairs)
        assert key not in out, f"series twice: {line}"
        out[key] = float(value)
    return out


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def scrape(address: str) -> Series:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=WAIT_S) as response:
        return parse(response.read().decode())


def get(series: Series, name: str, **labels: str) -> float | None:
    return series.get((name, frozenset(labels.items())))


def of(series: Series, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in series.items() if n == name}


def produce(bootstrap: str, client_id: str, values: list[bytes]) -> list[Any]:
    throttles: list[Any] = []
    producer = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "linger.ms": 50,
            "acks": "all",
            "throttle_cb": throttles.append,
        }
    )
    for value in values:
        producer.produce("g", value=value, partition=0)
    assert producer.flush(WAIT_S) == 0
    producer.poll(0.5)
    return throttles


def test_group_and_quota_metrics(log_dir: Path) -> None:
    QuotaStore(str(log_dir)).alter([(QuotaEntity(None, "slow"), {"producer_byte_rate": 2000})])
    with pylog.serve(log_dir, metrics="127.0.0.1:0") as broker:
        address = broker.metrics_address
        assert address is not None
        broker.log.create_topic("g", partitions=2)
        values = [b"v" * 1000] * 30  # 30 kB in one request: over slow's 20 kB window at once
        slow = produce(broker.bootstrap_servers, "slow", values)
        fast = produce(broker.bootstrap_servers, "fast", values)
        assert any(t.throttle_time > 0 for t in slow)
        assert all(t.throttle_time == 0 for t in fast)

        # an embedded pylog group: 12 records read and committed, then closed (Empty)
        embedded = broker.log.consumer(
            "g",
            group_id="embedded",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            value_deserializer=None,
        )
        got = 0
        while got < 12:
            got += sum(len(rs) for rs in embedded.poll(timeout_ms=1000, max_records=12 - got).values())
        embedded.commit({TopicPartition("g", 0): 12})
        embedded.close()

        # a Kafka group, still a member (Stable), committed at offset 10 of partition 0
        consumer = ck.Consumer(
            {
                "bootstrap.servers": broker.bootstrap_servers,
                "group.id": "kafka",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        consumer.subscribe(["g"])
        wait_until(lambda: consumer.poll(0.2) is not None, "a record for the Kafka group")
        consumer.commit(offsets=[ck.TopicPartition("g", 0, 10)], asynchronous=False)

        def stable() -> bool:
            return get(scrape(address), "pylog_group_state", group="kafka", state="Stable") == 1

        wait_until(stable, "the Kafka group Stable in the metrics")
        series = scrape(address)
        consumer.close()

    assert get(series, "pylog_group_state", group="embedded", state="Empty") == 1
    assert of(series, "pylog_group_lag") == {
        frozenset({("group", "embedded"), ("topic", "g"), ("partition", "0")}): 60 - 12,
        frozenset({("group", "kafka"), ("topic", "g"), ("partition", "0")}): 60 - 10,
    }
    assert get(series, "pylog_group_scrape_skipped") == 0
    counts = "kafka_coordinator_group_groupmetadatamanager_numgroups"
    assert get(series, counts) == 2
    assert [get(series, counts + s) for s in ("stable", "empty", "preparingrebalance", "dead")] == [
        1,
        1,
        0,
        0,
    ]
    slow_labels = {"quota": "produce", "user": "", "client_id": "slow"}
    assert (get(series, "kafka_server_quota_throttled_responses_total", **slow_labels) or 0) >= 1
    assert (get(series, "kafka_server_quota_throttle_time_seconds_total", **slow_labels) or 0) > 0
    assert (get(series, "kafka_server_quota_bytes_total", **slow_labels) or 0) >= 30_000
    for name in (
        "kafka_server_quota_bytes_total",
        "kafka_server_quota_throttled_responses_total",
        "kafka_server_quota_throttle_time_seconds_total",
    ):  # the client without a quota has no quota series
        assert {dict(labels)["client_id"] for labels in of(series, name)} == {"slow"}


def test_group_series_are_bounded(log_dir: Path) -> None:
    """At most max_groups groups are described per scrape; the others are counted, not read."""
    with pylog.open_log(log_dir) as log:
        log.create_topic("t")
        producer = log.producer()
        producer.send("t", b"x").get()
        producer.close()
        for i in range(5):
            consumer = log.consumer("t", group_id=f"g{i}", enable_auto_commit=False)
            consumer.commit({TopicPartition("t", 0): 0})
            consumer.close()
        samples = group_series(log, lambda: {"g0": "Stable", "live-only": "PreparingRebalance"}, max_groups=3)
    names = [
        (n, labels.get("group"), labels.get("state")) for n, labels, _ in samples if n == "pylog_group_state"
    ]
    assert names == [
        ("pylog_group_state", "g0", "Stable"),
        ("pylog_group_state", "g1", "Empty"),
        ("pylog_group_state", "g2", "Empty"),
    ]
    assert ("pylog_group_scrape_skipped", {}, 3.0) in samples  # g3, g4 and live-only
    lags = [(labels["group"], value) for n, labels, value in samples if n == "pylog_group_lag"]
    assert lags == [("g0", 1.0), ("g1", 1.0), ("g2", 1.0)]  # committed 0, end 1


def test_a_failing_collector_leaves_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    metrics = BrokerMetrics()
    metrics.add("x_total", 2, a='quote " and \\ and\nline')

    def broken() -> list[Any]:
        raise RuntimeError("boom")

    metrics.add_collector(broken)
    metrics.add_collector(lambda: [("y", {"k": "v"}, 1.5)])
    series = parse(metrics.render())
    assert get(series, "x_total", a='quote " and \\ and\nline') == 2
    assert get(series, "y", k="v") == 1.5
    assert "collector failed" in caplog.text
