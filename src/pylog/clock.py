"""Injected time.

Retention, rolls by age, linger, session timeouts and tests never read the system clock directly: they ask a
:class:`Clock`. :class:`SystemClock` is the default; :class:`ManualClock` only moves when told to, which makes
time-dependent behaviour deterministic in tests.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

from pylog.errors import ConfigError

__all__ = ["Clock", "ManualClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """A source of wall-clock milliseconds and a monotonic clock for timeouts."""

    def time_ms(self) -> int:
        """Milliseconds since the Unix epoch (record timestamps, retention)."""
        ...

    def monotonic_ms(self) -> float:
        """A clock that never goes backwards, in milliseconds (timeouts, linger, sessions)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds``; a manual clock returns at once (and may advance itself)."""
        ...


class SystemClock:
    """The real clock. Thread-safe."""

    def time_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> float:
        return time.monotonic_ns() / 1_000_000

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock that moves only when :meth:`advance` or :meth:`set` is called. Thread-safe.

    ``sleep(s)`` advances the clock by ``s`` seconds when ``auto_advance`` is true (the default), so code that
    waits in a loop makes progress under a manual clock.

    >>> clock = ManualClock(1_000)
    >>> clock.advance(250)
    >>> clock.time_ms()
    1250
    """

    def __init__(self, start_ms: int = 1_700_000_000_000, *, auto_advance: bool = True) -> None:
        if isinstance(start_ms, bool) or not isinstance(start_ms, int) or start_ms < 0:
            raise ConfigError(f"ManualClock start_ms must be an int >= 0, got {start_ms!r}")
        self._now = start_ms
        self._mono = 0.0
        self._auto = auto_advance
        self._lock = threading.Lock()

    def time_ms(self) -> int:
        with self._lock:
            return self._now

    def monotonic_ms(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, ms: int | float) -> None:
        """Move both clocks forward by ``ms`` milliseconds (must be >= 0)."""
        if ms < 0:
            raise ConfigError("ManualClock cannot go backwards")
        with self._lock:
            self._now += int(ms)
            self._mono += float(ms)

    def set(self, now_ms: int) -> None:
        """Set wall-clock time; the monotonic clock advances by the same amount (never backwards)."""
        with self._lock:
            delta = now_ms - self._now
            self._now = now_ms
            if delta > 0:
                self._mono += delta

    def sleep(self, seconds: float) -> None:
        if self._auto and seconds > 0:
            self.advance(seconds * 1000.0)

    def __repr__(self) -> str:
        return f"ManualClock({self._now})"
