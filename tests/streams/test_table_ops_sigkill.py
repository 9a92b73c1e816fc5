"""Exactly-once under SIGKILL for the table operations: a table group_by aggregation, a foreign-key join and a
suppression buffer, in one application process killed at random moments and restarted, then run to the end.
The grouped aggregates and the join equal a recomputation from the final tables, and the suppressed output is
exactly what a model of each partition's buffer forwards: no duplicate, nothing missing, in order."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from streams_helpers import Child, committed_records, suppress_model, wait_for

import pylog
from pylog.errors import UnknownGroupError
from pylog.streams import App
from pylog.streams.admin import read_store

CHANGES = 900
KILLS = 3
CHUNK = CHANGES // (KILLS + 1)
LIMIT_MS = 200
MAX_RECORDS = 4


def _define(app: App, delay: float) -> None:
    orders = app.table("orders", name="orders")
    customers = app.table("customers", name="customers")

    def group(key: str, order: dict[str, Any]) -> tuple[str, int]:
        time.sleep(delay)  # a run cannot finish its chunk before it is killed
        return order["customer"], order["eur"]

    orders.group_by(group).aggregate(
        lambda: [0, 0],
        lambda c, eur, agg: [agg[0] + 1, agg[1] + eur],
        lambda c, eur, agg: None if agg[0] == 1 else [agg[0] - 1, agg[1] - eur],
        name="per-customer",
    ).to_stream().to("per-customer")
    orders.left_join(
        customers,
        lambda o, c: [o["eur"], c and c["name"]],
        foreign_key=lambda o: o["customer"],
        name="enriched",
    ).to_stream().to("enriched")
    orders.suppress(until_time_limit=LIMIT_MS, max_records=MAX_RECORDS, name="held").to_stream().to(
        "suppressed"
    )


def _steps() -> list[tuple[str, str, Any, int]]:
    """(topic, key, value, timestamp)."""
    rng = random.Random(44)
    out: list[tuple[str, str, Any, int]] = []
    for i in range(CHANGES):
        ts = i * 10
        if rng.random() < 0.7:
            value = (
                None
                if rng.random() < 0.1
                else {"customer": f"c{rng.randrange(8)}", "eur": rng.randrange(1, 99)}
            )
            out.append(("orders", f"o{rng.randrange(40)}", value, ts))
        else:
            out.append(("customers", f"c{rng.randrange(8)}", {"name": f"name-{i}"}, ts))
    return out


def _produce(path: str, steps: list[tuple[str, str, Any, int]]) -> None:
    with pylog.open(path) as log:
        producer = log.producer()
        for topic, key, value, ts in steps:
            producer.send(topic, value, key=key, timestamp_ms=ts)
        producer.close()


def _run(path: str, delay: float) -> None:
    with pylog.open(path) as log:
        app = App(log, "tables", instance_id="worker", commit_interval_ms=30, max_poll_records=50)
        _define(app, delay)
        app.run(threads=2)


def _fork(path: str, delay: float) -> Child:
    return Child(lambda: _run(path, delay))


def _offsets(log: pylog.Log) -> dict[pylog.TopicPartition, Any]:
    try:
        return dict(log.group_offsets("tables"))
    except UnknownGroupError:  # killed before its first commit
        return {}


def _committed(log: pylog.Log) -> int:
    """Input records read and committed."""
    return sum(om.offset for tp, om in _offsets(log).items() if tp.topic in ("orders", "customers"))


def test_table_operations_are_exactly_once_under_sigkill(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    with pylog.open(path) as log:
        log.create_topic("orders", partitions=4)
        log.create_topic("customers", partitions=2)
        for topic in ("per-customer", "enriched", "suppressed"):
            log.create_topic(topic, partitions=2)
    steps = _steps()
    rng = random.Random(45)
    interrupted = 0
    for run in range(KILLS):
        _produce(path, steps[run * CHUNK : (run + 1) * CHUNK])
        # killed once it has committed part of the new chunk (restores, then more work, then a kill)
        with _fork(path, 0.004) as app:
            with pylog.open(path) as log:
                target = _committed(log) + rng.randrange(20, CHUNK // 2)
                wait_for(lambda log=log, target=target: _committed(log) >= target, "some progress")
            time.sleep(rng.uniform(0, 0.1))
            app.kill()
        with pylog.open(path) as log:
            offsets = _offsets(log)
            ends = log.topic("orders").end_offsets()
            behind = sum(
                end - (om.offset if (om := offsets.get(pylog.TopicPartition("orders", p))) else 0)
                for p, end in ends.items()
            )
        interrupted += behind > 0
    _produce(path, steps[KILLS * CHUNK :])
    with _fork(path, 0.0) as app:
        with pylog.open(path) as log:

            def done() -> bool:
                offsets = _offsets(log)
                return all(
                    offsets.get(pylog.TopicPartition(t, p)) is not None
                    and offsets[pylog.TopicPartition(t, p)].offset == end
                    for t in ("orders", "customers")
                    for p, end in log.topic(t).end_offsets().items()
                )

            wait_for(done, "the last run to read every input")
            time.sleep(0.5)  # the internal topics' records of the last inputs, then a commit
            wait_for(
                lambda: all(
                    om.offset == log.topic(tp.topic).end_offsets()[tp.partition]
                    for tp, om in log.group_offsets("tables").items()
                ),
                "the internal topics to be read",
            )
        app.stop()

    tables: dict[str, dict[str, Any]] = {"orders": {}, "customers": {}}
    for topic, key, value, _ in steps:
        if value is None:
            tables[topic].pop(key, None)
        else:
            tables[topic][key] = value
    per_customer: dict[str, list[int]] = {}
    for order in tables["orders"].values():
        agg = per_customer.setdefault(order["customer"], [0, 0])
        agg[0] += 1
        agg[1] += order["eur"]
    enriched = {
        k: [o["eur"], tables["customers"].get(o["customer"], {}).get("name")]
        for k, o in tables["orders"].items()
    }
    with pylog.open(path) as log:
        assert read_store(log, "tables", "per-customer") == per_customer
        assert read_store(log, "tables", "enriched") == enriched
        for topic, model in (("per-customer", per_customer), ("enriched", enriched)):
            last: dict[str, Any] = {}
            for r in committed_records(log, topic):
                last[r.key.decode()] = r.value
            assert {k: v for k, v in last.items() if v is not None} == model, topic
        # the suppressed output: per partition of "orders", the model of its buffer, exactly
        partitions: dict[int, list[tuple[str, Any, int]]] = {}
        for r in committed_records(log, "orders"):
            partitions.setdefault(r.partition, []).append((r.key.decode(), r.value, r.timestamp))
        expected: dict[str, list[tuple[Any, int]]] = {}
        for records in partitions.values():
            for key, value, ts in suppress_model(records, LIMIT_MS, MAX_RECORDS):
                expected.setdefault(key, []).append((value, ts))
        got: dict[str, list[tuple[Any, int]]] = {}
        for r in committed_records(log, "suppressed"):
            got.setdefault(r.key.decode(), []).append((r.value, r.timestamp))
        assert got == expected
        assert sum(map(len, got.values())) > 100
    assert interrupted >= 1, "the kills interrupted the work"
