"""A Hypothesis state machine of a compacted partition against a model.

Steps: appends of records with random keys from a small pool, values or tombstones and sometimes headers;
clock moves; rolls; cleaning passes (forced, or through ``apply_retention`` when the dirty ratio says so);
clean reopens. The model is every record ever written, by offset, and the clock time of every pass.

Invariants, after every step:
- reading from the beginning returns offsets in increasing order, each record byte-identical (key, value,
  timestamp, header bytes) to the one written at that offset; the log start offset stays 0 and the end is the
  number of records written;
- the latest record of every key is present, unless it is a tombstone and at least ``delete_retention_ms``
  passed between the first pass after it was written and the last pass;
- ``Topic.table()`` equals the latest value of every key; ``verify()`` finds nothing; the cleaner checkpoint is
  intact.
After a pass: nothing in the segment that was active before it changed; and with no compaction lag, a forced
pass leaves, before the active segment, only the latest record of each key there (or, when nothing else is
left, the last record).
"""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import pylog
from pylog.partition.cleaner import load_checkpoint
from pylog.partition.log import PartitionLog
from pylog.record import encode_headers

T0 = 1_700_000_000_000
RETENTION = 1_000
Raw = tuple[bytes | None, bytes | None, int, bytes]

keys = st.sampled_from([b"a", b"b", b"c", b"dd", b"eee", b"ffff0000", b"g" * 12])
values = st.one_of(st.none(), st.binary(max_size=40))


class CompactionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="pylog-compact-machine-")
        self.clock = pylog.ManualClock(T0)
        self.log: pylog.Log | None = None
        self.written: dict[int, Raw] = {}
        self.passes: list[tuple[int, int]] = []  # (log end offset, clock time) at each pass

    @initialize(
        segment_bytes=st.sampled_from([200, 450, 1200]),
        ratio=st.sampled_from([0.0, 0.5]),
        lag=st.sampled_from([0, 300]),
        compression=st.sampled_from(["none", "zstd"]),
    )
    def open_log(self, segment_bytes: int, ratio: float, lag: int, compression: str) -> None:
        self.lag = lag
        self.compression = compression
        self.log = pylog.open(self.root, clock=self.clock)
        self.log.create_topic(
            "kv",
            cleanup_policy="compact",
            segment_bytes=segment_bytes,
            delete_retention_ms=RETENTION,
            min_cleanable_dirty_ratio=ratio,
            min_compaction_lag_ms=lag,
        )

    def teardown(self) -> None:
        if self.log is not None:
            self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def topic(self) -> pylog.Topic:
        assert self.log is not None
        return self.log.topic("kv")

    @property
    def plog(self) -> PartitionLog:
        return self.topic.partition(0)

    # -- steps ------------------------------------------------------------------------------------------

    @rule(
        records=st.lists(st.tuples(keys, values, st.booleans()), min_size=1, max_size=12),
        batched=st.booleans(),
    )
    def append(self, records: list[tuple[bytes, bytes | None, bool]], batched: bool) -> None:
        assert self.log is not None
        p = self.log.producer(
            value_serializer=None,
            compression_type=self.compression,
            linger_ms=0,
            batch_size=300 if batched else 1,
        )
        sent = []
        for key, value, with_headers in records:
            headers = [("h", key)] if with_headers else None
            future = p.send("kv", value, key=key, partition=0, headers=headers)
            sent.append((future, key, value, encode_headers(headers) if headers else b""))
            self.clock.advance(7)
        p.flush()  # several records per batch: compaction must rebuild batches it keeps only part of
        for future, key, value, header_bytes in sent:
            meta = future.get()
            self.written[meta.offset] = (key, value, meta.timestamp, header_bytes)
        p.close()

    @rule(ms=st.sampled_from([1, 100, RETENTION // 2, RETENTION, 3 * RETENTION]))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule()
    def roll(self) -> None:
        self.plog.roll()

    @rule(force=st.booleans())
    def compact(self, force: bool) -> None:
        plog = self.plog
        active = plog.segments[-1]
        protected = {o: r for o, r in self._read().items() if o >= active.base_offset}
        self.passes.append((plog.log_end_offset, self.clock.time_ms()))
        if force:
            (result,) = self.topic.compact()
        else:
            self.log.apply_retention()  # type: ignore[union-attr]
            result = None
        after = self._read()
        assert all(after.get(o) == r for o, r in protected.items()), "the active segment changed"
        if result is not None and not result.skipped and self.lag == 0:
            before_active = sorted(o for o in after if o < active.base_offset)
            latest: dict[bytes | None, int] = {}
            for o in sorted(o for o in self.written if o < active.base_offset):
                latest[self.written[o][0]] = o
            stale = [o for o in before_active if latest[self.written[o][0]] != o]
            assert not stale or stale == before_active == [before_active[-1]], f"stale records kept: {stale}"

    @precondition(lambda self: self.log is not None)
    @rule()
    def reopen(self) -> None:
        assert self.log is not None
        self.log.close()
        self.log = pylog.open(self.root, clock=self.clock)

    # -- invariants -------------------------------------------------------------------------------------

    def _read(self) -> dict[int, Raw]:
        out: dict[int, Raw] = {}
        last = -1
        for b in self.plog.batches():
            raw_headers = bytes(b.header_data)
            bounds = b.header_offsets.tolist() if b.header_offsets is not None else None
            for i, (o, k, v, t) in enumerate(
                zip(b.offsets.tolist(), b.keys(), b.values(), b.timestamps.tolist(), strict=True)
            ):
                assert o > last, "offsets must increase"
                last = o
                out[o] = (k, v, t, raw_headers[bounds[i] : bounds[i + 1]] if bounds else b"")
        return out

    @invariant()
    def records_are_the_ones_written(self) -> None:
        if self.log is None:
            return
        present = self._read()
        for o, raw in present.items():
            assert self.written[o] == raw, f"offset {o} holds {raw}, written {self.written[o]}"
        plog = self.plog
        assert plog.log_start_offset == 0
        assert plog.log_end_offset == len(self.written)
        latest: dict[bytes | None, int] = {}
        for o in sorted(self.written):
            latest[self.written[o][0]] = o
        for key, o in latest.items():
            if o in present:
                continue
            assert self.written[o][1] is None, f"the latest record of {key!r} (offset {o}) is gone"
            first = next((t for end, t in self.passes if end > o), None)
            assert first is not None and self.passes[-1][1] - first >= RETENTION, (
                f"the tombstone of {key!r} (offset {o}) went before delete_retention_ms"
            )

    @invariant()
    def table_is_the_latest_value_of_every_key(self) -> None:
        if self.log is None:
            return
        model: dict[bytes, bytes] = {}
        for o in sorted(self.written):
            key, value, _, _ = self.written[o]
            assert key is not None
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        assert self.topic.table(value_deserializer=None) == model

    @invariant()
    def log_is_consistent(self) -> None:
        if self.log is None:
            return
        assert self.log.verify() == {}
        assert load_checkpoint(self.plog.directory)[1] is None


CompactionMachine.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_compaction_machine = CompactionMachine.TestCase
