"""Authentication with unchanged Kafka clients: SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) over plaintext and
TLS, TLS alone, TLS client certificates; refusals (wrong passwords, requests before authentication, plaintext
clients on a TLS port) write nothing; a broker that authenticates nobody stays on loopback."""

from __future__ import annotations

import itertools
import logging
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from kafka import KafkaConsumer
from kafka_support import WAIT_S, stored_values, wait_until
from kio_client import RawClient
from tls_support import Pki, make_pki

import pylog
from pylog.broker.acls import Acl, AclStore
from pylog.broker.credentials import CredentialStore
from pylog.errors import ConfigError

MECHS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
ALL = ",".join(MECHS)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def users(log_dir: Path) -> Iterator[CredentialStore]:
    store = CredentialStore(str(log_dir))
    store.add("alice", "alice-secret")
    store.add("mallory", "mallory-secret")
    yield store


def confluent_conf(bootstrap: str, protocol: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "security.protocol": protocol, **extra}


def sasl_conf(mechanism: str, user: str, password: str) -> dict[str, Any]:
    return {"sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password}


def produce_confluent(conf: dict[str, Any], topic: str, values: list[bytes]) -> None:
    producer = ck.Producer({**conf, "acks": "all", "linger.ms": 5})
    errors: list[Any] = []
    for value in values:
        producer.produce(topic, value=value, on_delivery=lambda err, msg: errors.append(err) if err else None)
    assert producer.flush(WAIT_S) == 0
    assert errors == []


def consume_kafka_python(topic: str, n: int, **conf: Any) -> list[bytes]:
    consumer = KafkaConsumer(
        topic,
        auto_offset_reset="earliest",
        group_id="readers",
        consumer_timeout_ms=int(WAIT_S * 1000),
        **conf,
    )
    try:
        got: list[bytes] = []
        for message in consumer:
            got.append(message.value)
            if len(got) == n:
                break
        return got
    finally:
        consumer.close()


def refused_producer(conf: dict[str, Any], topic: str, code: int | None = None) -> list[ck.KafkaError]:
    """The errors a confluent producer reports while its record to ``topic`` cannot be sent (until one of
    ``code``, or any when None)."""
    errors: list[ck.KafkaError] = []
    producer = ck.Producer({**conf, "error_cb": errors.append, "message.timeout.ms": 3000})
    producer.produce(topic, value=b"x")

    def failed() -> bool:
        producer.poll(0.1)
        return any(code is None or e.code() == code for e in errors)

    wait_until(failed, f"an error from a producer to {topic}")
    producer.purge()
    producer.flush(0)
    return errors


@pytest.mark.parametrize("mechanism", MECHS)
def test_sasl_plaintext_produce_and_consume(log_dir: Path, users: CredentialStore, mechanism: str) -> None:
    values = [b"v%d" % i for i in range(50)]
    with pylog.serve(log_dir, sasl=ALL, super_users="User:alice") as broker:
        conf = confluent_conf(
            broker.bootstrap_servers, "SASL_PLAINTEXT", **sasl_conf(mechanism, "alice", "alice-secret")
        )
        produce_confluent(conf, "events", values)
        got = consume_kafka_python(
            "events",
            len(values),
            bootstrap_servers=broker.bootstrap_servers,
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism=mechanism,
            sasl_plain_username="alice",
            sasl_plain_password="alice-secret",
        )
        assert got == values
        assert stored_values(broker.log, "events") == values


@pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnraisableExceptionWarning"
)  # kafka-python's leaked sockets
def test_wrong_password_is_an_authentication_failure_and_writes_nothing(
    log_dir: Path, users: CredentialStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "pylog.broker")
    with pylog.serve(log_dir, sasl=ALL, super_users="User:alice") as broker:
        for mechanism, user in itertools.product(MECHS, ("alice", "nobody")):  # wrong password, unknown user
            conf = confluent_conf(
                broker.bootstrap_servers,
                "SASL_PLAINTEXT",
                **sasl_conf(mechanism, user, "not-her-password"),
            )
            errors = refused_producer(conf, f"stolen-{mechanism}-{user}", ck.KafkaError._AUTHENTICATION)
            assert "Authentication failed" in str([e.str() for e in errors])
        assert broker.log.topics() == []  # not even auto-created
    assert "not-her-password" not in caplog.text
    assert "authentication of 'alice'" in caplog.text and "authentication of 'nobody'" in caplog.text


def _frame(api_key: int, version: int, correlation: int, body: bytes) -> bytes:
    client_id = b"raw"
    payload = struct.pack(">hhih", api_key, version, correlation, len(client_id)) + client_id + body
    return struct.pack(">i", len(payload)) + payload


def test_requests_before_authentication_close_the_connection(log_dir: Path, users: CredentialStore) -> None:
    with pylog.serve(log_dir, sasl=ALL) as broker:
        # Metadata v1 for topic "sneaky" (would auto-create it), without SASL: closed unanswered
        with socket.create_connection((broker.host, broker.port), timeout=WAIT_S) as sock:
            body = struct.pack(">i", 1) + struct.pack(">h", 6) + b"sneaky"
            sock.sendall(_frame(3, 1, 7, body))
            assert sock.recv(1024) == b""
        # a Produce request's size prefix before authentication may not exceed 512 KiB
        with socket.create_connection((broker.host, broker.port), timeout=WAIT_S) as sock:
            sock.sendall(struct.pack(">i", 10 << 20))
            assert sock.recv(1024) == b""
        # a plaintext Kafka client to a SASL broker: refused
        refused_producer({"bootstrap.servers": broker.bootstrap_servers}, "sneaky")
        assert broker.log.topics() == []


def test_tls_produce_and_consume(log_dir: Path, pki: Pki) -> None:
    values = [b"tls-%d" % i for i in range(20)]
    with pylog.serve(log_dir, tls_cert=str(pki.cert), tls_key=str(pki.key)) as broker:
        conf = confluent_conf(broker.bootstrap_servers, "SSL", **{"ssl.ca.location": str(pki.ca)})
        produce_confluent(conf, "secure", values)
        got = consume_kafka_python(
            "secure",
            len(values),
            bootstrap_servers=broker.bootstrap_servers,
            security_protocol="SSL",
            ssl_cafile=str(pki.ca),
        )
        assert got == values
        # a plaintext client on the TLS port gets nothing, and the broker keeps serving
        with socket.create_connection((broker.host, broker.port), timeout=WAIT_S) as sock:
            sock.sendall(_frame(18, 0, 1, b""))
            reply = sock.recv(1024)
            assert reply == b"" or reply[0] == 0x15  # closed, or a TLS alert: never a Kafka answer
        produce_confluent(conf, "secure", [b"after"])
        assert stored_values(broker.log, "secure") == [*values, b"after"]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_sasl_ssl(log_dir: Path, users: CredentialStore, pki: Pki, mechanism: str) -> None:
    values = [b"s%d" % i for i in range(10)]
    with pylog.serve(
        log_dir, sasl=ALL, tls_cert=str(pki.cert), tls_key=str(pki.key), super_users="User:alice"
    ) as broker:
        conf = confluent_conf(
            broker.bootstrap_servers,
            "SASL_SSL",
            **sasl_conf(mechanism, "alice", "alice-secret"),
            **{"ssl.ca.location": str(pki.ca)},
        )
        produce_confluent(conf, "t", values)
        got = consume_kafka_python(
            "t",
            len(values),
            bootstrap_servers=broker.bootstrap_servers,
            security_protocol="SASL_SSL",
            ssl_cafile=str(pki.ca),
            sasl_mechanism=mechanism,
            sasl_plain_username="alice",
            sasl_plain_password="alice-secret",
        )
        assert got == values


def test_mutual_tls(log_dir: Path, pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    cert, key = pki.client("alice")
    with pylog.serve(
        log_dir,
        tls_cert=str(pki.cert),
        tls_key=str(pki.key),
        tls_client_ca=str(pki.ca),
        super_users="User:CN=alice,O=pylog tests",
    ) as broker:
        base = confluent_conf(broker.bootstrap_servers, "SSL", **{"ssl.ca.location": str(pki.ca)})
        # no client certificate: the TLS handshake fails, nothing is written
        refused_producer(base, "certified")
        assert broker.log.topics() == []
        # with one: its subject is the principal
        with_cert = {**base, "ssl.certificate.location": str(cert), "ssl.key.location": str(key)}
        produce_confluent(with_cert, "certified", [b"from alice"])
        assert stored_values(broker.log, "certified") == [b"from alice"]


def test_unauthenticated_broker_stays_on_loopback(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--allow-anonymous"):
        pylog.serve(tmp_path / "a", "0.0.0.0:0")
    assert not (tmp_path / "a").exists()
    with pytest.raises(ConfigError, match="--allow-anonymous"):  # TLS alone does not say who the client is
        pylog.serve(tmp_path / "a", "0.0.0.0:0", tls_cert="c.pem", tls_key="k.pem")
    with pylog.serve(tmp_path / "b", "0.0.0.0:0", sasl="SCRAM-SHA-512") as broker:
        assert broker.port > 0
    with pytest.raises(ConfigError, match="unknown SASL mechanism"):
        pylog.serve(tmp_path / "c", sasl="GSSAPI")


def test_sasl_handshake_v0_then_bare_tokens(log_dir: Path, users: CredentialStore) -> None:
    """Kafka's first SASL protocol: SaslHandshake v0, then the mechanism's messages as bare size-prefixed
    tokens; an unknown mechanism is UNSUPPORTED_SASL_MECHANISM with the enabled list."""
    from kio.schema.metadata.v1.request import MetadataRequest
    from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest

    with pylog.serve(log_dir, sasl="PLAIN,SCRAM-SHA-512", super_users="User:alice") as broker:
        client = RawClient(broker.host, broker.port)
        try:
            refused = client.call(17, 0, SaslHandshakeRequest(mechanism="GSSAPI"))
            assert refused.error_code.value == 33 and list(refused.mechanisms) == ["PLAIN", "SCRAM-SHA-512"]
            accepted = client.call(17, 0, SaslHandshakeRequest(mechanism="PLAIN"))
            assert accepted.error_code.value == 0
            token = b"\0alice\0alice-secret"
            client.sock.sendall(struct.pack(">i", len(token)) + token)
            assert client.sock.recv(4) == b"\0\0\0\0"  # an empty answer: authenticated
            answer = client.call(3, 1, MetadataRequest(topics=None))
            assert answer.brokers[0].port == broker.port
        finally:
            client.close()
        client = RawClient(broker.host, broker.port)
        try:
            client.call(17, 0, SaslHandshakeRequest(mechanism="PLAIN"))
            token = b"\0alice\0wrong"
            client.sock.sendall(struct.pack(">i", len(token)) + token)
            assert client.sock.recv(4) == b""  # a wrong password closes the connection
        finally:
            client.close()


def test_certificate_subjects_are_principals_in_acls(
    log_dir: Path, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "pylog.broker")
    AclStore(str(log_dir)).add(
        [Acl("User:CN=alice,O=pylog tests", "*", "WRITE", "ALLOW", "TOPIC", "LITERAL", "certified")]
    )
    with pylog.serve(
        log_dir,
        tls_cert=str(pki.cert),
        tls_key=str(pki.key),
        tls_client_ca=str(pki.ca),
        auto_create_topics=False,
    ) as broker:
        broker.log.create_topic("certified")
        base = confluent_conf(broker.bootstrap_servers, "SSL", **{"ssl.ca.location": str(pki.ca)})
        results = {}
        for name in ("alice", "bob"):
            cert, key = pki.client(name)
            conf = {**base, "ssl.certificate.location": str(cert), "ssl.key.location": str(key), "retries": 0}
            producer = ck.Producer(conf)
            errors: list[Any] = []
            producer.produce(
                "certified",
                value=name.encode(),
                on_delivery=lambda err, msg, errors=errors: errors.append(err),
            )
            producer.flush(WAIT_S)
            results[name] = [e.code() if e else None for e in errors]
            del producer
        assert results == {"alice": [None], "bob": [ck.KafkaError.TOPIC_AUTHORIZATION_FAILED]}
        assert stored_values(broker.log, "certified") == [b"alice"]
    assert "opened (User:CN=alice,O=pylog tests)" in caplog.text
    assert "closed (User:CN=bob,O=pylog tests)" in caplog.text
    assert "User:CN=bob,O=pylog tests from 127.0.0.1 denied" in caplog.text


def test_broken_clients_do_not_stop_the_others(log_dir: Path, users: CredentialStore, pki: Pki) -> None:
    """A half-finished SASL handshake, a client gone in the middle of a request and a TLS client on a
    plaintext port: each affects its own connection only."""
    import ssl

    from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

    with pylog.serve(log_dir, sasl="SCRAM-SHA-256", super_users="User:alice") as broker:
        stalled = RawClient(broker.host, broker.port)
        assert stalled.call(17, 1, SaslHandshakeRequest(mechanism="SCRAM-SHA-256")).error_code.value == 0
        gone = socket.create_connection((broker.host, broker.port))
        gone.sendall(struct.pack(">i", 100) + b"\0\x12\0\0")  # a header of 100 bytes promised, 4 sent
        gone.close()
        tls = ssl.create_default_context(cafile=str(pki.ca))
        with (
            socket.create_connection((broker.host, broker.port)) as raw,
            pytest.raises((ssl.SSLError, OSError)),
        ):
            tls.wrap_socket(raw, server_hostname="localhost")  # the broker speaks no TLS here
        conf = confluent_conf(
            broker.bootstrap_servers, "SASL_PLAINTEXT", **sasl_conf("SCRAM-SHA-256", "alice", "alice-secret")
        )
        produce_confluent(conf, "still", [b"served"])  # while the stalled handshake stays open
        assert stored_values(broker.log, "still") == [b"served"]
        stalled.close()
