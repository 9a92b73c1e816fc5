"""A Hypothesis state machine of one partition against a model.

The model is a list of records plus the segment layout the documented rules produce: a roll when the next batch
would not fit in ``segment_bytes`` or it is ``segment_ms`` newer than the active segment's first batch, retention of whole
segments judged on their largest timestamp and on ``retention_bytes``, truncation on batch boundaries, and the
recovery point (only moved by flush, roll and reopen, lowered by truncation). Steps: appends of random batches
(keys and values may be None, timestamps from a ManualClock or explicitly older or newer), reads at random
offsets, rolls, clock moves with retention, flushes, truncation, time lookups, clean reopens, and reopens after
a crash (a kill, or a power cut that loses or zero-fills unflushed bytes of the active segment, or a torn junk
tail). Invariants: log start and end offsets, the segment layout, the recovery point; every read, index lookup
and time lookup equals a scan of the model.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import pylog
from pylog.errors import OffsetOutOfRangeError
from pylog.partition import files
from pylog.partition.checkpoint import RecoveryCheckpoint
from pylog.partition.log import PartitionLog
from pylog.record import encode_batch

T0 = 1_700_000_000_000
Record = tuple[bytes | None, bytes | None, int]


@dataclass
class Batch:
    first: int
    n: int
    max_ts: int
    length: int

    @property
    def end(self) -> int:
        return self.first + self.n


@dataclass
class Seg:
    base: int
    batches: list[Batch] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(b.length for b in self.batches)

    @property
    def max_ts(self) -> int:
        return max((b.max_ts for b in self.batches), default=-1)

    @property
    def first_ts(self) -> int:
        return self.batches[0].max_ts if self.batches else -1


blobs = st.one_of(st.none(), st.binary(max_size=12), st.binary(max_size=80))
big_blobs = st.one_of(blobs, st.binary(min_size=200, max_size=900))


class PartitionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="pylog-machine-")
        self.clock = pylog.ManualClock(T0)
        self.log: pylog.Log | None = None
        self.records: list[Record] = []
        self.segs: list[Seg] = [Seg(0)]
        self.durable = 0

    # -- setup and helpers ------------------------------------------------------------------------------

    @initialize(
        segment_bytes=st.sampled_from([2048, 4096, 8192]),
        index_interval_bytes=st.sampled_from([0, 256, 1024]),
        retention_ms=st.sampled_from([-1, 10_000, 60_000]),
        retention_bytes=st.sampled_from([-1, 3000, 12_000]),
        segment_ms=st.sampled_from([30_000, 7 * 24 * 3600 * 1000]),
    )
    def setup(
        self,
        segment_bytes: int,
        index_interval_bytes: int,
        retention_ms: int,
        retention_bytes: int,
        segment_ms: int,
    ) -> None:
        self.log = pylog.open(self.root, clock=self.clock)
        self.log.create_topic(
            "t",
            segment_bytes=segment_bytes,
            index_interval_bytes=index_interval_bytes,
            retention_ms=retention_ms,
            retention_bytes=retention_bytes,
            segment_ms=segment_ms,
        )
        self.config = self.log.topic("t").config

    def teardown(self) -> None:
        if self.log is not None:
            self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def plog(self) -> PartitionLog:
        assert self.log is not None
        return self.log.topic("t").partition(0)

    @property
    def start(self) -> int:
        return self.segs[0].base

    @property
    def end(self) -> int:
        last = self.segs[-1]
        return last.batches[-1].end if last.batches else last.base

    def model_roll(self) -> None:
        self.segs.append(Seg(self.end))
        self.durable = max(self.durable, self.end)  # a roll fsyncs the sealed segment

    def batch_holding(self, offset: int) -> tuple[Seg, Batch, int]:
        for seg in self.segs:
            pos = 0
            for b in seg.batches:
                if b.first <= offset < b.end:
                    return seg, b, pos
                pos += b.length
        raise AssertionError(offset)

    def reopen(self, *, clean: bool) -> pylog.partition.log.RecoveryReport:
        assert self.log is not None
        self.log = pylog.open(self.root, clock=self.clock)
        self.log.topic("t").partition(0)  # validated at open, or at first use after a clean shutdown
        report = self.log.recovery["t-0"]
        assert report.clean_shutdown == clean
        self.durable = self.end
        return report

    # -- rules ------------------------------------------------------------------------------------------

    @rule(
        records=st.lists(st.tuples(blobs, big_blobs), min_size=1, max_size=8),
        ages=st.lists(st.sampled_from([0, 0, 0, 1, 5_000, 20_000, 90_000, -3_000]), min_size=1, max_size=8),
    )
    def append(self, records: list[tuple[bytes | None, bytes | None]], ages: list[int]) -> None:
        self._append(records, ages)

    @rule(
        records=st.lists(
            st.tuples(st.none() | st.binary(max_size=4), st.binary(max_size=16)), min_size=1, max_size=3
        ),
        ages=st.lists(st.integers(-5_000, 70_000), min_size=1, max_size=3),
    )
    def append_small(self, records: list[tuple[bytes | None, bytes | None]], ages: list[int]) -> None:
        """Small batches with scattered timestamps: several per index interval, the largest often unindexed."""
        self._append(records, ages)

    def _append(self, records: list[tuple[bytes | None, bytes | None]], ages: list[int]) -> None:
        now = self.clock.time_ms()
        stamps = [now - ages[i % len(ages)] for i in range(len(records))]
        raw = encode_batch(0, [k for k, _ in records], [v for _, v in records], stamps)
        active = self.segs[-1]
        if active.size and (
            active.size + len(raw) > self.config.segment_bytes
            or max(stamps) - active.first_ts >= self.config.segment_ms
        ):
            self.model_roll()
        info = self.plog.append(raw)
        assert (info.base_offset, info.last_offset) == (self.end, self.end + len(records) - 1)
        self.segs[-1].batches.append(Batch(self.end, len(records), max(stamps), len(raw)))
        self.records.extend((k, v, t) for (k, v), t in zip(records, stamps, strict=True))

    @rule(data=st.data(), max_bytes=st.sampled_from([1, 300, 4000, 1 << 20]))
    def read(self, data: st.DataObject, max_bytes: int) -> None:
        offset = data.draw(st.integers(self.start, self.end))
        got = self.plog.read(offset, max_bytes)
        if offset == self.end:
            assert got == []
            return
        _, holder, _ = self.batch_holding(offset)
        assert got and got[0].offsets[0] == holder.first
        expected = holder.first
        for b in got:
            offsets = b.offsets.tolist()
            assert offsets == list(range(expected, expected + len(offsets)))
            expected += len(offsets)
            got_records = list(zip(b.keys(), b.values(), b.timestamps.tolist(), strict=True))
            assert got_records == self.records[offsets[0] : offsets[-1] + 1]
        assert expected <= self.end

    @rule(data=st.data())
    def read_out_of_range(self, data: st.DataObject) -> None:
        bad = data.draw(
            st.sampled_from([self.end + 1, self.end + 100] + ([self.start - 1] if self.start else []))
        )
        with pytest.raises(OffsetOutOfRangeError):
            self.plog.read(bad)

    @rule()
    def roll(self) -> None:
        before = len(self.plog.segments)
        seg = self.plog.roll()
        if self.segs[-1].size:
            self.model_roll()
            assert len(self.plog.segments) == before + 1
        assert seg.base_offset == self.segs[-1].base

    @rule(ms=st.sampled_from([0, 1_000, 9_999, 10_001, 30_000, 61_000]))
    def advance_clock_and_apply_retention(self, ms: int) -> None:
        self.clock.advance(ms)
        now = self.clock.time_ms()
        c = self.config
        deleted = 0
        if c.retention_ms >= 0 or c.retention_bytes >= 0:
            active = self.segs[-1]
            expired = c.retention_ms >= 0 and active.size and now - active.max_ts > c.retention_ms
            oversize = c.retention_bytes >= 0 and active.size > c.retention_bytes and len(self.segs) == 1
            if expired or oversize:
                self.model_roll()
            total = sum(s.size for s in self.segs)
            for seg in self.segs[:-1]:
                by_time = c.retention_ms >= 0 and now - seg.max_ts > c.retention_ms
                by_size = c.retention_bytes >= 0 and total - seg.size >= c.retention_bytes
                if not (by_time or by_size):
                    break
                deleted += 1
                total -= seg.size
            self.segs = self.segs[deleted:]
        start_before = self.plog.log_start_offset
        assert self.plog.apply_retention() == deleted
        assert self.plog.log_start_offset >= start_before  # never moves backwards

    @rule()
    def flush(self) -> None:
        assert self.plog.flush() == self.end
        self.durable = self.end

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.start, self.end))
        while len(self.segs) > 1 and self.segs[-1].base >= offset:
            self.segs.pop()
        last = self.segs[-1]
        last.batches = [b for b in last.batches if b.end - 1 < offset]
        del self.records[self.end :]
        assert self.plog.truncate_to(offset) == self.end
        self.durable = min(self.durable, self.end)

    @rule(data=st.data())
    def offset_for_time(self, data: st.DataObject) -> None:
        live = list(enumerate(self.records))[self.start :]
        stamps = [r[2] for _, r in live]
        target = data.draw(
            st.sampled_from([t + d for t in stamps for d in (-1, 0, 1)])
            if stamps
            else st.integers(T0 - 10**6, T0 + 10**6)
        )
        want = next(((o, r[2]) for o, r in live if r[2] >= target), None)
        assert self.plog.offset_for_time(target) == want

    @rule()
    def lookups_equal_a_scan(self) -> None:
        by_base = {s.base_offset: s for s in self.plog.segments}
        for mseg in self.segs:
            seg = by_base[mseg.base]
            pos = 0
            for b in mseg.batches:
                for offset in range(b.first, b.end):
                    assert seg.position_for(offset) == pos
                    assert self.plog.read(offset, 1)[0].offsets[0] == b.first
                pos += b.length
            assert seg.position_for(mseg.batches[-1].end if mseg.batches else mseg.base) == seg.size
        assert self.plog.verify() == []

    @rule()
    def reopen_clean(self) -> None:
        assert self.log is not None
        self.log.close()
        report = self.reopen(clean=True)
        assert report.bytes_truncated == 0 and report.indexes_rebuilt == 0

    @rule(data=st.data(), zero_fill=st.booleans(), junk=st.binary(min_size=1, max_size=300) | st.just(b""))
    def reopen_after_crash(self, data: st.DataObject, zero_fill: bool, junk: bytes) -> None:
        """A kill or a power cut: bytes of the active segment past the recovery point may be lost, zero-filled
        or followed by junk; everything the recovery point covers survives."""
        assert self.log is not None
        active_path = self.plog.segments[-1].path
        self.log.close()
        os.unlink(os.path.join(self.root, ".clean-shutdown"))
        RecoveryCheckpoint(os.path.join(self.root, "t-0", files.CHECKPOINT)).reset(self.durable)
        active = self.segs[-1]
        durable_pos = sum(b.length for b in active.batches if b.end <= self.durable)
        size = active.size
        cut = data.draw(st.integers(durable_pos, size))
        with open(active_path, "r+b") as f:
            f.truncate(cut)
            if zero_fill:
                f.seek(cut)
                f.write(b"\0" * (size - cut))
            f.seek(0, os.SEEK_END)
            f.write(junk)
        kept, boundary = [], 0
        for b in active.batches:
            if boundary + b.length > cut:
                break
            kept.append(b)
            boundary += b.length
        file_size = (size if zero_fill else cut) + len(junk)
        active.batches = kept
        del self.records[self.end :]
        report = self.reopen(clean=False)
        assert report.bytes_truncated == file_size - boundary
        assert report.segments_removed == 0

    # -- invariants -------------------------------------------------------------------------------------

    @invariant()
    def offsets_layout_and_recovery_point(self) -> None:
        if self.log is None:
            return
        plog = self.plog
        assert plog.log_start_offset == self.start
        assert plog.log_end_offset == self.end == len(self.records)
        segments = plog.segments
        assert [(s.base_offset, s.size) for s in segments] == [(s.base, s.size) for s in self.segs]
        # what retention and time lookups judge a segment by
        assert [s.max_timestamp for s in segments] == [s.max_ts for s in self.segs]
        assert plog.recovery_point == self.durable

    @invariant()
    def first_and_last_records_read_back(self) -> None:
        if self.log is None or self.start == self.end:
            return
        for offset in (self.start, self.end - 1):
            b = self.plog.read(offset, 1)[0]
            i = b.offsets.tolist().index(offset)
            assert (b.keys()[i], b.values()[i], int(b.timestamps[i])) == self.records[offset]


PartitionMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_partition_machine = PartitionMachine.TestCase
