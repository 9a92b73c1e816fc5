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
from pylog.streams.sqlite_buffers import SqliteJoinBufferStore, SqliteSlidingStore, SqliteSuppressBuffer
from pylog.streams.stores import JoinBufferStore, SlidingStore, SuppressBuffer, decode_key


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
        assert file.bytes == memory.bytes
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
