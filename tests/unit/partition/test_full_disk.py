"""A full disk (pylog.fs raises DiskFullError): a log opens, reads, rolls, flushes and makes room on it.

:class:`FullDisk` models a file system with a byte budget: a write or truncation that grows a file takes from
it (in 4 KiB blocks) and fails with ``ENOSPC`` when it is used up; shrinking and unlinking a file give its
blocks back. Writes inside a file's current size need nothing. (tests/fault/test_disk_full.py runs the same story on a real,
kernel-enforced full file system.)"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

import numpy as np
import pytest

import pylog
from pylog import fs
from pylog.errors import DiskFullError
from pylog.partition import files
from pylog.partition.checkpoint import RecoveryCheckpoint
from pylog.partition.index import OFFSET_ENTRY, TIME_ENTRY
from pylog.partition.log import PartitionLog
from pylog.partition.segment import Segment
from pylog.record import encode_batch

T0 = 1_700_000_000_000


class FullDisk(fs.FileSystem):
    """``free`` bytes left (None: unlimited); ``refused`` counts the writes that failed for lack of room.
    ``only`` limits the budget to paths ending with one of its suffixes (the others always have room)."""

    def __init__(self, free: int | None = 0, only: tuple[str, ...] = ()) -> None:
        self.free = free
        self.only = only
        self.refused = 0

    def _counts(self, path: str) -> bool:
        return self.free is not None and (not self.only or path.endswith(self.only))

    def _grow(self, fd: int, end: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        need = _blocks(end) - _blocks(os.fstat(fd).st_size)
        if need <= 0 or not self._counts(path):
            return
        assert self.free is not None
        if need > self.free:
            self.refused += 1
            raise fs._translate(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "write", path)
        self.free -= need

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        self._grow(fd, offset + len(data))
        super().pwrite(fd, data, offset)

    def ftruncate(self, fd: int, size: int) -> None:
        self._grow(fd, size)
        before = os.fstat(fd).st_size
        super().ftruncate(fd, size)
        if self.free is not None:
            self.free += max(_blocks(before) - _blocks(size), 0)

    def unlink(self, path: str) -> None:
        st = os.stat(path)
        super().unlink(path)
        if self.free is not None and st.st_nlink == 1:
            self.free += _blocks(st.st_size)


def _blocks(size: int) -> int:
    """Bytes of the 4 KiB blocks a file of ``size`` bytes occupies."""
    return -(-size // 4096) * 4096


@pytest.fixture
def disk() -> Iterator[FullDisk]:
    layer = FullDisk(free=None)
    with fs.install(layer):
        yield layer


def _append(plog: PartitionLog, model: list[bytes], batches: int, per_batch: int = 4) -> None:
    for _ in range(batches):
        values = [b"v%06d" % (len(model) + i) + b"." * 40 for i in range(per_batch)]
        plog.append(encode_batch(0, [None] * per_batch, list(values), [T0 + len(model)] * per_batch))
        model.extend(values)


def _values(plog: PartitionLog) -> list[bytes]:
    return [v for b in plog.batches() for v in b.values() if v is not None]


def _on_disk(seg: Segment) -> tuple[np.ndarray, np.ndarray]:
    with open(seg.index_path, "rb") as f:
        oe = np.frombuffer(f.read(), dtype=OFFSET_ENTRY)
    with open(seg.timeindex_path, "rb") as f:
        te = np.frombuffer(f.read(), dtype=TIME_ENTRY)
    return oe, te


def _assert_index_files_complete(plog: PartitionLog) -> None:
    for seg in plog.segments:
        oe, te = _on_disk(seg)
        assert np.array_equal(oe, seg.offset_index.entries) and np.array_equal(te, seg.time_index.entries)


def test_recovery_on_a_full_disk_cuts_a_torn_tail_and_writes_the_rebuilt_index_later(
    log_dir: str, disk: FullDisk
) -> None:
    model: list[bytes] = []
    with pylog.open(log_dir, clock=pylog.ManualClock(T0)) as log:
        log.create_topic("t", segment_bytes=4096, index_interval_bytes=100)
        _append(log.topic("t").partition(0), model, 120)
    # a power cut: no clean-shutdown marker, a torn batch after the log end and an index entry naming it
    os.unlink(os.path.join(log_dir, ".clean-shutdown"))
    directory = files.partition_dir(log_dir, "t", 0)
    active = max(files.live_segment_bases(os.listdir(directory)))
    log_path = files.segment_path(directory, active, files.LOG)
    size = os.path.getsize(log_path)
    with open(log_path, "ab") as f:
        f.write(b"\x00" * 8 + b"\x7f\x00\x00\x00" + b"torn" * 20)
    index_path = files.segment_path(directory, active, files.INDEX)
    with open(index_path, "ab") as f:
        f.write(np.array([(len(model) - active, size)], dtype=OFFSET_ENTRY).tobytes())

    disk.free = 0
    with pylog.open(log_dir, clock=pylog.ManualClock(T0)) as log:
        assert not log.clean_start
        report = log.recovery["t-0"]
        assert report.bytes_truncated > 0 and report.indexes_rebuilt >= 1
        assert disk.refused >= 1  # the rewrite of the index was refused: deferred
        plog = log.topic("t").partition(0)
        assert _values(plog) == model and plog.log_end_offset == len(model)
        assert log.verify() == {}  # the index files are a prefix of what the log derives
        assert plog.recovery_point <= plog.log_end_offset

        disk.free = None  # room again: appends work and the next flush writes the deferred entries
        _append(plog, model, 10)
        plog.flush()
        _assert_index_files_complete(plog)
        assert _values(plog) == model and plog.recovery_point == len(model)
    with pylog.open(log_dir) as log:
        assert log.verify() == {} and _values(log.topic("t").partition(0)) == model


def test_a_roll_on_a_full_disk_keeps_the_index_files_a_prefix_and_a_flush_completes_them(
    log_dir: str, disk: FullDisk
) -> None:
    model: list[bytes] = []
    with pylog.open(log_dir, clock=pylog.ManualClock(T0)) as log:
        log.create_topic("t", index_interval_bytes=1)  # an entry per batch: pending ones at the roll
        plog = log.topic("t").partition(0)
        _append(plog, model, 530, per_batch=1)  # 512 offset entries fill a block: the next ones need one
        sealed = plog.segments[-1]
        assert sealed.index_pending
        disk.free, disk.only = 0, (files.INDEX, files.TIMEINDEX)
        plog.roll()
        assert disk.refused >= 1 and sealed.index_pending
        assert plog.verify() == [] and _values(plog) == model
        disk.free = None
        _append(plog, model, 3)
        plog.flush()
        assert not sealed.index_pending
        _assert_index_files_complete(plog)
        assert plog.verify() == []


def test_an_index_entry_a_full_disk_refuses_does_not_fail_an_acknowledgement(
    log_dir: str, disk: FullDisk
) -> None:
    model: list[bytes] = []
    with pylog.open(log_dir, clock=pylog.ManualClock(T0)) as log:
        log.create_topic("t", index_interval_bytes=1)
        plog = log.topic("t").partition(0)
        _append(plog, model, 530, per_batch=1)
        disk.free, disk.only = 0, (files.INDEX, files.TIMEINDEX)
        # the records are in the log and fsynced: the flush an acknowledgement waits for must not fail on
        # their index entries (a failed acknowledgement of a written record invites a duplicate)
        assert plog.flush(len(model)) == len(model) and disk.refused >= 1
        producer = log.producer(acks="all", value_serializer=None)
        assert producer.send("t", b"last").get().offset == len(model)
        model.append(b"last")
        producer.close()
        assert plog.verify() == []
        disk.free = None
    with pylog.open(log_dir) as log:
        assert _values(log.topic("t").partition(0)) == model and log.verify() == {}


def test_a_recovery_point_is_lowered_in_place_on_a_full_disk(
    tmp_path: os.PathLike[str], disk: FullDisk
) -> None:
    path = os.path.join(os.fspath(tmp_path), files.CHECKPOINT)
    cp = RecoveryCheckpoint(path)
    cp.write(100, sync=True)
    cp.write(200, sync=True)
    disk.free = 0
    cp.reset(40)
    assert disk.refused == 1 and RecoveryCheckpoint(path).read() == 40
    assert sorted(os.listdir(os.fspath(tmp_path))) == [files.CHECKPOINT]  # no temp file left behind
    cp.write(50, sync=True)  # in place too: the slots exist
    assert RecoveryCheckpoint(path).read() == 50


def test_a_topic_is_deleted_on_a_full_disk(log_dir: str, disk: FullDisk) -> None:
    with pylog.open(log_dir, clock=pylog.ManualClock(T0)) as log:
        for name in ("keep", "drop"):
            log.create_topic(name, segment_bytes=2048, index_interval_bytes=100)
        model: list[bytes] = []
        _append(log.topic("keep").partition(0), model, 20)
        _append(log.topic("drop").partition(0), [], 20)
        disk.free = 0
        with pytest.raises(DiskFullError):  # the disk is full
            for _ in range(100):
                _append(log.topic("keep").partition(0), model, 1)
        log.delete_topic("drop")  # the manifest needs room: the topic's index files give it
        assert log.topics() == ["keep"] and disk.free > 4096
        _append(log.topic("keep").partition(0), model, 5)
        assert _values(log.topic("keep").partition(0)) == model
    with pylog.open(log_dir) as log:
        assert log.topics() == ["keep"] and log.verify() == {}
        assert not os.path.exists(files.partition_dir(log_dir, "drop", 0))


def test_a_log_closes_on_a_full_disk_and_the_next_open_recovers(log_dir: str, disk: FullDisk) -> None:
    model: list[bytes] = []
    with pylog.open(log_dir, clock=pylog.ManualClock(T0)) as log:
        log.create_topic("t")
        _append(log.topic("t").partition(0), model, 5)
        log.flush()
        disk.free = 0  # no room for the clean-shutdown marker
    assert not os.path.exists(os.path.join(log_dir, ".clean-shutdown"))
    assert not [n for n in os.listdir(log_dir) if n.endswith(".tmp")]
    disk.free = None
    with pylog.open(log_dir) as log:
        assert not log.clean_start and _values(log.topic("t").partition(0)) == model
