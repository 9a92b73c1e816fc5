"""The SQLite sliding-window, join-buffer and suppression-buffer stores against the in-memory stores: random
operations with checkpoints at random points (so that reads and closings mix the file and the overlay), the
same answers and the same changelog records, the file reopened after a checkpoint; and a store of many
entries whose Python-side state stays small."""

from __future__ import annotations

import gc
import random
from pathlib import Path
from typing import Any

import pytest

from pylog.streams.serde import MSGPACK
from pylog.streams.sqlite_buffers import (
    SqliteJoinBufferStore,
    SqliteSlidingStore,
    SqliteSubscriptionStore,
    SqliteSuppressBuffer,
)
from pylog.streams.stores import (
    JoinBufferStore,
    SlidingStore,
    SubscriptionStore,
    SuppressBuffer,
    decode_key,
    encode_key,
)


def _changes(store: Any, changelog: list[tuple[bytes, bytes | None]]) -> dict[Any, Any]:
    """The store's changelog records (taken, and added to ``changelog``), decoded."""
    records = store.take_changes()
    changelog.extend(records)
    return {decode_key(k): None if v is None else MSGPACK.decode(v) for k, v in records}


def _restart(fresh: Any, changelog: list[tuple[bytes, bytes | None]]) -> Any:
    """An in-memory store restored from the whole changelog, as a restart builds it."""
    fresh.restore([k for k, _ in changelog], [v for _, v in changelog])
    return fresh


def _both(memory: Any, file: Any, call: str, *args: Any) -> Any:
    expected = getattr(memory, call)(*args)
    got = getattr(file, call)(*args)
    assert got == expected, call
    return got


@pytest.mark.parametrize("seed", range(5))
def test_sqlite_sliding_store_follows_the_memory_store(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path, d = str(tmp_path / "s.sqlite"), 20
    memory, file = SlidingStore("s", "c", d), SqliteSlidingStore("s", "c", d, path, "id")
    time, changelog = 0, []  # type: ignore[var-annotated]
    for step in range(600):
        key = rng.choice("abcd")
        time += rng.randrange(0, 8)
        ts = max(0, time - rng.randrange(0, 30))
        _both(memory, file, "advance", ts)
        r = rng.random()
        if r < 0.35:
            _both(memory, file, "add_record", key, ts, rng.randrange(100))
        elif r < 0.55:
            starts = _both(memory, file, "window_starts", key)
            if starts and rng.random() < 0.5:
                start = rng.choice(starts)
                agg, max_ts, created = _both(memory, file, "window", key, start)
                _both(memory, file, "set_window", key, start, agg + 1, max(max_ts, ts), created)
            else:
                created = _both(memory, file, "next_created")
                _both(memory, file, "set_window", key, ts - d, rng.randrange(9), ts, created)
        elif r < 0.7:
            _both(memory, file, "records", key, ts - d, ts + d)
        elif r < 0.85:
            _both(memory, file, "closing", memory.stream_time - 15)
            _both(memory, file, "purge", memory.stream_time - 15 - d - 1)
        else:
            assert sorted(file.items()) == sorted(memory.items())
        if rng.random() < 0.1:
            assert _changes(file, []) == _changes(memory, changelog)
            file.checkpoint(step)
            assert file._data == {} and file._records == {} and file._windows == {}
            if rng.random() < 0.3:
                file.close()
                file = SqliteSlidingStore("s", "c", d, path, "id")
                memory = _restart(SlidingStore("s", "c", d), changelog)
                assert file.stream_time == memory.stream_time and file._seq == memory._seq
    assert sorted(file.items()) == sorted(memory.items())
    assert len(file) == len(memory)
    file.close()


@pytest.mark.parametrize("seed", range(5))
def test_sqlite_join_buffer_follows_the_memory_store(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = str(tmp_path / "j.sqlite")
    memory, file = JoinBufferStore("j", "c"), SqliteJoinBufferStore("j", "c", path, "id")
    time, changelog = 0, []  # type: ignore[var-annotated]
    for step in range(600):
        key = rng.choice("abc")
        time += rng.randrange(0, 6)
        ts = max(0, time - rng.randrange(0, 20))
        _both(memory, file, "advance", ts)
        r = rng.random()
        if r < 0.4:
            _both(memory, file, "add", key, ts, rng.randrange(100), rng.random() < 0.2)
        elif r < 0.7:
            for t, seq, _ in _both(memory, file, "matches", key, ts - 10, ts + 10):
                if rng.random() < 0.5:
                    _both(memory, file, "mark", key, t, seq)
        elif r < 0.9:
            _both(memory, file, "purge", memory.stream_time - 25)
        else:
            assert file.to_dict() == memory.to_dict()
        if rng.random() < 0.1:
            assert _changes(file, []) == _changes(memory, changelog)
            file.checkpoint(step)
            assert file._data == {} and file._by_key == {} and file._times == []
            if rng.random() < 0.3:
                file.close()
                file = SqliteJoinBufferStore("j", "c", path, "id")
                memory = _restart(JoinBufferStore("j", "c"), changelog)
                assert file.stream_time == memory.stream_time and file._next_seq == memory._next_seq
    assert file.to_dict() == memory.to_dict() and len(file) == len(memory)
    file.close()


@pytest.mark.parametrize("seed", range(5))
def test_sqlite_suppress_buffer_follows_the_memory_buffer(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = str(tmp_path / "b.sqlite")
    memory, file = SuppressBuffer("b", "c"), SqliteSuppressBuffer("b", "c", path, "id")
    time, changelog = 0, []  # type: ignore[var-annotated]
    for step in range(800):
        time += rng.randrange(0, 6)
        ts = max(0, time - rng.randrange(0, 20))
        _both(memory, file, "advance", ts)
        if rng.random() < 0.6:
            value = None if rng.random() < 0.1 else "x" * rng.randrange(0, 20)
            _both(memory, file, "buffer", f"k{rng.randrange(40)}", value, ts)
        else:
            while (oldest := _both(memory, file, "oldest")) is not None and oldest <= memory.stream_time - 30:
                _both(memory, file, "evict")
        assert file.bytes == memory.bytes and len(file) == len(memory)
        if rng.random() < 0.1:
            assert _changes(file, []) == _changes(memory, changelog)
            file.checkpoint(step)
            assert file._data == {} and file._heap == []
            if rng.random() < 0.3:
                file.close()
                file = SqliteSuppressBuffer("b", "c", path, "id")
                memory = _restart(SuppressBuffer("b", "c"), changelog)
                assert file.stream_time == memory.stream_time and file.bytes == memory.bytes
    assert file.to_dict() == memory.to_dict() and len(file) == len(memory)
    while _both(memory, file, "oldest") is not None:  # the whole eviction order agrees
        _both(memory, file, "evict")
    file.close()


def test_sqlite_join_buffer_larger_than_its_memory(tmp_path: Path) -> None:
    """20,000 buffered records written in 20 checkpoints: after each, the store holds no entry in Python
    (the overlay and its indexes are empty) while the file holds them all; matches and the purge read the
    file, and purging them all empties it."""
    store = SqliteJoinBufferStore("j", "c", str(tmp_path / "j.sqlite"), "id")
    for batch in range(20):
        for i in range(1000):
            store.advance(batch * 1000 + i)
            store.add(f"k{i % 500}", batch * 1000 + i, ["v", i])
        store.take_changes()
        store.checkpoint(batch)
        assert store._data == {} and store._by_key == {} and store._times == [] and not store._dirty
    gc.collect()
    assert len(store) == 20_000
    assert [ts for ts, _, _ in store.matches("k7", 0, 2000)] == [7, 507, 1007, 1507]
    unjoined = store.purge(10_000)
    assert len(unjoined) == 10_000 and len(store._data) == 10_000  # the overlay holds the deletions only
    store.take_changes()
    store.checkpoint(20)
    assert len(store) == 10_000 and store._data == {}
    store.close()


@pytest.mark.parametrize("seed", range(3))
def test_sqlite_subscription_store_follows_the_memory_store(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = str(tmp_path / "sub.sqlite")
    memory, file = SubscriptionStore("sub", "c"), SqliteSubscriptionStore("sub", "c", path, "id")
    foreign_keys: list[Any] = ["c1", "c2", 7, ("t", 1), "c1\xff", b"\xff"]  # prefixes of each other too
    changelog: list[tuple[bytes, bytes | None]] = []
    for step in range(600):
        fk, left = rng.choice(foreign_keys), encode_key(f"o{rng.randrange(30)}")
        if rng.random() < 0.6:
            _both(memory, file, "put", (fk, left), [rng.randbytes(4), rng.randrange(3)])
        else:
            _both(memory, file, "delete", (fk, left))
        fk = rng.choice(foreign_keys)
        assert sorted(file.subscribers(fk)) == sorted(memory.subscribers(fk))
        if rng.random() < 0.1:
            assert _changes(file, []) == _changes(memory, changelog)
            file.checkpoint(step)
            assert file._overlay == {} and file._changed == {}
            if rng.random() < 0.3:
                file.close()
                file = SqliteSubscriptionStore("sub", "c", path, "id")
                memory = _restart(SubscriptionStore("sub", "c"), changelog)
    assert file.to_dict() == memory.to_dict()
    file.close()


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


def _fill(kind: str, store: Any, batch: int, n: int) -> None:
    """``n`` entries of ``kind`` into ``store``, times from ``batch * n`` on."""
    for i in range(n):
        t = batch * n + i
        if kind == "sliding":
            store.advance(t)
            store.add_record(f"k{i % 500}", t, i)
            store.set_window(f"k{i % 500}", t, [1, i], t, store.next_created())
        elif kind == "join":
            store.advance(t)
            store.add(f"k{i % 500}", t, ["v", i])
        elif kind == "suppress":
            store.advance(t)
            store.buffer(f"k{t}", ["v", i], t)
        else:
            store.put((f"c{i % 50}", encode_key(f"o{t}")), [b"digest", 0])


@pytest.mark.parametrize("kind", ["sliding", "join", "suppress", "subscriptions"])
def test_sqlite_buffer_stores_hold_their_entries_in_the_file_not_in_memory(tmp_path: Path, kind: str) -> None:
    """20,000 entries written in 20 checkpoints: after each checkpoint the Python objects the process tracks
    grow by less than 1 per 20 entries (the overlay and its indexes are empty), while the file holds them all
    and reads come from it."""
    path = str(tmp_path / f"{kind}.sqlite")
    make = {
        "sliding": lambda: SqliteSlidingStore("s", "c", 10, path, "id"),
        "join": lambda: SqliteJoinBufferStore("j", "c", path, "id"),
        "suppress": lambda: SqliteSuppressBuffer("b", "c", path, "id"),
        "subscriptions": lambda: SqliteSubscriptionStore("sub", "c", path, "id"),
    }[kind]
    store = make()
    _fill(kind, store, 0, 1000)  # warm up: SQLite statements, interned strings
    store.take_changes()
    store.checkpoint(0)
    before = _tracked()
    for batch in range(1, 20):
        _fill(kind, store, batch, 1000)
        store.take_changes()
        store.checkpoint(batch)
    grown = _tracked() - before
    assert grown < 1000, f"{grown} more Python objects for 19,000 more entries"
    entries = 40_000 if kind == "sliding" else 20_000  # a sliding entry: a record and a window
    assert len(store) == entries
    if kind == "sliding":
        assert (
            store.records("k7", 0, 20_000)[:2] == [(7, 7), (507, 507)] and store.window("k7", 7) is not None
        )
    elif kind == "join":
        assert [ts for ts, _, _ in store.matches("k7", 0, 2000)] == [7, 507, 1007, 1507]
    elif kind == "suppress":
        assert (
            store.oldest() == 0 and store.evict() == ("k0", ["v", 0], 0) and store.get("k19999") == ["v", 999]
        )
    else:
        assert len(store.subscribers("c7")) == 400
    store.close()
    again = make()  # the file read again: the committed entries (an eviction not checkpointed is not there)
    assert len(again) == entries
    again.close()


@pytest.mark.parametrize("per_time", [1, 7, 300])
def test_the_expiry_scan_reads_pages_without_splitting_a_time(tmp_path: Path, per_time: int) -> None:
    """The file's scan by time reads 256 rows ahead: with 1 row per time, 7 (a page ends inside a time) and 300
    (a time longer than a page), purging by rising bounds returns each record once, in the memory store's
    order; records added below what was scanned already are found after the next checkpoint."""
    memory, file = (
        JoinBufferStore("j", "c"),
        SqliteJoinBufferStore("j", "c", str(tmp_path / "j.sqlite"), "id"),
    )
    for i in range(2000):
        for store in (memory, file):
            store.add(f"k{i % 13}", i // per_time, i)
    file.take_changes()
    file.checkpoint(1)
    top = 2000 // per_time + 2
    for before in range(0, top, max(1, top // 40)):
        assert file.purge(before) == memory.purge(before)
        if before == top // 2:  # late additions below the scan, then a checkpoint
            for store in (memory, file):
                store.add("late", 0, "x")
            file.take_changes()
            file.checkpoint(2)
    assert file.purge(top) == memory.purge(top)
    assert file.to_dict() == memory.to_dict() == {}


def test_the_suppression_buffer_counts_its_keys_without_reading_the_file(tmp_path: Path) -> None:
    """suppress(max_records=...) asks the buffer's len() after every record: the SQLite buffer answers from its
    count of the keys held (file and overlay), running no SQL statement."""
    path = str(tmp_path / "b.sqlite")
    buffer = SqliteSuppressBuffer("b", "c", path, "id")
    for i in range(100):
        buffer.advance(i)
        buffer.buffer(f"k{i}", i, i)
    buffer.take_changes()
    buffer.checkpoint(1)
    for i in range(100, 200):  # 50 keys of the file again, 50 new ones
        buffer.advance(i)
        buffer.buffer(f"k{i - 50}", i, i)
    for _ in range(10):
        buffer.evict()
    statements: list[str] = []
    buffer._db.set_trace_callback(statements.append)
    assert len(buffer) == 140 and statements == []
    buffer.take_changes()
    buffer.checkpoint(2)
    buffer.close()
    assert len(SqliteSuppressBuffer("b", "c", path, "id")) == 140
