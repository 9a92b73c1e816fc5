"""PartitionLog (pylog.partition.log) and the files beside it: appends, reads, rolls, flushes, retention,
truncation, time lookups, the recovery checkpoint, the shared state file, file naming, and the I/O layer
(pylog.fs) that every file operation goes through."""

from __future__ import annotations

import errno
import itertools
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

import pylog
from pylog import fs
from pylog.errors import (
    ConfigError,
    CorruptRecordError,
    DiskFullError,
    InvalidOffsetError,
    LogClosedError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
)
from pylog.partition import files
from pylog.partition.checkpoint import RecoveryCheckpoint
from pylog.partition.log import INDEX_SYNC_MS, PartitionLog
from pylog.partition.reader import PartitionReader
from pylog.partition.state import PartitionState, Snapshot
from pylog.record import HEADER_SIZE, check_crc, crc32c, decode_header, encode_batch

T0 = 1_700_000_000_000
Record = tuple[bytes | None, bytes | None, int]


def make(
    log: pylog.Log, name: str = "t", **config: object
) -> tuple[PartitionLog, list[Record], list[tuple[int, int]]]:
    log.create_topic(name, **config)
    return log.topic(name).partition(0), [], []


def append(
    plog: PartitionLog,
    model: list[Record],
    n: int,
    *,
    ts: list[int] | int | None = None,
    size: int = 20,
    bounds: list[tuple[int, int]] | None = None,
) -> pylog.partition.log.AppendInfo:
    start = len(model)
    if ts is None:
        ts = plog.clock.time_ms()
    stamps = ts if isinstance(ts, list) else [ts] * n
    keys: list[bytes | None] = [None if (start + i) % 5 == 0 else b"k%d" % (start + i) for i in range(n)]
    values: list[bytes | None] = [
        None if (start + i) % 7 == 3 else (b"%d:" % (start + i)).ljust(size, b".") for i in range(n)
    ]
    info = plog.append(encode_batch(0, keys, values, stamps))
    assert (info.base_offset, info.last_offset) == (start, start + n - 1)
    model.extend(zip(keys, values, stamps, strict=True))
    if bounds is not None:
        bounds.append((start, start + n))
    return info


def read_all(plog: PartitionLog, start: int | None = None) -> list[tuple[int, Record]]:
    out = []
    for b in plog.batches(start):
        out.extend(
            zip(
                b.offsets.tolist(),
                zip(b.keys(), b.values(), b.timestamps.tolist(), strict=True),
                strict=True,
            )
        )
    return out


def assert_matches(plog: PartitionLog, model: list[Record]) -> None:
    start = plog.log_start_offset
    assert plog.log_end_offset == len(model)
    assert read_all(plog) == [(o, model[o]) for o in range(start, len(model))]


# -- appending and reading ----------------------------------------------------------------------------------


def test_append_assigns_dense_offsets_and_keeps_the_crc_valid(log: pylog.Log) -> None:
    plog, model, _ = make(log)
    for n in (1, 3, 40, 2, 33):
        append(plog, model, n)
    assert_matches(plog, model)
    seg = plog.segments[0]
    with open(seg.path, "rb") as f:
        raw = f.read()
    assert len(raw) == seg.size
    pos, expected = 0, 0
    while pos < len(raw):  # every batch on disk carries its assigned base offset and a valid CRC
        h = decode_header(raw, pos)
        check_crc(raw, pos, h)
        assert h.base_offset == expected
        expected, pos = h.next_offset, pos + h.batch_length
    assert expected == len(model)


def test_read_returns_the_batch_holding_the_offset_within_max_bytes(log: pylog.Log) -> None:
    plog, model, bounds = make(log, segment_bytes=2048)
    for i in range(60):
        append(plog, model, 1 + i % 4, bounds=bounds)
    assert len(plog.segments) > 3
    for offset in range(len(model)):
        holder = next(b for b in bounds if b[0] <= offset < b[1])
        for max_bytes in (1, 300, 5000):
            got = plog.read(offset, max_bytes)
            assert got[0].offsets[0] == holder[0]
            flat = [o for b in got for o in b.offsets.tolist()]
            assert flat == list(range(holder[0], holder[0] + len(flat)))  # dense, also across segments
            sizes = [b.header.batch_length for b in got]
            assert len(got) == 1 or sum(sizes[:-1]) < max_bytes
            for b in got:
                for o, k, v in zip(b.offsets.tolist(), b.keys(), b.values(), strict=True):
                    assert (k, v) == model[o][:2]
    assert plog.read(len(model)) == []


def test_read_rejects_bad_offsets(log: pylog.Log) -> None:
    plog, model, _ = make(log)
    append(plog, model, 3)
    with pytest.raises(OffsetOutOfRangeError):
        plog.read(4)
    for bad in (-1, True, 1.0, "1", None):
        with pytest.raises(InvalidOffsetError):
            plog.read(bad)  # type: ignore[arg-type]


def test_headers_walk_every_batch_and_read_on_from_a_log_start_moved_meanwhile(log: pylog.Log) -> None:
    """headers(start, end) yields the header of each batch from the one holding start until end is passed,
    whatever the read size; a start below the log start, or a log start that delete_records moves past the
    walk between two reads, reads on from the log start."""
    plog, model, bounds = make(log, segment_bytes=700)
    for i in range(40):
        append(plog, model, 1 + i % 3, bounds=bounds)
    assert len(plog.segments) > 3

    def walk(start: int, end: int, max_bytes: int) -> list[tuple[int, int]]:
        return [(h.base_offset, h.next_offset) for h in plog.headers(start, end, max_bytes)]

    for start, end in ((0, len(model)), (5, 30), (len(model) - 1, len(model)), (7, 7)):
        first = next(i for i, b in enumerate(bounds) if b[1] > start)
        for max_bytes in (1, 500, 1 << 20):
            got = walk(start, end, max_bytes)
            assert got == bounds[first : first + len(got)]  # consecutive, from the batch holding start
            if start == end:
                assert got == []
                continue
            assert got[-1][1] >= end  # until end is passed
            if max_bytes == 1:  # one batch a read: no further
                assert len(got) == 1 or got[-2][1] < end

    walker = plog.headers(0, len(model), 1)  # one batch a read
    seen = [next(walker).base_offset for _ in range(3)]
    moved = bounds[20][0] + 1  # within a batch, two segments or more ahead of the walk
    plog.delete_records(moved)
    rest = [(h.base_offset, h.next_offset) for h in walker]
    assert seen == [b[0] for b in bounds[:3]]
    assert rest == bounds[20:]  # on from the batch holding the new log start
    assert walk(0, len(model), 1 << 20) == bounds[20:]  # a start below the log start


def test_too_large_batch_changes_nothing(log: pylog.Log) -> None:
    plog, model, _ = make(log, max_message_bytes=1000)
    append(plog, model, 2)
    size = plog.segments[0].size
    with pytest.raises(RecordTooLargeError):
        plog.append(encode_batch(0, [b"k"], [b"x" * 1000], [1]))
    assert plog.log_end_offset == 2 and plog.segments[0].size == size
    assert os.path.getsize(plog.segments[0].path) == size


def test_log_append_time_restamps_and_recomputes_the_crc(log: pylog.Log, clock: pylog.ManualClock) -> None:
    plog, _, _ = make(log, message_timestamp_type="LogAppendTime")
    clock.advance(1234)
    info = plog.append(encode_batch(0, [b"a", b"b"], [b"1", b"2"], [5, 5]))
    assert info.log_append_time == clock.time_ms()
    b = plog.read(0)[0]  # decode_batch checks the CRC
    assert b.timestamps.tolist() == [clock.time_ms()] * 2 and b.header.timestamp_type == 1


# -- rolling ----------------------------------------------------------------------------------------------


def test_roll_by_size_and_explicit_roll(log: pylog.Log) -> None:
    plog, model, _ = make(log, segment_bytes=1500)
    for _ in range(40):
        append(plog, model, 2)
    segs = plog.segments
    assert len(segs) > 3
    for prev, seg in itertools.pairwise(segs):
        assert prev.size <= 1500 and prev.next_offset == seg.base_offset
        assert os.path.basename(seg.path) == f"{seg.base_offset:020d}.log"
    before = len(segs)
    new = plog.roll()
    assert new.base_offset == len(model) and len(plog.segments) == before + 1
    assert plog.recovery_point == len(model)  # a roll makes the sealed segment durable
    assert plog.roll() is plog.segments[-1] and len(plog.segments) == before + 1  # empty: no-op
    append(plog, model, 1)
    assert_matches(plog, model)


def test_single_batch_larger_than_a_segment_gets_its_own_segment(log: pylog.Log) -> None:
    plog, model, _ = make(log, segment_bytes=500)
    append(plog, model, 1)
    append(plog, model, 10, size=100)
    append(plog, model, 1)
    assert [s.base_offset for s in plog.segments] == [0, 1, 11]
    assert plog.segments[1].size > 500
    assert_matches(plog, model)


def test_roll_by_age(log: pylog.Log, clock: pylog.ManualClock) -> None:
    plog, model, _ = make(log, segment_ms=10_000)
    append(plog, model, 1)
    clock.advance(9_999)
    append(plog, model, 1)
    assert len(plog.segments) == 1
    clock.advance(1)
    append(plog, model, 1)
    assert [s.base_offset for s in plog.segments] == [0, 2]


def test_old_records_fill_a_segment_instead_of_rolling_one_per_batch(
    log: pylog.Log, clock: pylog.ManualClock
) -> None:
    """Kafka measures ``segment.ms`` between the segment's first timestamp and the appended batch's newest
    (``LogSegment.timeWaitedForRoll``): records a year old, appended now, go on filling one segment."""
    plog, model, _ = make(log, segment_ms=10_000)
    year_ago = clock.time_ms() - 365 * 24 * 3600 * 1000
    for i in range(20):
        append(plog, model, 1, ts=year_ago + i * 100)
    assert [s.base_offset for s in plog.segments] == [0]
    append(plog, model, 1, ts=year_ago + 10_000)  # segment_ms past the first batch's timestamp
    append(plog, model, 1, ts=year_ago + 10_001)
    assert [s.base_offset for s in plog.segments] == [0, 20]
    assert read_all(plog) == list(enumerate(model))


# -- flushing ---------------------------------------------------------------------------------------------


def test_flush_moves_the_recovery_point_to_the_log_end(log: pylog.Log) -> None:
    plog, model, _ = make(log)
    append(plog, model, 5)
    assert plog.recovery_point == 0
    assert plog.flush() == 5 and plog.recovery_point == 5
    append(plog, model, 2)
    assert plog.flush(up_to=3) == 5 and plog.recovery_point == 5  # already covered: no fsync
    assert plog.flush(up_to=7) == 7 and plog.recovery_point == 7
    assert RecoveryCheckpoint(plog.checkpoint.path).read() == 7


def test_acknowledgement_flush_syncs_indexes_at_most_once_a_second(
    log: pylog.Log, clock: pylog.ManualClock
) -> None:
    """flush(up_to) (the acks="all" path) makes the records durable at once; the index files, and with them
    the recovery point, follow at most once per INDEX_SYNC_MS; a full flush() always brings both to the end."""
    plog, model, _ = make(log, index_interval_bytes=1)  # every batch adds index entries
    append(plog, model, 3)
    assert plog.flush(up_to=3) == 3 and plog.recovery_point == 3  # the first one syncs the indexes
    append(plog, model, 2)
    assert plog.flush(up_to=5) == 5 and plog.flushed_offset == 5
    assert plog.recovery_point == 3  # the new entries are not fsynced yet: the point stays
    clock.advance(INDEX_SYNC_MS)
    append(plog, model, 1)
    assert plog.flush(up_to=6) == 6 and plog.recovery_point == 6
    append(plog, model, 2)
    assert plog.flush(up_to=8) == 8 and plog.recovery_point == 6
    assert plog.flush() == 8 and plog.recovery_point == 8
    assert RecoveryCheckpoint(plog.checkpoint.path).read() == 8


def test_flush_after_truncation_moves_the_recovery_point_again(log: pylog.Log) -> None:
    plog, model, _ = make(log)
    for _ in range(3):
        append(plog, model, 1)
    assert plog.flush() == 3 and plog.recovery_point == 3
    assert plog.truncate_to(1) == 1 and plog.recovery_point <= 1
    del model[1:]
    append(plog, model, 2)
    assert plog.flush() == 3 and plog.recovery_point == 3


def test_close_brings_a_lagging_recovery_point_to_the_end(log_dir: str, clock: pylog.ManualClock) -> None:
    with pylog.open(log_dir, clock=clock) as log:
        plog, model, _ = make(log, index_interval_bytes=1)
        append(plog, model, 2)
        plog.flush(up_to=2)
        append(plog, model, 2)
        plog.flush(up_to=4)
        assert plog.recovery_point == 2
    assert RecoveryCheckpoint(os.path.join(plog.directory, files.CHECKPOINT)).read() == 4


def test_flush_messages_policy(log: pylog.Log) -> None:
    plog, model, _ = make(log, flush_messages=4)
    append(plog, model, 3)
    assert plog.recovery_point == 0
    append(plog, model, 1)
    assert plog.recovery_point == 4


def test_flush_ms_policy(log: pylog.Log, clock: pylog.ManualClock) -> None:
    plog, model, _ = make(log, flush_ms=1000)
    append(plog, model, 1)
    clock.advance(999)
    append(plog, model, 1)
    assert plog.recovery_point == 0
    clock.advance(1)
    append(plog, model, 1)
    assert plog.recovery_point == 3


class FailingFS(fs.FileSystem):
    """Fails every call of one kind with ``errno`` while ``armed``."""

    def __init__(self, op: str, err: int) -> None:
        self.op, self.err, self.armed, self.calls = op, err, False, 0

    def _maybe_fail(self, op: str) -> None:
        if self.armed and op == self.op:
            self.calls += 1
            raise fs._translate(OSError(self.err, os.strerror(self.err)), op, "injected")

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        self._maybe_fail("pwrite")
        super().pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        self._maybe_fail("fsync")
        super().fsync(fd)


@pytest.fixture
def failing() -> Iterator[FailingFS]:
    layer = FailingFS("", 0)
    with fs.install(layer):
        yield layer


def test_failed_fsync_is_never_treated_as_success(log: pylog.Log, failing: FailingFS) -> None:
    plog, model, _ = make(log)
    append(plog, model, 3)
    failing.op, failing.err, failing.armed = "fsync", errno.EIO, True
    with pytest.raises(StorageError):
        plog.flush()
    assert failing.calls == 1
    assert plog.recovery_point == 0 and plog.flushed_offset == 0
    failing.armed = False
    assert plog.flush() == 3 and plog.recovery_point == 3


def test_failed_delete_records_moves_nothing(log: pylog.Log, failing: FailingFS) -> None:
    """An fsync failing in delete_records (of the records up to the offset, or of the log start file) is a
    StorageError, and the log start, the segments and every record stay as they were."""
    plog, model, _ = make(log, segment_bytes=600)
    for _ in range(20):
        append(plog, model, 3)
    segments = [s.base_offset for s in plog.segments]
    failing.op, failing.err = "fsync", errno.EIO
    for flushed in (False, True):
        if flushed:
            plog.flush()
        failing.armed = True
        with pytest.raises(StorageError):
            plog.delete_records(segments[2] + 1)
        failing.armed = False
        assert plog.log_start_offset == 0 and [s.base_offset for s in plog.segments] == segments
        assert_matches(plog, model)
    assert plog.delete_records(segments[2] + 1) == segments[2] + 1


def test_failed_write_is_not_acknowledged_and_the_log_stays_consistent(
    log: pylog.Log, failing: FailingFS
) -> None:
    plog, model, _ = make(log)
    append(plog, model, 3)
    size = plog.segments[0].size
    failing.op, failing.err, failing.armed = "pwrite", errno.ENOSPC, True
    with pytest.raises(DiskFullError):
        plog.append(encode_batch(0, [b"k"], [b"v"], [1]))
    failing.armed = False
    assert plog.log_end_offset == 3 and plog.segments[0].size == size
    append(plog, model, 2)
    assert_matches(plog, model)
    assert plog.verify() == []


# -- retention --------------------------------------------------------------------------------------------


def test_retention_by_time_deletes_whole_expired_segments(log: pylog.Log, clock: pylog.ManualClock) -> None:
    plog, model, _ = make(log, retention_ms=60_000)
    for i in range(4):
        append(plog, model, 3, ts=T0 + i * 10_000)
        plog.roll()
    append(plog, model, 3, ts=T0 + 50_000)
    paths = [s.path for s in plog.segments]
    clock.set(T0 + 60_000 + 10_000)  # segments 0 and 1 (max ts T0, T0+10s): 0 is older than 60 s, 1 is not
    assert plog.apply_retention() == 1
    assert plog.log_start_offset == 3 and not os.path.exists(paths[0])
    with pytest.raises(OffsetOutOfRangeError):
        plog.read(2)
    clock.set(T0 + 60_000 + 30_001)
    assert plog.apply_retention() == 3
    assert plog.log_start_offset == 12 and plog.log_end_offset == 15
    assert_matches(plog, model)
    assert not any(os.path.exists(p) for p in paths[:4])


def test_retention_rolls_an_expired_active_segment(log: pylog.Log, clock: pylog.ManualClock) -> None:
    plog, model, _ = make(log, retention_ms=1000)
    append(plog, model, 3, ts=T0)
    clock.advance(1001)
    assert plog.apply_retention() == 1
    assert plog.log_start_offset == plog.log_end_offset == 3
    assert plog.read(3) == []
    append(plog, model, 1)
    assert_matches(plog, model)


def test_retention_judges_a_segment_by_its_largest_timestamp(
    log: pylog.Log, clock: pylog.ManualClock
) -> None:
    plog, model, _ = make(log, retention_ms=1000)
    append(plog, model, 2, ts=[T0 - 5000, T0])  # an old and a current record in one segment
    plog.roll()
    append(plog, model, 1, ts=T0 - 9000)
    clock.advance(999)
    assert plog.apply_retention() == 0  # the first segment's largest timestamp is recent
    assert plog.log_start_offset == 0


def test_retention_by_bytes(log: pylog.Log) -> None:
    plog, model, _ = make(log, retention_ms=-1, retention_bytes=1000, segment_bytes=600)
    for _ in range(30):
        append(plog, model, 2)
    assert plog.apply_retention() > 0
    segs = plog.segments
    total = sum(s.size for s in segs)
    assert total - segs[0].size < 1000 <= total or len(segs) == 1
    assert_matches(plog, model)


def test_no_retention_when_disabled(log: pylog.Log, clock: pylog.ManualClock) -> None:
    plog, model, _ = make(log, retention_ms=-1)
    append(plog, model, 2, ts=0)
    plog.roll()
    clock.advance(10**12)
    assert plog.apply_retention() == 0 and plog.log_start_offset == 0


def test_delete_records_moves_the_log_start(log: pylog.Log) -> None:
    """Against a model: the log start is the offset asked for (never lower: a smaller one changes nothing),
    every record from it on is read intact by this and another process, none below it, the segments wholly
    below it are deleted, and it survives a reopen."""
    plog, model, bounds = make(log, segment_bytes=600)
    for _ in range(30):
        append(plog, model, 3, bounds=bounds)
    bases = [s.base_offset for s in plog.segments]
    assert len(bases) > 4
    start = 0
    for offset in (0, 4, 2, bases[1], bases[3] - 1, bases[3] + 1, bases[3]):
        start = max(start, offset)
        assert plog.delete_records(offset) == start == plog.log_start_offset
        assert read_all(plog, start)[0][0] <= start  # the batch holding it (may start before it)
        assert [o for o, _ in read_all(plog, start) if o >= start] == list(range(start, len(model)))
        assert plog.segments[0].base_offset == max(b for b in bases if b <= start)  # whole segments below
        with pytest.raises(OffsetOutOfRangeError):
            plog.read(start - 1) if start else plog.read(len(model) + 1)
    with pytest.raises(OffsetOutOfRangeError):
        plog.delete_records(len(model) + 1)
    with pytest.raises(InvalidOffsetError):
        plog.delete_records(-1)
    assert PartitionReader(plog.directory, "t", 0).log_start_offset == start
    assert log.topic("t").describe()["partitions"][0]["log_start_offset"] == start
    other = pylog.open(log.path)  # another process's view: read through the shared layout
    try:
        other_plog = other.topic("t").partition(0)
        assert other_plog.log_start_offset == start
        assert plog.delete_records(start + 2) == start + 2
        assert other_plog.log_start_offset == start + 2
        with pytest.raises(OffsetOutOfRangeError):
            other_plog.read(start + 1)
        consumer = other.consumer(
            "t", auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None
        )
        assert [r.offset for r in consumer] == list(range(start + 2, len(model)))
        consumer.close()
        assert plog.delete_records(len(model)) == len(model)  # the log end: the active segment goes too
        assert other.topic("t").beginning_offsets() == {0: len(model)}
    finally:
        other.close()
    assert len(plog.segments) == 1 and plog.segments[0].size == 0 and plog.read(len(model)) == []
    append(plog, model, 2)
    assert_matches(plog, model)
    log.create_topic("c", cleanup_policy="compact")
    with pytest.raises(ConfigError):
        log.topic("c").partition(0).delete_records(0)


def test_offset_for_time_starts_at_the_log_start(log: pylog.Log) -> None:
    """A lookup by timestamp (ListOffsets) never answers an offset below the log start delete_records set,
    even in the batch holding it; against a model of (offset, timestamp) pairs."""
    plog, model, _ = make(log, segment_bytes=600)
    for i in range(12):
        append(plog, model, 4, ts=[T0 + 10 * (4 * i + k) for k in range(4)])
    for start in (0, 6, 21, 30):
        plog.delete_records(start)
        for ts in (T0 - 1, T0 + 55, T0 + 200, T0 + 305, T0 + 470, T0 + 1000):
            expected = next(((o, t) for o, (_, _, t) in enumerate(model) if o >= start and t >= ts), None)
            assert plog.offset_for_time(ts) == expected, (start, ts)


def test_the_table_and_describe_start_at_the_log_start(log: pylog.Log) -> None:
    """Topic.table() leaves out the records below the log start delete_records set, even in the batch
    holding it (model: the latest value of each key from the log start on); describe() shows the log
    start."""
    log.create_topic("t")
    with log.producer(key_serializer=None, value_serializer=None, linger_ms=60_000) as producer:
        for i in range(10):
            producer.send("t", key=b"k%d" % (i % 8), value=b"v%d" % i)
    plog = log.topic("t").partition(0)
    assert len(plog.read(0)) == 1  # one batch: the log start falls inside it
    for start in (0, 3, 7):
        plog.delete_records(start)
        model = {b"k%d" % (i % 8): b"v%d" % i for i in range(start, 10)}
        assert log.topic("t").table(value_deserializer=None) == model
        assert log.topic("t").describe()["partitions"][0]["log_start_offset"] == start


def test_log_start_survives_reopen_and_follows_truncation(tmp_path: Path, clock: pylog.ManualClock) -> None:
    path = str(tmp_path) + "/log"
    with pylog.open(path, clock=clock) as log:
        plog, model, _ = make(log)
        append(plog, model, 10)
        assert plog.delete_records(6) == 6
    with pylog.open(path, clock=clock) as log:
        plog = log.topic("t").partition(0)
        assert (plog.log_start_offset, plog.log_end_offset) == (6, 10)
        assert plog.truncate_to(4) == 0  # the batch holding 4 goes whole: the log is empty
        assert (plog.log_start_offset, plog.log_end_offset) == (0, 0)
        append(plog, [], 3)  # new records at 0..2 are read, not hidden by the old log start
        assert [o for o, _ in read_all(plog)] == [0, 1, 2]
    with pylog.open(path, clock=clock) as log:
        assert log.topic("t").partition(0).log_start_offset == 0
    # a damaged file shows the records again (never hides any): the first segment's base rules
    directory = files.partition_dir(path, "t", 0)
    with pylog.open(path, clock=clock) as log:
        log.topic("t").partition(0).delete_records(2)
    with open(os.path.join(directory, files.LOG_START), "r+b") as f:
        f.write(b"junk")
    with pylog.open(path, clock=clock) as log:
        assert log.topic("t").partition(0).log_start_offset == 0


# -- truncation -------------------------------------------------------------------------------------------


def test_truncate_to_works_on_batch_boundaries_across_segments(
    log_dir: str, clock: pylog.ManualClock
) -> None:
    with pylog.open(log_dir, clock=clock) as log:
        plog, model, bounds = make(log, segment_bytes=1024)
        for i in range(40):
            append(plog, model, 1 + i % 3, bounds=bounds)
        plog.flush()
        assert len(plog.segments) > 3
        target = bounds[25][0] + 1  # inside batch 25: the whole batch goes
        new_end = plog.truncate_to(target)
        assert new_end == bounds[25][0] == plog.log_end_offset
        assert plog.recovery_point <= new_end
        del model[new_end:]
        assert_matches(plog, model)
        assert all(s.base_offset < new_end or s.size == 0 for s in plog.segments)
        info = append(plog, model, 2)
        assert info.base_offset == new_end  # offsets continue from the new end
        assert plog.verify() == []
        assert not [n for n in os.listdir(plog.directory) if n.endswith((".cleaned", ".swap", ".deleted"))]
    with pylog.open(log_dir, clock=clock) as log:
        assert_matches(log.topic("t").partition(0), model)


@pytest.mark.parametrize("rolls", [1, 3])
def test_truncating_to_the_end_of_a_sealed_segment_makes_it_active_with_an_active_index(
    log: pylog.Log, clock: pylog.ManualClock, rolls: int
) -> None:
    """Found by the partition state machine: truncating away only empty or later segments makes a sealed
    segment active again; its time index must lose the final entry its roll added (verify() compares)."""
    plog, model, bounds = make(log, index_interval_bytes=256)
    for i in range(6):
        append(plog, model, 1 + i % 2, bounds=bounds)
        clock.advance(1)
    end = plog.log_end_offset
    for _ in range(rolls):
        plog.roll()
        if rolls > 1:
            append(plog, model, 1, bounds=bounds)
    assert plog.truncate_to(end) == end
    del model[end:]
    assert plog.verify() == []
    assert_matches(plog, model)
    append(plog, model, 2, bounds=bounds)  # and it goes on as the active segment
    plog.roll()
    assert plog.verify() == []
    assert_matches(plog, model)


def test_truncate_to_the_end_or_beyond_changes_nothing(log: pylog.Log) -> None:
    plog, model, _ = make(log)
    append(plog, model, 4)
    size = plog.segments[0].size
    assert plog.truncate_to(4) == 4 and plog.truncate_to(100) == 4
    assert plog.segments[0].size == size
    assert plog.truncate_to(0) == 0 and plog.segments[0].size == 0


# -- time lookups ------------------------------------------------------------------------------------------


def test_offset_for_time_equals_a_scan(log: pylog.Log) -> None:
    plog, model, _ = make(log, segment_bytes=1200, index_interval_bytes=100)
    stamps = [T0 + (i * 7919) % 5000 for i in range(150)]  # out of order
    for i in range(0, 150, 3):
        append(plog, model, 3, ts=stamps[i : i + 3])
    assert len(plog.segments) > 3
    for target in sorted(set(stamps) | {s + 1 for s in stamps} | {T0 - 1}):
        want = next(((o, r[2]) for o, r in enumerate(model) if r[2] >= target), None)
        assert plog.offset_for_time(target) == want, target


# -- verify, batches, close -------------------------------------------------------------------------------


def test_verify_is_clean_for_a_healthy_log_and_names_a_bad_batch(log: pylog.Log) -> None:
    plog, model, _ = make(log, segment_bytes=1024, index_interval_bytes=128)
    for i in range(30):
        append(plog, model, 2, ts=T0 + (i * 31) % 17)  # non-monotonic timestamps
    plog.flush()
    assert plog.verify() == []
    seg = plog.segments[1]
    with open(seg.path, "r+b") as f:
        f.seek(HEADER_SIZE + 3)
        b = f.read(1)
        f.seek(HEADER_SIZE + 3)
        f.write(bytes([b[0] ^ 4]))
    problems = plog.verify()
    assert len(problems) == 1 and seg.path in problems[0] and "position 0" in problems[0]


def test_closed_partition_raises(log: pylog.Log) -> None:
    plog, model, _ = make(log)
    append(plog, model, 1)
    plog.close()
    plog.close()  # idempotent
    for call in (lambda: plog.read(0), lambda: plog.log_end_offset, plog.roll, plog.flush):
        with pytest.raises(LogClosedError):
            call()


def test_two_partition_objects_in_one_process_see_each_others_appends(log_dir: str) -> None:
    with pylog.open(log_dir) as a, pylog.open(log_dir) as b:
        pa, model, _ = make(a)
        pb = b.topic("t").partition(0)
        for i in range(20):
            append(pa if i % 2 else pb, model, 1 + i % 3)
        assert_matches(pa, model)
        assert_matches(pb, model)
        assert [s.base_offset for s in pa.segments] == [s.base_offset for s in pb.segments]


def test_a_segment_deleted_by_another_process_under_a_read_is_out_of_range_not_an_os_error(
    log_dir: str,
) -> None:
    """Retention in another process deletes a segment this process listed but has not mapped yet (and has not
    yet published the new layout): reads reload the layout and answer like Kafka (offset out of range), and
    a consumer resets to the new log start."""
    with pylog.open(log_dir) as a, pylog.open(log_dir) as b:
        pa, model, _ = make(a, segment_bytes=1024)
        for i in range(40):
            append(pa, model, 1 + i % 3)
        pb = b.topic("t").partition(0)
        segments = pb.segments
        assert len(segments) >= 3
        for seg in segments:
            seg.drop_map()  # not mapped here: opening the file is what fails once it is gone
        first = segments[0]
        os.rename(first.path, first.path + ".deleted")  # retention's first step, nothing published yet
        with pytest.raises(OffsetOutOfRangeError):
            pb.read_raw(0)
        assert pb.log_start_offset == segments[1].base_offset
        got = [
            r.offset
            for r in b.consumer(
                "t", auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None
            )
        ]
        assert got == list(range(segments[1].base_offset, len(model)))


# -- recovery checkpoint ------------------------------------------------------------------------------------


def test_checkpoint_alternates_slots_and_survives_a_torn_slot(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(os.fspath(tmp_path), "recovery.checkpoint")
    cp = RecoveryCheckpoint(path)
    assert cp.read() == 0
    cp.write(10, sync=True)
    cp.write(5, sync=True)  # never backwards
    assert cp.read() == 10
    cp.write(20, sync=False)
    with open(path, "rb") as f:
        raw = f.read()
    assert len(raw) == 64
    slots = [struct.unpack("<IHHqqII", raw[i : i + 32]) for i in (0, 32)]
    assert {s[4] for s in slots} == {10, 20}
    for magic, version, _, _, _, _crc, _ in slots:
        assert magic == int.from_bytes(b"PLRP", "little") and version == 1
    for i in (0, 32):
        assert crc32c(raw[i : i + 24]) == struct.unpack_from("<I", raw, i + 24)[0]
    newest = 0 if slots[0][4] == 20 else 32
    torn = bytearray(raw)
    torn[newest + 17] ^= 0xFF  # the slot being written is damaged: the other one wins
    with open(path, "wb") as f:
        f.write(torn)
    assert cp.read() == 10
    torn[64 - newest - 32 + 3] ^= 0xFF  # both damaged: everything is revalidated
    with open(path, "wb") as f:
        f.write(torn)
    assert cp.read() == 0
    cp.reset(7)
    assert cp.read() == 7
    cp.write(8, sync=True)
    assert cp.read() == 8


# -- shared state ----------------------------------------------------------------------------------------


def test_state_publishes_consistent_snapshots_and_detects_a_torn_publish(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(os.fspath(tmp_path), files.STATE)
    a = PartitionState(path)
    b = PartitionState(path)
    try:
        assert not a.initialized and b.read() == Snapshot(0, 0, 0, 0, 0)
        assert a.lock(blocking=True) and not b.lock(blocking=False)  # flock: per open file description
        snap = Snapshot(10, 5, 300, 2, T0)
        a.publish(snap)
        assert b.initialized and b.read() == snap and b.seq == 2 and not b.torn()
        with open(path, "rb") as f:
            raw = f.read()
        assert raw[:8] == b"PLPSTAT1" and struct.unpack_from("<6q", raw, 8) == (2, *snap)
        struct.pack_into("<q", a._map, 8, 3)  # a writer died mid-publish: seq stays odd
        assert b.torn() and b.read(spins=5) is None
        a.reset(snap)
        assert not b.torn() and b.read() == snap and b.seq % 2 == 0
        a.unlock()
        assert b.lock(blocking=False)
        b.unlock()
    finally:
        a.close()
        b.close()


# -- file names -------------------------------------------------------------------------------------------


def test_segment_file_names() -> None:
    assert files.segment_path("/d", 42, files.LOG) == "/d/00000000000000000042.log"
    assert files.parse_segment_name("00000000000000000042.log") == (42, ".log", "")
    assert files.parse_segment_name("00000000000000000042.timeindex.swap") == (42, ".timeindex", ".swap")
    assert files.parse_segment_name("00000000000000000042.index.deleted") == (42, ".index", ".deleted")
    for bad in ("42.log", "00000000000000000042.log.bak", "0000000000000000004x.log", "partition.state"):
        assert files.parse_segment_name(bad) is None
    assert files.partition_dir("/r", "t", 3) == "/r/t-3"


# -- the I/O layer ---------------------------------------------------------------------------------------


def test_os_errors_are_translated_once(tmp_path: os.PathLike[str]) -> None:
    root = os.fspath(tmp_path)
    layer = fs.FileSystem()
    with pytest.raises(FileNotFoundError):
        layer.open(os.path.join(root, "missing"), os.O_RDONLY)
    with pytest.raises(FileNotFoundError):
        layer.unlink(os.path.join(root, "missing"))
    with pytest.raises(StorageError) as info:
        layer.fsync(987654)
    assert info.value.errno == errno.EBADF and not isinstance(info.value, DiskFullError)
    err = fs._translate(OSError(errno.ENOSPC, "full"), "write", "f")
    assert isinstance(err, DiskFullError) and isinstance(err, StorageError) and isinstance(err, OSError)
    assert isinstance(fs._translate(OSError(errno.EDQUOT, "quota"), "write", "f"), DiskFullError)


def test_pwrite_completes_short_writes(tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> None:
    path = os.path.join(os.fspath(tmp_path), "f")
    real = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, data, off: real(fd, bytes(data[:3]), off))
    layer = fs.FileSystem()
    fd = layer.open(path, os.O_RDWR | os.O_CREAT)
    try:
        layer.pwrite(fd, b"0123456789", 5)
        monkeypatch.undo()
        assert layer.pread(fd, 100, 0) == b"\0" * 5 + b"0123456789"
    finally:
        layer.close(fd)


def test_atomic_write_replaces_whole_files_and_install_restores(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(os.fspath(tmp_path), "m")
    fs.atomic_write(path, b"old")
    calls: list[str] = []

    class Recording(fs.FileSystem):
        def rename(self, src: str, dst: str) -> None:
            calls.append("rename")
            with open(dst, "rb") as f:
                assert f.read() == b"old"  # the original is untouched until the rename
            super().rename(src, dst)

        def fsync(self, fd: int) -> None:
            calls.append("fsync")
            super().fsync(fd)

        def fsync_dir(self, path: str) -> None:
            calls.append("fsync_dir")
            super().fsync_dir(path)

    previous = fs.FS
    with fs.install(Recording()) as layer:
        assert fs.FS is layer
        fs.atomic_write(path, b"new contents")
    assert fs.FS is previous
    assert calls == ["fsync", "rename", "fsync_dir"]
    with open(path, "rb") as f:
        assert f.read() == b"new contents"
    assert os.listdir(os.fspath(tmp_path)) == ["m"]


def test_read_file_and_size(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(os.fspath(tmp_path), "f")
    with open(path, "wb") as f:
        f.write(b"abc" * 1000)
    assert fs.FS.read_file(path) == b"abc" * 1000
    with pytest.raises(FileNotFoundError):
        fs.FS.read_file(path + "x")


def test_corrupt_batch_in_the_active_tail_is_reported_by_read(log: pylog.Log) -> None:
    plog, model, bounds = make(log, index_interval_bytes=0)
    for _ in range(5):
        append(plog, model, 2, bounds=bounds)
    seg = plog.segments[0]
    pos = seg.position_for(bounds[3][0])
    with open(seg.path, "r+b") as f:
        f.seek(pos + HEADER_SIZE)
        b = f.read(1)
        f.seek(pos + HEADER_SIZE)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(CorruptRecordError, match="CRC"):
        plog.read(bounds[3][0], 1)
    for o in (0, 2, 4, 8):
        assert plog.read(o, 1)[0].offsets.tolist() == [o, o + 1]
    assert len(plog.verify()) == 1


def test_log_start_of_a_topic_tiered_later_is_its_remote_one(tmp_path: Path) -> None:
    """delete_records refuses tiered topics; a log start it set before tiering was turned on is then not
    used (the partition's log start and its reads follow the tiered rules alike, so a consumer's reset to
    the log start can read)."""
    remote = tmp_path / "remote"
    remote.mkdir()
    with pylog.open(tmp_path / "log", clock=pylog.ManualClock(), remote_storage=remote.as_uri()) as log:
        plog, model, _ = make(log)
        append(plog, model, 10)
        assert plog.delete_records(4) == 4
        log.alter_topic("t", remote_storage_enable=True)
        with pytest.raises(ConfigError):
            plog.delete_records(5)
        start = plog.log_start_offset
        assert [o for o, _ in read_all(plog, start) if o >= start] == list(range(start, 10))
    with pylog.open(tmp_path / "log", clock=pylog.ManualClock(), remote_storage=remote.as_uri()) as log:
        plog = log.topic("t").partition(0)
        assert plog.remote is not None
        start = plog.log_start_offset
        assert start == 0 and [o for o, _ in read_all(plog, start)] == list(range(10))


def test_the_deletion_marker_refuses_appends_and_is_set_even_past_a_held_lock(log: pylog.Log) -> None:
    import fcntl

    from pylog.errors import UnknownTopicError
    from pylog.partition.state import mark_deleted

    plog, model, _ = make(log)
    append(plog, model, 2)
    path = os.path.join(plog.directory, files.STATE)
    mark_deleted(os.path.join(plog.directory, "missing.state"))  # no file: nothing made
    assert not os.path.exists(os.path.join(plog.directory, "missing.state"))
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a writer stopped while holding the lock
        mark_deleted(path, wait_s=0.0)
    finally:
        os.close(fd)
    end = plog.log_end_offset
    with pytest.raises(UnknownTopicError, match="deleted"):
        append(plog, model, 1)
    assert plog.log_end_offset == end and os.path.getsize(plog.segments[-1].path) == plog.segments[-1].size


@pytest.mark.parametrize("junk", [b"\x01", bytes(range(1, 57)), b"\xff" * 56, b"PLDELET"])
def test_a_torn_state_page_is_never_read_as_the_deletion_marker(log: pylog.Log, junk: bytes) -> None:
    """A power loss may leave junk in the unsynced page of ``partition.state``: the partition stays writable
    (only the whole eight-byte marker written by a topic deletion refuses appends)."""
    from pylog.partition.state import DELETED_AT

    plog, model, _ = make(log)
    append(plog, model, 2)
    path = os.path.join(plog.directory, files.STATE)
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, junk, DELETED_AT)  # what a torn write may leave where the marker lives
    finally:
        os.close(fd)
    append(plog, model, 1)
    assert plog.log_end_offset == 3
