"""Multi-process chaos: writer processes append (rolling segments, retention deleting them) while reader
processes scan from the beginning over and over; random SIGSTOP/SIGCONT of all of them and SIGKILL of writers.

Checked: no process dies of a signal it was not sent (SIGBUS from a shrunk mapping would show here); every
record a reader returns was sent (its value carries a digest) and offsets only increase within a partition
scan (no anomaly: no duplicate, no reordering, no phantom record); the log verifies clean at the end.
``PYLOG_TORTURE=1`` runs for two minutes instead of about fifteen seconds.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import time

import pytest

import pylog

# the long mode (PYLOG_TORTURE=1) runs far past the default per-test limit
pytestmark = pytest.mark.timeout(7200 if os.environ.get("PYLOG_TORTURE") else 600)

SECONDS = 120 if os.environ.get("PYLOG_TORTURE") else 12


def _value(writer: int, seq: int) -> bytes:
    head = b"%d:%d:" % (writer, seq)
    return head + hashlib.blake2b(head, digest_size=16).digest()


def _ok(value: bytes) -> bool:
    return hashlib.blake2b(value[:-16], digest_size=16).digest() == value[-16:]


def _writer(path: str, writer: int) -> None:
    rng = random.Random(writer)
    with pylog.open(path) as log:
        producer = log.producer(value_serializer=None, acks=rng.choice([1, "all"]))
        seq = 0
        while True:
            producer.send("chaos", _value(writer, seq), key=b"%d" % rng.randrange(100)).get()
            seq += 1
            if seq % 300 == 0:
                log.apply_retention()


def _reader(path: str) -> None:
    """Exit 0 when stopped with SIGTERM, 3 on an anomaly."""
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    with pylog.open(path) as log:
        while not stop:
            consumer = log.consumer(
                "chaos", value_deserializer=None, auto_offset_reset="earliest", consumer_timeout_ms=0
            )
            last: dict[int, int] = {}
            for record in consumer:
                if not _ok(record.value) or record.offset <= last.get(record.partition, -1):
                    os._exit(3)
                last[record.partition] = record.offset
                if stop:
                    break
            consumer.close()
    os._exit(0)


def _spawn(target: object, *args: object) -> int:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            target(*args)  # type: ignore[operator]
            code = 0
        except BaseException:
            import traceback

            with open(os.path.join(os.path.dirname(str(args[0])), f"child-{os.getpid()}.err"), "w") as f:
                traceback.print_exc(file=f)  # shown by the test when a child fails
        finally:
            os._exit(code)
    return pid


def _child_errors(path: str) -> str:
    folder = os.path.dirname(path)
    out = []
    for name in sorted(os.listdir(folder)):
        if name.startswith("child-") and name.endswith(".err"):
            with open(os.path.join(folder, name)) as f:
                out.append(f"{name}:\n{f.read()}")
    return "\n".join(out)


def test_writers_and_readers_under_sigstop_and_sigkill(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "log")
    with pylog.open(path) as log:
        log.create_topic("chaos", partitions=3, segment_bytes=8_192, retention_bytes=40_000)
    rng = random.Random(7)
    writers = {w: _spawn(_writer, path, w) for w in range(2)}
    readers = [_spawn(_reader, path) for _ in range(2)]
    stops = kills = writer_errors = 0
    deadline = time.monotonic() + SECONDS
    next_writer = 2
    try:
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.05, 0.3))
            victim = rng.choice(list(writers.values()) + readers)
            os.kill(victim, signal.SIGSTOP)
            time.sleep(rng.uniform(0.01, 0.2))
            os.kill(victim, signal.SIGCONT)
            stops += 1
            if rng.random() < 0.25:
                w = rng.choice(list(writers))
                os.kill(writers[w], signal.SIGKILL)
                _, status = os.waitpid(writers.pop(w), 0)
                # no process may die of a signal it was not sent (SIGBUS from a shrunk mapping would show here);
                # a writer that stopped with an error is reported below with its traceback
                assert not (os.WIFSIGNALED(status) and os.WTERMSIG(status) != signal.SIGKILL), _child_errors(
                    path
                )
                writer_errors += int(os.WIFEXITED(status))
                writers[next_writer] = _spawn(_writer, path, next_writer)
                next_writer += 1
                kills += 1
    finally:
        for pid in writers.values():
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        statuses = []
        for pid in readers:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGTERM)
            statuses.append(os.waitpid(pid, 0)[1])
    with pylog.open(path) as log:
        appended = sum(log.topic("chaos").partition(p).log_end_offset for p in range(3))
        intact = all(
            _ok(r.value)
            for r in log.consumer(
                "chaos", value_deserializer=None, auto_offset_reset="earliest", consumer_timeout_ms=0
            )
        )
    print(
        f"\nchaos: {SECONDS} s, {stops} SIGSTOP/SIGCONT, {kills} writers killed, {appended} records appended, "
        f"reader exits {statuses}"
    )
    for status in statuses:
        assert not os.WIFSIGNALED(status), f"a reader died of signal {os.WTERMSIG(status)} (SIGBUS?)"
    assert statuses == [0, 0], (
        f"a reader saw a record never sent or out of order (3), or failed:\n{_child_errors(path)}"
    )
    assert intact
    assert writer_errors == 0, f"writers stopped with an error before their kill:\n{_child_errors(path)}"
    assert appended >= 500, f"only {appended} records appended: the writers made no real progress"
    with pylog.open(path) as log:
        assert log.verify() == {}
