"""Helpers of the broker tests: a broker started as a process, bounded waits."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

WAIT_S = 60.0  # longest any single wait may take before the test fails


class BrokerProcess:
    """``pylog --dir DIR serve`` in a child process; ``address`` is the line it printed."""

    def __init__(self, directory: Path, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pylog.cli",
                "--dir",
                str(directory),
                "serve",
                "--listen",
                "127.0.0.1:0",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=directory.parent,  # whatever a library of the child writes to its working directory stays there
        )
        assert self.proc.stdout is not None
        self.address = self.proc.stdout.readline().strip()
        if not self.address:
            self.proc.wait(WAIT_S)
            raise AssertionError(
                f"the broker did not start: {self.proc.stderr.read() if self.proc.stderr else ''}"
            )

    def stop(self, sig: int | None = None) -> int:
        if self.proc.poll() is None:
            if sig is None:
                self.proc.terminate()
            else:
                os.kill(self.proc.pid, sig)
        return self.proc.wait(WAIT_S)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(WAIT_S)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def wait_until(predicate: Callable[[], object], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
