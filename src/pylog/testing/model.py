"""The reference model of a topic, and the workload steps that drive both a log and the model.

- Steps (:class:`Append`, :class:`Flush`, :class:`Roll`, :class:`AdvanceClock`, :class:`ApplyRetention`,
  :class:`TruncateTo`; their union is :data:`Step`) are frozen values; :func:`apply_step` runs one on a
  log and tells the model what was attempted and what the log answered.
- :class:`TopicModel` does not predict segment layouts; it tracks what the log has promised (records
  acknowledged by ``append``, made durable by ``flush``, possibly removed by retention or truncation), from
  which :func:`merge_expectations` builds the arguments of
  :func:`~pylog.testing.invariants.check_invariants`. An answer of the log that contradicts the model
  (an append landing at other offsets, a flush or truncation ending elsewhere) raises
  :class:`~pylog.testing.invariants.InvariantViolation` at once.

A :class:`TopicModel` has no lock: drive it (and :func:`apply_step` with it) from one thread at a time.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from pylog.clock import ManualClock
from pylog.config import TopicConfig
from pylog.errors import PylogError
from pylog.log import Log
from pylog.partition.log import AppendInfo
from pylog.testing.batches import PartitionKey, Record, batch_records, encode_records
from pylog.testing.invariants import InvariantViolation

__all__ = [
    "AdvanceClock",
    "Append",
    "ApplyRetention",
    "Flush",
    "Roll",
    "Step",
    "TopicModel",
    "TruncateTo",
    "apply_step",
    "merge_expectations",
]

# -- workload steps ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Append:
    """Append ``records`` as one batch to ``partition`` (acks=1: written to the operating system)."""

    partition: int
    records: tuple[Record, ...]


@dataclass(frozen=True)
class Flush:
    """fsync ``partition`` (acks=all for everything appended before). ``ack``: the flush an acks="all"
    acknowledgement runs (``flush(up_to=log end)``), which may leave the index files and the recovery point
    behind; the records are durable either way."""

    partition: int
    ack: bool = False


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
        model.end_flush(step.partition, plog.flush(up_to=plog.log_end_offset) if step.ack else plog.flush())
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
