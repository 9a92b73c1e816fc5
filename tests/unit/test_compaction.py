"""Log compaction against a model: the latest value of every key survives with its offset, tombstones expire
after delete_retention_ms, the lag and dirty ratio are honoured, readers skip removed offsets."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pylog
from pylog.errors import ConfigError, InvalidRecordError

T0 = 1_700_000_000_000


def _fill(
    log: pylog.Log, clock: pylog.ManualClock, ops: list[tuple[int, int | None]], flush_every: int = 7
) -> dict[int, tuple[bytes, object]]:
    """Append ``(key, value-or-None)`` records to ``kv``-0; returns offset -> (key, value) of everything."""
    producer = log.producer()
    sent: dict[int, tuple[bytes, object]] = {}
    for i, (k, v) in enumerate(ops):
        meta = producer.send("kv", v, key=f"k{k}", partition=0).get()
        sent[meta.offset] = (f"k{k}".encode(), v)
        clock.advance(10)
        if i % flush_every == 0:
            producer.flush()
    producer.close()
    return sent


def _records(log: pylog.Log) -> dict[int, tuple[bytes, object]]:
    c = log.consumer("kv", auto_offset_reset="earliest", consumer_timeout_ms=0)
    out = {r.offset: (r.key, r.value) for r in c}
    c.close()
    return out


def _latest(sent: dict[int, tuple[bytes, object]]) -> dict[bytes, int]:
    latest: dict[bytes, int] = {}
    for off in sorted(sent):
        latest[sent[off][0]] = off
    return latest


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 12), st.one_of(st.none(), st.integers(0, 10**6))), min_size=1, max_size=250
    ),
    advance=st.integers(0, 200_000),
    reopen=st.booleans(),
)
def test_compaction_keeps_the_latest_record_of_every_key(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[int, int | None]], advance: int, reopen: bool
) -> None:
    path = tmp_path_factory.mktemp("compact")
    clock = pylog.ManualClock(T0)
    with pylog.open(path, clock=clock) as log:
        topic = log.create_topic(
            "kv",
            cleanup_policy="compact",
            segment_bytes=600,
            delete_retention_ms=100_000,
            min_cleanable_dirty_ratio=0.0,
        )
        sent = _fill(log, clock, ops)
        clock.advance(advance)
        before = _records(log)
        topic.compact()
        active_base = topic.partition(0).segments[-1].base_offset
        if reopen:
            log.close()
            log = pylog.open(path, clock=clock)
            topic = log.topic("kv")
        after = _records(log)
        latest = _latest(sent)
        # the cleaner sees the segments before the active one: "latest" there is what decides
        cleanable = _latest({o: r for o, r in sent.items() if o < active_base})
        horizon = clock.time_ms() - 100_000
        for off, (key, value) in after.items():
            assert before[off] == (key, value) == sent[off]  # offsets unchanged, bytes unchanged
        for off, (key, value) in before.items():
            survives = off in after
            if off >= active_base:
                assert survives  # the active segment is never cleaned
            elif cleanable[key] != off:
                assert not survives, f"offset {off} is not the latest of {key!r} but survived"
            elif value is not None:
                assert survives, f"the latest record of {key!r} (offset {off}) was removed"
        table = topic.table()
        model = {k: sent[o][1] for k, o in latest.items() if sent[o][1] is not None}
        assert table == model
        assert log.verify() == {}
        del horizon
        log.close()


def test_tombstones_survive_delete_retention_then_go(log: pylog.Log, clock: pylog.ManualClock) -> None:
    topic = log.create_topic(
        "kv",
        cleanup_policy="compact",
        segment_bytes=300,
        delete_retention_ms=60_000,
        min_cleanable_dirty_ratio=0.0,
    )
    _fill(log, clock, [(1, 1), (2, 2), (1, None)] + [(3, i) for i in range(40)], flush_every=1)
    topic.compact()
    assert any(v is None for _, v in _records(log).values())  # the tombstone is young: kept
    clock.advance(61_000)
    topic.compact()
    records = _records(log)
    assert all(v is not None for _, v in records.values()) and b"k1" not in {k for k, _ in records.values()}
    assert topic.table()[b"k2"] == 2


def test_lag_and_dirty_ratio_hold_cleaning_back(log: pylog.Log, clock: pylog.ManualClock) -> None:
    topic = log.create_topic(
        "kv",
        cleanup_policy="compact",
        segment_bytes=300,
        min_compaction_lag_ms=50_000,
        min_cleanable_dirty_ratio=0.5,
    )
    _fill(log, clock, [(i % 3, i) for i in range(60)], flush_every=1)
    (result,) = topic.compact(force=False)
    assert result.skipped and result.records_removed == 0  # every segment is younger than the lag
    clock.advance(60_000)
    (result,) = topic.compact(force=False)
    assert result.records_removed > 0
    (again,) = topic.compact(force=False)
    assert "dirty ratio" in again.skipped  # nothing new since the last pass


def test_reads_at_removed_offsets_resume_at_the_next_survivor(
    log: pylog.Log, clock: pylog.ManualClock
) -> None:
    topic = log.create_topic("kv", cleanup_policy="compact", segment_bytes=300, min_cleanable_dirty_ratio=0.0)
    sent = _fill(log, clock, [(i % 4, i) for i in range(80)], flush_every=1)
    topic.compact()
    survivors = sorted(_records(log))
    gaps = [o for o in sent if o not in survivors]
    assert gaps
    tp = pylog.TopicPartition("kv", 0)
    for off in random.Random(3).sample(gaps, min(10, len(gaps))):
        c = log.consumer(consumer_timeout_ms=0)
        c.assign([tp])
        c.seek(tp, off)
        first = c.poll(max_records=1)[tp][0]
        assert first.offset == min(o for o in survivors if o > off)


def test_misuse_is_typed(log: pylog.Log) -> None:
    log.create_topic("plain")
    with pytest.raises(ConfigError):
        log.topic("plain").compact()
    log.create_topic("kv", cleanup_policy="compact")
    producer = log.producer()
    with pytest.raises(InvalidRecordError, match="needs a key"):
        producer.send("kv", 1)
    with pytest.raises(InvalidRecordError, match="needs a key"):
        producer.send_batch("kv", values=[b"a"])
    assert log.topic("kv").partition(0).log_end_offset == 0


def test_retention_runs_the_cleaner_for_compacted_topics(log: pylog.Log, clock: pylog.ManualClock) -> None:
    topic = log.create_topic(
        "kv",
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
