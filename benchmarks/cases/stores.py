"""Embedded stores a Python user would pick instead of a log, and the price of one fsync per record.

The queue libraries are orders of magnitude slower than the floors, so they run on fewer records (a fixed
share of ``--records`` with a cap); rec/s stays comparable.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.cases import case
from benchmarks.cases.workload import byte_lists, result, settle

__all__ = ["run_threads", "scaled"]

_QUEUE_CAP = 50_000
_PQ_CAP = 20_000
_FSYNC_CAP = 2_000
_FSYNC_RECORD = 128


def scaled(records: int, cap: int) -> int:
    """A queue case's record count: a twentieth of ``records``, at least 1,000, at most ``cap``."""
    return min(records, max(1_000, min(cap, records // 20)))


# -- sqlite3 --------------------------------------------------------------------------------------------


def _sqlite_fill(path: Path, keys: list[bytes], values: list[bytes]) -> tuple[float, str]:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE log (offset INTEGER PRIMARY KEY, key BLOB, value BLOB)")
    synchronous = _synchronous(conn)
    t0 = time.perf_counter()
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO log (key, value) VALUES (?, ?)", zip(keys, values, strict=True))
    conn.execute("COMMIT")
    seconds = time.perf_counter() - t0
    conn.close()
    return seconds, synchronous


@case(
    "sqlite3_write",
    group="write",
    kind="peer",
    fsync="WAL, synchronous=FULL: one commit, so one fsync of the WAL at the end",
    description="stdlib `sqlite3`, WAL, `executemany` of `(key, value)` in one transaction",
)
def sqlite3_write(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    keys, values = byte_lists(records, seed)
    path = workdir / "log.sqlite"
    seconds, synchronous = _sqlite_fill(path, keys, values)
    return result(records, seconds, synchronous=synchronous, sqlite_version=sqlite3.sqlite_version)


@case(
    "sqlite3_read",
    group="read",
    kind="peer",
    fsync="n/a (read)",
    description="stdlib `sqlite3`: iterate a cursor over `SELECT key, value ... ORDER BY offset`",
)
def sqlite3_read(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    keys, values = byte_lists(records, seed)
    path = workdir / "log.sqlite"
    _sqlite_fill(path, keys, values)
    del keys, values
    settle([workdir])
    conn = sqlite3.connect(path)
    n = 0
    t0 = time.perf_counter()
    for _k, _v in conn.execute("SELECT key, value FROM log ORDER BY offset"):
        n += 1
    seconds = time.perf_counter() - t0
    conn.close()
    return _checked(records, n, seconds)


# -- diskcache ------------------------------------------------------------------------------------------


def _deque(workdir: Path) -> Any:
    import diskcache

    return diskcache.Deque(directory=str(workdir / "deque"))


@case(
    "diskcache_deque_write",
    group="write",
    kind="peer",
    fsync="SQLite WAL, synchronous=NORMAL (diskcache's default): a commit per append, no fsync",
    description="`diskcache.Deque.append((k, v))`, one record at a time (fewer records)",
)
def diskcache_deque_write(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    n = scaled(records, _QUEUE_CAP)
    keys, values = byte_lists(n, seed)
    dq = _deque(workdir)
    append = dq.append
    t0 = time.perf_counter()
    for kv in zip(keys, values, strict=True):
        append(kv)
    seconds = time.perf_counter() - t0
    return result(n, seconds)


@case(
    "diskcache_deque_read",
    group="read",
    kind="peer",
    fsync="n/a (read)",
    description="iterate a `diskcache.Deque` (non-destructive, like a log reader; fewer records)",
)
def diskcache_deque_read(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    n = scaled(records, _QUEUE_CAP)
    keys, values = byte_lists(n, seed)
    dq = _deque(workdir)
    dq.extend(zip(keys, values, strict=True))
    del keys, values
    settle([workdir])
    got = 0
    t0 = time.perf_counter()
    for _item in dq:
        got += 1
    seconds = time.perf_counter() - t0
    return _checked(n, got, seconds)


_COMMIT_CAP = 20_000


def _sqlite_commit_each(workdir: Path, records: int, seed: int, synchronous: str) -> dict[str, Any]:
    """One ``INSERT`` and one ``COMMIT`` per record, as an application that needs each record stored before
    it goes on: what ``send().get()`` does for one record."""
    n = scaled(records, _COMMIT_CAP)
    keys, values = byte_lists(n, seed)
    conn = sqlite3.connect(workdir / "commits.sqlite", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("CREATE TABLE log (offset INTEGER PRIMARY KEY, key BLOB, value BLOB)")
    execute = conn.execute
    t0 = time.perf_counter()
    for k, v in zip(keys, values, strict=True):
        execute("BEGIN")
        execute("INSERT INTO log (key, value) VALUES (?, ?)", (k, v))
        execute("COMMIT")
    seconds = time.perf_counter() - t0
    got = _synchronous(conn)
    conn.close()
    return result(n, seconds, synchronous=got, sqlite_version=sqlite3.sqlite_version)


@case(
    "sqlite3_commit_normal",
    group="write",
    kind="peer",
    fsync="WAL, synchronous=NORMAL: a commit per record reaches the OS (survives a process crash), no fsync",
    description="stdlib `sqlite3`, WAL: `BEGIN`, `INSERT` of `(key, value)`, `COMMIT`, per record (fewer records)",
)
def sqlite3_commit_normal(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _sqlite_commit_each(workdir, records, seed, "NORMAL")


@case(
    "sqlite3_commit_full",
    group="durable",
    kind="peer",
    fsync="WAL, synchronous=FULL: every commit fsyncs the WAL (survives power loss)",
    description="stdlib `sqlite3`, WAL: `BEGIN`, `INSERT` of `(key, value)`, `COMMIT`, per record (fewer records)",
)
def sqlite3_commit_full(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _sqlite_commit_each(workdir, min(records, _FSYNC_CAP * 2), seed, "FULL")


# -- persist-queue --------------------------------------------------------------------------------------


def _sqlite_queue(workdir: Path, *, multithreading: bool = False) -> Any:
    import persistqueue

    return persistqueue.SQLiteQueue(str(workdir / "pq"), auto_commit=True, multithreading=multithreading)


def _synchronous(conn: sqlite3.Connection) -> str:
    return {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[conn.execute("PRAGMA synchronous").fetchone()[0]]


@case(
    "persistqueue_write",
    group="write",
    kind="peer",
    fsync="SQLite WAL, synchronous=FULL (the package's default): a commit and an fsync per put",
    description="`persistqueue.SQLiteQueue(auto_commit=True).put((k, v))`, one thread (fewer records)",
)
def persistqueue_write(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    n = scaled(records, _PQ_CAP)
    keys, values = byte_lists(n, seed)
    q = _sqlite_queue(workdir)
    put = q.put
    t0 = time.perf_counter()
    for kv in zip(keys, values, strict=True):
        put(kv)
    seconds = time.perf_counter() - t0
    return result(n, seconds, synchronous=_synchronous(q._putter))


@case(
    "persistqueue_read",
    group="read",
    kind="peer",
    fsync="a commit per get (the get deletes the row)",
    description="`persistqueue.SQLiteQueue.get()` until empty (destructive: a queue has no other read)",
)
def persistqueue_read(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    n = scaled(records, _PQ_CAP)
    keys, values = byte_lists(n, seed)
    q = _sqlite_queue(workdir)
    q._putter.execute("PRAGMA synchronous=OFF")  # fills faster; the timed gets use the same connection
    for kv in zip(keys, values, strict=True):
        q.put(kv)
    q._putter.execute("PRAGMA synchronous=FULL")
    del keys, values
    settle([workdir])
    get = q.get
    t0 = time.perf_counter()
    for _ in range(n):
        get(block=False)
    seconds = time.perf_counter() - t0
    return result(n, seconds, left=q.qsize())


@case(
    "persistqueue_durable_8_threads",
    group="durable",
    kind="peer",
    fsync="SQLite WAL, synchronous=FULL set explicitly: every put is durable when it returns",
    description="8 threads put into one `SQLiteQueue(multithreading=True)`; its commits are serialized",
)
def persistqueue_durable_8_threads(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    n = scaled(records, _PQ_CAP) // 8 * 8
    keys, values = byte_lists(n, seed)
    q = _sqlite_queue(workdir, multithreading=True)
    q._putter.execute("PRAGMA synchronous=FULL")
    chunks = [list(zip(keys[i::8], values[i::8], strict=True)) for i in range(8)]

    def put_all(items: list[tuple[bytes, bytes]]) -> None:
        for kv in items:
            q.put(kv)

    seconds = run_threads(put_all, chunks)
    return result(n, seconds, threads=8, synchronous=_synchronous(q._putter))


def run_threads(target: Any, chunks: list[Any]) -> float:
    """Start one thread per chunk at once; the seconds until the last one finished. Raises what a thread
    raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(chunks) + 1)

    def body(chunk: Any) -> None:
        start.wait()
        try:
            target(chunk)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(c,)) for c in chunks]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return seconds


# -- fsync ----------------------------------------------------------------------------------------------


@case(
    "fsync_per_record",
    group="durable",
    kind="floor",
    fsync="one fsync per record",
    description="append 128 B with `os.write` + `os.fsync` per record (the baseline of group commit)",
)
def fsync_per_record(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    n = min(records, _FSYNC_CAP)
    payload = np.random.default_rng(seed).integers(0, 256, _FSYNC_RECORD, dtype=np.uint8).tobytes()
    latencies = np.empty(n)
    fd = os.open(workdir / "fsync.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        clock = time.perf_counter
        t0 = clock()
        for i in range(n):
            s = clock()
            os.write(fd, payload)
            os.fsync(fd)
            latencies[i] = clock() - s
        seconds = clock() - t0
    finally:
        os.close(fd)
    p50, p99 = np.percentile(latencies, [50, 99]) * 1e6
    return result(n, seconds, n * _FSYNC_RECORD, p50_us=round(float(p50), 1), p99_us=round(float(p99), 1))


def _checked(expected: int, n: int, seconds: float) -> dict[str, Any]:
    if n != expected:
        raise RuntimeError(f"read {n} records, expected {expected}")
    return result(n, seconds)
