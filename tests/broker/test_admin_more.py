"""Admin calls that change a running log, from unchanged Kafka clients: topic configs altered
(IncrementalAlterConfigs, AlterConfigs), records deleted (DeleteRecords), groups and committed offsets
deleted (DeleteGroups, OffsetDelete); and the address a broker listening on every interface gives clients."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from kafka.admin import ConfigResource as KafkaConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kafka_support import WAIT_S

import pylog
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
