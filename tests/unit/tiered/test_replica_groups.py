"""Consumer groups on a read replica: a log opened read-only from its object store, its groups kept in a
local ``groups_dir`` (pylog.groups.replica).

The writing log tiers a topic; replicas open the URL with a shared ``groups_dir``. Members in one thread are
stepped deterministically (a heartbeat, then a poll, as in tests/unit/test_groups.py) with a ManualClock;
members in threads and processes run on the real clock with generous deadlines (nothing is timed). Every
check compares with the model of what the writer produced.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import pylog
import pylog.log
from pylog.clock import ManualClock
from pylog.errors import (
    ConfigError,
    GroupNotEmptyError,
    ReadOnlyLogError,
    RemoteStorageError,
    UnknownGroupError,
)
from pylog.structs import TopicPartition

TS0 = 1_700_000_000_000
PARTITIONS = 6
Model = dict[tuple[int, int], int]  # (partition, offset) -> value


def _writer(tmp_path: Path, remote: tuple[str, dict[str, Any]]) -> pylog.Log:
    url, options = remote
    return pylog.open(
        tmp_path / "log",
        remote_storage=url,
        remote_storage_options=options,
        remote_log_manager_task_interval_ms=-1,
        clock=ManualClock(TS0),
    )


def _produce_and_tier(log: pylog.Log, n: int, start: int = 0, topic: str = "t") -> Model:
    """Produce values ``start..start+n`` (keyed: spread over the partitions), roll and tier every partition."""
    if not log.has_topic(topic):
        log.create_topic(topic, PARTITIONS, remote_storage_enable=True, segment_bytes=4096)
    p = log.producer()
    futures = [(i, p.send(topic, i, key=str(i))) for i in range(start, start + n)]
    p.flush()
    model = {}
    for i, fut in futures:
        meta = fut.get()
        model[(meta.partition, meta.offset)] = i
    p.close()
    for part in range(PARTITIONS):
        log.topic(topic).partition(part).roll()
    log.tier()
    return model


def _ends(model: Model) -> dict[TopicPartition, int]:
    ends = dict.fromkeys(_all(), 0)
    for p, offset in model:
        tp = TopicPartition("t", p)
        ends[tp] = max(ends[tp], offset + 1)
    return ends


def _all() -> set[TopicPartition]:
    return {TopicPartition("t", p) for p in range(PARTITIONS)}


def _replica(remote: tuple[str, dict[str, Any]], groups_dir: Path | str, **kw: Any) -> pylog.Log:
    url, options = remote
    return pylog.open(url, read_only=True, remote_storage_options=options, groups_dir=groups_dir, **kw)


class CommitOnRevoke(pylog.ConsumerRebalanceListener):
    """Commits the positions of revoked partitions (orderly rebalances then lose and repeat nothing)."""

    def __init__(self) -> None:
        self.consumer: Any = None

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.consumer.commit({tp: self.consumer.position(tp) for tp in revoked})

    def on_partitions_lost(self, lost: list[TopicPartition]) -> None:
        raise AssertionError(f"orderly rebalances lose nothing: {lost}")


def _member(log: pylog.Log, *, commit_on_revoke: bool = True, **kw: Any) -> Any:
    listener = CommitOnRevoke() if commit_on_revoke else None
    c = log.consumer(
        group_id=kw.pop("group_id", "g"),
        auto_offset_reset="earliest",
        enable_auto_commit=kw.pop("enable_auto_commit", False),
        heartbeat_interval_ms=100,
        **kw,
    )
    if listener is not None:
        listener.consumer = c
    c.subscribe(["t"], listener=listener)
    return c


def _settle(consumers: list[Any], done: Callable[[], bool], timeout: float = 20.0) -> None:
    """Heartbeat and poll every consumer (positions do not move) until ``done()``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in consumers:
            c._group.heartbeat()
            c.poll(timeout_ms=1, max_records=1, update_offsets=False)
        if done():
            return
    raise AssertionError("the group did not settle")


def _balanced(consumers: list[Any]) -> Callable[[], bool]:
    def check() -> bool:
        if len({c._group.generation for c in consumers}) != 1:
            return False
        sets = [c.assignment() for c in consumers]
        sizes = [len(s) for s in sets]
        return set().union(*sets) == _all() and sum(sizes) == PARTITIONS and max(sizes) - min(sizes) <= 1

    return check


def _read_until(c: Any, n: int, rounds: int = 500) -> Model:
    """What ``c`` polls (without waiting) until it has ``n`` records or ``rounds`` polls were made."""
    got: Model = {}
    for _ in range(rounds):
        for tp, records in c.poll(timeout_ms=0).items():
            got.update({(tp.partition, r.offset): r.value for r in records})
        if len(got) >= n:
            break
    return got


@pytest.fixture
def groups_dir(tmp_path: Path) -> Path:
    return tmp_path / "groups"


# -- members share the partitions ---------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["range", "roundrobin", "cooperative-sticky"])
def test_three_members_split_the_partitions_and_read_each_record_once_across_a_leave(
    tmp_path: Path, groups_dir: Path, strategy: str
) -> None:
    remote = ((tmp_path / "remote").as_uri(), {})
    with _writer(tmp_path, remote) as log:
        model = _produce_and_tier(log, 600)
    clock = ManualClock(TS0)
    seen: list[tuple[int, int, int]] = []
    with _replica(remote, groups_dir, clock=clock) as ro:
        members = [_member(ro, max_poll_records=5, partition_assignment_strategy=strategy)]
        step = 0
        while len(seen) < len(model) and step < 5000:
            step += 1
            for c in list(members):
                c._group.heartbeat()
                for tp, records in c.poll(timeout_ms=0).items():
                    seen.extend((tp.partition, r.offset, r.value) for r in records)
            if step in (5, 10):
                members.append(_member(ro, max_poll_records=5, partition_assignment_strategy=strategy))
            if step == 12:
                _settle(members, _balanced(members))  # three members, two partitions each
                assert len(ro.describe_group("g").members) == 3
            if step == 30:
                members.pop(0).close()  # a leave: its partitions move, its positions were committed
        assert 30 < step < 5000  # the joins and the leave happened while records were being read
        assert len(seen) == len({(p, o) for p, o, _ in seen})  # exactly once
        assert {(p, o): v for p, o, v in seen} == model
        _settle(members, _balanced(members))
        for c in members:
            c.close()  # commits on revoke
        assert {tp: om.offset for tp, om in ro.group_offsets("g").items()} == _ends(model)
        assert ro.group_lag("g") == dict.fromkeys(_all(), 0)
        assert ro.describe_group("g").state == "Empty"
    # pylog created only its record and the group's own directory there
    assert sorted(os.listdir(groups_dir)) == ["__groups", "replica_of"]
    assert os.listdir(groups_dir / "__groups") == ["g-g"]


def test_two_members_in_threads_with_their_own_replicas_read_everything_once(
    tmp_path: Path, groups_dir: Path
) -> None:
    """Two threads, each with its own open of the URL (as two processes would), on the real clock: the
    group splits the partitions, each commits what it read, the second to finish closes last."""
    remote = ((tmp_path / "remote").as_uri(), {})
    with _writer(tmp_path, remote) as log:
        model = _produce_and_tier(log, 900)
    ends = _ends(model)
    got: dict[int, list[tuple[int, int, int]]] = {0: [], 1: []}
    owned: dict[int, set[TopicPartition]] = {0: set(), 1: set()}
    errors: list[BaseException] = []
    joined = threading.Barrier(2)

    def run(i: int) -> None:
        try:
            with _replica(remote, groups_dir) as ro:
                c = _member(ro, max_poll_records=20)
                joined.wait(30)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:  # both hold partitions before reading (positions stay)
                    c.poll(timeout_ms=20, max_records=1, update_offsets=False)
                    if len(ro.describe_group("g").members) == 2 and c.assignment():
                        break
                while time.monotonic() < deadline:
                    batch = c.poll(timeout_ms=20)
                    for tp, records in batch.items():
                        got[i].extend((tp.partition, r.offset, r.value) for r in records)
                    if batch:
                        c.commit()
                    owned[i] |= c.assignment()
                    committed = {tp: om.offset for tp, om in ro.group_offsets("g").items()}
                    if committed == ends:
                        break
                c.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    everything = got[0] + got[1]
    assert len(everything) == len({(p, o) for p, o, _ in everything}) == len(model)  # exactly once
    assert {(p, o): v for p, o, v in everything} == model
    assert owned[0] and owned[1]  # both members held partitions


_WORKER = textwrap.dedent(
    """
    import json, sys, time
    import pylog

    url, groups_dir, out, mode, expected = sys.argv[1:6]
    ends = {int(k): v for k, v in json.loads(expected).items()}
    with pylog.open(url, read_only=True, groups_dir=groups_dir) as ro, open(out, "a", buffering=1) as journal:
        class Commit(pylog.ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                c.commit({tp: c.position(tp) for tp in revoked})
        c = ro.consumer(group_id="g", auto_offset_reset="earliest", enable_auto_commit=False,
                        max_poll_records=10, heartbeat_interval_ms=100, session_timeout_ms=30_000)
        c.subscribe(["t"], listener=Commit())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait for the other member (positions do not move)
            c.poll(timeout_ms=20, max_records=1, update_offsets=False)
            if len(ro.describe_group("g").members) == 2 and c.assignment():
                break
        journal.write(json.dumps(["owned", sorted(tp.partition for tp in c.assignment())]) + "\\n")
        if mode == "idle":
            while True:
                c.poll(timeout_ms=50, max_records=1, update_offsets=False)
        while time.monotonic() < deadline:
            batch = c.poll(timeout_ms=20)
            for tp, records in batch.items():
                journal.write(json.dumps(["read", tp.partition, [[r.offset, r.value] for r in records]]) + "\\n")
            if batch:
                c.commit()
            committed = {tp.partition: om.offset for tp, om in ro.group_offsets("g").items()}
            if committed == ends:
                break
        c.close()
    """
)


def _spawn(url: str, groups_dir: Path, out: Path, mode: str, ends: dict[TopicPartition, int]) -> Any:
    expected = json.dumps({tp.partition: end for tp, end in ends.items()})
    return subprocess.Popen(
        [sys.executable, "-c", _WORKER, url, str(groups_dir), str(out), mode, expected],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _journal(out: Path) -> list[Any]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def test_two_processes_share_the_groups_dir_and_read_everything_once(
    tmp_path: Path, groups_dir: Path
) -> None:
    remote = ((tmp_path / "remote").as_uri(), {})
    with _writer(tmp_path, remote) as log:
        model = _produce_and_tier(log, 900)
    ends = _ends(model)
    outs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    procs = [_spawn(remote[0], groups_dir, out, "consume", ends) for out in outs]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    read: list[tuple[int, int, int]] = []
    for out in outs:
        entries = _journal(out)
        assert entries[0][0] == "owned" and entries[0][1]  # each process held partitions
        read += [(e[1], off, v) for e in entries if e[0] == "read" for off, v in e[2]]
    assert len(read) == len({(p, o) for p, o, _ in read}) == len(model)  # exactly once, across the leave
    assert {(p, o): v for p, o, v in read} == model
    with _replica(remote, groups_dir) as ro:
        assert {tp: om.offset for tp, om in ro.group_offsets("g").items()} == ends
        assert ro.describe_group("g").members == []


def test_a_killed_member_process_is_expelled_and_its_partitions_move(
    tmp_path: Path, groups_dir: Path
) -> None:
    remote = ((tmp_path / "remote").as_uri(), {})
    with _writer(tmp_path, remote) as log:
        model = _produce_and_tier(log, 300)
    out = tmp_path / "idle.jsonl"
    with _replica(remote, groups_dir) as ro:
        a = _member(ro)
        proc = _spawn(remote[0], groups_dir, out, "idle", _ends(model))
        try:
            deadline = time.monotonic() + 60
            while not _journal(out) and time.monotonic() < deadline:
                a.poll(timeout_ms=20, max_records=1, update_offsets=False)
            theirs = set(_journal(out)[0][1])
            assert theirs and len(ro.describe_group("g").members) == 2
            while len(a.assignment()) + len(theirs) != PARTITIONS and time.monotonic() < deadline:
                a.poll(timeout_ms=20, max_records=1, update_offsets=False)  # a adopts the latest assignment
            mine = {tp.partition for tp in a.assignment()}
            assert mine and not mine & theirs and len(mine | theirs) == PARTITIONS
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
        while a.assignment() != _all() and time.monotonic() < deadline:
            a.poll(timeout_ms=20, max_records=1, update_offsets=False)
        assert a.assignment() == _all()  # the dead member's liveness lock was free: it was expelled
        assert len(ro.describe_group("g").members) == 1
        a.close()


# -- committed offsets, lag, new uploads, admin ---------------------------------------------------------------


def test_committed_offsets_survive_reopening_and_lag_follows_the_replica_end(
    tmp_path: Path, remote: tuple[str, dict[str, Any]], groups_dir: Path
) -> None:
    clock = ManualClock(TS0)
    with _writer(tmp_path, remote) as log:
        model = _produce_and_tier(log, 300)
        ends = _ends(model)
        commit = {tp: end // 2 for tp, end in ends.items()}
        with _replica(remote, groups_dir, clock=clock) as ro:
            c = _member(ro, commit_on_revoke=False)
            _settle([c], lambda: c.assignment() == _all())
            c.commit(commit)
            c.close(autocommit=False)
        with _replica(remote, groups_dir, clock=clock) as ro:  # opened again: the offsets are there
            assert {tp: om.offset for tp, om in ro.group_offsets("g").items()} == commit
            assert ro.group_lag("g") == {tp: ends[tp] - commit[tp] for tp in ends}
            assert ro.list_groups() == ["g"]
            c = _member(ro, commit_on_revoke=False, enable_auto_commit=True, auto_commit_interval_ms=1000)
            assert {tp: c.committed(tp) for tp in _all()} == commit
            want = {k: v for k, v in model.items() if k[1] >= commit[TopicPartition("t", k[0])]}
            assert _read_until(c, len(want)) == want

            # the writer tiers more while the member reads: seen once the replica reads its manifests again
            more = _produce_and_tier(log, 200, start=300)
            clock.advance(1000)  # the cached manifests are a second old: the next reads look again
            assert _read_until(c, len(more)) == more
            new_ends = _ends(model | more)
            clock.advance(1000)  # auto-commit is due
            c.poll(timeout_ms=0)
            assert {tp: om.offset for tp, om in ro.group_offsets("g").items()} == new_ends
            assert ro.group_lag("g") == dict.fromkeys(_all(), 0)
            c.close(autocommit=False)

            # admin on the replica's groups: reset (lag = replica end - committed) and delete
            reset = {tp: end - 3 for tp, end in new_ends.items()}
            ro.reset_group_offsets("g", reset)
            assert ro.group_lag("g") == dict.fromkeys(_all(), 3)
            ro.delete_group("g")
            assert ro.list_groups() == []
            with pytest.raises(UnknownGroupError):
                ro.describe_group("g")
    assert sorted(os.listdir(groups_dir)) == ["__groups", "replica_of"]
    assert os.listdir(groups_dir / "__groups") == []  # only the group's own files went


def test_admin_refuses_a_group_with_live_members_on_the_replica(
    tmp_path: Path, groups_dir: Path, clock: ManualClock
) -> None:
    remote = ((tmp_path / "remote").as_uri(), {})
    with _writer(tmp_path, remote) as log:
        _produce_and_tier(log, 60)
    with _replica(remote, groups_dir, clock=clock) as ro:
        c = _member(ro)
        _settle([c], lambda: c.assignment() == _all())
        with pytest.raises(GroupNotEmptyError):
            ro.delete_group("g")
        with pytest.raises(GroupNotEmptyError):
            ro.reset_group_offsets("g", dict.fromkeys(_all(), 0))
        desc = ro.describe_group("g")
        assert desc.state == "Stable" and set(desc.members[0].assignment) == _all()
        c.close()


# -- refusals ---------------------------------------------------------------------------------------------


@pytest.fixture
def tiered(tmp_path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    remote = ((tmp_path / "remote").as_uri(), {})
    with _writer(tmp_path, remote) as log:
        _produce_and_tier(log, 30)
    yield remote


def _tree(path: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(path)): (p.read_bytes() if p.is_file() else None) for p in sorted(path.rglob("*"))
    }


def test_groups_on_a_replica_without_groups_dir_are_refused_naming_the_option(
    tiered: tuple[str, dict[str, Any]],
) -> None:
    url, options = tiered
    with pylog.open(url, read_only=True, remote_storage_options=options) as ro:
        for call in (
            lambda: ro.consumer("t", group_id="g"),
            ro.list_groups,
            lambda: ro.describe_group("g"),
            lambda: ro.group_lag("g"),
            lambda: ro.delete_group("g"),
            lambda: ro.reset_group_offsets("g", {}),
        ):
            with pytest.raises(ReadOnlyLogError, match="groups_dir"):
                call()
        c = ro.consumer("t")  # without a group it reads
        assert c.assignment() == _all()
        c.close()


def test_bad_groups_dirs_are_refused_and_left_untouched(
    tmp_path: Path, tiered: tuple[str, dict[str, Any]]
) -> None:
    with pytest.raises(ConfigError, match="parent"):
        _replica(tiered, tmp_path / "missing" / "groups")
    assert not (tmp_path / "missing").exists()
    a_file = tmp_path / "file"
    a_file.write_bytes(b"x")
    with pytest.raises(ConfigError, match="not a directory"):
        _replica(tiered, a_file)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_bytes(b"mine")
    with pytest.raises(ConfigError, match=r"notes\.txt"):
        _replica(tiered, other)
    assert _tree(other) == {"notes.txt": b"mine"}
    log_dir = tmp_path / "log"  # the writer's log directory
    before = _tree(log_dir)
    with pytest.raises(ConfigError, match="log directory"):
        _replica(tiered, log_dir)
    assert _tree(log_dir) == before
    with pytest.raises(ConfigError, match="object store"):  # a log directory keeps its groups in itself
        pylog.open(log_dir, read_only=True, groups_dir=tmp_path / "g2")
    assert not (tmp_path / "g2").exists()
    with pytest.raises(ConfigError, match="path"):
        _replica(tiered, 42)  # type: ignore[arg-type]


def test_a_groups_dir_serves_one_url_only(tmp_path: Path, tiered: tuple[str, dict[str, Any]]) -> None:
    url, _ = tiered
    second = ((tmp_path / "remote2").as_uri(), {})
    with _writer(tmp_path / "w2", second) as log:
        _produce_and_tier(log, 10)
    groups = tmp_path / "groups"
    with _replica(tiered, groups) as ro:
        c = _member(ro)
        c.close()
    with _replica((url + "/", {}), groups):  # the same URL, written with a trailing slash
        pass
    before = _tree(groups)
    with pytest.raises(ConfigError, match="not of"):
        _replica(second, groups)
    assert _tree(groups) == before
    # a record that is not pylog's is refused too
    (groups / "replica_of").write_bytes(b"something else\n{}")
    with pytest.raises(ConfigError, match="replica_of"):
        _replica(tiered, groups)


def test_a_url_that_cannot_be_opened_leaves_no_groups_dir(
    tmp_path: Path, tiered: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(store: Any) -> Any:
        raise RemoteStorageError("list: the store cannot be reached", key="")

    monkeypatch.setattr(pylog.log, "remote_topics", unreachable)
    groups = tmp_path / "groups"
    with pytest.raises(RemoteStorageError, match="cannot be reached"):
        _replica(tiered, groups)
    assert not groups.exists()
    monkeypatch.undo()
    with _replica(tiered, groups) as ro:  # the store answers: the directory is set up
        _member(ro).close()
    assert (groups / "replica_of").is_file()


def test_an_unwritable_groups_dir_is_refused(
    tmp_path: Path, tiered: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    groups = tmp_path / "groups"
    groups.mkdir()
    real = os.access

    def access(path: Any, mode: int, **kw: Any) -> bool:  # as for a read-only mount (even for root)
        if os.fspath(path) == str(groups) and mode & os.W_OK:
            return False
        return real(path, mode, **kw)

    monkeypatch.setattr(os, "access", access)
    with pytest.raises(ReadOnlyLogError, match="cannot be written"):
        _replica(tiered, groups)
    assert os.listdir(groups) == []


def test_a_new_groups_dir_holds_only_pylogs_record_until_a_group_is_used(
    tmp_path: Path, tiered: tuple[str, dict[str, Any]]
) -> None:
    groups = tmp_path / "groups"
    with _replica(tiered, groups) as ro:
        assert os.listdir(groups) == ["replica_of"]
        assert ro.list_groups() == []
        assert ro.topics() == ["t"]
    empty = tmp_path / "empty"
    empty.mkdir()  # an existing empty directory is taken as well
    with _replica(tiered, empty):
        assert os.listdir(empty) == ["replica_of"]
