"""Tiered transaction decisions under faults (file:// backend): a failure at every store write of a decisions
upload, and a tiering pass SIGKILLed at spread store calls of its decisions upload. Either way the previous
decisions manifest stays authoritative (remote readers see the earlier read_committed view: held at the last
stable offset, never an aborted record), or the new one is whole; the next pass completes and sweeps what the
killed one left unnamed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import crc32c
import pytest

import pylog
from pylog.clock import ManualClock
from pylog.structs import TopicPartition
from pylog.tiered import decisions
from pylog.tiered import manifest as tiered_manifest
from pylog.tiered.restore import restore
from pylog.tiered.store import ObjectStore
from pylog.tiered.uploader import tier_partition

TS0 = 1_700_000_000_000
Rows = list[tuple[int, bytes]]


class Crash(Exception):
    """The injected failure."""


class FaultyStore(ObjectStore):
    """Raises :class:`Crash` instead of performing the ``fail_at``-th put (1-based)."""

    def __init__(self, url: str, fail_at: int) -> None:
        super().__init__(url)
        self.fail_at = fail_at
        self.writes = 0

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        self.writes += 1
        if self.writes == self.fail_at:
            raise Crash(f"write {self.writes}")
        return super().put(key, data, if_absent=if_absent)


def _transactions(
    log: pylog.Log, names: list[tuple[str, bool]], model: dict[str, list[tuple[int, bytes]]]
) -> None:
    """One transaction per ``(name, commit)``: 12 records each, committed or aborted; ``model[name]`` gets
    the ``(offset, value)`` of its records."""
    for name, commit in names:
        p = log.producer(transactional_id=name, value_serializer=None)
        p.init_transactions()
        p.begin_transaction()
        futs = [
            (p.send("t", b"%s-%d" % (name.encode(), i)), b"%s-%d" % (name.encode(), i)) for i in range(12)
        ]
        p.flush()
        model[name] = [(f.get().offset, v) for f, v in futs]
        if commit:
            p.commit_transaction()
        else:
            p.abort_transaction()
        p.close()


def _view(model: dict[str, list[tuple[int, bytes]]], outcome: dict[str, bool | None]) -> Rows:
    """read_committed over the model: committed records, up to the first transaction undecided (None)."""
    records = sorted((off, v, name) for name, recs in model.items() for off, v in recs)
    out: Rows = []
    for off, v, name in records:
        state = outcome[name]
        if state is None:
            break
        if state:
            out.append((off, v))
    return out


def _remote_rows(url: str) -> Rows:
    with pylog.open(url, read_only=True, clock=ManualClock(TS0)) as ro:
        c = ro.consumer(
            value_deserializer=None, isolation_level="read_committed", auto_offset_reset="earliest"
        )
        c.assign([TopicPartition("t", 0)])
        rows = [(r.offset, r.value) for r in c.iterate(timeout_ms=0)]
        c.close()
    return rows


@pytest.fixture
def two_passes(tmp_path: Path) -> tuple[Path, Path, dict[str, list[tuple[int, bytes]]]]:
    """A log whose first transactions are tiered (the baseline store), then more, decided and sealed."""
    root, baseline = tmp_path / "log", tmp_path / "baseline"
    model: dict[str, list[tuple[int, bytes]]] = {}
    with pylog.open(
        root, clock=ManualClock(TS0), remote_storage=baseline.as_uri(), remote_log_manager_task_interval_ms=-1
    ) as log:
        log.create_topic("t", 1, segment_bytes=900, remote_storage_enable=True)
        _transactions(log, [("a", True), ("b", False)], model)
        log.topic("t").partition(0).roll()
        log.tier()
        _transactions(log, [("c", True), ("d", False), ("e", True)], model)
        log.topic("t").partition(0).roll()
    return root, baseline, model


OLD = {"a": True, "b": False, "c": None, "d": None, "e": None}
NEW = {"a": True, "b": False, "c": True, "d": False, "e": True}


def test_a_failure_at_every_write_of_a_decisions_upload_leaves_the_previous_manifest(
    tmp_path: Path, two_passes: tuple[Path, Path, dict[str, list[tuple[int, bytes]]]]
) -> None:
    root, baseline, model = two_passes
    with pylog.open(baseline.as_uri(), read_only=True) as ro:
        assert ro.topics() == ["t"]
    # the segments of the second pass first: the decisions are what fails
    with pylog.open(root, clock=ManualClock(TS0), remote_log_manager_task_interval_ms=-1) as log:
        tier_partition(ObjectStore(baseline.as_uri()), log.topic("t").partition(0), 1)
        txns = log.transactions()
        before = decisions.read_manifest(ObjectStore(baseline.as_uri()))
        assert _remote_rows(baseline.as_uri()) == _view(model, OLD)
        fail_at = 1
        while True:
            remote = tmp_path / f"remote-{fail_at}"
            shutil.copytree(baseline, remote)
            store = FaultyStore(remote.as_uri(), fail_at)
            try:
                decisions.upload_decisions(store, txns)
            except Crash:
                assert decisions.read_manifest(ObjectStore(remote.as_uri())) == before, fail_at
                assert _remote_rows(remote.as_uri()) == _view(model, OLD), fail_at
                done = decisions.upload_decisions(ObjectStore(remote.as_uri()), txns)
                assert done.manifest is not None
                named = {c.key for c in done.manifest.chunks}
                listed = {o.key for o in ObjectStore(remote.as_uri()).list(f"{decisions.PREFIX}chunks/")}
                assert listed == named, fail_at  # what the failed upload left is swept
                assert _remote_rows(remote.as_uri()) == _view(model, NEW), fail_at
                fail_at += 1
                continue
            break
        assert fail_at == 3  # the chunk put, the manifest put: both were failed once


KILLED_PASS = textwrap.dedent(
    """
    import os, signal, sys
    import pylog
    from pylog.clock import ManualClock
    from pylog.tiered import background
    from pylog.tiered.store import ObjectStore

    root, url, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    calls, active = [0], [False]

    def wrap(name):
        original = getattr(ObjectStore, name)

        def call(self, *args, **kwargs):
            if active[0]:
                calls[0] += 1
                if calls[0] == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
            return original(self, *args, **kwargs)

        setattr(ObjectStore, name, call)

    for name in ("put", "checksum", "get", "list", "delete"):
        wrap(name)
    upload = background.upload_decisions

    def counted(store, txns):
        active[0] = True
        try:
            return upload(store, txns)
        finally:
            active[0] = False

    background.upload_decisions = counted
    clock = ManualClock(1_700_000_000_000, auto_advance=False)
    with pylog.open(root, clock=clock, remote_storage=url, remote_log_manager_task_interval_ms=-1) as log:
        log.tier()
    print(calls[0])
    """
)


def test_sigkill_mid_decisions_upload_leaves_a_consistent_store(
    tmp_path: Path, two_passes: tuple[Path, Path, dict[str, list[tuple[int, bytes]]]]
) -> None:
    """The tiering process is SIGKILLed at spread store calls of its decisions upload (every call with
    PYLOG_TORTURE=1): the decisions manifest is the old one or the whole new one, remote readers see the view
    it gives, and a pass after it completes (restore then gives the new view)."""
    root, baseline, model = two_passes

    def run(log_copy: Path, remote: Path, kill_at: int) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-c", KILLED_PASS, str(log_copy), remote.as_uri(), str(kill_at)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    clean_log, clean = tmp_path / "clean-log", tmp_path / "clean"
    shutil.copytree(root, clean_log)
    shutil.copytree(baseline, clean)
    done = run(clean_log, clean, 0)
    assert done.returncode == 0, done.stderr
    points = int(done.stdout)  # store calls of the decisions upload of a whole pass
    assert points >= 5
    assert _remote_rows(clean.as_uri()) == _view(model, NEW)
    spread = {1, points // 2, points - 1}
    for kill_at in range(1, points) if os.environ.get("PYLOG_TORTURE") == "1" else sorted(spread):
        log_copy, remote = tmp_path / f"log-{kill_at}", tmp_path / f"remote-{kill_at}"
        shutil.copytree(root, log_copy)
        shutil.copytree(baseline, remote)
        killed = run(log_copy, remote, kill_at)
        assert killed.returncode == -signal.SIGKILL, (kill_at, killed.stderr)
        manifest, _ = decisions.read_manifest(ObjectStore(remote.as_uri()))
        assert manifest is not None
        rows = _remote_rows(remote.as_uri())
        assert rows in (_view(model, OLD), _view(model, NEW)), kill_at
        assert (rows == _view(model, NEW)) == (manifest.version == 2), kill_at
        with pylog.open(
            log_copy,
            clock=ManualClock(TS0),
            remote_storage=remote.as_uri(),
            remote_log_manager_task_interval_ms=-1,
        ) as log:
            log.tier()
        assert _remote_rows(remote.as_uri()) == _view(model, NEW), kill_at
        final, _ = decisions.read_manifest(ObjectStore(remote.as_uri()))
        assert final is not None
        listed = {o.key for o in ObjectStore(remote.as_uri()).list(f"{decisions.PREFIX}chunks/")}
        assert listed == {c.key for c in final.chunks}, kill_at
        target = tmp_path / f"restored-{kill_at}"
        restore(remote.as_uri(), target)
        with pylog.open(target, clock=ManualClock(TS0)) as restored:
            c = restored.consumer(
                value_deserializer=None, isolation_level="read_committed", auto_offset_reset="earliest"
            )
            c.assign([TopicPartition("t", 0)])
            assert [(r.offset, r.value) for r in c.iterate(timeout_ms=0)] == _view(model, NEW), kill_at
            c.close()


def test_concurrent_uploaders_publish_one_growing_sequence_of_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three threads upload the decisions at once (each with its own store client, as processes would) while
    transactions are decided: every version published is a whole manifest whose bytes extend the version
    before it, no version is published twice, and the last one holds the whole file. (Every version is kept
    here, so that all of them can be checked; a publish normally deletes the old ones.)"""
    monkeypatch.setattr(tiered_manifest, "KEEP_VERSIONS", 1 << 30)
    url = (tmp_path / "remote").as_uri()
    with pylog.open(
        tmp_path / "log", clock=ManualClock(TS0), remote_storage=url, remote_log_manager_task_interval_ms=-1
    ) as log:
        log.create_topic("t", 1, remote_storage_enable=True)
        txns = log.transactions()
        stop = threading.Event()
        errors: list[BaseException] = []

        def upload() -> None:
            store = ObjectStore(url)
            try:
                while not stop.is_set():
                    decisions.upload_decisions(store, txns)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=upload) for _ in range(3)]
        for t in threads:
            t.start()
        for i in range(60):
            pid, epoch = txns.init(f"tx{i % 7}")
            txn = txns.begin(f"tx{i % 7}", pid, epoch, TS0, 60_000)
            txns.end(f"tx{i % 7}", pid, epoch, txn, commit=i % 3 != 0)
        stop.set()
        for t in threads:
            t.join()
        assert not errors, errors
        decisions.upload_decisions(ObjectStore(url), txns)
        _, data = txns.snapshot()
    store = ObjectStore(url)
    newest, highest = decisions.read_manifest(store)
    ends = []
    for version in range(1, highest + 1):  # every version is a whole manifest of a prefix of the file
        manifest = decisions.decode_manifest(store.get(decisions.manifest_key(version)))
        assert manifest.version == version
        assert crc32c.crc32c(data[: manifest.end]) == manifest.crc32c
        ends.append(manifest.end)
    assert ends == sorted(ends)  # each version extends the one before it
    assert newest is not None and newest.version == highest and newest.end == len(data)
    assert decisions.read_decisions(store, newest) == data  # nothing it names was swept
    assert len(newest.chunks) <= decisions.MAX_CHUNKS
