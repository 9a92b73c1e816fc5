"""Tiered storage under faults (file:// backend): a crash at every object-store write of an upload, a crash
between segment upload and manifest publish, corrupt, truncated or missing remote objects at restore, an
upload the store corrupts, two processes publishing manifest versions at once, and a background pass (upload,
local retention, whole-log retention) SIGKILLed at spread points."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import pylog
from pylog.clock import ManualClock
from pylog.errors import CorruptRecordError, RemoteStorageError
from pylog.tiered import uploader
from pylog.tiered.manifest import (
    KEEP_VERSIONS,
    PartitionManifest,
    decode_manifest,
    listed_versions,
    manifest_key,
    read_manifest,
)
from pylog.tiered.restore import restore
from pylog.tiered.store import ObjectStore
from pylog.tiered.uploader import tier_partition

Model = dict[int, tuple[bytes, bytes]]


class Crash(Exception):
    """The injected failure."""


class FaultyStore(ObjectStore):
    """Raises :class:`Crash` instead of performing the ``fail_at``-th write (put or put_file), 1-based."""

    def __init__(self, url: str, fail_at: int) -> None:
        super().__init__(url)
        self.fail_at = fail_at
        self.writes = 0

    def _count(self) -> None:
        self.writes += 1
        if self.writes == self.fail_at:
            raise Crash(f"write {self.writes}")

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        self._count()
        return super().put(key, data, if_absent=if_absent)

    def put_file(self, key: str, path: str, length: int, *, if_absent: bool = True) -> tuple[int, int]:
        self._count()
        return super().put_file(key, path, length, if_absent=if_absent)


def _produce(log: pylog.Log, n: int, start: int = 0) -> Model:
    p = log.producer(batch_size=300, value_serializer=None)
    futs = [(p.send("t", b"v%d" % i + bytes(i % 61), key=b"k%d" % i), i) for i in range(start, start + n)]
    p.flush()
    model = {}
    for fut, i in futs:
        model[fut.get().offset] = (b"k%d" % i, b"v%d" % i + bytes(i % 61))
    p.close()
    return model


def _restored_records(remote: Path, target: Path) -> Model:
    restore(remote.as_uri(), target)
    with pylog.open(target, clock=ManualClock()) as log:
        c = log.consumer(value_deserializer=None, key_deserializer=None)
        tp = log.topic("t").partitions()[0]
        c.assign([tp])
        c.seek_to_beginning(tp)
        got = {r.offset: (r.key, r.value) for r in c.iterate(timeout_ms=0)}
        c.close()
    shutil.rmtree(target)
    return got


@pytest.fixture
def tiered_once(tmp_path: Path) -> Any:
    """A log whose first segments are tiered (the baseline manifest), then more sealed segments not yet."""
    remote = tmp_path / "baseline"
    log = pylog.open(tmp_path / "log", clock=ManualClock(), remote_storage=remote.as_uri())
    log.create_topic("t", 1, segment_bytes=2048, remote_storage_enable=True)
    model = _produce(log, 250)
    log.topic("t").partition(0).roll()
    log.tier()
    baseline, _ = read_manifest(ObjectStore(remote.as_uri()), "t", 0)
    model |= _produce(log, 150, start=250)
    log.topic("t").partition(0).roll()
    yield log, remote, baseline, model
    log.close()


def test_a_crash_at_every_write_of_an_upload_leaves_the_previous_manifest_and_a_rerun_completes(
    tmp_path: Path, tiered_once: Any
) -> None:
    log, baseline_remote, baseline, model = tiered_once
    plog = log.topic("t").partition(0)
    assert baseline is not None and baseline.segments
    old = {o: r for o, r in model.items() if o < baseline.log_end_offset}
    crashes = 0
    for k in range(1, 100):
        remote = tmp_path / f"remote-{k}"
        shutil.copytree(baseline_remote, remote)
        store = FaultyStore(remote.as_uri(), fail_at=k)
        try:
            tier_partition(store, plog, 1)
        except Crash:
            crashes += 1
        else:
            break  # k is past the last write: every write was a crash point
        assert read_manifest(store, "t", 0)[0] == baseline  # the previous manifest stays authoritative
        assert _restored_records(remote, tmp_path / "restored") == old
        result = tier_partition(ObjectStore(remote.as_uri()), plog, 1)  # the re-run completes
        assert result.manifest.log_end_offset == plog.log_end_offset
        assert _restored_records(remote, tmp_path / "restored") == model
    # new sealed segments x (log + index + timeindex) + the manifest
    assert crashes == 3 * (len(plog.segments) - 1 - len(baseline.segments)) + 1


def test_an_exception_between_upload_and_publish_publishes_nothing(
    tmp_path: Path, tiered_once: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, remote, baseline, model = tiered_once

    def crash(*args: object, **kwargs: object) -> None:
        raise Crash("after the segment upload, before the manifest")

    monkeypatch.setattr(uploader, "publish_manifest", crash)
    with pytest.raises(Crash):
        log.tier()
    store = ObjectStore(remote.as_uri())
    assert read_manifest(store, "t", 0) == (baseline, baseline.version)
    monkeypatch.undo()
    result = log.tier()[0]
    assert result.manifest.version == baseline.version + 1
    # the crashed run's objects stay unnamed; the re-run uploaded its own copies
    named = {s.key for s in result.manifest.segments}
    assert all(s.key in named for s in result.uploaded)
    assert _restored_records(remote, tmp_path / "restored") == model


def _flip(path: Path, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flip-log", "truncate-log", "flip-index", "missing-log", "torn-manifest"])
def test_a_damaged_remote_object_is_detected_at_restore_and_nothing_is_restored(
    tmp_path: Path, tiered_once: Any, damage: str
) -> None:
    log, remote, baseline, model = tiered_once
    log.tier()
    manifest, _ = read_manifest(ObjectStore(remote.as_uri()), "t", 0)
    assert manifest is not None
    rng = random.Random(damage)
    seg = manifest.segments[rng.randrange(len(manifest.segments))]
    log_object = remote / seg.key
    if damage == "flip-log":
        _flip(log_object, rng)
    elif damage == "truncate-log":
        log_object.write_bytes(log_object.read_bytes()[: seg.size - 1 - rng.randrange(seg.size - 1)])
    elif damage == "flip-index":
        index = next(s for s in manifest.segments if s.index is not None and s.index.size).index
        assert index is not None
        _flip(remote / index.key, rng)
    elif damage == "missing-log":
        log_object.unlink()
    else:  # the newest manifest torn: restore falls back to the one before, which is whole
        newest = remote / manifest_key("t", 0, manifest.version)
        newest.write_bytes(newest.read_bytes()[:-5])
        old = {o: r for o, r in model.items() if o < baseline.log_end_offset}
        assert _restored_records(remote, tmp_path / "restored") == old
        return
    expected = RemoteStorageError if damage == "missing-log" else CorruptRecordError
    with pytest.raises(expected):
        restore(remote.as_uri(), tmp_path / "restored")
    assert not (tmp_path / "restored").exists()
    assert not [n for n in os.listdir(tmp_path) if ".restore-" in n]  # the staging directory is gone


class CorruptingStore(ObjectStore):
    """Flips one byte of every object it stores from a file, after the put (a store that damages data)."""

    def put_file(self, key: str, path: str, length: int, *, if_absent: bool = True) -> tuple[int, int]:
        result = super().put_file(key, path, length, if_absent=if_absent)
        target = Path(self.url.removeprefix("file://")) / key
        if length:
            _flip(target, random.Random(key))
        return result


def test_an_upload_the_store_corrupts_is_caught_before_any_manifest_names_it(tiered_once: Any) -> None:
    log, remote, baseline, _ = tiered_once
    store = CorruptingStore(remote.as_uri())
    with pytest.raises(CorruptRecordError):
        tier_partition(store, log.topic("t").partition(0), 1)
    assert read_manifest(store, "t", 0) == (baseline, baseline.version)


WRITER = textwrap.dedent(
    """
    import json, os, sys, time
    from pylog.tiered.manifest import PartitionManifest, publish_manifest
    from pylog.tiered.store import ObjectStore

    url, wid, go, versions = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    store = ObjectStore(url)
    while not os.path.exists(go):
        time.sleep(0.001)
    won = []
    for v in range(1, versions + 1):
        if publish_manifest(store, PartitionManifest("t", 0, 1, {"writer": wid}), v) is not None:
            won.append(v)
    print(json.dumps(won))
    """
)


def test_two_processes_never_publish_the_same_manifest_version(tmp_path: Path) -> None:
    url, go, versions = (tmp_path / "remote").as_uri(), tmp_path / "go", 60
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, url, str(wid), str(go), str(versions)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for wid in (1, 2)
    ]
    go.touch()
    won = {}
    for wid, proc in zip((1, 2), procs, strict=True):
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        won[wid] = set(json.loads(out))
    assert not won[1] & won[2]
    assert won[1] | won[2] == set(range(1, versions + 1))  # every version was taken, by exactly one
    store = ObjectStore(url)
    present = set(listed_versions(store, "t/0/manifest/"))
    assert present == set(
        range(versions - KEEP_VERSIONS + 1, versions + 1)
    )  # publishes deleted the older ones
    for wid, mine in won.items():
        for v in mine & present:
            manifest = decode_manifest(store.get(manifest_key("t", 0, v)))
            assert manifest == PartitionManifest("t", 0, 1, {"writer": wid}, (), v)


KILLED_TIER = textwrap.dedent(
    """
    import os, signal, sys
    import crc32c as real
    import pylog
    from pylog.tiered import store

    root, url, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store._CHUNK = 512  # many small chunks: many points to be killed at, mid-object
    calls = [0]

    class Counting:
        @staticmethod
        def crc32c(data, value=0):
            calls[0] += 1
            if calls[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return real.crc32c(data, value)

    store.crc32c = Counting
    with pylog.open(root, remote_storage=url) as log:
        log.tier()
    print(calls[0])
    """
)


def test_sigkill_mid_upload_at_spread_points_never_publishes_a_partial_segment(tmp_path: Path) -> None:
    """The uploader process is SIGKILLed in the middle of streaming an object (or reading it back), at four
    points spread over a whole run (every point with PYLOG_TORTURE=1): the previous manifest stays
    authoritative, and a run after it completes."""
    baseline_remote, root = tmp_path / "baseline", tmp_path / "log"
    with pylog.open(root, clock=ManualClock(), remote_storage=baseline_remote.as_uri()) as log:
        log.create_topic("t", 1, segment_bytes=2048, remote_storage_enable=True)
        model = _produce(log, 120)
        log.topic("t").partition(0).roll()
        log.tier()
        model |= _produce(log, 120, start=120)
        log.topic("t").partition(0).roll()
        end = log.topic("t").partition(0).log_end_offset
    baseline, _ = read_manifest(ObjectStore(baseline_remote.as_uri()), "t", 0)
    assert baseline is not None

    def run(remote: Path, kill_at: int) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-c", KILLED_TIER, str(root), remote.as_uri(), str(kill_at)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    clean = tmp_path / "clean"
    shutil.copytree(baseline_remote, clean)
    done = run(clean, 0)
    assert done.returncode == 0, done.stderr
    points = int(done.stdout)  # CRC calls of a whole run: one per chunk sent or read back
    assert points > 20
    old = {o: r for o, r in model.items() if o < baseline.log_end_offset}
    spread = {1, points // 3, points * 2 // 3, points - 1}
    for kill_at in range(1, points) if os.environ.get("PYLOG_TORTURE") == "1" else sorted(spread):
        remote = tmp_path / f"remote-{kill_at}"
        shutil.copytree(baseline_remote, remote)
        killed = run(remote, kill_at)
        assert killed.returncode == -signal.SIGKILL, (kill_at, killed.stderr)
        assert read_manifest(ObjectStore(remote.as_uri()), "t", 0)[0] == baseline, kill_at
        assert _restored_records(remote, tmp_path / "restored") == old
        assert run(remote, 0).returncode == 0
        manifest, _ = read_manifest(ObjectStore(remote.as_uri()), "t", 0)
        assert manifest is not None and manifest.log_end_offset == end
        assert _restored_records(remote, tmp_path / "restored") == model


KILLED_PASS = textwrap.dedent(
    """
    import os, signal, sys
    import pylog
    from pylog.clock import ManualClock
    from pylog.tiered.store import ObjectStore

    root, url, kill_at, now = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    calls = [0]

    def wrap(name):
        original = getattr(ObjectStore, name)

        def call(self, *args, **kwargs):
            calls[0] += 1
            if calls[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, *args, **kwargs)

        setattr(ObjectStore, name, call)

    for name in ("put", "put_file", "checksum", "get", "list", "delete"):
        wrap(name)
    clock = ManualClock(now, auto_advance=False)
    with pylog.open(root, clock=clock, remote_storage=url, remote_log_manager_task_interval_ms=-1) as log:
        status = log.remote_log_manager.run_once()
        errors = [s.last_error for s in status.values() if s.last_error]
        assert not errors, errors
    print(calls[0])
    """
)


def _local_and_remote(root: Path, remote: Path, target: Path) -> Model:
    """The records of the local segments plus those of restore(remote)."""
    got: Model = {}
    if read_manifest(ObjectStore(remote.as_uri()), "t", 0)[0] is not None:
        got |= _restored_records(remote, target)
    with pylog.open(root, clock=ManualClock(), remote_log_manager_task_interval_ms=-1) as log:
        plog = log.topic("t").partition(0)
        offset = plog.local_log_start_offset
        while offset < plog.log_end_offset:
            for b in plog.read(offset, 1 << 20):
                for o, k, v in zip(b.offsets, b.keys(), b.values(), strict=True):
                    got[int(o)] = (bytes(k or b""), bytes(v or b""))
                offset = b.header.next_offset
    return got


def test_sigkill_of_a_background_pass_never_loses_a_record_not_past_retention(tmp_path: Path) -> None:
    """A pass (upload, local retention, whole-log retention) SIGKILLed at spread store calls (every call with
    PYLOG_TORTURE=1): the local segments plus the remote log still hold every record not past retention_ms,
    as one contiguous run to the log end; a later pass completes."""
    hour, day = 3600 * 1000, 24 * 3600 * 1000
    t0 = 1_700_000_000_000
    base_root, base_remote = tmp_path / "log", tmp_path / "remote"
    clock = ManualClock(t0)
    with pylog.open(
        base_root,
        clock=clock,
        remote_storage=base_remote.as_uri(),
        remote_log_manager_task_interval_ms=-1,
    ) as log:
        log.create_topic(
            "t", 1, segment_bytes=2048, retention_ms=day, remote_storage_enable=True, local_retention_ms=hour
        )
        p = log.producer(batch_size=300, value_serializer=None)
        futs = []
        for i in range(240):  # the first 120 records are old, the next 120 twelve hours younger
            ts = t0 if i < 120 else t0 + 12 * hour
            futs.append((p.send("t", b"v%d" % i + bytes(i % 61), key=b"k%d" % i, timestamp_ms=ts), i))
            if i == 119:
                p.flush()
                log.topic("t").partition(0).roll()
                log.tier()  # a baseline: the old records are remote, and still local
                clock.advance(12 * hour)  # the young records are written twelve hours later
        p.flush()
        p.close()
        model = {f.get().offset: (b"k%d" % i, b"v%d" % i + bytes(i % 61)) for f, i in futs}
        log.topic("t").partition(0).roll()
    now = t0 + 25 * hour  # old records past retention_ms, young ones past local_retention_ms only
    young = min(o for o, (k, _) in model.items() if int(k[1:]) >= 120)
    end = max(model) + 1

    def run(root: Path, remote: Path, kill_at: int) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-c", KILLED_PASS, str(root), remote.as_uri(), str(kill_at), str(now)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    def check(root: Path, remote: Path, label: object) -> None:
        got = _local_and_remote(root, remote, tmp_path / "restored")
        start = min(got)
        assert start <= young, label  # nothing younger than retention_ms was lost
        assert got == {o: r for o, r in model.items() if o >= start}, label  # one run, to the end
        assert max(got) + 1 == end, label

    def copy(label: str) -> tuple[Path, Path]:
        root, remote = tmp_path / f"log-{label}", tmp_path / f"remote-{label}"
        shutil.copytree(base_root, root)
        shutil.copytree(base_remote, remote)
        return root, remote

    root, remote = copy("clean")
    done = run(root, remote, 0)
    assert done.returncode == 0, done.stderr
    points = int(done.stdout)
    assert points > 10
    check(root, remote, "clean")
    with pylog.open(root, clock=ManualClock(), remote_log_manager_task_interval_ms=-1) as log:
        assert log.topic("t").partition(0).local_log_start_offset == end  # all uploaded, all deleted locally
    manifest, _ = read_manifest(ObjectStore(remote.as_uri()), "t", 0)
    assert (
        manifest is not None and manifest.log_start_offset is not None and manifest.log_start_offset <= young
    )

    spread = {points // 3, points * 2 // 3, points - 1}  # in the uploads, around the retention, in the sweep
    for kill_at in range(1, points) if os.environ.get("PYLOG_TORTURE") == "1" else sorted(spread):
        root, remote = copy(str(kill_at))
        killed = run(root, remote, kill_at)
        assert killed.returncode == -signal.SIGKILL, (kill_at, killed.stderr)
        check(root, remote, kill_at)
        again = run(root, remote, 0)
        assert again.returncode == 0, (kill_at, again.stderr)
        check(root, remote, (kill_at, "rerun"))
        shutil.rmtree(root)
        shutil.rmtree(remote)
