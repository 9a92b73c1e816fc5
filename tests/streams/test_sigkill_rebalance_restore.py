"""Exactly-once when processes of a three-process application die in the middle of a rebalance and in the middle
of a restore. The application keeps a count per user over 3,000 users in SQLite stores (one state directory per
process, as on separate machines) and echoes every input. Each round, a fourth process joins; as soon as the
group is seen rebalancing, one of the three is SIGKILLed; the joiner is SIGKILLed while it restores a store
(it reports the restore through ``App(restore_listener=...)``); the killed member restarts on its old state
directory. Input arrives all along. At the end every input has exactly one committed echo, every user's
counts are 1..n once and in order, the committed store (``read_store``) equals the model, and the committed
offsets are at the log end."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from streams_helpers import Child, committed_records, read_echo_counts, stop_all, wait_for

import pylog
from pylog.streams import App, StateRestoreListener
from pylog.structs import TopicPartition

USERS = 3000
CHUNK = 3000
ROUNDS = 3
INPUT = CHUNK * (ROUNDS + 2)
APP = "rebal"


class _BlockInRestore(StateRestoreListener):
    """Writes ``marker`` when a batch of a restore reached its store and then holds the restore until the
    process is killed (a guard ends the wait if it never is); a restore that reads no record at all writes
    ``marker`` at its end and goes on."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def _mark(self, text: str) -> None:
        tmp = self.marker + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.marker)

    def on_batch_restored(
        self, changelog: TopicPartition, store: str, batch_end_offset: int, num_restored: int
    ) -> None:
        self._mark(f"restoring {changelog.topic}-{changelog.partition} at {batch_end_offset}")
        threading.Event().wait(120)

    def on_restore_end(self, changelog: TopicPartition, store: str, total_restored: int) -> None:
        if not os.path.exists(self.marker):
            self._mark("restored nothing")


def _worker(path: str, instance: str, state_dir: str, marker: str | None) -> None:
    with pylog.open(path) as log:
        app = App(
            log,
            APP,
            instance_id=instance,
            commit_interval_ms=50,
            max_poll_records=200,
            state_dir=state_dir,
            restore_listener=None if marker is None else _BlockInRestore(marker),
        )
        events = app.stream("in")
        events.map_values(lambda v: v["i"]).to("echo")
        events.group_by(lambda k, v: v["user"]).count(name="counts").to_stream().to("counts-out")
        app.run()


def _fork(path: str, instance: str, state_dir: str, marker: str | None = None) -> Child:
    return Child(lambda: _worker(path, instance, state_dir, marker))


def _produce(path: str, start: int, stop: int) -> None:
    with pylog.open(path) as log:
        producer = log.producer()
        for i in range(start, stop):
            producer.send("in", {"i": i, "user": f"u{i % USERS}"}, key=f"k{i % 101}")
        producer.close()


def test_kills_during_a_rebalance_and_during_a_restore_are_exactly_once(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    with pylog.open(path) as log:
        log.create_topic("in", partitions=6)
        log.create_topic("echo", partitions=2)
        log.create_topic("counts-out", partitions=2)
    names = [f"w{i}" for i in range(3)] + [f"j{r}" for r in range(ROUNDS)]
    states = {name: str(tmp_path / "state" / name) for name in names}
    started = time.monotonic()
    apps: dict[str, Child] = {}
    seen: list[str] = []
    try:
        _produce(path, 0, CHUNK)
        for name in ("w0", "w1", "w2"):
            apps[name] = _fork(path, name, states[name])
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
                generation = log.describe_group(APP).generation
                joiner, victim = f"j{r}", f"w{r}"
                marker = str(tmp_path / f"restoring-{joiner}")
                apps[joiner] = _fork(path, joiner, states[joiner], marker)

                def rebalancing(generation: int = generation) -> bool:
                    group = log.describe_group(APP)
                    if group.generation > generation or group.state != "Stable":
                        seen.append(f"{group.state} generation {group.generation}")
                        return True
                    return False

                deadline = time.monotonic() + 60.0  # a guard against a hang, not a speed assertion
                while not rebalancing():
                    assert time.monotonic() < deadline, "timed out waiting for the joiner's rebalance"
                    time.sleep(0.002)
                apps.pop(victim).kill()  # in the middle of the rebalance the joiner started
                wait_for(lambda m=marker: os.path.exists(m), "the joiner to restore a store")
                apps.pop(joiner).kill()  # in the middle of its restore
                seen.append(f"{joiner} killed {Path(marker).read_text()}")
                # back on its old state directory, killed again in its restore, then back for good
                marker = str(tmp_path / f"restoring-{victim}-{r}")
                apps[victim] = _fork(path, victim, states[victim], marker)
                wait_for(lambda m=marker: os.path.exists(m), "the restarted process to restore")
                apps.pop(victim).kill()
                seen.append(f"{victim} killed {Path(marker).read_text()}")
                apps[victim] = _fork(path, victim, states[victim])
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
        f"{3 * ROUNDS} kills in {time.monotonic() - started:.1f} s ({'; '.join(seen)}): {sum(out.echo.values())} "
        f"echoes, {out.duplicates()} duplicates, {out.missing(INPUT)} missing"
    )
    out.check_exactly_once(INPUT, USERS)
