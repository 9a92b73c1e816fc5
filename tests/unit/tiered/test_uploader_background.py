"""The background uploader of a Log: one thread, scheduled on the injected clock, tiers and applies retention,
survives store failures (reported, retried), never blocks the writer, and stops on close."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import pylog
from pylog.clock import ManualClock
from pylog.errors import RemoteStorageError
from pylog.structs import TopicPartition
from pylog.tiered.manifest import read_manifest
from pylog.tiered.store import ObjectStore

HOUR = 3600 * 1000


def _wait(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Wait (real time, bounded) for the background thread to reach a state; the schedule itself is the
    manual clock's."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _produce(log: pylog.Log, n: int, ts: int, start: int = 0) -> dict[int, bytes]:
    p = log.producer(batch_size=300, value_serializer=None)
    futs = [
        (p.send("t", b"v%d" % i + bytes(40), partition=0, timestamp_ms=ts), i)
        for i in range(start, start + n)
    ]
    p.flush()
    p.close()
    return {f.get().offset: b"v%d" % i + bytes(40) for f, i in futs}


class FlakyStore(ObjectStore):
    """Fails every put while ``down``; counts the calls."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.down = False
        self.puts = 0

    def put_file(self, key: str, path: str, length: int, *, if_absent: bool = True) -> tuple[int, int]:
        self.puts += 1
        if self.down:
            raise RemoteStorageError(f"put {key}: 503 Slow Down (injected)", key=key)
        return super().put_file(key, path, length, if_absent=if_absent)


def test_the_thread_tiers_on_the_clock_schedule_and_reports_failures(tmp_path: Path) -> None:
    url = (tmp_path / "remote").as_uri()
    clock = ManualClock(1_700_000_000_000, auto_advance=False)
    before = {t.name for t in threading.enumerate()}
    log = pylog.open(
        tmp_path / "log", clock=clock, remote_storage=url, remote_log_manager_task_interval_ms=60_000
    )
    manager = log.remote_log_manager
    assert manager is not None and manager.running
    threads = [t for t in threading.enumerate() if t.name == "pylog-remote-log-manager"]
    assert len(threads) == 1 and "pylog-remote-log-manager" not in before  # one thread per Log
    store = FlakyStore(url)
    log._remote = store
    log.create_topic("t", 2, segment_bytes=1024, remote_storage_enable=True, local_retention_ms=HOUR)
    log.create_topic("u", 1, segment_bytes=1024, remote_storage_enable=True)
    model = _produce(log, 80, clock.time_ms())
    plog = log.topic("t").partition(0)
    plog.roll()

    manager.wake()
    time.sleep(0.05)  # woken before the interval passed: no pass
    assert manager.passes == 0 and store.puts == 0

    store.down = True
    clock.advance(60_000)
    manager.wake()
    _wait(lambda: manager.passes >= 1, "a pass with the store down")
    status = log.tier_status()[TopicPartition("t", 0)]
    assert status.failures == 1 and status.last_error is not None and "503" in status.last_error
    assert status.remote_end is None
    assert plog.local_log_start_offset == 0  # nothing deleted
    model.update(_produce(log, 5, clock.time_ms(), start=80))  # the writer goes on
    assert manager.running

    store.down = False
    clock.advance(2 * HOUR)
    manager.wake()
    _wait(lambda: manager.passes >= 2, "the next pass")
    status = log.tier_status()[TopicPartition("t", 0)]
    assert status.failures == 0 and status.last_error is None and status.total_failures == 1
    assert status.remote_end is not None and status.deleted_local > 0
    assert plog.local_log_start_offset == status.remote_end
    manifest, _ = read_manifest(store, "t", 0)
    assert manifest is not None and manifest.log_end_offset == status.remote_end
    # every record is still readable (remote below the local start)
    c = log.consumer(value_deserializer=None)
    c.assign([TopicPartition("t", 0)])
    c.seek_to_beginning(TopicPartition("t", 0))
    assert {r.offset: r.value for r in c.iterate(timeout_ms=0)} == model
    c.close()

    log.close()
    assert not manager.running
    assert not [t for t in threading.enumerate() if t.name == "pylog-remote-log-manager"]


def test_close_stops_the_thread_within_its_bound_during_a_slow_upload(tmp_path: Path) -> None:
    url = (tmp_path / "remote").as_uri()
    clock = ManualClock(1_700_000_000_000, auto_advance=False)
    entered, release = threading.Event(), threading.Event()

    class SlowStore(ObjectStore):
        def put_file(self, key: str, path: str, length: int, *, if_absent: bool = True) -> tuple[int, int]:
            entered.set()
            release.wait(30)
            return super().put_file(key, path, length, if_absent=if_absent)

    log = pylog.open(
        tmp_path / "log", clock=clock, remote_storage=url, remote_log_manager_task_interval_ms=1000
    )
    log._remote = SlowStore(url)
    log.create_topic("t", 1, segment_bytes=1024, remote_storage_enable=True)
    _produce(log, 40, clock.time_ms())
    log.topic("t").partition(0).roll()
    manager = log.remote_log_manager
    assert manager is not None
    clock.advance(1000)
    manager.wake()
    assert entered.wait(30)
    assert manager.close(timeout=0.2) is False  # bounded: an upload is still running
    release.set()
    _wait(lambda: not manager.running, "the thread to end after its upload")
    log.close()
    manifest, _ = read_manifest(ObjectStore(url), "t", 0)
    assert manifest is None or manifest.segments  # whatever was published names whole segments


def test_close_stops_an_upload_in_progress_at_its_next_chunk_boundary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import types

    import crc32c

    from pylog.tiered import store as store_module
    from pylog.tiered.restore import restore

    monkeypatch.setattr(store_module, "_CHUNK", 256)  # a segment of a few KiB is many chunks
    url = (tmp_path / "remote").as_uri()
    clock = ManualClock(1_700_000_000_000, auto_advance=False)
    log = pylog.open(
        tmp_path / "log", clock=clock, remote_storage=url, remote_log_manager_task_interval_ms=1000
    )
    log.create_topic("t", 1, segment_bytes=4096, remote_storage_enable=True)
    model = _produce(log, 60, clock.time_ms())
    plog = log.topic("t").partition(0)
    plog.roll()
    sizes = [s.size for s in plog.segments[:-1]]
    assert sizes[0] > 4 * 256
    chunks: list[int] = []

    def hook(data: bytes, value: int = 0) -> int:
        # the .log upload's second chunk: the store call is in progress when close() comes
        if not chunks and len(data) == 256:
            chunks.append(len(data))
        elif len(chunks) == 1:
            chunks.append(len(data))
            remote = log._remote
            assert remote is not None
            remote._uploads_stopped.wait(30)
        return crc32c.crc32c(data, value)

    monkeypatch.setattr(store_module, "crc32c", types.SimpleNamespace(crc32c=hook))
    manager = log.remote_log_manager
    assert manager is not None
    clock.advance(1000)
    manager.wake()
    _wait(lambda: len(chunks) == 2, "the upload's second chunk")
    caplog.set_level("DEBUG", logger="pylog")
    assert manager.close(timeout=10) is True  # the upload stopped at the next chunk boundary
    assert len(chunks) == 2  # no chunk was read after close
    status = manager.status()[TopicPartition("t", 0)]
    assert status.last_error is not None and "the log is closing" in status.last_error
    log.close()
    # a normal close says nothing: the stop is logged at DEBUG, never as a failure
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert any("stopped by close" in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(store_module, "crc32c", crc32c)
    store = ObjectStore(url)
    assert store.list("t/0/segments/") == []  # nothing of the stopped upload is visible
    assert read_manifest(store, "t", 0) == (None, 0)  # and nothing was published

    # the next open uploads it all
    with pylog.open(tmp_path / "log", clock=clock, remote_log_manager_task_interval_ms=-1) as log:
        (result,) = log.tier()
        assert [s.size for s in result.manifest.segments] == sizes
    restore(url, tmp_path / "restored")
    with pylog.open(tmp_path / "restored", clock=ManualClock()) as restored:
        c = restored.consumer(value_deserializer=None)
        c.assign([TopicPartition("t", 0)])
        c.seek_to_beginning(TopicPartition("t", 0))
        got = {r.offset: r.value for r in c.iterate(timeout_ms=0)}
        c.close()
    assert got == {o: v for o, v in model.items() if o < result.manifest.log_end_offset}


def test_read_only_and_unconfigured_logs_have_no_thread(tmp_path: Path) -> None:
    url = (tmp_path / "remote").as_uri()
    with pylog.open(tmp_path / "plain") as log:
        assert log.remote_log_manager is None and log.tier_status() == {}
    with pylog.open(tmp_path / "log", remote_storage=url, remote_log_manager_task_interval_ms=-1) as log:
        assert log.remote_log_manager is not None and not log.remote_log_manager.running
    with pylog.open(tmp_path / "log", read_only=True) as log:
        assert log.remote_storage == url  # recorded
        assert log.remote_log_manager is None
    with pytest.raises(pylog.errors.ConfigError, match="remote_log_manager_task_interval_ms"):
        pylog.open(tmp_path / "log", remote_log_manager_task_interval_ms=True)


def test_a_log_dropped_without_close_is_collected_and_its_thread_ends(tmp_path: Path) -> None:
    import gc
    import weakref

    log = pylog.open(tmp_path / "log", remote_storage=(tmp_path / "remote").as_uri())
    manager = log.remote_log_manager
    assert manager is not None and manager.running
    thread = manager._thread
    assert thread is not None
    dropped = weakref.ref(log)
    del log, manager
    gc.collect()
    assert dropped() is None  # the thread does not keep the log alive
    thread.join(10)  # it looks at least once a second
    assert not thread.is_alive()
