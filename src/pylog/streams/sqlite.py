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
interactive queries may read from other threads (one connection, calls serialized by a lock). Window and
session stores stay in memory.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

from pylog.streams.serde import MSGPACK
from pylog.streams.stores import KeyValueStore, decode_key, encode_key

__all__ = ["CACHE_ENTRIES", "SqliteStore"]

_DELETED: Any = object()
_ABSENT: Any = object()
CACHE_ENTRIES = 100_000  # committed values kept in memory per store, most recently used first


class SqliteStore(KeyValueStore):
    """A key-value store in a SQLite file (see the module docstring). ``changelog_id`` identifies the changelog
    topic the file follows (its topic id)."""

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
