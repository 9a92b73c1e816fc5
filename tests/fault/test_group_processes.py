"""A consumer group of worker processes on one directory: killed and frozen members (G1, G2, I7).

Each worker commits after every batch and logs what it processed (generation, partition, offset) to its own
file first, so the parent can check afterwards: every record processed at least once; no partition processed
by two processes in the same generation (G1); a member frozen past its session cannot commit (G2);
committed offsets end at the log end and never went backwards (I7).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

import pylog
from pylog.errors import CommitFailedError, UnknownPartitionError
from pylog.structs import TopicPartition

RECORDS = 6000
PARTITIONS = 6


def _worker(path: str, out: str) -> None:
    with pylog.open(path) as log, open(out, "a", buffering=1) as journal:
        consumer = log.consumer(
            group_id="workers",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            max_poll_records=50,
            session_timeout_ms=1_500,
            heartbeat_interval_ms=100,
        )
        consumer.subscribe(["jobs"])
        while True:
            batch = consumer.poll(timeout_ms=50)
            if not batch:
                continue
            generation = consumer._group.generation
            for tp, records in batch.items():
                journal.write(json.dumps([generation, tp.partition, [r.offset for r in records]]) + "\n")
            time.sleep(0.03)  # processing: most of a worker's time is spent between fetch and commit
            try:
                consumer.commit({tp: records[-1].offset + 1 for tp, records in batch.items()})
                journal.write(json.dumps(["committed", generation]) + "\n")
            except CommitFailedError:
                journal.write(json.dumps(["fenced", generation]) + "\n")


def _fork_worker(path: str, out: str) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            _worker(path, out)
        finally:
            os._exit(1)
    return pid


def _setup(tmp: str) -> str:
    path = os.path.join(tmp, "log")
    with pylog.open(path) as log:
        log.create_topic("jobs", partitions=PARTITIONS)
        p = log.producer()
        for i in range(RECORDS):
            p.send("jobs", i, key=str(i))
        p.close()
    return path


def _wait_done(path: str, timeout: float = 120) -> dict[TopicPartition, int]:
    deadline = time.monotonic() + timeout
    seen: dict[TopicPartition, int] = {}
    with pylog.open(path) as log:
        ends = {
            tp: log.topic("jobs").partition(tp.partition).log_end_offset
            for tp in log.topic("jobs").partitions()
        }
        while time.monotonic() < deadline:
            if "workers" in log.list_groups():
                offsets = {tp: om.offset for tp, om in log.group_offsets("workers").items()}
                for tp, off in offsets.items():
                    assert off >= seen.get(tp, 0), f"I7: committed offset of {tp} went backwards"
                    seen[tp] = off
                if offsets == ends:
                    return offsets
            time.sleep(0.05)
    raise AssertionError(f"the group did not finish: committed {seen}")


def _journals(paths: list[str]) -> list[list[Any]]:
    out = []
    for p in paths:
        with open(p) as f:
            out.append([json.loads(line) for line in f if line.endswith("\n")])
    return out


def _check_g1_and_coverage(journals: list[list[Any]]) -> None:
    owner: dict[tuple[int, int], int] = {}
    processed: set[tuple[int, int]] = set()
    for who, entries in enumerate(journals):
        for e in entries:
            if isinstance(e[0], str):
                continue
            generation, partition, offsets = e
            key = (generation, partition)
            assert owner.setdefault(key, who) == who, (
                f"G1: partition {partition} processed by two members in generation {generation}"
            )
            processed.update((partition, o) for o in offsets)
    with_offsets = {p: sorted(o for q, o in processed if q == p) for p in range(PARTITIONS)}
    assert sum(len(v) for v in with_offsets.values()) == RECORDS
    for offsets in with_offsets.values():
        assert offsets == list(range(len(offsets)))  # no gap: every record processed


def test_a_killed_worker_is_replaced_and_nothing_is_lost(tmp_path: object) -> None:
    tmp = str(tmp_path)
    path = _setup(tmp)
    outs = [os.path.join(tmp, f"w{i}.jsonl") for i in range(3)]
    pids = [_fork_worker(path, o) for o in outs]
    try:
        deadline = time.monotonic() + 60
        with pylog.open(path) as log:
            while time.monotonic() < deadline:
                done = (
                    sum(om.offset for om in log.group_offsets("workers").values())
                    if "workers" in log.list_groups()
                    else 0
                )
                if done > RECORDS // 3:
                    break
                time.sleep(0.02)
        os.kill(pids[1], signal.SIGKILL)
        os.waitpid(pids[1], 0)
        _wait_done(path)
    finally:
        for pid in (pids[0], pids[2]):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    _check_g1_and_coverage(_journals(outs))


def _has_batch(journal: str) -> bool:
    try:
        with open(journal) as f:
            return any(line.startswith("[") and not line.startswith('["') for line in f)
    except FileNotFoundError:
        return False


def test_a_frozen_worker_is_expelled_and_cannot_commit_when_it_wakes(tmp_path: object) -> None:
    tmp = str(tmp_path)
    path = _setup(tmp)
    outs = [os.path.join(tmp, f"w{i}.jsonl") for i in range(3)]
    pids = [_fork_worker(path, o) for o in outs]
    try:
        deadline = time.monotonic() + 60
        while not _has_batch(outs[0]):  # frozen while it is a member working on records, not before
            assert time.monotonic() < deadline, "the worker never got records"
            time.sleep(0.01)
        os.kill(pids[0], signal.SIGSTOP)
        time.sleep(3.0)  # twice its session timeout: the others expel it and take its partitions
        os.kill(pids[0], signal.SIGCONT)
        _wait_done(path)
        time.sleep(0.5)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    journals = _journals(outs)
    _check_g1_and_coverage(journals)
    fenced = [e for e in journals[0] if e[0] == "fenced"]
    assert fenced, "G2: the frozen member's commit after waking was not refused"


_DELETE = 'import sys, pylog\nwith pylog.open(sys.argv[1]) as log:\n    log.delete_topic("jobs")\n'
_CREATE = textwrap.dedent(
    """
    import sys
    import pylog

    with pylog.open(sys.argv[1]) as log:
        log.create_topic("jobs", partitions=2)
        producer = log.producer()
        for i in range(10):
            producer.send("jobs", -i, key=str(i))
        producer.close()
    """
)


def _poll_until(consumer: Any, done: Any, timeout: float = 30) -> list[Any]:
    values: list[Any] = []
    deadline = time.monotonic() + timeout
    while not done(values) and time.monotonic() < deadline:
        for tp, records in consumer.poll(timeout_ms=50).items():
            values += [r.value for r in records if tp.topic == "jobs"]
    return values


def test_a_topic_deleted_by_another_process_leaves_the_group_and_comes_back(tmp_path: object) -> None:
    """Another process deletes a subscribed topic, then (once the member's assignment has let go of it)
    creates it again with fewer partitions: the member's polls go on, its assignment follows the new
    partitions, it reads the new records, and close() succeeds."""
    path = _setup(str(tmp_path))
    with pylog.open(path) as log:
        log.create_topic("other")
        consumer = log.consumer(
            group_id="g", auto_offset_reset="earliest", heartbeat_interval_ms=100, max_poll_records=1000
        )
        consumer.subscribe(["jobs", "other"])
        reader = log.consumer(auto_offset_reset="earliest")
        reader.assign([TopicPartition("jobs", 5)])
        assert len(_poll_until(consumer, lambda v: len(v) >= RECORDS)) == RECORDS
        subprocess.run([sys.executable, "-c", _DELETE, path], check=True, timeout=60)
        _poll_until(consumer, lambda _: consumer.assignment() == {TopicPartition("other", 0)})
        assert consumer.assignment() == {TopicPartition("other", 0)}
        subprocess.run([sys.executable, "-c", _CREATE, path], check=True, timeout=60)
        new_values = _poll_until(consumer, lambda v: len(v) >= 10)
        assert sorted(new_values) == sorted(-i for i in range(10))
        assert consumer.assignment() == {
            TopicPartition("jobs", 0),
            TopicPartition("jobs", 1),
            TopicPartition("other", 0),
        }
        consumer.close()
        with pytest.raises(UnknownPartitionError):  # partition 5 is gone: the topic has 2 partitions now
            reader.poll(timeout_ms=0)
        reader.close()


# -- a hundred members in eight processes -----------------------------------------------------------------------

MANY_PARTITIONS = 200
MANY_RECORDS = 16_000
MANY_PROCESSES = 8
MANY_MEMBERS = 100


def _many_worker(path: str, out: str, first: int, count: int) -> None:
    """``count`` members in one process, polled in turn; each commits after every batch it processed, and
    journals (member, generation, partition, offsets) first."""
    with pylog.open(path) as log, open(out, "a", buffering=1) as journal:
        members = [
            log.consumer(
                group_id="many",
                client_id=f"m{first + i}",
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                max_poll_records=10,
            )
            for i in range(count)
        ]
        for m in members:
            m.subscribe(["jobs"])
        while True:
            idle = True
            for k, consumer in enumerate(members):
                batch = consumer.poll(timeout_ms=0)
                if not batch:
                    continue
                idle = False
                generation = consumer._group.generation
                for tp, records in batch.items():
                    line = [first + k, generation, tp.partition, [r.offset for r in records]]
                    journal.write(json.dumps(line) + "\n")
                try:
                    consumer.commit({tp: records[-1].offset + 1 for tp, records in batch.items()})
                except CommitFailedError:
                    journal.write(json.dumps(["fenced", first + k]) + "\n")
            if idle:
                time.sleep(0.005)


def _counts() -> list[int]:
    """Members per worker process."""
    return [
        MANY_MEMBERS // MANY_PROCESSES + (1 if k < MANY_MEMBERS % MANY_PROCESSES else 0)
        for k in range(MANY_PROCESSES)
    ]


def _fork_many(path: str, tmp: str) -> tuple[list[int], list[str]]:
    pids, outs, first = [], [], 0
    for k, count in enumerate(_counts()):
        out = os.path.join(tmp, f"p{k}.jsonl")
        pid = os.fork()
        if pid == 0:
            try:
                _many_worker(path, out, first, count)
            finally:
                os._exit(1)
        pids.append(pid)
        outs.append(out)
        first += count
    return pids, outs


def _group_size(log: Any) -> int:
    return len(log.describe_group("many").members) if "many" in log.list_groups() else 0


def _produce_many(log: Any, n: int, start: int) -> dict[TopicPartition, int]:
    p = log.producer()
    for i in range(start, start + n):
        p.send("jobs", i, partition=i % MANY_PARTITIONS)
    p.close()
    return {
        tp: log.topic("jobs").partition(tp.partition).log_end_offset for tp in log.topic("jobs").partitions()
    }


def test_a_hundred_members_in_eight_processes_share_the_work_and_survive_a_kill(tmp_path: object) -> None:
    """100 members over 8 processes on 200 partitions: the group settles with every member in it, every
    record is processed, no partition by two members in one generation (G1); once all are in, more records
    arrive and one process is SIGKILLed while it has some of them to do: its partitions move to the others.
    A record is processed twice only if the killed process processed it (after its last commit);
    everything else exactly once."""
    tmp = str(tmp_path)
    path = os.path.join(tmp, "log")
    with pylog.open(path) as log:
        log.create_topic("jobs", partitions=MANY_PARTITIONS)
        _produce_many(log, MANY_RECORDS // 4, 0)
    pids, outs = _fork_many(path, tmp)
    victim = -1
    try:
        with pylog.open(path) as log:
            deadline = time.monotonic() + 60
            while _group_size(log) < MANY_MEMBERS or log.describe_group("many").state != "Stable":
                assert time.monotonic() < deadline, f"only {_group_size(log)} members joined"
                time.sleep(0.05)
            described = log.describe_group("many")
            ends = _produce_many(log, MANY_RECORDS - MANY_RECORDS // 4, MANY_RECORDS // 4)
            held: list[list[TopicPartition]] = []  # per process: the partitions its members hold
            for k, count in enumerate(_counts()):
                first = sum(_counts()[:k])
                names = {f"m{i}" for i in range(first, first + count)}
                held.append([tp for m in described.members if m.client_id in names for tp in m.assignment])
            while sum(om.offset for om in log.group_offsets("many").values()) < MANY_RECORDS // 2:
                assert time.monotonic() < deadline, "the group does not consume"
                time.sleep(0.01)
            # The victim is the process with the most work left now (a fast machine may have finished some).
            committed = {tp: om.offset for tp, om in log.group_offsets("many").items()}
            left = [sum(ends[tp] - committed.get(tp, 0) for tp in tps) for tps in held]
            victim = max(range(len(left)), key=left.__getitem__)
            os.kill(pids[victim], signal.SIGKILL)
            committed = {tp: om.offset for tp, om in log.group_offsets("many").items()}
        os.waitpid(pids[victim], 0)
        assert any(committed.get(tp, 0) < ends[tp] for tp in held[victim]), (
            "the killed process had no work left"
        )
        assert _wait_for_many(path, ends) == ends
    finally:
        for k, pid in enumerate(pids):
            if k != victim:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    owner: dict[tuple[int, int], int] = {}
    processed: dict[tuple[int, int], list[int]] = {}
    for k, journal in enumerate(_journals(outs)):
        for e in journal:
            if e[0] == "fenced":
                continue
            member, generation, partition, offsets = e
            assert owner.setdefault((generation, partition), member) == member, (
                f"G1: partition {partition} processed by members {owner[(generation, partition)]} and "
                f"{member} in generation {generation}"
            )
            for o in offsets:
                processed.setdefault((partition, o), []).append(k)
    assert set(processed) == {(tp.partition, o) for tp, end in ends.items() for o in range(end)}
    twice = {key: who for key, who in processed.items() if len(who) > 1}
    assert all(victim in who for who in twice.values()), "a record processed twice without the kill"


def _wait_for_many(
    path: str, ends: dict[TopicPartition, int], timeout: float = 90
) -> dict[TopicPartition, int]:
    deadline = time.monotonic() + timeout
    with pylog.open(path) as log:
        while time.monotonic() < deadline:
            offsets = {tp: om.offset for tp, om in log.group_offsets("many").items()}
            if offsets == ends:
                return offsets
            time.sleep(0.05)
        done = sum(offsets.values())
    raise AssertionError(f"the group did not finish: {done} of {sum(ends.values())} records committed")
