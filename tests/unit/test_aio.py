"""asyncio clients: same semantics as the blocking ones, and no file work on the event loop's thread."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest

import pylog
from pylog.aio import AsyncConsumer, AsyncProducer
from pylog.errors import RecordTooLargeError, UnknownTopicError


def test_many_concurrent_tasks_get_distinct_contiguous_offsets(log: pylog.Log) -> None:
    log.create_topic("t", partitions=4)

    async def main() -> list[pylog.RecordMetadata]:
        async with AsyncProducer(log, acks="all") as producer:

            async def task(n: int) -> list[pylog.RecordMetadata]:
                return [
                    await producer.send_and_wait("t", {"task": n, "i": i}, key=f"k{n}") for i in range(50)
                ]

            results = await asyncio.gather(*(task(n) for n in range(100)))
        return [m for r in results for m in r]

    metas = asyncio.run(main())
    assert len(metas) == 5000
    per_partition: dict[int, list[int]] = {}
    for m in metas:
        per_partition.setdefault(m.partition, []).append(m.offset)
    for p, offsets in per_partition.items():
        assert sorted(offsets) == list(range(len(offsets))), p  # no gap, no duplicate
        assert log.topic("t").partition(p).flushed_offset == len(offsets)  # acks="all": fsynced
    # each task's records are in one partition (same key), in send order
    consumer = log.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0)
    seen: dict[int, list[int]] = {}
    for rec in consumer:
        seen.setdefault(rec.value["task"], []).append(rec.value["i"])
    assert all(v == list(range(50)) for v in seen.values()) and len(seen) == 100


def test_errors_are_the_blocking_producers_typed_errors(log: pylog.Log) -> None:
    log.create_topic("t", max_message_bytes=1000)

    async def main() -> None:
        async with AsyncProducer(log) as producer:
            with pytest.raises(UnknownTopicError):
                await producer.send_and_wait("missing", 1)
            with pytest.raises(RecordTooLargeError):
                await producer.send_and_wait("t", b"x" * 5000)
            meta = await producer.send_and_wait("t", 1)
            assert meta.offset == 0

    asyncio.run(main())
    assert log.topic("t").partition(0).log_end_offset == 1


def test_file_work_never_runs_on_the_loop_thread(log: pylog.Log, monkeypatch: pytest.MonkeyPatch) -> None:
    log.create_topic("t", partitions=2)
    threads: set[str] = set()
    from pylog.partition.log import PartitionLog

    calls = Counter[str]()

    def spy(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            threads.add(threading.current_thread().name)
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    for name in ("append", "flush", "read", "read_raw"):
        monkeypatch.setattr(PartitionLog, name, spy(name, getattr(PartitionLog, name)))

    async def main() -> int:
        loop_thread = threading.current_thread().name
        async with AsyncProducer(log, acks="all") as producer:
            await asyncio.gather(*(producer.send_and_wait("t", i, key=str(i)) for i in range(200)))
        async with AsyncConsumer(log, "t", auto_offset_reset="earliest", consumer_timeout_ms=0) as consumer:
            n = 0
            async for _ in consumer:
                n += 1
        assert loop_thread not in threads
        return n

    assert asyncio.run(main()) == 200
    assert calls["read_raw"] + calls["read"] > 0 and calls["append"] + calls["flush"] > 0


def test_async_group_consumers_share_the_partitions(log_dir: str) -> None:
    with pylog.open(log_dir) as log:
        log.create_topic("t", partitions=6)
        producer = log.producer()
        for i in range(600):
            producer.send("t", i, key=str(i))
        producer.close()

        async def member(stop: asyncio.Event, out: list[int]) -> None:
            async with AsyncConsumer(
                log, "t", group_id="g", auto_offset_reset="earliest", enable_auto_commit=False
            ) as consumer:
                while not stop.is_set():
                    batch = await consumer.getmany(timeout_ms=20)
                    for records in batch.values():
                        out.extend(r.value for r in records)
                    if batch:
                        await consumer.commit()

        async def main() -> list[list[int]]:
            stop = asyncio.Event()
            outs: list[list[int]] = [[], [], []]
            tasks = [asyncio.create_task(member(stop, o)) for o in outs]
            for _ in range(1000):
                await asyncio.sleep(0.02)
                committed = log.group_offsets("g") if "g" in log.list_groups() else {}
                if sum(om.offset for om in committed.values()) == 600:
                    break
            stop.set()
            await asyncio.gather(*tasks)
            return outs

        outs = asyncio.run(main())
        everything = [v for o in outs for v in o]
        assert sorted(everything) == list(
            range(600)
        )  # each record once: orderly rebalances, commits per batch
        assert all(
            om.offset == log.topic("t").partition(tp.partition).log_end_offset
            for tp, om in log.group_offsets("g").items()
        )
