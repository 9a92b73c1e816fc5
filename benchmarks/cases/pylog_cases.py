"""pylog's own cases, each measured against a floor or peer of the same run (see ``compare``).

Every case opens a fresh log under its work directory, creates one topic ``bench`` and times only the
measured part. Keys and values are raw bytes (``value_serializer=None``), as in the floors.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.cases import Compare, Goal, case
from benchmarks.cases.stores import run_threads, scaled
from benchmarks.cases.workload import PAYLOAD_SIZE, arrays, byte_lists, result, settle

__all__: list[str] = []

TOPIC = "bench"
_DURABLE_CAP = 40_000
_PAPER_VALUE_SIZE = 200
_PAPER_BATCH = 50
_READ_MAX_BYTES = 64 << 20


def _open(workdir: Path) -> Any:
    import pylog

    return pylog.open(str(workdir / "log"))


def _fill(workdir: Path, records: int, seed: int) -> None:
    """Write the workload untimed, with the vectorized producer."""
    keys, values = arrays(records, seed)
    with _open(workdir) as log:
        log.create_topic(TOPIC, partitions=1)
        producer = log.producer(acks=1, value_serializer=None)
        producer.send_batch(TOPIC, keys=keys, values=values)
        producer.close()


@case(
    "pylog_send",
    group="write",
    kind="pylog",
    fsync="none (acks=1): written to the OS, survives a process crash",
    description="`producer.send(topic, value=v, key=k)` one record at a time, acks=1, then `flush()`",
    compare=(Compare("floor_msgpack_write", at_least=1.0), Compare("confluent_produce")),
)
def pylog_send(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    keys, values = byte_lists(records, seed)
    with _open(workdir) as log:
        log.create_topic(TOPIC, partitions=1)
        producer = log.producer(acks=1, value_serializer=None)
        send = producer.send
        t0 = time.perf_counter()
        for k, v in zip(keys, values, strict=True):
            send(TOPIC, value=v, key=k)
        producer.flush()
        seconds = time.perf_counter() - t0
        producer.close()
    return result(records, seconds)


@case(
    "pylog_send_batch",
    group="write",
    kind="pylog",
    fsync="none (acks=1): written to the OS, survives a process crash",
    description="`producer.send_batch(topic, keys=..., values=...)` of 2-D uint8 arrays, one call",
    compare=(Compare("floor_numpy_write", at_least=0.5), Compare("sqlite3_write")),
)
def pylog_send_batch(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    keys, values = arrays(records, seed)
    with _open(workdir) as log:
        log.create_topic(TOPIC, partitions=1)
        producer = log.producer(acks=1, value_serializer=None)
        t0 = time.perf_counter()
        producer.send_batch(TOPIC, keys=keys, values=values)
        producer.flush()
        seconds = time.perf_counter() - t0
        producer.close()
    return result(records, seconds)


@case(
    "pylog_consume_iter",
    group="read",
    kind="pylog",
    fsync="n/a (read)",
    description="`for rec in consumer` (ConsumerRecord per record, raw bytes), from the earliest offset",
    compare=(
        Compare("floor_msgpack_read", at_least=0.5),
        Compare("floor_mmap_unpackb_read"),
        Compare("sqlite3_read"),
        Compare("confluent_consume"),
    ),
    goal=Goal("rec_per_s", ">=", 3_000_000, "rec/s"),
)
def pylog_consume_iter(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    _fill(workdir, records, seed)
    settle([workdir])
    n = 0
    with _open(workdir) as log:
        consumer = log.consumer(
            TOPIC, auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None
        )
        t0 = time.perf_counter()
        for _rec in consumer:
            n += 1
        seconds = time.perf_counter() - t0
        consumer.close()
    return _checked(records, n, seconds)


@case(
    "pylog_consume_iter_msgpack",
    group="read",
    kind="pylog",
    fsync="n/a (read)",
    description=(
        "`for rec in consumer` with the default msgpack value deserializer (values stored as msgpack bin "
        "objects, decoded to bytes), from the earliest offset"
    ),
    compare=(Compare("floor_msgpack_read"), Compare("floor_mmap_unpackb_read")),
)
def pylog_consume_iter_msgpack(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    import numpy as np

    keys, values = arrays(records, seed)
    prefix = np.frombuffer(bytes([0xC4, values.shape[1]]), dtype=np.uint8)  # msgpack bin 8 of the value
    packed = np.hstack([np.broadcast_to(prefix, (records, 2)), values])
    with _open(workdir) as log:
        log.create_topic(TOPIC, partitions=1)
        producer = log.producer(acks=1, value_serializer=None)
        producer.send_batch(TOPIC, keys=keys, values=packed)
        producer.close()
    settle([workdir])
    n = 0
    with _open(workdir) as log:
        consumer = log.consumer(TOPIC, auto_offset_reset="earliest", consumer_timeout_ms=0)
        t0 = time.perf_counter()
        for _rec in consumer:
            n += 1
        seconds = time.perf_counter() - t0
        consumer.seek_to_beginning()
        first = next(iter(consumer))
        assert type(first.value) is bytes and len(first.value) == values.shape[1], first
        consumer.close()
    return _checked(records, n, seconds)


@case(
    "pylog_consume_iterate",
    group="read",
    kind="pylog",
    fsync="n/a (read)",
    description="`for rec in consumer.iterate()` (bulk fetches, a ConsumerRecord per record, raw bytes)",
    compare=(Compare("floor_msgpack_read"), Compare("floor_mmap_unpackb_read"), Compare("sqlite3_read")),
)
def pylog_consume_iterate(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    _fill(workdir, records, seed)
    settle([workdir])
    n = 0
    with _open(workdir) as log:
        consumer = log.consumer(
            TOPIC, auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None
        )
        t0 = time.perf_counter()
        for _rec in consumer.iterate():
            n += 1
        seconds = time.perf_counter() - t0
        consumer.close()
    return _checked(records, n, seconds)


@case(
    "pylog_read_arrow",
    group="read",
    kind="pylog",
    fsync="n/a (read)",
    description=(
        "`consumer.poll_arrow(max_bytes=64 MiB)` until empty: pyarrow RecordBatches of the records (fastest "
        "of 3 passes, as `floor_frombuffer_read`)"
    ),
    compare=(Compare("floor_frombuffer_read", at_least=0.5),),
)
def pylog_read_arrow(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    for module in ("pyarrow", "pylog.arrow"):  # one-time imports, not part of reading (done on first use)
        importlib.import_module(module)
    _fill(workdir, records, seed)
    settle([workdir])
    passes = []
    with _open(workdir) as log:
        for _ in range(3):  # as floor_frombuffer_read: the fastest of 3 passes counts
            n = 0
            consumer = log.consumer(TOPIC, auto_offset_reset="earliest", consumer_timeout_ms=0)
            t0 = time.perf_counter()
            while polled := consumer.poll_arrow(max_bytes=_READ_MAX_BYTES):
                n += sum(batch.num_rows for batch in polled.values())
            passes.append(time.perf_counter() - t0)
            consumer.close()
    out = _checked(records, n, min(passes))
    out["passes_s"] = [round(x, 4) for x in passes]
    return out


@case(
    "pylog_durable_8_producers",
    group="durable",
    kind="pylog",
    fsync='acks="all": each send waits for the fsync that covers it (shared between threads)',
    description='8 threads, each its own producer with acks="all", `send(...).get()` per record',
    compare=(
        Compare("fsync_per_record", at_least=10.0),
        Compare("persistqueue_durable_8_threads"),
        Compare("persistqueue_write"),
    ),
)
def pylog_durable_8_producers(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    def send_all(producer: Any, chunk: list[tuple[bytes, bytes]]) -> None:
        send = producer.send
        for k, v in chunk:
            send(TOPIC, value=v, key=k).get(timeout=30)

    n, seconds, _ = _durable_8_producers(records, seed, workdir, send_all)
    return result(n, seconds, threads=8)


def _durable_8_producers(
    records: int, seed: int, workdir: Path, send_all: Callable[[Any, list[tuple[bytes, bytes]]], None]
) -> tuple[int, float, int]:
    """8 threads, each its own acks="all" producer running ``send_all(producer, its records)`` on one
    partition: (records, seconds until the last thread finished, the partition's fsynced offset)."""
    n = scaled(records, _DURABLE_CAP) // 8 * 8
    keys, values = byte_lists(n, seed)
    chunks = [list(zip(keys[i::8], values[i::8], strict=True)) for i in range(8)]
    with _open(workdir) as log:
        log.create_topic(TOPIC, partitions=1)
        producers = {id(c): log.producer(acks="all", value_serializer=None) for c in chunks}
        seconds = run_threads(lambda chunk: send_all(producers[id(chunk)], chunk), chunks)
        durable = log.topic(TOPIC).partition(0).flushed_offset  # fsynced (acknowledged)
        for producer in producers.values():
            producer.close()
    return n, seconds, durable


@case(
    "pylog_durable_8_producers_pipelined",
    group="durable",
    kind="pylog",
    fsync='acks="all": a record is acknowledged only after the fsync that covers it',
    description=(
        '8 threads, each its own producer with acks="all", sending without waiting per record (as a Kafka '
        "producer does); every future is checked after `flush()`"
    ),
    compare=(
        Compare("fsync_per_record", at_least=10.0),
        Compare("persistqueue_durable_8_threads", at_least=10.0),
        Compare("pylog_durable_8_producers"),
    ),
)
def pylog_durable_8_producers_pipelined(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    def send_all(producer: Any, chunk: list[tuple[bytes, bytes]]) -> None:
        send = producer.send
        futures = [send(TOPIC, value=v, key=k) for k, v in chunk]
        producer.flush()
        if not all(f.succeeded() for f in futures):
            raise RuntimeError("a record was not acknowledged")

    n, seconds, durable = _durable_8_producers(records, seed, workdir, send_all)
    if durable < n:
        raise RuntimeError(f"durable offset {durable} < {n} acknowledged records")
    return result(n, seconds, threads=8)


@case(
    "pylog_storage_overhead",
    group="paper",
    kind="pylog",
    fsync="none (acks=1)",
    description="`send_batch` of 50 records at a time; bytes of the segment files per record minus payload",
    goal=Goal("overhead_bytes_per_record", "<=", 12, "B/record"),
)
def pylog_storage_overhead(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    keys, values = arrays(records, seed)
    with _open(workdir) as log:
        log.create_topic(TOPIC, partitions=1)
        producer = log.producer(acks=1, value_serializer=None)
        t0 = time.perf_counter()
        for i in range(0, records, _PAPER_BATCH):
            producer.send_batch(TOPIC, keys=keys[i : i + _PAPER_BATCH], values=values[i : i + _PAPER_BATCH])
        producer.flush()
        seconds = time.perf_counter() - t0
        producer.close()
    files = [p for p in (workdir / "log").rglob("*") if p.is_file()]
    segments = sum(p.stat().st_size for p in files if p.suffix == ".log")
    everything = sum(p.stat().st_size for p in files)
    return result(
        records,
        seconds,
        overhead_bytes_per_record=round(segments / records - PAYLOAD_SIZE, 2),
        all_files_bytes_per_record=round(everything / records - PAYLOAD_SIZE, 2),
        batch_records=_PAPER_BATCH,
    )


def _paper(records: int, seed: int, workdir: Path, *, wait: bool) -> dict[str, Any]:
    _, values = arrays(records, seed, _PAPER_VALUE_SIZE)
    with _open(workdir) as log:
        log.create_topic(TOPIC, partitions=1)
        producer = log.producer(acks=1, value_serializer=None)
        send_batch = producer.send_batch
        t0 = time.perf_counter()
        for i in range(0, records, _PAPER_BATCH):
            send_batch(TOPIC, values=values[i : i + _PAPER_BATCH], wait=wait)
        producer.flush()
        seconds = time.perf_counter() - t0
        written = log.topic(TOPIC).partition(0).log_end_offset
        producer.close()
    if written != records:
        raise RuntimeError(f"{written} of {records} records written")
    return result(records, seconds, records * _PAPER_VALUE_SIZE, value_bytes=_PAPER_VALUE_SIZE)


@case(
    "pylog_kafka_paper",
    group="paper",
    kind="pylog",
    fsync="none (acks=1)",
    description=(
        "the Kafka paper's producer test scaled to --records: 200-byte values, no key, batches of 50 sent "
        "without waiting for each (`send_batch(..., wait=False)`, as the paper's producer sent "
        "asynchronously), then flush(), timed"
    ),
    compare=(Compare("Kafka paper, batches of 50 (400,000 msg/s)", anchor=400_000),),
    goal=Goal("rec_per_s", ">=", 4_000_000, "msg/s"),
)
def pylog_kafka_paper(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _paper(records, seed, workdir, wait=False)


@case(
    "pylog_kafka_paper_sync",
    group="paper",
    kind="pylog",
    fsync="none (acks=1)",
    description="as pylog_kafka_paper, but each `send_batch` of 50 returns after its batch was written",
    compare=(Compare("Kafka paper, batches of 50 (400,000 msg/s)", anchor=400_000),),
)
def pylog_kafka_paper_sync(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _paper(records, seed, workdir, wait=True)


def _checked(expected: int, n: int, seconds: float) -> dict[str, Any]:
    if n != expected:
        raise RuntimeError(f"read {n} records, expected {expected}")
    return result(n, seconds)
