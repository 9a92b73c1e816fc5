"""A damaged stored batch, met by a consumer: the records before it are returned, then the error, and no
position or commit passes a record that was not returned.

The log: one partition of 4 segments of 100 records each (offsets 0-399), one byte flipped in the second
segment (the batch of offsets 100-199). Random damage points, more read modes and several partitions are in
tests/property/test_damaged_reads.py; here the case as a user meets it.
"""

from __future__ import annotations

import asyncio
import glob
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import pylog
from pylog.aio import AsyncConsumer
from pylog.errors import CorruptRecordError
from pylog.structs import ConsumerRecord, TopicPartition

TP = TopicPartition("ev", 0)


def _build(root: str) -> None:
    with pylog.open(root) as log:
        log.create_topic("ev")
        producer = log.producer(acks=1)
        for s in range(4):
            for i in range(100):
                producer.send("ev", {"i": s * 100 + i}, partition=0)
            producer.flush()
            log.topic("ev").partition(0).roll()
        producer.close()


def _damage(root: str) -> None:
    second = sorted(glob.glob(os.path.join(root, "ev-0", "*.log")))[1]
    assert second.endswith(f"{100:020d}.log")
    with open(second, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0x10]))


@pytest.fixture
def damaged(tmp_path: Any) -> str:
    root = str(tmp_path / "log")
    _build(root)
    _damage(root)
    return root


def _poll(consumer: Any, **kwargs: Any) -> Callable[[], list[ConsumerRecord]]:
    return lambda: [r for recs in consumer.poll(**kwargs).values() for r in recs]


def _iteration(consumer: Any) -> Callable[[], list[ConsumerRecord]]:
    state: dict[str, Iterator[ConsumerRecord]] = {}

    def step() -> list[ConsumerRecord]:
        it = state.setdefault("it", iter(consumer))
        try:
            r = next(it, None)
        except BaseException:
            state.clear()
            raise
        return [] if r is None else [r]

    return step


READS = {
    "poll": lambda c: _poll(c, timeout_ms=10_000),
    "poll_max_records_10": lambda c: _poll(c, timeout_ms=10_000, max_records=10),
    "iteration": _iteration,
}


@pytest.mark.parametrize("mode", sorted(READS))
@pytest.mark.parametrize("group", [False, True], ids=["assign", "group"])
def test_records_before_the_damaged_batch_are_returned_then_the_error(
    damaged: str, mode: str, group: bool
) -> None:
    with pylog.open(damaged) as log:
        settings: dict[str, Any] = {"auto_offset_reset": "earliest", "consumer_timeout_ms": 0}
        if group:  # the member gets its assignment in its first poll: a timeout lets that take its time
            settings.update(group_id="g", auto_commit_interval_ms=0, consumer_timeout_ms=10_000)
        consumer = log.consumer(**settings)
        if group:
            consumer.subscribe(["ev"])
        else:
            consumer.assign([TP])
        step = READS[mode](consumer)
        offsets: list[int] = []
        while True:
            try:
                got = step()
            except CorruptRecordError as exc:
                assert "ev-0" in str(exc) and "offset 100" in str(exc)
                break
            assert got, "the damage was not reported"
            offsets += [r.offset for r in got]
            assert consumer.position(TP) == offsets[-1] + 1
            if group:  # auto-commit runs in every poll
                committed = log.group_offsets("g").get(TP)
                assert committed is None or committed.offset <= offsets[-1] + 1
        assert offsets == list(range(100))
        assert consumer.position(TP) == 100
        with pytest.raises(CorruptRecordError):  # and again: the position stays on the damaged batch
            step()
        assert consumer.position(TP) == 100
        consumer.close()
        if group:
            assert log.group_offsets("g")[TP].offset == 100


def test_other_partitions_are_read_past_a_damaged_one(tmp_path: Any) -> None:
    root = str(tmp_path / "log")
    with pylog.open(root) as log:
        log.create_topic("two", partitions=2)
        producer = log.producer(acks=1)
        for p in (0, 1):
            for i in range(300):
                producer.send("two", i, partition=p)
                if i % 100 == 99:
                    producer.flush()
        producer.close()
    first = sorted(glob.glob(os.path.join(root, "two-0", "*.log")))[0]
    with open(first, "r+b") as f:  # the second batch of partition 0 (offsets 100-199)
        size = os.path.getsize(first)
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0x01]))
    with pylog.open(root) as log:
        consumer = log.consumer("two", auto_offset_reset="earliest", max_partition_fetch_bytes=1)
        got: dict[int, list[int]] = {0: [], 1: []}
        errors = 0
        for _ in range(20):
            try:
                for tp, recs in consumer.poll().items():
                    got[tp.partition] += [r.offset for r in recs]
            except CorruptRecordError:
                errors += 1
        assert got[1] == list(range(300))
        assert got[0] == list(range(len(got[0]))) and len(got[0]) <= 100
        assert errors >= 1
        assert consumer.position(TopicPartition("two", 0)) == len(got[0])


def test_async_consumer_returns_the_records_before_the_damage(damaged: str) -> None:
    async def read() -> tuple[list[int], int]:
        with pylog.open(damaged) as log:
            consumer = AsyncConsumer(log, "ev", group_id="g", auto_offset_reset="earliest")
            offsets: list[int] = []
            async with consumer:
                with pytest.raises(CorruptRecordError):
                    while True:
                        offsets += [r.offset for r in (await consumer.getmany(max_records=30)).get(TP, [])]
            return offsets, log.group_offsets("g")[TP].offset

    offsets, committed = asyncio.run(read())
    assert offsets == list(range(100))
    assert committed == 100


def test_cli_consume_group_prints_the_records_before_the_damage_and_commits_them(damaged: str) -> None:
    env = {**os.environ, "PYLOG_DIR": damaged}
    env.pop("PYLOG_DEBUG", None)
    r = subprocess.run(
        [sys.executable, "-m", "pylog.cli", "consume", "ev", "--from-beginning", "--group", "gg", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 100
    assert "Traceback" not in r.stderr and "offset 100" in r.stderr and "damaged" in r.stderr
    assert r.stderr.count("pylog verify") == 1
    with pylog.open(damaged) as log:
        assert log.group_offsets("gg")[TP].offset == 100
