"""Admin calls of unchanged Kafka clients against pylog's broker: topics created with Kafka config names,
refused configs, partitions added, topics deleted, configs described, groups listed and described, and the
APIs that mean nothing on one node answered with Kafka's error codes."""

from __future__ import annotations

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic
from kafka_support import WAIT_S, wait_until

from pylog.broker.broker import Broker


def _admin(broker: Broker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap_servers})


def _result(futures: dict) -> dict:
    out = {}
    for key, future in futures.items():
        try:
            out[key] = future.result(WAIT_S)
        except ck.KafkaException as exc:
            out[key] = exc.args[0].code()
    return out


def test_create_topics_with_kafka_config_names(broker: Broker) -> None:
    admin = _admin(broker)
    results = _result(
        admin.create_topics(
            [
                NewTopic("compacted", 3, 1, config={"cleanup.policy": "compact", "retention.ms": "60000"}),
                NewTopic("plain", 2),
                NewTopic("bad-config", 1, 1, config={"no.such.config": "1"}),
                NewTopic("replicated", 1, 3),
            ]
        )
    )
    assert results["compacted"] is None and results["plain"] is None
    assert results["bad-config"] == ck.KafkaError.INVALID_CONFIG
    assert results["replicated"] == ck.KafkaError.INVALID_REPLICATION_FACTOR
    log = broker.log
    assert (log.topic("compacted").num_partitions, log.topic("compacted").config.cleanup_policy) == (
        3,
        "compact",
    )
    assert log.topic("compacted").config.retention_ms == 60000
    assert not log.has_topic("bad-config") and not log.has_topic("replicated")
    assert _result(admin.create_topics([NewTopic("plain", 2)]))["plain"] == ck.KafkaError.TOPIC_ALREADY_EXISTS

    resource = ConfigResource(ConfigResource.Type.TOPIC, "compacted")
    described = _result(admin.describe_configs([resource]))[resource]
    assert described["cleanup.policy"].value == "compact" and described["retention.ms"].value == "60000"
    assert described["segment.bytes"].is_default

    assert _result(admin.create_partitions([NewPartitions("plain", 5)]))["plain"] is None
    assert log.topic("plain").num_partitions == 5
    assert (
        _result(admin.create_partitions([NewPartitions("plain", 2)]))["plain"]
        == ck.KafkaError.INVALID_PARTITIONS
    )

    assert _result(admin.delete_topics(["plain", "absent"])) == {
        "plain": None,
        "absent": ck.KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
    assert not log.has_topic("plain")


def test_a_keyless_record_to_a_compacted_topic_is_refused(broker: Broker) -> None:
    broker.log.create_topic("table", cleanup_policy="compact")
    errors: list[ck.KafkaError] = []
    producer = ck.Producer({"bootstrap.servers": broker.bootstrap_servers, "retries": 0})
    producer.produce("table", value=b"no key", partition=0, on_delivery=lambda err, m: errors.append(err))
    producer.flush(WAIT_S)  # a batch of its own: Kafka refuses a batch holding a keyless record whole
    producer.produce(
        "table", key=b"k", value=b"keyed", partition=0, on_delivery=lambda err, m: errors.append(err)
    )
    producer.flush(WAIT_S)
    assert [e.code() if e else None for e in errors] == [ck.KafkaError.INVALID_RECORD, None]
    assert broker.log.topic("table").end_offsets() == {0: 1}


def test_groups_are_listed_and_described(broker: Broker) -> None:
    broker.log.create_topic("work", partitions=2)
    embedded = broker.log.consumer("work", group_id="embedded-group", auto_offset_reset="earliest")
    embedded.poll(timeout_ms=100)
    member = ck.Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "kafka-group"})
    member.subscribe(["work"])
    wait_until(
        lambda: member.poll(0.1) is None and bool(member.assignment()), "the Kafka member's assignment"
    )
    admin = _admin(broker)
    listed = admin.list_consumer_groups().result(WAIT_S)
    ids = {g.group_id: g for g in listed.valid}
    assert {"embedded-group", "kafka-group"} <= set(ids)
    described = _result(admin.describe_consumer_groups(["kafka-group", "embedded-group"]))
    kafka = described["kafka-group"]
    assert len(kafka.members) == 1
    assert {tp.partition for tp in kafka.members[0].assignment.topic_partitions} == {0, 1}
    assert len(described["embedded-group"].members) == 1
    member.close()
    embedded.close()


def test_single_node_apis_answer_with_kafka_error_codes(broker: Broker) -> None:
    from kafka.admin import KafkaAdminClient

    broker.log.create_topic("t", partitions=1)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        assert admin.list_partition_reassignments() == {}
        cluster = admin.describe_cluster()
        assert [b["broker_id"] for b in cluster["brokers"]] == [0]
        result = admin.elect_leaders(0, {"t": [0]}, raise_errors=False)
        [topic] = result.replica_election_results
        assert [(p.partition_id, p.error_code) for p in topic.partition_result] == [
            (0, 84)
        ]  # ELECTION_NOT_NEEDED
    finally:
        admin.close()
