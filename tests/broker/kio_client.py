"""A raw Kafka protocol client for tests that must send exact requests (kio's messages over a socket), and
the requests and record batches those tests send: one builder of each, shared by the broker tests."""

from __future__ import annotations

import datetime
import io
import socket
import struct
from collections.abc import Sequence
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.serial import entity_reader, entity_writer

TIMESTAMP = 1_700_000_000_000  # the records' timestamp unless a test asks for another (None: now)


class RawClient:
    def __init__(self, host: str, port: int, timeout: float = 60.0, *, client_id: str = "raw-test") -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.client_id = client_id
        self._correlation = 0

    @classmethod
    def to(cls, address: str, client_id: str = "raw-test") -> RawClient:
        """A client of the broker at ``address`` (``host:port``) that names itself ``client_id``."""
        host, _, port = address.rpartition(":")
        return cls(host, int(port), client_id=client_id)

    def call(self, api_key: int, version: int, body: Any) -> Any:
        """Send ``body`` (a kio request entity of ``api_key``/``version``), return the decoded response."""
        schema = load_request_schema(api_key, version)
        self._correlation += 1
        header_schema = schema.__header_schema__
        fields = {
            "request_api_key": api_key,
            "request_api_version": version,
            "correlation_id": self._correlation,
        }
        if "client_id" in header_schema.__dataclass_fields__:
            fields["client_id"] = self.client_id
        out = io.BytesIO()
        entity_writer(header_schema)(out, header_schema(**fields))
        entity_writer(schema)(out, body)
        frame = out.getvalue()
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        data = self._read(struct.unpack(">i", self._read(4))[0])
        response = load_response_schema(api_key, version)
        header, at = entity_reader(response.__header_schema__)(data, 0)
        assert header.correlation_id == self._correlation
        decoded, _ = entity_reader(response)(data, at)
        return decoded

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by the broker")
            buf += chunk
        return buf

    def close(self) -> None:
        self.sock.close()


def record_batch(
    values: Sequence[bytes | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    timestamp: int | None = TIMESTAMP,
    headers: bool = False,
    compression: int = 0,
) -> bytes:
    """A Kafka record batch (v2) as kafka-python builds it: ``values`` (with ``keys``, default None) at
    ``timestamp``; ``headers``: record ``i`` has the header ``("h", b"i")``."""
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 30,
    )
    for i, v in enumerate(values):
        key = None if keys is None else keys[i]
        b.append(i, timestamp=timestamp, key=key, value=v, headers=[("h", b"%d" % i)] if headers else [])
    return bytes(b.build())


def idempotent_batch(
    pid: int, epoch: int, sequence: int, values: Sequence[bytes | None], **options: Any
) -> bytes:
    """A batch of producer ``pid`` at ``epoch`` from ``sequence`` (the other options of :func:`record_batch`)."""
    return record_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=sequence, **options)


def produce_request(client: RawClient, topic: str, records: bytes, partition: int = 0, acks: int = -1) -> Any:
    """The answer to one Produce v9 of ``records`` to ``topic``-``partition``."""
    request = ProduceRequest(
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            TopicProduceData(
                name=topic, partition_data=(PartitionProduceData(index=partition, records=records),)
            ),
        ),
    )
    return client.call(0, 9, request)


def produce(
    client: RawClient, topic: str, records: bytes, partition: int = 0, acks: int = -1
) -> tuple[ErrorCode, int]:
    """``(error code, base offset)`` of one Produce v9 of ``records`` to ``topic``-``partition``."""
    part = produce_request(client, topic, records, partition, acks).responses[0].partition_responses[0]
    return part.error_code, part.base_offset


def init_producer_id(client: RawClient, pid: int = -1, epoch: int = -1) -> tuple[ErrorCode, int, int]:
    """``(error code, producer id, epoch)`` of an InitProducerId v4 without a transactional id (``pid`` and
    ``epoch``: the producer's current ones, to bump its epoch, KIP-360)."""
    r = client.call(
        22,
        4,
        InitProducerIdRequest(
            transactional_id=None,
            transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=pid,
            producer_epoch=epoch,
        ),
    )
    return r.error_code, r.producer_id, r.producer_epoch
