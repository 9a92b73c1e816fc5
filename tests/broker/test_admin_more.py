"""Admin calls that change a running log, from unchanged Kafka clients: topic configs altered
(IncrementalAlterConfigs, AlterConfigs), records deleted (DeleteRecords), groups and committed offsets
deleted (DeleteGroups, OffsetDelete); and the address a broker listening on every interface gives clients."""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import kafka.errors
import pytest
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
from aiokafka.admin.config_resource import ConfigResourceType as AioConfigResourceType
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from kafka.admin import ConfigResource as KafkaConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kafka.structs import TopicPartition as KafkaTopicPartition
from kafka.structs import TopicPartitionReplica
from kafka_support import WAIT_S, kafka_python_sasl, sasl_config, secured_broker

import pylog
from pylog import fs
from pylog.broker.acls import Acl, AclStore
from pylog.broker.broker import Broker

SET, DELETE, APPEND, SUBTRACT = (
    AlterConfigOpType.SET,
    AlterConfigOpType.DELETE,
    AlterConfigOpType.APPEND,
    AlterConfigOpType.SUBTRACT,
)


def _admin(broker: Broker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap_servers})


def _outcome(future: Any) -> Any:
    """A future's result, or its Kafka error code."""
    try:
        return future.result(WAIT_S)
    except ck.KafkaException as exc:
        return exc.args[0].code()


def _alter(
    admin: AdminClient, name: str, *entries: tuple[str, str | None, AlterConfigOpType], **kw: Any
) -> Any:
    configs = [ConfigEntry(n, v, incremental_operation=op) for n, v, op in entries]
    resource = ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=configs)
    [future] = admin.incremental_alter_configs([resource], **kw).values()
    return _outcome(future)


# -- IncrementalAlterConfigs, AlterConfigs ----------------------------------------------------------------


def test_incremental_alter_configs_set_delete_append_subtract(broker: Broker, log_dir: Path) -> None:
    log = broker.log
    log.create_topic("t", partitions=2)
    admin = _admin(broker)
    assert _alter(admin, "t", ("retention.ms", "60000", SET), ("cleanup.policy", "compact", APPEND)) is None
    assert (log.topic("t").config.retention_ms, log.topic("t").config.cleanup_policy) == (
        60000,
        "compact,delete",
    )
    assert _alter(admin, "t", ("cleanup.policy", "delete", SUBTRACT), ("retention.ms", None, DELETE)) is None
    config = log.topic("t").config
    assert (config.retention_ms, config.cleanup_policy) == (log.defaults.retention_ms, "compact")
    # validate_only checks and changes nothing
    assert _alter(admin, "t", ("segment.bytes", "4096", SET), validate_only=True) is None
    assert log.topic("t").config == config
    # refused, and nothing of the resource changes: an unknown config, APPEND to a non-list, a bad value,
    # tiered storage switched, an unknown topic
    for entries in (
        [("segment.bytes", "4096", SET), ("no.such.config", "1", SET)],
        [("segment.bytes", "4096", SET), ("retention.ms", "5", APPEND)],
        [("segment.bytes", "many", SET)],
        [("remote.storage.enable", "true", SET)],
    ):
        assert _alter(admin, "t", *entries) == ck.KafkaError.INVALID_CONFIG, entries
    assert log.topic("t").config == config
    assert _alter(admin, "nope", ("retention.ms", "1", SET)) == ck.KafkaError.UNKNOWN_TOPIC_OR_PART
    # a broker's configs are options of `pylog serve`
    broker_resource = ConfigResource(
        ConfigResource.Type.BROKER,
        "0",
        incremental_configs=[ConfigEntry("log.retention.ms", "1", incremental_operation=SET)],
    )
    [future] = admin.incremental_alter_configs([broker_resource]).values()
    assert _outcome(future) == ck.KafkaError.INVALID_REQUEST
    # described as changed, and written in the log directory: a reopened log has it
    resource = ConfigResource(ConfigResource.Type.TOPIC, "t")
    [described] = admin.describe_configs([resource]).values()
    assert described.result(WAIT_S)["cleanup.policy"].value == "compact"
    broker.close()
    log.close()
    with pylog.open(log_dir) as reopened:
        assert reopened.topic("t").config == config


def test_altered_configs_take_effect(broker: Broker) -> None:
    log = broker.log
    log.create_topic("t")
    admin = _admin(broker)
    conf = {"bootstrap.servers": broker.bootstrap_servers, "acks": "all", "message.max.bytes": 10_000}
    producer = ck.Producer(conf)
    errors: list[Any] = []
    hour_ago = int(time.time() * 1000) - 3_600_000
    for i in range(5):
        producer.produce(
            "t", value=b"x" * 2000, timestamp=hour_ago + i, on_delivery=lambda e, m: errors.append(e)
        )
    producer.flush(WAIT_S)
    assert errors == [None] * 5
    plog = log.topic("t").partition(0)
    plog.roll()
    assert log.apply_retention() == {"t": 0}  # the default keeps a week
    assert _alter(admin, "t", ("retention.ms", "60000", SET), ("max.message.bytes", "1024", SET)) is None
    assert log.apply_retention() == {"t": 1}
    assert plog.log_start_offset == 5
    producer.produce("t", value=b"y" * 2000, on_delivery=lambda e, m: errors.append(e))
    producer.flush(WAIT_S)
    assert errors[-1] is not None and errors[-1].code() == ck.KafkaError.MSG_SIZE_TOO_LARGE
    assert plog.log_end_offset == 5


def test_kafka_python_alter_configs(broker: Broker) -> None:
    """kafka-python's alter_configs: IncrementalAlterConfigs by default, AlterConfigs (the whole config is
    replaced: kafka-python sends the other changed configs along) when asked."""
    log = broker.log
    log.create_topic("t", cleanup_policy="compact")
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        resource = KafkaConfigResource(ConfigResourceType.TOPIC, "t", {"retention.ms": "5000"})
        assert admin.alter_configs([resource]) == {"topic": {"t": "OK"}}
        assert (log.topic("t").config.retention_ms, log.topic("t").config.cleanup_policy) == (5000, "compact")
        resource = KafkaConfigResource(ConfigResourceType.TOPIC, "t", {"retention.ms": "6000"})
        assert admin.alter_configs([resource], incremental=False) == {"topic": {"t": "OK"}}
        assert (log.topic("t").config.retention_ms, log.topic("t").config.cleanup_policy) == (6000, "compact")
        resource = KafkaConfigResource(ConfigResourceType.TOPIC, "t", {"segment.bytes": "x"})
        result = admin.alter_configs([resource], incremental=False, raise_on_unknown=False)
        assert "InvalidConfig" in result["topic"]["t"]
        assert log.topic("t").config.segment_bytes == log.defaults.segment_bytes
    finally:
        admin.close()


# -- DeleteGroups, OffsetDelete ------------------------------------------------------------------------


def _commit(broker: Broker, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """A simple commit (a consumer with assign(), no membership) of ``offsets`` for ``group``."""
    consumer = ck.Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    try:
        consumer.commit(
            offsets=[ck.TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False
        )
    finally:
        consumer.close()


def _committed(broker: Broker, group: str) -> dict[tuple[str, int], int]:
    return {(tp.topic, tp.partition): om.offset for tp, om in broker.log.group_offsets(group).items()}


def test_delete_groups_and_offsets_of_kafka_groups(broker: Broker) -> None:
    log = broker.log
    log.create_topic("work", partitions=2)
    log.create_topic("other")
    with log.producer(value_serializer=None) as producer:
        for i in range(10):
            producer.send("work", b"%d" % i, partition=i % 2)
            producer.send("other", b"%d" % i)
    _commit(broker, "kg", {("work", 0): 3, ("work", 1): 4, ("other", 0): 5})
    _commit(broker, "idle", {("other", 0): 1})
    member = ck.Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "kg"})
    member.subscribe(["work"])
    deadline = time.monotonic() + WAIT_S
    while not member.assignment() and time.monotonic() < deadline:
        member.poll(0.1)
    assert member.assignment()
    admin = _admin(broker)
    kafka_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        # a group with a member is not deleted; offsets of a topic it subscribes to are not either
        [future] = admin.delete_consumer_groups(["kg"]).values()
        assert _outcome(future) == ck.KafkaError.NON_EMPTY_GROUP
        result = kafka_admin.delete_group_offsets(
            "kg",
            [KafkaTopicPartition("work", 0), KafkaTopicPartition("other", 0), KafkaTopicPartition("gone", 0)],
        )
        assert {tp.topic: e.__name__ for tp, e in result.items()} == {
            "work": "GroupSubscribedToTopicError",
            "other": "NoError",
            "gone": "UnknownTopicOrPartitionError",
        }
        assert _committed(broker, "kg") == {("work", 0): 3, ("work", 1): 4}
        member.close()
        # empty now: deleted, and so is a group that only committed; an unknown one is not found
        futures = admin.delete_consumer_groups(["kg", "idle", "nosuch"])
        assert {g: _outcome(f) for g, f in futures.items()} == {
            "kg": None,
            "idle": None,
            "nosuch": ck.KafkaError.GROUP_ID_NOT_FOUND,
        }
        assert "kg" not in log.list_groups() and "idle" not in log.list_groups()
        assert kafka_admin.delete_groups(["kg"]) == {"kg": "GroupIdNotFoundError"}
        with pytest.raises(kafka.errors.GroupIdNotFoundError):
            kafka_admin.delete_group_offsets("kg", [KafkaTopicPartition("work", 0)])
        # a new consumer of the group starts from auto.offset.reset, not from the deleted offsets
        fresh = ck.Consumer(
            {"bootstrap.servers": broker.bootstrap_servers, "group.id": "kg", "auto.offset.reset": "earliest"}
        )
        fresh.assign([ck.TopicPartition("work", 0)])
        message = None
        while message is None and time.monotonic() < deadline:
            message = fresh.poll(0.1)
        assert message is not None and message.offset() == 0
        fresh.close()
    finally:
        kafka_admin.close()


def test_delete_groups_of_pylog_consumers(broker: Broker) -> None:
    """The one store: a group of embedded consumers is deleted through the Kafka API only when it has no
    live consumer, and its offsets of topics it does not subscribe to may go at any time."""
    log = broker.log
    log.create_topic("work")
    log.create_topic("other")
    with log.producer() as producer:
        producer.send("work", 1)
    consumer = log.consumer("work", group_id="eg", auto_offset_reset="earliest")
    assert [r.offset for rs in consumer.poll(timeout_ms=int(WAIT_S * 1000)).values() for r in rs] == [0]
    consumer.commit()
    admin = _admin(broker)
    kafka_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        [future] = admin.delete_consumer_groups(["eg"]).values()
        assert _outcome(future) == ck.KafkaError.NON_EMPTY_GROUP
        result = kafka_admin.delete_group_offsets("eg", [KafkaTopicPartition("work", 0)])
        assert [e.__name__ for e in result.values()] == ["GroupSubscribedToTopicError"]
        assert _committed(broker, "eg") == {("work", 0): 1}
        consumer.close()
        result = kafka_admin.delete_group_offsets("eg", [KafkaTopicPartition("work", 0)])
        assert [e.__name__ for e in result.values()] == ["NoError"]
        assert _committed(broker, "eg") == {}
        [future] = admin.delete_consumer_groups(["eg"]).values()
        assert _outcome(future) is None
        assert "eg" not in log.list_groups()
    finally:
        kafka_admin.close()


# -- DeleteRecords ------------------------------------------------------------------------------------------


def _fill(log: pylog.Log, topic: str, partition: int, count: int) -> None:
    """``count`` records, in batches of 5, into segments of a few batches each (segment_bytes is small)."""
    with log.producer(value_serializer=None, linger_ms=0) as producer:
        for i in range(count):
            producer.send(topic, b"v%03d" % i + b"." * 100, partition=partition)
            if i % 5 == 4:
                producer.flush()


def _low_watermark(admin: AdminClient, topic: str, partition: int, offset: int) -> Any:
    [future] = admin.delete_records([ck.TopicPartition(topic, partition, offset)]).values()
    outcome = _outcome(future)
    return outcome if isinstance(outcome, int) else outcome.low_watermark


def test_delete_records_moves_the_log_start(broker: Broker) -> None:
    """Against a model: the low watermark is the offset asked for (a smaller one than the log start changes
    nothing), the high watermark's deletes everything; the segments wholly below it are deleted, and the
    records left are the ones produced, from the low watermark on."""
    log = broker.log
    log.create_topic("t", partitions=2, segment_bytes=700)
    _fill(log, "t", 0, 60)
    _fill(log, "t", 1, 10)
    plog = log.topic("t").partition(0)
    bases = [s.base_offset for s in plog.segments]
    assert len(bases) > 5
    admin = _admin(broker)
    start = 0
    for offset in (0, 1, bases[2], bases[2] + 3, 2, bases[4] + 1):
        start = max(start, offset)
        assert _low_watermark(admin, "t", 0, offset) == start == plog.log_start_offset, offset
        assert plog.segments[0].base_offset == max(b for b in bases if b <= start)
    consumer = ck.Consumer(
        {"bootstrap.servers": broker.bootstrap_servers, "group.id": "g", "auto.offset.reset": "earliest"}
    )
    consumer.assign([ck.TopicPartition("t", 0)])
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < 60 - plog.log_start_offset and time.monotonic() < deadline:
        message = consumer.poll(0.1)
        if message is not None and message.error() is None:
            got.append((message.offset(), message.value()))
    consumer.close()
    start = plog.log_start_offset
    assert got == [(i, b"v%03d" % i + b"." * 100) for i in range(start, 60)]
    # errors: past the high watermark, a compacted topic; nothing is deleted
    assert _low_watermark(admin, "t", 0, 61) == ck.KafkaError.OFFSET_OUT_OF_RANGE
    log.create_topic("c", cleanup_policy="compact")
    assert _low_watermark(admin, "c", 0, 0) == ck.KafkaError.POLICY_VIOLATION
    assert plog.log_start_offset == start
    # the high watermark (kafka-python's delete_records, -1): everything goes, on every partition asked
    kafka_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        result = kafka_admin.delete_records({KafkaTopicPartition("t", 0): -1, KafkaTopicPartition("t", 1): 4})
        assert {tp.partition: r["low_watermark"] for tp, r in result.items()} == {0: 60, 1: 4}
        with pytest.raises(kafka.errors.OffsetOutOfRangeError):
            kafka_admin.delete_records({KafkaTopicPartition("t", 1): 11})
        with pytest.raises(kafka.errors.UnknownTopicOrPartitionError):  # sent to the broker as is
            kafka_admin.delete_records({KafkaTopicPartition("t", 7): 0}, partition_leader_id=0)
    finally:
        kafka_admin.close()
    assert (plog.log_start_offset, plog.log_end_offset) == (60, 60)
    assert log.topic("t").beginning_offsets() == {0: 60, 1: 4}
    _fill(log, "t", 0, 1)  # the log goes on at its end
    assert plog.log_end_offset == 61


# -- authorization ------------------------------------------------------------------------------------------


@pytest.fixture
def secured(log_dir: Path) -> Iterator[Broker]:
    acls = [
        Acl("User:alice", "*", op, "ALLOW", rtype, "LITERAL", name)
        for op, rtype, name in (
            ("ALTER_CONFIGS", "TOPIC", "orders"),
            ("DELETE", "TOPIC", "orders"),
            ("READ", "TOPIC", "orders"),
            ("DELETE", "GROUP", "g1"),
        )
    ]
    with secured_broker(log_dir, ("alice", "admin"), acls) as b:
        for topic in ("orders", "secret"):
            b.log.create_topic(topic)
            _fill(b.log, topic, 0, 3)
        yield b


def test_admin_changes_need_their_acls(secured: Broker) -> None:
    """ALTER_CONFIGS on the topic (on the cluster for a broker), DELETE on the topic for DeleteRecords, on the
    group for DeleteGroups and OffsetDelete (with READ on the topic); refused ones change nothing."""
    log = secured.log
    for group in ("g1", "g2"):
        consumer = ck.Consumer({**sasl_config(secured, "admin"), "group.id": group})
        offsets = [ck.TopicPartition("orders", 0, 1), ck.TopicPartition("secret", 0, 2)]
        consumer.commit(offsets=offsets, asynchronous=False)
        consumer.close()
    alice = AdminClient(sasl_config(secured, "alice"))
    resources = [
        ConfigResource(
            ConfigResource.Type.TOPIC,
            t,
            incremental_configs=[ConfigEntry("retention.ms", "5000", incremental_operation=SET)],
        )
        for t in ("orders", "secret")
    ]
    resources.append(
        ConfigResource(
            ConfigResource.Type.BROKER,
            "0",
            incremental_configs=[ConfigEntry("x", "1", incremental_operation=SET)],
        )
    )
    outcomes = {r.name: _outcome(f) for r, f in alice.incremental_alter_configs(resources).items()}
    assert outcomes == {
        "orders": None,
        "secret": ck.KafkaError.TOPIC_AUTHORIZATION_FAILED,
        "0": ck.KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
    assert (log.topic("orders").config.retention_ms, log.topic("secret").config.retention_ms) == (
        5000,
        log.defaults.retention_ms,
    )
    futures = alice.delete_records([ck.TopicPartition("orders", 0, -1), ck.TopicPartition("secret", 0, -1)])
    outcomes = {tp.topic: _outcome(f) for tp, f in futures.items()}
    assert outcomes["orders"].low_watermark == 3
    assert outcomes["secret"] == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert log.topic("secret").beginning_offsets() == {0: 0}
    kafka_alice = KafkaAdminClient(
        **kafka_python_sasl(secured, "alice"),
    )
    try:
        result = kafka_alice.delete_group_offsets(
            "g1", [KafkaTopicPartition("orders", 0), KafkaTopicPartition("secret", 0)]
        )
        assert {tp.topic: e.__name__ for tp, e in result.items()} == {
            "orders": "NoError",
            "secret": "TopicAuthorizationFailedError",
        }
        with pytest.raises(kafka.errors.GroupAuthorizationFailedError):
            kafka_alice.delete_group_offsets("g2", [KafkaTopicPartition("orders", 0)])
    finally:
        kafka_alice.close()
    assert _committed(secured, "g1") == {("secret", 0): 2}
    assert _committed(secured, "g2") == {("orders", 0): 1, ("secret", 0): 2}
    outcomes = {g: _outcome(f) for g, f in alice.delete_consumer_groups(["g1", "g2"]).items()}
    assert outcomes == {"g1": None, "g2": ck.KafkaError.GROUP_AUTHORIZATION_FAILED}
    assert "g1" not in log.list_groups() and "g2" in log.list_groups()


class _FailingFsync(fs.FileSystem):
    def fsync(self, fd: int) -> None:
        raise fs._translate(OSError(errno.EIO, os.strerror(errno.EIO)), "fsync", "injected")


def test_a_failed_delete_records_is_a_storage_error(broker: Broker) -> None:
    log = broker.log
    log.create_topic("t")
    _fill(log, "t", 0, 10)
    admin = _admin(broker)
    with fs.install(_FailingFsync()):
        assert _low_watermark(admin, "t", 0, 5) == ck.KafkaError.KAFKA_STORAGE_ERROR
    plog = log.topic("t").partition(0)
    assert (plog.log_start_offset, plog.log_end_offset) == (0, 10)
    assert _low_watermark(admin, "t", 0, 5) == 5  # the broker goes on


def test_aiokafka_alter_configs_and_delete_records(broker: Broker) -> None:
    """aiokafka's admin client (non-flexible versions: AlterConfigs v1, DeleteRecords v1)."""
    log = broker.log
    log.create_topic("t", segment_ms=123_456)
    _fill(log, "t", 0, 10)

    async def run() -> tuple[Any, Any]:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        await admin.start()
        try:
            resource = AioConfigResource(AioConfigResourceType.TOPIC, "t", {"retention.ms": "1234"})
            altered = await admin.alter_configs([resource])
            deleted = await admin.delete_records({AioTopicPartition("t", 0): RecordsToDelete(4)})
            return altered, deleted
        finally:
            await admin.close()

    altered, deleted = asyncio.run(run())
    assert [r[0] for r in altered[0].resources] == [0]
    # AlterConfigs replaces the whole config: segment.ms, not named, goes back to the default
    config = log.topic("t").config
    assert (config.retention_ms, config.segment_ms) == (1234, log.defaults.segment_ms)
    assert deleted == {AioTopicPartition("t", 0): 4} and log.topic("t").beginning_offsets() == {0: 4}


# -- DescribeLogDirs, AlterReplicaLogDirs ------------------------------------------------------------------


def test_log_dirs_describe_the_one_log_directory(broker: Broker) -> None:
    """kafka-python's describe_log_dirs: the log directory, every partition's size on disk (the model: the
    sum of its segments' sizes), the file system's bytes; alter_replica_log_dirs: the partition is already
    in the log's directory, any other is LOG_DIR_NOT_FOUND."""
    log = broker.log
    log.create_topic("t", partitions=2)
    _fill(log, "t", 0, 20)
    _fill(log, "t", 1, 3)
    log.create_topic("empty")
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        [answer] = admin.describe_log_dirs()
        [log_dir] = answer["log_dirs"]
        assert log_dir["error_code"] == 0 and Path(log_dir["log_dir"]) == Path(log.path).resolve()
        sizes = {
            (t["name"], p["partition_index"]): p["partition_size"]
            for t in log_dir["topics"]
            for p in t["partitions"]
        }
        assert sizes == {
            (name, p): sum(s.size for s in log.topic(name).partition(p).segments)
            for name in ("t", "empty")
            for p in range(log.topic(name).num_partitions)
        }
        assert sizes["t", 0] > sizes["t", 1] > 0 and 0 < log_dir["usable_bytes"] <= log_dir["total_bytes"]
        [answer] = admin.describe_log_dirs({"t": [1, 7], "nope": [0]})
        [log_dir] = answer["log_dirs"]
        assert [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in log_dir["topics"]] == [
            ("t", [1])
        ]
        moved = admin.alter_replica_log_dirs(
            {
                TopicPartitionReplica("t", 0, 0): str(Path(log.path).resolve()),
                TopicPartitionReplica("t", 1, 0): "/somewhere/else",
                TopicPartitionReplica("nope", 0, 0): str(Path(log.path).resolve()),
            }
        )
        assert {(r.topic, r.partition): e.__name__ for r, e in moved.items()} == {
            ("t", 0): "NoError",
            ("t", 1): "LogDirNotFoundError",
            ("nope", 0): "UnknownTopicOrPartitionError",
        }
    finally:
        admin.close()


def test_log_dirs_need_cluster_acls(secured: Broker) -> None:
    def client(user: str) -> KafkaAdminClient:
        return KafkaAdminClient(
            **kafka_python_sasl(secured, user),
        )

    alice, admin = client("alice"), client("admin")
    try:
        [denied] = alice.describe_log_dirs()
        assert denied["log_dirs"] == []  # CLUSTER_AUTHORIZATION_FAILED, which kafka-python does not return
        [answer] = admin.describe_log_dirs()
        assert {t["name"] for t in answer["log_dirs"][0]["topics"]} == {"orders", "secret"}
        # DESCRIBE on the cluster describes; moving needs ALTER on it
        AclStore(secured.log.path).add(
            [Acl("User:alice", "*", "DESCRIBE", "ALLOW", "CLUSTER", "LITERAL", "kafka-cluster")]
        )
        [answer] = alice.describe_log_dirs()  # (kafka-python asks for the topics its metadata shows)
        assert {t["name"] for t in answer["log_dirs"][0]["topics"]} == {"orders"}
        moved = alice.alter_replica_log_dirs({TopicPartitionReplica("orders", 0, 0): secured.log.path})
        assert [e.__name__ for e in moved.values()] == ["ClusterAuthorizationFailedError"]
    finally:
        alice.close()
        admin.close()
