"""Fetch under both isolation levels, as Kafka clients expect: read_uncommitted returns the records of
aborted and open transactions too, read_committed only committed ones, stops at the first open transaction
and moves past aborted ones; the last stable offset of a read_committed fetch is the partition's even when
the batches returned end well before it (raw Fetch v11), and confluent-kafka (librdkafka) consumers see
exactly that with isolation.level read_uncommitted and read_committed."""

from __future__ import annotations

import datetime

import confluent_kafka as ck
from kafka_support import WAIT_S, confluent_values
from kio.schema.fetch.v11.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.types import TopicName
from kio_client import RawClient

from pylog.broker.broker import Broker


def _fetch(
    client: RawClient, topic: str, offset: int, isolation: int, max_bytes: int
) -> tuple[int, int, bytes]:
    """(high watermark, last stable offset, records) of one partition."""
    request = FetchRequest(
        max_wait=datetime.timedelta(milliseconds=0),
        min_bytes=1,
        isolation_level=isolation,
        topics=(
            FetchTopic(
                topic=TopicName(topic),
                partitions=(FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=max_bytes),),
            ),
        ),
        forgotten_topics_data=(),
    )
    p = client.call(1, 11, request).responses[0].partitions[0]
    assert p.error_code == 0
    return p.high_watermark, p.last_stable_offset, bytes(p.records or b"")


def test_last_stable_offset_of_a_short_read_committed_fetch(broker: Broker) -> None:
    log = broker.log
    log.create_topic("short", partitions=1)
    plain = log.producer(value_serializer=None)
    held = log.producer(transactional_id="held", value_serializer=None)
    client = RawClient(broker.host, broker.port)
    try:
        for _ in range(4):  # four batches of 100 records of 1 KiB: offsets 0-399
            plain.send_batch("short", None, [b"v" * 1024] * 100, partition=0)
        held.init_transactions()
        held.begin_transaction()
        held.send("short", b"open", partition=0)  # offset 400, open
        held.flush()
        plain.send_batch("short", None, [b"after"] * 10, partition=0)  # 401-410
        hw, lso, records = _fetch(client, "short", 0, 1, 1)  # one batch: ends far before the open one
        assert (hw, lso) == (411, 400)
        assert 0 < len(records) < 200_000
        hw, lso, _ = _fetch(client, "short", 0, 0, 1)
        assert hw == 411
        held.commit_transaction()
        assert _fetch(client, "short", 0, 1, 1)[:2] == (411, 411)
    finally:
        client.close()
        plain.close()
        held.close()


def test_confluent_consumers_with_both_isolation_levels(broker: Broker) -> None:
    broker.log.create_topic("iso", partitions=1)
    txn = ck.Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "iso-writer"})
    txn.init_transactions(WAIT_S)
    plain = ck.Producer({"bootstrap.servers": broker.bootstrap_servers})

    def in_transaction(values: list[bytes]) -> None:
        txn.begin_transaction()
        for v in values:
            txn.produce("iso", value=v, partition=0)
        txn.flush(WAIT_S)

    def write(values: list[bytes]) -> None:
        for v in values:
            plain.produce("iso", value=v, partition=0)
        assert plain.flush(WAIT_S) == 0

    committed_a = [b"a%d" % i for i in range(5)]
    aborted = [b"x%d" % i for i in range(4)]
    plain_b = [b"b%d" % i for i in range(3)]
    pending = [b"t%d" % i for i in range(2)]
    plain_c = [b"c0"]
    in_transaction(committed_a)
    txn.commit_transaction(WAIT_S)
    in_transaction(aborted)
    txn.abort_transaction(WAIT_S)
    write(plain_b)
    in_transaction(pending)  # left open
    write(plain_c)

    everything = committed_a + aborted + plain_b + pending + plain_c
    assert (
        confluent_values(broker, "iso", "read_uncommitted", len(everything), "iso-read_uncommitted")
        == everything
    )
    # read_committed: the aborted records are skipped, and nothing from the open transaction on is returned
    assert confluent_values(broker, "iso", "read_committed", 8, "iso-read_committed") == committed_a + plain_b
    txn.commit_transaction(WAIT_S)
    assert (
        confluent_values(broker, "iso", "read_committed", 11, "iso-read_committed")
        == committed_a + plain_b + pending + plain_c
    )
