"""The broker's write path for the records it decodes: keys and values are stored as sent, with None kept,
without the per-record type check that ``Producer.send_batch`` makes of user input (``Column.of_bytes``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kafka_support import stored
from kio.schema.errors import ErrorCode
from kio_client import RawClient, produce, record_batch

from pylog.batching import Column
from pylog.broker.broker import Broker


def _model(n: int, seed: int) -> list[tuple[bytes | None, bytes | None]]:
    return [
        (None if i % 3 == 0 else f"k{seed}-{i}".encode(), None if i % 4 == 1 else bytes([i % 256]) * (i % 50))
        for i in range(n)
    ]


def _batch(records: list[tuple[bytes | None, bytes | None]], **options: Any) -> bytes:
    return record_batch([v for _, v in records], keys=[k for k, _ in records], timestamp=None, **options)


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
            code, base = produce(client, "w", _batch(records), acks=acks)
            assert (code, base) == (ErrorCode.none, len(sent))
            sent += records
        idem = _model(5, 9)[1:]
        code, base = produce(
            client, "w", _batch(idem, producer_id=7, producer_epoch=0, base_sequence=0), acks=acks
        )
        assert (code, base) == (ErrorCode.none, len(sent))
        sent += idem
    finally:
        client.close()
    assert [(r.key, r.value) for r in stored(broker.log, "w")] == sent


def test_of_bytes_matches_of() -> None:
    col: list[bytes | None] = [b"a", None, b"", b"xyz", None, b"\x00" * 9]
    checked, trusted = Column.of(col, "values"), Column.of_bytes(col)
    assert trusted.lens.tolist() == checked.lens.tolist() == [1, -1, 0, 3, -1, 9]
    assert len(trusted) == len(checked) == 6
    for sel in (slice(0, 6), slice(1, 4)):
        lens, data = trusted.take(sel)
        lens2, data2 = checked.take(sel)
        assert (lens.tolist(), bytes(data)) == (lens2.tolist(), bytes(data2))
