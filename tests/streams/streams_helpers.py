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
