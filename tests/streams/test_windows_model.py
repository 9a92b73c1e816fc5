"""Windowed aggregation against a brute-force model: random event times, out of order and late records,
tumbling, hopping and session windows, both emit modes; and the changelog restores the same store."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pylog.streams import (
    App,
    HoppingWindows,
    JoinWindows,
    SessionStore,
    SessionWindows,
    SlidingStore,
    SlidingWindows,
    TestDriver,
    TumblingWindows,
    Windowed,
    WindowStore,
)
from pylog.streams.sqlite import SqliteSessionStore, SqliteWindowStore
from pylog.streams.sqlite_buffers import SqliteJoinBufferStore, SqliteSlidingStore
from pylog.streams.stores import JoinBufferStore
from pylog.streams.windows import Windows


def _from_changelog(driver: TestDriver, empty: Any, name: str) -> Any:
    """``empty`` (an in-memory store) restored from what ``driver`` wrote to store ``name``'s changelog."""
    changelog = driver._outputs.get(f"model-{name}-changelog", [])
    empty.restore([k for k, _, _ in changelog], [v for _, v, _ in changelog])
    return empty


def _reopened(app: Any, driver: TestDriver, store: Any, name: str, expected: dict[Any, Any]) -> None:
    """Closed and read again from its file by a new driver, as a restart does, store ``name`` holds
    ``expected`` at the same stream time, in a store of the same kind."""
    driver.close()
    again = TestDriver(app)
    reopened = again.store(name)
    assert type(reopened) is type(store) and reopened.to_dict() == expected
    assert reopened.stream_time == store.stream_time
    again.close()


def _model(
    records: list[tuple[str, int, int]], size: int, advance: int, grace: int, emit: str
) -> tuple[list[tuple[Any, Any, int]], list[tuple[str, int]], dict[tuple[str, int], list[int]]]:
    """(emitted (Windowed, [count, sum], ts), late (key, value), open windows) by brute force."""
    stream_time = -1
    windows: dict[tuple[str, int], list[int]] = {}  # (key, start) -> [count, sum, max_ts, created]
    created = 0
    out: list[tuple[Any, Any, int]] = []
    late: list[tuple[str, int]] = []
    for key, value, ts in records:
        stream_time = max(stream_time, ts)
        taken = False
        for start in range(0, ts + 1, advance):
            if not start <= ts < start + size or start + size + grace <= stream_time:
                continue
            w = windows.get((key, start))
            if w is None:
                w = windows[(key, start)] = [0, 0, ts, created]
                created += 1
            w[0] += 1
            w[1] += value
            w[2] = max(w[2], ts)
            taken = True
            if emit == "update":
                out.append((Windowed(key, start, start + size), [w[0], w[1]], ts))
        if not taken:
            late.append((key, value))
        closing = sorted(
            (k for k in windows if k[1] + size + grace <= stream_time),
            key=lambda k: (k[1] + size, windows[k][3]),
        )
        for k in closing:
            w = windows.pop(k)
            if emit == "final":
                out.append((Windowed(k[0], k[1], k[1] + size), [w[0], w[1]], w[2]))
    return out, late, {k: [w[0], w[1]] for k, w in windows.items()}


@pytest.mark.parametrize("stores", ["memory", "sqlite"])
@settings(max_examples=100, deadline=None)
@given(
    records=st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 9), st.integers(0, 3000)), min_size=1, max_size=60
    ),
    size=st.integers(1, 800),
    hops=st.integers(1, 4),
    grace=st.sampled_from([0, 1, 100, 500]),
    emit=st.sampled_from(["update", "final"]),
    coarse=st.sampled_from([1, 10, 150]),
)
def test_windowed_aggregate_matches_the_model(
    stores: str, records: list[tuple[str, int, int]], size: int, hops: int, grace: int, emit: str, coarse: int
) -> None:
    with tempfile.TemporaryDirectory() as state_dir:
        _windowed_aggregate_case(
            None if stores == "memory" else state_dir, records, size, hops, grace, emit, coarse
        )


def _windowed_aggregate_case(
    state_dir: str | None,
    records: list[tuple[str, int, int]],
    size: int,
    hops: int,
    grace: int,
    emit: str,
    coarse: int,
) -> None:
    records = [(k, v, ts // coarse) for k, v, ts in records]  # coarse: many records at the same times
    advance = max(1, size // hops)
    windows: Windows = (
        TumblingWindows(size, grace) if advance == size else HoppingWindows(size, advance, grace)
    )
    app = App(None, "model", state_dir=state_dir)
    agg = app.stream("in").group_by_key().windowed_by(windows, emit=emit, late_topic="late")
    agg.aggregate(lambda: [0, 0], lambda k, v, a: [a[0] + 1, a[1] + v], name="w").to_stream().to("out")
    driver = TestDriver(app)
    for key, value, ts in records:
        driver.pipe("in", value, key=key, timestamp_ms=ts)

    out, late, open_windows = _model(records, windows.size_ms, windows.advance_ms, grace, emit)
    assert [tuple(r) for r in driver.read_output("out")] == out
    assert driver.read_key_values("late") == late
    assert driver.metrics().get("late-records", 0) == len(late)
    store = driver.store("w")
    assert store.to_dict() == open_windows
    restored = _from_changelog(driver, WindowStore("w", None, windows.size_ms), "w")
    assert restored.to_dict() == open_windows
    assert isinstance(store, WindowStore) and restored.stream_time == store.stream_time == max(
        r[2] for r in records
    )
    if state_dir is not None:  # the file holds the windows (checkpointed after each record), not memory
        assert isinstance(store, SqliteWindowStore) and store._data == {}
        _reopened(app, driver, store, "w", open_windows)


def _session_model(
    records: list[tuple[str, int, int]], gap: int, grace: int, emit: str
) -> tuple[list[tuple[Any, Any, int]], list[tuple[str, int]], dict[tuple[str, int, int], list[int]]]:
    """Sessions by brute force: (emitted, late, open sessions {(key, start, end): [count, sum]})."""
    stream_time = -1
    sessions: list[list[Any]] = []  # [key, start, end, count, sum, put order]
    puts = 0
    out: list[tuple[Any, Any, int]] = []
    late: list[tuple[str, int]] = []
    for key, value, ts in records:
        stream_time = max(stream_time, ts)
        close_before = stream_time - gap - grace
        found = sorted(
            (
                s
                for s in sessions
                if s[0] == key and s[2] >= ts - gap and s[1] <= ts + gap and s[2] >= close_before
            ),
            key=lambda s: s[1],
        )
        start = min([ts, *(s[1] for s in found)])
        end = max([ts, *(s[2] for s in found)])
        if end < close_before:
            late.append((key, value))
        else:
            for s in found:
                sessions.remove(s)
                if emit == "update":
                    out.append((Windowed(key, s[1], s[2]), None, ts))
            count = sum(s[3] for s in found) + 1
            total = sum(s[4] for s in found) + value
            sessions.append([key, start, end, count, total, puts])
            puts += 1
            if emit == "update":
                out.append((Windowed(key, start, end), [count, total], ts))
        for s in sorted((s for s in sessions if s[2] < close_before), key=lambda s: (s[2], s[5])):
            sessions.remove(s)
            if emit == "final":
                out.append((Windowed(s[0], s[1], s[2]), [s[3], s[4]], s[2]))
    return out, late, {(s[0], s[1], s[2]): [s[3], s[4]] for s in sessions}


@pytest.mark.parametrize("stores", ["memory", "sqlite"])
@settings(max_examples=100, deadline=None)
@given(
    records=st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 9), st.integers(0, 3000)), min_size=1, max_size=60
    ),
    gap=st.sampled_from([0, 1, 50, 300]),
    grace=st.sampled_from([0, 1, 100, 500]),
    emit=st.sampled_from(["update", "final"]),
    coarse=st.sampled_from([1, 10, 150]),
)
@example(  # a session put again with the same end closes after one put in between (order of equal ends)
    records=[("a", 0, 0), ("b", 0, 0), ("a", 0, 0), ("a", 0, 1)], gap=0, grace=0, emit="final", coarse=1
)
def test_session_windows_match_the_model(
    stores: str, records: list[tuple[str, int, int]], gap: int, grace: int, emit: str, coarse: int
) -> None:
    with tempfile.TemporaryDirectory() as state_dir:
        _session_case(None if stores == "memory" else state_dir, records, gap, grace, emit, coarse)


def _session_case(
    state_dir: str | None, records: list[tuple[str, int, int]], gap: int, grace: int, emit: str, coarse: int
) -> None:
    records = [(k, v, ts // coarse) for k, v, ts in records]  # coarse: many records at the same times
    app = App(None, "model", state_dir=state_dir)
    sessions = (
        app.stream("in").group_by_key().windowed_by(SessionWindows(gap, grace), emit=emit, late_topic="late")
    )
    sessions.aggregate(
        lambda: [0, 0],
        lambda k, v, a: [a[0] + 1, a[1] + v],
        lambda k, a, b: [a[0] + b[0], a[1] + b[1]],
        name="s",
    ).to_stream().to("out")
    driver = TestDriver(app)
    for key, value, ts in records:
        driver.pipe("in", value, key=key, timestamp_ms=ts)

    out, late, open_sessions = _session_model(records, gap, grace, emit)
    assert [tuple(r) for r in driver.read_output("out")] == out
    assert driver.read_key_values("late") == late
    assert driver.metrics().get("late-records", 0) == len(late)
    store = driver.store("s")
    assert store.to_dict() == open_sessions
    restored = _from_changelog(driver, SessionStore("s", None, gap), "s")
    assert restored.to_dict() == open_sessions
    assert isinstance(store, SessionStore) and restored.stream_time == store.stream_time
    if state_dir is not None:  # the file holds the sessions (checkpointed after each record), not memory
        assert isinstance(store, SqliteSessionStore) and store._data == {}
        _reopened(app, driver, store, "s", open_sessions)


@pytest.mark.parametrize("stores", ["memory", "sqlite"])
@settings(max_examples=100, deadline=None)
@given(
    records=st.lists(
        st.tuples(st.sampled_from("LR"), st.sampled_from("ab"), st.integers(0, 9), st.integers(0, 600)),
        min_size=1,
        max_size=50,
    ),
    diff=st.sampled_from([0, 1, 3, 30, 200]),
    grace=st.sampled_from([0, 1, 10, 100]),
    coarse=st.sampled_from([1, 30]),
    how=st.sampled_from(["inner", "left", "outer"]),
)
@example(  # R@50 must outlive stream time 95: L@70, not late (>= 95 - 30), still joins it
    records=[("L", "a", 0, 80), ("R", "a", 1, 50), ("L", "a", 2, 95), ("L", "a", 3, 70)],
    diff=30,
    grace=0,
    coarse=1,
    how="inner",
)
def test_stream_stream_join_matches_the_model(
    stores: str, records: list[tuple[str, str, int, int]], diff: int, grace: int, coarse: int, how: str
) -> None:
    with tempfile.TemporaryDirectory() as state_dir:
        _join_case(None if stores == "memory" else state_dir, records, diff, grace, coarse, how)


def _join_case(
    state_dir: str | None,
    records: list[tuple[str, str, int, int]],
    diff: int,
    grace: int,
    coarse: int,
    how: str,
) -> None:
    records = [(side, k, v, ts // coarse) for side, k, v, ts in records]  # coarse: equal and close times
    app = App(None, "model", state_dir=state_dir)
    left, right = app.stream("left"), app.stream("right")
    joiner = lambda lv, rv: [lv, rv]  # noqa: E731
    if how == "outer":
        left.outer_join(right, joiner, JoinWindows(diff, grace), name="j").to("out")
    else:
        left.join(right, joiner, JoinWindows(diff, grace), left=how == "left", name="j").to("out")
    driver = TestDriver(app)
    stream_time = -1
    seen: list[list[Any]] = []  # [side, key, value, ts, joined, purged]
    out: list[tuple[Any, Any, int]] = []
    late = 0
    for side, key, value, ts in records:
        driver.pipe("left" if side == "L" else "right", value, key=key, timestamp_ms=ts)
        stream_time = max(stream_time, ts)
        if ts < stream_time - diff - grace:
            late += 1
        else:
            met = False
            for other in seen:
                if other[0] != side and other[1] == key and abs(ts - other[3]) <= diff and not other[5]:
                    out.append(
                        (key, [value, other[2]] if side == "L" else [other[2], value], max(ts, other[3]))
                    )
                    other[4] = met = True
            seen.append([side, key, value, ts, met, False])
        horizon = stream_time - 2 * diff - grace
        for purged_side in ("L", "R"):  # the left side's unjoined records first, by time then arrival
            gone = sorted(
                (r for r in seen if r[0] == purged_side and not r[5] and r[3] < horizon), key=lambda r: r[3]
            )
            for r in gone:
                r[5] = True
                if not r[4] and (how == "outer" or (how == "left" and purged_side == "L")):
                    out.append((r[1], [r[2], None] if purged_side == "L" else [None, r[2]], r[3]))
    assert [tuple(r) for r in driver.read_output("out")] == out
    assert driver.metrics().get("late-records", 0) == late
    for name in ("j-left", "j-right"):  # the buffers come back from their changelogs
        store = driver.store(name)
        restored = _from_changelog(driver, JoinBufferStore(name, None), name)
        assert restored.to_dict() == store.to_dict()
        assert isinstance(store, JoinBufferStore) and restored.stream_time == store.stream_time
        if state_dir is not None:  # the file holds the records (checkpointed after each one), not memory
            assert isinstance(store, SqliteJoinBufferStore) and store._data == {} and store._by_key == {}
    if state_dir is not None:
        expected = {name: driver.store(name).to_dict() for name in ("j-left", "j-right")}
        driver.close()
        again = TestDriver(app)  # the files read again, as a restart does
        assert {name: again.store(name).to_dict() for name in expected} == expected
        again.close()


def _sliding_model(
    records: list[tuple[str, int, int]], d: int, grace: int, emit: str
) -> tuple[list[tuple[Any, Any, int]], list[tuple[str, int]], dict[tuple[str, int], list[int]]]:
    """Sliding windows by brute force: every aggregate recomputed from all accepted records."""
    stream_time = -1
    accepted: list[tuple[str, int, int]] = []  # (key, value, ts) in arrival order
    windows: dict[tuple[str, int], int] = {}  # (key, start) -> creation order
    created = 0
    out: list[tuple[Any, Any, int]] = []
    late: list[tuple[str, int]] = []

    def agg(key: str, start: int) -> tuple[list[int], int]:
        inside = [(v, t) for k, v, t in accepted if k == key and start <= t <= start + d]
        return [len(inside), sum(v for v, _ in inside)], max(t for _, t in inside)

    for key, value, ts in records:
        stream_time = max(stream_time, ts)
        close_before = stream_time - grace
        if ts + d < close_before:
            late.append((key, value))
        else:
            changed = {s for (k, s) in windows if k == key and s <= ts <= s + d and s + d >= close_before}
            accepted.append((key, value, ts))
            candidates = {ts - d}
            if any(k == key and ts < t <= ts + 1 + d for k, _, t in accepted):
                candidates.add(ts + 1)
            candidates |= {t + 1 for k, _, t in accepted if k == key and ts - 1 - d <= t <= ts - 1}
            for s in sorted(candidates):
                if s + d >= close_before and (key, s) not in windows:
                    windows[(key, s)] = created
                    created += 1
                    changed.add(s)
            if emit == "update":
                out += [(Windowed(key, s, s + d), agg(key, s)[0], ts) for s in sorted(changed)]
        closing = sorted(
            (w for w in windows if w[1] + d < close_before), key=lambda w: (w[1] + d, windows[w])
        )
        for k, s in closing:
            del windows[(k, s)]
            if emit == "final":
                value_, max_ts = agg(k, s)
                out.append((Windowed(k, s, s + d), value_, max_ts))
    return out, late, {w: agg(*w)[0] for w in windows}


@pytest.mark.parametrize("stores", ["memory", "sqlite"])
@settings(max_examples=100, deadline=None)
@given(
    records=st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 9), st.integers(0, 3000)), min_size=1, max_size=50
    ),
    d=st.sampled_from([0, 1, 50, 300]),
    grace=st.sampled_from([0, 1, 100, 500]),
    emit=st.sampled_from(["update", "final"]),
    coarse=st.sampled_from([1, 10, 150]),
)
@example(  # b@9's windows are all closed at stream time 60, but the window just after it, [10, 60], is not
    records=[("b", 0, 9), ("a", 0, 60), ("b", 0, 10)], d=50, grace=0, emit="final", coarse=1
)
def test_sliding_windows_match_the_model(
    stores: str, records: list[tuple[str, int, int]], d: int, grace: int, emit: str, coarse: int
) -> None:
    with tempfile.TemporaryDirectory() as state_dir:
        _sliding_case(None if stores == "memory" else state_dir, records, d, grace, emit, coarse)


def _sliding_case(
    state_dir: str | None, records: list[tuple[str, int, int]], d: int, grace: int, emit: str, coarse: int
) -> None:
    records = [(k, v, ts // coarse) for k, v, ts in records]
    app = App(None, "model", state_dir=state_dir)
    sliding = (
        app.stream("in").group_by_key().windowed_by(SlidingWindows(d, grace), emit=emit, late_topic="late")
    )
    sliding.aggregate(lambda: [0, 0], lambda k, v, a: [a[0] + 1, a[1] + v], name="s").to_stream().to("out")
    driver = TestDriver(app)
    for key, value, ts in records:
        driver.pipe("in", value, key=key, timestamp_ms=ts)
    out, late, open_windows = _sliding_model(records, d, grace, emit)
    assert [tuple(r) for r in driver.read_output("out")] == out
    assert driver.read_key_values("late") == late
    store = driver.store("s")
    assert store.to_dict() == open_windows
    restored = _from_changelog(driver, SlidingStore("s", None, d), "s")
    assert restored.to_dict() == open_windows
    assert isinstance(store, SlidingStore) and restored.stream_time == store.stream_time
    if state_dir is not None:  # the file holds the windows and records (checkpointed after each record)
        assert isinstance(store, SqliteSlidingStore) and store._data == {} and store._records == {}
        _reopened(app, driver, store, "s", open_windows)
