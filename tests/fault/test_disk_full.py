"""Real, kernel-enforced out-of-space conditions.

- A process with RLIMIT_FSIZE (writes past the limit fail with EFBIG once SIGXFSZ is ignored) appends until the
  limit. It gets a typed error and stays alive; nothing it was told was written is lost; the log stays
  consistent; and appends work again once there is room.
- A real full file system (a small tmpfs mounted by the test; skipped unless root may mount): a producer fills
  it and dies without closing. The log opens on the still-full disk (recovery rebuilds indexes it cannot
  write), every acknowledged record is read, pylog makes room (retention, or ``pylog topics delete``), and
  appends work again."""

from __future__ import annotations

import gc
import json
import os
import resource
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import pylog
from pylog.cli import main as cli_main
from pylog.clock import ManualClock
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


# -- a real full file system: a tmpfs mounted with a small size ------------------------------------------------

_DAY_MS = 86_400_000
_START_MS = 1_700_000_000_000


@pytest.fixture
def full_fs(tmp_path: Path) -> Iterator[str]:
    """A 1 MiB tmpfs mounted for the test (root only: skipped where mounting is not permitted)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"mount is not permitted here: {done.stderr.strip()}")
    try:
        yield str(mnt)
    finally:
        gc.collect()  # drop the maps of segment files before unmounting
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], check=True)


def _fill_and_die(path: str, acked_file: str) -> None:
    """Append to three topics until the disk is full, write down what was acknowledged, then die without
    closing (an unclean shutdown: the next open recovers and rebuilds the active segments' indexes)."""
    acked: dict[str, list[str]] = {"keep": [], "old": [], "scratch": []}
    log = pylog.open(path, clock=ManualClock(_START_MS))
    producer = log.producer(value_serializer=None, key_serializer=None)
    failures = 0
    i = 0
    while failures < 3:
        topic = ("keep", "old", "scratch")[i % 3]
        value = f"{topic}-{i:08d}".encode() + b"x" * 300
        try:
            producer.send(topic, value, key=b"k%d" % (i % 7)).get()
            acked[topic].append(value[:17].decode())
        except DiskFullError:
            failures += 1
        i += 1
    with open(acked_file, "w") as f:
        json.dump(acked, f)


def _read_all(log: pylog.Log, topic: str) -> list[tuple[int, int, str]]:
    c = log.consumer(topic, value_deserializer=None, auto_offset_reset="earliest", consumer_timeout_ms=0)
    try:
        return [(r.partition, r.offset, r.value[:17].decode()) for r in c]
    finally:
        c.close()


def _free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@pytest.mark.parametrize("make_room", ["retention", "delete_topic"])
def test_a_log_opens_on_a_full_file_system_and_room_can_be_made_with_pylog(
    full_fs: str, tmp_path: Path, make_room: str
) -> None:
    path = os.path.join(full_fs, "log")
    with pylog.open(path) as log:
        log.create_topic("keep", partitions=2, segment_bytes=64 << 10, index_interval_bytes=1024)
        log.create_topic("old", segment_bytes=64 << 10, retention_ms=_DAY_MS, index_interval_bytes=1024)
        log.create_topic("scratch", segment_bytes=64 << 10, index_interval_bytes=1024)
    acked_file = str(tmp_path / "acked.json")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _fill_and_die(path, acked_file)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the child died: {status}"
    with open(acked_file) as f:
        acked = json.load(f)
    assert all(len(values) > 100 for values in acked.values())
    assert _free_bytes(full_fs) < 4096  # the disk is full: not one page free

    # open the still-full disk: recovery finds the unclean shutdown and rebuilds indexes in memory
    clock = ManualClock(_START_MS + 2 * _DAY_MS)
    log = pylog.open(path, clock=clock)
    try:
        assert not log.clean_start
        for topic, values in acked.items():
            got = _read_all(log, topic)
            assert sorted(v for _, _, v in got) == sorted(values)  # every acknowledged record, nothing else
            for p in {p for p, _, _ in got}:
                offsets = [o for q, o, _ in got if q == p]
                assert offsets == list(range(len(offsets)))
        assert log.verify() == {}

        if make_room == "retention":
            deleted = log.apply_retention()
            assert deleted["old"] > 0 and deleted["keep"] == deleted["scratch"] == 0
            left = [v for _, _, v in _read_all(log, "old")]
            assert left == acked["old"][len(acked["old"]) - len(left) :]  # a suffix of what was written
        else:
            assert cli_main(["topics", "delete", "--dir", path, "scratch"]) == 0
            assert "scratch" not in log.topics()
        assert _free_bytes(full_fs) > 16 << 10

        producer = log.producer(value_serializer=None, key_serializer=None)
        after = [producer.send("keep", b"after-%d" % i, key=b"k%d" % i) for i in range(20)]
        producer.flush()
        assert all(f.get().offset >= 0 for f in after)
        producer.close()
    finally:
        log.close()

    with pylog.open(path) as log:  # and the log is whole and consistent after a clean close
        assert log.clean_start
        assert log.verify() == {}
        got = [v for _, _, v in _read_all(log, "keep")]
        assert sorted(got) == sorted(acked["keep"] + [f"after-{i}" for i in range(20)])
