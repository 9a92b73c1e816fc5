"""Time windows of a windowed aggregation, by event time.

A window is ``[start, end)`` in milliseconds of event time (what the timestamp extractor returned). A record
belongs to every window that contains its timestamp: one tumbling window, ``size_ms / advance_ms`` hopping
windows (fewer near time 0: windows never start below 0).

A window **closes** when the task's stream time (the largest event time it has seen) reaches
``end + grace_ms``: a record for a closed window is *late*.

A **session** window (:class:`SessionWindows`) is ``[start, end]`` with both ends included: the first and last
event time of a run of a key's records none of which is more than ``gap_ms`` after the previous one. A record
within ``gap_ms`` of one or more open sessions of its key merges them into one. A session closes when the
stream time passes ``end + gap_ms + grace_ms``; a record that would only make a session closed already is
late. A closed session is removed, and never merged again. With ``emit="final"`` the aggregate of a window is
emitted once, when it closes; with ``emit="update"`` (the default) after every record it takes. A closed window
is removed from its store.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple

from pylog.errors import ConfigError
from pylog.streams.serde import MSGPACK_KEY, Serde

__all__ = [
    "WINDOWED",
    "HoppingWindows",
    "JoinWindows",
    "SessionWindows",
    "SlidingWindows",
    "TumblingWindows",
    "Windowed",
    "Windows",
    "to_ms",
]


class Windowed(NamedTuple):
    """The key of a windowed aggregate: the grouping key and the window ``[start, end)``."""

    key: Any
    start: int
    end: int


WINDOWED = Serde(
    "windowed", lambda w: MSGPACK_KEY.encode(list(w)), lambda raw: Windowed(*MSGPACK_KEY.decode(raw))
)
"""A :class:`Windowed` key as the msgpack array ``[key, start, end]`` (the default key serde of a windowed
stream's ``to()``)."""


def to_ms(name: str, value: int | timedelta, *, minimum: int = 0) -> int:
    """``value`` (int milliseconds or a timedelta) as int milliseconds >= ``minimum``, else ConfigError."""
    if isinstance(value, timedelta):
        ms = value // timedelta(milliseconds=1)
    elif isinstance(value, int) and not isinstance(value, bool):
        ms = value
    else:
        raise ConfigError(f"{name} must be int milliseconds or a timedelta, got {value!r}")
    if ms < minimum:
        raise ConfigError(f"{name} must be >= {minimum} ms, got {ms}")
    return ms


@dataclass(frozen=True, init=False)
class Windows:
    """Fixed-size windows every ``advance_ms`` (hopping; tumbling when ``advance_ms == size_ms``)."""

    size_ms: int
    advance_ms: int
    grace_ms: int

    def __init__(self, size: int | timedelta, advance: int | timedelta, grace: int | timedelta = 0) -> None:
        size_ms = to_ms("size", size, minimum=1)
        advance_ms = to_ms("advance", advance, minimum=1)
        if advance_ms > size_ms:
            raise ConfigError(f"advance ({advance_ms} ms) must not exceed size ({size_ms} ms)")
        object.__setattr__(self, "size_ms", size_ms)
        object.__setattr__(self, "advance_ms", advance_ms)
        object.__setattr__(self, "grace_ms", to_ms("grace", grace))

    def starts(self, timestamp: int) -> range:
        """The start of every window holding ``timestamp`` (>= 0), ascending."""
        last = timestamp - timestamp % self.advance_ms
        first = max(0, timestamp - self.size_ms + self.advance_ms)  # the first start > timestamp - size...
        first -= first % self.advance_ms  # ...on the grid of advance_ms (size need not be a multiple of it)
        return range(first, last + 1, self.advance_ms)


class TumblingWindows(Windows):
    """Back-to-back windows of ``size`` (Kafka's ``TimeWindows.ofSizeAndGrace(size, grace)``)."""

    def __init__(self, size: int | timedelta, grace: int | timedelta = 0) -> None:
        super().__init__(size, size, grace)

    def __repr__(self) -> str:
        return f"TumblingWindows(size={self.size_ms}, grace={self.grace_ms})"


class HoppingWindows(Windows):
    """Windows of ``size`` starting every ``advance`` (overlapping when ``advance < size``; Kafka's
    ``TimeWindows.ofSizeAndGrace(size, grace).advanceBy(advance)``)."""

    def __init__(self, size: int | timedelta, advance: int | timedelta, grace: int | timedelta = 0) -> None:
        super().__init__(size, advance, grace)

    def __repr__(self) -> str:
        return f"HoppingWindows(size={self.size_ms}, advance={self.advance_ms}, grace={self.grace_ms})"


@dataclass(frozen=True, init=False)
class SessionWindows:
    """Sessions of activity separated by ``gap`` of inactivity (Kafka's
    ``SessionWindows.ofInactivityGapAndGrace(gap, grace)``); see the module docstring."""

    gap_ms: int
    grace_ms: int

    def __init__(self, gap: int | timedelta, grace: int | timedelta = 0) -> None:
        object.__setattr__(self, "gap_ms", to_ms("gap", gap))
        object.__setattr__(self, "grace_ms", to_ms("grace", grace))

    def __repr__(self) -> str:
        return f"SessionWindows(gap={self.gap_ms}, grace={self.grace_ms})"


@dataclass(frozen=True, init=False)
class JoinWindows:
    """How close in event time two records of a stream-stream join must be: ``|t1 - t2| <= time_difference``
    (Kafka's ``JoinWindows.ofTimeDifferenceAndGrace``). A record more than ``time_difference + grace`` behind
    the join's stream time is late."""

    time_difference_ms: int
    grace_ms: int

    def __init__(self, time_difference: int | timedelta, grace: int | timedelta = 0) -> None:
        object.__setattr__(self, "time_difference_ms", to_ms("time_difference", time_difference))
        object.__setattr__(self, "grace_ms", to_ms("grace", grace))

    def __repr__(self) -> str:
        return f"JoinWindows(time_difference={self.time_difference_ms}, grace={self.grace_ms})"


@dataclass(frozen=True, init=False)
class SlidingWindows:
    """Windows that slide with the records (Kafka's ``SlidingWindows.ofTimeDifferenceAndGrace``): ``[start,
    start + time_difference]``, both ends included, one ending at each record (``[t - d, t]``) and one starting
    just after it (``[t + 1, t + 1 + d]``) when a later record falls in it; so every set of a key's records
    at most ``d`` apart has its window. A window closes when the stream time reaches ``end + 1 + grace``; a
    record none of whose windows can still be open is late."""

    time_difference_ms: int
    grace_ms: int

    def __init__(self, time_difference: int | timedelta, grace: int | timedelta = 0) -> None:
        object.__setattr__(self, "time_difference_ms", to_ms("time_difference", time_difference))
        object.__setattr__(self, "grace_ms", to_ms("grace", grace))

    def __repr__(self) -> str:
        return f"SlidingWindows(time_difference={self.time_difference_ms}, grace={self.grace_ms})"
