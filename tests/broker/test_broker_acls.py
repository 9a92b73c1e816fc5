"""ACLs: Kafka's decision rule, and each API's authorization as unchanged clients see it (confluent-kafka,
kafka-python): allowed and denied produce, fetch, group consumption, metadata, topic creation; the error
codes TOPIC_AUTHORIZATION_FAILED (29) and GROUP_AUTHORIZATION_FAILED (30); nothing a denied client sends
reaches the log."""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import confluent_kafka.admin
import kafka.errors
import pytest
from kafka import KafkaConsumer
from kafka.admin import (
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePatternFilter,
    ResourceType,
)
from kafka.structs import TopicPartition as KTP
from kafka_support import WAIT_S, kafka_python_sasl, sasl_config, secured_broker, stored_values, wait_until

import pylog
from pylog.broker.acls import Acl, AclStore, Authorizer
from pylog.broker.broker import Broker
from pylog.broker.credentials import CredentialStore
from pylog.cli import main
from pylog.errors import ConfigError

ANY_ACL = ACLFilter(
    principal=None,
    host="*",
    operation=ACLOperation.ANY,
    permission_type=ACLPermissionType.ANY,
    resource_pattern=ResourcePatternFilter(ResourceType.ANY, None, ACLResourcePatternType.ANY),
)


def acl(
    principal: str,
    op: str,
    rtype: str,
    name: str,
    perm: str = "ALLOW",
    pattern: str = "LITERAL",
    host: str = "*",
) -> Acl:
    return Acl(principal, host, op, perm, rtype, pattern, name)


def test_decision_rule(tmp_path: Path) -> None:
    store = AclStore(str(tmp_path))
    store.add(
        [
            acl("User:alice", "READ", "TOPIC", "orders"),
            acl("User:alice", "WRITE", "TOPIC", "logs-", pattern="PREFIXED"),
            acl("User:*", "DESCRIBE", "TOPIC", "*"),
            acl("User:bob", "ALL", "TOPIC", "*"),
            acl("User:bob", "WRITE", "TOPIC", "orders", perm="DENY"),
            acl("User:carol", "READ", "GROUP", "g", host="10.0.0.1"),
            acl("User:dave", "ALTER_CONFIGS", "CLUSTER", "kafka-cluster"),
        ]
    )
    auth = Authorizer(store, frozenset({"User:root"}))
    h = "127.0.0.1"
    assert auth.allowed("User:alice", h, "READ", "TOPIC", "orders")
    assert not auth.allowed("User:alice", h, "WRITE", "TOPIC", "orders")
    assert auth.allowed("User:alice", h, "WRITE", "TOPIC", "logs-app")  # prefixed
    assert not auth.allowed("User:alice", h, "WRITE", "TOPIC", "log")
    assert auth.allowed("User:alice", h, "DESCRIBE", "TOPIC", "logs-app")  # WRITE implies DESCRIBE
    assert auth.allowed("User:eve", h, "DESCRIBE", "TOPIC", "x")  # User:* and '*'
    assert not auth.allowed("User:eve", h, "READ", "TOPIC", "x")  # no ACL: denied
    assert auth.allowed("User:bob", h, "READ", "TOPIC", "orders")  # ALL
    assert not auth.allowed("User:bob", h, "WRITE", "TOPIC", "orders")  # deny wins over ALL
    assert auth.allowed("User:carol", "10.0.0.1", "READ", "GROUP", "g")
    assert not auth.allowed("User:carol", h, "READ", "GROUP", "g")  # another host
    assert auth.allowed("User:dave", h, "DESCRIBE_CONFIGS", "CLUSTER", "kafka-cluster")
    assert not auth.allowed("User:dave", h, "ALTER", "CLUSTER", "kafka-cluster")
    assert auth.allowed("User:root", h, "DELETE", "TOPIC", "anything")  # super user
    assert auth.allowed_any("User:alice", h, "WRITE", "TOPIC")
    assert not auth.allowed_any("User:carol", h, "WRITE", "TOPIC")
    # removal, and a damaged file allows nothing
    assert store.remove([acl("User:alice", "READ", "TOPIC", "orders")]) == [
        acl("User:alice", "READ", "TOPIC", "orders")
    ]
    assert not auth.allowed("User:alice", h, "READ", "TOPIC", "orders")
    raw = bytearray(Path(store.path).read_bytes())
    raw[-3] ^= 1
    Path(store.path).write_bytes(bytes(raw))
    assert not auth.allowed("User:bob", h, "READ", "TOPIC", "orders")
    with pytest.raises(ConfigError, match="does not check"):
        store.acls()


def test_decision_rule_against_a_model(tmp_path: Path) -> None:
    """Random ACL sets against a literal reading of Kafka's rule (deny wins, then an allow of the operation,
    of ALL or of an operation implying it, else deny)."""
    rng = random.Random(7)
    ops = ["READ", "WRITE", "DESCRIBE", "ALL", "ALTER", "DELETE"]
    names = ["a", "ab", "b", "*"]
    for round_ in range(40):
        acls = {
            acl(
                rng.choice(["User:u", "User:*", "User:v"]),
                rng.choice(ops),
                "TOPIC",
                rng.choice(names),
                perm=rng.choice(["ALLOW", "ALLOW", "DENY"]),
                pattern=rng.choice(["LITERAL", "PREFIXED"]),
            )
            for _ in range(rng.randrange(0, 6))
        }
        acls = {a for a in acls if not (a.pattern_type == "PREFIXED" and a.name == "*")}
        store = AclStore(str(tmp_path / str(round_)))
        store.add(acls)
        auth = Authorizer(store)
        for op, name in itertools.product(["READ", "WRITE", "DESCRIBE", "DELETE"], ["a", "ab", "b"]):

            def applies(a: Acl, name: str = name) -> bool:
                if a.principal not in ("User:u", "User:*"):
                    return False
                return name.startswith(a.name) if a.pattern_type == "PREFIXED" else a.name in (name, "*")

            hits = [a for a in acls if applies(a)]
            denied = any(a.permission == "DENY" and a.operation in (op, "ALL") for a in hits)
            allowing = {op, "ALL"} | ({"READ", "WRITE", "DELETE", "ALTER"} if op == "DESCRIBE" else set())
            expected = not denied and any(a.permission == "ALLOW" and a.operation in allowing for a in hits)
            assert auth.allowed("User:u", "h", op, "TOPIC", name) == expected, (acls, op, name)


# -- with Kafka clients --------------------------------------------------------------------------------


@pytest.fixture
def secured(log_dir: Path) -> Iterator[Broker]:
    acls = [
        acl("User:alice", "WRITE", "TOPIC", "orders"),
        acl("User:alice", "READ", "TOPIC", "orders"),
        acl("User:alice", "READ", "GROUP", "billing"),
        acl("User:bob", "READ", "TOPIC", "orders"),
    ]
    with secured_broker(log_dir, ("alice", "bob", "admin"), acls) as b:
        b.log.create_topic("orders", partitions=2)
        b.log.create_topic("secret")
        yield b


def deliver(conf: dict[str, Any], topic: str, values: list[bytes]) -> list[ck.KafkaError | None]:
    # a delivery waits as long as any other step may (the log-in and first metadata take seconds under load)
    producer = ck.Producer({**conf, "acks": "all", "message.timeout.ms": int(WAIT_S * 1000), "retries": 0})
    results: list[ck.KafkaError | None] = []
    for value in values:
        producer.produce(topic, value=value, partition=0, on_delivery=lambda err, msg: results.append(err))
    producer.flush(WAIT_S)
    return results


def test_produce_needs_write(secured: Broker) -> None:
    assert deliver(sasl_config(secured, "alice"), "orders", [b"a1", b"a2"]) == [None, None]
    errors = deliver(sasl_config(secured, "bob"), "orders", [b"b1"])
    assert [e.code() if e else None for e in errors] == [ck.KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert stored_values(secured.log, "orders") == [b"a1", b"a2"]  # nothing of bob's


def test_metadata_hides_topics_not_allowed(secured: Broker) -> None:
    for user, visible in (("alice", {"orders"}), ("bob", {"orders"}), ("admin", {"orders", "secret"})):
        admin = ck.admin.AdminClient(sasl_config(secured, user))
        topics = set(admin.list_topics(timeout=WAIT_S).topics)
        assert topics == visible, user
    admin = ck.admin.AdminClient(sasl_config(secured, "bob"))
    meta = admin.list_topics("secret", timeout=WAIT_S)
    assert meta.topics["secret"].error.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_group_consumption_needs_read_on_topic_and_group(secured: Broker) -> None:
    values = [b"r%d" % i for i in range(10)]
    assert deliver(sasl_config(secured, "alice"), "orders", values) == [None] * 10
    # alice: READ on orders and on group billing
    consumer = KafkaConsumer(
        "orders",
        **kafka_python_sasl(secured, "alice"),
        group_id="billing",
        auto_offset_reset="earliest",
        consumer_timeout_ms=int(WAIT_S * 1000),
    )
    got = []
    for message in consumer:
        got.append(message.value)
        if len(got) == len(values):
            break
    consumer.commit()
    consumer.close()
    assert got == values
    # bob: READ on orders but not on the group: GROUP_AUTHORIZATION_FAILED
    bob = ck.Consumer({**sasl_config(secured, "bob"), "group.id": "billing", "auto.offset.reset": "earliest"})
    bob.subscribe(["orders"])
    seen: list[ck.KafkaError] = []

    def group_denied() -> bool:
        message = bob.poll(0.2)
        if message is not None and message.error() is not None:
            seen.append(message.error())
        return any(e.code() == ck.KafkaError.GROUP_AUTHORIZATION_FAILED for e in seen)

    wait_until(group_denied, "GROUP_AUTHORIZATION_FAILED for bob")
    bob.close()
    # bob may read the topic without a group (assign, no commit)
    reader = KafkaConsumer(
        **kafka_python_sasl(secured, "bob"),
        enable_auto_commit=False,
        consumer_timeout_ms=int(WAIT_S * 1000),
    )
    reader.assign([KTP("orders", 0)])
    reader.seek_to_beginning()
    read = []
    for message in reader:
        read.append(message.value)
        if len(read) == len(values):
            break
    reader.close()
    assert read == values
    # the group's committed offsets are alice's (bob's denied group requests changed nothing)
    assert {tp: o.offset for tp, o in secured.log.group_offsets("billing").items()} == {
        pylog.TopicPartition("orders", 0): 10,
        pylog.TopicPartition("orders", 1): 0,
    }


def test_fetch_needs_read(secured: Broker) -> None:
    assert deliver(sasl_config(secured, "admin"), "secret", [b"s"]) == [None]
    # alice may see the topic in metadata (DESCRIBE), not read it
    AclStore(secured.log.path).add([acl("User:alice", "DESCRIBE", "TOPIC", "secret")])
    consumer = KafkaConsumer(
        **kafka_python_sasl(secured, "alice"),
        enable_auto_commit=False,
    )
    try:
        consumer.assign([KTP("secret", 0)])
        consumer.seek(KTP("secret", 0), 0)
        with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
            wait_until(lambda: consumer.poll(200), "a record alice may not read")
    finally:
        consumer.close()


def test_create_topics_needs_create(secured: Broker) -> None:
    bob = ck.admin.AdminClient(sasl_config(secured, "bob"))
    future = bob.create_topics([ck.admin.NewTopic("bobs", 1, 1)])["bobs"]
    with pytest.raises(ck.KafkaException) as info:
        future.result(WAIT_S)
    assert info.value.args[0].code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "bobs" not in secured.log.topics()
    AclStore(secured.log.path).add([acl("User:bob", "CREATE", "TOPIC", "bob", pattern="PREFIXED")])
    bob.create_topics([ck.admin.NewTopic("bobs", 1, 1)])["bobs"].result(WAIT_S)
    assert "bobs" in secured.log.topics()


def test_deny_wins(secured: Broker) -> None:
    store = AclStore(secured.log.path)
    store.add(
        [
            acl("User:*", "WRITE", "TOPIC", "orders"),
            acl("User:alice", "WRITE", "TOPIC", "ord", perm="DENY", pattern="PREFIXED"),
        ]
    )
    errors = deliver(sasl_config(secured, "alice"), "orders", [b"x"])
    assert [e.code() if e else None for e in errors] == [ck.KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert deliver(sasl_config(secured, "bob"), "orders", [b"y"]) == [None]  # User:* allows bob now
    assert stored_values(secured.log, "orders") == [b"y"]


def test_acls_through_kafka_admin_clients(secured: Broker) -> None:
    """CreateAcls, DescribeAcls, DeleteAcls from confluent-kafka's AdminClient: a super user grants, lists and
    revokes; others may not (CLUSTER_AUTHORIZATION_FAILED)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    admin = ck.admin.AdminClient(sasl_config(secured, "admin"))
    binding = AclBinding(
        ResourceType.TOPIC,
        "pay",
        ResourcePatternType.PREFIXED,
        "User:bob",
        "*",
        AclOperation.WRITE,
        AclPermissionType.ALLOW,
    )
    for future in admin.create_acls([binding]).values():
        future.result(WAIT_S)
    assert acl("User:bob", "WRITE", "TOPIC", "pay", pattern="PREFIXED") in AclStore(secured.log.path).acls()
    secured.log.create_topic("payments")
    assert deliver(sasl_config(secured, "bob"), "payments", [b"p"]) == [None]

    every_topic_acl = AclBindingFilter(
        ResourceType.TOPIC, None, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY
    )
    listed = admin.describe_acls(every_topic_acl).result(WAIT_S)
    assert {(b.name, b.principal, b.operation) for b in listed} == {
        ("orders", "User:alice", AclOperation.WRITE),
        ("orders", "User:alice", AclOperation.READ),
        ("orders", "User:bob", AclOperation.READ),
        ("pay", "User:bob", AclOperation.WRITE),
    }
    applying = AclBindingFilter(
        ResourceType.TOPIC,
        "payments",
        ResourcePatternType.MATCH,
        None,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    assert [b.name for b in admin.describe_acls(applying).result(WAIT_S)] == ["pay"]

    # others may not (kafka-python reports the error; confluent-kafka's describe_acls drops it)
    bob_admin = KafkaAdminClient(
        **kafka_python_sasl(secured, "bob"),
    )
    try:
        with pytest.raises(kafka.errors.ClusterAuthorizationFailedError):
            bob_admin.describe_acls(ANY_ACL)
    finally:
        bob_admin.close()

    deleted = [b for f in admin.delete_acls([applying]).values() for b in f.result(WAIT_S)]
    assert [(b.name, b.principal) for b in deleted] == [("pay", "User:bob")]
    errors = deliver(sasl_config(secured, "bob"), "payments", [b"q"])
    assert [e.code() if e else None for e in errors] == [ck.KafkaError.TOPIC_AUTHORIZATION_FAILED]


def test_acl_apis_without_authentication_are_security_disabled(broker: Broker) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        with pytest.raises(kafka.errors.SecurityDisabledError):
            admin.describe_acls(ANY_ACL)
    finally:
        admin.close()


def test_acls_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(tmp_path / "log")
    add = [
        "--dir",
        d,
        "acls",
        "add",
        "--principal",
        "User:alice",
        "--operation",
        "read",
        "--operation",
        "WRITE",
    ]
    assert main([*add, "--topic", "orders"]) == 0
    assert (
        main(
            [
                "--dir",
                d,
                "acls",
                "add",
                "--principal",
                "User:*",
                "--operation",
                "READ",
                "--group",
                "g-",
                "--prefixed",
                "--deny",
                "--host",
                "10.0.0.9",
            ]
        )
        == 0
    )
    assert main([*add, "--topic", "orders"]) == 0  # already there: not added twice
    capsys.readouterr()
    assert main(["--dir", d, "acls", "list"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "GROUP:PREFIXED:g- User:* DENY READ from 10.0.0.9",
        "TOPIC:LITERAL:orders User:alice ALLOW READ from *",
        "TOPIC:LITERAL:orders User:alice ALLOW WRITE from *",
    ]
    assert main(["--dir", d, "--json", "acls", "list", "--topic", "orders", "--operation", "WRITE"]) == 0
    assert '"operation": "WRITE"' in capsys.readouterr().out
    assert (
        main(
            [
                "--dir",
                d,
                "acls",
                "remove",
                "--principal",
                "User:alice",
                "--operation",
                "READ",
                "--topic",
                "orders",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "--dir",
                d,
                "acls",
                "remove",
                "--principal",
                "User:alice",
                "--operation",
                "READ",
                "--topic",
                "orders",
            ]
        )
        == 1
    )
    assert {a.operation for a in AclStore(d).acls() if a.resource_type == "TOPIC"} == {"WRITE"}
    assert main(["--dir", d, "acls", "add", "--principal", "alice", "--operation", "READ", "--cluster"]) == 1
    assert (
        main(
            [
                "--dir",
                d,
                "acls",
                "add",
                "--principal",
                "User:a",
                "--operation",
                "READ",
                "--cluster",
                "--prefixed",
            ]
        )
        == 2
    )
    assert (
        main(["--dir", d, "acls", "add", "--principal", "User:a", "--operation", "READ"]) == 2
    )  # no resource
    assert "User:NAME" in capsys.readouterr().err


def test_scram_users_through_kafka_admin_clients(secured: Broker) -> None:
    """AlterUserScramCredentials and DescribeUserScramCredentials (KIP-554) from confluent-kafka: a super user
    creates carol (the client sends a salted password, never the password), carol authenticates and is
    described, deleting her credential locks her out; bob may not alter users."""
    from confluent_kafka.admin import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    admin = ck.admin.AdminClient(sasl_config(secured, "admin"))
    upsert = UserScramCredentialUpsertion(
        "carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), b"carol-pw"
    )
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(WAIT_S)
    assert CredentialStore(secured.log.path).users()["carol"] == ["SCRAM-SHA-256"]
    AclStore(secured.log.path).add([acl("User:carol", "WRITE", "TOPIC", "orders")])
    assert deliver(sasl_config(secured, "carol"), "orders", [b"c"]) == [None]

    described = admin.describe_user_scram_credentials(["carol"])["carol"].result(WAIT_S)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == [
        (ScramMechanism.SCRAM_SHA_256, 8192)
    ]
    everyone = admin.describe_user_scram_credentials().result(WAIT_S)
    assert sorted(everyone) == ["admin", "alice", "bob", "carol"]

    bob = ck.admin.AdminClient(sasl_config(secured, "bob"))
    with pytest.raises(ck.KafkaException) as info:
        for future in bob.alter_user_scram_credentials([upsert]).values():
            future.result(WAIT_S)
    assert info.value.args[0].code() == ck.KafkaError.CLUSTER_AUTHORIZATION_FAILED

    deletion = UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_256)
    for future in admin.alter_user_scram_credentials([deletion]).values():
        future.result(WAIT_S)
    assert "carol" not in CredentialStore(secured.log.path).users()
    with pytest.raises(ck.KafkaException) as info:
        admin.alter_user_scram_credentials([deletion])["carol"].result(WAIT_S)
    assert info.value.args[0].code() == ck.KafkaError.RESOURCE_NOT_FOUND


def test_repeated_refusals_are_logged_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    from pylog.broker.authorize import LOG_EVERY_MS, _Refusals

    refusals = _Refusals()
    what = ("User:bob", "10.0.0.1", "READ", "TOPIC", "secret")
    with caplog.at_level(logging.WARNING, "pylog.broker"):
        for now in (0, 10, 20, LOG_EVERY_MS - 1):
            refusals.log(now, what, "Fetch")
        refusals.log(
            5, ("User:eve", "10.0.0.2", "READ", "TOPIC", "secret"), "Fetch"
        )  # another refusal: its own line
        refusals.log(LOG_EVERY_MS, what, "Fetch")
    assert [r.getMessage() for r in caplog.records] == [
        "User:bob from 10.0.0.1 denied READ on TOPIC 'secret' (Fetch)",
        "User:eve from 10.0.0.2 denied READ on TOPIC 'secret' (Fetch)",
        "User:bob from 10.0.0.1 denied READ on TOPIC 'secret' (Fetch); refused 3 more times since the last line",
    ]
