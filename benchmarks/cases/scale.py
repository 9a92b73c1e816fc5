"""Cases about scale and latency rather than throughput: end-to-end latency between processes, 10,000
partitions in one directory, and reopening a large log after an unclean shutdown."""

from __future__ import annotations

import os
import signal
import statistics
import struct
import time
from pathlib import Path
from typing import Any

from benchmarks.cases import Compare, Goal, case
from benchmarks.cases.workload import arrays, result

__all__: list[str] = []

_LATENCY_SAMPLES = 20_000
_LATENCY_GAP_S = 0.0002


def _open(path: Path, **kw: Any) -> Any:
    import pylog

    return pylog.open(str(path), **kw)


def _consume_latencies(path: Path, n: int, out_fd: int) -> None:
    """Child: read ``n`` records as they arrive; each value starts with its send time (monotonic ns)."""
    lat = []
    with _open(path) as log:
        consumer = log.consumer("lat", auto_offset_reset="earliest", value_deserializer=None)
        while len(lat) < n:
            for records in consumer.poll(timeout_ms=1000).values():
                now = time.monotonic_ns()
                lat.extend(now - struct.unpack_from("<q", r.value)[0] for r in records)
        consumer.close()
    os.write(out_fd, struct.pack(f"<{n}q", *lat[:n]))
    os.close(out_fd)


@case(
    "pylog_latency_e2e",
    group="latency",
    kind="pylog",
    fsync="none (acks=1)",
    description=(
        "producer process -> consumer process on one partition: `send(...).get()` every 200 us, a consumer "
        "polling in another process; latency = receive time - send time (CLOCK_MONOTONIC)"
    ),
    goal=(Goal("p50_us", "<=", 30, "us"), Goal("p99_us", "<=", 300, "us")),
)
def pylog_latency_e2e(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    n = min(records, _LATENCY_SAMPLES)
    path = workdir / "log"
    with _open(path) as log:
        log.create_topic("lat")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 1
        try:
            _consume_latencies(path, n, w)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    pad = b"x" * 92
    with _open(path) as log:
        producer = log.producer(acks=1, value_serializer=None)
        time.sleep(0.3)  # the consumer is polling by now
        t0 = time.perf_counter()
        for _ in range(n):
            producer.send("lat", struct.pack("<q", time.monotonic_ns()) + pad).get()
            target = time.perf_counter() + _LATENCY_GAP_S
            while time.perf_counter() < target:
                pass
        seconds = time.perf_counter() - t0
        producer.close()
    data = b""
    while len(data) < 8 * n:
        chunk = os.read(r, 1 << 20)
        if not chunk:
            break
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if status != 0 or len(data) != 8 * n:
        raise RuntimeError(f"consumer process failed (status {status}, {len(data) // 8} samples)")
    lat_us = sorted(x / 1000 for x in struct.unpack(f"<{n}q", data))
    q = statistics.quantiles(lat_us, n=100)
    return result(n, seconds, p50_us=round(q[49], 1), p99_us=round(q[98], 1), max_us=round(lat_us[-1], 1))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _append_round_robin(path: Path, partitions: int, records: int, seed: int) -> tuple[float, int]:
    """Batches of 25 records, partition after partition. One untimed pass first touches every partition
    (creating its segment and index files is a one-time cost); the timed pass is the steady state."""
    keys, values = arrays(records, seed)
    per = 25
    with _open(path) as log:
        log.create_topic("wide", partitions=partitions, segment_bytes=1 << 20)
        producer = log.producer(acks=1, value_serializer=None)
        send_batch = producer.send_batch
        for p in range(partitions):
            send_batch("wide", keys=keys[:per], values=values[:per], partition=p)
        t0 = time.perf_counter()
        for i in range(0, records, per):
            send_batch(
                "wide", keys=keys[i : i + per], values=values[i : i + per], partition=(i // per) % partitions
            )
        producer.flush()
        seconds = time.perf_counter() - t0
        fds = _open_fds()
        producer.close()
    return seconds, fds


@case(
    "pylog_8_partitions",
    group="scale",
    kind="pylog",
    fsync="none (acks=1)",
    description="`send_batch` of 25-record batches, round-robin over 8 partitions (steady state)",
)
def pylog_8_partitions(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    n = min(records, 250_000)
    seconds, fds = _append_round_robin(workdir / "log", 8, n, seed)
    return result(n, seconds, open_fds=fds)


@case(
    "pylog_10k_partitions",
    group="scale",
    kind="pylog",
    fsync="none (acks=1)",
    description=(
        "`send_batch` of 25-record batches, round-robin over 10,000 partitions of one topic (steady state: topic "
        "creation and a first pass over every partition untimed); open files counted from /proc/self/fd"
    ),
    compare=(Compare("pylog_8_partitions", at_least=0.5),),
    goal=Goal("open_fds", "<=", 1024, "files"),
    timeout_s=900.0,
)
def pylog_10k_partitions(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    n = min(records, 250_000)
    seconds, fds = _append_round_robin(workdir / "log", 10_000, n, seed)
    return result(n, seconds, open_fds=fds)


def _write_flushed(path: Path, records: int, seed: int) -> int:
    keys, values = arrays(min(records, 200_000), seed)
    written = 0
    with _open(path) as log:
        log.create_topic("big", segment_bytes=256 << 20)
        producer = log.producer(acks=1, value_serializer=None)
        while written < records:
            take = min(len(keys), records - written)
            producer.send_batch("big", keys=keys[:take], values=values[:take])
            written += take
        producer.close()
        log.flush()
    return written


def _crash_with_tail(path: Path, tail: int, seed: int) -> None:
    """A child appends ``tail`` records without fsync and is killed: an unclean shutdown."""
    keys, values = arrays(tail, seed + 1)
    pid = os.fork()
    if pid == 0:
        try:
            log = _open(path)
            producer = log.producer(acks=1, value_serializer=None)
            producer.send_batch("big", keys=keys, values=values)
            producer.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)
    os.waitpid(pid, 0)


def _reopen_seconds(path: Path) -> tuple[float, int]:
    t0 = time.perf_counter()
    log = _open(path)
    seconds = time.perf_counter() - t0
    validated = sum(r.batches_validated for r in log.recovery.values())
    log.close()
    return seconds, validated


@case(
    "pylog_reopen_small",
    group="scale",
    kind="pylog",
    fsync="log fsynced, then an unflushed tail of 50,000 records and SIGKILL",
    description="reopen (recovery) after an unclean shutdown: 1/8 of `pylog_reopen_large`'s log, same tail",
)
def pylog_reopen_small(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    n = max(records // 8, 50_000)
    _write_flushed(workdir / "log", n, seed)
    _crash_with_tail(workdir / "log", 50_000, seed)
    seconds, validated = _reopen_seconds(workdir / "log")
    size = sum(p.stat().st_size for p in (workdir / "log").rglob("*.log"))
    return result(n, seconds, log_bytes=size, batches_validated=validated)


@case(
    "pylog_reopen_large",
    group="scale",
    kind="pylog",
    fsync="log fsynced, then an unflushed tail of 50,000 records and SIGKILL",
    description=(
        "reopen (recovery) after an unclean shutdown of a log of --records records (16 B keys, 100 B values; at "
        "least 400,000) with an unflushed tail of 50,000; rec/s = log records per second of reopen, so 8x the "
        "small case's means the same reopen time for 8x the log (time follows the tail, not the size)"
    ),
    compare=(Compare("pylog_reopen_small", at_least=4.0),),
    timeout_s=1800.0,
)
def pylog_reopen_large(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    n = max(records, 400_000)
    _write_flushed(workdir / "log", n, seed)
    _crash_with_tail(workdir / "log", 50_000, seed)
    seconds, validated = _reopen_seconds(workdir / "log")
    size = sum(p.stat().st_size for p in (workdir / "log").rglob("*.log"))
    # rec/s here is "records of log per second of reopen": the larger log must not be slower per tail
    return result(n, seconds, log_bytes=size, batches_validated=validated)


@case(
    "pylog_compact",
    group="scale",
    kind="pylog",
    fsync="cleaned segments fsynced and swapped in two phases",
    description=(
        "log compaction: 8-byte keys (100,000 distinct), 100-byte values, one pass of `Topic.compact()` over "
        "the rolled segments; rec/s = records read by the cleaner per second"
    ),
    goal=Goal("rec_per_s", ">=", 1_000_000, "rec/s"),
)
def pylog_compact(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    import numpy as np

    import pylog

    rng = np.random.default_rng(seed)
    keys = np.frombuffer(rng.integers(0, 100_000, records).astype(">u8").tobytes(), dtype=np.uint8)
    keys = keys.reshape(records, 8)
    values = rng.integers(0, 256, (records, 100), dtype=np.uint8)
    clock = pylog.ManualClock(1_700_000_000_000)
    with _open(workdir / "log", clock=clock) as log:
        topic = log.create_topic("kv", cleanup_policy="compact", segment_bytes=16 << 20)
        producer = log.producer(value_serializer=None)
        producer.send_batch("kv", keys=keys, values=values, partition=0)
        topic.partition(0).roll()
        producer.close()
        clock.advance(1)
        t0 = time.perf_counter()
        (cleaned,) = topic.compact()
        seconds = time.perf_counter() - t0
    return result(
        cleaned.records_read,
        seconds,
        records_removed=cleaned.records_removed,
        bytes_before=cleaned.bytes_before,
        bytes_after=cleaned.bytes_after,
    )


def _many_partitions(path: Path, partitions: int) -> dict[str, float]:
    """A log with one topic of ``partitions`` partitions, a record in every 100th; returns the set-up times."""
    t0 = time.perf_counter()
    with _open(path) as log:
        log.create_topic("wide", partitions=partitions)
        created = time.perf_counter() - t0
        producer = log.producer(acks=1, value_serializer=None)
        for p in range(0, partitions, 100):
            producer.send("wide", b"v", partition=p)
        producer.flush()
        t1 = time.perf_counter()
    return {"create_s": round(created, 3), "close_after_writes_s": round(time.perf_counter() - t1, 3)}


def _die_with_log_open(path: Path) -> None:
    pid = os.fork()
    if pid == 0:
        try:
            log = _open(path)
            log.producer(acks=1, value_serializer=None).send("wide", b"v", partition=0).get()
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)
    os.waitpid(pid, 0)


def _open_list_close(path: Path, partitions: int, *, clean: bool) -> dict[str, Any]:
    setup = _many_partitions(path, partitions)
    if not clean:
        _die_with_log_open(path)
    t0 = time.perf_counter()
    log = _open(path)
    opened = time.perf_counter() - t0
    topics = log.topics()
    listed = time.perf_counter() - t0
    log.close()
    seconds = time.perf_counter() - t0
    if topics != ["wide"]:
        raise RuntimeError(f"unexpected topics {topics}")
    return result(
        partitions,
        seconds,
        total_s=round(seconds, 4),
        open_s=round(opened, 4),
        list_s=round(listed - opened, 4),
        close_s=round(seconds - listed, 4),
        **setup,
    )


for _n, _label in ((10_000, "10k"), (100_000, "100k")):
    for _clean in (True, False):

        def _fn(records: int, seed: int, workdir: Path, n: int = _n, clean: bool = _clean) -> dict[str, Any]:
            return _open_list_close(workdir / "log", n, clean=clean)

        case(
            f"pylog_open_{_label}_partitions_{'clean' if _clean else 'unclean'}",
            group="scale",
            kind="pylog",
            fsync="clean shutdown" if _clean else "unclean shutdown (a process killed with the log open)",
            description=(
                f"`pylog.open` + `topics()` + `close()` of a log with one topic of {_n:,} partitions (a record in "
                f"every 100th) after a{' clean' if _clean else 'n unclean'} shutdown; rec/s = partitions per "
                "second; create_s and close_after_writes_s time the set-up"
            ),
            goal=Goal("total_s", "<=", 0.2, "s") if _clean and _n == 100_000 else None,
            timeout_s=1800.0,
        )(_fn)
