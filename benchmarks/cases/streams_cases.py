"""pylog.streams: a keyed tumbling-window count, exactly-once and at-least-once, against a hand-written loop;
and the restore of a store from its changelog.

The workload's records (16-byte keys, 100-byte values) with 10,000 distinct keys (the issue's shape: a keyed
count over many keys), event times one millisecond apart, counted in one-minute tumbling windows, over 4
partitions, by one stream thread. The floor is what a user would write by hand with pylog: a
``read_committed`` group consumer, a dict of counts and one transaction per poll carrying the offsets (it
keeps no changelog: a crash loses its counts). Quix Streams, the other peer the issue names, needs a
Kafka-protocol broker and is not run here.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

import pylog
from benchmarks.cases import Compare, Goal, case
from benchmarks.cases.workload import KEY_SIZE, byte_lists, result
from pylog.streams import BYTES, App, TumblingWindows
from pylog.streams.runtime import restore_tasks
from pylog.streams.serde import MSGPACK
from pylog.streams.stores import encode_key
from pylog.streams.task import Task

_KEYS = 10_000
_PARTITIONS = 4
_T0 = 1_700_000_000_000
_WINDOW_MS = 60_000
_TXN = "transactions: fsync at every commit"


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
    compare=(Compare("floor_streams_window_loop"),),
)
def pylog_streams_window_count_alos(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _count_with_app(records, seed, workdir, "at_least_once")


@case(
    "pylog_streams_restore",
    group="streams",
    kind="pylog",
    fsync="none (reads)",
    description="rebuild a count store of N distinct keys from its compacted changelog (4 partitions, Arrow)",
    goal=Goal("seconds", "<=", 2.0, "s"),
)
def pylog_streams_restore(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    keys, _ = byte_lists(records, seed)
    with pylog.open(workdir / "log") as log:
        log.create_topic("in", partitions=_PARTITIONS)
        app = App(log, "r", key_serde=BYTES)
        app.stream("in").group_by_key().count(name="c")
        app.create_topics()
        topology = app.topology()
        producer = log.producer(value_serializer=None)
        one = MSGPACK.encode(1)
        encoded = [encode_key(k) for k in keys]
        for p in range(_PARTITIONS):
            part = encoded[p::_PARTITIONS]
            for i in range(0, len(part), 50_000):
                chunk = part[i : i + 50_000]
                producer.send_batch("r-c-changelog", chunk, [one] * len(chunk), partition=p)
        producer.close()
        tasks = [Task(topology, tid, None, log.clock) for tid in topology.tasks()]  # type: ignore[arg-type]
        t0 = time.perf_counter()
        restored = restore_tasks(log, tasks)
        seconds = time.perf_counter() - t0
        held = sum(len(s) for t in tasks for s in t.stores.values())
    if restored != records or held != len(set(keys)):
        raise RuntimeError(f"restored {restored} records and {held} keys of {records}")
    return result(records, seconds)
