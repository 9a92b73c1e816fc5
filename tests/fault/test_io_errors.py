"""I/O errors on the k-th call: EIO and ENOSPC, once or until cleared, at every file-system call made by a
workload of appends (some of which roll), flushes and an explicit roll.

For every k: the failing call raises :class:`~pylog.errors.StorageError` (``DiskFullError`` for ENOSPC), the
process carries on, a failed append leaves the log end offset unchanged, a failed flush does not advance the
recovery point, and no fsync error is swallowed. Then either the fault clears and the log must keep working
and reopen cleanly with every acknowledged record (the operating system did not fail: I2), or the power fails
while the fault persists and everything acknowledged by a flush must survive (I1: a failed fsync was not
taken for success).
"""

from __future__ import annotations

import errno
import functools
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import pylog
from pylog import fs
from pylog.errors import DiskFullError, StorageError
from pylog.partition.checkpoint import RecoveryCheckpoint
from pylog.partition.log import PartitionLog
from pylog.testing import (
    Append,
    FaultyFileSystem,
    Flush,
    InvariantViolation,
    ManualClock,
    PowerLossMode,
    Record,
    Roll,
    Step,
    TopicModel,
    apply_step,
    check_invariants,
    merge_expectations,
)

T0 = 1_700_000_000_000
SYNC_OPS = {"fsync", "fdatasync", "fsync_dir"}
POWER_CUTS: tuple[PowerLossMode, ...] = ("drop_unsynced", "random_blocks", "torn_zeros", "torn_junk")


def recs(tag: str, i: int) -> tuple[Record, ...]:
    return tuple((f"{tag}{i}".encode(), f"{tag}-{i}-{j}-".encode() + b"y" * 40, (), T0 + i) for j in range(2))


def workload(tag: str) -> list[Step]:
    """Appends of ~180 bytes into 600-byte segments (the fourth batch of a segment rolls it), flushes, and
    an explicit roll of a segment with room left, so that appends after a failed roll still fit into it."""
    a = [Append(0, recs(tag, i)) for i in range(7)]
    return [a[0], a[1], Flush(0), Roll(0), a[2], a[3], Flush(0), a[4], a[5], a[6], Flush(0)]


@pytest.fixture
def scratch(tmp_path: Any) -> Iterator[str]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else str(tmp_path)
    path = tempfile.mkdtemp(prefix="pylog-io-", dir=base)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _template(base: str) -> tuple[str, TopicModel]:
    template = os.path.join(base, "template")
    model = TopicModel("t", 1)
    with pylog.open(template, clock=ManualClock(T0)) as log:
        log.create_topic("t", segment_bytes=600, index_interval_bytes=128)
        for i in range(2):
            apply_step(log, "t", Append(0, recs("s", i)), model)
    model.mark_all_durable()
    return template, model


def _quiet(fn: Callable[[], int]) -> int:
    """Observe without going through the faulty layer."""
    with fs.install(fs.FileSystem()):
        return fn()


def _recovery_point(plog: PartitionLog) -> int:
    return _quiet(lambda: RecoveryCheckpoint(plog.checkpoint.path).read())


def _end(plog: PartitionLog) -> int:
    return _quiet(lambda: plog.log_end_offset)


def _run_with_fault(
    layer: FaultyFileSystem, model: TopicModel, clock: ManualClock, steps: list[Step], arm: Callable[[], None]
) -> tuple[pylog.Log, list[str]]:
    """Open the log, arm the fault, run ``steps``; returns the open log and the problems seen."""
    problems: list[str] = []
    log = pylog.open(layer.root, clock=clock)
    plog = log.topic("t").partition(0)
    arm()
    for step in steps:
        end, point, flushed = _end(plog), _recovery_point(plog), plog.flushed_offset
        fired_before = layer.errors_injected
        ops_before = len(layer.ops)
        try:
            apply_step(log, "t", step, model)
        except InvariantViolation as exc:
            problems.append(f"{step}: {exc}")
            break
        except StorageError as exc:
            code = getattr(exc, "errno", None)
            if isinstance(exc, DiskFullError) != (code in (errno.ENOSPC, errno.EDQUOT)):
                problems.append(f"{step}: {type(exc).__name__} for errno {code}")
            if layer.errors_injected == fired_before:
                problems.append(f"{step}: StorageError without an injected fault: {exc}")
            if isinstance(step, Append) and _end(plog) != end:
                problems.append(f"{step}: failed append moved the log end {end} -> {_end(plog)}")
            data_sync_failed = any(
                op.name in SYNC_OPS and op.path.endswith(".log") and op.index in layer.failed_ops
                for op in layer.ops[ops_before:]
            )
            if isinstance(step, Flush) and plog.flushed_offset > flushed:
                problems.append(
                    f"{step}: flush raised but flushed_offset moved {flushed} -> {plog.flushed_offset}"
                )
            if data_sync_failed and _recovery_point(plog) > point:
                problems.append(f"{step}: a log fsync failed but the recovery point moved from {point}")
            continue
        swallowed = [
            op for op in layer.ops[ops_before:] if op.name in SYNC_OPS and op.index in layer.failed_ops
        ]
        if swallowed:
            problems.append(
                f"{step}: {swallowed[0].name} of {swallowed[0].path} failed but the step succeeded"
            )
    return log, problems


def _count_calls(template: str, base: str, model0: TopicModel) -> int:
    layer = FaultyFileSystem(os.path.join(base, "count"), copy_from=template, real_sync=False)
    start: list[int] = []
    with fs.install(layer):
        log, problems = _run_with_fault(
            layer, model0.copy(), ManualClock(T0), workload("w"), lambda: start.append(len(layer.ops))
        )
        n = len(layer.ops) - start[0]
        log.close()
    assert not problems
    assert not layer.bypassed(), f"changes made around the file-system layer: {layer.bypassed()}"
    shutil.rmtree(layer.root)
    return n


FAULTS = [
    pytest.param(errno.EIO, False, id="EIO-transient"),
    pytest.param(errno.EIO, True, id="EIO-persistent"),
    pytest.param(errno.ENOSPC, False, id="ENOSPC-transient"),
    pytest.param(errno.ENOSPC, True, id="ENOSPC-persistent"),
]


@pytest.mark.parametrize(("code", "persistent"), FAULTS)
def test_error_on_every_call_then_recover(code: int, persistent: bool, scratch: str) -> None:
    """The fault clears; the log keeps working, closes, and reopens cleanly with every acknowledged record."""
    template, model0 = _template(scratch)
    n = _count_calls(template, scratch, model0)
    failures: list[str] = []
    raised = 0
    for k in range(n):
        model, clock = model0.copy(), ManualClock(T0)
        layer = FaultyFileSystem(os.path.join(scratch, "work"), copy_from=template, real_sync=False)
        with fs.install(layer):
            log, problems = _run_with_fault(
                layer,
                model,
                clock,
                workload("w"),
                functools.partial(layer.inject_error, k, code, persistent=persistent),
            )
            raised += layer.errors_injected > 0
            layer.clear_faults()
            try:
                for step in [Append(0, recs("after", 0)), Flush(0), Roll(0), Append(0, recs("after", 1))]:
                    apply_step(log, "t", step, model)
                log.close()
            except Exception as exc:
                problems.append(f"after the fault cleared: {type(exc).__name__}: {exc}")
        model.mark_all_durable()
        if not problems:
            try:
                with pylog.open(layer.root, clock=clock) as again:
                    again.topic("t").partition(0)  # validated at first use after a clean shutdown
                    report = again.recovery.get("t-0")
                    if report is None or not report.clean_shutdown or report.bytes_truncated:
                        problems.append(f"reopen after a clean close was not clean: {report}")
                check_invariants(
                    layer.root, **merge_expectations([model], durable_is_acked=True), clock=clock
                )
            except Exception as exc:
                problems.append(f"reopen: {type(exc).__name__}: {exc}")
        if problems:
            op = layer.ops[layer.first_failed] if layer.first_failed is not None else None
            failures.append(f"k={k} (first failed call: {op}): " + "; ".join(problems))
    print(
        f"\n{errno.errorcode[code]} {'persistent' if persistent else 'transient'}: {n} calls failed in turn"
    )
    assert raised == n, "every armed fault must fire"
    assert not failures, f"{len(failures)} of {n} failed:\n" + "\n".join(failures[:10])


@pytest.mark.parametrize(("code", "persistent"), FAULTS)
def test_error_on_every_call_then_power_loss(code: int, persistent: bool, scratch: str) -> None:
    """The power fails while the fault is still there (damage modes in turn: unsynced data dropped, random
    unsynced blocks dropped, torn last writes): what flush acknowledged survives, what is there is a prefix
    of what was appended, and recovery never meets corruption below a recovery point that ran ahead of the
    fsynced data."""
    template, model0 = _template(scratch)
    n = _count_calls(template, scratch, model0)
    failures: list[str] = []
    for k in range(n):
        model, clock = model0.copy(), ManualClock(T0)
        layer = FaultyFileSystem(os.path.join(scratch, "work"), copy_from=template, real_sync=False)
        with fs.install(layer):
            _, problems = _run_with_fault(
                layer,
                model,
                clock,
                workload("w"),
                functools.partial(layer.inject_error, k, code, persistent=persistent),
            )
        layer.power_loss(POWER_CUTS[k % len(POWER_CUTS)], random.Random(k))
        try:
            check_invariants(layer.root, **merge_expectations([model]), clock=clock)
        except Exception as exc:
            problems.append(f"after power loss: {type(exc).__name__}: {exc}")
        if problems:
            failures.append(f"k={k}: " + "; ".join(problems))
    print(f"\n{errno.errorcode[code]} {'persistent' if persistent else 'transient'} + power loss: {n} calls")
    assert not failures, f"{len(failures)} of {n} failed:\n" + "\n".join(failures[:10])
