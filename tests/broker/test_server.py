"""The broker's server: bad frames and oversized requests close only their own connection, ApiVersions
answers unsupported versions with its range, one broker per directory, loopback only by default, and the
`pylog serve` process: ready line, graceful SIGTERM, and no acknowledged record lost to a SIGKILL."""

from __future__ import annotations

import signal
import socket
import struct
import threading
from pathlib import Path

import confluent_kafka as ck
import pytest
from kafka import KafkaProducer
from kafka_support import WAIT_S, BrokerProcess, stored_values
from kafka_support import stored as stored_records

import pylog
from pylog.broker.broker import Broker
from pylog.errors import ConfigError, LockError


def _connect(broker: Broker) -> socket.socket:
    s = socket.create_connection((broker.host, broker.port), timeout=WAIT_S)
    return s


def _closed_by_peer(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def _api_versions(version: int, correlation_id: int = 7) -> bytes:
    client = b"t"
    body = struct.pack(">hhih", 18, version, correlation_id, len(client)) + client
    if version >= 3:
        body += b"\x00" + b"\x02a" + b"\x021" + b"\x00"  # tagged fields, client software name and version
    return struct.pack(">i", len(body)) + body


def _read_frame(s: socket.socket) -> bytes:
    head = b""
    while len(head) < 4:
        chunk = s.recv(4 - len(head))
        assert chunk, "connection closed"
        head += chunk
    (size,) = struct.unpack(">i", head)
    data = b""
    while len(data) < size:
        chunk = s.recv(size - len(data))
        assert chunk, "connection closed"
        data += chunk
    return data


def _still_serves(broker: Broker) -> None:
    p = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, enable_idempotence=False)
    assert p.send("alive", value=b"x", partition=0).get(WAIT_S).offset >= 0
    p.close()


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">i", 200 << 20),  # over socket.request.max.bytes: closed before reading it
        struct.pack(">i", -5),
        struct.pack(">i", 3) + b"abc",  # shorter than a header
        struct.pack(">i", 12) + struct.pack(">hhi", 3, 12, 1) + b"\xff\xff\xff\xff",  # truncated body
        struct.pack(">i", 8) + struct.pack(">hhi", 999, 0, 1),  # unknown api key
    ],
)
def test_bad_frames_close_only_their_connection(broker: Broker, frame: bytes) -> None:
    healthy = _connect(broker)
    bad = _connect(broker)
    bad.sendall(frame)
    assert _closed_by_peer(bad)
    bad.close()
    healthy.sendall(_api_versions(2))
    assert _read_frame(healthy)[:4] == struct.pack(">i", 7)  # answered after the other connection failed
    healthy.close()
    _still_serves(broker)


def test_api_versions_unsupported_version_answers_with_the_range(broker: Broker) -> None:
    s = _connect(broker)
    s.sendall(_api_versions(99, correlation_id=42))
    frame = _read_frame(s)
    s.close()
    correlation_id, error, count = struct.unpack_from(">ihi", frame)
    assert (correlation_id, error) == (42, 35)  # UNSUPPORTED_VERSION, in version 0's layout
    keys = [struct.unpack_from(">hhh", frame, 10 + 6 * i) for i in range(count)]
    assert (18, 0, 3) in keys and (0, 0, 9) in keys


def test_one_broker_per_directory(broker: Broker) -> None:
    with pytest.raises(LockError, match="another broker serves"):
        pylog.serve(broker.log.path)
    with pytest.raises(LockError):
        pylog.serve(broker.log)


def test_non_loopback_address_is_refused_without_allow_anonymous(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="loopback addresses only"):
        pylog.serve(tmp_path / "log", listen="0.0.0.0:0")
    assert not (tmp_path / "log").exists()  # refused before the directory was created
    with pytest.raises(ConfigError, match="HOST:PORT"):
        pylog.serve(tmp_path / "log", listen="nonsense")


def test_serve_process_prints_its_address_and_stops_on_sigterm(log_dir: Path) -> None:
    p = BrokerProcess(log_dir)
    try:
        host, port = p.address.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        producer = ck.Producer({"bootstrap.servers": p.address, "acks": "all"})
        for i in range(100):
            producer.produce("t", value=b"%d" % i, partition=0)
        assert producer.flush(WAIT_S) == 0
        assert p.stop(signal.SIGTERM) == 0
        assert p.stop(signal.SIGINT) == 0  # already stopped
    finally:
        p.close()
    with pylog.open(log_dir) as log:
        values = stored_values(log, "t")
    assert values == [b"%d" % i for i in range(100)]


def test_sigkill_mid_stream_loses_no_acknowledged_record(log_dir: Path) -> None:
    """acks=all: every record the broker acknowledged is in the log after the broker process is SIGKILLed
    while records are still being produced."""
    p = BrokerProcess(log_dir)
    acked: dict[int, bytes] = {}
    lock = threading.Lock()

    def on_delivery(err: object, msg: ck.Message) -> None:
        if err is None:
            with lock:
                acked[msg.offset()] = msg.value()

    producer = ck.Producer(
        {
            "bootstrap.servers": p.address,
            "acks": "all",
            "linger.ms": 1,
            "message.timeout.ms": 5000,
            "retries": 0,
        }
    )
    try:
        i = 0
        while True:
            try:
                producer.produce("kill", value=b"value-%d" % i, partition=0, on_delivery=on_delivery)
            except BufferError:  # the client's queue is full: wait for acknowledgements
                producer.poll(0.05)
                continue
            i += 1
            producer.poll(0)
            if len(acked) >= 2000:
                break
        p.stop(signal.SIGKILL)
        producer.flush(WAIT_S)
    finally:
        p.close()
    with pylog.open(log_dir) as log:
        stored = {r.offset: r.value for r in stored_records(log, "kill")}
    assert len(acked) >= 2000
    missing = {o: v for o, v in acked.items() if stored.get(o) != v}
    assert not missing


def test_an_invalid_topic_name_is_answered_not_dropped(broker: Broker) -> None:
    """A produce or fetch naming a topic pylog cannot have (a name with '/') gets INVALID_TOPIC_EXCEPTION on
    its partition, over a connection that stays open."""
    import datetime

    from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
    from kio_client import RawClient, produce

    client = RawClient(broker.host, broker.port)
    try:
        assert produce(client, "a/b", b"", acks=1)[0] == 17  # INVALID_TOPIC_EXCEPTION
        fetched = client.call(
            1,
            12,
            FetchRequest(
                max_wait=datetime.timedelta(0),
                min_bytes=1,
                topics=(
                    FetchTopic(
                        topic="a/b",
                        partitions=(FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1024),),
                    ),
                ),
                forgotten_topics_data=(),
            ),
        )
        assert fetched.responses[0].partitions[0].error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION
    finally:
        client.close()
