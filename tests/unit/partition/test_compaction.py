"""Log compaction against a model: the latest record of every key survives with its offset and bytes,
tombstones live delete_retention_ms from the pass that first cleaned them, the lag and the dirty ratio hold
cleaning back, transactions are respected, readers skip removed offsets (also while a swap happens), the
checkpoint is durable and exact, and the table view equals the model."""

from __future__ import annotations

import fcntl
import os
import random
import struct
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pylog
from pylog.errors import ConfigError, CorruptRecordError, InvalidRecordError
from pylog.partition import cleaner, files
from pylog.partition.cleaner import CleanerCheckpoint, load_checkpoint, read_checkpoint
from pylog.partition.log import PartitionLog

T0 = 1_700_000_000_000
DAY = 86_400_000
Raw = tuple[bytes | None, bytes | None, int, bytes]


def _fill(
    log: pylog.Log,
    clock: pylog.ManualClock,
    ops: list[tuple[int, int | None]],
    flush_every: int = 7,
    **producer: Any,
) -> dict[int, tuple[bytes, object]]:
    """Append ``(key, value-or-None)`` records to ``kv``-0, a batch per ``flush_every`` records; returns
    offset -> (key, value) of everything."""
    p = log.producer(**producer)
    futures = []
    for i, (k, v) in enumerate(ops):
        futures.append((p.send("kv", v, key=f"k{k}", partition=0), f"k{k}".encode(), v))
        clock.advance(10)
        if (i + 1) % flush_every == 0:
            p.flush()
    p.flush()
    sent = {f.get().offset: (k, v) for f, k, v in futures}
    p.close()
    return sent


def _records(log: pylog.Log) -> dict[int, tuple[bytes, object]]:
    c = log.consumer("kv", auto_offset_reset="earliest", consumer_timeout_ms=0)
    out = {r.offset: (r.key, r.value) for r in c}
    c.close()
    return out


def _dump(plog: PartitionLog) -> dict[int, Raw]:
    """offset -> (key, value, timestamp, header bytes) of every record, read batch by batch."""
    out: dict[int, Raw] = {}
    for b in plog.batches():
        raw_headers = bytes(b.header_data)
        bounds = b.header_offsets.tolist() if b.header_offsets is not None else None
        for i, (o, k, v, t) in enumerate(
            zip(b.offsets.tolist(), b.keys(), b.values(), b.timestamps.tolist(), strict=True)
        ):
            out[o] = (k, v, t, raw_headers[bounds[i] : bounds[i + 1]] if bounds else b"")
    return out


def _latest(sent: dict[int, tuple[bytes, object]]) -> dict[bytes, int]:
    latest: dict[bytes, int] = {}
    for off in sorted(sent):
        latest[sent[off][0]] = off
    return latest


def _model_table(sent: dict[int, tuple[bytes, object]]) -> dict[bytes, object]:
    return {k: sent[o][1] for k, o in _latest(sent).items() if sent[o][1] is not None}


def _compacted(log: pylog.Log, name: str = "kv", **config: Any) -> pylog.Topic:
    config.setdefault("cleanup_policy", "compact")
    config.setdefault("min_cleanable_dirty_ratio", 0.0)
    return log.create_topic(name, **config)


# -- the model --------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 12), st.one_of(st.none(), st.integers(0, 10**6))), min_size=10, max_size=250
    ),
    compression=st.sampled_from(["none", "gzip", "lz4", "zstd"]),
    headers=st.booleans(),
    reopen=st.booleans(),
)
def test_compaction_keeps_the_latest_record_of_every_key(
    tmp_path_factory: pytest.TempPathFactory,
    ops: list[tuple[int, int | None]],
    compression: str,
    headers: bool,
    reopen: bool,
) -> None:
    path = tmp_path_factory.mktemp("compact")
    clock = pylog.ManualClock(T0)
    log = pylog.open(path, clock=clock)
    topic = _compacted(log, segment_bytes=260, delete_retention_ms=100_000)
    p = log.producer(compression_type=compression, linger_ms=0, batch_size=300)
    futures = []
    for i, (k, v) in enumerate(ops):
        hdrs = [("i", str(i).encode())] if headers and i % 3 else None
        futures.append((p.send("kv", v, key=f"k{k}", partition=0, headers=hdrs), f"k{k}".encode(), v))
        clock.advance(10)
        if i % 5 == 4:
            p.flush()  # batches of up to 5 records: compaction rebuilds those it keeps part of
    p.flush()
    sent = {f.get().offset: (k, v) for f, k, v in futures}
    p.close()
    before = _dump(topic.partition(0))
    active_base = topic.partition(0).segments[-1].base_offset
    (result,) = topic.compact()
    if reopen:
        log.close()
        log = pylog.open(path, clock=clock)
        topic = log.topic("kv")
    plog = topic.partition(0)
    after = _dump(plog)
    cleanable = _latest({o: r for o, r in sent.items() if o < active_base})
    for off, raw in after.items():
        assert before[off] == raw  # offsets, keys, values, timestamps and header bytes unchanged
    kept_stale = [o for o in after if o < active_base and cleanable[sent[o][0]] != o]
    for off, (key, _) in sent.items():
        if off >= active_base or cleanable[key] == off:
            # the active segment is never cleaned; the latest record of a key always survives (a tombstone
            # too: this pass is the first to clean it)
            assert off in after, f"offset {off} of {key!r} was removed"
    if kept_stale:
        # only when nothing else survives before the active segment: its last record stays
        assert kept_stale == [active_base - 1] and len([o for o in after if o < active_base]) == 1
    assert plog.log_start_offset == 0 and plog.log_end_offset == len(sent)
    assert result.records_removed == len(before) - len(after)
    assert topic.table() == _model_table(sent)
    assert log.verify() == {}
    log.close()


def test_tombstones_live_delete_retention_ms_from_their_first_cleaning(
    log: pylog.Log, clock: pylog.ManualClock
) -> None:
    topic = _compacted(log, segment_bytes=300, delete_retention_ms=60_000)
    p = log.producer()
    p.send("kv", 1, key="k1", partition=0)
    p.send("kv", 2, key="k2", partition=0)
    # a tombstone stamped long ago: its record timestamp does not start its retention
    p.send("kv", None, key="k1", partition=0, timestamp_ms=T0 - 10 * DAY)
    p.close()
    _fill(log, clock, [(3, i) for i in range(40)], flush_every=1)
    clock.advance(5 * DAY)
    topic.compact()  # the first pass to see it: kept for delete_retention_ms from now
    assert (b"k1", None) in _records(log).values()
    clock.advance(59_999)
    topic.compact()
    assert (b"k1", None) in _records(log).values()
    clock.advance(1)
    (result,) = topic.compact()
    records = _records(log)
    assert result.tombstones_removed == 1
    assert b"k1" not in {k for k, _ in records.values()}
    assert topic.table() == {b"k2": 2, b"k3": 39}


def test_an_expiring_tombstone_starts_a_pass_by_itself(log: pylog.Log, clock: pylog.ManualClock) -> None:
    topic = _compacted(log, segment_bytes=300, delete_retention_ms=60_000, min_cleanable_dirty_ratio=0.9)
    _fill(log, clock, [(1, 1), (1, None)] + [(2, i) for i in range(30)], flush_every=1)
    topic.compact()
    assert load_checkpoint(topic.partition(0).directory)[0].tombstones_since == clock.time_ms()
    (idle,) = topic.compact(force=False)
    assert idle.skipped  # nothing dirty, the tombstone is young
    clock.advance(60_000)
    (due,) = topic.compact(force=False)
    assert not due.skipped and due.tombstones_removed == 1
    assert load_checkpoint(topic.partition(0).directory)[0].tombstones_since == -1


def test_lag_and_dirty_ratio_hold_cleaning_back(log: pylog.Log, clock: pylog.ManualClock) -> None:
    topic = _compacted(log, segment_bytes=300, min_compaction_lag_ms=50_000, min_cleanable_dirty_ratio=0.5)
    _fill(log, clock, [(i % 3, i) for i in range(60)], flush_every=1)
    (result,) = topic.compact(force=False)
    assert result.skipped and result.records_removed == 0  # every segment is younger than the lag
    clock.advance(60_000)
    (result,) = topic.compact(force=False)
    assert result.records_removed > 0
    assert read_checkpoint(topic.partition(0).directory) == topic.partition(0).segments[-1].base_offset
    (again,) = topic.compact(force=False)
    assert "dirty ratio" in again.skipped  # nothing new since the last pass


def test_the_lag_cuts_the_cleanable_range_at_the_first_young_segment(
    log: pylog.Log, clock: pylog.ManualClock
) -> None:
    topic = _compacted(log, segment_bytes=300, min_compaction_lag_ms=50_000)
    sent = _fill(log, clock, [(i % 3, i) for i in range(30)], flush_every=1)
    topic.partition(0).roll()
    boundary = topic.partition(0).log_end_offset
    clock.advance(100_000)
    sent.update(_fill(log, clock, [(i % 3, i) for i in range(30)], flush_every=1))
    topic.compact()
    survivors = set(_records(log))
    assert all(o in survivors for o in sent if o >= boundary)  # young: untouched
    assert len([o for o in survivors if o < boundary]) == 3  # old: the latest of each key


def test_reads_at_removed_offsets_resume_at_the_next_survivor(
    log: pylog.Log, clock: pylog.ManualClock
) -> None:
    topic = _compacted(log, segment_bytes=300)
    sent = _fill(log, clock, [(i % 4, i) for i in range(80)], flush_every=1)
    topic.compact()
    survivors = sorted(_records(log))
    gaps = [o for o in sent if o not in survivors]
    assert gaps
    tp = pylog.TopicPartition("kv", 0)
    plog = topic.partition(0)
    for off in random.Random(3).sample(gaps, min(10, len(gaps))):
        after = min(o for o in survivors if o > off)
        c = log.consumer(consumer_timeout_ms=0)
        c.assign([tp])
        c.seek(tp, off)
        assert c.poll(max_records=1)[tp][0].offset == after
        c.close()
        first = plog.read(off, 1)
        assert min(o for o in first[0].offsets.tolist() if o >= off) == after


def test_misuse_is_typed(log: pylog.Log) -> None:
    log.create_topic("plain")
    with pytest.raises(ConfigError):
        log.topic("plain").compact()
    with pytest.raises(ConfigError):
        log.topic("plain").partition(0).compact()
    log.create_topic("kv", cleanup_policy="compact")
    producer = log.producer()
    with pytest.raises(InvalidRecordError, match="needs a key"):
        producer.send("kv", 1)
    with pytest.raises(InvalidRecordError, match="needs a key"):
        producer.send_batch("kv", values=[b"a"])
    assert log.topic("kv").partition(0).log_end_offset == 0
    with pytest.raises(ConfigError):
        log.topic("kv").table(isolation_level="committed")


def test_retention_runs_the_cleaner_for_compacted_topics(log: pylog.Log, clock: pylog.ManualClock) -> None:
    topic = _compacted(
        log,
        cleanup_policy="compact,delete",
        segment_bytes=300,
        retention_ms=10**9,
        min_cleanable_dirty_ratio=0.3,
    )
    _fill(log, clock, [(i % 2, i) for i in range(60)], flush_every=1)
    before = len(_records(log))
    log.apply_retention()
    assert len(_records(log)) < before
    assert topic.table() == {b"k0": 58, b"k1": 59}


def test_the_log_start_offset_never_moves(log: pylog.Log, clock: pylog.ManualClock) -> None:
    """When every record before the active segment is superseded, the last one stays: a position anywhere
    in the cleaned range remains valid (no OffsetOutOfRange, no reset to the log end)."""
    topic = _compacted(log, segment_bytes=300, delete_retention_ms=0)
    _fill(log, clock, [(1, i) for i in range(30)], flush_every=1)
    plog = topic.partition(0)
    active = plog.roll().base_offset
    _fill(log, clock, [(1, None)])  # supersedes everything, and lives in the active segment
    topic.compact()
    clock.advance(1)
    topic.compact()
    assert plog.log_start_offset == 0
    assert [o for o in _dump(plog) if o < active] == [active - 1]
    tp = pylog.TopicPartition("kv", 0)
    c = log.consumer(consumer_timeout_ms=0, auto_offset_reset="none")
    c.assign([tp])
    c.seek(tp, 3)
    assert [r.offset for r in c.poll()[tp]][:1] == [active - 1]


def test_segments_merge_up_to_segment_bytes(log: pylog.Log, clock: pylog.ManualClock) -> None:
    topic = _compacted(log, segment_bytes=400)
    sent = _fill(log, clock, [(i % 5, i) for i in range(200)], flush_every=1)
    plog = topic.partition(0)
    before = len(plog.segments)
    (result,) = topic.compact()
    after = plog.segments
    assert result.segments_removed > 0 and len(after) == before - result.segments_removed
    assert all(s.size <= 400 for s in after[:-1])
    assert after[0].base_offset == 0
    assert topic.table() == _model_table(sent)
    assert log.verify() == {}


def test_a_damaged_base_offset_is_never_rewritten(log: pylog.Log, clock: pylog.ManualClock) -> None:
    """The base offset is outside the CRC: the cleaner checks it instead of baking it into a new batch."""
    topic = _compacted(log, segment_bytes=300)
    _fill(log, clock, [(i % 4, i) for i in range(40)], flush_every=1)
    seg = topic.partition(0).segments[1]
    with open(seg.path, "r+b") as f:
        f.seek(0)
        f.write(struct.pack("<q", seg.base_offset - 1))
    with pytest.raises(CorruptRecordError, match="offsets"):
        topic.compact()
    assert not [n for n in os.listdir(topic.partition(0).directory) if n.endswith((".cleaned", ".swap"))]
    with open(seg.path, "r+b") as f:
        f.write(struct.pack("<q", seg.base_offset))  # as it was: the file was not touched
    assert log.verify() == {}


# -- transactions -----------------------------------------------------------------------------------------


def _txn_log(log: pylog.Log, clock: pylog.ManualClock) -> tuple[pylog.Topic, Any]:
    topic = _compacted(log, segment_bytes=250)
    p = log.producer(transactional_id="tx")
    p.init_transactions()
    return topic, p


def _committed(log: pylog.Log) -> list[tuple[int, bytes, object]]:
    c = log.consumer(
        "kv", auto_offset_reset="earliest", consumer_timeout_ms=0, isolation_level="read_committed"
    )
    out = [(r.offset, r.key, r.value) for r in c]
    c.close()
    return out


def test_aborted_records_go_and_never_hide_committed_ones(log: pylog.Log, clock: pylog.ManualClock) -> None:
    topic, p = _txn_log(log, clock)
    for i in range(6):
        p.begin_transaction()
        p.send("kv", f"v{i}", key=f"k{i % 2}")
        p.send("kv", f"w{i}", key="w")
        if i >= 4:
            p.flush()
            p.abort_transaction()  # the last two overwrite k0, k1 and w, then abort
        else:
            p.commit_transaction()
    p.close()
    topic.partition(0).roll()
    view = topic.table(isolation_level="read_committed")
    assert view == {b"k0": "v2", b"k1": "v3", b"w": "w3"}
    topic.compact()
    assert topic.table(isolation_level="read_committed") == view
    assert topic.table() == view  # the aborted records are gone
    assert [(k, v) for _, k, v in _committed(log)] == [(b"k0", "v2"), (b"k1", "v3"), (b"w", "w3")]


def test_an_open_transaction_stops_the_cleaner(log: pylog.Log, clock: pylog.ManualClock) -> None:
    topic, p = _txn_log(log, clock)
    plain = log.producer()
    for i in range(20):
        plain.send("kv", i, key="a", partition=0)
        plain.flush()
    p.begin_transaction()
    p.send("kv", "pending", key="a", partition=0)
    p.flush()
    for i in range(20):
        plain.send("kv", i, key="b", partition=0)
        plain.flush()
    plain.close()
    plog = topic.partition(0)
    plog.roll()
    open_at = next(s for s in plog.segments if s.base_offset <= 20 < s.next_offset).base_offset
    topic.compact()
    survivors = sorted(_dump(plog))
    assert all(o in survivors for o in range(open_at, 41))  # from the open transaction on: untouched
    assert [o for o in survivors if o < open_at] == [open_at - 1] or open_at == 0
    # without a way to ask about transactions, a transactional batch counts as open
    assert plog.compact(txn_status=None).records_removed == 0
    p.commit_transaction()
    p.close()
    topic.compact()
    assert topic.table(isolation_level="read_committed") == {b"a": "pending", b"b": 19}
    assert [o for o in _dump(plog) if o < 41] == [20, 40]


# -- the checkpoint ---------------------------------------------------------------------------------------


def test_the_checkpoint_layout_round_trips_and_damage_reads_as_empty(tmp_path: Any) -> None:
    cp = CleanerCheckpoint(((10, 1000), (25, 2000)), 1000)
    raw = cp.encode()
    assert len(raw) == 16 + 2 * 16 + 4 and raw[:4] == b"PLCC"
    assert CleanerCheckpoint.decode(raw) == cp
    for i in range(len(raw)):
        damaged = bytearray(raw)
        damaged[i] ^= 0x40
        assert CleanerCheckpoint.decode(bytes(damaged)) is None
    assert CleanerCheckpoint.decode(raw[:-1]) is None
    path = os.path.join(str(tmp_path), files.CLEANER_CHECKPOINT)
    with open(path, "wb") as f:
        f.write(raw[:20])
    checkpoint, problem = load_checkpoint(str(tmp_path))
    assert checkpoint == CleanerCheckpoint() and problem and "damaged" in problem


@pytest.mark.parametrize("retention", [1000, 20_000, 10**7, -1])
def test_the_checkpoint_only_ever_makes_tombstones_live_longer(retention: int) -> None:
    """Pruned passes make a tombstone look cleaned later (never earlier) than it was; a pass within
    delete_retention_ms is kept exactly while at most 64 are. ``-1``: the retention changes at every pass."""
    import numpy as np

    rng = random.Random(retention)
    pruned = CleanerCheckpoint()
    history: list[tuple[int, int]] = []  # every pass, never pruned
    now = end = 0
    for _ in range(300):
        now += rng.randrange(1, 5000)
        end += rng.randrange(0, 30)
        ret = retention if retention >= 0 else rng.choice([1000, 20_000, 10**6])
        pruned = pruned.after_pass(end, now, ret, -1)
        if end > (history[-1][0] if history else 0):
            history.append((end, now))
        offsets = np.arange(0, end + 5, dtype=np.int64)
        truth = CleanerCheckpoint(tuple(history)).cleaned_at(offsets)
        got = pruned.cleaned_at(offsets)
        assert len(pruned.passes) <= 64
        assert (got >= truth).all()
        assert CleanerCheckpoint.decode(pruned.encode()) == pruned
        recent = truth > now - ret
        if retention >= 0 and len([t for _, t in history if t > now - ret]) < 64:
            assert (got[recent] == truth[recent]).all()


def test_truncation_lowers_the_checkpoint(log: pylog.Log, clock: pylog.ManualClock) -> None:
    topic = _compacted(log, segment_bytes=300, delete_retention_ms=60_000)
    _fill(log, clock, [(i % 3, i) for i in range(60)], flush_every=1)
    plog = topic.partition(0)
    topic.compact()
    first_dirty = read_checkpoint(plog.directory)
    clock.advance(120_000)
    plog.truncate_to(first_dirty - 10)
    assert read_checkpoint(plog.directory) <= plog.log_end_offset
    _fill(log, clock, [(7, None)] + [(8, i) for i in range(40)], flush_every=1)
    topic.compact()  # the tombstone was written again below the old end: this pass cleans it first
    assert (b"k7", None) in _records(log).values()


def test_a_run_whose_last_segment_became_active_is_left_alone(
    log: pylog.Log, clock: pylog.ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Truncating exactly at the end of a sealed segment while a pass writes its cleaned copy makes that
    segment the active one with its file and size unchanged. The pass must not merge it into its run: the
    active segment would be replaced by a sealed one (with a roll's final time entry, which no active segment
    has), and verify() then reported its time index as not matching the log."""
    topic = _compacted(log, segment_bytes=300)
    sent = _fill(log, clock, [(i % 3, i) for i in range(60)], flush_every=1)
    plog = topic.partition(0)
    cut = plog.segments[-1].base_offset  # truncating here makes the last sealed segment active, untouched
    write = cleaner._write

    def write_then_truncate(path: str, chunks: list[bytes | memoryview]) -> None:
        write(path, chunks)
        if plog.log_end_offset > cut:
            plog.truncate_to(cut)

    monkeypatch.setattr(cleaner, "_write", write_then_truncate)
    (result,) = topic.compact()
    assert plog.log_end_offset == cut
    assert result.problems or result.skipped  # the partition changed under the pass: nothing swapped
    assert log.verify() == {}
    kept = {o: kv for o, kv in sent.items() if o < cut}
    assert topic.table() == _model_table(kept)
    _fill(log, clock, [(i % 3, i) for i in range(20)], flush_every=1)
    monkeypatch.undo()
    topic.compact()
    assert log.verify() == {}


# -- concurrency ------------------------------------------------------------------------------------------


def test_readers_in_other_threads_never_fail_during_swaps(log: pylog.Log, clock: pylog.ManualClock) -> None:
    topic = _compacted(log, segment_bytes=500)
    p = log.producer()
    sent: dict[int, tuple[bytes, object]] = {}
    lock = threading.Lock()

    def write(n: int) -> None:
        for i in range(n):
            meta = p.send("kv", i, key=f"k{i % 7}", partition=0).get()
            with lock:
                sent[meta.offset] = (f"k{i % 7}".encode(), i)
        p.flush()

    write(300)
    stop = threading.Event()
    errors: list[BaseException] = []

    def read() -> None:
        try:
            while not stop.is_set():
                c = log.consumer("kv", auto_offset_reset="earliest", consumer_timeout_ms=0)
                last = -1
                for r in c:
                    assert r.offset > last
                    last = r.offset
                    with lock:
                        assert sent.get(r.offset, (r.key, r.value)) == (r.key, r.value)
                c.close()
                topic.table()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            stop.set()

    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers:
        t.start()
    for _ in range(15):
        write(40)
        clock.advance(1)
        topic.compact()
    stop.set()
    for t in readers:
        t.join()
    p.close()
    assert not errors, errors[0]
    assert topic.table() == _model_table(sent)
    assert log.verify() == {}


def test_another_handle_sees_the_new_layout(log_dir: str, clock: pylog.ManualClock) -> None:
    """Two handles on one directory stand for two processes: the second reopens the segments whose file the
    first replaced (a new inode under the same name) and forgets the merged ones."""
    with pylog.open(log_dir, clock=clock) as first:
        topic = _compacted(first, segment_bytes=300)
        sent = _fill(first, clock, [(i % 5, i) for i in range(150)], flush_every=1)
        with pylog.open(log_dir, clock=clock) as second:
            assert _records(second) == {o: (k, v) for o, (k, v) in sent.items()}
            topic.compact()
            survivors = _records(first)
            assert len(survivors) < len(sent)
            assert _records(second) == survivors
            assert second.topic("kv").table() == _model_table(sent)
            assert second.verify() == {}


def test_a_second_pass_at_the_same_time_is_skipped(log: pylog.Log, clock: pylog.ManualClock) -> None:
    topic = _compacted(log, segment_bytes=300)
    _fill(log, clock, [(i % 3, i) for i in range(40)], flush_every=1)
    fd = os.open(os.path.join(topic.partition(0).directory, files.CLEANER_LOCK), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        (result,) = topic.compact()
        assert "another cleaning pass" in result.skipped and result.records_read == 0
    finally:
        os.close(fd)
    (result,) = topic.compact()
    assert result.records_removed > 0


# -- the table view ---------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.binary(min_size=0, max_size=6), st.one_of(st.none(), st.binary(max_size=20)), st.integers(0, 2)
        ),
        max_size=200,
    ),
    compact=st.booleans(),
)
def test_table_equals_a_model(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[bytes, bytes | None, int]], compact: bool
) -> None:
    clock = pylog.ManualClock(T0)
    with pylog.open(tmp_path_factory.mktemp("table"), clock=clock) as log:
        topic = _compacted(log, partitions=3, segment_bytes=250)
        p = log.producer(value_serializer=None, linger_ms=0, batch_size=200)
        model: dict[bytes, bytes] = {}
        for part in range(3):
            for key, value, target in ops:
                if target != part:
                    continue
                if value is None:
                    model.pop(key, None)
                else:
                    model[key] = value
                p.send("kv", value, key=key, partition=part)
        p.close()
        if compact:
            topic.compact()
        assert topic.table(value_deserializer=None) == model
        decoded = topic.table(key_deserializer=bytes.hex, value_deserializer=len)
        assert decoded == {k.hex(): len(v) for k, v in model.items()}


# -- a compacted topic whose cleanup_policy changes ----------------------------------------------------------


def _compacted_then_delete(log_dir: str, clock: pylog.ManualClock) -> dict[int, tuple[bytes, object]]:
    """A topic compacted (gaps inside and between its segments), then altered to ``delete`` as Kafka allows;
    returns what a consumer read before the change."""
    with pylog.open(log_dir, clock=clock) as log:
        topic = _compacted(log, segment_bytes=300)
        _fill(log, clock, [(i % 4, i) for i in range(80)], flush_every=1)
        topic.compact()
        before = _records(log)
        log.alter_topic("kv", cleanup_policy="delete")
        assert _records(log) == before
    assert len(before) < 80  # compaction left gaps
    return before


def test_a_cleaned_topic_altered_to_delete_is_read_whole_after_a_reopen(
    log_dir: str, clock: pylog.ManualClock
) -> None:
    before = _compacted_then_delete(log_dir, clock)
    assert os.path.exists(os.path.join(files.partition_dir(log_dir, "kv", 0), files.COMPACTED))
    with pylog.open(log_dir, clock=clock) as log:
        assert _records(log) == before
        assert log.verify() == {}
        offset = log.producer().send("kv", 81, key="k1").get().offset  # appends after the gaps read back
        assert offset == 80
        after = _records(log)
    assert after == {**before, 80: (b"k1", 81)}
    os.unlink(os.path.join(log_dir, ".clean-shutdown"))  # as after a crash: recovery checks every offset
    with pylog.open(log_dir, clock=clock) as log:
        assert _records(log) == after


def test_repair_drops_nothing_of_a_cleaned_topic_altered_to_delete(
    log_dir: str, clock: pylog.ManualClock
) -> None:
    before = _compacted_then_delete(log_dir, clock)
    assert pylog.repair(log_dir) == {}
    with pylog.open(log_dir, clock=clock) as log:
        assert _records(log) == before


def test_a_log_cleaned_before_the_marker_existed_is_read_through_its_cleaner_checkpoint(
    log_dir: str, clock: pylog.ManualClock
) -> None:
    before = _compacted_then_delete(log_dir, clock)
    directory = files.partition_dir(log_dir, "kv", 0)
    os.unlink(os.path.join(directory, files.COMPACTED))  # as a log cleaned and altered by an older pylog
    assert os.path.exists(os.path.join(directory, files.CLEANER_CHECKPOINT))
    with pylog.open(log_dir, clock=clock) as log:
        assert _records(log) == before
    assert pylog.repair(log_dir) == {}


def test_a_never_compacted_topic_keeps_the_exact_offset_check(log_dir: str, clock: pylog.ManualClock) -> None:
    """The marker is left only where compaction ran (or may have run: a compacted topic altered to delete):
    a topic that was never compacted still has every base offset checked exactly."""
    with pylog.open(log_dir, clock=clock) as log:
        topic = log.create_topic("kv", segment_bytes=300)
        _fill(log, clock, [(i % 4, i) for i in range(40)], flush_every=1)
        log.alter_topic("kv", retention_ms=DAY)
        seg = topic.partition(0).segments[1]
        path, base = seg.path, seg.base_offset
    assert not files.offsets_may_skip(files.partition_dir(log_dir, "kv", 0), False)
    with open(path, "r+b") as f:
        f.write(struct.pack("<q", base + 1))  # a gap only compaction may leave
    with pylog.open(log_dir, clock=clock) as log, pytest.raises(CorruptRecordError, match="not contiguous"):
        log.verify()
