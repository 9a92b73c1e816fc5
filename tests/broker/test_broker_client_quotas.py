"""Client quotas per user and client id (KIP-55): Kafka's precedence against a model, per-entity throttling
answered with throttle_time_ms, DescribeClientQuotas/AlterClientQuotas, the quota file and ``pylog quotas``."""

from __future__ import annotations

import itertools
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
from kafka_support import stored
from kio.schema.alter_client_quotas.v1.request import AlterClientQuotasRequest, EntryData, OpData
from kio.schema.alter_client_quotas.v1.request import EntityData as AlterEntity
from kio.schema.describe_client_quotas.v1.request import ComponentData, DescribeClientQuotasRequest
from kio_client import RawClient, produce_request, record_batch

import pylog
from pylog.broker.credentials import CredentialStore
from pylog.broker.quota_store import QuotaStore
from pylog.broker.quotas import DEFAULT, WINDOW_MS, QuotaEntity, Quotas, resolve
from pylog.cli import main
from pylog.clock import ManualClock
from pylog.errors import ConfigError


def produce(client: RawClient, topic: str, records: bytes) -> tuple[int, int]:
    """(error code, throttle_time_ms) of one Produce v9."""
    answer = produce_request(client, topic, records)
    ms = int(answer.throttle_time.total_seconds() * 1000)
    return int(answer.responses[0].partition_responses[0].error_code), ms


def expected_throttle(in_window: int, rate: int) -> int:
    over = in_window - rate * WINDOW_MS / 1000
    return 0 if over <= 0 else min(int(over / rate * 1000), WINDOW_MS)


def alter(
    client: RawClient, entity: dict[str, str | None], validate_only: bool = False, **ops: float | None
) -> Any:
    request = AlterClientQuotasRequest(
        entries=(
            EntryData(
                entity=tuple(AlterEntity(entity_type=t, entity_name=n) for t, n in entity.items()),
                ops=tuple(
                    OpData(key=k, value=0.0 if v is None else float(v), remove=v is None)
                    for k, v in ops.items()
                ),
            ),
        ),
        validate_only=validate_only,
    )
    return client.call(49, 1, request).entries[0]


def describe(client: RawClient, strict: bool = False, **components: tuple[int, str | None]) -> Any:
    request = DescribeClientQuotasRequest(
        components=tuple(
            ComponentData(entity_type=t.replace("_", "-"), match_type=m, match=n)
            for t, (m, n) in components.items()
        ),
        strict=strict,
    )
    return client.call(48, 1, request)


def entries(answer: Any) -> dict[tuple[tuple[str, str | None], ...], dict[str, float]]:
    return {
        tuple((e.entity_type, e.entity_name) for e in entry.entity): {v.key: v.value for v in entry.values}
        for entry in answer.entries
    }


# -- precedence -------------------------------------------------------------------------------------------


def model(paths: dict[str, dict[str, int]], key: str, user: str, client: str) -> tuple[str, str] | None:
    """Kafka's documented order of quota config paths (the 'Quotas' section of Kafka's operations guide); the
    path that gives the quota and who shares it, as Kafka's quota metric tags (user tag, client-id tag)."""
    order = [
        (f"/config/users/{user}/clients/{client}", (user, client)),
        (f"/config/users/{user}/clients/<default>", (user, client)),
        (f"/config/users/{user}", (user, "")),
        (f"/config/users/<default>/clients/{client}", (user, client)),
        ("/config/users/<default>/clients/<default>", (user, client)),
        ("/config/users/<default>", (user, "")),
        (f"/config/clients/{client}", ("", client)),
        ("/config/clients/<default>", ("", client)),
    ]
    for path, tags in order:
        if key in paths.get(path, {}):
            return path, f"{paths[path][key]}|{tags[0]}|{tags[1]}"
    return None


def path_of(entity: QuotaEntity) -> str:
    if entity.user is not None and entity.client_id is not None:
        return f"/config/users/{entity.user}/clients/{entity.client_id}"
    if entity.user is not None:
        return f"/config/users/{entity.user}"
    return f"/config/clients/{entity.client_id}"


def test_precedence_against_kafkas_order() -> None:
    """Random quota sets over 2 users, 2 client ids and the defaults: the quota each (user, client id)
    gets, per key, and who shares it, are those of Kafka's order of config paths."""
    rng = random.Random(55)
    users = ["alice", "bob", DEFAULT]
    clients = ["c1", "c2", DEFAULT]
    entities = [QuotaEntity(u, c) for u in [*users, None] for c in [*clients, None] if (u, c) != (None, None)]
    for _ in range(400):
        configs: dict[QuotaEntity, dict[str, int]] = {}
        for entity in rng.sample(entities, rng.randrange(0, len(entities))):
            keys = rng.sample(["producer_byte_rate", "consumer_byte_rate"], rng.choice([1, 2]))
            configs[entity] = {k: rng.randrange(1, 10_000) for k in keys}
        paths = {path_of(e): v for e, v in configs.items()}
        for user, client, key in itertools.product(
            ["alice", "bob", "carol"], ["c1", "c2", "c3"], ["producer_byte_rate", "consumer_byte_rate"]
        ):
            got = resolve(configs, key, user, client)
            want = model(paths, key, user, client)
            if want is None:
                assert got is None
                continue
            assert got is not None and got.entity is not None
            shared = f"{got.rate}|{got.shared_by.user or ''}|{got.shared_by.client_id or ''}"
            assert (path_of(got.entity), shared) == want


def test_broker_options_are_the_last_resort() -> None:
    quotas = Quotas(lambda: {QuotaEntity(None, "c1"): {"producer_byte_rate": 7}}, producer_byte_rate=100)
    c1 = quotas.match("producer_byte_rate", "alice", "c1")
    assert c1 is not None and (c1.rate, c1.entity) == (7, QuotaEntity(None, "c1"))
    other = quotas.match("producer_byte_rate", "alice", "c2")
    assert other is not None and (other.rate, other.entity, other.shared_by) == (
        100,
        None,
        QuotaEntity("alice", None),
    )
    anonymous = quotas.match("producer_byte_rate", "ANONYMOUS", "c2")
    assert anonymous is not None and anonymous.shared_by == QuotaEntity(None, "c2")
    assert quotas.match("consumer_byte_rate", "alice", "c1") is None
    # resolutions are remembered only while the source gives the same quotas
    current: dict[QuotaEntity, dict[str, int]] = {}
    changing = Quotas(lambda: current)
    assert changing.match("producer_byte_rate", "alice", "c1") is None
    current = {QuotaEntity("alice", None): {"producer_byte_rate": 5}}
    found = changing.match("producer_byte_rate", "alice", "c1")
    assert found is not None and found.rate == 5


# -- throttling per entity -----------------------------------------------------------------------------


def test_client_ids_are_throttled_apart(log_dir: Path) -> None:
    """A quota on client id 'slow' only: its produce answers carry Kafka's throttle time, computed from its
    own bytes; a client with another id sending the same is never throttled; every record is written."""
    QuotaStore(str(log_dir)).alter([(QuotaEntity(None, "slow"), {"producer_byte_rate": 1000})])
    clock = ManualClock()
    log = pylog.open_log(log_dir, clock=clock)
    log.create_topic("q")
    records = record_batch([bytes([i]) * 1000 for i in range(6)])  # about 6 kB: 60 % of the window's 10 kB
    try:
        with pylog.serve(log) as broker:
            fast = RawClient.to(broker.bootstrap_servers, "fast")
            for _ in range(5):
                assert produce(fast, "q", records) == (0, 0)
            fast.close()
            in_window = 0
            for expected_zero in (True, False):  # a new connection each time: a throttled one is muted
                slow = RawClient.to(broker.bootstrap_servers, "slow")
                in_window += len(records)
                code, ms = produce(slow, "q", records)
                slow.close()
                assert code == 0
                assert ms == expected_throttle(in_window, 1000)
                assert (ms == 0) == expected_zero
            clock.advance(WINDOW_MS)  # the window has passed: the quota is back
            slow = RawClient.to(broker.bootstrap_servers, "slow")
            assert produce(slow, "q", records) == (0, 0)
            slow.close()
            # a quota set while the broker runs (as 'pylog quotas set' from another process) applies at once
            QuotaStore(str(log_dir)).alter([(QuotaEntity(None, "fast"), {"producer_byte_rate": 1000})])
            answers = []
            for _ in range(2):
                fast = RawClient.to(broker.bootstrap_servers, "fast")
                answers.append(produce(fast, "q", records))
                fast.close()
            assert answers == [(0, 0), (0, expected_throttle(2 * len(records), 1000))]
        assert len(stored(log, "q")) == 10 * 6
    finally:
        log.close()


def test_user_quota_is_shared_by_its_clients(log_dir: Path) -> None:
    """users/alice: all alice's client ids count together; bob (users/<default> absent) is unlimited."""
    store = CredentialStore(str(log_dir))
    store.add("alice", "pw", ("PLAIN",))
    quotas = QuotaStore(str(log_dir))
    quotas.alter([(QuotaEntity("alice", None), {"producer_byte_rate": 1000})])
    log = pylog.open_log(log_dir, clock=ManualClock())
    log.create_topic("q")
    records = record_batch([b"x" * 1000] * 6)
    try:
        with pylog.serve(log, sasl="PLAIN", super_users="User:alice") as broker:
            seen = []
            for client_id in ("a1", "a2"):
                client = RawClient.to(broker.bootstrap_servers, client_id)
                assert client.call(17, 1, _handshake("PLAIN")).error_code == 0
                auth = client.call(36, 2, _authenticate(b"\0alice\0pw"))
                assert auth.error_code == 0
                seen.append(produce(client, "q", records))
                client.close()
            assert seen[0] == (0, 0)
            assert seen[1] == (0, expected_throttle(2 * len(records), 1000)) and seen[1][1] > 0
    finally:
        log.close()


def _handshake(mechanism: str) -> Any:
    from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

    return SaslHandshakeRequest(mechanism=mechanism)


def _authenticate(token: bytes) -> Any:
    from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest

    return SaslAuthenticateRequest(auth_bytes=token)


# -- DescribeClientQuotas / AlterClientQuotas -------------------------------------------------------------


def test_alter_and_describe_client_quotas(log_dir: Path) -> None:
    with pylog.serve(log_dir) as broker:
        admin = RawClient.to(broker.bootstrap_servers, "admin")
        assert alter(admin, {"user": "alice"}, producer_byte_rate=5000).error_code == 0
        assert alter(admin, {"user": "alice", "client-id": None}, consumer_byte_rate=7000).error_code == 0
        assert alter(admin, {"client-id": None}, producer_byte_rate=100).error_code == 0
        assert alter(admin, {"client-id": "x"}, validate_only=True, producer_byte_rate=1).error_code == 0
        everything = entries(describe(admin))
        assert everything == {
            (("user", "alice"),): {"producer_byte_rate": 5000.0},
            (("user", "alice"), ("client-id", None)): {"consumer_byte_rate": 7000.0},
            (("client-id", None),): {"producer_byte_rate": 100.0},
        }
        assert set(entries(describe(admin, user=(0, "alice")))) == {
            (("user", "alice"),),
            (("user", "alice"), ("client-id", None)),
        }
        assert set(entries(describe(admin, strict=True, user=(0, "alice")))) == {(("user", "alice"),)}
        assert set(entries(describe(admin, client_id=(1, None)))) == {
            (("user", "alice"), ("client-id", None)),
            (("client-id", None),),
        }
        assert set(entries(describe(admin, strict=True, client_id=(2, None)))) == {(("client-id", None),)}
        # removing the last key removes the entity
        assert alter(admin, {"client-id": None}, producer_byte_rate=None).error_code == 0
        assert (("client-id", None),) not in entries(describe(admin))
        # invalid entries: Kafka's INVALID_REQUEST (42) with the reason, nothing changed
        for entity, ops in [
            ({"user": "alice"}, {"request_percentage": 50.0}),
            ({"user": "alice"}, {"producer_byte_rate": 0.0}),
            ({"user": "alice"}, {"producer_byte_rate": 1.5}),
            ({"user": "alice"}, {"producer_byte_rate": float("inf")}),
            ({"user": "alice"}, {"producer_byte_rate": float("nan")}),
            ({"user": "alice"}, {"producer_byte_rate": 2.0**64}),
            ({"user": "alice"}, {"nonsense": 1.0}),
            ({"ip": "10.0.0.1"}, {"producer_byte_rate": 10.0}),
            ({"user": "<default>"}, {"producer_byte_rate": 10.0}),
            ({}, {"producer_byte_rate": 10.0}),
        ]:
            result = alter(admin, entity, **ops)
            assert result.error_code == 42, (entity, ops)
            assert result.error_message
        assert describe(admin, ip=(0, "x")).error_code == 42
        assert entries(describe(admin))[(("user", "alice"),)] == {"producer_byte_rate": 5000.0}
        admin.close()
    # what the broker wrote is what the store reads (and survives the broker)
    stored = QuotaStore(str(log_dir)).quotas()
    assert stored == {
        QuotaEntity("alice", None): {"producer_byte_rate": 5000},
        QuotaEntity("alice", DEFAULT): {"consumer_byte_rate": 7000},
    }


def test_a_failed_write_is_answered(log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A quota file that cannot be written (a full disk) answers UNKNOWN_SERVER_ERROR and changes nothing;
    a damaged one INVALID_CONFIG; the connection keeps serving."""
    import pylog.broker.quota_store as quota_store

    def full(path: str, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    with pylog.serve(log_dir) as broker:
        admin = RawClient.to(broker.bootstrap_servers, "admin")
        with monkeypatch.context() as m:
            m.setattr(quota_store, "write_private", full)
            result = alter(admin, {"user": "alice"}, producer_byte_rate=10)
        assert (result.error_code, "No space left" in (result.error_message or "")) == (-1, True)
        assert entries(describe(admin)) == {}
        path = os.path.join(log_dir, "__security", "quotas")
        with open(path, "wb") as f:
            f.write(b"damaged")
        os.chmod(path, 0o600)
        assert alter(admin, {"user": "alice"}, producer_byte_rate=10).error_code == 40
        assert describe(admin).error_code == 40  # the reason in error_message
        admin.close()
        with open(path, "rb") as f:
            assert f.read() == b"damaged"


def test_quotas_need_configs_operations_on_the_cluster(log_dir: Path) -> None:
    CredentialStore(str(log_dir)).add("bob", "pw", ("PLAIN",))
    with pylog.serve(log_dir, sasl="PLAIN") as broker:
        client = RawClient.to(broker.bootstrap_servers, "c")
        client.call(17, 1, _handshake("PLAIN"))
        assert client.call(36, 2, _authenticate(b"\0bob\0pw")).error_code == 0
        assert describe(client).error_code == 31  # CLUSTER_AUTHORIZATION_FAILED
        assert alter(client, {"user": "bob"}, producer_byte_rate=1).error_code == 31
        assert QuotaStore(str(log_dir)).quotas() == {}
        from pylog.broker.acls import CLUSTER_NAME, Acl, AclStore

        AclStore(str(log_dir)).add(
            [Acl("User:bob", "*", "ALTER_CONFIGS", "ALLOW", "CLUSTER", "LITERAL", CLUSTER_NAME)]
        )
        assert alter(client, {"user": "bob"}, producer_byte_rate=1).error_code == 0
        assert describe(client).error_code == 0  # ALTER_CONFIGS implies DESCRIBE_CONFIGS
        client.close()


# -- the file ----------------------------------------------------------------------------------------------


def test_quota_file_is_private_checked_and_persistent(log_dir: Path) -> None:
    store = QuotaStore(str(log_dir))
    store.alter([(QuotaEntity(DEFAULT, None), {"consumer_byte_rate": 10})])
    path = os.path.join(log_dir, "__security", "quotas")
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert not os.path.exists(path + ".tmp")
    # another store (another process) reads it; a restart keeps it
    assert QuotaStore(str(log_dir)).quotas() == {QuotaEntity(DEFAULT, None): {"consumer_byte_rate": 10}}
    with open(path, "rb") as f:
        raw = f.read()
    damaged = raw.replace(b"10", b"11")
    with open(path, "wb") as f:
        f.write(damaged)
    with pytest.raises(ConfigError, match="does not check"):
        QuotaStore(str(log_dir)).quotas()
    with pytest.raises(ConfigError, match="does not check"):
        pylog.serve(log_dir).close()
    with pytest.raises(ConfigError, match="does not check"):  # nothing written over a damaged file
        store.alter([(QuotaEntity("x", None), {"consumer_byte_rate": 1})])
    with open(path, "rb") as f:
        assert f.read() == damaged
    with pytest.raises(ConfigError):
        QuotaStore(str(log_dir)).alter([(QuotaEntity("x", None), {"producer_byte_rate": -1})])


def test_a_running_broker_keeps_its_quotas_when_the_file_breaks(log_dir: Path) -> None:
    store = QuotaStore(str(log_dir))
    store.alter([(QuotaEntity(None, "c"), {"producer_byte_rate": 3})])
    assert store.current() == {QuotaEntity(None, "c"): {"producer_byte_rate": 3}}
    path = os.path.join(log_dir, "__security", "quotas")
    with open(path, "ab") as f:
        f.write(b"garbage")
    assert store.current() == {QuotaEntity(None, "c"): {"producer_byte_rate": 3}}
    os.remove(path)
    os.mkdir(path, 0o700)  # reading it now fails with IsADirectoryError (an OSError)
    assert store.current() == {QuotaEntity(None, "c"): {"producer_byte_rate": 3}}


def test_quotas_survive_a_restart(log_dir: Path) -> None:
    with pylog.serve(log_dir) as broker:
        admin = RawClient.to(broker.bootstrap_servers, "admin")
        assert alter(admin, {"client-id": "slow"}, producer_byte_rate=1000).error_code == 0
        admin.close()
    log = pylog.open_log(log_dir, clock=ManualClock())
    log.create_topic("q")
    try:
        with pylog.serve(log) as broker:
            slow = RawClient.to(broker.bootstrap_servers, "slow")
            records = record_batch([b"y" * 1000] * 12)  # over the window's 10 kB at once
            assert produce(slow, "q", records) == (0, expected_throttle(len(records), 1000))
            slow.close()
    finally:
        log.close()


# -- the CLI -----------------------------------------------------------------------------------------------


def test_cli_quotas(log_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(log_dir)

    def quotas(*args: str) -> int:
        return main(["--dir", d, "quotas", *args])

    assert quotas("set", "--user", "alice", "--client-id", "app", "--produce-byte-rate", "1000") == 0
    assert quotas("set", "--client-id-default", "--consumer-byte-rate", "500") == 0
    assert quotas("set", "--user", "alice", "--client-id", "app", "--consumer-byte-rate", "9") == 0
    capsys.readouterr()
    assert quotas("list", "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed == [
        {
            "user": "alice",
            "client-id": "app",
            "values": {"consumer_byte_rate": 9, "producer_byte_rate": 1000},
        },
        {"client-id": "<default>", "values": {"consumer_byte_rate": 500}},
    ]
    assert quotas("list", "--user", "alice") == 0
    text = capsys.readouterr().out
    assert text.splitlines() == ["user=alice, client-id=app consumer_byte_rate=9 producer_byte_rate=1000"]
    assert quotas("remove", "--user", "alice", "--client-id", "app", "--consumer-byte-rate") == 0
    assert QuotaStore(d).quotas()[QuotaEntity("alice", "app")] == {"producer_byte_rate": 1000}
    assert quotas("remove", "--user", "alice", "--client-id", "app") == 0  # every key
    assert QuotaEntity("alice", "app") not in QuotaStore(d).quotas()
    capsys.readouterr()
    assert quotas("remove", "--user", "nobody") == 1
    assert "no quota" in capsys.readouterr().err
    assert quotas("set", "--user", "alice", "--produce-byte-rate", "0") == 2
    assert quotas("set", "--user", "alice") == 2  # nothing to set
    assert quotas("set", "--produce-byte-rate", "5") == 2  # no entity


def test_kafka_python_quota_messages(log_dir: Path) -> None:
    """kafka-python's own AlterClientQuotas / DescribeClientQuotas messages (its admin client has no quota
    methods; the messages and the version negotiation are its own), and the quota then applies."""
    from kafka import KafkaAdminClient
    from kafka.protocol.admin import AlterClientQuotasRequest as Alter
    from kafka.protocol.admin import DescribeClientQuotasRequest as Describe

    with pylog.serve(log_dir) as broker:
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        try:
            entry = Alter.EntryData(
                entity=[
                    Alter.EntryData.EntityData(entity_type="user", entity_name=None),
                    Alter.EntryData.EntityData(entity_type="client-id", entity_name="etl"),
                ],
                ops=[
                    Alter.EntryData.OpData(key="consumer_byte_rate", value=2048.0, remove=False),
                    Alter.EntryData.OpData(key="producer_byte_rate", value=1024.0, remove=False),
                ],
            )
            answer = admin._manager.run(admin._manager.send, Alter(entries=[entry], validate_only=False))
            assert [e.error_code for e in answer.entries] == [0]
            described = admin._manager.run(
                admin._manager.send,
                Describe(
                    components=[Describe.ComponentData(entity_type="client-id", match_type=0, match="etl")],
                    strict=False,
                ),
            )
        finally:
            admin.close()
    assert described.error_code == 0
    [found] = described.entries
    assert [(e.entity_type, e.entity_name) for e in found.entity] == [("user", None), ("client-id", "etl")]
    assert {v.key: v.value for v in found.values} == {
        "consumer_byte_rate": 2048.0,
        "producer_byte_rate": 1024.0,
    }
    match = Quotas(QuotaStore(str(log_dir)).quotas).match("producer_byte_rate", "ANONYMOUS", "etl")
    assert match is not None and (match.rate, match.entity) == (1024, QuotaEntity(DEFAULT, "etl"))


def test_idle_windows_are_dropped() -> None:
    """Memory stays bounded by the entities active in the last window: 5000 client ids once, then one
    client for more than a window; empty fetches keep no sample."""
    quotas = Quotas(None, consumer_byte_rate=1000)
    for i in range(5000):
        quotas.throttle(1, "ANONYMOUS", f"c{i}", lambda: 10, 0.0)
    assert quotas.windows() == 5000
    for step in range(2048):
        quotas.throttle(1, "ANONYMOUS", "steady", lambda: 0, WINDOW_MS + step)
    assert quotas.windows() == 0  # the 5000 swept, 'steady' moved no byte
    assert quotas.throttle(1, "ANONYMOUS", "steady", lambda: 20_000, 3 * WINDOW_MS).ms == WINDOW_MS


def test_fetch_quota_per_client_id(log_dir: Path) -> None:
    """consumer_byte_rate on client id 'reader-slow': unchanged confluent-kafka consumers, one told to slow
    down (throttle_cb), the other not; both read every record."""
    import confluent_kafka as ck
    from kafka_support import WAIT_S

    QuotaStore(str(log_dir)).alter([(QuotaEntity(None, "reader-slow"), {"consumer_byte_rate": 2000})])
    values = [bytes([i]) * 1000 for i in range(30)]  # 30 kB: over the window's 20 kB
    with pylog.serve(log_dir) as broker:
        broker.log.create_topic("f")
        producer = broker.log.producer(value_serializer=None)
        for value in values:
            producer.send("f", value, partition=0)
        producer.flush()
        producer.close()
        seen: dict[str, list[int]] = {}
        for client_id in ("reader-slow", "reader-fast"):
            throttles: list[Any] = []
            consumer = ck.Consumer(
                {
                    "bootstrap.servers": broker.bootstrap_servers,
                    "client.id": client_id,
                    "group.id": client_id,
                    "auto.offset.reset": "earliest",
                    "throttle_cb": throttles.append,
                }
            )
            consumer.subscribe(["f"])
            got: list[bytes] = []
            deadline = WAIT_S
            while len(got) < len(values) and deadline > 0:
                message = consumer.poll(0.5)
                deadline -= 0.5
                if message is not None and message.error() is None:
                    got.append(message.value())
            consumer.poll(0.5)  # throttle events are served by poll
            consumer.close()
            assert got == values, client_id
            seen[client_id] = [t.throttle_time for t in throttles]
    assert any(ms > 0 for ms in seen["reader-slow"])
    assert all(ms == 0 for ms in seen["reader-fast"])
