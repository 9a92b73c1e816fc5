"""The invariant checks: what a log must show after any sequence of operations, crashes and recoveries.

Invariants checked by :func:`check_invariants`: I1 every record acknowledged after fsync is readable at the
same offset, byte-identical; I3 no read returns a record that fails its CRC or was never sent; I4 each
partition is a prefix of what was attempted (no gaps, no reordering); I5 an offset is never reused for a
different record; I6 offset and time lookups equal a brute-force scan (and :meth:`PartitionLog.verify` finds
nothing); I8 recovering again (after a power cut right after recovery) gives the same state. A violation
raises :class:`InvariantViolation` listing every problem found.

:func:`check_open_log` checks I1 and I3-I6 on a log that is already open (it only reads), for use between
the rules of a state machine; :func:`log_state` captures a log's visible contents as a :class:`LogState`.

:func:`check_invariants` runs recovery under its own :class:`~pylog.testing.faults.FaultyFileSystem`,
installed with :func:`pylog.fs.install`, which is process-wide: call it while no other thread of the process
is using pylog.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from pylog import fs
from pylog.clock import Clock
from pylog.errors import CorruptRecordError, UnsupportedFormatError
from pylog.log import Log, open_log
from pylog.partition import files
from pylog.partition.log import PartitionLog
from pylog.record import DecodedBatch
from pylog.testing.batches import PartitionKey, Record, batch_records
from pylog.testing.faults import FaultyFileSystem

__all__ = ["InvariantViolation", "LogState", "check_invariants", "check_open_log", "log_state"]


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
    names = {files.partition_dir_name(t, p) for t, p in topics}
    out = []
    for entry in os.listdir(root):
        full = os.path.join(root, entry)
        if os.path.isdir(full):
            if entry not in names:
                out.append(entry)
                continue
            for name in os.listdir(full):
                parsed = files.parse_segment_name(name)
                if name.endswith(files.TMP) or (parsed is not None and parsed[2]):
                    out.append(os.path.join(entry, name))
        elif entry.endswith((files.TMP, files.DELETED)):
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
