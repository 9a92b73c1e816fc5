"""The DSL through the TestDriver: every operation against a plain-Python model of what it should do."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pylog.errors import ConfigError, DeserializationError, SerializationError
from pylog.streams import (
    BYTES,
    JSON,
    MSGPACK,
    App,
    HoppingWindows,
    KeyValueStore,
    TestDriver,
    TumblingWindows,
    Windowed,
)


def _words(seed: int, n: int = 200) -> list[tuple[str, str, int]]:
    rng = random.Random(seed)
    vocab = ["to", "be", "or", "not", "that", "is", "the", "question"]
    return [
        (f"k{rng.randrange(5)}", " ".join(rng.choice(vocab) for _ in range(rng.randrange(0, 5))), i * 10)
        for i in range(n)
    ]


def test_stateless_operations_match_a_model() -> None:
    app = App(None, "stateless")
    seen: list[tuple[str, str]] = []
    lines = app.stream("lines")
    short, long_, _rest = lines.peek(lambda k, v: seen.append((k, v))).branch(
        lambda k, v: len(v) < 10, lambda k, v: len(v) >= 20, lambda k, v: True
    )
    short.map_values(str.upper).to("short")
    long_.flat_map(lambda k, v: [(w, k) for w in v.split()]).filter(lambda k, v: k != "the").to("long-words")
    short.merge(long_).map(lambda k, v: (v, k)).filter_not(lambda k, v: k == "").to("swapped")
    driver = TestDriver(app)
    inputs = _words(1)
    driver.pipe_many("lines", inputs)

    assert seen == [(k, v) for k, v, _ in inputs]
    assert driver.read_output("short") == [(k, v.upper(), ts) for k, v, ts in inputs if len(v) < 10]
    assert driver.read_key_values("long-words") == [
        (w, k) for k, v, _ in inputs if len(v) >= 20 for w in v.split() if w != "the"
    ]
    assert driver.read_key_values("swapped") == [
        (v, k) for k, v, _ in inputs if (len(v) < 10 or len(v) >= 20) and v != ""
    ]
    assert driver.read_output("short") == []  # read once


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_count_reduce_aggregate_match_a_model(seed: int) -> None:
    app = App(None, "aggs")
    lines = app.stream("lines")
    words = lines.flat_map_values(str.split)
    words.group_by(lambda k, w: w).count(name="word-counts").to_stream().to("counts")
    lines.map_values(len).group_by_key().reduce(lambda a, b: a + b, name="lengths")
    lines.group_by_key().aggregate(list, lambda k, v, agg: [*agg[-2:], v], name="last3")
    driver = TestDriver(app)
    inputs = _words(seed)
    driver.pipe_many("lines", inputs)

    all_words = [w for _, v, _ in inputs for w in v.split()]
    assert driver.store("word-counts").to_dict() == dict(Counter(all_words))
    # every update is emitted: the n-th occurrence of a word emits n
    running: Counter[str] = Counter()
    expected = []
    for w in all_words:
        running[w] += 1
        expected.append((w, running[w]))
    assert driver.read_key_values("counts") == expected
    lengths: dict[str, int] = {}
    last3: dict[str, list[str]] = {}
    for k, v, _ in inputs:
        lengths[k] = lengths.get(k, 0) + len(v)
        last3[k] = [*last3.get(k, [])[-2:], v]
    assert driver.store("lengths").to_dict() == lengths
    assert driver.store("last3").to_dict() == last3


def test_group_by_goes_through_a_repartition_topic_and_stores_have_changelogs() -> None:
    app = App(None, "clicks")
    clicks = app.stream("clicks")
    clicks.group_by(lambda k, v: v["page"]).count(name="per-page")
    clicks.group_by_key().count(name="per-user")  # the key is unchanged: no repartition
    clicks.select_key(lambda k, v: v["page"]).group_by_key().count(name="per-page-2")  # changed: repartition
    driver = TestDriver(app)
    topology = driver.topology
    assert topology.describe() == "\n".join(
        [
            "Topology of clicks:",
            "  Sub-topology 0 (1 tasks)",
            "    sources: clicks",
            "    stores: per-user",
            "    sinks: clicks-per-page-repartition, clicks-per-page-2-repartition",
            "  Sub-topology 1 (1 tasks)",
            "    sources: clicks-per-page-repartition",
            "    stores: per-page",
            "  Sub-topology 2 (1 tasks)",
            "    sources: clicks-per-page-2-repartition",
            "    stores: per-page-2",
        ]
    )
    internal = topology.internal_topics()
    assert internal["clicks-per-page-changelog"] == (1, {"cleanup_policy": "compact"})
    assert internal["clicks-per-page-repartition"] == (1, {})
    for i in range(30):
        driver.pipe("clicks", {"page": f"/p{i % 4}"}, key=f"u{i % 3}")
    assert driver.store("per-page").to_dict() == {f"/p{j}": 8 if j < 2 else 7 for j in range(4)}
    assert driver.store("per-page-2").to_dict() == driver.store("per-page").to_dict()
    assert driver.store("per-user").to_dict() == {"u0": 10, "u1": 10, "u2": 10}
    # the changelog restores the same store
    changelog = driver._outputs["clicks-per-page-changelog"]
    fresh = KeyValueStore("per-page", "clicks-per-page-changelog")
    fresh.restore([k for k, _, _ in changelog], [v for _, v, _ in changelog])
    assert fresh.to_dict() == driver.store("per-page").to_dict()
    assert len(driver.read_output("clicks-per-page-changelog")) == 30  # one per record: flushed per pipe


def test_table_upserts_and_deletes() -> None:
    app = App(None, "users")
    users = app.table("users", name="users-store")
    users.to_stream().to("user-changes")
    driver = TestDriver(app)
    driver.pipe("users", {"name": "Ann"}, key="1")
    driver.pipe("users", {"name": "Bob"}, key="2")
    driver.pipe("users", {"name": "Ann B."}, key="1")
    driver.pipe("users", None, key="2")  # tombstone
    driver.pipe("users", {"name": "nobody"})  # no key: skipped
    assert driver.store("users-store").to_dict() == {"1": {"name": "Ann B."}}
    assert driver.read_key_values("user-changes") == [
        ("1", {"name": "Ann"}),
        ("2", {"name": "Bob"}),
        ("1", {"name": "Ann B."}),
        ("2", None),
    ]
    assert driver.metrics()["dropped-records"] == 1


def test_timestamp_extractor_and_serdes() -> None:
    app = App(None, "ts")
    events = app.stream("events", key_serde=BYTES, value_serde=JSON, timestamp=lambda k, v, ts: v["at"])
    events.to("copy", key_serde=BYTES, value_serde=JSON)
    driver = TestDriver(app)
    driver.pipe("events", {"at": 1234}, key=b"a", timestamp_ms=99)
    driver.pipe("events", {"at": -1}, key=b"b")  # no valid event time: skipped
    assert driver.read_output("copy") == [(b"a", {"at": 1234}, 1234)]
    assert driver.metrics() == {"processed-records": 2, "dropped-records": 1}
    with pytest.raises(SerializationError):
        driver.pipe("events", {"at": 1}, key="not bytes")


@pytest.mark.parametrize("policy", ["raise", "skip", "dead_letter"])
def test_undecodable_input_records(policy: str) -> None:
    app = App(
        None,
        "poison",
        key_serde=BYTES,
        on_deserialization_error=policy,
        dead_letter_topic="dlq" if policy == "dead_letter" else None,
    )
    app.stream("in").map_values(lambda v: v + 1).to("out", key_serde=BYTES)
    driver = TestDriver(app)
    source = driver.topology.subtopology_of("in").sources["in"]
    task = driver._tasks[0]
    source.receive(task, b"k1", MSGPACK.encode(1), 5, 0, 0)
    if policy == "raise":
        with pytest.raises(DeserializationError, match=r"in-0@1 cannot be decoded") as info:
            source.receive(task, b"k", b"\xc1", 6, 0, 1)  # 0xc1 is never valid msgpack
        assert info.value.offset == 1
        return
    source.receive(task, b"k", b"\xc1", 6, 0, 1)
    source.receive(task, b"k3", MSGPACK.encode(3), 7, 0, 2)
    assert driver.read_values("out") == [2, 4]  # the records around it go on
    counter = "skipped-records" if policy == "skip" else "dead-lettered-records"
    assert driver.metrics()[counter] == 1
    if policy == "dead_letter":
        assert driver.read_output("dlq") == [(b"k", b"\xc1", 6)]  # the stored bytes, as they were


def test_dead_letter_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="dead_letter_topic"):
        App(None, "x", on_deserialization_error="dead_letter")
    with pytest.raises(ConfigError, match="dead_letter_topic"):
        App(None, "x", dead_letter_topic="dlq")
    with pytest.raises(ConfigError, match="on_deserialization_error"):
        App(None, "x", on_deserialization_error="ignore")


def test_tumbling_and_hopping_windows() -> None:
    app = App(None, "win")
    clicks = app.stream("clicks")
    clicks.group_by_key().windowed_by(TumblingWindows(100, grace=50)).count(name="tumbling").to_stream().to(
        "t"
    )
    hop = clicks.group_by_key().windowed_by(HoppingWindows(100, 50), emit="final", late_topic="late")
    hop.count(name="hopping").to_stream().to("h")
    driver = TestDriver(app)
    for ts in [10, 60, 120, 30, 170, 20, 260]:
        driver.pipe("clicks", 1, key="a", timestamp_ms=ts)
    assert driver.read_key_values("t") == [
        (Windowed("a", 0, 100), 1),
        (Windowed("a", 0, 100), 2),
        (Windowed("a", 100, 200), 1),
        (Windowed("a", 0, 100), 3),  # 30 arrives at stream time 120 < 100 + 50: still open
        (Windowed("a", 100, 200), 2),
        # 20 at stream time 170 >= 150: window [0, 100) is closed, the record is late
        (Windowed("a", 200, 300), 1),
    ]
    # final: each hopping window once, when stream time passes its end (no grace), stamped with its latest
    # record; 30 and 20 belong only to [0, 100) (windows start at 0), closed when they come: late
    assert driver.read_output("h") == [
        (Windowed("a", 0, 100), 2, 60),
        (Windowed("a", 50, 150), 2, 120),
        (Windowed("a", 100, 200), 2, 170),
        (Windowed("a", 150, 250), 1, 170),
    ]
    assert driver.read_key_values("late") == [("a", 1), ("a", 1)]
    assert driver.metrics()["late-records"] == 3  # 20 for the tumbling count; 30 and 20 for the hopping one
    assert driver.store("hopping").to_dict() == {("a", 200): 1, ("a", 250): 1}


def test_topology_mistakes_are_config_errors() -> None:
    app = App(None, "bad")
    app.stream("a")
    with pytest.raises(ConfigError, match="already a source"):
        app.stream("a")
    with pytest.raises(ConfigError, match="store name"):
        app.stream("b").group_by_key().count(name="no spaces")
    with pytest.raises(ConfigError):
        App(None, "bad id")
    with pytest.raises(ConfigError):
        App(None, "x", processing_guarantee="exactly_twice")
    with pytest.raises(ConfigError):
        HoppingWindows(10, 20)
    app.stream("c").to("d")
    TestDriver(app)
    with pytest.raises(ConfigError, match="cannot change"):
        app.stream("e")


def test_stream_table_join_matches_a_model() -> None:
    app = App(None, "enrich")
    users = app.table("users", name="users")
    orders = app.stream("orders")
    orders.join(users, lambda order, user: {**order, "name": user["name"]}).to("enriched")
    orders.left_join(users, lambda order, user: (user or {}).get("name")).to("names")
    # a changed key goes through a repartition topic before the join
    orders.select_key(lambda k, v: v["by"]).join(users, lambda o, u: u["name"]).to("by-referrer")
    driver = TestDriver(app)
    assert "enrich-join-0009-repartition" in driver.topology.internal_topics()
    rng = random.Random(7)
    table: dict[str, dict[str, str]] = {}
    enriched, names, referred = [], [], []
    for i in range(300):
        user = f"u{rng.randrange(6)}"
        if rng.random() < 0.3:
            value = None if rng.random() < 0.3 else {"name": f"name-{i}"}
            driver.pipe("users", value, key=user)
            if value is None:
                table.pop(user, None)
            else:
                table[user] = value
            continue
        order = {"i": i, "by": f"u{rng.randrange(6)}"}
        driver.pipe("orders", order, key=user)
        if user in table:
            enriched.append((user, {**order, "name": table[user]["name"]}))
        names.append((user, table[user]["name"] if user in table else None))
        if order["by"] in table:
            referred.append((order["by"], table[order["by"]]["name"]))
    assert driver.read_key_values("enriched") == enriched
    assert driver.read_key_values("names") == names
    assert driver.read_key_values("by-referrer") == referred
    assert driver.topology.subtopology_of("users") is driver.topology.subtopology_of("orders")


def test_table_operations_and_table_table_joins_match_a_model() -> None:
    app = App(None, "tables")
    users = app.table("users", name="users")
    plans = app.table("plans", name="plans")
    adults = users.filter(lambda k, u: u["age"] >= 18).map_values(lambda u: u["name"])
    adults.join(plans, lambda name, plan: f"{name}:{plan}").to_stream().to("inner")
    adults.left_join(plans, lambda name, plan: f"{name}:{plan}").to_stream().to("left")
    orders = app.stream("orders")
    orders.join(adults.join(plans, lambda n, p: [n, p]), lambda o, np_: [o, *np_]).to("orders-joined")
    driver = TestDriver(app)
    rng = random.Random(11)
    u: dict[str, dict[str, Any]] = {}
    p: dict[str, str] = {}
    expect: dict[str, list[tuple[str, Any]]] = {"inner": [], "left": [], "orders-joined": []}

    def adult(k: str) -> str | None:
        return u[k]["name"] if k in u and u[k]["age"] >= 18 else None

    for i in range(400):
        k = f"k{rng.randrange(5)}"
        what = rng.random()
        if what < 0.35:
            value = None if rng.random() < 0.2 else {"name": f"n{i}", "age": rng.randrange(10, 30)}
            driver.pipe("users", value, key=k)
            if value is None:
                u.pop(k, None)
            else:
                u[k] = value
            a = adult(k)
            expect["inner"].append((k, f"{a}:{p[k]}" if a is not None and k in p else None))
            expect["left"].append((k, f"{a}:{p.get(k)}" if a is not None else None))
        elif what < 0.7:
            plan = None if rng.random() < 0.2 else f"plan{i}"
            driver.pipe("plans", plan, key=k)
            if plan is None:
                p.pop(k, None)
            else:
                p[k] = plan
            a = adult(k)
            expect["inner"].append((k, f"{a}:{p[k]}" if a is not None and k in p else None))
            expect["left"].append((k, f"{a}:{p.get(k)}" if a is not None else None))
        else:
            driver.pipe("orders", i, key=k)
            a = adult(k)
            if a is not None and k in p:
                expect["orders-joined"].append((k, [i, a, p[k]]))
    for topic, records in expect.items():
        assert driver.read_key_values(topic) == records, topic


def test_global_table_join() -> None:
    app = App(None, "enrich-global")
    products = app.global_table("products", name="products")
    orders = app.stream("orders")  # keyed by customer; the product id is in the value
    orders.join_global(products, lambda customer, o: o["product"], lambda o, p: [o["qty"], p["name"]]).to(
        "named"
    )
    orders.join_global(products, lambda c, o: o["product"], lambda o, p: p and p["name"], left=True).to(
        "names"
    )
    driver = TestDriver(app)
    driver.pipe("products", {"name": "tea"}, key="p1")
    driver.pipe("orders", {"product": "p1", "qty": 2}, key="ann")
    driver.pipe("orders", {"product": "p2", "qty": 1}, key="bob")
    driver.pipe("products", {"name": "cake"}, key="p2")
    driver.pipe("products", None, key="p1")
    driver.pipe("orders", {"product": "p2", "qty": 5}, key="ann")
    driver.pipe("orders", {"product": "p1", "qty": 5}, key="cid")
    assert driver.read_key_values("named") == [("ann", [2, "tea"]), ("ann", [5, "cake"])]
    assert driver.read_key_values("names") == [("ann", "tea"), ("bob", None), ("ann", "cake"), ("cid", None)]
    assert driver.store("products").to_dict() == {"p2": {"name": "cake"}}
    assert [sub.sources for sub in driver.topology.subtopologies] == [
        {"orders": driver.topology.subtopologies[0].sources["orders"]}
    ]


def test_state_dir_keeps_the_stores_in_sqlite_files(tmp_path: Path) -> None:
    """With the app's state_dir, the driver's key-value and window stores are SQLite files, checkpointed after
    each piped record: a second driver of the same application continues from them."""

    def define() -> App:
        app = App(None, "files", state_dir=tmp_path / "state")
        words = app.stream("in").flat_map_values(lambda v: v.split())
        words.group_by(lambda k, v: v).count(name="words")
        words.group_by(lambda k, v: v).windowed_by(TumblingWindows(100, 1000)).count(name="windowed")
        return app

    records = _words(3, 60)
    model: Counter[str] = Counter()
    windows: Counter[tuple[str, int]] = Counter()
    for half in (records[:30], records[30:]):
        driver = TestDriver(define())
        for key, value, ts in half:
            driver.pipe("in", value, key=key, timestamp_ms=ts)
            model.update(value.split())
            windows.update((w, ts // 100 * 100) for w in value.split())
        words, windowed = driver.store("words"), driver.store("windowed")
        assert type(words).__name__ == "SqliteStore" and type(windowed).__name__ == "SqliteWindowStore"
        assert words.to_dict() == dict(model) and windowed.to_dict() == dict(windows)
        driver.close()
    assert sorted(p.name for p in (tmp_path / "state" / "files").rglob("*.sqlite")) == [
        "windowed.sqlite",
        "words.sqlite",
    ]
