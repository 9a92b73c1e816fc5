"""Client metrics in kafka-python's shape: ``{group: {name: value}}`` (``producer.metrics()``,
``consumer.metrics()``).

A :class:`Sensor` records events (a fetch of n records, a batch of b bytes) into one-second buckets kept for
the last 30 seconds, as Kafka's sampled stats do over their window: ``-total`` names count since the client was
created, ``-rate`` names are per second over the window (over the client's age while it is younger), ``-avg``
and ``-max`` are over the window too (``-avg`` 0.0 and ``-max`` ``-inf`` with no event in it, as kafka-python
reports). Time is the log's clock, so a test's ``ManualClock`` drives it.

Thread-safety: thread-safe (a sensor is updated by the producer's background thread and flushing threads).
"""

from __future__ import annotations

import threading
from collections import deque

__all__ = ["WINDOW_MS", "Sensor"]

WINDOW_MS = 30_000
_BUCKET_MS = 1_000


class Sensor:
    """Counts events and the values they carry (see the module docstring)."""

    __slots__ = ("_buckets", "_lock", "created_ms", "events", "total")

    def __init__(self, now_ms: float, *, lock: threading.Lock | None = None) -> None:
        self.created_ms = now_ms
        self.total = 0.0  # sum of the values recorded
        self.events = 0  # number of record() calls
        self._buckets: deque[list[float]] = deque()  # [bucket start ms, events, sum, max]
        #: sensors recorded together (:meth:`record_with`) share one lock
        self._lock = threading.Lock() if lock is None else lock

    def record(self, value: float, now_ms: float) -> None:
        with self._lock:
            self._add(value, now_ms)

    def record_with(self, value: float, other: Sensor, other_value: float, now_ms: float) -> None:
        """:meth:`record` of ``value`` here and of ``other_value`` in ``other`` (made with this sensor's lock),
        under one acquisition of the lock (the producer records two per batch it writes)."""
        with self._lock:
            self._add(value, now_ms)
            other._add(other_value, now_ms)

    def _add(self, value: float, now_ms: float) -> None:
        self.total += value
        self.events += 1
        b = self._buckets
        if b:
            last = b[-1]
            if last[0] == now_ms - now_ms % _BUCKET_MS:
                last[1] += 1
                last[2] += value
                if value > last[3]:
                    last[3] = value
                return
        b.append([now_ms - now_ms % _BUCKET_MS, 1, value, value])
        while b and b[0][0] <= now_ms - WINDOW_MS - _BUCKET_MS:
            b.popleft()

    def _window(self, now_ms: float) -> list[list[float]]:
        with self._lock:
            return [list(x) for x in self._buckets if x[0] > now_ms - WINDOW_MS - _BUCKET_MS]

    def rate(self, now_ms: float) -> float:
        """Sum of the values per second over the window."""
        elapsed = min(max(now_ms - self.created_ms, _BUCKET_MS), WINDOW_MS)
        return sum(x[2] for x in self._window(now_ms)) * 1000.0 / elapsed

    def event_rate(self, now_ms: float) -> float:
        """Events per second over the window."""
        elapsed = min(max(now_ms - self.created_ms, _BUCKET_MS), WINDOW_MS)
        return sum(x[1] for x in self._window(now_ms)) * 1000.0 / elapsed

    def avg(self, now_ms: float) -> float:
        window = self._window(now_ms)
        events = sum(x[1] for x in window)
        return sum(x[2] for x in window) / events if events else 0.0

    def max(self, now_ms: float) -> float:
        window = self._window(now_ms)
        return max((x[3] for x in window), default=float("-inf"))
