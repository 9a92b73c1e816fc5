"""Soak of ``pylog serve``: 20 idempotent confluent-kafka producers (acks=all) and 20 consumers in two groups
run for minutes while the broker process is stopped with SIGTERM and restarted four times, SIGKILLed once and
paused (SIGSTOP) once for longer than the consumers' session timeout; then every acknowledged record was read
exactly once by each group, none is lost, the log holds each sent value at most once (idempotence), and the
broker's memory stayed flat.

Counting is honest about commits: a consumer counts a batch as read only once ``commit(asynchronous=False)``
of its offsets succeeded. A failed commit may still have been written: librdkafka retries a commit whose
request was lost with its connection (the broker stopped, or librdkafka closed its coordinator connection when
another one closed) or timed out, and reports the error of the retry (UNKNOWN_MEMBER_ID from the next broker).
So the consumer seeks back and reads the batch again if the group still gives it the partition, and the batch
is kept aside as *in doubt*, decided at the end per partition, all or nothing: either the group read all of it
again (the commit was not written) or none of it (it was: the committed offset passed it); part of it is a
violation. Every failed commit is printed with the committed offset read just after it when records are lost.

The broker's resident memory (``VmRSS``) is sampled every second for each incarnation; the last incarnation,
which runs for the second half of the soak, must end at no more than 1.5 times its RSS after warm-up.

Runs only under ``PYLOG_TORTURE=1`` (``make torture``); ``PYLOG_SOAK_SECONDS`` sets the producing time
(240 s by default). It prints one summary line with the figures.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import pylog

ck = pytest.importorskip("confluent_kafka")

TORTURE = os.environ.get("PYLOG_TORTURE") == "1"
pytestmark = [
    pytest.mark.skipif(not TORTURE, reason="a soak of minutes: runs under PYLOG_TORTURE=1 (make torture)"),
    pytest.mark.timeout(7200),
]

SECONDS = float(os.environ.get("PYLOG_SOAK_SECONDS", "240"))
TOPIC = "soak"
PARTITIONS = 10
PRODUCERS = 20
GROUPS = {"soak-a": 10, "soak-b": 10}  # 20 consumers
IN_FLIGHT = 500  # records a producer may have unacknowledged before it waits (back-pressure)
# (fraction of SECONDS, signal): four graceful stops and one SIGKILL in the first half; the last incarnation
# runs for the second half and the drain, long enough to see its memory grow if it does
RESTARTS = [(0.1, signal.SIGTERM), (0.2, signal.SIGTERM), (0.3, signal.SIGKILL), (0.4, signal.SIGTERM)]
RESTARTS += [(0.5, signal.SIGTERM)]
# and once the broker is paused (SIGSTOP) for longer than the consumers' session timeout: the broker adds the
# pause to every session (it could not hear anyone), so only the members whose client gave up on its own
# session during the pause (librdkafka rejoins then) lose their generation and see their commits refused
STALL_AT, STALL_S, SESSION_TIMEOUT_MS = 0.13, 15.0, 10_000
WARM_UP_S = 20.0  # the RSS this long after an incarnation started is its warmed-up size
RSS_GROWTH = 1.5
WAIT_S = 120.0  # the longest any one wait (a broker start or stop) may take
DRAIN_S = 600.0  # the longest the producers' flush and the groups' catching up may take


# pylog serve with the broker's INFO lines (sessions expired, rebalances) kept in its stderr file
_SERVE = [
    sys.executable,
    "-c",
    "import logging, sys; from pylog.cli import main; "
    "logging.basicConfig(level=logging.INFO, format='%(asctime)s %(name)s %(message)s'); "
    "sys.exit(main(sys.argv[1:]))",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


@dataclass
class Incarnation:
    proc: subprocess.Popen[bytes]
    started: float
    rss: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, kB)
    stopped_by: str = ""
    exit_code: int | None = None


class Broker:
    """``pylog serve`` restarted on one port; stderr of every incarnation goes to one file."""

    def __init__(self, directory: Path, port: int) -> None:
        self.directory = directory
        self.port = port
        self.incarnations: list[Incarnation] = []
        self.stderr_path = directory.parent / "broker.stderr"
        self._lock = threading.Lock()

    def start(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while True:
            with open(self.stderr_path, "ab") as err:
                proc = subprocess.Popen(
                    [*_SERVE, "--dir", str(self.directory), "serve", "--listen", f"127.0.0.1:{self.port}"],
                    stdout=subprocess.PIPE,
                    stderr=err,
                    cwd=self.directory.parent,
                )
            assert proc.stdout is not None
            if proc.stdout.readline().strip():
                with self._lock:
                    self.incarnations.append(Incarnation(proc, time.monotonic()))
                return
            code = proc.wait(WAIT_S)
            proc.stdout.close()
            if time.monotonic() > deadline:  # e.g. the port still taken: retried until then
                raise AssertionError(f"the broker did not start (exit {code}): see {self.stderr_path}")
            time.sleep(0.5)

    def stop(self, sig: int) -> None:
        inc = self.incarnations[-1]
        inc.stopped_by = signal.Signals(sig).name
        inc.proc.send_signal(sig)
        inc.exit_code = inc.proc.wait(WAIT_S)
        assert inc.proc.stdout is not None
        inc.proc.stdout.close()
        self.sample()  # nothing: the process is gone

    def pause(self, seconds: float) -> None:
        pid = self.incarnations[-1].proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)

    def sample(self) -> None:
        with self._lock:
            if not self.incarnations:
                return
            inc = self.incarnations[-1]
            if inc.proc.poll() is None and (kb := _rss_kb(inc.proc.pid)) is not None:
                inc.rss.append((time.monotonic() - inc.started, kb))

    def kill(self) -> None:
        for inc in self.incarnations:
            if inc.proc.poll() is None:
                inc.proc.kill()
                inc.proc.wait(WAIT_S)


def _value(producer: int, seq: int) -> bytes:
    return b"p%02d-%09d" % (producer, seq)


class Producer(threading.Thread):
    """One idempotent producer: unique values, at most IN_FLIGHT unacknowledged, until told to stop."""

    def __init__(self, index: int, bootstrap: str, stop: threading.Event) -> None:
        super().__init__(name=f"producer-{index}", daemon=True)
        self.index = index
        self.stop = stop
        self.acked: list[bytes] = []
        self.failed: list[tuple[bytes, str]] = []
        self.fatal: list[str] = []
        self.sent = 0
        self.unflushed = -1
        self.producer = ck.Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": int(DRAIN_S * 1000),  # outlives every restart
                "reconnect.backoff.max.ms": 1000,
                "log_level": 0,  # the refused connections while the broker restarts are expected
                "error_cb": self._error,
            }
        )

    def _error(self, err: Any) -> None:
        if err.fatal():
            self.fatal.append(str(err))

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked.append(msg.value())
        else:
            self.failed.append((msg.value(), str(err)))

    def run(self) -> None:
        p = self.producer
        while not self.stop.is_set() and not self.fatal:
            if self.sent - len(self.acked) - len(self.failed) >= IN_FLIGHT:
                p.poll(0.05)
                continue
            try:
                p.produce(TOPIC, _value(self.index, self.sent), on_delivery=self._delivered)
            except BufferError:
                p.poll(0.1)
                continue
            self.sent += 1
            p.poll(0)
        self.unflushed = p.flush(DRAIN_S)


@dataclass
class Doubt:
    """One partition's part of a batch whose commit failed while the broker restarted: it may be written."""

    values: list[bytes]
    probe: str  # what the group's committed offset said just after: "written", "not written" or "unknown"


@dataclass
class Tally:
    """What one group has read: the counted values, and the batches whose commit may have been written."""

    counted: Counter[bytes] = field(default_factory=Counter)
    in_doubt: list[Doubt] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)  # failed commits by error
    failures: list[str] = field(default_factory=list)  # each failed commit, for a post-mortem
    client_errors: Counter[str] = field(default_factory=Counter)  # what error_cb reported, by error
    commits: int = 0
    skipped: int = 0  # batches dropped because they did not start where a failed commit's batch did
    lock: threading.Lock = field(default_factory=threading.Lock)


class Restarts:
    """Counts the broker's stops and starts, so a consumer knows whether one overlapped its commit."""

    def __init__(self) -> None:
        self.changes = 0


class Consumer(threading.Thread):
    """A group member that counts a batch only once its offsets were committed synchronously."""

    def __init__(
        self, group: str, index: int, bootstrap: str, tally: Tally, restarts: Restarts, stop: threading.Event
    ) -> None:
        super().__init__(name=f"{group}-{index}", daemon=True)
        self.tally = tally
        self.restarts = restarts
        self.stop = stop
        self.disconnects = 0  # errors librdkafka reported (error_cb): connections lost, requests timed out
        # partition -> the offset this member must read next: the start of a batch whose commit failed
        self.resume: dict[int, int] = {}
        self.consumer = ck.Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "client.id": f"{group}-{index}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": 1_000,
                "reconnect.backoff.max.ms": 1000,
                "log_level": 0,  # the refused connections while the broker restarts are expected
                "error_cb": self._error,
            }
        )

    def _error(self, err: Any) -> None:  # a lost connection, a request timed out (then retried), ...
        self.disconnects += 1
        with self.tally.lock:
            self.tally.client_errors[err.name()] += 1

    def _assigned(self, consumer: Any, partitions: list[Any]) -> None:
        for tp in partitions:  # a new assignment starts at the group's committed offsets
            self.resume.pop(tp.partition, None)

    def run(self) -> None:
        c = self.consumer
        c.subscribe([TOPIC], on_assign=self._assigned)
        try:
            while not self.stop.is_set():
                self._one_batch(c.consume(500, 0.5))
        finally:
            c.close()

    def _one_batch(self, messages: list[Any]) -> None:
        parts: dict[int, list[Any]] = {}
        for m in messages:
            if m.error() is None:
                parts.setdefault(m.partition(), []).append(m)
        for p in list(parts):
            # After a failed commit librdkafka may still return records fetched past the batch (the seek
            # back did not take, e.g. the assignment was just lost), and a member between generations
            # commits with generation -1, which Kafka accepts while the group is empty: committing those
            # would skip the batch. They are dropped until the batch is read again (or the partition is
            # assigned anew).
            if p in self.resume:
                if parts[p][0].offset() == self.resume[p]:
                    del self.resume[p]
                else:
                    with contextlib.suppress(ck.KafkaException):
                        self.consumer.seek(ck.TopicPartition(TOPIC, p, self.resume[p]))
                    del parts[p]
                    with self.tally.lock:
                        self.tally.skipped += 1
        if not parts:
            return
        offsets = [ck.TopicPartition(TOPIC, p, ms[-1].offset() + 1) for p, ms in parts.items()]
        before = self.restarts.changes, self.disconnects
        try:
            answer = self.consumer.commit(offsets=offsets, asynchronous=False)
            failed = [tp for tp in answer or [] if tp.error is not None]
            if failed:
                raise ck.KafkaException(failed[0].error)
        except ck.KafkaException as exc:
            error = exc.args[0]
            name = error.name() if hasattr(error, "name") else str(error)
            # librdkafka retries a commit whose request was lost with its connection (the broker stopped, or
            # librdkafka closed its coordinator connection when another closed) or timed out, and reports
            # the error of the retry (UNKNOWN_MEMBER_ID from the next broker, or once the member's session
            # expired) although the first attempt may have been written: every failed commit is in doubt.
            after = self.restarts.changes, self.disconnects
            self._not_committed(parts, name, after != before)
            return
        with self.tally.lock:
            self.tally.commits += 1
            for ms in parts.values():
                self.tally.counted.update(m.value() for m in ms)

    def _not_committed(self, parts: dict[int, list[Any]], name: str, disturbed: bool) -> None:
        for p, ms in parts.items():  # read them again (a partition no longer ours is read by its new owner)
            self.resume[p] = ms[0].offset()
            with contextlib.suppress(ck.KafkaException):
                self.consumer.seek(ck.TopicPartition(TOPIC, p, ms[0].offset()))
        probes = {p: "unknown" for p in parts}
        with contextlib.suppress(ck.KafkaException):
            for tp in self.consumer.committed([ck.TopicPartition(TOPIC, p) for p in parts], timeout=10):
                ms = parts[tp.partition]
                if tp.offset == ms[-1].offset() + 1:
                    probes[tp.partition] = "written"
                elif tp.offset == ms[0].offset():
                    probes[tp.partition] = "not written"
        with self.tally.lock:
            self.tally.failures.extend(
                f"{time.monotonic():.1f} {self.name} {name} restart or client error={disturbed} p{p} {ms[0].offset()}-"
                f"{ms[-1].offset()} committed offset after: {probes[p]}"
                for p, ms in parts.items()
            )
            self.tally.refused[name + (" (restart or client error)" if disturbed else "")] += 1
            self.tally.in_doubt.extend(Doubt([m.value() for m in ms], probes[p]) for p, ms in parts.items())


@dataclass
class Decided:
    written: int = 0  # no one read the batch again: its commit was written
    late: int = 0  # of those, the committed offset read just after the failure did not have it yet
    again: int = 0  # the group read the whole batch again: its commit was not written
    problems: list[str] = field(default_factory=list)  # part of a batch read again


def _resolve(tally: Tally) -> Decided:
    """Decide the batches in doubt, all or nothing: read again by the group (the commit was not written) or
    by no one (it was written: the group's committed offset passed the batch)."""
    decided = Decided()
    for doubt in tally.in_doubt:
        seen = sum(1 for v in doubt.values if tally.counted[v])
        if seen == len(doubt.values):
            decided.again += 1
        elif seen == 0:
            decided.written += 1
            decided.late += doubt.probe == "not written"
            tally.counted.update(doubt.values)
        else:
            decided.problems.append(
                f"{seen} of {len(doubt.values)} read again, the committed offset said {doubt.probe}"
            )
    return decided


def _caught_up(bootstrap: str, groups: list[str]) -> bool:
    """Every group's committed offset is the end of every partition."""
    probe = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": groups[0], "enable.auto.commit": False})
    try:
        tps = [ck.TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        ends = [probe.get_watermark_offsets(tp, timeout=10)[1] for tp in tps]
        for group in groups:
            admin = ck.Consumer(
                {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
            )
            try:
                committed = [tp.offset for tp in admin.committed(tps, timeout=10)]
            finally:
                admin.close()
            if committed != ends:
                return False
        return True
    except ck.KafkaException:
        return False
    finally:
        probe.close()


def _log_values(
    directory: Path,
) -> tuple[Counter[bytes], dict[str, list[str]], dict[bytes, tuple[int, int]]]:
    """The values in the log (each with its count), what ``verify()`` found, and each value's place."""
    with pylog.open(directory) as log:
        problems = log.verify()
        c = log.consumer(value_deserializer=None, consumer_timeout_ms=0)
        try:
            c.assign([pylog.TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
            c.seek_to_beginning()
            records = list(c)
            return (
                Counter(r.value for r in records),
                problems,
                {r.value: (r.partition, r.offset) for r in records},
            )
        finally:
            c.close()


def _rss_figures(inc: Incarnation) -> str:
    if not inc.rss:
        return "no sample"
    values = [kb for _, kb in inc.rss]
    warm = _warm_rss(inc)
    return (
        f"{inc.rss[-1][0]:.0f}s start={values[0] // 1024} warm={warm // 1024} end={values[-1] // 1024} "
        f"max={max(values) // 1024} MiB, stopped by {inc.stopped_by} (exit {inc.exit_code})"
    )


def _warm_rss(inc: Incarnation) -> int:
    later = [kb for t, kb in inc.rss if t >= WARM_UP_S]
    return later[0] if later else inc.rss[-1][1]


def test_soak_of_the_broker_under_restarts(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    with pylog.open(directory) as log:
        log.create_topic(TOPIC, partitions=PARTITIONS, segment_bytes=1 << 20)
    broker = Broker(directory, _free_port())
    broker.start()
    bootstrap = f"127.0.0.1:{broker.port}"
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(1.0):
            broker.sample()

    sampler = threading.Thread(target=sample, name="rss", daemon=True)
    sampler.start()
    stop_producing, stop_consuming = threading.Event(), threading.Event()
    tallies = {g: Tally() for g in GROUPS}
    restarts = Restarts()
    producers = [Producer(i, bootstrap, stop_producing) for i in range(PRODUCERS)]
    consumers = [
        Consumer(g, i, bootstrap, tallies[g], restarts, stop_consuming)
        for g, n in GROUPS.items()
        for i in range(n)
    ]
    try:
        for t in [*consumers, *producers]:
            t.start()
        began = time.monotonic()
        for fraction, sig in sorted([*RESTARTS, (STALL_AT, signal.SIGSTOP)]):
            time.sleep(max(0.0, began + fraction * SECONDS - time.monotonic()))
            if sig == signal.SIGSTOP:
                broker.pause(STALL_S)
                continue
            restarts.changes += 1
            broker.stop(sig)
            broker.start()
            restarts.changes += 1
        time.sleep(max(0.0, began + SECONDS - time.monotonic()))
        stop_producing.set()
        produced_s = time.monotonic() - began
        for p in producers:
            p.join(DRAIN_S)
        deadline = time.monotonic() + DRAIN_S
        while not _caught_up(bootstrap, list(GROUPS)):
            assert time.monotonic() < deadline, "the groups did not catch up with the log"
            time.sleep(2.0)
        stop_consuming.set()
        for c in consumers:
            c.join(WAIT_S)
        drained_s = time.monotonic() - began - produced_s
        broker.sample()
        sampling.set()
        sampler.join(WAIT_S)
        broker.stop(signal.SIGTERM)
    finally:
        stop_producing.set()
        stop_consuming.set()
        sampling.set()
        broker.kill()

    acked = [v for p in producers for v in p.acked]
    failed = [f for p in producers for f in p.failed]
    fatal = [f for p in producers for f in p.fatal]
    in_log, verify, positions = _log_values(directory)
    resolved = {g: _resolve(t) for g, t in tallies.items()}
    acked_set = set(acked)
    read = {g: {v for v in t.counted if t.counted[v]} for g, t in tallies.items()}
    duplicates = {g: sum(1 for n in t.counted.values() if n > 1) for g, t in tallies.items()}
    lost = {g: len(acked_set - read[g]) for g in GROUPS}
    log_duplicates = sum(1 for n in in_log.values() if n > 1)
    missing_in_log = sum(1 for v in acked_set if not in_log[v])
    stderr = broker.stderr_path.read_text(errors="replace")
    last = broker.incarnations[-1]
    print(
        f"\nsoak: {SECONDS:.0f}s producing + {drained_s:.0f}s drain, {PRODUCERS} producers, "
        f"{sum(GROUPS.values())} consumers in {len(GROUPS)} groups, {PARTITIONS} partitions; "
        f"acknowledged={len(acked)} ({len(acked) / produced_s:.0f} rec/s) delivery failures={len(failed)} "
        f"fatal={len(fatal)}; in log={sum(in_log.values())} log duplicates={log_duplicates} "
        f"acknowledged missing from log={missing_in_log}; "
        + "; ".join(
            f"group {g}: read={len(read[g])} duplicates={duplicates[g]} lost={lost[g]} "
            f"commits={tallies[g].commits} failed commits={dict(tallies[g].refused)} "
            f"batches dropped after a failed commit={tallies[g].skipped} "
            f"client errors={dict(tallies[g].client_errors)} "
            f"in doubt={len(tallies[g].in_doubt)} (written {resolved[g].written}, of which after the "
            f"committed offset was read {resolved[g].late}; read again {resolved[g].again})"
            for g in GROUPS
        )
        + f"; restarts={len(RESTARTS)} ("
        + ", ".join(signal.Signals(s).name for _, s in RESTARTS)
        + f") and a {STALL_S:.0f} s SIGSTOP; sessions expired={stderr.count('session expired')}; broker RSS per incarnation: "
        + " | ".join(_rss_figures(inc) for inc in broker.incarnations)
    )
    assert not fatal and not failed[:5], (fatal, failed[:5])
    assert all(p.unflushed == 0 for p in producers)
    assert verify == {}
    assert log_duplicates == 0 and missing_in_log == 0
    assert all(v.startswith(b"p") and len(v) == 13 for v in in_log)
    for g in GROUPS:
        if lost[g]:
            where = Counter(positions[v][0] for v in acked_set - read[g])
            first = {
                p: min(positions[v][1] for v in acked_set - read[g] if positions[v][0] == p) for p in where
            }
            print(g, "lost per partition", dict(where), "from offset", first)
            print("\n".join(tallies[g].failures))
            print("\n".join(line for line in stderr.splitlines() if "connection" not in line))
        assert resolved[g].problems == []
        assert duplicates[g] == 0 and lost[g] == 0, g
        assert read[g] <= set(in_log), "a group read a value the log does not hold"
    assert [i.exit_code for i in broker.incarnations] == [
        -signal.SIGKILL if s == signal.SIGKILL else 0 for _, s in RESTARTS
    ] + [0]
    assert "Traceback" not in stderr, stderr[-4000:]
    assert last.rss and last.rss[-1][1] <= RSS_GROWTH * _warm_rss(last), _rss_figures(last)
