"""Records below the log start are never returned (Kafka's OFFSET_OUT_OF_RANGE rule).

A consumer stops at offset 15 (paused, or closed after committing 15) while retention, by time (a
ManualClock) or by size, moves the log start past it. When it reads again, every record it returns is at or
above the log start it had when the read began; its position is reset by ``auto_offset_reset``: to the log
start with ``"earliest"``, the log end with ``"latest"``; with ``"none"`` it raises OffsetOutOfRangeError (and
again at the next call) until a seek, and returns nothing. ``lag()`` counts from the log start.
Read modes: ``poll()``, ``for record in consumer``, and a group member.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import pylog
from pylog.clock import ManualClock
from pylog.errors import OffsetOutOfRangeError
from pylog.structs import ConsumerRecord, TopicPartition

T0 = 1_700_000_000_000
TP = TopicPartition("ev", 0)
HOUR_MS = 3_600_000


def _send(log: Any, first: int, n: int) -> None:
    producer = log.producer(acks=1)
    for i in range(first, first + n):
        producer.send("ev", {"i": i}, partition=0)
        if i % 10 == 9:
            producer.flush()
    producer.close()


def _open(root: str, clock: ManualClock, retention: str) -> Any:
    log = pylog.open(root, clock=clock)
    if "ev" not in log.topics():
        limits = {"retention_ms": HOUR_MS} if retention == "time" else {"retention_bytes": 3000}
        log.create_topic("ev", segment_bytes=1000, **limits)
    return log


def _retire_the_first_records(log: Any, clock: ManualClock) -> int:
    """Two hours later 100 more records arrive and retention runs: the log start moves past offset 15."""
    clock.advance(2 * HOUR_MS)
    _send(log, 200, 100)
    assert sum(log.apply_retention().values()) > 0
    start = int(log.topic("ev").partition(0).log_start_offset)
    assert start > 15
    return start


def _records(consumer: Any, mode: str) -> Iterator[ConsumerRecord]:
    """Everything the consumer returns now, one read call at a time, each checked against the log start the
    log had when the call began."""
    plog = consumer.log.topic("ev").partition(0)
    it = iter(consumer) if mode == "iteration" else None
    while True:
        start = plog.log_start_offset
        if it is not None:
            got = [r for r in [next(it, None)] if r is not None]
        else:
            got = [r for recs in consumer.poll(timeout_ms=0).values() for r in recs]
        if not got:
            return
        assert all(r.offset >= start for r in got), ([r.offset for r in got][:5], start)
        yield from got


@pytest.mark.parametrize("retention", ["time", "size"])
@pytest.mark.parametrize("mode", ["poll", "iteration"])
@pytest.mark.parametrize("reset", ["earliest", "latest", "none"])
def test_a_paused_consumer_never_returns_records_retention_deleted(
    tmp_path: Any, retention: str, mode: str, reset: str
) -> None:
    clock = ManualClock(T0)
    with _open(str(tmp_path), clock, retention) as log:
        _send(log, 0, 200)
        consumer = log.consumer(auto_offset_reset=reset, consumer_timeout_ms=0)
        consumer.assign([TP])
        consumer.seek(TP, 0)
        assert [r.offset for r in consumer.poll(max_records=15)[TP]] == list(range(15))
        consumer.pause(TP)  # records 15-199 stay fetched in the consumer
        start = _retire_the_first_records(log, clock)
        end = log.topic("ev").partition(0).log_end_offset
        lag = consumer.lag()
        consumer.resume(TP)
        if reset == "none":
            for _ in range(2):  # raised by every read until a seek; nothing returned
                with pytest.raises(OffsetOutOfRangeError, match="auto_offset_reset='none'"):
                    list(_records(consumer, mode))
            assert consumer.position(TP) == 15
            consumer.seek_to_beginning(TP)
        got = [r.offset for r in _records(consumer, mode)]
        assert got == ([] if reset == "latest" else list(range(start, end)))
        assert consumer.position(TP) == end
        assert lag == {TP: end - start}  # counted from the log start: the records that still exist
        _send(log, 300, 10)
        assert [r.offset for r in _records(consumer, mode)] == list(range(300, 310))
        consumer.close()


@pytest.mark.parametrize("retention", ["time", "size"])
@pytest.mark.parametrize("reset", ["earliest", "latest", "none"])
def test_a_group_whose_committed_offset_was_deleted_is_reset_by_auto_offset_reset(
    tmp_path: Any, retention: str, reset: str
) -> None:
    clock = ManualClock(T0)
    with _open(str(tmp_path), clock, retention) as log:
        _send(log, 0, 200)
        first = log.consumer("ev", group_id="g", auto_offset_reset="earliest", enable_auto_commit=False)
        got: list[int] = []
        while len(got) < 15:
            got += [r.offset for r in first.poll(timeout_ms=100, max_records=15 - len(got)).get(TP, [])]
        first.commit()
        first.close()
        assert log.group_offsets("g")[TP].offset == 15
        start = _retire_the_first_records(log, clock)
        end = log.topic("ev").partition(0).log_end_offset
        member = log.consumer("ev", group_id="g", auto_offset_reset=reset, consumer_timeout_ms=0)
        if reset == "none":
            for _ in range(2):  # the first poll joins the group; each raises, and nothing is returned
                with pytest.raises(OffsetOutOfRangeError, match="auto_offset_reset='none'"):
                    member.poll(timeout_ms=1000)
            assert member.position(TP) == 15
            assert member.lag() == {TP: end - start}
            member.close()
            assert log.group_offsets("g")[TP].offset == 15  # nothing returned, nothing committed
            return
        rest = [r.offset for r in member.poll(timeout_ms=1000).get(TP, [])]  # joins the group
        assert member.assignment() == {TP}
        rest += [r.offset for r in _records(member, "poll")]
        assert rest == (list(range(start, end)) if reset == "earliest" else [])
        member.close()
        assert log.group_offsets("g")[TP].offset == end


def test_a_read_whose_log_start_moves_again_after_the_reset_is_reset_again(tmp_path: Any) -> None:
    """Retention (of another process, say) moves the log start twice while one poll reads: the reset to the
    log start is itself overtaken. The poll resets again and returns records from the newest log start on
    (it raised OffsetOutOfRangeError although auto_offset_reset was "earliest")."""
    clock = ManualClock(T0)
    with _open(str(tmp_path), clock, "size") as log:
        _send(log, 0, 200)
        consumer = log.consumer(auto_offset_reset="earliest", consumer_timeout_ms=0)
        consumer.assign([TP])
        consumer.seek(TP, 0)
        plog = log.topic("ev").partition(0)
        read_raw = plog.read_raw
        starts: list[int] = []

        def overtaken(offset: int, max_bytes: int) -> Any:
            if len(starts) < 2:  # before each of the first two reads, retention moves the log start on
                _send(log, 300 + 100 * len(starts), 100)
                log.apply_retention()
                starts.append(int(plog.log_start_offset))
                assert offset < starts[-1]
            return read_raw(offset, max_bytes)

        plog.read_raw = overtaken
        try:
            got = [r.offset for r in _records(consumer, "poll")]
        finally:
            del plog.read_raw
        assert len(starts) == 2 and starts[0] < starts[1]
        assert got == list(range(starts[1], plog.log_end_offset))
        consumer.close()


def test_a_read_retried_batch_by_batch_after_retention_moved_the_log_start_is_reset(tmp_path: Any) -> None:
    """A read of several batches fails (as one of a segment being deleted by retention may), and before the
    batch-by-batch re-read the log start moves past the position: the position is reset by
    auto_offset_reset='earliest' and the records from the new log start are returned (the re-read raised
    OffsetOutOfRangeError)."""
    clock = ManualClock(T0)
    with _open(str(tmp_path), clock, "size") as log:
        _send(log, 0, 200)
        consumer = log.consumer(auto_offset_reset="earliest", consumer_timeout_ms=0)
        consumer.assign([TP])
        consumer.seek(TP, 0)
        plog = log.topic("ev").partition(0)
        read_raw = plog.read_raw
        starts: list[int] = []

        def failing_once(offset: int, max_bytes: int) -> Any:
            if not starts:
                _send(log, 300, 100)
                log.apply_retention()
                starts.append(int(plog.log_start_offset))
                raise pylog.errors.CorruptRecordError("a batch header failed its checks")
            return read_raw(offset, max_bytes)

        plog.read_raw = failing_once
        try:
            got = [r.offset for r in _records(consumer, "poll")]
        finally:
            del plog.read_raw
        assert starts and starts[0] > 0
        assert got == list(range(starts[0], plog.log_end_offset))
        consumer.close()
