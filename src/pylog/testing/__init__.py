"""Building blocks for testing code that uses pylog, and pylog itself, with Hypothesis and injected faults.

What is here:

- :class:`ManualClock` (re-exported): time that moves only when told to, for retention and rolls by age.
- Hypothesis strategies: :func:`records` (``(key, value, headers, timestamp)`` tuples), :func:`topic_configs`
  (small segments, indexes and retention so that rolls and deletions happen in short tests) and
  :func:`workloads` (lists of :data:`Step` values: appends, flushes, rolls, clock moves, retention,
  truncation), executed with :func:`apply_step`. Only these need Hypothesis (``pip install
  'pylog[testing]'``); without it they raise :class:`ModuleNotFoundError` saying so, and everything else
  here works.
- :class:`TopicModel`: a reference model of a topic. It does not predict segment layouts; it tracks what the
  log has promised (records acknowledged by ``append``, made durable by ``flush``, possibly removed by
  retention or truncation), from which :func:`merge_expectations` builds the arguments of the checks.
- :class:`FaultyFileSystem`: an :class:`pylog.fs.FileSystem` that records every operation, crashes
  (:class:`SimulatedCrash`) after the k-th one, fails the k-th call with ``EIO``/``ENOSPC`` (once or until
  cleared), and keeps a shadow model of what is durable so that :meth:`FaultyFileSystem.power_loss` can
  rewrite the directory as a power cut would leave it.
- :func:`crash_and_reopen` (a power cut of the process holding a log, then recovery: for the rules of a
  Hypothesis ``RuleBasedStateMachine``, followed by :func:`check_open_log` and :meth:`TopicModel.rebase`),
  :func:`corrupt_segment` (a bit flip) and :func:`check_invariants` (recover a directory and check it).

The invariants :func:`check_invariants` checks (I1, I3-I6, I8) are listed in
:mod:`pylog.testing.invariants`; a violation raises :class:`InvariantViolation` listing every problem found.

Example, a crash after every file-system mutation of a small workload::

    import random, shutil, tempfile
    import pylog
    from pylog import fs
    from pylog.testing import (Append, FaultyFileSystem, Flush, ManualClock, SimulatedCrash, TopicModel,
                               apply_step, check_invariants)

    steps = [Append(0, ((b"k", b"v%d" % i, (), 1_000 + i),)) for i in range(5)] + [Flush(0)]

    def run(path: str, model: TopicModel, clock: ManualClock) -> None:
        with pylog.open(path, clock=clock) as log:
            for step in steps:
                apply_step(log, "t", step, model)

    template = tempfile.mkdtemp()
    with pylog.open(template) as log:
        log.create_topic("t", segment_bytes=512)
    counter = FaultyFileSystem(template + "-count", copy_from=template)
    with fs.install(counter):
        run(counter.root, TopicModel("t", 1), ManualClock())
    for k in range(counter.mutations + 1):
        faulty = FaultyFileSystem(template + f"-{k}", copy_from=template, crash_after=k)
        model, clock = TopicModel("t", 1), ManualClock()
        with fs.install(faulty):
            try:
                run(faulty.root, model, clock)
            except SimulatedCrash:
                pass
        faulty.power_loss("drop_unsynced", random.Random(k))
        check_invariants(faulty.root, model.acked_records(), model.durable_records(),
                         attempted=model.attempted(), clock=clock)
        shutil.rmtree(faulty.root)
    shutil.rmtree(counter.root)

Objects that were open when a :class:`FaultyFileSystem` crashed or lost power must not be used again: their
file descriptors were closed (as the death of the process would) and the numbers may be reused.

The package, by responsibility (everything public is re-exported here; import it from ``pylog.testing``):

- :mod:`pylog.testing.batches`: :data:`Record` tuples and their conversion to and from pylog batches.
- :mod:`pylog.testing.model`: the workload steps, :func:`apply_step` and :class:`TopicModel`.
- :mod:`pylog.testing.faults`: :class:`FaultyFileSystem`, power loss, :func:`crash_and_reopen`,
  :func:`corrupt_segment`.
- :mod:`pylog.testing.invariants`: :func:`check_invariants`, :func:`check_open_log`, :func:`log_state`.
- :mod:`pylog.testing.strategies`: the Hypothesis strategies, the only module importing Hypothesis; it is
  imported when one of :func:`records`, :func:`topic_configs` or :func:`workloads` is first looked up here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from pylog.clock import ManualClock
from pylog.testing.batches import Headers, PartitionKey, Record, batch_records, encode_records
from pylog.testing.faults import (
    MUTATING_OPS,
    POWER_LOSS_MODES,
    FaultyFileSystem,
    Op,
    PowerLossMode,
    PowerLossReport,
    SimulatedCrash,
    corrupt_segment,
    crash_and_reopen,
)
from pylog.testing.invariants import InvariantViolation, LogState, check_invariants, check_open_log, log_state
from pylog.testing.model import (
    AdvanceClock,
    Append,
    ApplyRetention,
    Flush,
    Roll,
    Step,
    TopicModel,
    TruncateTo,
    apply_step,
    merge_expectations,
)

if TYPE_CHECKING:
    from pylog.testing.strategies import records, topic_configs, workloads

__all__ = [
    "MUTATING_OPS",
    "POWER_LOSS_MODES",
    "AdvanceClock",
    "Append",
    "ApplyRetention",
    "FaultyFileSystem",
    "Flush",
    "Headers",
    "InvariantViolation",
    "LogState",
    "ManualClock",
    "Op",
    "PartitionKey",
    "PowerLossMode",
    "PowerLossReport",
    "Record",
    "Roll",
    "SimulatedCrash",
    "Step",
    "TopicModel",
    "TruncateTo",
    "apply_step",
    "batch_records",
    "check_invariants",
    "check_open_log",
    "corrupt_segment",
    "crash_and_reopen",
    "encode_records",
    "log_state",
    "merge_expectations",
    "records",
    "topic_configs",
    "workloads",
]

#: The names that live in :mod:`pylog.testing.strategies`, looked up (and Hypothesis imported) on first use.
_STRATEGIES = frozenset({"records", "topic_configs", "workloads"})


def _needs_hypothesis(name: str, missing: ModuleNotFoundError) -> Callable[..., NoReturn]:
    """Stands in for the strategy ``name`` when Hypothesis is not installed: importing the name works (so
    does ``from pylog.testing import *``), calling it raises what importing the strategies raised."""

    def strategy(*args: Any, **kwargs: Any) -> NoReturn:
        raise ModuleNotFoundError(str(missing), name=missing.name) from missing

    strategy.__name__ = strategy.__qualname__ = name
    return strategy


# Hidden from type checkers, which take the strategies' signatures from the import above and keep
# reporting unknown names of this module as errors.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        if name not in _STRATEGIES:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        try:
            from pylog.testing import strategies
        except ModuleNotFoundError as exc:
            if exc.name != "hypothesis":
                raise
            return _needs_hypothesis(name, exc)
        value = getattr(strategies, name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(__all__))
