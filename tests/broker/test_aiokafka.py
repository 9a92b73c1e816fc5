"""aiokafka (which speaks only the non-flexible protocol versions) against pylog's broker: produce with its
codecs, consume in a group, commit."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from kafka_support import WAIT_S

from pylog.broker.broker import Broker


@pytest.mark.parametrize("codec", [None, "gzip", "lz4", "zstd"])
def test_aiokafka_produce_and_consume_in_a_group(broker: Broker, codec: str | None) -> None:
    async def run() -> list[tuple[bytes | None, bytes | None]]:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, compression_type=codec)
        await producer.start()
        try:
            for i in range(100):
                await producer.send("aio", key=b"k%d" % i, value=None if i == 7 else b"v%d" % i, partition=0)
            await producer.flush()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            "aio",
            bootstrap_servers=broker.bootstrap_servers,
            group_id="aio-group",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            got: list[tuple[bytes | None, bytes | None]] = []
            while len(got) < 100:
                batch = await consumer.getmany(timeout_ms=1000)
                got.extend((r.key, r.value) for rs in batch.values() for r in rs)
            await consumer.commit()
        finally:
            await consumer.stop()
        return got

    got = asyncio.run(asyncio.wait_for(run(), WAIT_S))
    assert got == [(b"k%d" % i, None if i == 7 else b"v%d" % i) for i in range(100)]
    committed = broker.log.group_offsets("aio-group")
    assert [om.offset for om in committed.values()] == [100]
