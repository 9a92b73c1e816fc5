"""Table.suppress: until_window_closes (the windows once each, when they close) and until_time_limit with a
bounded buffer, against brute-force models; the buffer restored from its changelog and through the runtime
under exactly-once."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from streams_helpers import committed_records, suppress_model, wait_for

import pylog
from pylog.errors import ConfigError, IllegalStateError
from pylog.streams import App, TestDriver, TumblingWindows, Windowed
from pylog.streams.sqlite_buffers import SqliteSuppressBuffer
from pylog.streams.stores import SuppressBuffer


def _records(seed: int, n: int, keys: int = 6, spread: int = 400) -> list[tuple[str, int | None, int]]:
    """(key, value or None, timestamp): mostly forward in time, some out of order."""
    rng = random.Random(seed)
    out: list[tuple[str, int | None, int]] = []
    t = 0
    for i in range(n):
        t += rng.randrange(0, 40)
        ts = max(0, t - rng.randrange(spread)) if rng.random() < 0.2 else t
        out.append((f"k{rng.randrange(keys)}", None if rng.random() < 0.1 else i, ts))
    return out


def _suppressed_app(
    limit: int, max_records: int | None, app_id: str = "suppress", log: Any = None, state_dir: Any = None
) -> App:
    app = App(log, app_id, commit_interval_ms=20, state_dir=state_dir)
    app.table("in", name="in").suppress(
        until_time_limit=limit, max_records=max_records, name="held"
    ).to_stream().to("out")
    return app


@pytest.mark.parametrize("stores", ["memory", "sqlite"])
@pytest.mark.parametrize(
    ("seed", "limit", "max_records"), [(1, 100, None), (2, 0, None), (3, 250, 3), (4, 50, 1)]
)
def test_until_time_limit_matches_a_model(
    tmp_path: Path, stores: str, seed: int, limit: int, max_records: int | None
) -> None:
    records = _records(seed, 400)
    state_dir = tmp_path / "state" if stores == "sqlite" else None
    driver = TestDriver(_suppressed_app(limit, max_records, state_dir=state_dir))
    for key, value, ts in records:
        driver.pipe("in", value, key=key, timestamp_ms=ts)
    got = [(r.key, r.value, r.timestamp_ms) for r in driver.read_output("out")]
    assert got == suppress_model(records, limit, max_records)
    # nothing is lost: what was forwarded last per key, then what is still held, is the table
    table: dict[str, int | None] = {}
    for key, value, _ in records:
        table[key] = value
    seen: dict[str, int | None] = {k: v for k, v, _ in got}
    seen.update(driver.store("held").to_dict())
    assert seen == table
    if max_records is not None:
        assert len(driver.store("held")) <= max_records
    if state_dir is not None:  # the file holds the buffer (checkpointed after each record), not memory
        held = driver.store("held")
        assert isinstance(held, SqliteSuppressBuffer) and held._data == {} and held._heap == []
        expected, size = held.to_dict(), held.bytes
        driver.close()
        again = TestDriver(_suppressed_app(limit, max_records, state_dir=state_dir))
        assert again.store("held").to_dict() == expected and again.store("held").bytes == size  # type: ignore[attr-defined]
        again.close()


def test_the_buffer_is_restored_from_its_changelog_in_order() -> None:
    records = _records(5, 300)
    driver = TestDriver(_suppressed_app(300, None))
    for key, value, ts in records[:200]:
        driver.pipe("in", value, key=key, timestamp_ms=ts)
    changelog = driver.read_output("suppress-held-changelog")
    held = driver.store("held")
    assert isinstance(held, SuppressBuffer)
    restored = SuppressBuffer("held", None)
    restored.restore(
        [pylog.streams.stores.encode_key(r.key) for r in changelog],
        [None if r.value is None else pylog.streams.serde.MSGPACK.serialize(r.value) for r in changelog],
    )
    assert restored.to_dict() == held.to_dict()
    assert restored.stream_time == held.stream_time
    assert restored.bytes == held.bytes
    order = []
    while restored.oldest() is not None:
        order.append(restored.evict())
    expected = []
    while held.oldest() is not None:
        expected.append(held.evict())
    assert order == expected and expected


def test_a_full_buffer_with_when_full_shutdown_stops_the_application() -> None:
    app = App(None, "suppress")
    app.table("in").suppress(until_time_limit=10_000, max_bytes=40, when_full="shutdown").to_stream().to(
        "out"
    )
    driver = TestDriver(app)
    driver.pipe("in", "x" * 10, key="a", timestamp_ms=0)
    with pytest.raises(IllegalStateError, match="full"):
        driver.pipe("in", "y" * 30, key="b", timestamp_ms=1)


def test_suppress_arguments_are_checked() -> None:
    app = App(None, "suppress")
    table = app.table("in")
    windowed = app.stream("s").group_by_key().windowed_by(TumblingWindows(100)).count()
    for bad in (
        lambda: table.suppress(),
        lambda: table.suppress(until_window_closes=True),
        lambda: table.suppress(until_time_limit=-1),
        lambda: table.suppress(until_time_limit=10, max_records=0),
        lambda: table.suppress(until_time_limit=10, when_full="drop"),
        lambda: windowed.suppress(until_window_closes=True, max_records=3),
    ):
        with pytest.raises(ConfigError):
            bad()
    suppressed = table.suppress(until_time_limit=10)
    with pytest.raises(ConfigError, match="suppressed"):
        app.stream("s2").join(suppressed, lambda a, b: a)
    with pytest.raises(ConfigError, match="suppressed"):
        table.join(suppressed.filter(lambda k, v: True), lambda a, b: a)


@pytest.mark.parametrize("stores", ["memory", "sqlite"])
def test_until_time_limit_of_a_windowed_table_matches_a_model(tmp_path: Path, stores: str) -> None:
    rng = random.Random(12)
    records = [(f"k{rng.randrange(3)}", i * 7 + rng.randrange(0, 60)) for i in range(300)]
    app = App(None, "windowed", state_dir=tmp_path / "state" if stores == "sqlite" else None)
    counts = app.stream("in").group_by_key().windowed_by(TumblingWindows(100, grace=1_000)).count(name="c")
    counts.to_stream().to("updates")
    counts.suppress(until_time_limit=40, max_records=5, name="held").to_stream().to("out")
    driver = TestDriver(app)
    for key, ts in records:
        driver.pipe("in", 1, key=key, timestamp_ms=ts)
    updates = [(r.key, r.value, r.timestamp_ms) for r in driver.read_output("updates")]
    got = [(r.key, r.value, r.timestamp_ms) for r in driver.read_output("out")]
    assert got == suppress_model(updates, 40, 5)
    assert all(isinstance(k, Windowed) for k, _, _ in got)
    # restored, a held window comes back as a plain tuple: the node makes it a Windowed again
    changelog = driver.read_output("windowed-held-changelog")
    restored = SuppressBuffer("held", None)
    restored.restore(
        [pylog.streams.stores.encode_key(r.key) for r in changelog],
        [None if r.value is None else pylog.streams.serde.MSGPACK.serialize(r.value) for r in changelog],
    )
    held = driver.store("held").to_dict()
    assert held and {Windowed(*k): v for k, v in restored.to_dict().items()} == held
    assert isinstance(driver.store("held"), SqliteSuppressBuffer) == (stores == "sqlite")
    driver.close()


def test_until_window_closes_is_emit_final_beside_the_updates() -> None:
    rng = random.Random(9)
    records = [(f"k{rng.randrange(3)}", rng.randrange(0, 2_000)) for _ in range(300)]
    final = App(None, "final")
    final.stream("in").group_by_key().windowed_by(
        TumblingWindows(100, grace=50), emit="final"
    ).count().to_stream().to("out")
    both = App(None, "both")
    counts = both.stream("in").group_by_key().windowed_by(TumblingWindows(100, grace=50)).count(name="c")
    counts.to_stream().to("updates")
    closed = counts.suppress(until_window_closes=True)
    assert closed.suppress(until_window_closes=True) is closed
    closed.to_stream().to("out")
    drivers = [TestDriver(final), TestDriver(both)]
    for driver in drivers:
        for key, ts in records:
            driver.pipe("in", 1, key=key, timestamp_ms=ts)
    out = drivers[0].read_output("out")
    assert drivers[1].read_output("out") == out
    updates = drivers[1].read_output("updates")
    assert len(updates) == 300 - drivers[1].metrics().get("late-records", 0)
    # each window once, with the last update it had
    last: dict[Any, Any] = {}
    for r in updates:
        last[r.key] = r.value
    assert out, "some windows closed"
    for r in out:
        assert last[r.key] == r.value


@pytest.mark.parametrize("stores", ["memory", "sqlite"])
def test_until_time_limit_in_the_runtime_exactly_once_with_a_restart(tmp_path: Path, stores: str) -> None:
    records = _records(11, 400, keys=20)
    expected = suppress_model(records, 150, 8)
    state_dir = tmp_path / "state" if stores == "sqlite" else None
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("in", partitions=1)
        log.create_topic("out", partitions=1)
        producer = log.producer()
        for half in (records[:230], records[230:]):
            app = _suppressed_app(150, 8, "suppress-rt", log, state_dir)
            app.start(threads=1)
            for key, value, ts in half:
                producer.send("in", value, key=key, timestamp_ms=ts)
            producer.flush()
            wait_for(
                lambda a=app: sum(a.lag().values()) == 0 and bool(log.group_offsets("suppress-rt")), "the app"
            )
            restored = app.metrics().get("restored-records", 0)
            app.close()
        producer.close()
        got = [(r.key.decode(), r.value, r.timestamp) for r in committed_records(log, "out")]
        assert got == expected
    if state_dir is None:
        assert restored > 0  # the second run read the buffer back from its changelog
    else:  # the second run opened the file the first one left, at the changelog's end: nothing to read
        assert restored == 0 and [p.name for p in state_dir.rglob("*.sqlite")].count("held.sqlite") == 1
