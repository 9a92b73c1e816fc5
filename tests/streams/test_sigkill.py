"""Exactly-once under SIGKILL: a stream application process (two stream threads: a stateless branch and a
count through a repartition topic) is killed at random moments and restarted, then runs to the end; every
input then has exactly one committed output, every count is emitted once and in order, and the store's
changelog holds the model's counts."""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from streams_helpers import Child, committed_records, stop_all, wait_for

import pylog
from pylog.idempotent import IdempotentProducer
from pylog.streams import App, TumblingWindows
from pylog.streams.admin import read_store
from pylog.streams.sqlite import SqliteStore, SqliteWindowStore
from pylog.streams.sqlite_buffers import SqliteSuppressBuffer
from pylog.streams.stores import decode_key

INPUT = 2000
BASE_MS = int(time.time()) * 1000  # event times near now (not past any retention), windows aligned to it
KILLS = 4
CHUNK = INPUT // (KILLS + 1)


def _app_process(
    path: str,
    out: str,
    delay: float,
    instance: str = "worker",
    threads: int = 2,
    state_dir: str | None = None,
    crash_at_commit: int = 0,
    crash_in_restore: bool = False,
    windowed: bool = False,
    suppressed: bool = False,
) -> None:
    """Runs in a forked child until SIGTERM, ``delay`` seconds per record; writes its metrics to ``out`` when it
        stops cleanly. With ``crash_at_commit=n``, the process dies (exit 17) at its n-th commit, after the
        transaction's records and offsets were written and before it commits; with ``crash_in_restore``, after
        the first batch of a SQLite store's restore reached its file; ``windowed``: also a tumbling-window count
    per user (100 ms, grace 1 s; late records to ``late-w``) to ``windowed-out``; ``suppressed``: also the counts
    through ``suppress(until_time_limit=50)`` (the buffer ``held``) to ``held-out``."""
    if crash_in_restore:
        real_restore = SqliteStore.restore_decoded

        def restore(self: SqliteStore, keys: list[object], values: list[object]) -> None:
            real_restore(self, keys, values)
            os._exit(17)

        SqliteStore.restore_decoded = restore  # type: ignore[method-assign]
    if crash_at_commit:
        commits = iter(range(1, 1 << 30))
        real_commit = IdempotentProducer.commit_transaction

        def commit(self: IdempotentProducer) -> None:
            if next(commits) == crash_at_commit:
                self.flush()
                os._exit(17)
            real_commit(self)

        IdempotentProducer.commit_transaction = commit  # type: ignore[method-assign]
    with pylog.open(path) as log:
        app = App(
            log, "eos", instance_id=instance, commit_interval_ms=30, max_poll_records=50, state_dir=state_dir
        )
        events = app.stream("in")
        events.peek(lambda k, v: time.sleep(delay)).map_values(lambda v: v["i"]).to("echo")
        counts = events.group_by(lambda k, v: v["user"]).count(name="counts")
        counts.to_stream().to("counts-out")
        if suppressed:
            counts.suppress(until_time_limit=50, name="held").to_stream().to("held-out")
        if windowed:
            events.group_by(lambda k, v: v["user"]).windowed_by(
                TumblingWindows(100, 1000), late_topic="late-w"
            ).count(name="windowed").to_stream().to("windowed-out")
        app.run(threads=threads)
        with open(out, "w") as f:
            json.dump(app.metrics(), f)


def _produce(path: str, start: int, stop: int) -> None:
    with pylog.open(path) as log:
        producer = log.producer()
        for i in range(start, stop):  # event time i ms on: windows of 100 ms close as the input goes on
            producer.send("in", {"i": i, "user": f"u{i % 37}"}, key=f"k{i % 101}", timestamp_ms=BASE_MS + i)
        producer.close()


def _fork(
    path: str,
    out: str,
    delay: float = 0.0,
    instance: str = "worker",
    threads: int = 2,
    state_dir: str | None = None,
    crash_at_commit: int = 0,
    crash_in_restore: bool = False,
    windowed: bool = False,
    suppressed: bool = False,
) -> Child:
    return Child(
        lambda: _app_process(
            path,
            out,
            delay,
            instance,
            threads,
            state_dir,
            crash_at_commit,
            crash_in_restore,
            windowed,
            suppressed,
        )
    )


def _in_files(state_dir: str, name: str, open_file: Callable[[str], Any]) -> dict[Any, Any]:
    """What the SQLite files of store ``name`` under ``state_dir`` (one per task) hold together, each file
    opened with ``open_file`` (its path)."""
    held: dict[Any, Any] = {}
    for file in sorted(Path(state_dir).rglob(f"{name}.sqlite")):
        store = open_file(str(file))
        held.update(store.to_dict())
        store.close()
    return held


@pytest.mark.parametrize("stores", ["memory", "sqlite"])
def test_sigkill_loop_is_exactly_once(tmp_path: Path, stores: str) -> None:
    path = str(tmp_path / "log")
    state_dir = str(tmp_path / "state") if stores == "sqlite" else None
    with pylog.open(path) as log:
        log.create_topic("in", partitions=4)
        log.create_topic("echo", partitions=2)
        log.create_topic("counts-out", partitions=2)
    rng = random.Random(30)
    started = time.monotonic()
    for run in range(KILLS):  # each run gets new input, and is killed in the middle of it (mostly)
        _produce(path, run * CHUNK, (run + 1) * CHUNK)
        # 5 ms per record: a run cannot finish its chunk before it is killed (at most 0.7 s)
        with _fork(path, str(tmp_path / "unused.json"), 0.005, state_dir=state_dir) as app:
            time.sleep(rng.uniform(0.2, 0.7))
            app.kill()
    with pylog.open(path) as log:
        before = len(committed_records(log, "counts-out"))
    _produce(path, KILLS * CHUNK, INPUT)
    with _fork(path, str(tmp_path / "metrics.json"), state_dir=state_dir) as app:
        with pylog.open(path) as log:
            wait_for(lambda: len(committed_records(log, "counts-out")) >= INPUT, "the last run to finish")
        app.stop()
    _check(
        path,
        f"{stores} stores, {KILLS} kills in {time.monotonic() - started:.1f} s; {before} of {INPUT} counts "
        "committed before the last run",
        json.loads((tmp_path / "metrics.json").read_text()),
    )
    if state_dir is not None:  # the files hold the committed state too
        with pylog.open(path) as log:
            topic_id = str(log.topic("eos-counts-changelog").topic_id)
        held: dict[str, int] = _in_files(
            state_dir, "counts", lambda file: SqliteStore("counts", "eos-counts-changelog", file, topic_id)
        )
        assert held == dict(Counter(f"u{i % 37}" for i in range(INPUT)))
    assert before < KILLS * CHUNK, "the kills interrupted the work"


def _check(path: str, what: str, metrics: object) -> None:
    """Exactly once: every input once in echo, each user's counts 1..n once and in order, the changelog table
    equal to the model, committed offsets at the log end."""
    with pylog.open(path) as log:
        echo = Counter(r.value for r in committed_records(log, "echo"))
        counts: dict[str, list[int]] = {}
        for r in committed_records(log, "counts-out"):
            counts.setdefault(r.key.decode(), []).append(r.value)
        table = log.topic("eos-counts-changelog").table(
            isolation_level="read_committed", key_deserializer=decode_key
        )
        written = sum(1 for _ in log.consumer("echo", auto_offset_reset="earliest", consumer_timeout_ms=0))
        offsets = {tp.partition: om.offset for tp, om in log.group_offsets("eos").items() if tp.topic == "in"}
        ends = log.topic("in").end_offsets()
    duplicates = sum(c - 1 for c in echo.values() if c > 1)
    missing = INPUT - len(set(echo) & set(range(INPUT)))
    print(
        f"streams exactly-once: {what}; {written} echo records written, {sum(echo.values())} committed, "
        f"{duplicates} duplicates, {missing} missing; last run: {metrics}"
    )
    users = Counter(f"u{i % 37}" for i in range(INPUT))
    assert duplicates == 0 and missing == 0 and set(echo) == set(range(INPUT))
    assert counts == {u: list(range(1, n + 1)) for u, n in users.items()}
    assert table == dict(users)
    assert offsets == ends


def test_three_processes_killed_and_restarted_are_exactly_once(tmp_path: Path) -> None:
    """Three application processes share the tasks; one of them at a time is killed at a random moment (while
    processing, while the group rebalances after the previous restart, or while it restores its tasks) and
    restarted under the same instance id, with new input arriving all along."""
    path = str(tmp_path / "log")
    with pylog.open(path) as log:
        log.create_topic("in", partitions=6)
        log.create_topic("echo", partitions=2)
        log.create_topic("counts-out", partitions=2)
    rng = random.Random(31)
    kills = 5
    chunk = INPUT // (kills + 1)
    started = time.monotonic()
    apps: dict[int, Child] = {}
    try:
        for i in range(3):
            apps[i] = _fork(path, str(tmp_path / f"metrics-{i}.json"), 0.002, f"w{i}", 1)
        for run in range(kills):
            _produce(path, run * chunk, (run + 1) * chunk)
            time.sleep(rng.uniform(0.1, 0.5))
            victim = rng.randrange(3)
            apps[victim].kill()
            time.sleep(rng.uniform(0.0, 0.3))
            apps[victim] = _fork(path, str(tmp_path / f"metrics-{victim}.json"), 0.002, f"w{victim}", 1)
        _produce(path, kills * chunk, INPUT)
        with pylog.open(path) as log:
            wait_for(lambda: len(committed_records(log, "counts-out")) >= INPUT, "the processes to finish")
        stop_all(apps)
    finally:
        for app in apps.values():
            app.kill()
    metrics = [json.loads((tmp_path / f"metrics-{i}.json").read_text()) for i in range(3)]
    _check(path, f"3 processes, {kills} kills in {time.monotonic() - started:.1f} s", metrics)


def _crash_at_commits_then_finish(
    path: str, tmp_path: Path, state_dir: str | None, *, settled: bool = False, **kind: bool
) -> object:
    """Three runs of the application (``kind``: windowed or suppressed) that die at a commit point, after
    committing 2, 1 and 4 times (each run commits n - 1 times, then dies in its n-th commit), then one that
    runs until the count of every input record is committed (``settled``: and the group's offsets too) and
    is stopped with SIGTERM: the metrics of the last run."""
    for n in (3, 2, 5):
        with _fork(path, str(tmp_path / "unused.json"), 0.0005, "worker", 1, state_dir, n, **kind) as app:
            code = app.wait()
            assert code == 17, f"run exited with {code}"
    with _fork(path, str(tmp_path / "metrics.json"), 0.0, "worker", 1, state_dir, **kind) as app:
        with pylog.open(path) as log:
            wait_for(lambda: len(committed_records(log, "counts-out")) >= INPUT, "the last run to finish")
            if settled:
                wait_for(lambda: sum(log.group_lag("eos").values()) == 0, "the last run's commits")
        app.stop()
    return json.loads((tmp_path / "metrics.json").read_text())


@pytest.mark.parametrize("stores", ["memory", "sqlite"])
def test_a_crash_at_the_commit_point_loses_and_doubles_nothing(tmp_path: Path, stores: str) -> None:
    """The process dies at a commit, after the changelog records and offsets of the transaction were written
    and before its commit decision, several times in a row; the state the next run starts from (restored from
    the changelog, or from a SQLite file and the changelog after its checkpoint) is the committed one."""
    path = str(tmp_path / "log")
    state_dir = str(tmp_path / "state") if stores == "sqlite" else None
    with pylog.open(path) as log:
        log.create_topic("in", partitions=2)
        log.create_topic("echo", partitions=2)
        log.create_topic("counts-out", partitions=2)
    _produce(path, 0, INPUT)
    metrics = _crash_at_commits_then_finish(path, tmp_path, state_dir)
    _check(path, f"{stores} stores, 3 crashes at a commit", metrics)


def test_crashes_at_the_commit_point_with_sqlite_window_stores(tmp_path: Path) -> None:
    """As above with a tumbling-window count kept in SQLite files: windows close (and leave the files) while
    the process dies at commits several times; every input is then counted in exactly one window or written
    once as late, each window's updates are 1..n once and in order, and the files hold the committed open
    windows (the changelog's table), nothing of the aborted transactions."""
    path = str(tmp_path / "log")
    state_dir = str(tmp_path / "state")
    with pylog.open(path) as log:
        for topic in ("in", "echo", "counts-out", "windowed-out", "late-w"):
            log.create_topic(topic, partitions=2)
    _produce(path, 0, INPUT)
    metrics = _crash_at_commits_then_finish(path, tmp_path, state_dir, settled=True, windowed=True)
    _check(path, "sqlite window stores, 3 crashes at a commit", metrics)
    with pylog.open(path) as log:
        updates: dict[tuple[str, int], list[int]] = {}
        for r in committed_records(log, "windowed-out"):
            user, start, _ = decode_key(r.key)
            updates.setdefault((user, start), []).append(r.value)
        late = [r.value["i"] for r in committed_records(log, "late-w")]
        table = {w: v[0] for w, v in read_store(log, "eos", "windowed").items()}
        topic_id = str(log.topic("eos-windowed-changelog").topic_id)
    assert all(counts == list(range(1, len(counts) + 1)) for counts in updates.values()), (
        "updates once, in order"
    )
    assert len(late) == len(set(late)) and sum(len(c) for c in updates.values()) + len(late) == INPUT
    held: dict[tuple[str, int], int] = _in_files(
        state_dir,
        "windowed",
        lambda file: SqliteWindowStore("windowed", "eos-windowed-changelog", 100, file, topic_id),
    )
    assert held == table and all(len(updates[w]) == n for w, n in held.items())
    assert held and len(held) < len(updates), "windows closed and left the files"
    print(f"{len(updates)} windows, {len(held)} open in the files, {len(late)} late records")


def test_crashes_at_the_commit_point_with_a_sqlite_suppression_buffer(tmp_path: Path) -> None:
    """As above with the counts also sent through a suppression buffer kept in a SQLite file: the process dies at
    commits several times while keys are held and evicted; then each user's suppressed counts are increasing
    (none emitted twice), the last one emitted or the one still held is the user's count, and the files hold
    exactly the buffer of the changelog (what the committed transactions left), nothing of the aborted ones."""
    path = str(tmp_path / "log")
    state_dir = str(tmp_path / "state")
    with pylog.open(path) as log:
        for topic in ("in", "echo", "counts-out", "held-out"):
            log.create_topic(topic, partitions=2)
    _produce(path, 0, INPUT)
    metrics = _crash_at_commits_then_finish(path, tmp_path, state_dir, settled=True, suppressed=True)
    _check(path, "sqlite suppression buffer, 3 crashes at a commit", metrics)
    with pylog.open(path) as log:
        emitted: dict[str, list[int]] = {}
        for r in committed_records(log, "held-out"):
            emitted.setdefault(r.key.decode(), []).append(r.value)
        table = {k: v[0] for k, v in read_store(log, "eos", "held").items()}
        topic_id = str(log.topic("eos-held-changelog").topic_id)
    held: dict[str, int] = _in_files(
        state_dir, "held", lambda file: SqliteSuppressBuffer("held", "eos-held-changelog", file, topic_id)
    )
    assert held == table, "the files hold the committed buffer"
    assert all(values == sorted(set(values)) for values in emitted.values()), "increasing, none twice"
    users = Counter(f"u{i % 37}" for i in range(INPUT))
    assert {u: held.get(u, emitted.get(u, [None])[-1]) for u in users} == dict(users)
    assert held and sum(len(v) for v in emitted.values()) > len(users), "keys were held and evicted"
    print(
        f"{sum(len(v) for v in emitted.values())} suppressed counts emitted, {len(held)} keys held at the end"
    )


def test_a_crash_in_the_middle_of_a_restore_is_repaired(tmp_path: Path) -> None:
    """A process with SQLite stores dies after the first batch of a restore reached its file (the file's offset
    not yet recorded); the next run restores again from the file's offset and continues exactly once."""
    path = str(tmp_path / "log")
    state_dir = str(tmp_path / "state")
    with pylog.open(path) as log:
        log.create_topic("in", partitions=2)
        log.create_topic("echo", partitions=2)
        log.create_topic("counts-out", partitions=2)
    _produce(path, 0, INPUT // 2)
    # in-memory stores: the changelog fills up
    with _fork(path, str(tmp_path / "unused.json"), 0.0, "worker", 1) as app:
        with pylog.open(path) as log:
            wait_for(lambda: len(committed_records(log, "counts-out")) >= INPUT // 2, "the first half")
        app.terminate()
        app.wait()
    # new files: the run restores them from the changelog, and dies after the first batch of the restore
    with _fork(
        path, str(tmp_path / "unused.json"), 0.0, "worker", 1, state_dir, crash_in_restore=True
    ) as app:
        code = app.wait()
        assert code == 17, f"run exited with {code}"
    assert list(Path(state_dir).rglob("counts.sqlite")), "the restore had begun writing the files"
    _produce(path, INPUT // 2, INPUT)
    with _fork(path, str(tmp_path / "metrics.json"), 0.0, "worker", 1, state_dir) as app:
        with pylog.open(path) as log:
            wait_for(lambda: len(committed_records(log, "counts-out")) >= INPUT, "the last run to finish")
        app.stop()
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    _check(path, "a crash in a restore", metrics)
    assert metrics["restored-records"] > 0
    with pylog.open(path) as log:
        topic_id = str(log.topic("eos-counts-changelog").topic_id)
    held: dict[str, int] = _in_files(
        state_dir, "counts", lambda file: SqliteStore("counts", "eos-counts-changelog", file, topic_id)
    )
    assert held == dict(Counter(f"u{i % 37}" for i in range(INPUT)))
