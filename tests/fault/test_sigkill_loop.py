"""SIGKILL at random moments while a process produces: nothing acknowledged is lost (I2), nothing wrong is
returned (I3), partitions stay gap-free prefixes (I4), offsets are never reused (I5), indexes agree with the
log (I6, through verify()).

The child produces to two topics of several partitions with small segments (rolls) and size retention, with
acks=1 and acks="all", and reports every acknowledgement over a pipe; the parent kills it, reopens the log and
checks. ``PYLOG_TORTURE=1`` runs thousands of kills instead of 200.
"""

from __future__ import annotations

import hashlib
import os
import random
import select
import signal
import time

import pytest

import pylog

# the long mode (PYLOG_TORTURE=1) runs far past the default per-test limit
pytestmark = pytest.mark.timeout(7200 if os.environ.get("PYLOG_TORTURE") else 600)

KILLS = 3000 if os.environ.get("PYLOG_TORTURE") else 200
TOPICS = {"events": 3, "audit": 2}


def _value(seq: int, salt: int) -> bytes:
    """``salt:seq:digest``: any stored value can be checked for having been sent (I3)."""
    head = b"%d:%d:" % (salt, seq)
    return head + hashlib.blake2b(head, digest_size=16).digest()


def _was_sent(value: bytes) -> bool:
    head, digest = value[:-16], value[-16:]
    return head.count(b":") == 2 and hashlib.blake2b(head, digest_size=16).digest() == digest


def _produce(path: str, fd: int, salt: int) -> None:
    rng = random.Random(salt)
    with pylog.open(path) as log:
        producers = {
            1: log.producer(acks=1, value_serializer=None),
            "all": log.producer(acks="all", value_serializer=None),
        }
        seq = 0
        while True:
            topic = rng.choice(sorted(TOPICS))
            acks = 1 if rng.random() < 0.8 else "all"
            value = _value(seq, salt)
            meta = producers[acks].send(topic, value, key=b"k%d" % rng.randrange(50)).get()
            os.write(
                fd, b"%s %d %d %s\n" % (topic.encode(), meta.partition, meta.offset, value.hex().encode())
            )
            seq += 1
            if seq % 500 == 0:
                log.apply_retention()


def test_sigkill_loop_loses_nothing_acknowledged(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "log")
    with pylog.open(path) as log:
        for name, n in TOPICS.items():
            log.create_topic(name, partitions=n, segment_bytes=16_384, retention_bytes=65_536)
    rng = random.Random(99)
    acked: dict[tuple[str, int, int], bytes] = {}
    violations: list[str] = []
    started = time.monotonic()
    kills = 0
    for kill in range(KILLS):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                _produce(path, w, kill)
            finally:
                os._exit(1)
        os.close(w)
        deadline = time.monotonic() + rng.uniform(0.005, 0.08)
        buf = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            if ready:
                buf += os.read(r, 1 << 16)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        kills += 1
        while chunk := os.read(r, 1 << 16):
            buf += chunk
        os.close(r)
        for line in buf.split(b"\n")[:-1]:  # a torn last line was never fully reported
            topic, partition, offset, value = line.split(b" ")
            key = (topic.decode(), int(partition), int(offset))
            if key in acked and acked[key] != bytes.fromhex(value.decode()):
                violations.append(f"I5: offset {key} acknowledged twice for different records")
            acked[key] = bytes.fromhex(value.decode())
        violations += _check(path, acked, full=kill % 10 == 9 or kill == KILLS - 1)
        if violations:
            break
    print(
        f"\nSIGKILL loop: {kills} kills in {time.monotonic() - started:.1f} s, {len(acked)} acknowledged records, "
        f"{len(violations)} violations"
    )
    assert not violations, violations[:5]
    assert kills == KILLS


def _check(path: str, acked: dict[tuple[str, int, int], bytes], *, full: bool) -> list[str]:
    problems = []
    with pylog.open(path) as log:
        report = log.verify() if full else {}
        if report:
            problems.append(f"I6: verify() found {report}")
        for name, n in TOPICS.items():
            for p in range(n):
                plog = log.topic(name).partition(p)
                start, end = plog.log_start_offset, plog.log_end_offset
                c = log.consumer(value_deserializer=None, consumer_timeout_ms=0, auto_offset_reset="earliest")
                tp = pylog.TopicPartition(name, p)
                c.assign([tp])
                stored = {r.offset: r.value for r in c}
                c.close()
                if sorted(stored) != list(range(start, end)):
                    problems.append(f"I4: {name}-{p} offsets are not {start}..{end - 1} without gaps")
                problems += [
                    f"I3: {name}-{p}@{off} holds a record never sent"
                    for off, v in stored.items()
                    if not _was_sent(v)
                ]
                for (t, q, off), value in acked.items():
                    if t == name and q == p and off >= start and stored.get(off) != value:
                        problems.append(
                            f"I2: {t}-{q}@{off} acknowledged but {'missing' if off not in stored else 'different'}"
                        )
    return problems
