"""The partition doorbell: a poll waiting in one process returns when another process appends (proved with the
bounded wait made longer than the test, so only a ring can end it), a SIGKILLed waiter leaves nothing stuck,
a state file of the size before the doorbell is extended without losing its fields, and a consumer on a manual
clock never waits on the doorbell at all."""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Callable

import pytest

import pylog
from pylog.partition import doorbell
from pylog.partition import state as state_module
from pylog.partition.files import STATE
from pylog.partition.state import PartitionState, Snapshot
from pylog.structs import TopicPartition

pytestmark = pytest.mark.skipif(not doorbell.available(), reason="the futex doorbell needs Linux")

_GIVE_UP_S = 60  # only a broken doorbell gets near this; the test fails then instead of hanging


def _state_path(log_dir: str, topic: str, partition: int) -> str:
    with pylog.open(log_dir) as log:
        return os.path.join(log.topic(topic).partition(partition).directory, STATE)


def _waiting_flag(path: str) -> int:
    with open(path, "rb") as f:
        return f.read()[doorbell.WAITING_AT]


def _child(run: Callable[[int], None]) -> tuple[int, int]:
    """Fork a child running ``run(write_fd)``; returns (pid, read end of its pipe)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.close(r)
            run(w)
            code = 0
        except BaseException as exc:
            os.write(w, f"error {exc!r}\n".encode())
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def _read_line(fd: int, pid: int) -> str:
    """The child's next line; a child silent for _GIVE_UP_S is killed and the test fails (never hangs)."""
    data = b""
    deadline = time.monotonic() + _GIVE_UP_S
    while not data.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(
                f"no answer from the child process (got {data!r}): the doorbell did not ring"
            )
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode()


def _reap(pid: int) -> int:
    deadline = time.monotonic() + _GIVE_UP_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("the waiting process never returned: the doorbell did not ring")


def _poll_in_child(log_dir: str, topic: str) -> Callable[[int], None]:
    def run(w: int) -> None:
        doorbell.MAX_WAIT_S = 3600.0  # only a ring (or a signal) can end a wait now
        with pylog.open(log_dir) as log:
            consumer = log.consumer(topic, auto_offset_reset="latest", value_deserializer=None)
            assert consumer.poll(timeout_ms=0) == {}  # positions set: at the end
            os.write(w, b"polling\n")
            got = consumer.poll(timeout_ms=3_600_000)
            values = sorted(r.value.decode() for records in got.values() for r in records)
            os.write(w, f"got {','.join(values)}\n".encode())
            consumer.close()

    return run


def _wait_until_armed(paths: list[str]) -> None:
    deadline = time.monotonic() + _GIVE_UP_S
    while not any(_waiting_flag(p) for p in paths):
        if time.monotonic() > deadline:
            raise AssertionError("the child never started waiting")
        time.sleep(0.005)


@pytest.mark.parametrize("partitions", [1, 3])
def test_a_waiting_poll_returns_when_another_process_appends(log_dir: str, partitions: int) -> None:
    with pylog.open(log_dir) as log:
        log.create_topic("t", partitions=partitions)
    paths = [_state_path(log_dir, "t", p) for p in range(partitions)]
    pid, r = _child(_poll_in_child(log_dir, "t"))
    assert _read_line(r, pid) == "polling\n"
    _wait_until_armed(paths)
    with pylog.open(log_dir) as log:
        producer = log.producer(acks=1, value_serializer=None)
        producer.send("t", b"hello", partition=partitions - 1).get()
        producer.close()
    assert _read_line(r, pid) == "got hello\n"
    assert _reap(pid) == 0
    os.close(r)
    assert [_waiting_flag(p) for p in paths][partitions - 1] == 0  # the ring cleared it


def test_a_sigkilled_waiter_leaves_nothing_stuck(log_dir: str) -> None:
    with pylog.open(log_dir) as log:
        log.create_topic("t")
    path = _state_path(log_dir, "t", 0)
    pid, r = _child(_poll_in_child(log_dir, "t"))
    assert _read_line(r, pid) == "polling\n"
    _wait_until_armed([path])
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(r)
    assert _waiting_flag(path) == 1  # left behind by the dead waiter
    with pylog.open(log_dir) as log:
        producer = log.producer(acks=1, value_serializer=None)
        producer.send("t", b"one").get()  # rings for nobody, and clears the flag
        assert _waiting_flag(path) == 0
        producer.send("t", b"two").get()
        producer.close()
    # a new waiter is woken as usual
    pid, r = _child(_poll_in_child(log_dir, "t"))
    assert _read_line(r, pid) == "polling\n"
    _wait_until_armed([path])
    with pylog.open(log_dir) as log:
        producer = log.producer(acks=1, value_serializer=None)
        producer.send("t", b"three").get()
        producer.close()
    assert _read_line(r, pid) == "got three\n"
    assert _reap(pid) == 0
    os.close(r)


def test_a_state_file_from_before_the_doorbell_is_extended_and_keeps_its_fields(
    tmp_path: os.PathLike[str],
) -> None:
    path = os.path.join(os.fspath(tmp_path), STATE)
    state = PartitionState(path)
    snap = Snapshot(17, 10, 4096, 3, 1_700_000_000_123)
    state.publish(snap)
    state.close()
    with open(path, "r+b") as f:
        head = f.read(64)
        f.truncate(64)  # the old size
    assert os.path.getsize(path) == 64
    bell = doorbell.Doorbell(path)  # a reader opening it first
    assert os.path.getsize(path) == doorbell.MAPPED
    state = PartitionState(path)
    assert state.read() == snap
    with open(path, "rb") as f:
        assert f.read(64) == head
    mark = bell.mark()
    state.publish(snap._replace(log_end_offset=18))
    assert bell.mark() != mark
    state.close()
    bell.close()


def test_the_writer_rings_only_when_someone_waits(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the pure-Python publish, whose FUTEX_WAKE goes through doorbell._LIBC (counted here); the compiled one
    # rings in C: test_the_compiled_publish_rings_only_when_someone_waits
    monkeypatch.setattr(state_module, "_publish", None)
    path = os.path.join(os.fspath(tmp_path), STATE)
    state = PartitionState(path)
    bell = doorbell.Doorbell(path)
    rings: list[int] = []
    fn = doorbell._LIBC
    assert fn is not None

    def counting(*args: object) -> int:
        rings.append(1)
        return 0

    doorbell._LIBC = (counting, fn[1], fn[2])
    try:
        state.publish(Snapshot(1, 0, 64, 0, -1))
        assert rings == []
        bell.arm()
        state.publish(Snapshot(2, 0, 128, 0, -1))
        assert rings == [1]
        assert _waiting_flag(path) == 0
        state.publish(Snapshot(3, 0, 192, 0, -1))
        assert rings == [1]
    finally:
        doorbell._LIBC = fn
        state.close()
        bell.close()


@pytest.mark.skipif(state_module._publish is None, reason="the compiled extension is not in use")
def test_the_compiled_publish_rings_only_when_someone_waits(tmp_path: os.PathLike[str]) -> None:
    """The compiled publish clears ``waiting`` (and wakes, in the same branch) only when a reader set it."""
    path = os.path.join(os.fspath(tmp_path), STATE)
    state = PartitionState(path)
    bell = doorbell.Doorbell(path)
    try:
        assert state.publish_values(1, 0, 64, 0, -1) == state.seq == 2
        assert _waiting_flag(path) == 0
        bell.arm()
        assert _waiting_flag(path) == 1
        state.publish(Snapshot(2, 0, 128, 0, -1))
        assert _waiting_flag(path) == 0
        assert state.read() == Snapshot(2, 0, 128, 0, -1)
    finally:
        state.close()
        bell.close()


def test_a_wait_returns_at_once_when_the_mark_is_stale(tmp_path: os.PathLike[str]) -> None:
    """The kernel compares the futex word with the mark: a publish after the mark was read is never slept
    through (the wait would otherwise last the whole bound, an hour here)."""
    path = os.path.join(os.fspath(tmp_path), STATE)
    state = PartitionState(path)
    bells = doorbell.Doorbells()
    try:
        marks = bells.marks([os.fspath(tmp_path)])
        assert marks is not None
        state.publish(Snapshot(1, 0, 64, 0, -1))
        saved = doorbell.MAX_WAIT_S
        doorbell.MAX_WAIT_S = 30.0
        try:
            bells.wait(marks, 30.0)
        finally:
            doorbell.MAX_WAIT_S = saved
    finally:
        bells.close()
        state.close()


def test_a_manual_clock_never_waits_on_the_doorbell(
    log_dir: str, clock: pylog.ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("a consumer on a manual clock blocked on the doorbell")

    monkeypatch.setattr(doorbell.Doorbells, "wait", refuse)
    with pylog.open(log_dir, clock=clock) as log:
        log.create_topic("t")
        consumer = log.consumer("t", auto_offset_reset="earliest")
        start = clock.monotonic_ms()
        assert consumer.poll(timeout_ms=30_000) == {}
        assert clock.monotonic_ms() >= start + 30_000  # the wait went through clock.sleep
        consumer.close()


def test_poll_with_the_system_clock_still_times_out(log_dir: str) -> None:
    with pylog.open(log_dir) as log:
        log.create_topic("t", partitions=2)
        consumer = log.consumer("t", auto_offset_reset="earliest")
        assert consumer.poll(timeout_ms=30) == {}
        consumer.unsubscribe()
        consumer.assign([TopicPartition("t", 1)])
        assert consumer.poll(timeout_ms=30) == {}
        consumer.close()
