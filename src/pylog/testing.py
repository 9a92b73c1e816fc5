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

Invariants checked by :func:`check_invariants`: I1 every record acknowledged after fsync is readable at the
same offset, byte-identical; I3 no read returns a record that fails its CRC or was never sent; I4 each
partition is a prefix of what was attempted (no gaps, no reordering); I5 an offset is never reused for a
different record; I6 offset and time lookups equal a brute-force scan (and :meth:`PartitionLog.verify` finds
nothing); I8 recovering again (after a power cut right after recovery) gives the same state. A violation
raises :class:`InvariantViolation` listing every problem found.

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
"""

from __future__ import annotations

import contextlib
import copy
import errno as _errno
import os
import random
import shutil
import threading
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from pylog import fs
from pylog.clock import Clock, ManualClock
from pylog.config import TopicConfig
from pylog.errors import CorruptRecordError, PylogError, UnsupportedFormatError
from pylog.log import Log, open_log
from pylog.partition import files
from pylog.partition.log import AppendInfo, PartitionLog
from pylog.record import DecodedBatch, encode_batch, encode_headers

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

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

# -- records ------------------------------------------------------------------------------------------------

Headers: TypeAlias = tuple[tuple[str, bytes | None], ...]
#: One record as the model sees it: ``(key, value, headers, timestamp_ms)``.
Record: TypeAlias = tuple[bytes | None, bytes | None, Headers, int]
#: ``(topic, partition)``.
PartitionKey: TypeAlias = tuple[str, int]


def encode_records(records_: Sequence[Record], *, compression: str = "none") -> bytes:
    """One batch (base offset 0, ready for :meth:`PartitionLog.append`) holding ``records_`` in order."""
    headers = [encode_headers(r[2]) for r in records_]
    return encode_batch(
        0,
        [r[0] for r in records_],
        [r[1] for r in records_],
        [r[3] for r in records_],
        headers if any(headers) else None,
        compression=compression,
    )


def batch_records(batch: DecodedBatch) -> list[tuple[int, Record]]:
    """``(offset, record)`` for every record of a decoded batch."""
    keys, values, headers = batch.keys(), batch.values(), batch.headers()
    return [
        (int(o), (keys[i], values[i], tuple((str(k), v) for k, v in headers[i]), int(batch.timestamps[i])))
        for i, o in enumerate(batch.offsets.tolist())
    ]


_HYPOTHESIS_MISSING = "pylog.testing's strategies need Hypothesis: pip install 'pylog[testing]'"


@contextlib.contextmanager
def _hypothesis_extra() -> Iterator[None]:
    """Around the import of Hypothesis (the ``testing`` extra): its absence becomes an error saying what to
    install. Only the strategies need it; the rest of this module works without it."""
    try:
        yield
    except ImportError as exc:
        raise ModuleNotFoundError(_HYPOTHESIS_MISSING, name="hypothesis") from exc


def records(
    *, max_key: int = 16, max_value: int = 64, min_ts: int = 0, max_ts: int = 2**41
) -> SearchStrategy[Record]:
    """A record: an optional key, a value (None only when there is a key), up to two headers, a timestamp."""
    with _hypothesis_extra():
        from hypothesis import strategies as st

    @st.composite
    def draw_record(draw: st.DrawFn) -> Record:
        key = draw(st.none() | st.binary(max_size=max_key))
        value = draw(
            st.binary(max_size=max_value) if key is None else st.none() | st.binary(max_size=max_value)
        )
        headers = draw(
            st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=2).map(tuple)
        )
        ts = draw(st.integers(min_value=min_ts, max_value=max_ts))
        return (key, value, headers, ts)

    return draw_record()


def topic_configs(**fixed: Any) -> SearchStrategy[TopicConfig]:
    """Topic configs sized for tests: segments of 256 B - 4 KiB (so rolls happen), dense indexes, optional
    time/size retention, flush policies and LogAppendTime. ``fixed`` overrides any field."""
    with _hypothesis_extra():
        from hypothesis import strategies as st
    fields: dict[str, SearchStrategy[Any]] = {
        "segment_bytes": st.integers(256, 4096),
        "index_interval_bytes": st.sampled_from([0, 64, 256, 4096]),
        "retention_ms": st.sampled_from([-1, 1_000, 60_000]),
        "retention_bytes": st.sampled_from([-1, -1, 2048, 8192]),
        "flush_messages": st.sampled_from([-1, -1, 1, 5]),
        "message_timestamp_type": st.sampled_from(["CreateTime", "CreateTime", "LogAppendTime"]),
        "compression_type": st.sampled_from(["none", "none", "zstd", "lz4", "gzip"]),
    }
    for name, value in fixed.items():
        fields[name] = st.just(value)
    return st.fixed_dictionaries(fields).map(lambda d: TopicConfig().replace(**d))


# -- workload steps ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Append:
    """Append ``records`` as one batch to ``partition`` (acks=1: written to the operating system)."""

    partition: int
    records: tuple[Record, ...]


@dataclass(frozen=True)
class Flush:
    """fsync ``partition`` (acks=all for everything appended before)."""

    partition: int


@dataclass(frozen=True)
class Roll:
    """Roll the active segment of ``partition``."""

    partition: int


@dataclass(frozen=True)
class AdvanceClock:
    """Move the :class:`ManualClock` forward by ``ms``."""

    ms: int


@dataclass(frozen=True)
class ApplyRetention:
    """Run retention on every partition of the topic."""


@dataclass(frozen=True)
class TruncateTo:
    """Truncate ``partition`` at ``fraction`` of the way from its log start to its log end offset (on batch
    boundaries, as Kafka does)."""

    partition: int
    fraction: float


Step: TypeAlias = Append | Flush | Roll | AdvanceClock | ApplyRetention | TruncateTo


def workloads(
    partitions: int = 1,
    *,
    max_steps: int = 30,
    max_batch: int = 4,
    truncate: bool = True,
    start_ms: int = 1_700_000_000_000,
) -> SearchStrategy[list[Step]]:
    """Lists of steps for a topic with ``partitions`` partitions. Record timestamps stay near ``start_ms`` so
    retention and time lookups have something to do."""
    with _hypothesis_extra():
        from hypothesis import strategies as st
    part = st.integers(0, partitions - 1)
    rec = records(min_ts=start_ms - 5_000, max_ts=start_ms + 120_000)
    choices: list[SearchStrategy[Step]] = [
        st.builds(Append, part, st.lists(rec, min_size=1, max_size=max_batch).map(tuple)),
        st.builds(Append, part, st.lists(rec, min_size=1, max_size=max_batch).map(tuple)),
        st.builds(Flush, part),
        st.builds(Roll, part),
        st.builds(AdvanceClock, st.integers(0, 30_000)),
        st.just(ApplyRetention()),
    ]
    if truncate:
        choices.append(st.builds(TruncateTo, part, st.floats(0.0, 1.0)))
    return st.lists(st.one_of(choices), max_size=max_steps)


def apply_step(log: Log, topic: str, step: Step, model: TopicModel) -> None:
    """Run ``step`` on ``log`` and record it in ``model``. Errors propagate after the model was told."""
    t = log.topic(topic)
    clock = log.clock
    if isinstance(step, AdvanceClock):
        if not isinstance(clock, ManualClock):
            raise TypeError("AdvanceClock needs a log opened with a ManualClock")
        clock.advance(step.ms)
        return
    if isinstance(step, ApplyRetention):
        now = clock.time_ms()
        for p in range(t.num_partitions):
            model.begin_retention(p, now, t.config)
        t.apply_retention()
        return
    plog = t.partition(step.partition)
    if isinstance(step, Append):
        append_time = clock.time_ms() if t.config.log_append_time else None
        batch = step.records
        if append_time is not None:  # the log stamps them; it needs one timestamp per batch to start from
            batch = tuple((k, v, h, append_time) for k, v, h, _ in batch)
        model.begin_append(step.partition, batch)
        try:
            info = plog.append(encode_records(batch, compression=t.config.compression_type))
        except PylogError:
            model.abort_append(step.partition)
            raise
        model.end_append(step.partition, info)
    elif isinstance(step, Flush):
        model.end_flush(step.partition, plog.flush())
    elif isinstance(step, Roll):
        plog.roll()
    else:
        start, end = plog.log_start_offset, plog.log_end_offset
        offset = start + int(step.fraction * (end - start))
        model.begin_truncate(step.partition, offset)
        model.end_truncate(step.partition, plog.truncate_to(offset))


# -- the reference model ----------------------------------------------------------------------------------


@dataclass
class _PartitionModel:
    history: list[Record] = field(default_factory=list)
    batch_starts: list[int] = field(default_factory=list)
    acked_end: int = 0
    durable_end: int = 0
    max_start: int = 0
    in_flight: int = 0  # end offset of an append that has not returned (0: none)
    alternatives: list[list[Record]] = field(default_factory=list)
    phantoms: list[list[Record]] = field(default_factory=list)
    truncating: list[Record] | None = None
    truncate_offset: int = 0


class TopicModel:
    """What a topic must (and may) contain, built from the calls made and their results.

    Per partition the model keeps the history of records in offset order, where acknowledgements end
    (``append`` returned: acks=1; ``flush`` returned: acks=all) and the highest log start offset retention
    may have reached. Interrupted or failed operations are kept as alternatives: an append that did not
    return may or may not be in the log; an interrupted truncation may or may not have happened.
    Retention is modelled by its bound (a segment can only be deleted once all of its records are older than
    ``retention_ms``); size-based retention is not bounded.
    """

    def __init__(self, name: str, partitions: int) -> None:
        self.name = name
        self.partitions = [_PartitionModel() for _ in range(partitions)]

    def copy(self) -> TopicModel:
        return copy.deepcopy(self)

    # -- updates --------------------------------------------------------------------------------------

    def begin_append(
        self, partition: int, batch: Sequence[Record], *, append_time: int | None = None
    ) -> None:
        """An append of ``batch`` starts (with ``append_time`` for LogAppendTime topics)."""
        m = self.partitions[partition]
        if append_time is not None:
            batch = [(k, v, h, append_time) for k, v, h, _ in batch]
        m.batch_starts.append(len(m.history))
        m.history.extend(batch)
        m.in_flight = len(m.history)

    def end_append(self, partition: int, info: AppendInfo) -> None:
        """The append returned ``info``: acknowledged (acks=1); it must land right after the previous one."""
        m = self.partitions[partition]
        base = m.batch_starts[-1]
        if info.base_offset != base or info.last_offset != m.in_flight - 1:
            raise InvariantViolation(
                [
                    f"{self.name}-{partition}: append landed at {info.base_offset}..{info.last_offset}, "
                    f"expected {base}..{m.in_flight - 1} (I4)"
                ]
            )
        m.acked_end = m.in_flight
        m.in_flight = 0
        m.phantoms.clear()

    def abort_append(self, partition: int) -> None:
        """The append raised: it is not acknowledged, but its bytes may still surface after a crash."""
        m = self.partitions[partition]
        m.phantoms.append(list(m.history))
        base = m.batch_starts.pop()
        del m.history[base:]
        m.in_flight = 0

    def end_flush(self, partition: int, durable_offset: int) -> None:
        """``flush`` returned ``durable_offset``: everything acknowledged before it is durable (acks=all)."""
        m = self.partitions[partition]
        if durable_offset < m.acked_end or durable_offset > len(m.history):
            raise InvariantViolation(
                [
                    f"{self.name}-{partition}: flush returned {durable_offset}, "
                    f"acknowledged end is {m.acked_end}"
                ]
            )
        m.durable_end = max(m.durable_end, min(durable_offset, m.acked_end))

    def rebase(self, log: Log) -> None:
        """After a crash and recovery: what the log now holds becomes the history, all of it durable
        (recovery leaves nothing unsynced); below the log start the old history is kept. Check the log against
        the model first (:func:`check_open_log`): this accepts whatever is there."""
        topic = log.topic(self.name)
        for p, m in enumerate(self.partitions):
            plog = topic.partition(p)
            start = plog.log_start_offset
            if start > len(m.history):
                raise InvariantViolation([f"{self.name}-{p}: log start {start} is past the model's history"])
            history = m.history[:start]
            starts = [b for b in m.batch_starts if b < start]
            for batch in plog.batches():
                starts.append(batch.header.base_offset)
                history.extend(r for _, r in batch_records(batch))
            m.history, m.batch_starts = history, starts
            m.acked_end = m.durable_end = len(history)
            m.in_flight = 0
            m.alternatives, m.phantoms, m.truncating = [], [], None

    def mark_all_durable(self) -> None:
        """After a clean :meth:`Log.close`: everything acknowledged is durable."""
        for m in self.partitions:
            m.durable_end = m.acked_end

    def begin_retention(self, partition: int, now_ms: int, config: TopicConfig) -> None:
        """Retention runs at ``now_ms``: raise the bound on the log start offset accordingly."""
        m = self.partitions[partition]
        if not config.deletes:
            return
        if config.retention_bytes >= 0:
            m.max_start = len(m.history)
            return
        if config.retention_ms < 0:
            return
        bound = len(m.history)
        for offset, rec in enumerate(m.history):
            if now_ms - rec[3] <= config.retention_ms:
                bound = offset
                break
        m.max_start = max(m.max_start, bound)

    def begin_truncate(self, partition: int, offset: int) -> None:
        """``truncate_to(offset)`` starts: records from the batch holding ``offset`` on need not survive."""
        m = self.partitions[partition]
        m.truncating = list(m.history)
        m.truncate_offset = offset
        new_end = self._truncated_end(m, offset)
        m.alternatives.append(m.truncating)
        m.durable_end = min(m.durable_end, new_end)
        m.acked_end = min(m.acked_end, new_end)

    def end_truncate(self, partition: int, new_end: int) -> None:
        """``truncate_to`` returned ``new_end``: the truncation is done (and durable)."""
        m = self.partitions[partition]
        pre = m.truncating
        expected = self._truncated_end(m, m.truncate_offset)
        if pre is not None and expected != new_end:
            raise InvariantViolation(
                [f"{self.name}-{partition}: truncate_to left end {new_end}, model {expected}"]
            )
        del m.history[new_end:]
        m.batch_starts = [b for b in m.batch_starts if b < new_end]
        m.acked_end = min(m.acked_end, new_end)
        m.durable_end = min(m.durable_end, new_end)
        m.max_start = min(m.max_start, new_end)
        if pre is not None:
            m.alternatives = [a for a in m.alternatives if a is not pre]
        m.truncating = None
        m.phantoms.clear()

    @staticmethod
    def _truncated_end(m: _PartitionModel, offset: int) -> int:
        if offset >= len(m.history):
            return len(m.history)
        starts = [b for b in m.batch_starts if b <= offset]
        return starts[-1] if starts else 0

    # -- expectations ---------------------------------------------------------------------------------

    def acked_records(self) -> dict[PartitionKey, list[Record]]:
        return {(self.name, p): m.history[: m.acked_end] for p, m in enumerate(self.partitions)}

    def durable_records(self) -> dict[PartitionKey, list[Record]]:
        return {(self.name, p): m.history[: m.durable_end] for p, m in enumerate(self.partitions)}

    def attempted(self) -> dict[PartitionKey, list[list[Record]]]:
        return {
            (self.name, p): [m.history, *m.alternatives, *m.phantoms] for p, m in enumerate(self.partitions)
        }

    def max_log_start(self) -> dict[PartitionKey, int]:
        return {(self.name, p): m.max_start for p, m in enumerate(self.partitions)}


def merge_expectations(models: Sequence[TopicModel], *, durable_is_acked: bool = False) -> dict[str, Any]:
    """Keyword arguments for :func:`check_invariants` covering every model (``durable_is_acked`` after a
    process kill without power loss: every acknowledged record must survive, I2)."""
    acked: dict[PartitionKey, list[Record]] = {}
    durable: dict[PartitionKey, list[Record]] = {}
    attempted: dict[PartitionKey, list[list[Record]]] = {}
    starts: dict[PartitionKey, int] = {}
    for model in models:
        acked.update(model.acked_records())
        durable.update(model.acked_records() if durable_is_acked else model.durable_records())
        attempted.update(model.attempted())
        starts.update(model.max_log_start())
    return {
        "acked_records": acked,
        "durable_records": durable,
        "attempted": attempted,
        "max_log_start": starts,
    }


# -- fault injection --------------------------------------------------------------------------------------


class SimulatedCrash(BaseException):
    """The process "died" at this point. A BaseException so that ``except Exception`` cleanup does not run
    as if it had survived; once raised, every further operation of the layer raises it too."""


#: Operations that change what a power cut would leave (crash points).
MUTATING_OPS = frozenset(
    {"create", "pwrite", "fsync", "fdatasync", "ftruncate", "rename", "unlink", "mkdir", "rmdir", "fsync_dir"}
)

PowerLossMode: TypeAlias = Literal[
    "drop_unsynced", "random_blocks", "torn_zeros", "torn_junk", "process_kill"
]
#: ``drop_unsynced``: file contents roll back to their last fsync, unsynced directory changes are undone;
#: ``random_blocks``: each unsynced block and the size independently keep the old or new contents and each
#: directory keeps a random prefix of its unsynced changes; ``torn_zeros``/``torn_junk``: unsynced directory
#: changes are undone, and every file with unsynced contents keeps its earlier writes but its last write
#: persists torn (a random prefix of the data, then zeros or garbage); ``process_kill``: nothing is lost (the
#: operating system survives), only the process dies.
POWER_LOSS_MODES: tuple[PowerLossMode, ...] = (
    "drop_unsynced",
    "random_blocks",
    "torn_zeros",
    "torn_junk",
    "process_kill",
)


@dataclass(frozen=True)
class Op:
    """One recorded call. ``mutating`` marks crash points (see :data:`MUTATING_OPS`)."""

    index: int
    name: str
    path: str
    detail: str
    mutating: bool


@dataclass
class PowerLossReport:
    """What :meth:`FaultyFileSystem.power_loss` changed, relative to what the crashed process saw."""

    mode: str
    files_changed: list[str] = field(default_factory=list)
    entries_reverted: list[str] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)


@dataclass
class _Node:
    ident: int
    is_dir: bool
    data: bytearray = field(default_factory=bytearray)
    durable: bytes = b""
    entries: dict[str, int] = field(default_factory=dict)
    durable_entries: dict[str, int] = field(default_factory=dict)
    dir_log: list[tuple[str, int | None]] = field(default_factory=list)


@dataclass
class _Tree:
    ident: int
    entries: dict[str, _Tree | int]


@dataclass
class _Write:
    ident: int
    offset: int
    data: bytes
    before: bytes


@dataclass
class _Fault:
    nth: int
    code: int
    persistent: bool
    ops: frozenset[str] | None
    seen: int = 0
    fired: bool = False


class FaultyFileSystem(fs.FileSystem):
    """A file system layer for fault injection under the directory ``root``.

    Every call is performed for real and recorded in :attr:`ops`. Beside it a shadow model of ``root`` is
    kept: per file its current and durable contents (as of its last ``fsync``/``fdatasync``), per
    directory its current and durable entries (as of its last :meth:`fsync_dir`) and the changes since. What
    exists under ``root`` when the layer is created counts as durable (``copy_from`` first copies a
    template directory there).

    - ``crash_after=k``: the first ``k`` counted operations run; the next raises :class:`SimulatedCrash`
      without running, and so does every later one. Counted are the mutating operations
      (:data:`MUTATING_OPS`; an ``open`` that may create or truncate counts as ``create``), or every
      operation with ``count_all=True``. :attr:`mutations` is the number counted so far.
    - :meth:`inject_error`: fail the n-th call (of the named operations) with ``EIO``/``ENOSPC``, once or
      until :meth:`clear_faults`; errors surface as pylog raises them
      (:class:`~pylog.errors.StorageError`/:class:`~pylog.errors.DiskFullError`). A failing ``pwrite``
      writes the first half of its data first; a failing ``fsync`` makes nothing durable.
    - :meth:`power_loss`: kill the "process" (close its descriptors) and rewrite ``root`` as a power cut
      would leave it; afterwards the layer passes calls through again with the new contents as durable.

    Paths outside ``root`` are passed through unmodelled. Thread-safe.
    """

    def __init__(
        self,
        root: str,
        *,
        crash_after: int | None = None,
        count_all: bool = False,
        copy_from: str | None = None,
        block_size: int = 4096,
        real_sync: bool = True,
    ) -> None:
        self.root = os.path.abspath(root)
        if copy_from is not None:
            if os.path.exists(self.root):
                shutil.rmtree(self.root)
            shutil.copytree(copy_from, self.root, symlinks=True)
        os.makedirs(self.root, exist_ok=True)
        self.crash_after = crash_after
        self.count_all = count_all
        self.block_size = block_size
        self.real_sync = real_sync
        self.ops: list[Op] = []
        self.mutations = 0
        self.crashed = False
        #: Where the crash happened (the first :class:`SimulatedCrash`), or None.
        self.crash_point: str | None = None
        self.errors_injected = 0
        #: Indexes (into :attr:`ops`) of the calls that failed with an injected error.
        self.failed_ops: set[int] = set()
        #: Paths found on disk that the model did not know (written around the layer).
        self.untracked: list[str] = []
        self._lock = threading.RLock()
        self._faults: list[_Fault] = []
        self._nodes: dict[int, _Node] = {}
        self._fds: dict[int, int | None] = {}
        self._fd_paths: dict[int, str] = {}
        self._last_write: dict[int, _Write] = {}  # per file: its last unsynced write
        self._baseline()

    # -- model ----------------------------------------------------------------------------------------

    def _new(self, is_dir: bool, data: bytes = b"") -> _Node:
        node = _Node(len(self._nodes) + 1, is_dir, bytearray(data), data)
        self._nodes[node.ident] = node
        return node

    def _baseline(self) -> None:
        self._nodes.clear()
        self._fds.clear()
        self._last_write.clear()
        self._root = self._scan(self.root).ident

    def _scan(self, path: str) -> _Node:
        if os.path.isdir(path) and not os.path.islink(path):
            node = self._new(True)
            for name in sorted(os.listdir(path)):
                node.entries[name] = self._scan(os.path.join(path, name)).ident
            node.durable_entries = dict(node.entries)
            return node
        with open(path, "rb") as f:
            return self._new(False, f.read())

    def _parts(self, path: str) -> list[str] | None:
        full = os.path.abspath(path)
        if full == self.root:
            return []
        if not full.startswith(self.root + os.sep):
            return None
        return full[len(self.root) + 1 :].split(os.sep)

    def _resolve(self, parts: list[str]) -> _Node | None:
        node = self._nodes[self._root]
        for name in parts:
            ident = node.entries.get(name)
            if ident is None:
                return None
            node = self._nodes[ident]
        return node

    def _parent(self, parts: list[str], path: str) -> _Node:
        parent = self._resolve(parts[:-1])
        if parent is None:
            parent = self._adopt(parts[:-1], os.path.dirname(os.path.abspath(path)))
        return parent

    def _adopt(self, parts: list[str], path: str) -> _Node:
        """A path that exists on disk but not in the model was made around this layer: take it as durable."""
        self.untracked.append(path)
        parent = self._nodes[self._root]
        for i, name in enumerate(parts):
            ident = parent.entries.get(name)
            if ident is None:
                sub = os.path.join(self.root, *parts[: i + 1])
                node = self._scan(sub) if os.path.exists(sub) else self._new(True)
                parent.entries[name] = node.ident
                parent.durable_entries[name] = node.ident
                ident = node.ident
            parent = self._nodes[ident]
        return parent

    def _link(self, parent: _Node, name: str, ident: int | None) -> None:
        if ident is None:
            parent.entries.pop(name, None)
        else:
            parent.entries[name] = ident
        parent.dir_log.append((name, ident))

    def _node_for_path(self, path: str) -> _Node | None:
        parts = self._parts(path)
        if parts is None:
            return None
        node = self._resolve(parts)
        if node is None and os.path.exists(path):
            node = self._adopt(parts, path)
        return node

    def _sync(self, node: _Node) -> None:
        if node.is_dir:
            node.durable_entries = dict(node.entries)
            node.dir_log.clear()
        else:
            node.durable = bytes(node.data)
            self._last_write.pop(node.ident, None)

    # -- fault plumbing -------------------------------------------------------------------------------

    def inject_error(
        self,
        nth: int,
        code: int = _errno.EIO,
        *,
        persistent: bool = False,
        ops: Collection[str] | None = None,
    ) -> None:
        """Fail the ``nth`` (0-based) call from now on among ``ops`` (default: every operation) with errno
        ``code``; with ``persistent`` that call and every later matching one fail until
        :meth:`clear_faults`."""
        with self._lock:
            self._faults.append(_Fault(nth, code, persistent, None if ops is None else frozenset(ops)))

    @property
    def first_failed(self) -> int | None:
        """Index (into :attr:`ops`) of the first call that failed with an injected error."""
        return min(self.failed_ops) if self.failed_ops else None

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def fault_fired(self) -> bool:
        with self._lock:
            return any(f.fired for f in self._faults)

    def _enter(self, name: str, path: str, detail: str = "", *, mutating: bool | None = None) -> None:
        """Record the call; raise the crash or the injected error it is due for."""
        counted_name = name
        is_mut = name in MUTATING_OPS if mutating is None else mutating
        if self.crashed:
            raise SimulatedCrash(f"the process already crashed ({name} {path})")
        if self.count_all or is_mut:
            if self.crash_after is not None and self.mutations >= self.crash_after:
                self.crashed = True
                self.crash_point = f"before operation #{self.mutations}: {name} {path}"
                raise SimulatedCrash(f"simulated crash {self.crash_point}")
            self.mutations += 1
        self.ops.append(Op(len(self.ops), counted_name, path, detail, is_mut))
        for fault in self._faults:
            if fault.ops is not None and name not in fault.ops:
                continue
            due = fault.seen == fault.nth or (fault.persistent and fault.seen > fault.nth)
            fault.seen += 1
            if due:
                fault.fired = True
                self.errors_injected += 1
                self.failed_ops.add(len(self.ops) - 1)
                raise fs._translate(OSError(fault.code, os.strerror(fault.code)), name, path)

    def _path_of(self, fd: int) -> str:
        return self._fd_paths.get(fd, f"fd {fd}")

    # -- the layer ------------------------------------------------------------------------------------

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        creating = bool(flags & (os.O_CREAT | os.O_TRUNC))
        with self._lock:
            self._enter("create" if creating else "open", path, oct(flags), mutating=creating)
            parts = self._parts(path)
            node = None if parts is None else self._node_for_path(path)
            fd = super().open(path, flags, mode)
            self._fd_paths[fd] = path
            if parts is not None and node is None:
                node = self._new(os.path.isdir(path))
                self._link(self._parent(parts, path), parts[-1], node.ident)
            if node is not None and flags & os.O_TRUNC and not node.is_dir:
                self._record_write(node, 0, b"", truncate=True)
            self._fds[fd] = None if node is None else node.ident
            return fd

    def close(self, fd: int) -> None:
        with self._lock:
            try:
                self._enter("close", self._path_of(fd))
            except PylogError:
                os.close(fd)  # as on Linux: the descriptor is released even when close reports an error
                self._fds.pop(fd, None)
                raise
            super().close(fd)
            self._fds.pop(fd, None)

    def _record_write(self, node: _Node, offset: int, data: bytes, *, truncate: bool = False) -> None:
        before = bytes(node.data)
        if truncate:
            del node.data[offset:]
        else:
            end = offset + len(data)
            if len(node.data) < offset:
                node.data.extend(bytes(offset - len(node.data)))
            node.data[offset:end] = data
        if not truncate:
            self._last_write[node.ident] = _Write(node.ident, offset, bytes(data), before)

    def _file(self, fd: int) -> _Node | None:
        ident = self._fds.get(fd)
        return None if ident is None else self._nodes[ident]

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        raw = bytes(data)
        with self._lock:
            node = self._file(fd)
            try:
                self._enter("pwrite", self._path_of(fd), f"{len(raw)}@{offset}")
            except PylogError:
                half = raw[: len(raw) // 2]
                if half:
                    super().pwrite(fd, half, offset)
                    if node is not None:
                        self._record_write(node, offset, half)
                raise
            super().pwrite(fd, raw, offset)
            if node is not None:
                self._record_write(node, offset, raw)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        with self._lock:
            self._enter("pread", self._path_of(fd), f"{size}@{offset}")
            return super().pread(fd, size, offset)

    def fsync(self, fd: int) -> None:
        with self._lock:
            self._enter("fsync", self._path_of(fd))
            self._really_sync(fd)
            node = self._file(fd)
            if node is not None:
                self._sync(node)

    def fdatasync(self, fd: int) -> None:
        with self._lock:
            self._enter("fdatasync", self._path_of(fd))
            self._really_sync(fd)
            node = self._file(fd)
            if node is not None:
                self._sync(node)

    def _really_sync(self, fd: int) -> None:
        if self.real_sync:
            super().fsync(fd)
        else:
            try:
                os.fstat(fd)  # without the fsync itself, a bad descriptor still fails
            except OSError as exc:
                raise fs._translate(exc, "fsync", fd) from exc

    def ftruncate(self, fd: int, size: int) -> None:
        with self._lock:
            self._enter("ftruncate", self._path_of(fd), str(size))
            super().ftruncate(fd, size)
            node = self._file(fd)
            if node is not None:
                if size <= len(node.data):
                    self._record_write(node, size, b"", truncate=True)
                else:
                    node.data.extend(bytes(size - len(node.data)))

    def size(self, fd: int) -> int:
        with self._lock:
            self._enter("size", self._path_of(fd))
            return super().size(fd)

    def rename(self, src: str, dst: str) -> None:
        with self._lock:
            self._enter("rename", src, dst)
            node = self._node_for_path(src)
            super().rename(src, dst)
            sp, dp = self._parts(src), self._parts(dst)
            if node is None or sp is None:
                if dp is not None:
                    self._node_for_path(dst)
                return
            self._link(self._parent(sp, src), sp[-1], None)
            if dp is not None:
                self._link(self._parent(dp, dst), dp[-1], node.ident)

    def unlink(self, path: str) -> None:
        with self._lock:
            self._enter("unlink", path)
            self._node_for_path(path)
            super().unlink(path)
            parts = self._parts(path)
            if parts:
                self._link(self._parent(parts, path), parts[-1], None)

    def mkdir(self, path: str) -> None:
        with self._lock:
            self._enter("mkdir", path)
            super().mkdir(path)
            parts = self._parts(path)
            if parts:
                self._link(self._parent(parts, path), parts[-1], self._new(True).ident)

    def rmdir(self, path: str) -> None:
        with self._lock:
            self._enter("rmdir", path)
            self._node_for_path(path)
            super().rmdir(path)
            parts = self._parts(path)
            if parts:
                self._link(self._parent(parts, path), parts[-1], None)

    def fsync_dir(self, path: str) -> None:
        with self._lock:
            self._enter("fsync_dir", path)
            if self.real_sync:
                super().fsync_dir(path)
            elif not os.path.isdir(path):
                raise FileNotFoundError(_errno.ENOENT, "No such directory", path)
            node = self._node_for_path(path)
            if node is not None:
                self._sync(node)

    def listdir(self, path: str) -> list[str]:
        with self._lock:
            self._enter("listdir", path)
            return super().listdir(path)

    # -- crashes --------------------------------------------------------------------------------------

    def kill(self) -> None:
        """The process dies: every descriptor opened through this layer is closed; later calls raise
        :class:`SimulatedCrash` until :meth:`power_loss` rebuilds the directory."""
        with self._lock:
            self.crashed = True
            for fd in list(self._fds):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._fds.clear()
            self._fd_paths.clear()

    def _real_contents(self) -> dict[int, bytes]:
        """What the files hold on disk now (including writes made around the layer, such as the shared
        memory of ``partition.state``)."""
        out: dict[int, bytes] = {}
        for rel, node in self._walk(current=True):
            if rel and not node.is_dir:
                try:
                    with open(os.path.join(self.root, rel), "rb") as f:
                        out[node.ident] = f.read()
                except OSError:
                    pass
        return out

    def bypassed(self) -> list[str]:
        """Paths under ``root`` that exist on disk but not in the model, or the other way round: what was
        created, renamed or removed around this layer (empty when every change went through it)."""
        with self._lock:
            model = {rel for rel, _ in self._walk(current=True) if rel}
            disk = set()
            for dirpath, dirnames, filenames in os.walk(self.root):
                for name in dirnames + filenames:
                    disk.add(os.path.relpath(os.path.join(dirpath, name), self.root))
            return sorted(model ^ disk) + list(self.untracked)

    def unsynced_files(self) -> list[str]:
        """Paths (relative to ``root``) whose current contents differ from their durable contents."""
        out = []
        for rel, node in self._walk(current=True):
            if not node.is_dir and bytes(node.data) != node.durable:
                out.append(rel)
        return out

    def _walk(self, *, current: bool) -> Iterator[tuple[str, _Node]]:
        stack: list[tuple[str, _Node]] = [("", self._nodes[self._root])]
        while stack:
            rel, node = stack.pop()
            yield rel, node
            if node.is_dir:
                entries = node.entries if current else node.durable_entries
                for name, ident in sorted(entries.items()):
                    stack.append((os.path.join(rel, name) if rel else name, self._nodes[ident]))

    def power_loss(
        self, mode: PowerLossMode = "drop_unsynced", rng: random.Random | None = None
    ) -> PowerLossReport:
        """Kill the process and rewrite ``root`` as the power cut ``mode`` (see :data:`POWER_LOSS_MODES`)
        would leave it. Then the layer is usable again, with the rewritten directory as its durable
        baseline (and no crash or error scheduled)."""
        if mode not in POWER_LOSS_MODES:
            raise ValueError(f"unknown power loss mode {mode!r}; use one of {POWER_LOSS_MODES}")
        rng = rng if rng is not None else random.Random(0)
        with self._lock:
            self.kill()
            report = PowerLossReport(mode)
            torn = self._torn_targets() if mode in ("torn_zeros", "torn_junk") else {}
            contents: dict[int, bytes] = {}
            tree = self._surviving_tree(self._root, mode, rng, report, "")
            on_disk = self._real_contents() if mode == "process_kill" else {}
            for ident in sorted(self._reachable(tree)):
                node = self._nodes[ident]
                if node.is_dir:
                    continue
                if mode == "process_kill":
                    data = on_disk.get(ident, bytes(node.data))
                elif mode == "random_blocks":
                    data = self._mix_blocks(node, rng)
                elif ident in torn:
                    data = self._tear(torn[ident], mode, rng)
                    report.torn.append(
                        f"node {ident}: write of {len(torn[ident].data)} bytes at {torn[ident].offset}"
                    )
                else:
                    data = node.durable
                contents[ident] = data
            self._materialize(tree, contents, report)
            self.crashed = False
            self.crash_point = None
            self.crash_after = None
            self.mutations = 0
            self.ops.clear()
            self._faults.clear()
            self.failed_ops.clear()
            self._baseline()
            return report

    def _surviving_tree(
        self, ident: int, mode: str, rng: random.Random, report: PowerLossReport, rel: str
    ) -> _Tree:
        node = self._nodes[ident]
        if mode == "process_kill":
            entries = dict(node.entries)
        else:
            entries = dict(node.durable_entries)
            keep = rng.randint(0, len(node.dir_log)) if mode == "random_blocks" else 0
            for name, target in node.dir_log[:keep]:
                if target is None:
                    entries.pop(name, None)
                else:
                    entries[name] = target
            if entries != node.entries:
                for name in sorted(set(entries) | set(node.entries)):
                    if entries.get(name) != node.entries.get(name):
                        report.entries_reverted.append(os.path.join(rel, name))
        tree = _Tree(ident, {})
        for name, target in entries.items():
            child = self._nodes[target]
            sub = os.path.join(rel, name) if rel else name
            tree.entries[name] = (
                self._surviving_tree(target, mode, rng, report, sub) if child.is_dir else target
            )
        return tree

    def _reachable(self, tree: _Tree) -> Iterator[int]:
        yield tree.ident
        for value in tree.entries.values():
            if isinstance(value, _Tree):
                yield from self._reachable(value)
            else:
                yield value

    def _mix_blocks(self, node: _Node, rng: random.Random) -> bytes:
        old, new = node.durable, bytes(node.data)
        if old == new:
            return old
        size = rng.choice([len(old), len(new)])
        bs = self.block_size
        out = bytearray()
        for start in range(0, size, bs):
            a = old[start : start + bs].ljust(min(bs, size - start), b"\0")
            b = new[start : start + bs].ljust(min(bs, size - start), b"\0")
            out += (a if a == b or rng.random() < 0.5 else b)[: size - start]
        return bytes(out)

    def _torn_targets(self) -> dict[int, _Write]:
        """Per file with unsynced contents, its last unsynced write."""
        return {
            i: w for i, w in self._last_write.items() if bytes(self._nodes[i].data) != self._nodes[i].durable
        }

    def _tear(self, w: _Write, mode: str, rng: random.Random) -> bytes:
        out = bytearray(w.before)
        if len(out) < w.offset:
            out.extend(bytes(w.offset - len(out)))
        cut = rng.randrange(0, len(w.data)) if w.data else 0
        rest = len(w.data) - cut
        filler = bytes(rest) if mode == "torn_zeros" else rng.randbytes(rest)
        out[w.offset : w.offset + len(w.data)] = w.data[:cut] + filler
        return bytes(out)

    def _materialize(self, tree: _Tree, contents: dict[int, bytes], report: PowerLossReport) -> None:
        before: dict[str, bytes] = {}
        for rel, node in self._walk(current=True):
            if rel and not node.is_dir:
                before[rel] = bytes(node.data)
        for name in os.listdir(self.root):
            full = os.path.join(self.root, name)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)

        def build(path: str, sub: _Tree, rel: str) -> None:
            for name, value in sorted(sub.entries.items()):
                full = os.path.join(path, name)
                rel_name = os.path.join(rel, name) if rel else name
                if isinstance(value, _Tree):
                    os.mkdir(full)
                    build(full, value, rel_name)
                else:
                    data = contents[value]
                    with open(full, "wb") as f:
                        f.write(data)
                    if before.get(rel_name) != data:
                        report.files_changed.append(rel_name)

        build(self.root, tree, "")


# -- helpers over a whole log -----------------------------------------------------------------------------


def crash_and_reopen(
    log: Log,
    mode: PowerLossMode = "drop_unsynced",
    *,
    rng: random.Random | None = None,
    clock: Clock | None = None,
) -> Log:
    """Power-cut the process that has ``log`` open (the active layer must be a :class:`FaultyFileSystem`
    rooted at ``log.path``) and open the log again, which runs recovery. ``log`` must not be used again."""
    layer = fs.FS
    if not isinstance(layer, FaultyFileSystem) or layer.root != os.path.abspath(log.path):
        raise TypeError("crash_and_reopen needs fs.install(FaultyFileSystem(log.path)) around the log")
    layer.power_loss(mode, rng)
    return open_log(log.path, clock=clock if clock is not None else log.clock, **log.defaults.to_dict())


def corrupt_segment(path: str, rng: random.Random, *, start: int = 0) -> tuple[int, int]:
    """Flip one random bit of the file at ``path`` at or after byte ``start`` (as a failing disk would);
    returns ``(position, bit)``. Written around the file-system layer on purpose."""
    size = os.path.getsize(path)
    if size <= start:
        raise ValueError(f"{path} has no byte at or after {start}")
    position = rng.randrange(start, size)
    bit = rng.randrange(8)
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ (1 << bit)]))
    return position, bit


class InvariantViolation(AssertionError):
    """One or more invariants do not hold; ``problems`` lists them (each names its invariant)."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class LogState:
    """The visible contents of a log: per partition its start and end offsets and its records."""

    partitions: dict[PartitionKey, tuple[int, int, tuple[Record, ...]]]


def log_state(log: Log) -> LogState:
    """Every partition of every topic, read through the public API (checks CRCs)."""
    out: dict[PartitionKey, tuple[int, int, tuple[Record, ...]]] = {}
    for name in log.topics():
        topic = log.topic(name)
        for p in range(topic.num_partitions):
            plog = topic.partition(p)
            recs = tuple(r for b in plog.batches() for _, r in batch_records(b))
            out[(name, p)] = (plog.log_start_offset, plog.log_end_offset, recs)
    return LogState(out)


def _check_partition(
    key: PartitionKey,
    plog: PartitionLog,
    durable: Sequence[Record],
    histories: Sequence[Sequence[Record]],
    max_start: int,
    problems: list[str],
) -> None:
    where = f"{key[0]}-{key[1]}"
    start, end = plog.log_start_offset, plog.log_end_offset
    observed: list[tuple[int, Record]] = []
    batches: list[DecodedBatch] = []
    try:
        for batch in plog.batches():
            batches.append(batch)
            observed.extend(batch_records(batch))
    except (CorruptRecordError, UnsupportedFormatError) as exc:
        problems.append(f"{where}: I3 read failed its checks: {exc}")
        return
    offsets = [o for o, _ in observed]
    if offsets != list(range(start, end)):
        gaps = sorted(set(range(start, end)) - set(offsets))[:5]
        problems.append(
            f"{where}: I4 offsets are not exactly [{start}, {end}): {len(offsets)} records, missing {gaps}, "
            f"first {offsets[:3]} last {offsets[-3:]}"
        )
        return
    recs = [r for _, r in observed]
    known = {r for h in histories for r in h}
    unknown = [o for o, r in observed if r not in known]
    if unknown:
        problems.append(f"{where}: I3 records never sent at offsets {unknown[:5]}")
    if not any(end <= len(h) and list(h[start:end]) == recs for h in histories):
        main = histories[0] if histories else []
        diff = next((o for o, r in observed if o >= len(main) or main[o] != r), end)
        problems.append(
            f"{where}: I4/I5 contents [{start}, {end}) are not a prefix of any attempted history "
            f"(first difference from the main history at offset {diff}; {len(histories)} histories, "
            f"main has {len(main)} records)"
        )
    counts = Counter(recs)
    history_counts = Counter(histories[0]) if histories else Counter()
    dups = [r for r, n in counts.items() if n > max(1, history_counts[r])]
    if dups:
        problems.append(f"{where}: I5 {len(dups)} records appear at more than one offset")
    if start > max_start:
        problems.append(
            f"{where}: I1 log start {start} is above the highest retention could reach ({max_start})"
        )
    for o in range(max(start, 0), len(durable)):
        if o >= end:
            problems.append(f"{where}: I1 durable offsets [{o}, {len(durable)}) lost (log end {end})")
            break
        if recs[o - start] != durable[o]:
            problems.append(f"{where}: I1 durable record at offset {o} differs")
            break
    for o in range(start, end):
        try:
            got = plog.read(o, max_bytes=1)
        except (CorruptRecordError, UnsupportedFormatError) as exc:
            problems.append(f"{where}: I3 read({o}) failed: {exc}")
            break
        if not got or not got[0].header.base_offset <= o <= got[0].header.last_offset:
            problems.append(f"{where}: I6 read({o}) returned a batch not holding it")
            break
        if dict(batch_records(got[0]))[o] != recs[o - start]:
            problems.append(f"{where}: I6 read({o}) disagrees with a scan")
            break
    times = sorted({r[3] for r in recs} | {r[3] + 1 for r in recs} | {0})
    for t in times:
        want = next(((o, r[3]) for o, r in observed if r[3] >= t), None)
        got_t = plog.offset_for_time(t)
        if got_t != want:
            problems.append(f"{where}: I6 offset_for_time({t}) = {got_t}, scan says {want}")
            break
    for line in plog.verify():
        problems.append(f"{where}: I6 verify: {line}")


def _leftovers(root: str, topics: Collection[PartitionKey]) -> list[str]:
    names = {f"{t}-{p}" for t, p in topics}
    out = []
    for entry in os.listdir(root):
        full = os.path.join(root, entry)
        if os.path.isdir(full):
            if entry not in names:
                out.append(entry)
                continue
            for name in os.listdir(full):
                parsed = files.parse_segment_name(name)
                if name.endswith(".tmp") or (parsed is not None and parsed[2]):
                    out.append(os.path.join(entry, name))
        elif entry.endswith((".tmp", ".deleted")):
            out.append(entry)
    return out


def check_open_log(
    log: Log,
    acked_records: Mapping[PartitionKey, Sequence[Record]],
    durable_records: Mapping[PartitionKey, Sequence[Record]],
    *,
    attempted: Mapping[PartitionKey, Sequence[Sequence[Record]]] | None = None,
    max_log_start: Mapping[PartitionKey, int] | None = None,
    optional_topics: Collection[str] = (),
) -> list[str]:
    """Check I1, I3, I4, I5 and I6 on an open log (arguments as for :func:`check_invariants`); returns the
    problems found, one line each. Reads only, so it may run between the rules of a state machine."""
    problems: list[str] = []
    expected_topics = {t for t, _ in acked_records}
    present = set(log.topics())
    for name in sorted(present - expected_topics):
        problems.append(f"{name}: topic exists but was never created (or its deletion was undone)")
    for name in sorted(expected_topics - present - set(optional_topics)):
        problems.append(f"{name}: topic is missing")
    for key in sorted(acked_records):
        if key[0] not in present:
            continue
        histories = (attempted or {}).get(key) or [acked_records[key]]
        _check_partition(
            key,
            log.topic(key[0]).partition(key[1]),
            durable_records.get(key, []),
            histories,
            (max_log_start or {}).get(key, 0),
            problems,
        )
    return problems


def check_invariants(
    log_dir: str,
    acked_records: Mapping[PartitionKey, Sequence[Record]],
    durable_records: Mapping[PartitionKey, Sequence[Record]],
    *,
    attempted: Mapping[PartitionKey, Sequence[Sequence[Record]]] | None = None,
    max_log_start: Mapping[PartitionKey, int] | None = None,
    optional_topics: Collection[str] = (),
    clock: Clock | None = None,
    reopen: bool = True,
) -> LogState:
    """Open the log at ``log_dir`` (running recovery) and check I1, I3, I4, I5, I6 and, with ``reopen``, I8.

    ``acked_records`` and ``durable_records`` give per partition the records acknowledged by append and by
    flush, in offset order from 0 (``durable_records`` must be a prefix of ``acked_records``).
    ``attempted`` lists per partition the histories the log may legitimately show a prefix of (default:
    just the acknowledged records); ``max_log_start`` how far retention may have moved the log start
    (default 0). Topics of the log must be the topics named in ``acked_records``; those in
    ``optional_topics`` may be missing. Partition directories of no topic and temporary files must be gone.

    I8: after the checks, the power fails right after recovery (unsynced changes dropped) and the log is
    opened again; it must show exactly the same state. Returns the state. Raises :class:`InvariantViolation`.
    """
    layer = FaultyFileSystem(log_dir, real_sync=False)
    problems: list[str] = []
    try:
        with fs.install(layer):
            log = open_log(log_dir, clock=clock)
            state = log_state(log)
            problems = check_open_log(
                log,
                acked_records,
                durable_records,
                attempted=attempted,
                max_log_start=max_log_start,
                optional_topics=optional_topics,
            )
            problems.extend(f"{x}: left over after recovery" for x in _leftovers(log_dir, state.partitions))
    except (CorruptRecordError, UnsupportedFormatError, OSError) as exc:
        layer.kill()
        raise InvariantViolation([*problems, f"open or read failed: {type(exc).__name__}: {exc}"]) from exc
    if reopen:
        layer.power_loss("drop_unsynced")
        try:
            with fs.install(layer), open_log(log_dir, clock=clock) as again:
                second = log_state(again)
        except (CorruptRecordError, UnsupportedFormatError, OSError) as exc:
            raise InvariantViolation(
                [*problems, f"I8 second recovery failed: {type(exc).__name__}: {exc}"]
            ) from exc
        if second != state:
            diff = sorted(
                k
                for k in set(state.partitions) | set(second.partitions)
                if state.partitions.get(k) != second.partitions.get(k)
            )
            problems.append(f"I8 state after a second recovery differs for {diff}")
    else:
        log.close()
    if problems:
        raise InvariantViolation(problems)
    return state
