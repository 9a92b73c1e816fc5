"""Stores and their changelog codec: restore from raw records and from Arrow columns (the bulk path)."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import msgpack
import pyarrow as pa
import pytest

import pylog.streams.sqlite as sqlite_module
from pylog.streams.runtime import _decode_column
from pylog.streams.serde import MSGPACK, MSGPACK_KEY
from pylog.streams.sqlite import SqliteSessionStore, SqliteStore, SqliteWindowStore
from pylog.streams.stores import KeyValueStore, SessionStore, WindowStore, encode_key


def test_decode_column_matches_row_by_row_decoding() -> None:
    rows = [MSGPACK.encode(v) for v in [1, "a", [1, 2], {"k": 3}, None, b"x"]]
    assert _decode_column(pa.array(rows, pa.binary()), MSGPACK) == [1, "a", [1, 2], {"k": 3}, None, b"x"]
    keys = [encode_key(k) for k in [("a", 1), "b", 7]]
    assert _decode_column(pa.array(keys, pa.binary()), MSGPACK_KEY) == [("a", 1), "b", 7]
    # a slice (an Arrow offset), nulls (tombstones), and rows that are not one object each: same answers
    assert _decode_column(pa.array(rows, pa.binary()).slice(2, 3), MSGPACK) == [[1, 2], {"k": 3}, None]
    assert _decode_column(pa.array([rows[0], None, rows[1]], pa.binary()), MSGPACK) == [1, None, "a"]
    # rows that are not one object each are decoded row by row, which refuses them (never a shifted decode)
    two_in_one = [msgpack.packb(1) + msgpack.packb(2), msgpack.packb(3)]  # 3 objects in 2 rows
    split = [b"\x92\x01", b"\x02\x05"]  # [1, 2] cut over two rows, then 5: two objects in two rows
    for rows in (two_in_one, split):
        with pytest.raises((ValueError, msgpack.UnpackException)):
            _decode_column(pa.array(rows, pa.binary()), MSGPACK)


def test_bulk_and_raw_restore_agree_with_a_model() -> None:
    rng = random.Random(3)
    keys, values, model = [], [], {}
    for _ in range(2000):
        k = f"k{rng.randrange(300)}"
        v = None if rng.random() < 0.2 else rng.randrange(10**6)
        keys.append(encode_key(k))
        values.append(None if v is None else MSGPACK.encode(v))
        if v is None:
            model.pop(k, None)
        else:
            model[k] = v
    raw = KeyValueStore("s", "c")
    raw.restore(keys, values)
    bulk = KeyValueStore("s", "c")
    for i in range(0, 2000, 700):  # batches, in order
        bulk.restore_decoded(
            _decode_column(pa.array(keys[i : i + 700], pa.binary()), MSGPACK_KEY),
            _decode_column(pa.array(values[i : i + 700], pa.binary()), MSGPACK),
        )
    assert raw.to_dict() == bulk.to_dict() == model
    assert raw.take_changes() == bulk.take_changes() == []  # a restore changes nothing to log


def test_window_store_round_trip_through_its_changelog() -> None:
    store = WindowStore("w", "c", 100)
    store.advance(250)
    for key, start, agg in [("a", 0, 3), ("a", 100, 1), (("t", 1), 200, 9)]:
        store.fold((key, start), start + 5, key, None, lambda k, v, old, agg=agg: agg)
    store.delete(("a", 0))
    changes = store.take_changes()
    again = WindowStore("w", "c", 100)
    again.restore([k for k, _ in changes], [v for _, v in changes])
    assert again.to_dict() == store.to_dict() == {("a", 100): 1, (("t", 1), 200): 9}
    assert again.stream_time == 250
    assert [(k, s) for k, s, _ in again.closing(300)] == [("a", 100), (("t", 1), 200)]


def test_sqlite_store_keeps_committed_state_only(tmp_path: Path) -> None:
    path = str(tmp_path / "state" / "0_0" / "s.sqlite")
    store = SqliteStore("s", "app-s-changelog", path, "topic-id-1")
    store.put("a", 1)
    store.put("b", [2, 3])
    assert store.get("a") == 1 and len(store) == 2 and store.to_dict() == {"a": 1, "b": [2, 3]}
    changes = store.take_changes()
    assert sorted(changes) == sorted(
        [(encode_key("a"), MSGPACK.encode(1)), (encode_key("b"), MSGPACK.encode([2, 3]))]
    )
    store.checkpoint(2)
    store.delete("a")
    store.put("c", 4)  # not checkpointed: lost by a crash (the changelog's transaction did not commit)
    assert store.to_dict() == {"b": [2, 3], "c": 4} and len(store) == 2 and "a" not in store
    store.close()

    again = SqliteStore("s", "app-s-changelog", path, "topic-id-1")
    assert again.offset == 2 and again.to_dict() == {"a": 1, "b": [2, 3]}
    assert again.get("a") == 1 and again.get("d") is None  # now in the read cache
    again.restore([encode_key("a"), encode_key("d")], [None, MSGPACK.encode(5)])  # changelog after offset 2
    again.restored(4)
    assert again.get("a") is None and again.get("d") == 5  # the restore went around the cache
    again.put("d", 6)
    again.checkpoint(5)
    assert again.get("d") == 6
    again.close()
    third = SqliteStore("s", "app-s-changelog", path, "topic-id-1")
    assert third.offset == 5 and third.to_dict() == {"b": [2, 3], "d": 6}
    third.close()

    other = SqliteStore(
        "s", "app-s-changelog", path, "topic-id-2"
    )  # the changelog was created again: rebuild
    assert other.offset == 0 and other.to_dict() == {}
    other.close()


def _rows(path: str) -> list[tuple[object, int]]:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT k, start FROM win ORDER BY start, k").fetchall()
    db.close()
    return [(MSGPACK_KEY.decode(k), start) for k, start in rows]


def _count(key: object, value: object, old: object) -> int:
    return 1 if not isinstance(old, int) else old + 1


def test_sqlite_window_store_keeps_committed_windows_only_and_closes_from_the_file(tmp_path: Path) -> None:
    path = str(tmp_path / "state" / "1_0" / "w.sqlite")
    memory = WindowStore("w", "c", 100)  # the model: the in-memory store fed the same calls
    store = SqliteWindowStore("w", "c", 100, path, "topic-id-1")
    for s in (memory, store):
        s.advance(250)
        for key, start in [("a", 0), ("a", 100), (("t", 1), 200), ("b", 0), ("a", 0)]:
            s.fold((key, start), start + 5, key, None, _count)
    assert (
        store.to_dict() == memory.to_dict() == {("a", 0): 2, ("a", 100): 1, (("t", 1), 200): 1, ("b", 0): 1}
    )
    assert _rows(path) == []  # nothing committed yet
    assert sorted(store.take_changes()) == sorted(memory.take_changes())
    store.checkpoint(5)
    assert store._data == {} and len(store) == 4  # the windows are in the file, not in memory
    assert _rows(path) == [("a", 0), ("b", 0), ("a", 100), (("t", 1), 200)]
    assert store.fetch("a") == memory.fetch("a") == [(0, 2), (100, 1)]
    assert store.entry(("a", 0)) == (2, 5) and store.get(("b", 0)) == 1 and ("z", 0) not in store

    # closing at 200: the windows ending at 100 and 200, by end then creation, from the file and the overlay
    for s in (memory, store):
        s.fold(("b", 100), 150, "b", None, _count)  # created in this interval: in the overlay only
    assert store.closes_by(100) and not store.closes_by(99)
    closed = store.closing(200)
    assert closed == memory.closing(200)
    assert [(k, s) for k, s, _ in closed] == [("a", 0), ("b", 0), ("a", 100), ("b", 100)]
    assert store.to_dict() == memory.to_dict() == {(("t", 1), 200): 1}
    assert sorted(store.take_changes()) == sorted(memory.take_changes())
    store.fold(("c", 300), 301, "c", None, _count)  # not checkpointed: an aborted interval
    store.close()
    assert _rows(path) == [("a", 0), ("b", 0), ("a", 100), (("t", 1), 200)]

    again = SqliteWindowStore("w", "c", 100, path, "topic-id-1")
    assert again.offset == 5 and again.stream_time == 250
    assert again.to_dict() == {("a", 0): 2, ("a", 100): 1, (("t", 1), 200): 1, ("b", 0): 1}
    # the changelog after offset 5 (the closings, "b"@100 created then closed, the stream time) is replayed
    again.restore_decoded(
        [("a", 0), ("b", 0), ("a", 100), ("b", 100), "\x00stream-time"], [None, None, None, None, 320]
    )
    again.restored(9)
    assert again.to_dict() == {(("t", 1), 200): 1} and again.stream_time == 320
    assert _rows(path) == [(("t", 1), 200)]  # retention: the closed windows left the file
    assert [(k, s) for k, s, _ in again.closing(300)] == [(("t", 1), 200)]
    again.checkpoint(10)
    assert _rows(path) == [] and len(again) == 0
    again.close()
    third = SqliteWindowStore("w", "c", 100, path, "topic-id-1")
    assert third.offset == 10 and third.stream_time == 320 and third.to_dict() == {}
    third.close()

    other = SqliteWindowStore("w", "c", 100, path, "topic-id-2")  # the changelog was created again: rebuild
    assert other.offset == 0 and other.stream_time == -1 and other.to_dict() == {}
    other.close()


@pytest.mark.parametrize("seed", range(6))
def test_sqlite_window_and_session_stores_follow_the_memory_stores(tmp_path: Path, seed: int) -> None:
    """Random folds, session puts and deletes, and closings with checkpoints at random points (so that the file and the
    overlay both hold windows when they close): the SQLite stores answer, close and log as the in-memory
    stores do, and a store reopened from its file after the last checkpoint equals the memory one then."""
    rng = random.Random(seed)
    wpath, spath = str(tmp_path / "w.sqlite"), str(tmp_path / "s.sqlite")
    windows, wfile = WindowStore("w", "c", 100), SqliteWindowStore("w", "c", 100, wpath, "id")
    sessions, sfile = SessionStore("s", "c", 10), SqliteSessionStore("s", "c", 10, spath, "id")
    closed_at = 0
    for step in range(400):
        key = rng.choice("abc")
        op = rng.random()
        if op < 0.45:
            start = rng.randrange(closed_at // 100 * 100, closed_at + 600, 100)
            ts = start + rng.randrange(100)
            for w in (windows, wfile):
                w.fold((key, start), ts, key, None, _count)
            s0 = rng.randrange(closed_at, closed_at + 300)
            value = (rng.randrange(10), s0 + rng.randrange(50))
            for s in (sessions, sfile):
                s.put((key, s0), value)
        elif op < 0.6:
            found = sessions.sessions(key)
            if found:
                start = rng.choice(found)[0]
                for s in (sessions, sfile):
                    s.delete((key, start))
        elif op < 0.8:
            closed_at += rng.randrange(60)
            assert wfile.closes_by(closed_at) == windows.closes_by(closed_at)
            assert wfile.closing(closed_at) == windows.closing(closed_at), step
            assert sfile.closing(closed_at) == sessions.closing(closed_at), step
        else:
            for store in (windows, wfile, sessions, sfile):
                store.advance(closed_at)
            assert sorted(wfile.take_changes()) == sorted(windows.take_changes())
            assert sorted(sfile.take_changes()) == sorted(sessions.take_changes())
            wfile.checkpoint(step)
            sfile.checkpoint(step)
        assert wfile.to_dict() == windows.to_dict() and len(wfile) == len(windows)
        assert sfile.to_dict() == sessions.to_dict() and len(sfile) == len(sessions)
        assert wfile.entry((key, 0)) == windows.entry((key, 0)) and sfile.get((key, 0)) == sessions.get(
            (key, 0)
        )
        assert sfile.sessions(key) == sessions.sessions(key) and wfile.fetch(key) == windows.fetch(key)
    wfile.checkpoint(400)
    sfile.checkpoint(400)
    wfile.close()
    sfile.close()
    wagain, sagain = (
        SqliteWindowStore("w", "c", 100, wpath, "id"),
        SqliteSessionStore("s", "c", 10, spath, "id"),
    )
    assert wagain.to_dict() == windows.to_dict() and sagain.to_dict() == sessions.to_dict()
    assert wagain.offset == sagain.offset == 400
    assert _rows(wpath) == sorted(windows.to_dict(), key=lambda w: (w[1], MSGPACK_KEY.encode(w[0])))
    wagain.close()
    sagain.close()


def test_sqlite_window_store_memory_stays_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many open windows: after each checkpoint the store holds in memory no window beyond its read cache
    (CACHE_ENTRIES, made 50 here) and no index entry, while the file has them all and reads them back."""
    monkeypatch.setattr(sqlite_module, "CACHE_ENTRIES", 50)
    path = str(tmp_path / "w.sqlite")
    store = SqliteWindowStore("w", "c", 1000, path, "id")
    for batch in range(10):
        for i in range(500):
            key = f"k{batch * 500 + i}"
            store.fold((key, 0), 5, key, None, _count)
        store.take_changes()
        store.checkpoint(batch + 1)
        assert store._data == {} and store._ends == [] and len(store._cache) <= 50
    assert len(store) == 5000 and len(_rows(path)) == 5000
    assert store.fetch("k1234") == [(0, 1)] and store.entry(("k4999", 0)) == (1, 5)
    store.fold(("k7", 0), 9, "k7", None, _count)  # a window read back from the file, not the cache
    assert store.entry(("k7", 0)) == (2, 9)
    closed = store.closing(1000)
    assert len(closed) == 5000 and len(store) == 0
    store.take_changes()
    store.checkpoint(11)
    assert _rows(path) == [] and store._data == {}
    store.close()
