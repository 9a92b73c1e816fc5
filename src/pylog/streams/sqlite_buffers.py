"""The SQLite stores of the buffering operations (``App(..., state_dir=PATH)``): sliding windows, the two
buffers of a stream-stream join, the suppression buffer and a foreign-key join's subscriptions, larger than
memory, each in its file ``<state_dir>/<application_id>/<task>/<store>.sqlite`` beside the key-value and
window stores of :mod:`pylog.streams.sqlite`, and :func:`make_sqlite_store`, which chooses a store kind's SQLite
store.

Each keeps the contract of :mod:`pylog.streams.sqlite`: the file holds the **committed** state only, as of the
changelog offset in its ``meta`` table; the changes of the current commit interval are an overlay in memory
(``_data``: key -> entry, or ``_MISSING`` for a deletion, the same keys and entries as the in-memory store,
so that the inherited ``take_changes`` writes the same changelog records the in-memory store writes), read
before the file and written to it by ``checkpoint`` once the pylog transaction holding their changelog records
has committed. An aborted interval's changes never reach the file; a restore writes the changelog records read
straight to the file. Besides the overlay, a store keeps in memory only the indexes of the overlay (cleared at
each checkpoint) and a few counters: what it holds lives in the file, found by its indexes:

- sliding windows: the records ``srec (k, seq) -> value`` with their time indexed (the purge is a range scan)
  and the windows ``swin (k, start) -> [aggregate, max_timestamp, created]`` with their end indexed (closing is
  a range scan, by end then creation as in memory); a key's records in a time range are a lookup by key;
- a join buffer: ``jbuf (k, seq) -> [value, joined]`` with the record's time indexed: the records of a key in a
  time range are a lookup by key, the purge a range scan by time then arrival;
- a suppression buffer: ``held (k) -> [value, buffer_time, timestamp, seq]`` with ``(buffer_time, seq)``
  indexed: the evictions read the file in that order, in pages, beside a heap of the keys the overlay added;
- the subscriptions: the key-value file of :class:`~pylog.streams.sqlite.SqliteStore`, whose keys are the
  msgpack arrays ``[foreign_key, left_key]``: the subscribers of a foreign key are the keys starting with the
  msgpack bytes of ``[foreign_key, ...`` (Kafka's prefix scan), one range of the primary key.

Crash contract and thread-safety as in :mod:`pylog.streams.sqlite`: each checkpoint is one SQLite transaction;
the task's thread writes, interactive queries may read from other threads (calls serialized by a lock).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator
from typing import Any

from pylog.streams.serde import MSGPACK
from pylog.streams.sqlite import (
    _ABSENT,
    _DELETED,
    _MIN_TIME,
    SqliteSessionStore,
    SqliteStore,
    SqliteWindowStore,
    _SqliteTimed,
    _Sweep,
)
from pylog.streams.stores import (
    _MISSING,
    JoinBufferStore,
    KeyValueStore,
    SlidingStore,
    SuppressBuffer,
    decode_key,
    encode_key,
)
from pylog.streams.topology import StoreSpec
from pylog.streams.windows import JoinWindows, SessionWindows, SlidingWindows

__all__ = [
    "SqliteJoinBufferStore",
    "SqliteSlidingStore",
    "SqliteSubscriptionStore",
    "SqliteSuppressBuffer",
    "make_sqlite_store",
]

_MAX_TIME = 2**63 - 1
_PAGE = 256  # rows of the suppression buffer's file read at a time, in eviction order


def make_sqlite_store(spec: StoreSpec, path: str, changelog_id: str) -> KeyValueStore:
    """The SQLite store of ``spec`` in the file ``path``, following the changelog whose topic id is
    ``changelog_id``: every store kind has one."""
    if spec.kind == "suppress":
        return SqliteSuppressBuffer(spec.name, spec.changelog, path, changelog_id)
    if spec.kind == "subscriptions":
        return SqliteSubscriptionStore(spec.name, spec.changelog, path, changelog_id)
    windows = spec.windows
    if windows is None:
        return SqliteStore(spec.name, spec.changelog, path, changelog_id)
    if isinstance(windows, SessionWindows):
        return SqliteSessionStore(spec.name, spec.changelog, windows.gap_ms, path, changelog_id)
    if isinstance(windows, SlidingWindows):
        return SqliteSlidingStore(spec.name, spec.changelog, windows.time_difference_ms, path, changelog_id)
    if isinstance(windows, JoinWindows):
        return SqliteJoinBufferStore(spec.name, spec.changelog, path, changelog_id)
    return SqliteWindowStore(spec.name, spec.changelog, windows.size_ms, path, changelog_id)


def _count(store: Any, sql: str, params: tuple[Any, ...] = ()) -> int:
    with store._lock:
        (n,) = store._db.execute(sql, params).fetchone()
    return 0 if n is None else int(n)


class SqliteSlidingStore(_SqliteTimed, SlidingStore):
    """Sliding-window aggregates and the records they may still need, in a SQLite file (see the module
    docstring); ``_records`` and ``_windows`` index the overlay only."""

    _TABLES = ("srec", "swin")

    def __init__(self, name: str, changelog: str, difference_ms: int, path: str, changelog_id: str) -> None:
        super().__init__(name, changelog, difference_ms)
        other = self._open(
            path,
            changelog_id,
            [
                "CREATE TABLE IF NOT EXISTS srec (k BLOB NOT NULL, seq INTEGER NOT NULL, ts INTEGER NOT NULL,"
                " v BLOB NOT NULL, PRIMARY KEY (k, seq)) WITHOUT ROWID",
                "CREATE INDEX IF NOT EXISTS srec_ts ON srec (ts)",
                "CREATE TABLE IF NOT EXISTS swin (k BLOB NOT NULL, start INTEGER NOT NULL, wend INTEGER NOT NULL,"
                " created INTEGER NOT NULL, v BLOB NOT NULL, PRIMARY KEY (k, start)) WITHOUT ROWID",
                "CREATE INDEX IF NOT EXISTS swin_end ON swin (wend, created)",
            ],
        )
        self._ends: list[
            tuple[int, int, Any, int]
        ] = []  # heap of the overlay's new windows: (end, created, ..)
        self._times: list[tuple[int, int, Any]] = []  # heap of the overlay's new records: (ts, seq, key)
        self._closes = _Sweep(self, "swin", "wend", "wend, created, k, start, v")
        self._purges = _Sweep(self, "srec", "ts", "ts, seq, k")
        if other:
            self.clear()
        self._reload()

    def _reload(self) -> None:
        top = max(
            _count(self, "SELECT MAX(seq) + 1 FROM srec"), _count(self, "SELECT MAX(created) + 1 FROM swin")
        )
        self._seq = max(self._seq, top)
        self._closes.refresh()
        self._purges.refresh()

    # -- reads ----------------------------------------------------------------------------------------

    def _stored(self, key: Any) -> Any:
        """The committed entry of a store key (``("r", key, ts, seq)`` or ``("w", key, start)``), or None."""
        with self._lock:
            if key[0] == "r":
                row = self._db.execute(
                    "SELECT v FROM srec WHERE k = ? AND seq = ?", (encode_key(key[1]), key[3])
                ).fetchone()
                return None if row is None else MSGPACK.decode(row[0])
            row = self._db.execute(
                "SELECT v FROM swin WHERE k = ? AND start = ?", (encode_key(key[1]), key[2])
            ).fetchone()
        return None if row is None else tuple(MSGPACK.decode(row[0]))

    def _live(self, key: Any) -> Any:
        value = self._data.get(key, _ABSENT)
        if value is _ABSENT:
            return self._stored(key)
        return None if value is _MISSING else value

    def records(self, key: Any, low: int, high: int) -> list[tuple[int, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, ts, v FROM srec WHERE k = ? AND ts >= ? AND ts <= ?",
                (encode_key(key), low, high),
            ).fetchall()
        data = self._data
        found = {seq: (ts, MSGPACK.decode(v)) for seq, ts, v in rows if ("r", key, ts, seq) not in data}
        for seq, ts in self._records.get(key, ()):
            value = data.get(("r", key, ts, seq), _MISSING)
            if low <= ts <= high and value is not _MISSING:
                found[seq] = (ts, value)
        return [found[seq] for seq in sorted(found)]

    def window_starts(self, key: Any) -> list[int]:
        with self._lock:
            rows = self._db.execute("SELECT start FROM swin WHERE k = ?", (encode_key(key),)).fetchall()
        starts = {start for (start,) in rows}
        for start in self._windows.get(key, ()):
            if self._data.get(("w", key, start), _MISSING) is _MISSING:
                starts.discard(start)
            else:
                starts.add(start)
        return sorted(starts)

    def window(self, key: Any, start: int) -> tuple[Any, int, int] | None:
        entry = self._live(("w", key, start))
        return None if entry is None else (entry[0], entry[1], entry[2])

    def get(self, key: Any, default: Any = None) -> Any:
        entry = self._live(key)
        return default if entry is None else entry

    def __contains__(self, key: Any) -> bool:
        return self._live(key) is not None

    def __len__(self) -> int:
        n = _count(self, "SELECT COUNT(*) FROM srec") + _count(self, "SELECT COUNT(*) FROM swin")
        for key, value in list(self._data.items()):
            n += (value is not _MISSING) - (self._stored(key) is not None)
        return n

    def items(self) -> list[tuple[Any, Any]]:
        overlay = dict(self._data)
        with self._lock:
            rows = self._db.execute("SELECT k, start, v FROM swin").fetchall()
        out = []
        for raw_key, start, raw in rows:
            key = decode_key(raw_key)
            if ("w", key, start) not in overlay:
                out.append(((key, start), MSGPACK.decode(raw)[0]))
        out.extend(((k[1], k[2]), v[0]) for k, v in overlay.items() if k[0] == "w" and v is not _MISSING)
        return out

    def __iter__(self) -> Iterator[Any]:
        return iter([("w", *window) for window, _ in self.items()])

    # -- writes ---------------------------------------------------------------------------------------

    def add_record(self, key: Any, timestamp: int, value: Any) -> None:
        seq = self._seq
        self._records.setdefault(key, []).append((seq, timestamp))
        heapq.heappush(self._times, (timestamp, seq, key))
        self._purges.include(timestamp)
        self._seq = seq + 1
        self._data[("r", key, timestamp, seq)] = value
        self._dirty.add(("r", key, timestamp, seq))

    def set_window(self, key: Any, start: int, agg: Any, max_ts: int, created: int) -> None:
        window = ("w", key, start)
        if self._live(window) is None:
            heapq.heappush(self._ends, (start + self.difference_ms, created, key, start))
            self._closes.include(start + self.difference_ms)
            self._seq = max(self._seq, created + 1)  # as in memory: a new window moves the sequence
        self._windows.setdefault(key, set()).add(start)
        self._data[window] = (agg, max_ts, created)
        self._dirty.add(window)

    def put(self, key: Any, value: Any) -> None:
        if value is None:
            self.delete(key)
        elif key[0] == "r":
            self._put_record(key, value)
        else:
            self.set_window(key[1], key[2], value[0], value[1], value[2])

    def _put_record(self, key: Any, value: Any) -> None:
        if self._live(key) is None:
            self._records.setdefault(key[1], []).append((key[3], key[2]))
            heapq.heappush(self._times, (key[2], key[3], key[1]))
            self._purges.include(key[2])
            self._seq = max(self._seq, key[3] + 1)
        self._data[key] = value
        self._dirty.add(key)

    def delete(self, key: Any) -> None:
        if self._live(key) is not None:
            self._data[key] = _MISSING
            self._dirty.add(key)
            if key[0] == "w":
                self._windows.setdefault(key[1], set()).add(key[2])

    def closing(self, end_before: int) -> list[tuple[Any, int, Any, int]]:
        found: list[tuple[int, int, Any, int, Any]] = []  # (end, created, key, start, the file's entry)
        ends = self._ends
        while ends and ends[0][0] < end_before:
            found.append((*heapq.heappop(ends), None))
        found.extend((e, c, decode_key(k), s, v) for e, c, k, s, v in self._closes.scan(end_before - 1))
        found.sort(key=lambda f: (f[0], f[1]))
        out = []
        for _, _, key, start, raw in found:
            window = ("w", key, start)
            entry = self._data.get(window, _ABSENT)  # the overlay's entry decides, else the file's
            if entry is _ABSENT and raw is not None:
                entry = MSGPACK.decode(raw)
            if entry is not _ABSENT and entry is not _MISSING:
                self.delete(window)
                out.append((key, start, entry[0], entry[1]))
        return out

    def purge(self, before: int) -> None:
        found = []
        times = self._times
        while times and times[0][0] < before:
            found.append(heapq.heappop(times))
        found.extend((ts, seq, decode_key(k)) for ts, seq, k in self._purges.scan(before - 1))
        data, dirty = self._data, self._dirty
        for ts, seq, key in found:
            record = ("r", key, ts, seq)
            if data.get(record, _ABSENT) is not _MISSING:
                data[record] = _MISSING
                dirty.add(record)

    # -- commit and restore ---------------------------------------------------------------------------

    def _writes(self, changes: dict[Any, Any]) -> list[tuple[str, list[Any]]]:
        """The statements writing ``changes`` (store key -> entry, or a deletion) to the file."""
        d, enc, pack = self.difference_ms, encode_key, MSGPACK.encode
        rec_put, rec_del, win_put, win_del = [], [], [], []
        for key, value in changes.items():
            deleted = value is None or value is _MISSING
            if key[0] == "r":
                if deleted:
                    rec_del.append((enc(key[1]), key[3]))
                else:
                    rec_put.append((enc(key[1]), key[3], key[2], pack(value)))
            elif deleted:
                win_del.append((enc(key[1]), key[2]))
            else:
                win_put.append((enc(key[1]), key[2], key[2] + d, value[2], pack(list(value))))
        return [
            ("INSERT OR REPLACE INTO srec (k, seq, ts, v) VALUES (?, ?, ?, ?)", rec_put),
            ("DELETE FROM srec WHERE k = ? AND seq = ?", rec_del),
            ("INSERT OR REPLACE INTO swin (k, start, wend, created, v) VALUES (?, ?, ?, ?, ?)", win_put),
            ("DELETE FROM swin WHERE k = ? AND start = ?", win_del),
        ]

    def checkpoint(self, offset: int) -> None:
        """Write the overlay (and the stream time) to the file with the changelog ``offset`` it is committed
        up to, atomically; called after the pylog transaction holding its changelog records committed."""
        self._apply(self._writes(self._data), offset)
        self._data.clear()
        self._records.clear()
        self._windows.clear()
        self._ends.clear()  # the overlay's windows and records are the file's now: found by its indexes
        self._times.clear()
        self._closes.refresh()
        self._purges.refresh()
        self.offset = offset

    def clear(self) -> None:
        """Empty the file (it follows another changelog, or is ahead of it): rebuilt from offset 0."""
        self._wipe()
        self._records.clear()
        self._windows.clear()
        self._ends.clear()
        self._times.clear()
        self._seq = 0
        self._closes.reset()
        self._purges.reset()

    def _restore_latest(self, latest: dict[Any, Any]) -> None:
        self._apply(self._writes(latest), None)
        self._reload()


class SqliteJoinBufferStore(_SqliteTimed, JoinBufferStore):
    """One side of a stream-stream join in a SQLite file (see the module docstring); ``_by_key`` and
    ``_times`` index the overlay's new records only."""

    _TABLES = ("jbuf",)

    def __init__(self, name: str, changelog: str, path: str, changelog_id: str) -> None:
        super().__init__(name, changelog)
        other = self._open(
            path,
            changelog_id,
            [
                "CREATE TABLE IF NOT EXISTS jbuf (k BLOB NOT NULL, seq INTEGER NOT NULL, ts INTEGER NOT NULL,"
                " v BLOB NOT NULL, PRIMARY KEY (k, seq)) WITHOUT ROWID",
                "CREATE INDEX IF NOT EXISTS jbuf_ts ON jbuf (ts, seq)",
            ],
        )
        self._purges = _Sweep(self, "jbuf", "ts", "ts, seq, k, v")
        if other:
            self.clear()
        self._reload()

    def _reload(self) -> None:
        self._next_seq = max(self._next_seq, _count(self, "SELECT MAX(seq) + 1 FROM jbuf"))
        self._purges.refresh()

    def _stored(self, key: Any) -> Any:
        with self._lock:
            row = self._db.execute(
                "SELECT v FROM jbuf WHERE k = ? AND seq = ?", (encode_key(key[0]), key[2])
            ).fetchone()
        return None if row is None else MSGPACK.decode(row[0])

    def _live(self, key: Any) -> Any:
        value = self._data.get(key, _ABSENT)
        if value is _ABSENT:
            return self._stored(key)
        return None if value is _MISSING else value

    # -- reads ----------------------------------------------------------------------------------------

    def matches(self, key: Any, low: int, high: int) -> list[tuple[int, int, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, ts, v FROM jbuf WHERE k = ? AND ts >= ? AND ts <= ?",
                (encode_key(key), low, high),
            ).fetchall()
        data = self._data
        found = {}
        for seq, ts, raw in rows:
            entry = data.get((key, ts, seq), _ABSENT)  # the overlay's entry decides (marked, purged)
            if entry is _ABSENT:
                found[seq] = (ts, seq, MSGPACK.decode(raw)[0])
            elif entry is not _MISSING:
                found[seq] = (ts, seq, entry[0])
        for seq, ts in self._by_key.get(key, ()):
            entry = data.get((key, ts, seq), _MISSING)
            if low <= ts <= high and entry is not _MISSING:
                found[seq] = (ts, seq, entry[0])
        return [found[seq] for seq in sorted(found)]

    def get(self, key: Any, default: Any = None) -> Any:
        entry = self._live(key)
        return default if entry is None else entry

    def __getitem__(self, key: Any) -> Any:
        entry = self._live(key)
        if entry is None:
            raise KeyError(key)
        return entry

    def __contains__(self, key: Any) -> bool:
        return self._live(key) is not None

    def __len__(self) -> int:
        n = _count(self, "SELECT COUNT(*) FROM jbuf")
        for key, value in list(self._data.items()):
            n += (value is not _MISSING) - (self._stored(key) is not None)
        return n

    def items(self) -> list[tuple[Any, Any]]:
        overlay = dict(self._data)
        with self._lock:
            rows = self._db.execute("SELECT k, ts, seq, v FROM jbuf").fetchall()
        out = []
        for raw_key, ts, seq, raw in rows:
            key = (decode_key(raw_key), ts, seq)
            if key not in overlay:
                out.append((key, MSGPACK.decode(raw)))
        out.extend((k, v) for k, v in overlay.items() if v is not _MISSING)
        return out

    def __iter__(self) -> Iterator[Any]:
        return iter([k for k, _ in self.items()])

    def to_dict(self) -> dict[Any, Any]:
        return dict(self.items())

    # -- writes ---------------------------------------------------------------------------------------

    def add(self, key: Any, timestamp: int, value: Any, joined: bool = False) -> None:
        seq = self._next_seq  # above every sequence of the file: a new record, no lookup needed
        self._next_seq += 1
        record = (key, timestamp, seq)
        self._by_key.setdefault(key, []).append((seq, timestamp))
        heapq.heappush(self._times, (timestamp, seq, key))
        self._purges.include(timestamp)
        self._data[record] = [value, joined]
        self._dirty.add(record)

    def mark(self, key: Any, timestamp: int, seq: int) -> None:
        entry = self._live((key, timestamp, seq))
        if entry is None:
            raise KeyError((key, timestamp, seq))
        if not entry[1]:
            self.put((key, timestamp, seq), [entry[0], True])

    def put(self, key: Any, value: Any) -> None:
        if value is None:
            self.delete(key)
            return
        if self._live(key) is None:
            self._by_key.setdefault(key[0], []).append((key[2], key[1]))
            heapq.heappush(self._times, (key[1], key[2], key[0]))
            self._purges.include(key[1])
            self._next_seq = max(self._next_seq, key[2] + 1)
        self._data[key] = value
        self._dirty.add(key)

    def delete(self, key: Any) -> None:
        if self._live(key) is not None:
            self._data[key] = _MISSING
            self._dirty.add(key)

    def purge(self, before: int) -> list[tuple[Any, int, Any]]:
        found: list[tuple[int, int, Any, Any]] = []  # (ts, seq, key, the file's entry or None)
        times = self._times
        while times and times[0][0] < before:
            found.append((*heapq.heappop(times), None))
        found.extend((ts, seq, decode_key(k), v) for ts, seq, k, v in self._purges.scan(before - 1))
        found.sort(key=lambda f: (f[0], f[1]))
        unjoined = []
        data, dirty = self._data, self._dirty
        for ts, seq, key, raw in found:
            record = (key, ts, seq)
            entry = data.get(record, _ABSENT)  # the overlay's entry decides, else the file's
            if entry is _ABSENT and raw is not None:
                entry = MSGPACK.decode(raw)
            if entry is not _ABSENT and entry is not _MISSING:
                if not entry[1]:
                    unjoined.append((key, ts, entry[0]))
                data[record] = _MISSING
                dirty.add(record)
        return unjoined

    # -- commit and restore ---------------------------------------------------------------------------

    def _writes(self, changes: dict[Any, Any]) -> list[tuple[str, list[Any]]]:
        enc, pack = encode_key, MSGPACK.encode
        puts = [
            (enc(k[0]), k[2], k[1], pack(list(v)))
            for k, v in changes.items()
            if v is not None and v is not _MISSING
        ]
        deletes = [(enc(k[0]), k[2]) for k, v in changes.items() if v is None or v is _MISSING]
        return [
            ("INSERT OR REPLACE INTO jbuf (k, seq, ts, v) VALUES (?, ?, ?, ?)", puts),
            ("DELETE FROM jbuf WHERE k = ? AND seq = ?", deletes),
        ]

    def checkpoint(self, offset: int) -> None:
        """Write the overlay (and the stream time) to the file with the changelog ``offset`` it is committed
        up to, atomically; called after the pylog transaction holding its changelog records committed."""
        self._apply(self._writes(self._data), offset)
        self._data.clear()
        self._by_key.clear()
        self._times.clear()  # the overlay's records are the file's now: found by its index
        self._purges.refresh()
        self.offset = offset

    def clear(self) -> None:
        """Empty the file (it follows another changelog, or is ahead of it): rebuilt from offset 0."""
        self._wipe()
        self._by_key.clear()
        self._times.clear()
        self._next_seq = 0
        self._purges.reset()

    def _restore_latest(self, latest: dict[Any, Any]) -> None:
        self._apply(self._writes(latest), None)
        self._reload()


class SqliteSuppressBuffer(_SqliteTimed, SuppressBuffer):
    """A suppression buffer in a SQLite file (see the module docstring). ``_heap`` holds the keys the overlay
    added (by buffer time); the file's keys are read in ``(buffer_time, seq)`` order, a page at a time, and an
    eviction takes the earlier of the two heads. ``bytes`` counts the whole buffer, file and overlay."""

    _TABLES = ("held",)

    def __init__(self, name: str, changelog: str, path: str, changelog_id: str) -> None:
        super().__init__(name, changelog)
        other = self._open(
            path,
            changelog_id,
            [
                "CREATE TABLE IF NOT EXISTS held (k BLOB PRIMARY KEY, bt INTEGER NOT NULL, seq INTEGER NOT NULL,"
                " size INTEGER NOT NULL, v BLOB NOT NULL) WITHOUT ROWID",
                "CREATE INDEX IF NOT EXISTS held_order ON held (bt, seq)",
            ],
        )
        self._page: deque[tuple[int, int, Any]] = deque()  # the file's next keys: (buffer_time, seq, key)
        if other:
            self.clear()
        self._reload()

    def _reload(self) -> None:
        """The byte count and the next sequence from the file; its eviction order read again from the start."""
        self.bytes = _count(self, "SELECT SUM(size) FROM held")
        self._held = _count(self, "SELECT COUNT(*) FROM held")  # keys held, file and overlay
        self._seq = itertools.count(_count(self, "SELECT MAX(seq) + 1 FROM held"))
        self._rewind()

    def _rewind(self) -> None:
        self._page.clear()
        self._after = (_MIN_TIME, _MIN_TIME)  # the last (buffer_time, seq) read from the file
        self._read_all = False

    def _stored(self, key: Any) -> tuple[Any, int, int, int, int] | None:
        with self._lock:
            row = self._db.execute("SELECT v, size FROM held WHERE k = ?", (encode_key(key),)).fetchone()
        if row is None:
            return None
        value, buffer_time, timestamp, seq = MSGPACK.decode(row[0])
        return value, buffer_time, timestamp, seq, row[1]

    def _live(self, key: Any) -> Any:
        value = self._data.get(key, _ABSENT)
        if value is _ABSENT:
            return self._stored(key)
        return None if value is _MISSING else value

    # -- eviction order -------------------------------------------------------------------------------

    def _file_head(self) -> tuple[int, int, Any] | None:
        """The file's earliest key still held as the file has it (not evicted nor buffered again since)."""
        page, data = self._page, self._data
        while True:
            if not page:
                if self._read_all:
                    return None
                bt, seq = self._after
                with self._lock:
                    rows = self._db.execute(
                        "SELECT bt, seq, k FROM held WHERE bt > ? OR (bt = ? AND seq > ?) ORDER BY bt, seq"
                        " LIMIT ?",
                        (bt, bt, seq, _PAGE),
                    ).fetchall()
                self._read_all = len(rows) < _PAGE
                if not rows:
                    return None
                self._after = (rows[-1][0], rows[-1][1])
                page.extend((b, s, decode_key(k)) for b, s, k in rows)
            bt, seq, key = page[0]
            entry = data.get(key, _ABSENT)
            if entry is _ABSENT or (entry is not _MISSING and entry[3] == seq):
                return page[0]
            page.popleft()

    def _heap_head(self) -> tuple[int, int, Any] | None:
        heap, data = self._heap, self._data
        while heap:
            entry = data.get(heap[0][2], _MISSING)
            if entry is not _MISSING and entry[3] == heap[0][1]:
                return heap[0]
            heapq.heappop(heap)
        return None

    def oldest(self) -> int | None:
        heads = [h for h in (self._heap_head(), self._file_head()) if h is not None]
        return min(h[:2] for h in heads)[0] if heads else None

    def evict(self) -> tuple[Any, Any, int]:
        mine, theirs = self._heap_head(), self._file_head()
        if theirs is None or (mine is not None and mine[:2] < theirs[:2]):
            _, _, key = heapq.heappop(self._heap)
        else:
            _, _, key = self._page.popleft()
        value, _, timestamp, _, size = self._live(key)
        self._data[key] = _MISSING
        self.bytes -= size
        self._held -= 1
        self._dirty.add(key)
        return key, value, timestamp

    # -- reads and writes -----------------------------------------------------------------------------

    def buffer(self, key: Any, value: Any, timestamp: int) -> None:
        old = self._live(key)
        size = len(encode_key(key)) + (0 if value is None else len(MSGPACK.encode(value)))
        if old is None:
            seq = next(self._seq)
            heapq.heappush(self._heap, (timestamp, seq, key))
            self._data[key] = (value, timestamp, timestamp, seq, size)
            self._held += 1
        else:
            self.bytes -= old[4]
            self._data[key] = (value, old[1], timestamp, old[3], size)
        self.bytes += size
        self._dirty.add(key)

    def get(self, key: Any, default: Any = None) -> Any:
        entry = self._live(key)
        return default if entry is None else entry[0]

    def __contains__(self, key: Any) -> bool:
        return self._live(key) is not None

    def __len__(self) -> int:
        return self._held  # counted as keys come and go: the node checks max_records after each record

    def items(self) -> list[tuple[Any, Any]]:
        overlay = dict(self._data)
        with self._lock:
            rows = self._db.execute("SELECT k, v FROM held").fetchall()
        out = []
        for raw_key, raw in rows:
            key = decode_key(raw_key)
            if key not in overlay:
                out.append((key, MSGPACK.decode(raw)[0]))
        out.extend((k, v[0]) for k, v in overlay.items() if v is not _MISSING)
        return out

    def __iter__(self) -> Iterator[Any]:
        return iter([k for k, _ in self.items()])

    # -- commit and restore ---------------------------------------------------------------------------

    def _writes(self, changes: dict[Any, Any]) -> list[tuple[str, list[Any]]]:
        """``changes``: key -> ``(value, buffer_time, timestamp, seq, size)``, or a deletion."""
        enc, pack = encode_key, MSGPACK.encode
        puts = [
            (enc(k), v[1], v[3], v[4], pack(list(v[:4])))
            for k, v in changes.items()
            if v is not None and v is not _MISSING
        ]
        deletes = [(enc(k),) for k, v in changes.items() if v is None or v is _MISSING]
        return [
            ("INSERT OR REPLACE INTO held (k, bt, seq, size, v) VALUES (?, ?, ?, ?, ?)", puts),
            ("DELETE FROM held WHERE k = ?", deletes),
        ]

    def checkpoint(self, offset: int) -> None:
        """Write the overlay (and the stream time) to the file with the changelog ``offset`` it is committed
        up to, atomically; called after the pylog transaction holding its changelog records committed."""
        self._apply(self._writes(self._data), offset)
        self._data.clear()
        self._heap.clear()  # the overlay's keys are the file's now: read in order from it
        self._rewind()
        self.offset = offset

    def clear(self) -> None:
        """Empty the file (it follows another changelog, or is ahead of it): rebuilt from offset 0."""
        self._wipe()
        self._heap.clear()
        self.bytes = 0
        self._held = 0
        self._seq = itertools.count()
        self._rewind()

    def _restore_latest(self, latest: dict[Any, Any]) -> None:
        changes: dict[Any, Any] = {}
        for key, value in latest.items():
            if value is None:
                changes[key] = None
            else:
                held = value[0]
                size = len(encode_key(key)) + (0 if held is None else len(MSGPACK.encode(held)))
                changes[key] = (held, value[1], value[2], value[3], size)
        self._apply(self._writes(changes), None)
        self._reload()


class SqliteSubscriptionStore(SqliteStore):
    """The subscriptions of a foreign-key join in a SQLite file (see the module docstring): ``(foreign_key,
    encoded_left_key) -> [left_value_hash, left_partition]``, as :class:`~pylog.streams.stores.SubscriptionStore`;
    :meth:`subscribers` is a range of the file's primary key beside the overlay's changes of that foreign key."""

    def __init__(self, name: str, changelog: str, path: str, changelog_id: str) -> None:
        self._changed: dict[Any, set[Any]] = {}  # foreign key -> left keys changed in the overlay
        super().__init__(name, changelog, path, changelog_id)

    def subscribers(self, foreign_key: Any) -> list[tuple[bytes, Any]]:
        """``(encoded_left_key, [hash, partition])`` of the rows subscribed to ``foreign_key``."""
        low = b"\x92" + encode_key(foreign_key)  # msgpack: a 2-array, then the foreign key's own bytes
        high = _successor(low)
        with self._lock:
            rows = self._db.execute(
                "SELECT k, v FROM kv WHERE k >= ? AND k < ?"
                if high is not None
                else "SELECT k, v FROM kv WHERE k >= ?",
                (low, high) if high is not None else (low,),
            ).fetchall()
        overlay = self._overlay
        found = {}
        for raw_key, raw in rows:
            key = decode_key(raw_key)
            if key not in overlay:
                found[key[1]] = MSGPACK.decode(raw)
        for left_key in list(self._changed.get(foreign_key, ())):
            value = overlay.get((foreign_key, left_key), _DELETED)
            if value is _DELETED:
                found.pop(left_key, None)
            else:
                found[left_key] = value
        return list(found.items())

    def put(self, key: Any, value: Any) -> None:
        super().put(key, value)
        if value is not None:
            self._changed.setdefault(key[0], set()).add(key[1])

    def delete(self, key: Any) -> None:
        super().delete(key)
        self._changed.setdefault(key[0], set()).add(key[1])

    def checkpoint(self, offset: int) -> None:
        super().checkpoint(offset)
        self._changed.clear()

    def clear(self) -> None:
        super().clear()
        self._changed.clear()


def _successor(prefix: bytes) -> bytes | None:
    """The least byte string greater than every string starting with ``prefix`` (None: there is none)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])
