"""Filters pushed down by Spark (``spark.sql.python.filterPushdown.enabled=true``), turned into bounds.

Handled exactly (Spark does not evaluate them again): ``EqualTo``, ``GreaterThan``, ``GreaterThanOrEqual``,
``LessThan``, ``LessThanOrEqual`` and ``In`` on ``topic`` (equality and ``In`` only), ``partition``, ``offset``
and ``timestamp``. Their use:

- ``topic``/``partition``: partitions that cannot match are not planned at all;
- ``offset``: each offset range is narrowed when planned, so whole segments and batches are never opened;
- ``timestamp``: segments whose largest timestamp (from the time index) and batches whose timestamp span (from
  the batch header) cannot match are skipped without decoding;

and every handled filter is also applied row by row with numpy, so the result is exact. Any other filter
(``Not``, ``IsNull``, string filters, filters on other columns, values of unexpected types) is handed back to
Spark unchanged.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Bounds", "ColumnBounds", "push"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_INT_COLUMNS = ("partition", "offset", "timestamp")


@dataclass
class ColumnBounds:
    """``lo <= x <= hi`` (None: unbounded) and, when ``values`` is set, ``x in values``."""

    lo: int | None = None
    hi: int | None = None
    values: frozenset[int] | None = None

    def add_lo(self, v: int) -> None:
        self.lo = v if self.lo is None else max(self.lo, v)

    def add_hi(self, v: int) -> None:
        self.hi = v if self.hi is None else min(self.hi, v)

    def add_values(self, vs: frozenset[int]) -> None:
        self.values = vs if self.values is None else self.values & vs

    def admits(self, x: int) -> bool:
        return (
            (self.lo is None or x >= self.lo)
            and (self.hi is None or x <= self.hi)
            and (self.values is None or x in self.values)
        )

    def overlaps(self, lo: int, hi: int) -> bool:
        """Whether some x in ``[lo, hi]`` may satisfy the bounds."""
        if (self.lo is not None and hi < self.lo) or (self.hi is not None and lo > self.hi):
            return False
        return self.values is None or any(lo <= v <= hi for v in self.values)

    def mask(self, x: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_] | None:
        """Row mask, or None when every row passes trivially."""
        m: npt.NDArray[np.bool_] | None = None
        if self.lo is not None:
            m = x >= self.lo
        if self.hi is not None:
            m = x <= self.hi if m is None else m & (x <= self.hi)
        if self.values is not None:
            inside = np.isin(x, np.fromiter(self.values, dtype=np.int64, count=len(self.values)))
            m = inside if m is None else m & inside
        return m

    @property
    def active(self) -> bool:
        return self.lo is not None or self.hi is not None or self.values is not None


@dataclass
class Bounds:
    """What the handled filters allow. ``timestamp`` is in microseconds since the epoch, like the column."""

    topics: frozenset[str] | None = None
    partition: ColumnBounds = field(default_factory=ColumnBounds)
    offset: ColumnBounds = field(default_factory=ColumnBounds)
    timestamp: ColumnBounds = field(default_factory=ColumnBounds)

    def admits_partition(self, topic: str, partition: int) -> bool:
        return (self.topics is None or topic in self.topics) and self.partition.admits(partition)

    def narrow(self, start: int, end: int) -> tuple[int, int]:
        """Offsets ``[start, end)`` narrowed by the offset bounds (possibly empty)."""
        o = self.offset
        lo = start if o.lo is None else max(start, o.lo)
        hi = end if o.hi is None else min(end, o.hi + 1)
        if o.values is not None:
            inside = [v for v in o.values if lo <= v < hi]
            lo, hi = (min(inside), max(inside) + 1) if inside else (lo, lo)
        return lo, max(lo, hi)


def _to_int(column: str, value: Any) -> int | None:
    if column == "timestamp":
        if isinstance(value, dt.datetime) and value.tzinfo is not None:
            return (value - _EPOCH) // dt.timedelta(microseconds=1)
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def _apply_one(bounds: Bounds, f: Any) -> bool:
    """Fold ``f`` into ``bounds``; False when it is not a filter this source handles."""
    kind = type(f).__name__
    attr = getattr(f, "attribute", None)
    if attr is None or len(attr) != 1:
        return False
    column = attr[0]
    if column == "topic":
        if kind == "EqualTo" and isinstance(f.value, str):
            names = frozenset([f.value])
        elif kind == "In" and all(isinstance(v, str) for v in f.value):
            names = frozenset(f.value)
        else:
            return False
        bounds.topics = names if bounds.topics is None else bounds.topics & names
        return True
    if column not in _INT_COLUMNS:
        return False
    target: ColumnBounds = getattr(bounds, column)
    if kind == "In":
        converted = [_to_int(column, v) for v in f.value]
        if any(v is None for v in converted):
            return False
        target.add_values(frozenset(v for v in converted if v is not None))
        return True
    v = _to_int(column, getattr(f, "value", None))
    if v is None:
        return False
    if kind == "EqualTo":
        target.add_lo(v)
        target.add_hi(v)
    elif kind == "GreaterThan":
        target.add_lo(v + 1)
    elif kind == "GreaterThanOrEqual":
        target.add_lo(v)
    elif kind == "LessThan":
        target.add_hi(v - 1)
    elif kind == "LessThanOrEqual":
        target.add_hi(v)
    else:
        return False
    return True


def push(bounds: Bounds, filters: list[Any]) -> list[Any]:
    """Fold the handled filters into ``bounds``; return the others (the same objects, in order)."""
    return [f for f in filters if not _apply_one(bounds, f)]
