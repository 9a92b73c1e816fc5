"""The broker's per-record path: Kafka record batches (magic 2) to pylog batches and back.

A Produce request's Kafka batches become pylog batches (:func:`pylog.broker.records.decode_batches`, its CRC
check included, then :func:`pylog.record.encode_batch`); a Fetch turns stored pylog batches into Kafka batches
(:func:`pylog.broker.records.from_pylog`: every check of the format, then the Kafka records). Batches of 1,000 records, built untimed; no I/O. Each result is
dropped once made, as a broker drops it once written, so its memory is reused (kept, the first touch of
fresh pages on a virtual machine would be measured instead). The floor is a copy of the same bytes (what a
broker that stored Kafka's format unchanged would do per batch).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.cases import Compare, Goal, case
from benchmarks.cases.workload import byte_lists, result

_PER_BATCH = 1_000
_IN_MEMORY = "none (in memory)"


def _pylog_batches(records: int, seed: int) -> list[bytes]:
    from pylog.record import encode_batch

    keys, values = byte_lists(records, seed)
    now = int(time.time() * 1000)
    out = []
    for start in range(0, records, _PER_BATCH):
        k, v = keys[start : start + _PER_BATCH], values[start : start + _PER_BATCH]
        out.append(encode_batch(start, k, v, [now] * len(k)))
    return out


@case(
    "floor_memcpy_batches",
    group="broker",
    kind="floor",
    fsync=_IN_MEMORY,
    description="a copy (`bytearray(batch)`) of each pylog batch of 1,000 records",
)
def floor_memcpy_batches(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    batches = _pylog_batches(records, seed)
    copied = 0
    t0 = time.perf_counter()
    for b in batches:
        copied += len(bytearray(b))
    seconds = time.perf_counter() - t0
    return result(records, seconds, copied_bytes=copied)


@case(
    "pylog_kafka_to_pylog",
    group="broker",
    kind="pylog",
    fsync=_IN_MEMORY,
    description="Kafka batches of 1,000 records -> pylog batches (`decode_batches` with its CRC, `encode_batch`)",
    compare=(Compare("floor_memcpy_batches"),),
    goal=Goal("rec_per_s", ">=", 5_000_000, "records/s"),
)
def pylog_kafka_to_pylog(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    from pylog.broker.records import decode_batches
    from pylog.broker.records import encode_batch as kafka_batch
    from pylog.record import decode_lists, encode_batch

    kafka = [kafka_batch(decode_lists(b)) for b in _pylog_batches(records, seed)]
    written = 0
    t0 = time.perf_counter()
    for data in kafka:
        for b in decode_batches(data):
            written += len(encode_batch(0, b.keys, b.values, b.timestamps, None))
    seconds = time.perf_counter() - t0
    return result(records, seconds, pylog_bytes=written)


@case(
    "pylog_pylog_to_kafka",
    group="broker",
    kind="pylog",
    fsync=_IN_MEMORY,
    description="pylog batches of 1,000 records -> Kafka batches (the broker's fetch: `records.from_pylog`)",
    compare=(Compare("floor_memcpy_batches"),),
    goal=Goal("rec_per_s", ">=", 5_000_000, "records/s"),
)
def pylog_pylog_to_kafka(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    from pylog.broker.records import from_pylog

    batches = _pylog_batches(records, seed)
    written = 0
    t0 = time.perf_counter()
    for b in batches:
        written += len(from_pylog(b, 0))
    seconds = time.perf_counter() - t0
    return result(records, seconds, kafka_bytes=written)
