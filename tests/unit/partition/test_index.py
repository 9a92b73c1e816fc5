"""Sparse offset and time indexes (pylog.partition.index) and the entries a segment derives from its batches:
the file layout, the sanity checks, and lookups equal to a brute-force scan of the log."""

from __future__ import annotations

import os
import struct
import tempfile
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pylog
from pylog.errors import CorruptIndexError, CorruptRecordError
from pylog.partition.index import (
    OFFSET_ENTRY,
    TIME_ENTRY,
    SparseIndex,
    check_offset_index,
    check_time_index,
)
from pylog.partition.log import PartitionLog
from pylog.partition.segment import MapCache, Segment
from pylog.record import BatchHeader, decode_header, encode_batch

T0 = 1_700_000_000_000


def scan(seg: Segment) -> list[tuple[int, BatchHeader]]:
    """(position, header) of every batch, read straight from the file."""
    with open(seg.path, "rb") as f:
        raw = f.read()[: seg.size]
    out, pos = [], 0
    while pos < len(raw):
        h = decode_header(raw, pos)
        out.append((pos, h))
        pos += h.batch_length
    assert pos == seg.size
    return out


def brute_position_for(batches: list[tuple[int, BatchHeader]], size: int, offset: int) -> int:
    return next((p for p, h in batches if h.last_offset >= offset), size)


def brute_position_for_time(batches: list[tuple[int, BatchHeader]], size: int, ts: int) -> int:
    return next((p for p, h in batches if h.max_timestamp >= ts), size)


def expected_entries(
    batches: list[tuple[int, BatchHeader]], base: int, interval: int, sealed: bool
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The documented rule, written out independently: an offset entry for the first batch and whenever at
    least ``interval`` bytes were written since the previous entry; beside it a time entry when the largest
    timestamp grew since the previous time entry; on seal a final time entry with the largest timestamp."""
    offsets: list[tuple[int, int]] = []
    times: list[tuple[int, int]] = []
    top = -1
    last_pos = None
    for pos, h in batches:
        top = max(top, h.max_timestamp)
        if last_pos is None or (pos > last_pos and pos - last_pos >= interval):
            offsets.append((h.base_offset - base, pos))
            last_pos = pos
            if not times or times[-1][0] < top:
                times.append((top, h.base_offset - base))
    if sealed and batches and times[-1][0] < top:
        times.append((top, offsets[-1][0]))
    return offsets, times


def pairs(index: SparseIndex) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in index.entries.tolist()]


# -- SparseIndex -------------------------------------------------------------------------------------------


def test_entry_layout_is_the_documented_bytes() -> None:
    assert OFFSET_ENTRY.itemsize == 8 and TIME_ENTRY.itemsize == 12
    idx = SparseIndex(OFFSET_ENTRY)
    tix = SparseIndex(TIME_ENTRY)
    for i in range(40):  # past the initial capacity: the array grows
        idx.append(i * 3, i * 100)
        tix.append(T0 + i, i * 3)
    assert idx.entries.tobytes() == b"".join(struct.pack("<II", i * 3, i * 100) for i in range(40))
    assert tix.entries.tobytes() == b"".join(struct.pack("<qI", T0 + i, i * 3) for i in range(40))
    assert len(idx) == 40 and idx.last() == (117, 3900) and tix.last() == (T0 + 39, 117)
    assert SparseIndex(OFFSET_ENTRY).last() is None


def test_pending_bytes_and_truncation() -> None:
    idx = SparseIndex(OFFSET_ENTRY, np.array([(0, 0), (5, 80)], dtype=OFFSET_ENTRY))
    assert idx.written == 2 and idx.pending_bytes() == b""
    idx.append(9, 200)
    assert idx.pending_bytes() == struct.pack("<II", 9, 200)
    idx.written = 3
    idx.truncate_entries(1)
    assert len(idx) == 1 and idx.written == 1 and pairs(idx) == [(0, 0)]
    idx.append(4, 50)
    assert idx.pending_bytes() == struct.pack("<II", 4, 50)


@settings(max_examples=100, deadline=None)
@given(
    gaps=st.lists(st.tuples(st.integers(1, 50), st.integers(1, 500)), max_size=60),
    probes=st.lists(st.integers(0, 4000), max_size=30),
)
def test_floor_lookups_equal_a_linear_search(gaps: list[tuple[int, int]], probes: list[int]) -> None:
    entries = [(0, 0)]
    for dr, dp in gaps:
        entries.append((entries[-1][0] + dr, entries[-1][1] + dp))
    idx = SparseIndex(OFFSET_ENTRY)
    tix = SparseIndex(TIME_ENTRY)
    for rel, pos in entries:
        idx.append(rel, pos)
        tix.append(pos, rel)  # strictly increasing timestamps
    for probe in probes:
        floor = [pos for rel, pos in entries if rel <= probe]
        assert idx.floor_position(probe) == (floor[-1] if floor else 0)
        below = [rel for rel, pos in entries if pos < probe]
        assert tix.time_floor_rel(probe) == (below[-1] if below else 0)


# -- sanity checks ----------------------------------------------------------------------------------------


def _offset_raw(entries: list[tuple[int, int]]) -> bytes:
    return b"".join(struct.pack("<II", r, p) for r, p in entries)


def _time_raw(entries: list[tuple[int, int]]) -> bytes:
    return b"".join(struct.pack("<qI", t, r) for t, r in entries)


def test_check_offset_index_accepts_a_valid_index() -> None:
    e = check_offset_index(_offset_raw([(0, 0), (4, 300), (9, 700)]), 800, 20)
    assert [tuple(x) for x in e.tolist()] == [(0, 0), (4, 300), (9, 700)]
    assert len(check_offset_index(b"", 0, 0)) == 0


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (_offset_raw([(0, 0), (4, 300)]) + b"\x01", "size"),
        (_offset_raw([(0, 0), (4, 300)])[:-3], "size"),
        (_offset_raw([(0, 0), (9, 300), (4, 500)]), "increasing"),
        (_offset_raw([(0, 0), (4, 500), (9, 300)]), "increasing"),
        (_offset_raw([(0, 0), (4, 300), (4, 500)]), "increasing"),
        (_offset_raw([(0, 0), (4, 800)]), "outside"),  # position at or past the log size
        (_offset_raw([(0, 0), (4, 10_000)]), "outside"),
        (_offset_raw([(0, 0), (21, 300)]), "outside"),  # relative offset beyond the segment
        (_offset_raw([(1, 0), (4, 300)]), "outside"),  # the first batch must be indexed at 0
        (_offset_raw([(0, 8), (4, 300)]), "outside"),
    ],
)
def test_check_offset_index_rejects(raw: bytes, why: str) -> None:
    with pytest.raises(CorruptIndexError, match=why):
        check_offset_index(raw, 800, 20, "x.index")
    assert issubclass(CorruptIndexError, CorruptRecordError)


def test_check_time_index() -> None:
    ok = [(T0, 0), (T0 + 5, 4), (T0 + 9, 4)]  # the seal entry may repeat the last indexed batch
    assert len(check_time_index(_time_raw(ok), 20)) == 3
    for bad, why in [
        (_time_raw(ok) + b"\0" * 5, "size"),
        (_time_raw([(T0, 0), (T0, 4)]), "increasing"),
        (_time_raw([(T0 + 5, 0), (T0, 4)]), "increasing"),
        (_time_raw([(T0, 4), (T0 + 5, 0)]), "increasing"),
        (_time_raw([(T0, 0), (T0 + 5, 21)]), "outside"),
    ]:
        with pytest.raises(CorruptIndexError, match=why):
            check_time_index(bad, 20)


# -- indexes derived by a segment ---------------------------------------------------------------------------


batches_st = st.lists(
    st.tuples(
        st.integers(1, 6),  # records
        st.integers(0, 300),  # value size
        st.integers(-50_000, 5_000),  # timestamp offset: often older than the previous batch
    ),
    min_size=1,
    max_size=40,
)


def _fill(plog: PartitionLog, batches: list[tuple[int, int, int]]) -> None:
    for n, size, dt in batches:
        ts = [T0 + dt + i for i in range(n)]
        plog.append(encode_batch(0, [b"k"] * n, [b"v" * size] * n, ts))


def _check_segment(plog: PartitionLog, seg: Segment, sealed: bool) -> None:
    interval = plog.config.index_interval_bytes
    batches = scan(seg)
    want_offsets, want_times = expected_entries(batches, seg.base_offset, interval, sealed)
    assert pairs(seg.offset_index) == want_offsets
    assert pairs(seg.time_index) == want_times
    for rel, pos in want_offsets:  # every entry names the batch that is really there
        assert decode_header(seg.view(), pos).base_offset == seg.base_offset + rel
    assert seg.max_timestamp == max(h.max_timestamp for _, h in batches)
    for offset in range(seg.base_offset, seg.next_offset + 2):
        assert seg.position_for(offset) == brute_position_for(batches, seg.size, offset)
    stamps = sorted({h.max_timestamp for _, h in batches})
    for ts in [stamps[0] - 1, *stamps, *(t + 1 for t in stamps)]:
        assert seg.position_for_time(ts) == brute_position_for_time(batches, seg.size, ts), ts


@settings(max_examples=40, deadline=None)
@given(batches=batches_st, interval=st.sampled_from([0, 1, 64, 256, 1000, 1 << 20]))
def test_segment_indexes_follow_the_rule_and_lookups_equal_a_scan(
    batches: list[tuple[int, int, int]], interval: int
) -> None:
    with tempfile.TemporaryDirectory() as root:
        clock = pylog.ManualClock(T0)
        with pylog.open(root, clock=clock) as log:
            log.create_topic("t", index_interval_bytes=interval, segment_bytes=1 << 20)
            plog = log.topic("t").partition(0)
            _fill(plog, batches)
            active = plog.segments[-1]
            _check_segment(plog, active, sealed=False)
            plog.flush()  # entries reach the files
            with open(active.index_path, "rb") as f:
                assert f.read() == active.offset_index.entries.tobytes()
            with open(active.timeindex_path, "rb") as f:
                assert f.read() == active.time_index.entries.tobytes()
            plog.roll()
            sealed = plog.segments[0]
            _check_segment(plog, sealed, sealed=True)
            in_memory = (pairs(sealed.offset_index), pairs(sealed.time_index))
        with pylog.open(root, clock=clock) as log:  # loaded from the files, not rebuilt
            plog = log.topic("t").partition(0)
            assert log.recovery["t-0"].indexes_rebuilt == 0
            seg = plog.segments[0]
            assert (pairs(seg.offset_index), pairs(seg.time_index)) == in_memory
            _check_segment(plog, seg, sealed=True)
            assert plog.verify() == []


def test_every_batch_is_indexed_with_interval_zero(log: pylog.Log) -> None:
    log.create_topic("t", index_interval_bytes=0)
    plog = log.topic("t").partition(0)
    _fill(plog, [(2, 10, i) for i in range(30)])
    seg = plog.segments[0]
    assert [pos for _, pos in pairs(seg.offset_index)] == [pos for pos, _ in scan(seg)]


def test_rebuilt_indexes_equal_the_written_ones(log_dir: str, clock: pylog.ManualClock) -> None:
    with pylog.open(log_dir, clock=clock) as log:
        log.create_topic("t", index_interval_bytes=200, segment_bytes=3000)
        plog = log.topic("t").partition(0)
        _fill(plog, [(1 + i % 4, 7 * i % 250, (i * 7919) % 9000 - 4000) for i in range(120)])
        written = [(pairs(s.offset_index), pairs(s.time_index)) for s in plog.segments]
        assert len(written) > 5
    for seg_file in os.listdir(os.path.join(log_dir, "t-0")):
        if seg_file.endswith((".index", ".timeindex")):
            os.unlink(os.path.join(log_dir, "t-0", seg_file))
    with pylog.open(log_dir, clock=clock) as log:
        plog = log.topic("t").partition(0)
        assert log.recovery["t-0"].indexes_rebuilt == len(written)
        assert [(pairs(s.offset_index), pairs(s.time_index)) for s in plog.segments] == written
        assert plog.verify() == []


def test_load_indexes_rejects_an_entry_that_does_not_match_the_log(log: pylog.Log) -> None:
    log.create_topic("t", index_interval_bytes=0)
    plog = log.topic("t").partition(0)
    _fill(plog, [(3, 10, 0)] * 5)
    plog.flush()
    seg = plog.segments[0]
    probe = Segment(seg.directory, seg.base_offset, MapCache())
    probe.size = seg.size
    assert probe.load_indexes(0xFFFFFFFF)
    with open(seg.index_path, "rb") as f:
        raw = bytearray(f.read())
    struct.pack_into("<I", raw, len(raw) - 8, 13)  # last entry: right position, wrong offset
    with open(seg.index_path, "wb") as f:
        f.write(raw)
    assert not probe.load_indexes(0xFFFFFFFF)
    os.unlink(seg.index_path)
    assert not probe.load_indexes(0xFFFFFFFF)


def test_largest_timestamp_survives_a_reopen_when_an_unindexed_batch_raised_it(
    log_dir: str, clock: pylog.ManualClock
) -> None:
    # batch 1 raises the largest timestamp but is not indexed; batch 2 is indexed and older
    dts = [0, 1000, 0, 0, 0, 0]
    with pylog.open(log_dir, clock=clock) as log:
        log.create_topic("t", index_interval_bytes=150)
        plog = log.topic("t").partition(0)
        _fill(plog, [(1, 20, dt) for dt in dts])
        assert [pos for _, pos in pairs(plog.segments[0].offset_index)] == [0, 190, 380]
        assert plog.offset_for_time(T0 + 500) == (1, T0 + 1000)
    for _ in range(2):
        with pylog.open(log_dir, clock=clock) as log:
            plog = log.topic("t").partition(0)
            assert plog.segments[0].max_timestamp == T0 + 1000
            assert plog.offset_for_time(T0 + 500) == (1, T0 + 1000)
            clock.set(T0 + 500 + plog.config.retention_ms)  # within retention of T0 + 1000 only
            plog.roll()
            assert plog.apply_retention() == 0
            assert plog.log_start_offset == 0


def test_flushes_racing_appends_keep_the_index_files_exact(log_dir: str) -> None:
    """A thread that flushes (fsync outside the partition lock) while others append must not lose or
    interleave index entries: the files stay equal to what a scan of the log derives."""
    with pylog.open(log_dir) as log:
        log.create_topic("t", index_interval_bytes=64, segment_bytes=1 << 20)
        plog = log.topic("t").partition(0)
        stop = threading.Event()

        def flusher() -> None:
            while not stop.is_set():
                plog.flush()

        threads = [threading.Thread(target=flusher) for _ in range(2)]
        for t in threads:
            t.start()
        producer = log.producer(value_serializer=None)
        try:
            for i in range(3000):
                producer.send("t", b"v%d" % i, timestamp_ms=1_700_000_000_000 + (i * 7919) % 100_000).get()
        finally:
            stop.set()
            for t in threads:
                t.join()
        producer.close()
        plog.flush()
        assert log.verify() == {}
