"""A key-value store kept in SQLite (``App(..., state_dir=PATH)``): state larger than memory, and a restart that
reads only the changelog records written since the last commit instead of the whole changelog.

Each task's store is the file ``<state_dir>/<application_id>/<task>/<store>.sqlite`` (stdlib ``sqlite3``; no
native dependency beyond Python's). It holds **committed** state only (and the store keeps up to :data:`CACHE_ENTRIES` committed values it read
lately in memory): what a task changes goes to an overlay
in memory (read first), which the runtime writes to the file, in one SQLite transaction together with the
changelog offset it reaches, after the pylog transaction holding those changelog records has committed
(:meth:`SqliteStore.checkpoint`). So the file is always the state as of some committed offset of the
changelog, whatever happened to the process (KIP-892's idea): a crash before the checkpoint leaves an older
offset, and the restore replays the changelog from it (applying a record twice is harmless: latest value per
key). An aborted transaction's changes never reach the file. A file whose changelog is not the one it was
built from (the topic was deleted and created again: an application reset) or whose offset is past the
changelog's end is emptied and rebuilt from the changelog.

Crash contract: SQLite's journal makes each checkpoint atomic; ``synchronous=NORMAL`` may lose the last
checkpoints on power loss, which only means a longer replay. Thread-safety: the task's thread writes;
interactive queries may read from other threads (one connection, calls serialized by a lock).

:class:`SqliteWindowStore` does the same for tumbling and hopping windows: a table of ``(key, window_start)
-> aggregate`` with the window's end indexed, so that closing the windows a stream time passes is a range
scan of the file (retention: a closed window is deleted from the file at the next checkpoint), and the stream
time kept beside the offset. :class:`SqliteSessionStore` likewise for session windows (``(key, start) ->
[aggregate, end]``, the end indexed; a key's sessions are a lookup by key). The sliding-window, join-buffer,
suppression-buffer and foreign-key subscription stores are in :mod:`pylog.streams.sqlite_buffers`, which also
chooses the SQLite store of each store kind (:func:`~pylog.streams.sqlite_buffers.make_sqlite_store`).
"""

from __future__ import annotations

import heapq
import itertools
import os
import sqlite3
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from typing import Any

from pylog.streams.serde import MSGPACK
from pylog.streams.stores import (
    _MISSING,
    MISSING,
    STREAM_TIME_KEY,
    KeyValueStore,
    SessionStore,
    WindowStore,
    decode_key,
    encode_key,
)

__all__ = ["CACHE_ENTRIES", "SqliteSessionStore", "SqliteStore", "SqliteWindowStore"]

_DELETED: Any = object()
_ABSENT: Any = object()
CACHE_ENTRIES = 100_000  # committed values kept in memory per store, most recently used first
_SWEEP_PAGE = 256  # rows an expiry scan reads ahead


class SqliteStore(KeyValueStore):
    """A key-value store in a SQLite file (see the module docstring). ``changelog_id`` identifies the changelog
    topic the file follows (its topic id)."""

    persistent = True

    def __init__(self, name: str, changelog: str, path: str, changelog_id: str) -> None:
        super().__init__(name, changelog)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.path = path
        self._lock = threading.RLock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
        self._overlay: dict[Any, Any] = {}  # changes not yet checkpointed: key -> value or _DELETED
        self._cache: OrderedDict[Any, Any] = OrderedDict()  # committed values read lately (or _DELETED)
        meta = dict(self._db.execute("SELECT name, value FROM meta").fetchall())
        self.offset = int(meta.get("offset", 0))
        if meta.get("changelog_id", changelog_id) != changelog_id:
            self.clear()
        self._changelog_id = changelog_id

    # -- reads ----------------------------------------------------------------------------------------

    def _stored(self, key: Any) -> Any:
        """The committed value of ``key`` (or _DELETED): from the read cache, else from the file."""
        with self._lock:  # queries from other threads use the cache too
            cache = self._cache
            value = cache.get(key, _ABSENT)
            if value is not _ABSENT:
                cache.move_to_end(key)
                return value
            row = self._db.execute("SELECT v FROM kv WHERE k = ?", (encode_key(key),)).fetchone()
            value = _DELETED if row is None else MSGPACK.decode(row[0])
            cache[key] = value
            if len(cache) > CACHE_ENTRIES:
                cache.popitem(last=False)
            return value

    def get(self, key: Any, default: Any = None) -> Any:
        value = self._overlay.get(key, _ABSENT)  # one lookup: a checkpoint may empty the overlay meanwhile
        if value is _ABSENT:
            value = self._stored(key)
        return default if value is _DELETED else value

    def __getitem__(self, key: Any) -> Any:
        value = self.get(key, _DELETED)
        if value is _DELETED:
            raise KeyError(key)
        return value

    def __contains__(self, key: Any) -> bool:
        return self.get(key, _DELETED) is not _DELETED

    def _rows(self) -> Iterator[tuple[Any, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT k, v FROM kv").fetchall()
        overlay = dict(self._overlay)
        for raw_key, raw_value in rows:
            key = decode_key(raw_key)
            if key not in overlay:
                yield key, MSGPACK.decode(raw_value)
        for key, value in overlay.items():
            if value is not _DELETED:
                yield key, value

    def __len__(self) -> int:
        with self._lock:
            (n,) = self._db.execute("SELECT COUNT(*) FROM kv").fetchone()
        for key, value in list(self._overlay.items()):
            stored = self._stored(key) is not _DELETED
            n += (value is not _DELETED) - stored
        return int(n)

    def __iter__(self) -> Iterator[Any]:
        return iter([k for k, _ in self._rows()])

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._rows())

    def range(self, low: Any = None, high: Any = None) -> list[tuple[Any, Any]]:
        found = [(k, v) for k, v in self._rows() if (low is None or k >= low) and (high is None or k <= high)]
        return sorted(found, key=lambda kv: kv[0])

    def to_dict(self) -> dict[Any, Any]:
        return dict(self._rows())

    # -- writes ---------------------------------------------------------------------------------------

    def put(self, key: Any, value: Any) -> None:
        if value is None:
            self.delete(key)
            return
        self._overlay[key] = value
        self._dirty.add(key)

    def delete(self, key: Any) -> None:
        if key in self:
            self._overlay[key] = _DELETED
            self._dirty.add(key)

    def take_changes(self) -> list[tuple[bytes, bytes | None]]:
        out = []
        for key in self._dirty:
            value = self._overlay.get(key, _DELETED)
            out.append((encode_key(key), None if value is _DELETED else MSGPACK.encode(value)))
        self._dirty.clear()
        return out

    def checkpoint(self, offset: int) -> None:
        """Write the overlay to the file with the changelog ``offset`` it is committed up to, atomically; called
        after the pylog transaction holding its changelog records committed."""
        with self._lock:
            db = self._db
            db.execute("BEGIN")
            try:
                puts = [
                    (encode_key(k), MSGPACK.encode(v)) for k, v in self._overlay.items() if v is not _DELETED
                ]
                deletes = [(encode_key(k),) for k, v in self._overlay.items() if v is _DELETED]
                db.executemany("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", puts)
                db.executemany("DELETE FROM kv WHERE k = ?", deletes)
                self._write_meta(offset)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            for key, value in self._overlay.items():  # the file now holds them: cache what is cached
                if key in self._cache:
                    self._cache[key] = value
            self._overlay.clear()
            self.offset = offset

    def _write_meta(self, offset: int) -> None:
        self._db.executemany(
            "INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)",
            [("offset", str(offset)), ("changelog_id", self._changelog_id)],
        )

    # -- restore --------------------------------------------------------------------------------------

    def clear(self) -> None:
        """Empty the file (it follows another changelog, or is ahead of it): rebuilt from offset 0."""
        with self._lock:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM kv")
            self._db.execute("DELETE FROM meta")
            self._db.execute("COMMIT")
        with self._lock:
            self._cache.clear()
        self._overlay.clear()
        self._dirty.clear()
        self.offset = 0

    def restore(self, keys: Iterable[bytes], values: Iterable[bytes | None]) -> None:
        latest = dict(zip(keys, values, strict=True))
        self.restore_decoded(
            [decode_key(k) for k in latest],
            [None if v is None else MSGPACK.decode(v) for v in latest.values()],
        )

    def restore_decoded(self, keys: list[Any], values: list[Any]) -> None:
        """Changelog records (decoded) go straight to the file: they are committed already."""
        latest = dict(zip(keys, values, strict=True))
        with self._lock:
            db = self._db
            db.execute("BEGIN")
            db.executemany(
                "INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)",
                [(encode_key(k), MSGPACK.encode(v)) for k, v in latest.items() if v is not None],
            )
            db.executemany(
                "DELETE FROM kv WHERE k = ?", [(encode_key(k),) for k, v in latest.items() if v is None]
            )
            db.execute("COMMIT")
            for key in latest:
                self._cache.pop(key, None)

    def restored(self, offset: int) -> None:
        """The restore read the changelog up to ``offset``: record it."""
        with self._lock:
            self._db.execute("BEGIN")
            self._write_meta(offset)
            self._db.execute("COMMIT")
        self.offset = offset

    def close(self) -> None:
        with self._lock:
            self._db.close()


_MIN_TIME = -(2**63)


class _Sweep:
    """The expiry scan of one table of a store's file by an indexed time column: the rows whose time is at or
    before a bound that only grows (a stream time less the grace), each returned once, in time order. The rows
    it returned are deleted in the store's overlay, and from the file at the next checkpoint; ``swept`` is how
    far it went, so a row is never returned twice. It reads the file ahead a page of rows at a time (rows of
    one time never split across pages), so a bound moving a little per record costs no query until the page
    is used up; the file changes only at a checkpoint or a restore, after which :meth:`refresh` drops the
    page. ``columns`` starts with the time column. The window, session and sliding-window stores close by it;
    the sliding-window and join-buffer stores purge their records by it. Runs under the store's lock."""

    def __init__(self, store: Any, table: str, column: str, columns: str) -> None:
        self._store = store
        self._next_page = (
            f"SELECT {columns} FROM {table} WHERE {column} > ? ORDER BY {column} LIMIT {_SWEEP_PAGE}"
        )
        self._ties = f"SELECT {columns} FROM {table} WHERE {column} = ?"
        self.swept = _MIN_TIME  # the rows at or before this time were returned
        self._fetched = _MIN_TIME  # the rows at or before this time were returned or are in the page
        self._page: deque[Any] = deque()
        self._last_page = False  # the page holds every row after _fetched

    def refresh(self) -> None:
        """Forget the page (the file changed: a checkpoint, a restore): read again after ``swept``."""
        self._page.clear()
        self._fetched = self.swept
        self._last_page = False

    def reset(self) -> None:
        """Start again from the earliest time (the file was emptied)."""
        self.swept = _MIN_TIME
        self.refresh()

    def include(self, time: int) -> None:
        """A row of ``time`` is added (to the overlay, the file's at the next checkpoint): scan it too, even
        if the scan went past ``time`` already (the rows it returned then are deleted in the overlay)."""
        if time <= self.swept:
            self.swept = time - 1
            self.refresh()

    def _read(self) -> None:
        with self._store._lock:
            db = self._store._db
            rows = db.execute(self._next_page, (self._fetched,)).fetchall()
            if len(rows) == _SWEEP_PAGE:
                last = rows[-1][0]
                if rows[0][0] == last:  # a page of one time: take all of that time
                    rows = db.execute(self._ties, (last,)).fetchall()
                else:  # the last time may go on in the next page: read it there whole
                    rows = [r for r in rows if r[0] != last]
                    last -= 1
                self._fetched = last
            else:
                self._last_page = True
                if rows:
                    self._fetched = rows[-1][0]
        self._page.extend(rows)

    def due(self, through: int) -> bool:
        """Whether a row not returned yet has its time at or before ``through``."""
        if not self._page and not self._last_page:
            self._read()
        return bool(self._page) and self._page[0][0] <= through

    def scan(self, through: int) -> list[Any]:
        """The rows (their ``columns``) not returned yet whose time is at or before ``through``, by time."""
        rows = []
        while self.due(through):
            rows.append(self._page.popleft())
        self.swept = max(self.swept, through)
        return rows


class _SqliteTimed:
    """What the SQLite timed stores share: the file (the store's tables ``_TABLES`` and ``meta``:
    the changelog offset, the changelog's id and the stream time, written with each checkpoint), emptying it,
    and the restore's bookkeeping."""

    _TABLES: tuple[str, ...] = ()
    persistent = True
    offset: int
    stream_time: int
    _time_dirty: bool
    _data: dict[Any, Any]
    _dirty: set[Any]
    name: str

    def _open(self, path: str, changelog_id: str, schema: list[str]) -> bool:
        """Open (or create) the file with ``schema``; returns whether it follows another changelog (then
        :meth:`clear` it)."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.path = path
        self._lock = threading.RLock()
        self._db = db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        for statement in schema:
            db.execute(statement)
        db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
        self._changelog_id = changelog_id
        meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
        self.offset = int(meta.get("offset", 0))
        self.stream_time = int(meta.get("stream_time", -1))
        return bool(meta.get("changelog_id", changelog_id) != changelog_id)

    def _apply(self, writes: list[tuple[str, list[Any]]], offset: int | None) -> None:
        """Run the statements of ``writes`` (each with its rows) in one SQLite transaction, with the changelog
        ``offset`` reached (None: keep the offset; a restore's batch)."""
        with self._lock:
            db = self._db
            db.execute("BEGIN")
            try:
                for statement, rows in writes:
                    db.executemany(statement, rows)
                if offset is not None:
                    self._write_meta(offset)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def _write_meta(self, offset: int) -> None:
        self._db.executemany(
            "INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)",
            [
                ("offset", str(offset)),
                ("changelog_id", self._changelog_id),
                ("stream_time", str(self.stream_time)),
            ],
        )

    def _wipe(self) -> None:
        """Empty the file and forget the overlay, the offset and the stream time."""
        with self._lock:
            self._db.execute("BEGIN")
            for table in self._TABLES:
                self._db.execute(f"DELETE FROM {table}")
            self._db.execute("DELETE FROM meta")
            self._db.execute("COMMIT")
        self._data.clear()
        self._dirty.clear()
        self.offset = 0
        self.stream_time = -1
        self._time_dirty = False

    def restore_decoded(self, keys: list[Any], values: list[Any]) -> None:
        """Changelog records (decoded) go straight to the file: they are committed already."""
        latest = dict(zip(keys, values, strict=True))
        time = latest.pop(STREAM_TIME_KEY, None)
        if time is not None:
            self.stream_time = max(self.stream_time, int(time))
        self._restore_latest(latest)
        self._dirty.clear()
        self._time_dirty = False

    def _restore_latest(self, latest: dict[Any, Any]) -> None:
        """Write each key's latest changelog value (None: deleted) to the file and update what indexes it."""
        raise NotImplementedError

    def restore(self, keys: Iterable[bytes], values: Iterable[bytes | None]) -> None:
        latest = dict(zip(keys, values, strict=True))
        self.restore_decoded(
            [decode_key(k) for k in latest],
            [None if v is None else MSGPACK.decode(v) for v in latest.values()],
        )

    def restored(self, offset: int) -> None:
        """The restore read the changelog up to ``offset``: record it (and the stream time)."""
        with self._lock:
            self._db.execute("BEGIN")
            self._write_meta(offset)
            self._db.execute("COMMIT")
        self.offset = offset

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.path!r})"


class SqliteWindowStore(_SqliteTimed, WindowStore):
    """Tumbling and hopping window aggregates in a SQLite file (see the module docstring): the table ``win``
    holds ``(key, start) -> [aggregate, max_timestamp]`` as of the changelog offset in ``meta``, with the
    window's end (indexed: the windows to close are a range scan) and its creation sequence (windows closing
    at the same end are emitted in creation order, as the in-memory store does). The changes of the current
    commit interval are an overlay in memory (``_data``: window -> entry, or a deletion), written to the file
    by :meth:`checkpoint` once their changelog records are committed; an aborted interval's changes never
    reach the file."""

    _TABLES = ("win",)

    def __init__(self, name: str, changelog: str, size_ms: int, path: str, changelog_id: str) -> None:
        super().__init__(name, changelog, size_ms)
        self._cache: OrderedDict[Any, tuple[Any, int]] = OrderedDict()  # committed windows used lately
        other = self._open(
            path,
            changelog_id,
            [
                "CREATE TABLE IF NOT EXISTS win (k BLOB NOT NULL, start INTEGER NOT NULL, wend INTEGER NOT NULL,"
                " seq INTEGER NOT NULL, v BLOB NOT NULL, PRIMARY KEY (k, start)) WITHOUT ROWID",
                "CREATE INDEX IF NOT EXISTS win_end ON win (wend, seq)",
            ],
        )
        self._new: dict[Any, int] = {}  # window created in the overlay -> its creation sequence
        self._sweep = _Sweep(self, "win", "wend", "wend, seq, k, start, v")  # closes the file's windows
        if other:
            self.clear()
        self._reload()

    def _reload(self) -> None:
        """Sequence, latest start and next end from the file."""
        with self._lock:
            top, latest = self._db.execute("SELECT MAX(seq), MAX(start) FROM win").fetchone()
        self._seq = itertools.count(0 if top is None else int(top) + 1)
        self._max_start = _MIN_TIME if latest is None else int(latest)  # a later window is not in the file
        self._sweep.refresh()

    # -- reads ----------------------------------------------------------------------------------------

    def _stored(self, window: Any) -> tuple[Any, int] | None:
        """The committed entry of ``window``: from the cache, else from the file (None when absent)."""
        if window[1] > self._max_start:
            return None
        with self._lock:
            cache = self._cache
            entry = cache.get(window)
            if entry is not None:
                cache.move_to_end(window)
                return entry
            row = self._db.execute(
                "SELECT v FROM win WHERE k = ? AND start = ?", (encode_key(window[0]), window[1])
            ).fetchone()
            if row is None:
                return None
            agg, max_ts = MSGPACK.decode(row[0])
            cache[window] = entry = (agg, max_ts)
            if len(cache) > CACHE_ENTRIES:
                cache.popitem(last=False)
            return entry

    def _live(self, window: Any) -> tuple[Any, int] | None:
        """The entry of ``window``: the overlay's, else the file's; None when absent."""
        value = self._data.get(window, _ABSENT)
        if value is _ABSENT:
            return self._stored(window)
        return None if value is _MISSING else value

    def _rows(self, key: Any = _ABSENT, time_from: int = _MIN_TIME, time_to: int = 2**63 - 1) -> list[Any]:
        """``((key, start), (aggregate, max_timestamp))`` of the open windows (of ``key`` only, if given,
        starting in ``[time_from, time_to]``), the file's then the overlay's."""
        overlay = dict(self._data)
        with self._lock:
            if key is _ABSENT:
                rows = self._db.execute("SELECT k, start, v FROM win").fetchall()
            else:
                rows = self._db.execute(
                    "SELECT k, start, v FROM win WHERE k = ? AND start >= ? AND start <= ?",
                    (encode_key(key), time_from, time_to),
                ).fetchall()
        out = []
        for raw_key, start, raw in rows:
            window = (decode_key(raw_key), start)
            if window not in overlay:
                agg, max_ts = MSGPACK.decode(raw)
                out.append((window, (agg, max_ts)))
        for window, value in overlay.items():
            if value is not _MISSING and (
                key is _ABSENT or (window[0] == key and time_from <= window[1] <= time_to)
            ):
                out.append((window, value))
        return out

    def get(self, key: Any, default: Any = None) -> Any:
        entry = self._live(key)
        return default if entry is None else entry[0]

    def entry(self, key: Any) -> tuple[Any, int] | None:
        return self._live(key)

    def __getitem__(self, key: Any) -> Any:
        entry = self._live(key)
        if entry is None:
            raise KeyError(key)
        return entry

    def __contains__(self, key: Any) -> bool:
        return self._live(key) is not None

    def __len__(self) -> int:
        with self._lock:
            (n,) = self._db.execute("SELECT COUNT(*) FROM win").fetchone()
        for window, value in list(self._data.items()):
            n += (value is not _MISSING) - (self._stored(window) is not None)
        return int(n)

    def __iter__(self) -> Iterator[Any]:
        return iter([w for w, _ in self._rows()])

    def items(self) -> list[tuple[Any, Any]]:
        return [(w, entry[0]) for w, entry in self._rows()]

    def range(self, low: Any = None, high: Any = None) -> list[tuple[Any, Any]]:
        found = [(w, v) for w, v in self.items() if (low is None or w >= low) and (high is None or w <= high)]
        return sorted(found, key=lambda kv: kv[0])

    def fetch(self, key: Any, time_from: int = 0, time_to: int | None = None) -> list[tuple[int, Any]]:
        rows = self._rows(key, time_from, 2**63 - 1 if time_to is None else time_to)
        return sorted((w[1], entry[0]) for w, entry in rows)

    # -- writes ---------------------------------------------------------------------------------------

    def _created(self, window: Any) -> None:
        seq = next(self._seq)
        self._new[window] = seq
        heapq.heappush(self._ends, (window[1] + self.size_ms, seq, *window))

    def put(self, key: Any, value: Any) -> None:
        if value is None:
            self.delete(key)
            return
        if self._live(key) is None:
            self._created(key)
        self._data[key] = (value[0], value[1])
        self._dirty.add(key)

    def delete(self, key: Any) -> None:
        if self._live(key) is not None:
            self._data[key] = _MISSING
            self._dirty.add(key)

    def fold(self, window: tuple[Any, int], timestamp: int, key: Any, value: Any, aggregator: Any) -> Any:
        data = self._data
        entry = data.get(window)
        if entry is None:
            entry = self._stored(window)
        elif entry is _MISSING:
            entry = None
        if entry is None:
            agg = aggregator(key, value, MISSING)
            self._created(window)
            data[window] = (agg, timestamp)
        else:
            agg = aggregator(key, value, entry[0])
            data[window] = (agg, timestamp if timestamp > entry[1] else entry[1])
        self._dirty.add(window)
        return agg

    def closes_by(self, close_before: int) -> bool:
        return (bool(self._ends) and self._ends[0][0] <= close_before) or self._sweep.due(close_before)

    def closing(self, close_before: int) -> list[tuple[Any, int, Any]]:
        found: list[tuple[int, int, Any, int, Any]] = []  # (end, seq, key, start, the file's value or None)
        ends = self._ends
        while ends and ends[0][0] <= close_before:
            found.append((*heapq.heappop(ends), None))
        found.extend(
            (end, seq, decode_key(k), start, v) for end, seq, k, start, v in self._sweep.scan(close_before)
        )
        found.sort(key=lambda f: (f[0], f[1]))
        out = []
        data, dirty = self._data, self._dirty
        for _, _, key, start, raw in found:
            window = (key, start)
            entry = data.get(window, _ABSENT)  # the overlay's entry decides, else the file's
            if entry is _ABSENT and raw is not None:
                agg, max_ts = MSGPACK.decode(raw)
                entry = (agg, max_ts)
            if entry is not _ABSENT and entry is not _MISSING:
                data[window] = _MISSING
                dirty.add(window)
                out.append((key, start, entry))
        return out

    # -- commit ---------------------------------------------------------------------------------------

    def checkpoint(self, offset: int) -> None:
        """Write the overlay (and the stream time) to the file with the changelog ``offset`` it is committed
        up to, atomically; called after the pylog transaction holding its changelog records committed."""
        size = self.size_ms
        with self._lock:
            db = self._db
            db.execute("BEGIN")
            try:
                db.executemany(
                    "INSERT INTO win (k, start, wend, seq, v) VALUES (?, ?, ?, ?, ?)"
                    " ON CONFLICT (k, start) DO UPDATE SET v = excluded.v",
                    [
                        (encode_key(w[0]), w[1], w[1] + size, self._new.get(w, 0), MSGPACK.encode(list(v)))
                        for w, v in self._data.items()
                        if v is not _MISSING
                    ],
                )
                db.executemany(
                    "DELETE FROM win WHERE k = ? AND start = ?",
                    [(encode_key(w[0]), w[1]) for w, v in self._data.items() if v is _MISSING],
                )
                self._write_meta(offset)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            cache = self._cache  # the overlay's windows are the file's now: cache them, forget the closed
            for window, value in self._data.items():
                if value is _MISSING:
                    cache.pop(window, None)
                else:
                    cache[window] = value
                    cache.move_to_end(window)
                    if window[1] > self._max_start:
                        self._max_start = window[1]
            while len(cache) > CACHE_ENTRIES:
                cache.popitem(last=False)
        self._data.clear()
        self._new.clear()
        self._ends.clear()  # the windows of the overlay are the file's now: found by its index
        self._sweep.refresh()
        self.offset = offset

    # -- restore --------------------------------------------------------------------------------------

    def clear(self) -> None:
        """Empty the file (it follows another changelog, or is ahead of it): rebuilt from offset 0."""
        self._wipe()
        with self._lock:
            self._cache.clear()
        self._max_start = _MIN_TIME
        self._ends.clear()
        self._new = {}
        self._sweep.reset()

    def _restore_latest(self, latest: dict[Any, Any]) -> None:
        size, seq = self.size_ms, self._seq
        with self._lock:
            db = self._db
            db.execute("BEGIN")
            db.executemany(
                "INSERT INTO win (k, start, wend, seq, v) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (k, start) DO UPDATE SET v = excluded.v",
                [
                    (encode_key(w[0]), w[1], w[1] + size, next(seq), MSGPACK.encode(v))
                    for w, v in latest.items()
                    if v is not None
                ],
            )
            db.executemany(
                "DELETE FROM win WHERE k = ? AND start = ?",
                [(encode_key(w[0]), w[1]) for w, v in latest.items() if v is None],
            )
            db.execute("COMMIT")
            for window in latest:
                self._cache.pop(window, None)
            self._max_start = max([self._max_start, *(w[1] for w, v in latest.items() if v is not None)])
        self._sweep.refresh()


class SqliteSessionStore(_SqliteTimed, SessionStore):
    """Session aggregates in a SQLite file (see the module docstring): the table ``sess`` holds ``(key, start)
    -> [aggregate, end]`` as of the changelog offset in ``meta``, with the session's end (indexed: the
    sessions to close are a range scan) and the sequence of its latest change (sessions closing at the same
    end close in that order, as in memory). The commit interval's changes are an overlay in memory (``_data``,
    with ``_by_key`` indexing it), written to the file by :meth:`checkpoint` once their changelog records are
    committed."""

    _TABLES = ("sess",)

    def __init__(self, name: str, changelog: str, gap_ms: int, path: str, changelog_id: str) -> None:
        super().__init__(name, changelog, gap_ms)
        other = self._open(
            path,
            changelog_id,
            [
                "CREATE TABLE IF NOT EXISTS sess (k BLOB NOT NULL, start INTEGER NOT NULL, send INTEGER NOT NULL,"
                " seq INTEGER NOT NULL, v BLOB NOT NULL, PRIMARY KEY (k, start)) WITHOUT ROWID",
                "CREATE INDEX IF NOT EXISTS sess_end ON sess (send, seq)",
            ],
        )
        self._sweep = _Sweep(self, "sess", "send", "send, seq, k, start, v")  # closes the file's sessions
        if other:
            self.clear()
        (top,) = self._db.execute("SELECT MAX(seq) FROM sess").fetchone()
        self._seq = itertools.count(0 if top is None else int(top) + 1)

    # -- reads ----------------------------------------------------------------------------------------

    def _stored(self, session: Any) -> tuple[Any, int] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT v FROM sess WHERE k = ? AND start = ?", (encode_key(session[0]), session[1])
            ).fetchone()
        if row is None:
            return None
        agg, end = MSGPACK.decode(row[0])
        return agg, end

    def _live(self, session: Any) -> tuple[Any, int] | None:
        value = self._data.get(session, _ABSENT)
        if value is _ABSENT:
            return self._stored(session)
        return None if value is _MISSING else value

    def _all(self) -> list[tuple[Any, tuple[Any, int]]]:
        overlay = dict(self._data)
        with self._lock:
            rows = self._db.execute("SELECT k, start, v FROM sess").fetchall()
        out = []
        for raw_key, start, raw in rows:
            session = (decode_key(raw_key), start)
            if session not in overlay:
                agg, end = MSGPACK.decode(raw)
                out.append((session, (agg, end)))
        out.extend((s, v) for s, v in overlay.items() if v is not _MISSING)
        return out

    def sessions(self, key: Any) -> list[tuple[int, int, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT start, v FROM sess WHERE k = ?", (encode_key(key),)).fetchall()
        found = {start: MSGPACK.decode(raw) for start, raw in rows}
        for start in list(self._by_key.get(key, ())):
            value = self._data.get((key, start), _MISSING)
            if value is _MISSING:
                found.pop(start, None)
            else:
                found[start] = value
        return sorted((start, v[1], v[0]) for start, v in found.items())

    def get(self, key: Any, default: Any = None) -> Any:
        entry = self._live(key)
        return default if entry is None else entry[0]

    def __getitem__(self, key: Any) -> Any:
        entry = self._live(key)
        if entry is None:
            raise KeyError(key)
        return entry

    def __contains__(self, key: Any) -> bool:
        return self._live(key) is not None

    def __len__(self) -> int:
        with self._lock:
            (n,) = self._db.execute("SELECT COUNT(*) FROM sess").fetchone()
        for session, value in list(self._data.items()):
            n += (value is not _MISSING) - (self._stored(session) is not None)
        return int(n)

    def __iter__(self) -> Iterator[Any]:
        return iter([s for s, _ in self._all()])

    def items(self) -> list[tuple[Any, Any]]:
        return [((k, start, entry[1]), entry[0]) for (k, start), entry in self._all()]

    def range(self, low: Any = None, high: Any = None) -> list[tuple[Any, Any]]:
        found = [(s, e) for s, e in self._all() if (low is None or s >= low) and (high is None or s <= high)]
        return sorted(found, key=lambda kv: kv[0])

    # -- writes ---------------------------------------------------------------------------------------

    def put(self, key: Any, value: Any) -> None:
        if value is None:
            self.delete(key)
            return
        k, start = key
        self._by_key.setdefault(k, set()).add(start)
        seq = next(self._seq)
        self._latest[key] = seq
        heapq.heappush(self._ends, (value[1], seq, k, start))
        self._data[key] = (value[0], value[1])
        self._dirty.add(key)

    def delete(self, key: Any) -> None:
        if self._live(key) is not None:
            self._latest.pop(key, None)
            self._by_key.setdefault(key[0], set()).add(key[1])  # the overlay's deletion, found by sessions()
            self._data[key] = _MISSING
            self._dirty.add(key)

    def closing(self, end_before: int) -> list[tuple[Any, int, Any]]:
        found: list[tuple[int, int, Any, int, Any]] = []  # (end, seq, key, start, the file's entry or None)
        ends = self._ends
        while ends and ends[0][0] < end_before:
            end, seq, key, start = heapq.heappop(ends)
            if self._latest.get((key, start)) == seq:
                found.append((end, seq, key, start, None))
        for end, seq, raw_key, start, raw in self._sweep.scan(end_before - 1):
            session = (decode_key(raw_key), start)
            if session not in self._data:  # else the overlay's entry decides (and its heap entry)
                agg, send = MSGPACK.decode(raw)
                found.append((end, seq, *session, (agg, send)))
        found.sort(key=lambda f: (f[0], f[1]))
        out = []
        data = self._data
        for _, _, key, start, stored in found:
            session = (key, start)
            entry = data.get(session, stored)  # the overlay's entry, else the file's
            if entry is not None and entry is not _MISSING:
                self._latest.pop(session, None)
                self._by_key.setdefault(key, set()).add(start)  # the deletion, found by sessions()
                data[session] = _MISSING
                self._dirty.add(session)
                out.append((key, start, entry))
        return out

    # -- commit ---------------------------------------------------------------------------------------

    def checkpoint(self, offset: int) -> None:
        """Write the overlay (and the stream time) to the file with the changelog ``offset`` it is committed
        up to, atomically; called after the pylog transaction holding its changelog records committed."""
        with self._lock:
            db = self._db
            db.execute("BEGIN")
            try:
                db.executemany(
                    "INSERT OR REPLACE INTO sess (k, start, send, seq, v) VALUES (?, ?, ?, ?, ?)",
                    [
                        (encode_key(s[0]), s[1], v[1], self._latest.get(s, 0), MSGPACK.encode(list(v)))
                        for s, v in self._data.items()
                        if v is not _MISSING
                    ],
                )
                db.executemany(
                    "DELETE FROM sess WHERE k = ? AND start = ?",
                    [(encode_key(s[0]), s[1]) for s, v in self._data.items() if v is _MISSING],
                )
                self._write_meta(offset)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        self._data.clear()
        self._by_key.clear()
        self._latest.clear()
        self._ends.clear()  # the overlay's sessions are the file's now: found by its index
        self._sweep.refresh()
        self.offset = offset

    # -- restore --------------------------------------------------------------------------------------

    def clear(self) -> None:
        """Empty the file (it follows another changelog, or is ahead of it): rebuilt from offset 0."""
        self._wipe()
        self._by_key.clear()
        self._latest.clear()
        self._ends.clear()
        self._sweep.reset()

    def _restore_latest(self, latest: dict[Any, Any]) -> None:
        seq = self._seq
        with self._lock:
            db = self._db
            db.execute("BEGIN")
            db.executemany(
                "INSERT OR REPLACE INTO sess (k, start, send, seq, v) VALUES (?, ?, ?, ?, ?)",
                [
                    (encode_key(s[0]), s[1], v[1], next(seq), MSGPACK.encode(v))
                    for s, v in latest.items()
                    if v is not None
                ],
            )
            db.executemany(
                "DELETE FROM sess WHERE k = ? AND start = ?",
                [(encode_key(s[0]), s[1]) for s, v in latest.items() if v is None],
            )
            db.execute("COMMIT")
        self._sweep.refresh()
