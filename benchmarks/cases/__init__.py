"""The benchmark cases and their registry.

A case is a function ``(records, seed, workdir) -> dict`` that prepares its data untimed and times only the
measured part with :func:`time.perf_counter`. It returns ``{"records", "seconds", "bytes", ...extra}`` (see
:func:`benchmarks.cases.workload.result`), or ``{"status": "skipped", "reason": ...}`` when something it needs
is unavailable. ``python -m benchmarks.cases NAME`` runs one case in a fresh process; ``--list`` prints the
registry as JSON, which is how ``run.py`` learns the cases, their baselines and their goals.

Each case is registered with the metadata the report needs:

| field | meaning |
|---|---|
| ``suite`` | ``default`` or ``spark`` (Spark cases start a JVM and run apart) |
| ``group`` | the table the case belongs to: ``write``, ``read``, ``durable``, ``paper``, ``spark`` |
| ``kind`` | ``floor`` (what Python and the hardware allow), ``peer`` (what a user would pick instead), ``pylog`` |
| ``fsync`` | the durability the case pays for, in words |
| ``compare`` | ratios to report: against another case or a published anchor, each with an optional goal |
| ``goal`` | an absolute goal on ``rec_per_s`` or on a number the case returns (or a tuple of them: p50 and p99) |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["CASES", "Case", "CaseFn", "Compare", "Goal", "case"]

CaseFn = Callable[[int, int, Path], dict[str, Any]]


@dataclass(frozen=True)
class Compare:
    """Report ``rec_per_s / baseline``; ``baseline`` names a case, or a published figure when ``anchor`` is
    set (records per second). ``at_least`` turns the ratio into a goal."""

    baseline: str
    at_least: float | None = None
    anchor: float | None = None


@dataclass(frozen=True)
class Goal:
    """An absolute goal: ``metric`` (``rec_per_s`` or a key of the case's result) ``op`` (``>=``/``<=``)
    ``target``, shown with ``unit``."""

    metric: str
    op: str
    target: float
    unit: str


@dataclass(frozen=True)
class Case:
    name: str
    fn: CaseFn
    suite: str
    group: str
    kind: str
    fsync: str
    description: str
    compare: tuple[Compare, ...] = ()
    goals: tuple[Goal, ...] = ()
    timeout_s: float = 300.0

    def meta(self) -> dict[str, Any]:
        out = asdict(self)
        del out["fn"]
        return out


CASES: dict[str, Case] = {}


def case(
    name: str,
    *,
    group: str,
    kind: str,
    fsync: str,
    description: str,
    suite: str = "default",
    compare: tuple[Compare, ...] = (),
    goal: Goal | tuple[Goal, ...] | None = None,
    timeout_s: float = 300.0,
) -> Callable[[CaseFn], CaseFn]:
    """Register the decorated function as the case ``name``."""
    goals = () if goal is None else (goal,) if isinstance(goal, Goal) else tuple(goal)

    def register(fn: CaseFn) -> CaseFn:
        if name in CASES:
            raise ValueError(f"case {name!r} is registered twice")
        CASES[name] = Case(name, fn, suite, group, kind, fsync, description, compare, goals, timeout_s)
        return fn

    return register


def _load_all() -> None:
    # Importing the modules registers their cases; the order here is the order of the report.
    from benchmarks.cases import (  # noqa: F401
        assignors,
        broker_cases,
        floors,
        groups,
        kafka,
        producer_cases,
        pylog_cases,
        scale,
        spark,
        stores,
        streams_cases,
        tiered_read,
        tiered_upload,
        translate,
    )


_load_all()
