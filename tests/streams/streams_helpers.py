"""Helpers of the pylog.streams tests: read what an application committed, and wait for it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pylog

DEADLINE_S = 60.0  # a bound against hanging, not a speed assertion


def committed_records(log: pylog.Log, topic: str, **config: Any) -> list[pylog.ConsumerRecord]:
    """Every committed record of ``topic``, partition by partition in offset order."""
    consumer = log.consumer(
        topic, isolation_level="read_committed", auto_offset_reset="earliest", consumer_timeout_ms=0, **config
    )
    try:
        return sorted(consumer, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def wait_for(condition: Callable[[], bool], what: str, deadline_s: float = DEADLINE_S) -> None:
    """Poll ``condition`` until true; fail after ``deadline_s`` (a hang, not a slow machine)."""
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def suppress_model(
    records: list[tuple[Any, Any, int]], limit: int, max_records: int | None
) -> list[tuple[Any, Any, int]]:
    """What suppress(until_time_limit=limit, max_records=...) forwards, by brute force."""
    held: dict[Any, list[Any]] = {}  # key -> [first_time, seq, value, ts]
    out: list[tuple[Any, Any, int]] = []
    stream_time = -1
    for seq, (key, value, ts) in enumerate(records):
        stream_time = max(stream_time, ts)
        if key in held:
            held[key][2:] = [value, ts]
        else:
            held[key] = [ts, seq, value, ts]

        def oldest(held: dict[Any, list[Any]] = held) -> Any:
            return min(held, key=lambda name: (held[name][0], held[name][1]))

        while held and held[oldest()][0] <= stream_time - limit:
            k = oldest()
            out.append((k, held[k][2], held.pop(k)[3]))
        while max_records is not None and len(held) > max_records:
            k = oldest()
            out.append((k, held[k][2], held.pop(k)[3]))
    return out
