"""``pylog consume`` stopped by SIGINT (Ctrl-C) or SIGTERM, run for real in a subprocess: it exits 130 or 143
(as operations.md says), and with ``--group`` the group's committed offset is that of the records it printed,
never more.
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import subprocess
import sys
import termios
import time
from typing import Any

import pytest

import pylog
from pylog.structs import TopicPartition

TP = TopicPartition("t", 0)
PIPE_FULL = 60_000  # bytes waiting in the pipe when the writer is blocked (a Linux pipe holds 64 KiB)


def _fill(root: str, n: int, size: int) -> None:
    with pylog.open(root) as log:
        log.create_topic("t")
        producer = log.producer(acks=1, value_serializer=None)
        for i in range(n):
            producer.send("t", b"%06d " % i + b"x" * size, partition=0)
        producer.close()


def _start(root: str, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYLOG_DIR": root}
    env.pop("PYLOG_DEBUG", None)
    return subprocess.Popen(
        [sys.executable, "-m", "pylog.cli", "consume", "t", "--from-beginning", "--group", "g", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


def _committed(root: str) -> int | None:
    with pylog.open(root) as log:
        found = log.group_offsets("g").get(TP)
    return None if found is None else int(found.offset)


def _check_lines(out: bytes) -> int:
    """The number of complete lines printed, each checked to be the next record."""
    lines = out.split(b"\n")[:-1]
    for i, line in enumerate(lines):
        assert line.startswith(b"%06d " % i), (i, line[:20])
    return len(lines)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_follow_stopped_by_a_signal_exits_128_plus_its_number_and_commits_what_it_printed(
    tmp_path: Any, signum: int
) -> None:
    root = str(tmp_path / "log")
    _fill(root, 50, 10)
    proc = _start(root, "--follow")
    assert proc.stdout is not None
    printed = [proc.stdout.readline() for _ in range(50)]  # it printed everything and now waits for more
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    assert _check_lines(b"".join(printed) + out) == 50
    name = signal.Signals(signum).name
    assert err.decode().startswith(f"pylog: error: interrupted by {name} after 50 records"), err
    assert b"Traceback" not in err
    assert _committed(root) == 50


def test_a_signal_while_the_output_is_blocked_commits_only_records_printed(tmp_path: Any) -> None:
    """The reader of the output stops reading: the command blocks writing its output. The first Ctrl-C is
    noted, the second stops the write; what the group commits is at most what reached the output."""
    root = str(tmp_path / "log")
    _fill(root, 5_000, 100)
    proc = _start(root, "--follow")
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + 120
    while struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0] < PIPE_FULL:
        assert time.monotonic() < deadline and proc.poll() is None, "the output never filled the pipe"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)  # reading lets the interrupted command finish its output
    assert proc.returncode == 130, err
    printed = _check_lines(out)
    committed = _committed(root)
    assert committed is not None and committed <= printed < 5_000
    assert printed - committed <= 500  # at most the poll being printed is given back
    assert b"Traceback" not in err
