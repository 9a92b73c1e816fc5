"""Table.group_by and its aggregations (Kafka's KGroupedTable): random upserts and deletions of a table, and
after every step the grouped aggregates equal a recomputation from the table as it now is."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from streams_helpers import committed_records, wait_for

import pylog
from pylog.streams import App, TestDriver
from pylog.streams.admin import read_store

CITIES = ["lyon", "paris", "nice", "brest"]


def _define(app: App) -> None:
    users = app.table("users", name="users")
    by_city = users.group_by(lambda key, user: (user["city"], user["age"]))
    by_city.count(name="per-city").to_stream().to("city-counts")
    by_city.reduce(lambda total, age: total + age, lambda total, age: total - age, name="age-sum")
    by_city.aggregate(
        lambda: [0, 0],
        lambda city, age, agg: [agg[0] + 1, agg[1] + age],
        lambda city, age, agg: None if agg[0] == 1 else [agg[0] - 1, agg[1] - age],
        name="stats",
    ).to_stream().to("city-stats")


def _steps(seed: int, n: int) -> list[tuple[str, dict[str, Any] | None]]:
    rng = random.Random(seed)
    out: list[tuple[str, dict[str, Any] | None]] = []
    for _ in range(n):
        key = f"u{rng.randrange(12)}"
        if rng.random() < 0.2:
            out.append((key, None))
        else:
            out.append((key, {"city": rng.choice(CITIES), "age": rng.randrange(1, 90)}))
    return out


def _model(table: dict[str, dict[str, Any]]) -> tuple[Counter[str], Counter[str], dict[str, list[int]]]:
    counts: Counter[str] = Counter()
    sums: Counter[str] = Counter()
    for user in table.values():
        counts[user["city"]] += 1
        sums[user["city"]] += user["age"]
    return counts, sums, {c: [counts[c], sums[c]] for c in counts}


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_grouped_table_aggregates_match_a_recomputation_after_every_step(seed: int) -> None:
    app = App(None, "groupby")
    _define(app)
    driver = TestDriver(app)
    table: dict[str, dict[str, Any]] = {}
    ever: set[str] = set()
    for key, user in _steps(seed, 300):
        driver.pipe("users", user, key=key)
        if user is None:
            table.pop(key, None)
        else:
            table[key] = user
            ever.add(user["city"])
        counts, sums, stats = _model(table)
        # count and reduce keep a group whose rows all left (0), as Kafka does; aggregate's subtractor
        # returns None for the last row, which deletes the group
        assert driver.store("per-city").to_dict() == {c: counts[c] for c in ever}
        assert driver.store("age-sum").to_dict() == {c: sums[c] for c in ever}
        assert driver.store("stats").to_dict() == stats
    last: dict[str, Any] = {}
    for k, v in driver.read_key_values("city-stats"):
        last[k] = v
    assert {k: v for k, v in last.items() if v is not None} == _model(table)[2]


def test_an_update_within_its_group_is_one_repartition_record() -> None:
    app = App(None, "groupby")
    _define(app)
    driver = TestDriver(app)
    driver.pipe("users", {"city": "lyon", "age": 30}, key="ann")
    driver.pipe("users", {"city": "lyon", "age": 31}, key="ann")  # same group: [30, 31] in one record
    driver.pipe("users", {"city": "nice", "age": 31}, key="ann")  # moves: lyon [31, None], nice [None, 31]
    driver.pipe("users", None, key="ann")  # leaves: nice [31, None]
    driver.pipe("users", None, key="bob")  # was never there: nothing
    assert driver.read_key_values("city-counts") == [
        ("lyon", 1),
        ("lyon", 1),
        ("lyon", 0),
        ("nice", 1),
        ("nice", 0),
    ]
    assert driver.read_key_values("city-stats") == [
        ("lyon", [1, 30]),
        ("lyon", [1, 31]),
        ("lyon", None),
        ("nice", [1, 31]),
        ("nice", None),
    ]
    assert driver.store("stats-group-by").to_dict() == {}


def test_a_row_mapped_to_no_group_leaves_its_group() -> None:
    app = App(None, "groupby")
    app.table("users", name="users").group_by(lambda k, v: (v.get("team"), 1)).count(name="teams")
    driver = TestDriver(app)
    driver.pipe("users", {"team": "red"}, key="ann")
    driver.pipe("users", {"team": None}, key="ann")
    assert driver.store("teams").to_dict() == {"red": 0}


@pytest.mark.parametrize("stores", ["memory", "sqlite"])
def test_table_group_by_in_the_runtime_exactly_once_with_a_restart(tmp_path: Path, stores: str) -> None:
    state_dir = tmp_path / "state" if stores == "sqlite" else None
    steps = _steps(7, 400)
    with pylog.open(tmp_path / "log") as log:
        for name in ("users", "city-counts", "city-stats"):
            log.create_topic(name, partitions=3)
        producer = log.producer()
        table: dict[str, dict[str, Any]] = {}
        for half in (steps[:200], steps[200:]):
            app = App(log, "groupby", commit_interval_ms=20, state_dir=state_dir)
            _define(app)
            app.start(threads=2)
            for key, user in half:
                producer.send("users", user, key=key)
                if user is None:
                    table.pop(key, None)
                else:
                    table[key] = user
            producer.flush()
            wait_for(
                lambda a=app: sum(a.lag().values()) == 0 and bool(log.group_offsets("groupby")), "the app"
            )
            app.close()
        producer.close()
        stats = _model(table)[2]
        assert read_store(log, "groupby", "stats") == stats
        counts = read_store(log, "groupby", "per-city")
        assert {c: n for c, n in counts.items() if n} == dict(_model(table)[0])
        last: dict[str, Any] = {}
        for r in committed_records(log, "city-stats"):
            last[r.key.decode()] = r.value
        assert {k: v for k, v in last.items() if v is not None} == stats
        assert "groupby-stats-repartition" in log.topics()
        assert "groupby-stats-group-by-changelog" in log.topics()
