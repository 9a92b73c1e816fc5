"""Retention of tiered topics: local segments are deleted only once a published manifest names them and their
local retention passed; retention_ms / retention_bytes drop remote segments (manifest first, objects after);
nothing is deleted while the store is down; the configs; the recorded remote_storage URL.

Checked against a model: every produced record is in the object store (restore()) or in the local segments,
after every pass, on file:// and on a moto S3 server on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from store_faults import FaultyStore

import pylog
from pylog.cli import main
from pylog.clock import ManualClock
from pylog.errors import ConfigError, RemoteStorageError
from pylog.structs import TopicPartition
from pylog.tiered.background import RemoteLogManager
from pylog.tiered.location import read_remote_storage
from pylog.tiered.manifest import decode_manifest, manifest_key, read_manifest, segment_key
from pylog.tiered.restore import restore
from pylog.tiered.store import ObjectStore

HOUR = 3600 * 1000
DAY = 24 * HOUR
Model = dict[int, tuple[bytes, bytes]]
RETAIN = {
    "retention_ms": DAY,
    "local_retention_ms": HOUR,
}  # a whole-log retention of a day, a local one of an hour


def _open(root: Path, url: str, options: dict[str, Any], clock: ManualClock, **kw: Any) -> pylog.Log:
    return pylog.open(
        root,
        clock=clock,
        remote_storage=url,
        remote_storage_options=options,
        remote_log_manager_task_interval_ms=-1,
        **kw,
    )


@contextmanager
def _tiered(
    tmp_path: Path, url: str, options: dict[str, Any], *, store: ObjectStore | None = None, **config: Any
) -> Iterator[tuple[pylog.Log, Any, RemoteLogManager, ManualClock]]:
    """``(log, partition, manager, clock)``: a log whose tiering passes the test runs (``manager.run_once()``,
    no background thread), with ``store`` as its object store if given, and one tiered topic ``t`` of one
    partition (1 KiB segments, ``config``); its clock is manual and moves only when the test moves it."""
    clock = ManualClock(1_700_000_000_000, auto_advance=False)
    with _open(tmp_path / "log", url, options, clock) as log:
        if store is not None:
            log._remote = store
        log.create_topic("t", 1, segment_bytes=1024, remote_storage_enable=True, **config)
        manager = log.remote_log_manager
        assert manager is not None
        yield log, log.topic("t").partition(0), manager, clock


def _produce(log: pylog.Log, n: int, ts: int, start: int = 0) -> Model:
    p = log.producer(batch_size=300, value_serializer=None)
    futs = [
        (p.send("t", b"v%d" % i + bytes(i % 53), key=b"k%d" % i, partition=0, timestamp_ms=ts), i)
        for i in range(start, start + n)
    ]
    p.flush()
    p.close()
    return {f.get().offset: (b"k%d" % i, b"v%d" % i + bytes(i % 53)) for f, i in futs}


def _local(log: pylog.Log) -> Model:
    """The records in the local segments only."""
    plog = log.topic("t").partition(0)
    out: Model = {}
    for batch in _decode(plog, plog.local_log_start_offset, plog.log_end_offset):
        out.update(batch)
    return out


def _decode(plog: Any, start: int, end: int) -> Iterator[Model]:
    offset = start
    while offset < end:
        batches = plog.read(offset, 1 << 20)
        if not batches:
            return
        for b in batches:
            yield {
                int(o): (bytes(k or b""), bytes(v or b""))
                for o, k, v in zip(b.offsets, b.keys(), b.values(), strict=True)
                if start <= o < end
            }
            offset = b.header.next_offset


def _remote(url: str, options: dict[str, Any], target: Path) -> Model:
    """The records of the object store, through a full restore (CRCs, manifests, Log.verify())."""
    report = restore(url, target, remote_storage_options=options)
    if TopicPartition("t", 0) not in report:
        return {}
    with pylog.open(target, clock=ManualClock()) as restored:
        return _local(restored)


def _check_model(log: pylog.Log, url: str, options: dict[str, Any], model: Model, target: Path) -> Model:
    """Every produced record is local or remote (restore() of the remote plus the local ones)."""
    remote = _remote(url, options, target)
    local = _local(log)
    assert {**remote, **local} == model
    return remote


def test_local_segments_are_deleted_only_after_their_upload_and_local_retention(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    url, options = remote
    with _tiered(tmp_path, url, options, local_retention_ms=HOUR) as (log, plog, manager, clock):
        model = _produce(log, 100, clock.time_ms())
        clock.advance(2 * HOUR)
        sealed = len(plog.segments) - 1
        assert sealed >= 3

        # nothing uploaded yet: retention deletes nothing local, though the local retention passed
        assert log.apply_retention() == {"t": 0}
        assert len(plog.segments) == sealed + 1

        status = manager.run_once()[TopicPartition("t", 0)]
        assert status.uploaded == sealed and status.deleted_local == sealed and status.failures == 0
        assert plog.local_log_start_offset == status.remote_end
        # the expired active segment was rolled (sealed, so the next pass uploads it), not deleted
        assert len(plog.segments) == 2 and plog.segments[-1].size == 0
        remote_part = _check_model(log, url, options, model, tmp_path / "r1")
        assert max(remote_part) + 1 == status.remote_end  # the deleted local records are all remote

        # new records are young: uploaded once sealed, but kept locally until their local retention passes
        model.update(_produce(log, 60, clock.time_ms(), start=100))
        plog.roll()
        status = manager.run_once()[TopicPartition("t", 0)]
        # the old segment rolled by the last pass went too (uploaded now, past local retention)
        assert status.deleted_local == sealed + 1 and status.remote_end == plog.log_end_offset
        assert min(_local(log)) < status.remote_end  # uploaded and still local
        _check_model(log, url, options, model, tmp_path / "r2")
        clock.advance(2 * HOUR)
        manager.run_once()
        assert plog.local_log_start_offset == plog.log_end_offset  # all uploaded, all past local retention
        assert _check_model(log, url, options, model, tmp_path / "r3") == model


def test_local_retention_bytes_keeps_the_newest_uploaded_segments(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    url, options = remote
    with _tiered(tmp_path, url, options, local_retention_bytes=2500) as (log, plog, manager, clock):
        model = _produce(log, 150, clock.time_ms())
        plog.roll()
        manager.run_once()
        sizes = [s.size for s in plog.segments]
        # Kafka's rule: the oldest segment goes while the rest still holds the budget
        assert sum(sizes) - sizes[0] < 2500 <= sum(sizes)
        assert plog.local_log_start_offset > 0 and len(plog.segments) >= 3
        _check_model(log, url, options, model, tmp_path / "r")


def test_nothing_is_deleted_while_the_store_is_down_and_the_error_is_reported(tmp_path: Path) -> None:
    url = (tmp_path / "remote").as_uri()
    with _tiered(tmp_path, url, {}, **RETAIN) as (log, plog, manager, clock):
        model = _produce(log, 100, clock.time_ms())
        plog.roll()
        clock.advance(2 * DAY)  # past the whole-log retention too
        before = [s.base_offset for s in plog.segments]
        down = FaultyStore(url)
        log._remote = down  # the Log's store: every call fails
        for _ in range(2):
            status = manager.run_once()[TopicPartition("t", 0)]
            assert status.last_error is not None and "store down" in status.last_error
            assert status.remote_end is None and status.uploaded == 0
            with pytest.raises(RemoteStorageError):
                log.apply_retention()  # needs the manifest: the store is down, nothing deleted
        assert log.tier_status()[TopicPartition("t", 0)].failures == 4
        assert [s.base_offset for s in plog.segments] == before  # a segment not uploaded stays past retention
        assert _local(log) == model
        model.update(_produce(log, 10, clock.time_ms(), start=100))  # the writer is not affected

        down.down = frozenset()
        status = manager.run_once()[TopicPartition("t", 0)]
        assert status.failures == 0 and status.last_error is None and status.total_failures == 4
        assert status.uploaded == len(before) - 1
        # uploaded, then past the whole-log retention: dropped remotely too, after the local copies
        assert status.deleted_local == len(before) - 1 and status.deleted_remote == len(before) - 1
        assert _local(log) == {o: v for o, v in model.items() if o >= plog.local_log_start_offset}
        assert min(_local(log)) == before[-1]


class RecordingStore(ObjectStore):
    """Records manifest publishes and deletes in order; ``fail_deletes`` makes deletes raise."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self.events: list[tuple[str, str, bytes]] = []
        self.fail_deletes = False

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        done = super().put(key, data, if_absent=if_absent)
        if done:
            self.events.append(("put", key, data))
        return done

    def delete(self, key: str) -> None:
        if self.fail_deletes:
            raise RemoteStorageError(f"delete {key}: injected", key=key)
        self.events.append(("delete", key, b""))
        super().delete(key)


def test_whole_log_retention_drops_remote_segments_from_the_manifest_before_deleting_objects(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    url, options = remote
    store = RecordingStore(url, **options)
    with _tiered(tmp_path, url, options, store=store, **RETAIN) as (log, plog, manager, clock):
        old = _produce(log, 100, clock.time_ms())
        clock.advance(12 * HOUR)
        young = _produce(log, 100, clock.time_ms(), start=100)
        plog.roll()
        clock.advance(2 * HOUR)
        manager.run_once()  # everything uploaded; local copies past local retention deleted; nothing expired
        first, _ = read_manifest(store, "t", 0)
        assert first is not None and first.log_start_offset == 0
        assert plog.local_log_start_offset == plog.log_end_offset
        assert not [e for e in store.events if e[0] == "delete"]

        clock.advance(11 * HOUR)  # the old records are 25 h old, the young ones 13 h
        status = manager.run_once()[TopicPartition("t", 0)]
        after, _ = read_manifest(store, "t", 0)
        assert after is not None and status.deleted_remote > 0
        dropped = [s for s in first.segments if s not in after.segments]
        assert len(dropped) == status.deleted_remote
        assert all(s.max_timestamp < clock.time_ms() - DAY for s in dropped)
        assert all(s.max_timestamp >= clock.time_ms() - DAY for s in after.segments)
        # each dropped object was deleted after a manifest not naming it was published, never before
        published = [i for i, e in enumerate(store.events) if e[0] == "put" and "/manifest/" in e[1]]
        last = decode_manifest(store.events[published[-1]][2])
        assert last.segments == after.segments
        deleted = {e[1]: i for i, e in enumerate(store.events) if e[0] == "delete"}
        for seg in dropped:
            for key in [seg.key] + [f.key for f in (seg.index, seg.timeindex) if f is not None]:
                assert deleted[key] > published[-1]
        keys = {o.key for o in store.list("t/0/segments/")}
        assert not keys & set(deleted)
        assert {s.key for s in after.segments} <= keys
        remote_records = _remote(url, options, tmp_path / "r")
        assert remote_records == {o: v for o, v in {**old, **young}.items() if o >= after.log_start_offset}
        assert set(young) <= set(remote_records)


def test_a_crash_between_manifest_and_delete_leaves_orphans_a_later_pass_sweeps(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    url, options = remote
    store = RecordingStore(url, **options)
    with _tiered(tmp_path, url, options, store=store, **RETAIN) as (log, plog, manager, clock):
        _produce(log, 100, clock.time_ms())
        clock.advance(12 * HOUR)
        _produce(log, 100, clock.time_ms(), start=100)
        plog.roll()
        manager.run_once()
        first, _ = read_manifest(store, "t", 0)
        assert first is not None
        # objects pylog did not make, under the same prefix: never deleted
        foreign = ["t/0/segments/notes.txt", "t/0/segments/00000000000000000000-ZZZZ.log"]
        for key in foreign:
            store.put(key, b"not pylog's")
        # an unnamed upload above the manifest end (one in progress, as far as anyone can tell): kept
        in_flight = segment_key("t", 0, first.log_end_offset or 0, "0123456789abcdef", ".log")
        store.put(in_flight, b"uploading")

        clock.advance(13 * HOUR)
        store.fail_deletes = True  # the pass dies after publishing the manifest without the expired segments
        status = manager.run_once()[TopicPartition("t", 0)]
        assert status.last_error is not None and "injected" in status.last_error
        after, _ = read_manifest(store, "t", 0)
        assert after is not None and len(after.segments) < len(first.segments)
        dropped = [s for s in first.segments if s not in after.segments]
        orphans = {k for s in dropped for k in [s.key] + [f.key for f in (s.index, s.timeindex) if f]}
        keys = {o.key for o in store.list("t/0/segments/")}
        assert orphans <= keys  # unnamed now, still there

        store.fail_deletes = False
        status = manager.run_once()[TopicPartition("t", 0)]
        assert status.failures == 0
        keys = {o.key for o in store.list("t/0/segments/")}
        assert not orphans & keys
        assert set(foreign) | {in_flight} <= keys
        newest, _ = read_manifest(store, "t", 0)
        assert newest is not None
        assert {s.key for s in newest.segments} <= keys


def test_after_a_restart_the_remote_end_is_read_from_the_manifest_and_the_url_was_recorded(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    url, options = remote
    with _tiered(tmp_path, url, options, local_retention_ms=HOUR) as (log, plog, _, clock):
        model = _produce(log, 100, clock.time_ms())
        plog.roll()
        results = log.tier()  # uploads only: nothing deleted
        end = results[0].manifest.log_end_offset
        assert _local(log) == model
    assert read_remote_storage(str(tmp_path / "log")) == url
    assert options == {} or "secret" not in (tmp_path / "log" / "remote_storage").read_text()
    clock.advance(2 * HOUR)
    # reopened without remote_storage: the recorded URL (options are given again; they are not recorded)
    with pylog.open(
        tmp_path / "log", clock=clock, remote_storage_options=options, remote_log_manager_task_interval_ms=-1
    ) as log:
        assert log.remote_storage == url
        plog = log.topic("t").partition(0)
        sealed = len(plog.segments) - 1
        assert log.apply_retention() == {"t": sealed}
        assert plog.local_log_start_offset == end
        _check_model(log, url, options, model, tmp_path / "r")


def test_local_retention_configs_are_validated_and_set_from_the_command_line(tmp_path: Path) -> None:
    with pylog.open(tmp_path / "log", clock=ManualClock()) as log:
        with pytest.raises(ConfigError, match="remote_storage_enable"):
            log.create_topic("a", 1, local_retention_ms=1000)
        with pytest.raises(ConfigError, match="at most retention_ms"):
            log.create_topic("a", 1, remote_storage_enable=True, retention_ms=1000, local_retention_ms=2000)
        with pytest.raises(ConfigError, match="at most retention_bytes"):
            log.create_topic(
                "a", 1, remote_storage_enable=True, retention_bytes=10**6, local_retention_bytes=-1
            )
        with pytest.raises(ConfigError, match="local_retention_bytes must be"):
            log.create_topic("a", 1, remote_storage_enable=True, local_retention_bytes=-3)
        with pytest.raises(ConfigError, match="local_retention_ms must be an int"):
            log.create_topic("a", 1, remote_storage_enable=True, local_retention_ms="1h")
        t = log.create_topic("b", 1, remote_storage_enable=True, retention_ms=-1, local_retention_ms=-1)
        assert t.config.effective_local_retention_ms == -1
        assert t.config.effective_local_retention_bytes == t.config.retention_bytes == -1
        with pytest.raises(ConfigError):
            pylog.open(tmp_path / "other", remote_log_manager_task_interval_ms=0)
    root = str(tmp_path / "cli")
    cfg = ["--config", "remote.storage.enable=true", "--config", "local.retention.ms=3600000"]
    assert main(["--dir", root, "topics", "create", "t", *cfg, "--config", "local.retention.bytes=4096"]) == 0
    assert main(["--dir", root, "topics", "create", "u", "--config", "local.retention.ms=5"]) != 0
    with pylog.open(root) as log:
        config = log.topic("t").config
        assert (config.local_retention_ms, config.local_retention_bytes) == (3_600_000, 4096)
        assert "u" not in log.topics()


def test_a_manifest_key_is_never_deleted(tmp_path: Path) -> None:
    """Whole-log retention that empties the remote log publishes an empty manifest; no manifest version
    (the proof of what was named) is ever deleted, and the sweep of an empty manifest deletes nothing."""
    url = (tmp_path / "remote").as_uri()
    with _tiered(tmp_path, url, {}, **RETAIN) as (log, plog, manager, clock):
        _produce(log, 100, clock.time_ms())
        plog.roll()
        manager.run_once()
        clock.advance(2 * DAY)
        status = manager.run_once()[TopicPartition("t", 0)]
        assert status.remote_end is None and status.deleted_remote > 0
        store = ObjectStore(url)
        manifest, highest = read_manifest(store, "t", 0)
        assert manifest is not None and manifest.segments == () and highest == manifest.version
        assert all(store.get(manifest_key("t", 0, v)) for v in range(1, highest + 1))
        assert store.list("t/0/segments/") == []
        # new records after the remote log emptied: uploaded again from the local log end
        model = _produce(log, 30, clock.time_ms(), start=100)
        plog.roll()
        manager.run_once()
        assert _remote(url, {}, tmp_path / "r") == model


def test_a_file_store_fsyncs_each_object_and_the_directories_it_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc/self/fd to name the fsynced descriptors")
    import os

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    root = tmp_path / "remote"
    store = ObjectStore(root.as_uri())
    monkeypatch.setattr(os, "fsync", fsync)
    store.put("t/0/manifest/x.json", b"one")
    created = [root / "t/0/manifest", root / "t/0", root / "t", root, tmp_path]
    assert synced == [str(root / "t/0/manifest/x.json")] + [str(d) for d in created]
    synced.clear()
    store.put("t/0/manifest/y.json", b"two")  # the directories are durable already: only the new entry's one
    assert synced == [str(root / "t/0/manifest/y.json"), str(root / "t/0/manifest")]
    synced.clear()
    (tmp_path / "data").write_bytes(b"x" * 100)
    store.put_file("t/1/segments/a.log", str(tmp_path / "data"), 100)
    # new directories up to the first one known durable, whose own entry is then fsynced ("t" names "1")
    new_dirs = [root / "t/1/segments", root / "t/1", root / "t"]
    assert synced == [str(root / "t/1/segments/a.log")] + [str(d) for d in new_dirs]
    synced.clear()
    store.delete("t/1/segments/a.log")
    assert synced == [str(root / "t/1/segments")]


def test_a_local_segment_rewritten_after_its_upload_is_not_deleted(tmp_path: Path) -> None:
    """The manifest must name a local segment as it is (same offsets and size): after a truncation below the
    remote end and new appends, the rewritten segments stay, though their offsets are within the remote
    range."""
    url = (tmp_path / "remote").as_uri()
    with _tiered(tmp_path, url, {}, local_retention_ms=HOUR) as (log, plog, _, clock):
        model = _produce(log, 100, clock.time_ms())
        plog.roll()
        manifest = log.tier()[0].manifest
        assert manifest.log_end_offset == 100
        cut = manifest.segments[-2].base_offset + 1  # inside an uploaded segment
        plog.truncate_to(cut)
        rewritten = _produce(log, 20, clock.time_ms(), start=1000)
        plog.roll()
        clock.advance(2 * HOUR)
        log.apply_retention()
        assert plog.local_log_start_offset == manifest.segments[-2].base_offset  # the exact copies went
        # what is left locally: the old records before the truncation point, then the rewritten ones
        first_new = min(rewritten)
        assert first_new <= cut
        kept = {o: r for o, r in model.items() if plog.local_log_start_offset <= o < first_new}
        assert _local(log) == {**kept, **rewritten}


def test_the_recorded_url_file_is_checked(tmp_path: Path) -> None:
    from pylog.errors import UnsupportedFormatError
    from pylog.tiered.location import FILE_NAME, write_remote_storage

    root = tmp_path / "log"
    url = (tmp_path / "remote").as_uri()
    pylog.open(root, remote_storage=url, remote_log_manager_task_interval_ms=-1).close()
    path = root / FILE_NAME
    assert read_remote_storage(str(root)) == url
    raw = path.read_bytes()
    assert raw.startswith(b"pylog-remote-storage 1 ") and url.encode() in raw
    path.write_bytes(raw.replace(b'/remote"', b'/remotX"'))  # a flipped byte in the body: the CRC fails
    with pytest.warns(RuntimeWarning, match="does not check"):
        assert read_remote_storage(str(root)) is None
    path.write_bytes(raw.replace(b"storage 1 ", b"storage 9 ", 1))
    with pytest.raises(UnsupportedFormatError):
        read_remote_storage(str(root))
    write_remote_storage(str(root), "s3://other/prefix")
    assert read_remote_storage(str(root)) == "s3://other/prefix"
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(FILE_NAME)) == [FILE_NAME]
