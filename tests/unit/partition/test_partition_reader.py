"""The reader of a partition directory (pylog.partition.reader) and the pieces it shares with the writer: the
published state read with state.py's one seqlock reader, the one batch-header walk, the directory naming rules.
Every answer is checked against what the PartitionLog that wrote the files says."""

from __future__ import annotations

import itertools
import os
import pickle
import struct

import pytest

import pylog
from pylog.errors import CorruptRecordError, UnsupportedFormatError
from pylog.partition import files
from pylog.partition.log import PartitionLog
from pylog.partition.reader import PartitionReader, list_segments, walk_headers
from pylog.partition.state import PartitionState, Snapshot, read_published
from pylog.record import BATCH_LENGTH_AT, HEADER, HEADER_FIELD_AT, BatchHeader, decode_header, encode_batch

T0 = 1_700_000_000_000


def _written(log: pylog.Log, clock: pylog.ManualClock, *, rolls: int) -> PartitionLog:
    log.create_topic("t-x", segment_bytes=400)
    plog = log.topic("t-x").partition(0)
    for i in range(rolls * 4):
        n = 1 + i % 3
        plog.append(encode_batch(0, [b"k%d" % i] * n, [b"v" * 40] * n, [T0 + 10 * i] * n))
        clock.advance(5)
    return plog


def _reader(plog: PartitionLog) -> PartitionReader:
    return PartitionReader(plog.directory, plog.topic, plog.partition)


def test_reader_sees_what_the_writer_published(log: pylog.Log, clock: pylog.ManualClock) -> None:
    plog = _written(log, clock, rolls=4)
    reader = _reader(plog)
    assert len(plog.segments) > 2
    assert [(s.base_offset, s.next_offset, s.size) for s in reader.segments] == [
        (s.base_offset, s.next_offset, s.size) for s in plog.segments
    ]
    assert [s.sealed for s in reader.segments] == [True] * (len(plog.segments) - 1) + [False]
    assert (reader.log_start_offset, reader.log_end_offset) == (plog.log_start_offset, plog.log_end_offset)
    for ts in (T0 - 1, T0, T0 + 95, T0 + 10_000):
        found = plog.offset_for_time(ts)
        assert reader.offset_for_time(ts) == (None if found is None else found[0])
    for offset in range(plog.log_end_offset):
        (seg,) = [s for s in reader.segments_for(offset, offset + 1)]
        buf = seg.view()
        h = decode_header(buf, seg.position_for(buf, offset), seg.size)
        assert h.base_offset <= offset <= h.last_offset


def test_reader_pickles_and_reads_after_unpickling(log: pylog.Log, clock: pylog.ManualClock) -> None:
    plog = _written(log, clock, rolls=2)
    reader = pickle.loads(pickle.dumps(_reader(plog)))  # what a Spark executor receives
    assert reader.log_end_offset == plog.log_end_offset
    seg = reader.segments[-1]
    got = [h.base_offset for _, h in walk_headers(seg.view(), 0, seg.size, seg.path)]
    assert got == [b.header.base_offset for b in plog.read(seg.base_offset, 1 << 20)]


def test_reader_does_not_see_an_unpublished_roll(log: pylog.Log, clock: pylog.ManualClock) -> None:
    plog = _written(log, clock, rolls=1)
    end = plog.log_end_offset
    stray = files.segment_path(plog.directory, end + 100, files.LOG)
    open(stray, "wb").close()  # a roll that has not published its segment yet
    try:
        assert list_segments(plog.directory)[-1] == end + 100
        assert _reader(plog).segments[-1].base_offset < end + 100
        assert _reader(plog).log_end_offset == end
    finally:
        os.unlink(stray)


def test_read_published_is_the_seqlock_read_of_the_state(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(os.fspath(tmp_path), files.STATE)
    assert read_published(path) is None  # no file: never used
    state = PartitionState(path)
    try:
        assert read_published(path) is None  # created, nothing published yet
        snap = Snapshot(10, 5, 300, 2, T0)
        state.lock()
        state.publish(snap)
        assert read_published(path) == state.read() == snap
        with open(path, "r+b") as f:
            f.seek(8)
            f.write(struct.pack("<q", 3))  # a writer died mid-publish: seq stays odd
        with pytest.raises(CorruptRecordError, match="middle of publishing"):
            read_published(path, spins=3)
        state.reset(snap)
        assert read_published(path) == snap
        state.unlock()
    finally:
        state.close()


def test_walk_headers_names_the_file_of_a_damaged_header() -> None:
    batches = [encode_batch(i * 3, [b"k"] * 3, [b"v"] * 3, [T0] * 3) for i in range(3)]
    buf = bytearray(b"".join(batches))
    positions = [0, len(batches[0]), len(batches[0]) + len(batches[1])]
    assert [p for p, _ in walk_headers(buf, 0, len(buf))] == positions
    assert [h.base_offset for _, h in walk_headers(buf, positions[1], len(buf))] == [3, 6]
    struct.pack_into("<i", buf, positions[2] + BATCH_LENGTH_AT, 1 << 20)  # runs past the end
    walk = walk_headers(buf, 0, len(buf), "/d/00.log")
    assert [p for p, _ in itertools.islice(walk, 2)] == positions[:2]
    with pytest.raises(CorruptRecordError, match=r"/d/00\.log at position") as info:
        next(walk)
    assert (info.value.path, info.value.position) == ("/d/00.log", positions[2])
    with pytest.raises(CorruptRecordError) as raw:
        list(walk_headers(buf, 0, len(buf)))  # no path: the header's own error
    assert "/d/" not in str(raw.value)
    buf[positions[0] + HEADER_FIELD_AT["magic"]] = 9
    with pytest.raises((UnsupportedFormatError, CorruptRecordError), match=r"/d/00\.log"):
        list(walk_headers(buf, 0, len(buf), "/d/00.log"))


def test_header_field_positions_follow_the_header_struct() -> None:
    raw = HEADER.pack(*range(1, len(BatchHeader._fields) + 1))
    for i, name in enumerate(BatchHeader._fields):
        fmt = "<" + HEADER.format.lstrip("<")[i]
        assert struct.unpack_from(fmt, raw, HEADER_FIELD_AT[name])[0] == i + 1, name


@pytest.mark.parametrize(
    ("topic", "partition"), [("t", 0), ("t", 12), ("my-topic", 3), ("a-1", 0), ("t-", 1), ("x.y_z", 99)]
)
def test_partition_dir_names_round_trip(topic: str, partition: int) -> None:
    name = files.partition_dir_name(topic, partition)
    assert files.parse_partition_dir_name(name) == (topic, partition)
    assert files.partition_dir("/r", topic, partition) == os.path.join("/r", name)


@pytest.mark.parametrize("name", ["t", "t-", "-1", "t-x", "t-01", "manifest", "__groups"])
def test_not_partition_dir_names(name: str) -> None:
    assert files.parse_partition_dir_name(name) is None


def test_live_segments_are_logs_without_a_temporary_suffix(tmp_path: os.PathLike[str]) -> None:
    directory = os.fspath(tmp_path)
    names = [
        files.segment_path(directory, base, kind + suffix)
        for base, kind, suffix in [
            (0, files.LOG, ""),
            (0, files.INDEX, ""),
            (7, files.LOG, ""),
            (7, files.TIMEINDEX, ""),
            (12, files.LOG, files.CLEANED),
            (12, files.LOG, files.SWAP),
            (20, files.LOG, files.DELETED),
            (30, files.LOG, ""),
            (31, files.INDEX, files.TMP),
        ]
    ]
    for path in [*names, os.path.join(directory, files.STATE), os.path.join(directory, "42.log")]:
        open(path, "wb").close()
    assert list_segments(directory) == [0, 7, 30]
    assert list_segments(directory, up_to=7) == [0, 7]
    assert files.live_segment_bases(map(os.path.basename, names), 29) == [0, 7]


def test_a_partition_being_created_reads_as_empty_and_one_without_segments_is_corrupt(
    tmp_path: os.PathLike[str],
) -> None:
    directory = os.path.join(os.fspath(tmp_path), "t-0")
    os.mkdir(directory)
    state = PartitionState(os.path.join(directory, files.STATE))  # first use creates it before any segment
    try:
        reader = PartitionReader(directory, "t", 0)
        assert (reader.log_start_offset, reader.log_end_offset) == (0, 0)
        open(os.path.join(directory, files.CHECKPOINT), "wb").close()  # only written after a segment exists
        with pytest.raises(CorruptRecordError, match="no segment files"):
            PartitionReader(directory, "t", 0)
    finally:
        state.close()
