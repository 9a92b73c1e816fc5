"""ListOffsets under read_committed (v2+): "latest" is the last stable offset (the first offset of the
earliest transaction still open), not the log end, and an offset by timestamp at or past it is not
answered; read_uncommitted keeps answering the log end. Raw requests, confluent-kafka's
get_watermark_offsets and offsets_for_times and kafka-python's end_offsets with both isolation levels."""

from __future__ import annotations

import confluent_kafka as ck
from kafka import KafkaConsumer
from kafka import TopicPartition as KTP
from kafka_support import WAIT_S
from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kio.schema.types import BrokerId, TopicName
from kio_client import RawClient

from pylog.broker.broker import Broker

_T0 = 1_700_000_000_000
LATEST, MAX_TIMESTAMP = -1, -3


def _list(client: RawClient, topic: str, timestamp: int, isolation: int) -> tuple[int, int]:
    request = ListOffsetsRequest(
        replica_id=BrokerId(-1),
        isolation_level=isolation,
        topics=(
            ListOffsetsTopic(
                name=TopicName(topic),
                partitions=(ListOffsetsPartition(partition_index=0, timestamp=timestamp),),
            ),
        ),
    )
    p = client.call(2, 7, request).topics[0].partitions[0]
    assert p.error_code == 0
    return p.offset, p.timestamp


def _watermarks(broker: Broker, topic: str, isolation: str) -> tuple[int, int]:
    c = ck.Consumer(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": "lso", "isolation.level": isolation}
    )
    try:
        low, high = c.get_watermark_offsets(ck.TopicPartition(topic, 0), WAIT_S, cached=False)
        return low, high
    finally:
        c.close()


def _end_offset(broker: Broker, topic: str, isolation: str) -> int:
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, isolation_level=isolation)
    try:
        tp = KTP(topic, 0)
        return int(c.end_offsets([tp])[tp])
    finally:
        c.close()


def _for_time(broker: Broker, topic: str, ts: int, isolation: str) -> int:
    c = ck.Consumer(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": "lso", "isolation.level": isolation}
    )
    try:
        (tp,) = c.offsets_for_times([ck.TopicPartition(topic, 0, ts)], WAIT_S)
        assert tp.error is None
        return int(tp.offset)
    finally:
        c.close()


def test_latest_under_read_committed_is_the_last_stable_offset(broker: Broker) -> None:
    log = broker.log
    log.create_topic("lso", partitions=1)
    plain = log.producer(value_serializer=None)
    aborted = log.producer(transactional_id="aborted", value_serializer=None)
    held = log.producer(transactional_id="held", value_serializer=None)
    client = RawClient(broker.host, broker.port)
    try:
        for i in range(3):  # offsets 0-2
            plain.send("lso", b"p%d" % i, partition=0, timestamp_ms=_T0 + i)
        plain.flush()
        aborted.init_transactions()
        aborted.begin_transaction()
        aborted.send("lso", b"x", partition=0, timestamp_ms=_T0 + 3)  # offset 3, aborted below
        aborted.flush()
        held.init_transactions()
        held.begin_transaction()
        for i in range(2):  # offsets 4-5: open
            held.send("lso", b"t%d" % i, partition=0, timestamp_ms=_T0 + 4 + i)
        held.flush()
        aborted.abort_transaction()
        for i in range(2):  # offsets 6-7: after the open transaction
            plain.send("lso", b"q%d" % i, partition=0, timestamp_ms=_T0 + 10 + i)
        plain.flush()

        assert _list(client, "lso", LATEST, 0)[0] == 8
        assert _list(client, "lso", LATEST, 1)[0] == 4  # the open transaction's first offset
        # by timestamp: an offset at or past the last stable offset is not answered under read_committed
        assert _list(client, "lso", _T0 + 1, 1) == (1, _T0 + 1)
        assert _list(client, "lso", _T0 + 10, 0) == (6, _T0 + 10)
        assert _list(client, "lso", _T0 + 10, 1) == (-1, -1)
        assert _list(client, "lso", MAX_TIMESTAMP, 0) == (7, _T0 + 11)
        assert _list(client, "lso", MAX_TIMESTAMP, 1) == (-1, -1)
        assert _end_offset(broker, "lso", "read_uncommitted") == 8  # kafka-python
        assert _end_offset(broker, "lso", "read_committed") == 4
        assert _watermarks(broker, "lso", "read_uncommitted") == (0, 8)
        assert _watermarks(broker, "lso", "read_committed") == (0, 4)
        assert _for_time(broker, "lso", _T0 + 10, "read_uncommitted") == 6
        assert _for_time(broker, "lso", _T0 + 1, "read_committed") == 1
        assert _for_time(broker, "lso", _T0 + 10, "read_committed") == -1  # none below the LSO

        held.commit_transaction()
        assert _list(client, "lso", LATEST, 1)[0] == 8
        assert _list(client, "lso", _T0 + 10, 1) == (6, _T0 + 10)
        assert _watermarks(broker, "lso", "read_committed") == (0, 8)

        held.begin_transaction()  # a new open transaction after more plain records
        plain.send("lso", b"r", partition=0, timestamp_ms=_T0 + 20)  # offset 8
        plain.flush()
        held.send("lso", b"u", partition=0, timestamp_ms=_T0 + 21)  # offset 9
        held.flush()
        assert _list(client, "lso", LATEST, 1)[0] == 9
        assert _list(client, "lso", LATEST, 0)[0] == 10
        held.abort_transaction()
        assert _list(client, "lso", LATEST, 1)[0] == 10
    finally:
        client.close()
        for p in (plain, aborted, held):
            p.close()
