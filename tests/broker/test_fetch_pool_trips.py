"""A long-polling Fetch woken by a new record reads its partitions in one trip to the broker's thread pool per
read (the doorbell marks taken before the read, in the same trip), and still returns the record."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from typing import Any

import pytest
from kafka_support import WAIT_S
from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.types import TopicName
from kio_client import RawClient

from pylog.broker import fetch as fetch_module
from pylog.broker.broker import Broker
from pylog.broker.context import Context


def test_a_woken_fetch_makes_one_pool_trip_per_read(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    broker.log.create_topic("wake", partitions=1)
    trips: list[str] = []
    reads: list[int] = []
    started = threading.Event()
    real_run, real_read = Context.run, fetch_module._read_all

    async def run(self: Context, fn: Callable[..., Any], *args: Any) -> Any:
        trips.append(getattr(fn, "__name__", repr(fn)))  # the client sends nothing but the Fetch
        return await real_run(self, fn, *args)

    def read_all(*args: Any) -> Any:
        got = real_read(*args)
        reads.append(got[1])
        started.set()
        return got

    monkeypatch.setattr(Context, "run", run)
    monkeypatch.setattr(fetch_module, "_read_all", read_all)
    client = RawClient(broker.host, broker.port)
    answer: list[Any] = []
    request = FetchRequest(
        max_wait=datetime.timedelta(seconds=WAIT_S),
        min_bytes=1,
        isolation_level=0,
        topics=(
            FetchTopic(
                topic=TopicName("wake"),
                partitions=(FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20),),
            ),
        ),
        forgotten_topics_data=(),
    )
    fetcher = threading.Thread(target=lambda: answer.append(client.call(1, 11, request)))
    fetcher.start()
    try:
        assert started.wait(WAIT_S)  # the first read found nothing: the fetch waits for the doorbell
        producer = broker.log.producer(value_serializer=None)
        producer.send("wake", b"ring", partition=0)
        producer.flush()
        producer.close()
        fetcher.join(WAIT_S)
    finally:
        client.close()
    assert answer, "the fetch was not answered"
    part = answer[0].responses[0].partitions[0]
    assert part.error_code == 0 and b"ring" in bytes(part.records or b"")
    assert reads[0] == 0 and reads[-1] > 0
    assert len(trips) == len(reads), trips
