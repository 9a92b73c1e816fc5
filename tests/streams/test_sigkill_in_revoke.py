"""Exactly-once when a process dies inside a rebalance with an open transaction: three processes of one
application (in-memory stores, the default; a count per user over 2,000 users and an echo of every input).
Each round a fourth process joins; the group asks the members to give their partitions back, and one of them
is SIGKILLed inside its revocation, before the commit that would close its transaction (its processed
records and changelog updates written but not committed). The group is seen rebalancing at that moment
(``describe_group``). The joiner is SIGKILLed later while it processes, the killed member restarts under its
instance id. At the end every input has exactly one committed echo, every user's counts are 1..n once and
in order, the committed store equals the model and the committed offsets are at the log end."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from streams_helpers import Child, committed_records, read_echo_counts, stop_all, wait_for

import pylog
from pylog.streams import App
from pylog.streams.runtime import StreamThread

USERS = 2000
CHUNK = 2000
ROUNDS = 3
INPUT = CHUNK * (ROUNDS + 2)
APP = "revoke"


def _worker(path: str, instance: str, gate: str) -> None:
    """Runs until SIGTERM. When the file ``gate + instance`` exists, the process's next revocation writes
    ``gate + instance + ".held"`` (the open transaction's input partitions and whether it is open) and waits
    there until the process is killed (a guard ends the wait if it never is)."""
    real_revoke = StreamThread.revoke

    def revoke(self: StreamThread, partitions: set[Any], lost: bool = False) -> None:
        if not lost and os.path.exists(gate + instance):
            held = gate + instance + ".held"
            with open(held + ".tmp", "w") as f:
                f.write(f"{len(self._offsets)} partitions processed, transaction open: {self._in_txn}")
            os.replace(held + ".tmp", held)
            threading.Event().wait(120)
        real_revoke(self, partitions, lost)

    StreamThread.revoke = revoke  # type: ignore[method-assign]
    with pylog.open(path) as log:
        app = App(log, APP, instance_id=instance, commit_interval_ms=200, max_poll_records=20)
        events = app.stream("in").peek(lambda k, v: time.sleep(0.001))  # a member always has work
        events.map_values(lambda v: v["i"]).to("echo")
        events.group_by(lambda k, v: v["user"]).count(name="counts").to_stream().to("counts-out")
        app.run()


def _fork(path: str, instance: str, gate: str) -> Child:
    return Child(lambda: _worker(path, instance, gate))


def _produce(path: str, start: int, stop: int) -> None:
    with pylog.open(path) as log:
        producer = log.producer()
        for i in range(start, stop):
            producer.send("in", {"i": i, "user": f"u{i % USERS}"}, key=f"k{i % 101}")
        producer.close()


def test_a_process_killed_in_its_revocation_with_an_open_transaction(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    gate = str(tmp_path / "hold-revoke-")
    with pylog.open(path) as log:
        log.create_topic("in", partitions=6)
        log.create_topic("echo", partitions=2)
        log.create_topic("counts-out", partitions=2)
    started = time.monotonic()
    apps: dict[str, Child] = {}
    seen: list[str] = []
    open_kills = 0
    try:
        _produce(path, 0, CHUNK)
        for name in ("w0", "w1", "w2"):
            apps[name] = _fork(path, name, gate)
        with pylog.open(path) as log:

            def stable(members: int) -> bool:
                if APP not in log.list_groups():
                    return False
                group = log.describe_group(APP)
                return group.state == "Stable" and len(group.members) == members

            for r in range(ROUNDS):
                wait_for(lambda: stable(3), "the three members to settle")
                wait_for(lambda: len(committed_records(log, "counts-out")) > 0, "counts to be committed")
                _produce(path, (r + 1) * CHUNK, (r + 2) * CHUNK)
                victim, joiner = f"w{r}", f"j{r}"
                Path(gate + victim).touch()
                apps[joiner] = _fork(path, joiner, gate)
                held = Path(gate + victim + ".held")
                wait_for(held.exists, f"{victim} to be held in its revocation")
                state = log.describe_group(APP).state
                apps.pop(victim).kill()
                text = held.read_text()
                seen.append(f"{victim} killed in its revocation ({text}), group {state}")
                open_kills += text.endswith("True") and not text.startswith("0 ")
                assert state != "Stable", "the victim was killed inside a rebalance"
                held.unlink()
                Path(gate + victim).unlink()
                wait_for(lambda: stable(3), "the group to settle without the victim")
                apps.pop(joiner).kill()  # while it processes
                apps[victim] = _fork(path, victim, gate)
            _produce(path, (ROUNDS + 1) * CHUNK, INPUT)
            wait_for(
                lambda: len(committed_records(log, "counts-out")) >= INPUT, "the processes to finish", 120.0
            )
            wait_for(lambda: sum(log.group_lag(APP).values()) == 0, "the last commits")
        stop_all(apps)
    finally:
        for app in apps.values():
            app.kill()
    out = read_echo_counts(path, APP)
    print(
        f"{2 * ROUNDS} kills in {time.monotonic() - started:.1f} s, {open_kills} with processed records in an "
        f"open transaction ({'; '.join(seen)}): {out.written} echoes "
        f"written, {sum(out.echo.values())} committed, {out.duplicates()} duplicates, {out.missing(INPUT)} missing"
    )
    out.check_exactly_once(INPUT, USERS)
