"""The producer's write path as a caller that waits sees it: one record at a time, each ``get()`` before the
next send, against the floor of the same per-record work done by hand in the same run.

``pylog_send`` (send without waiting, then ``flush()``) is in :mod:`benchmarks.cases.pylog_cases`. Here:

| case | floor | goal |
|---|---|---|
| ``pylog_send_get`` (acks=1) | ``floor_pack_oswrite``: ``msgpack`` pack + ``os.write`` per record | >= 0.25x |
| ``pylog_send_get_keyed_8p`` (acks=1, keyed, 8 partitions) | ``pylog_send_get`` (one partition) | >= 0.8x |
| ``pylog_send_get_loaded`` (acks=1, two CPU-bound processes beside it) | ``pylog_send_get`` (idle) | >= 0.5x |
| ``pylog_send_get_durable`` (acks="all", 1 thread) | ``fsync_per_record``: ``os.write`` + ``os.fsync`` | >= 0.8x |
| ``pylog_durable_8_threads`` (acks="all", one producer) | ``fsync_per_record`` | >= 4x (group commit) |
| ``pylog_aio_64_tasks`` (acks="all", ``send_and_wait``) | ``fsync_per_record`` | >= 4x |

Keys are 16 bytes, values 100 bytes, given as bytes (``value_serializer=None``). The durable cases run on
fewer records (every record waits for an fsync).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import msgpack

from benchmarks.cases import Compare, case
from benchmarks.cases.stores import run_threads, scaled
from benchmarks.cases.workload import byte_lists, result

__all__: list[str] = []

TOPIC = "bench"
_WAIT_CAP = 100_000  # records of the acks=1 cases (each a write() syscall)
_DURABLE_CAP = 5_000  # records of the acks="all" cases
_THREADS = 8
_TASKS = 64


def _open(workdir: Path, partitions: int = 1) -> Any:
    import pylog

    log = pylog.open(str(workdir / "log"))
    log.create_topic(TOPIC, partitions=partitions)
    return log


@case(
    "floor_pack_oswrite",
    group="write",
    kind="floor",
    fsync="none: each record reaches the page cache before the next (survives a process crash)",
    description="Python loop: `msgpack.Packer.pack((k, v))` + `os.write` of it to an O_APPEND file, per record",
)
def floor_pack_oswrite(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    n = min(records, _WAIT_CAP)
    keys, values = byte_lists(n, seed)
    pack = msgpack.Packer().pack
    write = os.write
    fd = os.open(workdir / "appends.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        t0 = time.perf_counter()
        for k, v in zip(keys, values, strict=True):
            write(fd, pack((k, v)))
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
    return result(n, seconds)


@case(
    "pylog_send_get",
    group="write",
    kind="pylog",
    fsync="none (acks=1): the record is written to the OS before get() returns",
    description="`producer.send(topic, value=v, key=k).get()` one record at a time, acks=1",
    compare=(Compare("floor_pack_oswrite", at_least=0.25),),
)
def pylog_send_get(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    n = min(records, _WAIT_CAP)
    keys, values = byte_lists(n, seed)
    return result(n, _send_get_seconds(workdir, keys, values))


@case(
    "pylog_send_get_keyed_8p",
    group="write",
    kind="pylog",
    fsync="none (acks=1): the record is written to the OS before get() returns",
    description=(
        "`pylog_send_get` on a topic of 8 partitions: each record goes to its key's murmur2 partition "
        "(Kafka's); goal: within 0.8x of the one-partition call"
    ),
    compare=(
        Compare("pylog_send_get", at_least=0.8),
        Compare("floor_pack_oswrite", at_least=0.25),
        Compare("sqlite3_commit_normal", at_least=2.0),
    ),
)
def pylog_send_get_keyed_8p(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    n = min(records, _WAIT_CAP)
    keys, values = byte_lists(n, seed)
    return result(n, _send_get_seconds(workdir, keys, values, partitions=8))


def _send_get_seconds(workdir: Path, keys: list[bytes], values: list[bytes], partitions: int = 1) -> float:
    """``send(...).get()`` of every record, acks=1, to a topic of ``partitions``: the seconds it took."""
    with _open(workdir, partitions) as log:
        producer = log.producer(acks=1, value_serializer=None)
        send = producer.send
        t0 = time.perf_counter()
        for k, v in zip(keys, values, strict=True):
            send(TOPIC, value=v, key=k).get()
        seconds = time.perf_counter() - t0
        producer.close()
    return seconds


def _burn(stop_at: float) -> None:
    """A CPU-bound process: spins until ``stop_at`` (time.monotonic)."""
    x = 0
    while time.monotonic() < stop_at:
        for _ in range(10_000):
            x += 1


@case(
    "pylog_send_get_loaded",
    group="write",
    kind="pylog",
    fsync="none (acks=1): the record is written to the OS before get() returns",
    description=(
        "`pylog_send_get` while two CPU-bound processes run beside it (a web handler on a busy machine); "
        "goal: at most 2x slower than idle"
    ),
    compare=(Compare("pylog_send_get", at_least=0.5), Compare("floor_pack_oswrite")),
)
def pylog_send_get_loaded(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    import multiprocessing

    n = min(records, _WAIT_CAP)
    keys, values = byte_lists(n, seed)
    ctx = multiprocessing.get_context("spawn")
    burners = [ctx.Process(target=_burn, args=(time.monotonic() + 600,), daemon=True) for _ in range(2)]
    for b in burners:
        b.start()
    try:
        time.sleep(0.5)  # both spinning
        seconds = _send_get_seconds(workdir, keys, values)
    finally:
        for b in burners:
            b.kill()
            b.join()
    return result(n, seconds)


@case(
    "pylog_send_get_durable",
    group="durable",
    kind="pylog",
    fsync='acks="all": each get() returns after the fsync that covers its record',
    description='`producer.send(topic, value=v, key=k).get()` one record at a time, acks="all", one thread',
    compare=(Compare("fsync_per_record", at_least=0.8), Compare("sqlite3_commit_full", at_least=1.5)),
)
def pylog_send_get_durable(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    n = scaled(records, _DURABLE_CAP)
    keys, values = byte_lists(n, seed)
    with _open(workdir) as log:
        producer = log.producer(acks="all", value_serializer=None)
        send = producer.send
        t0 = time.perf_counter()
        for k, v in zip(keys, values, strict=True):
            send(TOPIC, value=v, key=k).get()
        seconds = time.perf_counter() - t0
        durable = log.topic(TOPIC).partition(0).flushed_offset  # fsynced (acknowledged)
        producer.close()
    if durable < n:
        raise RuntimeError(f"durable offset {durable} < {n} acknowledged records")
    return result(n, seconds)


@case(
    "pylog_durable_8_threads",
    group="durable",
    kind="pylog",
    fsync='acks="all": each get() returns after the fsync that covers its record (one fsync for many)',
    description='8 threads share one producer with acks="all", `send(...).get()` per record (group commit)',
    compare=(Compare("fsync_per_record", at_least=4.0), Compare("pylog_durable_8_producers")),
)
def pylog_durable_8_threads(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    n = scaled(records, _DURABLE_CAP * 4) // _THREADS * _THREADS
    keys, values = byte_lists(n, seed)
    chunks = [list(zip(keys[i::_THREADS], values[i::_THREADS], strict=True)) for i in range(_THREADS)]
    with _open(workdir) as log:
        producer = log.producer(acks="all", value_serializer=None)

        def send_all(chunk: list[tuple[bytes, bytes]]) -> None:
            send = producer.send
            for k, v in chunk:
                send(TOPIC, value=v, key=k).get(timeout=30)

        seconds = run_threads(send_all, chunks)
        durable = log.topic(TOPIC).partition(0).flushed_offset  # fsynced (acknowledged)
        producer.close()
    if durable < n:
        raise RuntimeError(f"durable offset {durable} < {n} acknowledged records")
    return result(n, seconds, threads=_THREADS)


@case(
    "pylog_aio_64_tasks",
    group="durable",
    kind="pylog",
    fsync='acks="all": each send_and_wait returns after the fsync that covers its record',
    description='64 asyncio tasks on one `AsyncProducer(acks="all")`, `await send_and_wait(...)` per record',
    compare=(Compare("fsync_per_record", at_least=4.0),),
)
def pylog_aio_64_tasks(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    from pylog.aio import AsyncProducer

    n = scaled(records, _DURABLE_CAP * 4) // _TASKS * _TASKS
    keys, values = byte_lists(n, seed)
    with _open(workdir) as log:

        async def main() -> float:
            async with AsyncProducer(log, acks="all", value_serializer=None) as producer:

                async def task(i: int) -> None:
                    for k, v in zip(keys[i::_TASKS], values[i::_TASKS], strict=True):
                        await producer.send_and_wait(TOPIC, v, k)

                t0 = time.perf_counter()
                await asyncio.gather(*(task(i) for i in range(_TASKS)))
                return time.perf_counter() - t0

        seconds = asyncio.run(main())
        durable = log.topic(TOPIC).partition(0).flushed_offset  # fsynced (acknowledged)
    if durable < n:
        raise RuntimeError(f"durable offset {durable} < {n} acknowledged records")
    return result(n, seconds, tasks=_TASKS)
