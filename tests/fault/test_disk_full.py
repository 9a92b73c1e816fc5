"""A real, kernel-enforced out-of-space condition: a process with RLIMIT_FSIZE (writes past the limit fail
with EFBIG once SIGXFSZ is ignored) appends until the limit. It gets a typed error and stays alive; nothing it
was told was written is lost; the log stays consistent; and appends work again once there is room."""

from __future__ import annotations

import os
import resource
import signal

import pylog
from pylog.errors import DiskFullError


def _fill_until_full(path: str, fd: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
    acked = 0
    errors = 0
    with pylog.open(path) as log:
        producer = log.producer(value_serializer=None)
        for i in range(20_000):
            try:
                producer.send("t", b"%08d" % i + b"x" * 200, key=b"k").get()
                acked = i + 1
            except DiskFullError:
                errors += 1
                if errors >= 5:  # repeated attempts keep failing cleanly
                    break
        os.write(fd, b"%d %d\n" % (acked, errors))
        try:
            producer.close()
        except DiskFullError:
            pass


def test_a_full_disk_is_a_typed_error_and_loses_nothing(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "log")
    with pylog.open(path) as log:
        log.create_topic("t", segment_bytes=1 << 20)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 1
        try:
            _fill_until_full(path, w)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    report = os.read(r, 100).split()
    os.close(r)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the child died: {status}"
    acked, errors = int(report[0]), int(report[1])
    assert errors == 5 and 100 < acked < 20_000
    with pylog.open(path) as log:
        assert log.verify() == {}
        c = log.consumer("t", value_deserializer=None, auto_offset_reset="earliest", consumer_timeout_ms=0)
        values = [r.value for r in c]
        assert [int(v[:8]) for v in values[:acked]] == list(
            range(acked)
        )  # every acknowledged record, in order
        assert len(values) == acked  # and nothing half-written
        producer = log.producer(value_serializer=None)
        assert producer.send("t", b"after", key=b"k").get().offset == acked  # room again: appends work
        producer.close()
