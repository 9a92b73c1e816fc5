"""The broker's write path for the records it decodes: keys and values are stored as sent, with None kept,
without the per-record type check that ``Producer.send_batch`` makes of user input (``Column.of_bytes``)."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio_client import RawClient

from pylog.batching import Column
from pylog.broker.broker import Broker


def _model(n: int, seed: int) -> list[tuple[bytes | None, bytes | None]]:
    return [
        (None if i % 3 == 0 else f"k{seed}-{i}".encode(), None if i % 4 == 1 else bytes([i % 256]) * (i % 50))
        for i in range(n)
    ]


def _batch(records: list[tuple[bytes | None, bytes | None]], pid: int = -1, sequence: int = -1) -> bytes:
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=sequence,
        batch_size=1 << 20,
    )
    for i, (key, value) in enumerate(records):
        b.append(i, timestamp=None, key=key, value=value, headers=[])
    return bytes(b.build())


def _produce(client: RawClient, topic: str, records: bytes, acks: int) -> tuple[ErrorCode, int]:
    request = ProduceRequest(
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=0, records=records),)),
        ),
    )
    part = client.call(0, 9, request).responses[0].partition_responses[0]
    return part.error_code, part.base_offset


def _stored(broker: Broker, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    c = broker.log.consumer(
        topic, auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None
    )
    try:
        return [(r.key, r.value) for r in c]
    finally:
        c.close()


@pytest.fixture
def no_user_checks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``Column.of`` (the checked constructor for user input) refuses to run: the broker must not need it."""

    def refuse(cls: type[Column], col: Any, what: str) -> Column:
        raise AssertionError("the broker's decoded records went through Column.of's per-record checks")

    monkeypatch.setattr(Column, "of", classmethod(refuse))
    yield


@pytest.mark.parametrize("acks", [1, -1])
def test_decoded_records_are_stored_as_sent_without_the_user_checks(
    broker: Broker, no_user_checks: None, acks: int
) -> None:
    broker.log.create_topic("w", partitions=1)
    client = RawClient(broker.host, broker.port)
    try:
        sent: list[tuple[bytes | None, bytes | None]] = []
        for seed, n in enumerate([1, 7, 300]):
            records = [(k, v) for k, v in _model(n, seed) if k is not None or v is not None]
            code, base = _produce(client, "w", _batch(records), acks)
            assert (code, base) == (ErrorCode.none, len(sent))
            sent += records
        idem = _model(5, 9)[1:]
        code, base = _produce(client, "w", _batch(idem, pid=7, sequence=0), acks)
        assert (code, base) == (ErrorCode.none, len(sent))
        sent += idem
    finally:
        client.close()
    assert _stored(broker, "w") == sent


def test_of_bytes_matches_of() -> None:
    col: list[bytes | None] = [b"a", None, b"", b"xyz", None, b"\x00" * 9]
    checked, trusted = Column.of(col, "values"), Column.of_bytes(col)
    assert trusted.lens.tolist() == checked.lens.tolist() == [1, -1, 0, 3, -1, 9]
    assert len(trusted) == len(checked) == 6
    for sel in (slice(0, 6), slice(1, 4)):
        lens, data = trusted.take(sel)
        lens2, data2 = checked.take(sel)
        assert (lens.tolist(), bytes(data)) == (lens2.tolist(), bytes(data2))
