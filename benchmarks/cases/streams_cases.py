"""pylog.streams: a keyed tumbling-window count, exactly-once and at-least-once, against a hand-written loop
and against Quix Streams; and the restore of a store of N keys after its application was SIGKILLed.

The workload's records (16-byte keys, 100-byte values) with 10,000 distinct keys (the issue's shape: a keyed
count over many keys), event times one millisecond apart, counted in one-minute tumbling windows, over 4
partitions, by one stream thread. The floor is what a user would write by hand with pylog: a
``read_committed`` group consumer, a dict of counts and one transaction per poll carrying the offsets (it
keeps no changelog: a crash loses its counts).

Quix Streams reads the same records (the same log directory, written by the same code) through pylog's own
Kafka-protocol broker, ``pylog serve`` started as a subprocess as in :mod:`benchmarks.cases.broker_cases`: a
Quix ``Application`` (consumer group, ``auto_offset_reset="earliest"``, exactly-once or at-least-once, its
default 5 s commit interval, RocksDB state with changelog topics) runs
``tumbling_window(60_000).count().current()`` (every update emitted, as ``pylog.streams``' default
``emit="update"``) in :mod:`benchmarks.cases.quix_app`, a process of its own with the interpreter of a
virtualenv that has ``quixstreams`` (``make quix-env``: ``build/quix-venv``; or ``PYLOG_BENCH_QUIX_PYTHON``;
or this interpreter when it has ``quixstreams``). Quix Streams pins confluent-kafka, pydantic and
pydantic-settings below what pylog's own environment holds, so it does not share that environment. The Quix
figure is timed from its first record processed to the end of ``Application.run()`` (the last checkpoint
committed): its group join and topic checks before the first record (``startup_s``) are left out, which
favours Quix. Without the package the Quix cases report ``skipped``.

The restore case builds a count store of N distinct keys with a running exactly-once application in a child
process, SIGKILLs it once everything is processed and committed, and then, in the benchmark's own process,
opens the log (``reopen_s``: recovery after the unclean stop) and times the rebuild of the four tasks' stores
from their changelog partitions, the runtime's ``restore_tasks`` (Arrow batches decoded by column).
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import pylog
from benchmarks.cases import Compare, Goal, case
from benchmarks.cases.broker_cases import pylog_server
from benchmarks.cases.kafka import BrokerUnavailable
from benchmarks.cases.workload import KEY_SIZE, Deadline, byte_lists, result, skipped
from pylog.streams import BYTES, App, TumblingWindows
from pylog.streams.runtime import restore_tasks
from pylog.streams.task import Task

_KEYS = 10_000
_PARTITIONS = 4
_T0 = 1_700_000_000_000
_WINDOW_MS = 60_000
_TXN = "transactions: fsync at every commit"
_ROOT = Path(__file__).resolve().parents[2]
_QUIX_APP = Path(__file__).resolve().with_name("quix_app.py")
_QUIX_VENV_PYTHON = _ROOT / "build" / "quix-venv" / "bin" / "python"
_QUIX_TIMEOUT_S = 1800.0  # Quix counts a few thousand records a second here: 1M records take minutes
_BUILD_TIMEOUT_S = 600.0


def _fill(path: Path, records: int, seed: int) -> None:
    _, values = byte_lists(records, seed)
    keys = [bytes(k) for k in np.random.default_rng(seed + 1).integers(0, 256, (_KEYS, KEY_SIZE), np.uint8)]
    with pylog.open(path) as log:
        log.create_topic("in", partitions=_PARTITIONS)
        producer = log.producer(value_serializer=None, linger_ms=5)
        for i, value in enumerate(values):
            producer.send("in", value, key=keys[i % _KEYS], timestamp_ms=_T0 + i)
        producer.close()


def _count_with_app(records: int, seed: int, workdir: Path, guarantee: str) -> dict[str, Any]:
    path = workdir / "log"
    _fill(path, records, seed)
    with pylog.open(path) as log:
        app = App(
            log,
            "bench",
            key_serde=BYTES,
            value_serde=BYTES,
            processing_guarantee=guarantee,
            max_poll_records=5000,
        )
        app.stream("in").group_by_key().windowed_by(TumblingWindows(_WINDOW_MS)).count(name="counts")
        t0 = time.perf_counter()
        app.start(threads=1)
        while sum(app.lag().values()) > 0 or not log.group_offsets("bench"):
            time.sleep(0.01)
        seconds = time.perf_counter() - t0
        metrics = app.metrics()
        app.close()
    if metrics.get("processed-records") != records:
        raise RuntimeError(f"processed {metrics.get('processed-records')} of {records} records")
    return result(records, seconds, commits=metrics.get("commits", 0))


@case(
    "floor_streams_window_loop",
    group="streams",
    kind="floor",
    fsync=_TXN + " (one per poll of up to 5,000 records)",
    description="hand-written read_committed group consumer, dict of (key, window) counts, a transaction per poll",
)
def floor_streams_window_loop(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    path = workdir / "log"
    _fill(path, records, seed)
    with pylog.open(path) as log:
        consumer = log.consumer(
            group_id="floor",
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            value_deserializer=None,
            max_poll_records=5000,
        )
        producer = log.producer(transactional_id="floor-0", value_serializer=None)
        t0 = time.perf_counter()
        consumer.subscribe(["in"])
        producer.init_transactions()
        counts: dict[tuple[bytes, int], int] = {}
        seen = 0
        while seen < records:
            batch = consumer.poll(timeout_ms=100)
            if not batch:
                continue
            producer.begin_transaction()
            for recs in batch.values():
                for r in recs:
                    window = (r.key, r.timestamp - r.timestamp % _WINDOW_MS)
                    counts[window] = counts.get(window, 0) + 1
                seen += len(recs)
            offsets = {tp: recs[-1].offset + 1 for tp, recs in batch.items()}
            producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
            producer.commit_transaction()
        seconds = time.perf_counter() - t0
        consumer.close()
        producer.close()
    return result(records, seconds)


@case(
    "pylog_streams_window_count_eos",
    group="streams",
    kind="pylog",
    fsync=_TXN + " (every 100 ms: changelog, offsets)",
    description="pylog.streams, exactly-once (default): group_by_key().windowed_by(1 min).count(), 1 thread",
    compare=(
        Compare("floor_streams_window_loop", at_least=0.5),
        Compare("quix_streams_window_count_eos", at_least=2.0),
        Compare("pylog_streams_window_count_alos", at_least=0.9),
    ),
)
def pylog_streams_window_count_eos(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _count_with_app(records, seed, workdir, "exactly_once")


@case(
    "pylog_streams_window_count_alos",
    group="streams",
    kind="pylog",
    fsync="acks=all flush, then an offset commit, every 100 ms",
    description="pylog.streams, at-least-once: the same count",
    compare=(Compare("floor_streams_window_loop"), Compare("quix_streams_window_count_alos")),
)
def pylog_streams_window_count_alos(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _count_with_app(records, seed, workdir, "at_least_once")


# -- Quix Streams through pylog's broker ------------------------------------------------------------------


def _quix_python() -> str | None:
    """An interpreter that has ``quixstreams``: ``PYLOG_BENCH_QUIX_PYTHON``, ``build/quix-venv`` (``make
    quix-env``), or this one."""
    named = os.environ.get("PYLOG_BENCH_QUIX_PYTHON")
    if named:
        return named
    if _QUIX_VENV_PYTHON.exists():
        return str(_QUIX_VENV_PYTHON)
    return sys.executable if importlib.util.find_spec("quixstreams") is not None else None


def _count_with_quix(records: int, seed: int, workdir: Path, guarantee: str) -> dict[str, Any]:
    python = _quix_python()
    if python is None:
        return skipped(
            "quixstreams is not installed: `make quix-env` (a virtualenv of its own, build/quix-venv)"
        )
    _fill(workdir / "log", records, seed)
    argv = [python, str(_QUIX_APP), "--topic", "in", "--records", str(records), "--guarantee", guarantee]
    argv += ["--state-dir", str(workdir / "quix-state")]
    try:
        with pylog_server(workdir) as broker:
            proc = subprocess.run(
                [*argv, "--servers", broker.servers],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=_QUIX_TIMEOUT_S,
            )
    except BrokerUnavailable as exc:
        return skipped(str(exc))
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"the Quix application failed (exit {proc.returncode}): {tail}")
    out = json.loads(lines[-1])
    if out["committed"] != records or out["end"] != records:
        raise RuntimeError(
            f"Quix committed offsets {out['committed']} of {out['end']} records ({records} sent)"
        )
    return result(
        records,
        out["seconds"],
        startup_s=round(out["startup_s"], 2),
        peer=f"quixstreams {out['quixstreams']} (confluent-kafka {out['confluent_kafka']})",
    )


_QUIX_TEXT = (
    "Quix Streams `tumbling_window(60_000).count().current()`, RocksDB state and changelog, reading the same "
    "records from `pylog serve` (timed from its first record to the end of `run()`)"
)


@case(
    "quix_streams_window_count_eos",
    group="streams",
    kind="peer",
    fsync="Kafka transactions through `pylog serve` (fsync at every commit), every 5 s (Quix's default)",
    description=f"{_QUIX_TEXT}, processing_guarantee exactly-once",
    timeout_s=_QUIX_TIMEOUT_S + 300,
)
def quix_streams_window_count_eos(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _count_with_quix(records, seed, workdir, "exactly-once")


@case(
    "quix_streams_window_count_alos",
    group="streams",
    kind="peer",
    fsync="changelog flushed, then an offset commit, every 5 s (Quix's default); `pylog serve` writes to the "
    "page cache",
    description=f"{_QUIX_TEXT}, processing_guarantee at-least-once",
    timeout_s=_QUIX_TIMEOUT_S + 300,
)
def quix_streams_window_count_alos(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _count_with_quix(records, seed, workdir, "at-least-once")


# -- restore after a SIGKILL ------------------------------------------------------------------------------

_RESTORE_APP = "restore"


def _restore_app(log: Any) -> App:
    app = App(log, _RESTORE_APP, key_serde=BYTES, value_serde=BYTES, max_poll_records=5000)
    app.stream("in").group_by_key().count(name="c")
    return app


def build_store_then_wait(path: str, records: int, seed: int) -> None:
    """In a child process: write ``records`` records with distinct keys, count them per key with an
    exactly-once application until every one is processed and committed, print ``ready`` and wait to be
    killed (the application still running, its log still open)."""
    keys, values = byte_lists(records, seed)
    with pylog.open(path) as log:
        log.create_topic("in", partitions=_PARTITIONS)
        producer = log.producer(value_serializer=None, linger_ms=5)
        for k, v in zip(keys, values, strict=True):
            producer.send("in", v, key=k)
        producer.close()
        app = _restore_app(log)
        app.start(threads=1)
        while sum(app.lag().values()) > 0 or not log.group_offsets(_RESTORE_APP):
            if app.error is not None:
                raise app.error
            time.sleep(0.05)
        print("ready", app.metrics().get("processed-records"), flush=True)
        while True:
            time.sleep(60)


def _build_and_kill(path: Path, records: int, seed: int) -> None:
    code = "import sys; from benchmarks.cases.streams_cases import build_store_then_wait as b; "
    code += "b(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))"
    argv = [sys.executable, "-c", code, str(path), str(records), str(seed)]
    proc = subprocess.Popen(argv, cwd=_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        deadline = Deadline(_BUILD_TIMEOUT_S)
        line = b""
        while not line.endswith(b"\n"):
            if deadline.passed() or proc.poll() is not None:
                raise RuntimeError(
                    f"the application building the store did not finish (exit {proc.returncode})"
                )
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                line += os.read(proc.stdout.fileno(), 256)
        if line.split() != [b"ready", str(records).encode()]:
            raise RuntimeError(f"the application building the store said {line!r}")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@case(
    "pylog_streams_restore",
    group="streams",
    kind="pylog",
    fsync="none (reads)",
    description="after a SIGKILL of the exactly-once application that built it, rebuild a count store of N "
    "distinct keys from its compacted changelog in a fresh process (4 partitions, Arrow): restore_s; reopen_s: "
    "opening the log after the kill (not in restore_s)",
    goal=Goal("restore_s", "<=", 2.0, "s"),
    timeout_s=_BUILD_TIMEOUT_S + 300,
)
def pylog_streams_restore(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    path = workdir / "log"
    _build_and_kill(path, records, seed)
    distinct = len(set(byte_lists(records, seed)[0]))
    t0 = time.perf_counter()
    with pylog.open(path) as log:
        open_s = time.perf_counter() - t0
        topology = _restore_app(log).topology()
        tasks = [Task(topology, tid, None, log.clock) for tid in topology.tasks()]  # type: ignore[arg-type]
        t0 = time.perf_counter()
        restored = restore_tasks(log, tasks)
        seconds = time.perf_counter() - t0
        stores = [s for t in tasks for s in t.stores.values()]
        held = sum(len(s) for s in stores)
        counted = sum(v for s in stores for _, v in s.items())
    if restored != distinct or held != distinct or counted != records:
        raise RuntimeError(
            f"restored {restored} records, {held} keys, {counted} counted of {records} records"
        )
    return result(records, seconds, restore_s=round(seconds, 3), reopen_s=round(open_s, 3), keys=held)
