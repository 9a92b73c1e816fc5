"""A writer process dies at any point of its appends and rolls while another process keeps the log open and
goes on writing: nothing is recovered (the log is never closed by everyone), so what the dead writer left in
the files must never disagree with what the survivor writes next.

The dying writer is killed (``os._exit``, as SIGKILL would: no ``finally`` block runs) before its k-th file
system call, for every k of its workload. Its batches carry later timestamps than the survivor's, so an
index entry it wrote for a batch it never published differs from the one the survivor derives for the batch
that takes that position. After the survivor's appends (and a roll), ``verify()`` must find every index equal
to what a scan of the log derives, and ``offsets_for_times`` must agree with a brute-force search.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

import pylog
from pylog import fs
from pylog.record import encode_batch

# every second batch gets an index entry (a batch is 116 bytes) and a segment holds 80 batches: after the
# survivor's 62 batches (31 entries) the dying writer's second or third append writes a group of 32 index
# entries; in the "roll" workload it then rolls the segment (writing the final time entry) before it is full
CONFIG = {"index_interval_bytes": 200, "segment_bytes": 80 * 116}
SURVIVOR_TS, DYING_TS = 1_000, 9_000
CLOCK_MS = 10_000  # both processes' clock: no segment is rolled for its age


class _DiesAt(fs.FileSystem):
    """Exits the process before its ``k``-th call, as a kill at that point would leave things."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.calls = 0

    def __getattribute__(self, name: str) -> Any:
        attr = object.__getattribute__(self, name)
        if name.startswith("_") or name in ("k", "calls") or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.calls >= self.k:
                os._exit(9)
            self.calls += 1
            return attr(*args, **kwargs)

        return call


def _batch(i: int, ts: int) -> bytes:
    return encode_batch(0, [b"k%d" % i], [b"v" * 40], [ts])


def _dying_writer(path: str, k: int, go_r: int, roll: bool) -> None:
    os.read(go_r, 1)  # the survivor has the log open
    with pylog.open(path, clock=pylog.ManualClock(CLOCK_MS)) as log:
        plog = log.topic("t").partition(0)
        fs.FS = _DiesAt(k)
        for i in range(4):  # the last one gets no index entry: the roll adds a final time entry for it
            plog.append(_batch(i, DYING_TS + i))
        if roll:
            plog.roll()
            plog.append(_batch(5, DYING_TS + 5))
        os._exit(0)  # survived its whole workload: leave as a kill would


def _run(path: str, k: int, roll: bool) -> tuple[bool, list[str], list[tuple[int, int | None, int | None]]]:
    with pylog.open(path, clock=pylog.ManualClock(CLOCK_MS)) as log:
        log.create_topic("t", **CONFIG)
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            _dying_writer(path, k, go_r, roll)
        finally:
            os._exit(1)
    with pylog.open(path, clock=pylog.ManualClock(CLOCK_MS)) as log:
        plog = log.topic("t").partition(0)
        for i in range(62):
            plog.append(_batch(i, SURVIVOR_TS))
        os.write(go_w, b"x")
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) in (0, 9), status
        finished = os.WEXITSTATUS(status) == 0
        problems = plog.verify()  # as the dead writer left it
        # no later timestamp: no time-index entry of the survivor's own covers a slot the dead writer wrote
        for i in range(4):
            plog.append(_batch(i, SURVIVOR_TS))
        problems += plog.verify()  # the dead writer's segment still active
        for i in range(90):
            plog.append(_batch(i, SURVIVOR_TS))
        problems += plog.verify()  # and sealed by the survivor
        consumer = log.consumer(
            "t", value_deserializer=None, auto_offset_reset="earliest", consumer_timeout_ms=0
        )
        stamps = [(r.offset, r.timestamp) for r in consumer]
        checks = []
        for target in sorted({ts for _, ts in stamps} | {0, SURVIVOR_TS + 1, DYING_TS + 30, 10**9}):
            want = next((off for off, ts in stamps if ts >= target), None)
            got = plog.offset_for_time(target)
            checks.append((target, want, None if got is None else got[0]))
    return finished, problems, checks


@pytest.mark.parametrize("roll", [False, True], ids=["appends", "roll"])
def test_writer_killed_at_every_call_while_another_process_writes(
    tmp_path: os.PathLike[str], roll: bool
) -> None:
    k, failures = 0, list[tuple[int, object]]()
    while True:
        path = os.path.join(tmp_path, f"log-{k}")
        finished, problems, checks = _run(path, k, roll)
        if problems:
            failures.append((k, problems))
        bad = [(target, want, got) for target, want, got in checks if want != got]
        if bad:
            failures.append((k, bad))
        if finished:
            break
        k += 1
    assert k > (25 if roll else 8), f"the dying writer's workload made only {k} file system calls"
    assert not failures, failures[:5]


@pytest.fixture(autouse=True)
def _restore_fs() -> Any:
    saved = fs.FS
    yield
    fs.FS = saved
