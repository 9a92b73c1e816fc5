"""AsyncConsumer never moves a position or a commit past a record it has not returned.

``getone()`` and ``async for`` hand out records one at a time from what one ``poll()`` returned; the records
not handed out yet are given back before ``position()``, ``commit()`` or ``stop()`` run, and ``getmany()``
returns them first. The model: the records produced, in order; what the user got must be exactly their
prefix, and every committed offset the end of that prefix.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import pylog
from pylog.aio import AsyncConsumer
from pylog.structs import TopicPartition

TP = TopicPartition("ev", 0)
N = 120


@pytest.fixture
def log(tmp_path: Any) -> Any:
    with pylog.open(str(tmp_path / "log")) as log:
        log.create_topic("ev")
        producer = log.producer(acks=1)
        for i in range(N):
            producer.send("ev", i, partition=0)
        producer.close()
        yield log


def _committed(log: Any) -> int | None:
    found = log.group_offsets("g").get(TP)
    return None if found is None else int(found.offset)


def test_getone_then_commit_and_position_count_only_what_was_returned(log: Any) -> None:
    async def run() -> None:
        async with AsyncConsumer(log, "ev", group_id="g", auto_offset_reset="earliest") as consumer:
            got = [(await consumer.getone()).offset for _ in range(3)]
            assert got == [0, 1, 2]
            assert await consumer.position(TP) == 3
            await consumer.commit()
            assert _committed(log) == 3
            got += [(await consumer.getone()).offset for _ in range(2)]
            rest = await consumer.getmany(max_records=10)  # what getone() kept comes first
            got += [r.offset for r in rest[TP]]
            assert got == list(range(15))
        assert _committed(log) == 15  # stop() commits what was returned

    asyncio.run(run())


def test_async_for_that_stops_early_commits_only_what_it_returned(log: Any) -> None:
    async def run() -> None:
        consumer = AsyncConsumer(log, "ev", group_id="g", auto_offset_reset="earliest")
        got = []
        async for record in consumer:
            got.append(record.offset)
            if len(got) == 7:
                break
        await consumer.stop()
        assert got == list(range(7))
        assert _committed(log) == 7

    asyncio.run(run())


def test_commit_after_every_record_of_an_async_for(log: Any) -> None:
    async def run() -> None:
        consumer = AsyncConsumer(
            log, "ev", group_id="g", auto_offset_reset="earliest", enable_auto_commit=False
        )
        got = []
        async for record in consumer:
            got.append(record.offset)
            await consumer.commit()
            assert _committed(log) == record.offset + 1
            if len(got) == N:
                break
        await consumer.stop()
        assert got == list(range(N))

    asyncio.run(run())


def test_a_seek_back_into_the_fetched_records_returns_them_without_fetching_again(
    log: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pylog.fetcher import Fetcher

    fetches = []
    fetch = Fetcher.fetch
    monkeypatch.setattr(Fetcher, "fetch", lambda self, tp: fetches.append(tp) or fetch(self, tp))
    consumer = log.consumer(auto_offset_reset="earliest", consumer_timeout_ms=0)
    consumer.assign([TP])
    assert [r.offset for r in consumer.poll(max_records=10)[TP]] == list(range(10))
    consumer.seek(TP, 3)
    assert consumer.position(TP) == 3
    assert [r.offset for r in consumer.poll(max_records=5)[TP]] == [3, 4, 5, 6, 7]
    got = []
    for record in consumer:  # a seek back during a `for` loop: the loop goes on from there
        got.append(record.offset)
        if record.offset == 20 and got.count(20) == 1:
            consumer.seek(TP, 15)
        if record.offset == 60:
            break
    assert got == list(range(8, 21)) + list(range(15, 61))
    consumer.seek(TP, 50)
    assert [r.offset for r in consumer.poll(max_records=2)[TP]] == [50, 51]
    assert len(fetches) == 1
    consumer.seek(TP, N)  # not held: fetched as before
    assert consumer.poll() == {}
    assert len(fetches) == 2
    consumer.close()
