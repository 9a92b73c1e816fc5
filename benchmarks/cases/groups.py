"""Consumer groups at scale: how long a group takes to settle, to move a departed member's partitions, what a
settled member's ``poll()`` costs, commit throughput, and how long the other members pause in a cooperative
rebalance.

*Settled* means every partition of the topic is owned (adopted: ``consumer.assignment()``) by exactly one
member, and every member holds the same generation. Members of one process are polled in turn
(``poll(timeout_ms=0)``), each with its own heartbeat thread, defaults otherwise (``cooperative-sticky``,
heartbeat 3 s, session 45 s). A case that does not settle within its time budget reports
``not settled after X s`` (with how many partitions were owned once) instead of running on.

Across processes, each worker process polls its members in turn and sends each change of what they own
(generation and partitions, with a ``CLOCK_MONOTONIC`` time stamp, comparable across processes) to the
parent through a pipe; the parent finds the first moment the union is settled.

Every partition is opened once (untimed) before the members subscribe: the first use of a partition in a log
session validates its files (``pylog.log``), a cost of opening the log directory, not of the group. Worker
processes open the log while the parent holds it open, so they join its session.

``records`` in these cases is the number of partitions (commits for the commit case, polls for the poll
case), and ``seconds`` the measured time, so ``rec/s`` is partitions settled per second; the goals are on
the named figures (``settle_s``, ``move_s``, ``poll_ms``, ``max_pause_ms``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.cases import Compare, Goal, case
from benchmarks.cases.workload import result

__all__: list[str] = []

TOPIC = "g"
GROUP = "bench"


def _open(path: Path) -> Any:
    """The log, with room for every partition of these cases (up to 2,000) to stay open: past
    ``max_open_partitions`` (200 by default) a process reopens a partition's files on each use, a cost of
    the partition layer that would hide the group's."""
    import pylog

    return pylog.open(str(path), max_open_partitions=2000, max_open_maps=2000)


def _create(path: Path, partitions: int, records_per_partition: int = 0) -> None:
    with _open(path) as log:
        log.create_topic(TOPIC, partitions=partitions)
        if records_per_partition:
            producer = log.producer(acks=1, value_serializer=None)
            value = b"v" * 100
            for p in range(partitions):
                producer.send_batch(TOPIC, values=[value] * records_per_partition, keys=None, partition=p)
            producer.close()


def _validate(log: Any) -> None:
    """Open every partition of the topic once (its first use in the session validates its files)."""
    topic = log.topic(TOPIC)
    for p in range(topic.num_partitions):
        _ = topic.partition(p).log_end_offset


def _wait_for(path: Path, budget_s: float = 120.0) -> None:
    deadline = time.monotonic() + budget_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def _member(log: Any, i: int, **kw: Any) -> Any:
    consumer = log.consumer(
        group_id=GROUP,
        client_id=f"m{i}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        value_deserializer=None,
        **kw,
    )
    consumer.subscribe([TOPIC])
    return consumer


def _owned_once(owned: list[tuple[int, frozenset[Any]]], partitions: int) -> tuple[bool, int]:
    """(settled, partitions owned by exactly one member) for (generation, partitions) per member."""
    counts: dict[Any, int] = {}
    for _, tps in owned:
        for tp in tps:
            counts[tp] = counts.get(tp, 0) + 1
    once = sum(1 for n in counts.values() if n == 1)
    generations = {g for g, _ in owned}
    return once == partitions and len(counts) == partitions and len(generations) == 1, once


def _snapshot(consumers: list[Any]) -> list[tuple[int, frozenset[Any]]]:
    return [(c._group.generation, frozenset(c.assignment())) for c in consumers]


class _Ownership:
    """Who owns what, kept up to date member by member: settled is checked after every poll, not per round."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.members: dict[Any, tuple[int, frozenset[Any]]] = {}
        self.counts: dict[Any, int] = {}
        self.once = 0
        self.more = 0  # partitions owned by two members or more
        self.generations: dict[int, int] = {}

    def _count(self, tp: Any, delta: int) -> None:
        before = self.counts.get(tp, 0)
        after = before + delta
        self.counts[tp] = after
        self.once += (after == 1) - (before == 1)
        self.more += (after > 1) - (before > 1)

    def update(self, key: Any, generation: int, owned: set[Any] | frozenset[Any]) -> bool:
        """Record a member's ownership; True if it changed."""
        old = self.members.get(key)
        if old is not None and old[0] == generation and old[1] == owned:
            return False
        if old is not None:
            self.generations[old[0]] -= 1
            if not self.generations[old[0]]:
                del self.generations[old[0]]
            for tp in old[1] - owned:
                self._count(tp, -1)
            added = owned - old[1]
        else:
            added = owned
        for tp in added:
            self._count(tp, 1)
        self.members[key] = (generation, frozenset(owned))
        self.generations[generation] = self.generations.get(generation, 0) + 1
        return True

    def settled(self) -> bool:
        return self.once == self.partitions and self.more == 0 and len(self.generations) == 1


def _poll_until_settled(
    consumers: list[Any],
    partitions: int,
    budget_s: float,
    extra: list[tuple[int, frozenset[Any]]] | None = None,
) -> tuple[float | None, int, int]:
    """Poll every member in turn until the group (with ``extra``, what other processes own) is settled,
    checked after every poll. Returns (seconds, rounds, partitions owned once); seconds is None when not
    settled within ``budget_s``."""
    t0 = time.perf_counter()
    owners = _Ownership(partitions)
    for k, (generation, owned) in enumerate(_snapshot(consumers) + (extra or [])):
        owners.update(k, generation, owned)
    rounds = 0
    while not owners.settled():
        for k, c in enumerate(consumers):
            c.poll(timeout_ms=0)
            if owners.update(k, c._group.generation, c.assignment()) and owners.settled():
                break
            if time.perf_counter() - t0 > budget_s:
                return None, rounds, owners.once
        rounds += 1
    return time.perf_counter() - t0, rounds, owners.once


def _not_settled(budget_s: float, once: int, partitions: int, what: str = "settled") -> dict[str, Any]:
    return {
        "status": "not settled",
        "reason": f"not {what} after {budget_s:.0f} s: {once:,} of {partitions:,} partitions owned once",
    }


def _close_all(consumers: list[Any], budget_s: float = 30.0) -> None:
    """Close the members, for at most ``budget_s`` (the rest end with the process)."""
    t0 = time.perf_counter()
    for c in consumers:
        if time.perf_counter() - t0 > budget_s:
            return
        with contextlib.suppress(Exception):
            c.close(autocommit=False)


@contextlib.contextmanager
def _group(path: Path, members: int, budget_s: float) -> Iterator[tuple[Any, list[Any], float | None]]:
    """A log with ``members`` subscribed members (subscribe time in the third item, None past the budget)."""
    log = _open(path)
    _validate(log)
    (path.parent / "go").touch()  # for a member in another process (pylog_group_member_dies)
    consumers: list[Any] = []
    try:
        t0 = time.perf_counter()
        subscribe_s: float | None = None
        for i in range(members):
            consumers.append(_member(log, i))
            if time.perf_counter() - t0 > budget_s:
                break
        else:
            subscribe_s = time.perf_counter() - t0
        yield log, consumers, subscribe_s
    finally:
        _close_all(consumers)
        log.close()


def _settle_case(members: int, partitions: int, workdir: Path, budget_s: float) -> dict[str, Any]:
    path = workdir / "log"
    _create(path, partitions)
    with _group(path, members, budget_s) as (_, consumers, subscribe_s):
        if subscribe_s is None:
            return {
                "status": "not settled",
                "reason": f"only {len(consumers)} of {members} members subscribed within {budget_s:.0f} s",
            }
        seconds, rounds, once = _poll_until_settled(consumers, partitions, budget_s)
        if seconds is None:
            return _not_settled(budget_s, once, partitions)
        generation = consumers[0]._group.generation
    return result(
        partitions,
        seconds,
        0,
        settle_s=round(seconds, 3),
        subscribe_s=round(subscribe_s, 3),
        rounds=rounds,
        generation=generation,
    )


def _register_settle(members: int, partitions: int, goal_s: float, budget_s: float) -> None:
    name = f"pylog_group_settle_{members}x{partitions}"

    def run(records: int, seed: int, workdir: Path) -> dict[str, Any]:
        return _settle_case(members, partitions, workdir, budget_s)

    case(
        name,
        group="groups",
        kind="pylog",
        fsync="group state as the protocol writes it",
        description=(
            f"{members} members x {partitions:,} partitions in one process, each polled in turn: seconds from the "
            f"last subscribe() until every partition is owned exactly once (budget {budget_s:.0f} s)"
        ),
        goal=Goal("settle_s", "<=", goal_s, "s"),
        timeout_s=budget_s * 3 + 120,
    )(run)


_register_settle(50, 500, 1.0, 60.0)
_register_settle(100, 1000, 1.0, 60.0)
_register_settle(500, 10_000, 10.0, 180.0)


# -- across processes ---------------------------------------------------------------------------------------


def _worker(path: Path, first: int, count: int, wfd: int, stop_file: Path) -> None:
    """A worker process: subscribe ``count`` members, then poll them in turn, reporting ownership changes."""

    def send(msg: Any) -> None:
        os.write(wfd, (json.dumps(msg) + "\n").encode())

    _wait_for(stop_file.with_name("go"))
    log = _open(path)
    consumers = [_member(log, first + i) for i in range(count)]
    send({"subscribed": time.monotonic()})
    last: list[Any] = []
    start_file = stop_file.with_name("commit")
    while not stop_file.exists() and not start_file.exists():
        for c in consumers:
            c.poll(timeout_ms=0)
        now = [[c._group.generation, sorted(tp.partition for tp in c.assignment())] for c in consumers]
        if now != last:
            send({"t": time.monotonic(), "owned": now})
            last = now
        time.sleep(0.001)
    if start_file.exists():  # the commit case: commit in turn from a given moment, for given seconds
        begin, seconds = json.loads(start_file.read_text())
        offsets = [{tp: 1 for tp in c.assignment()} for c in consumers]
        while time.monotonic() < begin:
            time.sleep(0.001)
        n, error = 0, None
        try:
            while time.monotonic() < begin + seconds:
                for c, mine in zip(consumers, offsets, strict=True):
                    c.commit(mine)
                    n += 1
        except Exception as exc:  # reported: a commit of a settled member must not fail
            error = f"{type(exc).__name__}: {exc}"
        send({"commits": n, "error": error})
        _wait_for(stop_file)
    _close_all(consumers)
    log.close()


def _fork_workers(path: Path, members: int, processes: int, stop_file: Path) -> list[tuple[int, int]]:
    """(pid, read end of its pipe) per worker; members are dealt as evenly as possible."""
    out = []
    first = 0
    for k in range(processes):
        count = members // processes + (1 if k < members % processes else 0)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 1
            try:
                _worker(path, first, count, w, stop_file)
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        out.append((pid, r))
        first += count
    return out


class _Reports:
    """The workers' messages, read from their pipes: subscribe times and ownership per worker."""

    def __init__(self, workers: list[tuple[int, int]]) -> None:
        self.fds = {r: k for k, (_, r) in enumerate(workers)}
        self.buf = {r: b"" for r in self.fds}
        self.subscribed: dict[int, float] = {}
        self.owned: dict[int, list[tuple[int, frozenset[int]]]] = {}
        self.events: list[tuple[float, int, list[tuple[int, frozenset[int]]]]] = []
        self.commits: dict[int, int] = {}
        self.errors: list[str] = []

    def read(self, wait_s: float) -> None:
        ready, _, _ = select.select(list(self.fds), [], [], wait_s)
        for r in ready:
            chunk = os.read(r, 1 << 20)
            if not chunk:
                self.fds.pop(r)
                continue
            self.buf[r] += chunk
            *lines, self.buf[r] = self.buf[r].split(b"\n")
            for line in lines:
                msg = json.loads(line)
                k = self.fds[r]
                if "subscribed" in msg:
                    self.subscribed[k] = msg["subscribed"]
                elif "commits" in msg:
                    self.commits[k] = msg["commits"]
                    if msg.get("error"):
                        self.errors.append(msg["error"])
                else:
                    owned = [(g, frozenset(ps)) for g, ps in msg["owned"]]
                    self.owned[k] = owned
                    self.events.append((msg["t"], k, owned))

    def settled_at(self, partitions: int, processes: int) -> tuple[float | None, int]:
        """The first report time at which the union of the workers' latest reports was settled."""
        latest: dict[int, list[tuple[int, frozenset[int]]]] = {}
        once = 0
        for t, k, owned in sorted(self.events, key=lambda e: e[0]):
            latest[k] = owned
            if len(latest) == processes:
                settled, once = _owned_once([x for v in latest.values() for x in v], partitions)
                if settled:
                    return t, once
        return None, once


def _stop_workers(workers: list[tuple[int, int]], stop_file: Path) -> None:
    stop_file.touch()
    deadline = time.monotonic() + 20
    for pid, r in workers:
        while time.monotonic() < deadline:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(r)


@case(
    "pylog_group_settle_100x1000_8_processes",
    group="groups",
    kind="pylog",
    fsync="group state as the protocol writes it",
    description=(
        "100 members x 1,000 partitions spread over 8 worker processes (12-13 members each, polled in turn): "
        "seconds from the last subscribe() (of any process) until every partition is owned exactly once"
    ),
    goal=Goal("settle_s", "<=", 1.0, "s"),
    timeout_s=300.0,
)
def pylog_group_settle_processes(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    members, partitions, processes, budget_s = 100, 1000, 8, 90.0
    path = workdir / "log"
    _create(path, partitions)
    stop_file = workdir / "stop"
    workers = _fork_workers(path, members, processes, stop_file)
    reports = _Reports(workers)
    log = _open(path)  # held open: the workers join its session, in which every partition is validated
    _validate(log)
    (workdir / "go").touch()
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < budget_s:
            reports.read(0.05)
            if len(reports.subscribed) == processes:
                at, once = reports.settled_at(partitions, processes)
                if at is not None:
                    last_subscribe = max(reports.subscribed.values())
                    seconds = at - last_subscribe
                    return result(
                        partitions,
                        seconds,
                        0,
                        settle_s=round(seconds, 3),
                        subscribe_s=round(last_subscribe - t0, 3),
                    )
        _, once = reports.settled_at(partitions, processes)
        if len(reports.subscribed) < processes:
            return {
                "status": "not settled",
                "reason": f"{len(reports.subscribed)} of {processes} processes subscribed in {budget_s:.0f} s",
            }
        return _not_settled(budget_s, once, partitions)
    finally:
        _stop_workers(workers, stop_file)
        log.close()


# -- a member leaves or dies ----------------------------------------------------------------------------------


@case(
    "pylog_group_member_leaves_100x1000",
    group="groups",
    kind="pylog",
    fsync="group state as the protocol writes it",
    description=(
        "a settled group of 100 members x 1,000 partitions (one process); one member close()s: seconds until "
        "its partitions are owned again (every partition owned exactly once by the other 99)"
    ),
    goal=Goal("move_s", "<=", 1.0, "s"),
    timeout_s=300.0,
)
def pylog_group_member_leaves(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    members, partitions, budget_s = 100, 1000, 60.0
    path = workdir / "log"
    _create(path, partitions)
    with _group(path, members, budget_s) as (_, consumers, subscribe_s):
        if subscribe_s is None:
            return {"status": "not settled", "reason": f"members did not subscribe within {budget_s:.0f} s"}
        seconds, _, once = _poll_until_settled(consumers, partitions, budget_s)
        if seconds is None:
            return _not_settled(budget_s, once, partitions)
        leaving = consumers.pop(len(consumers) // 2)
        moved = len(leaving.assignment())
        t0 = time.perf_counter()
        leaving.close(autocommit=False)
        seconds, rounds, once = _poll_until_settled(consumers, partitions, budget_s)
        total = time.perf_counter() - t0
        if seconds is None:
            return _not_settled(budget_s, once, partitions, "moved")
    return result(partitions, total, 0, move_s=round(total, 3), moved_partitions=moved, rounds=rounds)


def _lone_member(path: Path, wfd: int) -> None:
    """Child: one member, polled continuously, reporting what it owns whenever that changes."""
    _wait_for(path.with_name("go"))
    log = _open(path)
    c = _member(log, 999)
    last: Any = None
    while True:
        c.poll(timeout_ms=0)
        now = [c._group.generation, sorted(tp.partition for tp in c.assignment())]
        if now != last:
            os.write(wfd, (json.dumps(now) + "\n").encode())
            last = now
        time.sleep(0.002)


@case(
    "pylog_group_member_dies_100x1000",
    group="groups",
    kind="pylog",
    fsync="group state as the protocol writes it",
    description=(
        "a settled group of 100 members x 1,000 partitions: 99 in this process, one in a child process that "
        "is SIGKILLed; seconds from the kill until every partition is owned exactly once by the other 99 "
        "(session timeout 45 s: the death is noticed by the member's liveness lock)"
    ),
    goal=Goal("move_s", "<=", 1.0, "s"),
    timeout_s=300.0,
)
def pylog_group_member_dies(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    from pylog.structs import TopicPartition

    members, partitions, budget_s = 100, 1000, 60.0
    path = workdir / "log"
    _create(path, partitions)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            _lone_member(path, w)
        finally:
            os._exit(1)
    os.close(w)
    child: list[Any] = [-1, []]
    buf = b""

    def read_child() -> None:
        nonlocal buf, child
        while select.select([r], [], [], 0)[0]:
            chunk = os.read(r, 1 << 16)
            if not chunk:
                return
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                child = json.loads(line)

    killed = False
    try:
        with _group(path, members - 1, budget_s) as (_, consumers, subscribe_s):
            if subscribe_s is None:
                return {
                    "status": "not settled",
                    "reason": f"members did not subscribe within {budget_s:.0f} s",
                }
            t0 = time.perf_counter()
            once = 0
            while True:
                for c in consumers:
                    c.poll(timeout_ms=0)
                read_child()

                theirs = (child[0], frozenset(TopicPartition(TOPIC, p) for p in child[1]))
                settled, once = _owned_once([*_snapshot(consumers), theirs], partitions)
                if settled:
                    break
                if time.perf_counter() - t0 > budget_s:
                    return _not_settled(budget_s, once, partitions)
            moved = len(child[1])
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            killed = True
            t1 = time.perf_counter()
            seconds, rounds, once = _poll_until_settled(consumers, partitions, budget_s)
            total = time.perf_counter() - t1
            if seconds is None:
                return _not_settled(budget_s, once, partitions, "moved")
    finally:
        if not killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(r)
    return result(partitions, total, 0, move_s=round(total, 3), moved_partitions=moved, rounds=rounds)


# -- steady state ---------------------------------------------------------------------------------------------


def _settled_group(path: Path, members: int, partitions: int, budget_s: float) -> Any:
    """Context: a settled group (raises RuntimeError when it does not settle)."""

    @contextlib.contextmanager
    def ctx() -> Iterator[tuple[Any, list[Any]]]:
        with _group(path, members, budget_s) as (log, consumers, subscribe_s):
            if subscribe_s is None:
                raise RuntimeError(f"members did not subscribe within {budget_s:.0f} s")
            seconds, _, once = _poll_until_settled(consumers, partitions, budget_s)
            if seconds is None:
                raise RuntimeError(
                    f"not settled after {budget_s:.0f} s: {once} of {partitions} partitions owned once"
                )
            yield log, consumers

    return ctx()


def _poll_cost(members: int, partitions: int, workdir: Path) -> dict[str, Any]:
    path = workdir / "log"
    _create(path, partitions)
    with _settled_group(path, members, partitions, 90.0) as (_, consumers):
        for c in consumers:  # one untimed round
            c.poll(timeout_ms=0)
        polls = max(2000, 10 * members)
        samples = []
        t0 = time.perf_counter()
        for i in range(polls):
            c = consumers[i % members]
            s = time.perf_counter()
            c.poll(timeout_ms=0)
            samples.append(time.perf_counter() - s)
        seconds = time.perf_counter() - t0
        generations = {c._group.generation for c in consumers}
        s = time.perf_counter()
        for i in range(polls):
            consumers[i % members]._group.poll()  # the group's part of poll() alone
        group_us = (time.perf_counter() - s) / polls * 1e6
    samples.sort()
    return result(
        polls,
        seconds,
        0,
        poll_ms=round(seconds / polls * 1000, 4),
        p50_ms=round(samples[len(samples) // 2] * 1000, 4),
        p99_ms=round(samples[int(len(samples) * 0.99)] * 1000, 4),
        group_step_us=round(group_us, 2),
        generations=len(generations),
    )


@case(
    "pylog_group_poll_8x80",
    group="groups",
    kind="pylog",
    fsync="none",
    description=(
        "steady state: poll(timeout_ms=0) of a settled member of an 8-member group (80 partitions, 10 per "
        "member, no new records), members polled in turn; poll_ms = mean time per poll, group_step_us = the "
        "group's part of it alone"
    ),
    goal=Goal("poll_ms", "<=", 0.5, "ms"),
)
def pylog_group_poll_small(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _poll_cost(8, 80, workdir)


@case(
    "pylog_group_poll_100x1000",
    group="groups",
    kind="pylog",
    fsync="none",
    description=(
        "steady state: poll(timeout_ms=0) of a settled member of a 100-member group (1,000 partitions, 10 per "
        "member, no new records); rec/s = polls per second, compared with the 8-member group"
    ),
    compare=(Compare("pylog_group_poll_8x80", at_least=0.8),),
    goal=Goal("poll_ms", "<=", 0.5, "ms"),
    timeout_s=600.0,
)
def pylog_group_poll_large(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _poll_cost(100, 1000, workdir)


def _commit_rate(
    members: int, partitions: int, threads: int, seconds: float, workdir: Path
) -> dict[str, Any]:
    path = workdir / "log"
    _create(path, partitions, records_per_partition=4)
    with _settled_group(path, members, partitions, 90.0) as (_, consumers):
        offsets = [{tp: 1 + (k % 3) for tp in c.assignment()} for k, c in enumerate(consumers)]
        counts = [0] * threads
        errors: list[BaseException] = []
        stop = threading.Event()

        def work(k: int) -> None:
            mine = list(range(k, members, threads))
            i = 0
            try:
                while not stop.is_set():
                    m = mine[i % len(mine)]
                    consumers[m].commit(offsets[m])
                    counts[k] += 1
                    i += 1
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        t0 = time.perf_counter()
        for t in workers:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in workers:
            t.join()
        elapsed = time.perf_counter() - t0
        if errors:
            raise errors[0]
    n = sum(counts)
    return result(
        n, elapsed, 0, commits_per_s=round(n / elapsed), commit_ms=round(elapsed * threads / n * 1000, 3)
    )


@case(
    "pylog_group_commit_1_member",
    group="groups",
    kind="pylog",
    fsync="every commit (fsync before it returns)",
    description="commit() of 10 partitions in a loop, one member, one thread (the fsync-bound baseline)",
)
def pylog_group_commit_one(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _commit_rate(1, 10, 1, 3.0, workdir)


@case(
    "pylog_group_commit_100_members",
    group="groups",
    kind="pylog",
    fsync="every commit (fsync before it returns)",
    description=(
        "commit() of 10 partitions each by 100 settled members (1,000 partitions) in 8 worker processes, each "
        "committing its members in turn for 5 s; rec/s = commits per second of the whole group, compared "
        "with one member alone"
    ),
    compare=(Compare("pylog_group_commit_1_member"),),
    timeout_s=600.0,
)
def pylog_group_commit_many(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    members, partitions, processes, budget_s, seconds = 100, 1000, 8, 90.0, 5.0
    path = workdir / "log"
    _create(path, partitions, records_per_partition=4)
    stop_file = workdir / "stop"
    workers = _fork_workers(path, members, processes, stop_file)
    reports = _Reports(workers)
    log = _open(path)
    _validate(log)
    (workdir / "go").touch()
    t0 = time.monotonic()
    try:
        while True:
            reports.read(0.05)
            if (
                len(reports.subscribed) == processes
                and reports.settled_at(partitions, processes)[0] is not None
            ):
                break
            if time.monotonic() - t0 > budget_s:
                return _not_settled(budget_s, reports.settled_at(partitions, processes)[1], partitions)
        (workdir / "commit").write_text(json.dumps([time.monotonic() + 0.2, seconds]))
        while len(reports.commits) < processes and time.monotonic() - t0 < budget_s + 60:
            reports.read(0.1)
        n = sum(reports.commits.values())
    finally:
        _stop_workers(workers, stop_file)
        log.close()
    if reports.errors or len(reports.commits) < processes:
        lost = processes - len(reports.commits)
        return {"status": "error", "reason": f"{lost} workers did not report; errors: {reports.errors[:3]}"}
    return result(n, seconds, 0, commits_per_s=round(n / seconds), processes=len(reports.commits))


# -- the others' pause in a cooperative rebalance -----------------------------------------------------------


@case(
    "pylog_group_cooperative_pause_100x1000",
    group="groups",
    kind="pylog",
    fsync="group state as the protocol writes it",
    description=(
        "a settled group of 100 members x 1,000 partitions with records to read (max_poll_records=5), polled in "
        "turn; a 101st member joins; max_pause_ms = the longest time any of the 100 went without records from "
        "the join until the group settled again; round_ms: one round of polls, the floor of that gap; "
        "max_pause_rounds = max_pause_ms / round_ms (a stop-the-world rebalance would stop them for all of it)"
    ),
    goal=Goal("max_pause_rounds", "<=", 3, "rounds"),
    timeout_s=600.0,
)
def pylog_group_cooperative_pause(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    members, partitions, budget_s = 100, 1000, 90.0
    path = workdir / "log"
    _create(path, partitions, records_per_partition=200)
    log = _open(path)
    _validate(log)
    consumers: list[Any] = []
    try:
        consumers = [_member(log, i, max_poll_records=5) for i in range(members)]
        seconds, _, once = _poll_until_settled(consumers, partitions, budget_s)
        if seconds is None:
            return _not_settled(budget_s, once, partitions)
        rounds_ms = []
        for _ in range(5):
            s = time.perf_counter()
            for c in consumers:
                c.poll(timeout_ms=0)
            rounds_ms.append((time.perf_counter() - s) * 1000)
        last_records = dict.fromkeys(range(members), time.perf_counter())
        gaps = [0.0] * members
        t0 = time.perf_counter()
        newcomer = _member(log, members, max_poll_records=5)
        everyone = [*consumers, newcomer]
        consumed = 0
        while True:
            for k, c in enumerate(everyone):
                got = c.poll(timeout_ms=0)
                if k < members and got:
                    now = time.perf_counter()
                    gaps[k] = max(gaps[k], now - last_records[k])
                    last_records[k] = now
                    consumed += sum(len(v) for v in got.values())
            settled, once = _owned_once(_snapshot(everyone), partitions)
            if settled:
                break
            if time.perf_counter() - t0 > budget_s:
                return _not_settled(budget_s, once, partitions, "settled again")
        now = time.perf_counter()
        gaps = [max(g, now - last_records[k]) for k, g in enumerate(gaps)]
        total = now - t0
        consumers = everyone
    finally:
        _close_all(consumers)
        log.close()
    return result(
        partitions,
        total,
        0,
        max_pause_ms=round(max(gaps) * 1000, 1),
        max_pause_rounds=round(max(gaps) * 1000 / statistics.median(rounds_ms), 2),
        median_pause_ms=round(statistics.median(gaps) * 1000, 1),
        round_ms=round(statistics.median(rounds_ms), 1),
        rebalance_s=round(total, 3),
        records_consumed_meanwhile=consumed,
    )
