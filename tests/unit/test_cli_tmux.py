"""``pylog consume --follow`` in a real terminal (tmux): it prints records as they are produced and exits
cleanly on Ctrl-C."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid

import pytest

import pylog

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def _wait_for(session: str, text: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = _tmux("capture-pane", "-p", "-t", session)
        if text in screen:
            return screen
        time.sleep(0.1)
    raise AssertionError(f"{text!r} never appeared; the pane shows:\n{screen}")


def test_consume_follow_prints_new_records_and_stops_on_ctrl_c(log_dir: str) -> None:
    with pylog.open(log_dir) as log:
        log.create_topic("t", partitions=2)
    session = f"pylog-{uuid.uuid4().hex[:8]}"
    status = os.path.join(os.path.dirname(log_dir), "status")
    # The pane's shell has the tmux server's environment, not this one's: name the pylog under test. The
    # consumer reads from the beginning, so records produced before it has started are shown all the same.
    src = os.path.dirname(os.path.dirname(pylog.__file__))
    command = (
        f"env PYTHONPATH={shlex.quote(src)} {shlex.quote(sys.executable)} -m pylog.cli "
        f"--dir {shlex.quote(log_dir)} consume t --from-beginning --follow --value-format text; "
        f"echo $? > {shlex.quote(status)}; echo EXITED; sleep 60"
    )
    _tmux("new-session", "-d", "-s", session, "-x", "200", "-y", "50", command)
    try:
        with pylog.open(log_dir) as log:
            producer = log.producer(value_serializer=None)
            for word in ("alpha", "beta", "gamma"):
                producer.send("t", word.encode(), key=word.encode()).get()
            producer.close()
        screen = _wait_for(session, "gamma")
        assert "alpha" in screen and "beta" in screen
        with pylog.open(log_dir) as log:
            log.producer(value_serializer=None).send("t", b"delta").get()
        _wait_for(session, "delta")
        _tmux("send-keys", "-t", session, "C-c")
        screen = _wait_for(session, "EXITED")
        assert "Traceback" not in screen
        with open(status) as f:
            assert f.read().strip() in ("0", "130")  # 130: interrupted, as kafka-console-consumer
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
