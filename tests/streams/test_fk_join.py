"""Foreign-key table-table joins (KIP-213): random updates of both tables, and the join result equals the
join recomputed from both tables once the topology is quiet (after every record in the test driver; at the
end in the runtime, with tables of different partition counts, exactly-once and a restart)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from streams_helpers import committed_records, wait_for

import pylog
from pylog.errors import ConfigError
from pylog.streams import App, JoinWindows, TestDriver
from pylog.streams.admin import describe_application, read_store, reset_application
from pylog.streams.sqlite_buffers import SqliteSubscriptionStore


def _join(order: dict[str, Any], customer: dict[str, Any] | None) -> list[Any]:
    return [order["n"], None if customer is None else customer["name"]]


def _define(app: App, left: bool) -> None:
    orders = app.table("orders", name="orders")
    customers = app.table("customers", name="customers")
    joined = orders.join(
        customers, _join, foreign_key=lambda order: order["customer"], left=left, name="enriched"
    )
    joined.to_stream().to("enriched-orders")


def _steps(seed: int, n: int) -> list[tuple[str, str, Any]]:
    """(topic, key, value): orders move between customers (or to none), both sides are deleted at times."""
    rng = random.Random(seed)
    out: list[tuple[str, str, Any]] = []
    for i in range(n):
        if rng.random() < 0.55:
            key = f"o{rng.randrange(15)}"
            r = rng.random()
            if r < 0.12:
                value = None
            else:
                customer = None if r < 0.2 else f"c{rng.randrange(6)}"
                value = {"customer": customer, "n": i}
            out.append(("orders", key, value))
        else:
            key = f"c{rng.randrange(6)}"
            out.append(("customers", key, None if rng.random() < 0.15 else {"name": f"name-{i}"}))
    return out


def _model(orders: dict[str, Any], customers: dict[str, Any], left: bool) -> dict[str, Any]:
    out = {}
    for key, order in orders.items():
        customer = customers.get(order["customer"]) if order["customer"] is not None else None
        if customer is not None or left:
            out[key] = _join(order, customer)
    return out


def _apply(tables: dict[str, dict[str, Any]], topic: str, key: str, value: Any) -> None:
    if value is None:
        tables[topic].pop(key, None)
    else:
        tables[topic][key] = value


@pytest.mark.parametrize("stores", ["memory", "sqlite"])
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_foreign_key_join_equals_a_recomputation_after_every_record(
    tmp_path: Path, seed: int, left: bool, stores: str
) -> None:
    app = App(None, "fk", state_dir=tmp_path / "state" if stores == "sqlite" else None)
    _define(app, left)
    driver = TestDriver(app)
    tables: dict[str, dict[str, Any]] = {"orders": {}, "customers": {}}
    for topic, key, value in _steps(seed, 400):
        driver.pipe(topic, value, key=key)
        _apply(tables, topic, key, value)
        model = _model(tables["orders"], tables["customers"], left)
        assert driver.store("enriched").to_dict() == model
    last: dict[str, Any] = {}
    for k, v in driver.read_key_values("enriched-orders"):
        last[k] = v
    assert {k: v for k, v in last.items() if v is not None} == model
    subscriptions = driver.store("enriched-subscriptions").to_dict()
    assert {(fk, key) for fk, key in subscriptions} == {
        (order["customer"], pylog.streams.stores.encode_key(k))
        for k, order in tables["orders"].items()
        if order["customer"] is not None
    }, "exactly the live subscriptions"
    if stores == "sqlite":
        store = driver.store("enriched-subscriptions")
        assert isinstance(store, SqliteSubscriptionStore) and store._overlay == {}
        for fk in {fk for fk, _ in subscriptions}:  # the prefix scan of the file finds every subscriber
            assert sorted(store.subscribers(fk)) == sorted(
                (k, v) for (f, k), v in subscriptions.items() if f == fk
            )
    driver.close()


def test_a_foreign_key_change_retracts_the_old_match() -> None:
    app = App(None, "fk")
    _define(app, left=False)
    driver = TestDriver(app)
    driver.pipe("customers", {"name": "Ann"}, key="c1")
    driver.pipe("orders", {"customer": "c1", "n": 1}, key="o1")
    driver.pipe("orders", {"customer": "c2", "n": 1}, key="o1")  # c2 does not exist: the row goes
    driver.pipe("customers", {"name": "Ann B."}, key="c1")  # o1 no longer follows c1
    driver.pipe("customers", {"name": "Bob"}, key="c2")  # ... but c2
    driver.pipe("customers", None, key="c2")
    assert driver.read_key_values("enriched-orders") == [
        ("o1", [1, "Ann"]),
        ("o1", None),
        ("o1", [1, "Bob"]),
        ("o1", None),
    ]
    assert driver.metrics().get("stale-join-responses", 0) == 0


def test_a_stale_response_is_dropped() -> None:
    """A response that answers an older version of the left row never overwrites a newer result: responses are
    handed in late, after the row changed, by holding back the response topic."""
    app = App(None, "fk")
    _define(app, left=True)
    driver = TestDriver(app)
    held: list[Any] = []
    send = driver.send

    def hold(topic: str, key: Any, value: Any, ts: int, partition: Any, headers: Any = None) -> None:
        if topic.endswith("-subscription-response-topic") and holding:
            held.append((topic, key, value, ts, partition))
        else:
            send(topic, key, value, ts, partition, headers)

    driver.send = hold  # type: ignore[method-assign]
    driver.pipe("customers", {"name": "Ann"}, key="c1")
    driver.pipe("customers", {"name": "Bob"}, key="c2")
    holding = True
    driver.pipe("orders", {"customer": "c1", "n": 1}, key="o1")
    holding = False
    driver.pipe("orders", {"customer": "c2", "n": 2}, key="o1")
    for record in held:
        send(*record)
    driver.pipe("customers", {"name": "Cid"}, key="c3")  # drains the queue
    assert driver.store("enriched").to_dict() == {"o1": [2, "Bob"]}
    assert driver.metrics()["stale-join-responses"] == 1


def test_foreign_key_join_needs_a_known_right_partitioning() -> None:
    app = App(None, "fk")
    orders = app.table("orders")
    remapped = app.stream("s").map(lambda k, v: (v, k)).group_by_key().count()  # repartitioned: msgpack keys
    orders.join(remapped, lambda a, b: b, foreign_key=lambda v: v)
    joined = app.stream("a").join(app.stream("b"), lambda x, y: x, JoinWindows(10)).group_by_key().count()
    with pytest.raises(ConfigError, match="partitioned"):
        orders.join(joined, lambda a, b: b, foreign_key=lambda v: v)
    with pytest.raises(ConfigError, match="foreign-key"):
        orders.join(remapped, lambda a, b: b, name="not-a-fk-join")


@pytest.mark.parametrize("stores", ["memory", "sqlite"])
def test_foreign_key_join_in_the_runtime_exactly_once(tmp_path: Path, stores: str) -> None:
    state_dir = tmp_path / "state" if stores == "sqlite" else None
    steps = _steps(21, 500)
    tables: dict[str, dict[str, Any]] = {"orders": {}, "customers": {}}
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("orders", partitions=3)
        log.create_topic("customers", partitions=2)
        log.create_topic("enriched-orders", partitions=3)
        producer = log.producer()
        for half in (steps[:250], steps[250:]):
            app = App(log, "fk", commit_interval_ms=20, state_dir=state_dir)
            _define(app, left=True)
            app.start(threads=2)
            for topic, key, value in half:
                producer.send(topic, value, key=key)
                _apply(tables, topic, key, value)
            producer.flush()
            wait_for(lambda a=app: sum(a.lag().values()) == 0 and bool(log.group_offsets("fk")), "the app")
            app.close()
        producer.close()
        model = _model(tables["orders"], tables["customers"], left=True)
        assert read_store(log, "fk", "enriched") == model
        last: dict[str, Any] = {}
        for r in committed_records(log, "enriched-orders"):
            last[r.key.decode()] = r.value
        assert {k: v for k, v in last.items() if v is not None} == model
        assert log.topic("fk-enriched-subscription-registration-topic").num_partitions == 2
        assert log.topic("fk-enriched-subscription-response-topic").num_partitions == 3
        described = {t["topic"] for t in describe_application(log, "fk")["internal_topics"]}
        assert {
            "fk-enriched-subscription-registration-topic",
            "fk-enriched-subscription-response-topic",
        } <= described
        plan = reset_application(log, "fk")
        assert {
            "fk-enriched-subscription-registration-topic",
            "fk-enriched-subscription-response-topic",
            "fk-enriched-subscriptions-changelog",
            "fk-enriched-foreign-keys-changelog",
            "fk-enriched-changelog",
        } <= set(plan["internal_topics"])
        reset_application(log, "fk", execute=True)
        assert sorted(log.topics()) == ["customers", "enriched-orders", "orders"]
