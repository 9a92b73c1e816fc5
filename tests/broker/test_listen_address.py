"""The address a broker listening on every interface prints and advertises: one clients can connect to
(the machine's host name when it resolves, as Kafka advertises a listener without a host), never 0.0.0.0."""

from __future__ import annotations

import socket
from pathlib import Path

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient
from kafka_support import WAIT_S, BrokerProcess

import pylog
from pylog.broker.broker import advertised_host


def _expected_host() -> str:
    """The model: the host name if it resolves, else loopback."""
    name = socket.gethostname()
    try:
        socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError:
        return "127.0.0.1"
    return name


def test_every_interface_advertises_a_usable_address(log_dir: Path) -> None:
    with pylog.serve(log_dir, "0.0.0.0:0", allow_anonymous=True) as broker:
        expected = f"{_expected_host()}:{broker.port}"
        assert broker.bootstrap_servers == broker.advertised == expected
        conf = {"bootstrap.servers": broker.bootstrap_servers}
        metadata = AdminClient(conf).list_topics(timeout=WAIT_S)
        assert [f"{b.host}:{b.port}" for b in metadata.brokers.values()] == [expected]
        producer = ck.Producer({**conf, "acks": "all"})
        producer.produce("t", value=b"over the advertised address")
        assert producer.flush(WAIT_S) == 0
        consumer = ck.Consumer({**conf, "group.id": "g", "auto.offset.reset": "earliest"})
        consumer.subscribe(["t"])
        message = None
        for _ in range(int(WAIT_S * 10)):
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                break
        consumer.close()
        assert message is not None and message.value() == b"over the advertised address"
    with pylog.serve(log_dir, "0.0.0.0:0", allow_anonymous=True, advertise="kafka.example:9092") as broker:
        assert broker.bootstrap_servers == broker.advertised == "kafka.example:9092"
    with pylog.serve(log_dir, "127.0.0.1:0") as broker:  # a specific address is printed as it is
        assert broker.bootstrap_servers == f"127.0.0.1:{broker.port}" == broker.advertised


def test_every_interface_from_the_command_line(log_dir: Path) -> None:
    process = BrokerProcess(log_dir, "--listen", "0.0.0.0:0", "--allow-anonymous")
    try:
        host, _, port = process.address.rpartition(":")
        assert host == _expected_host() and int(port) > 0
        metadata = AdminClient({"bootstrap.servers": process.address}).list_topics(timeout=WAIT_S)
        assert [f"{b.host}:{b.port}" for b in metadata.brokers.values()] == [process.address]
        assert process.stop() == 0
        assert process.proc.stderr is not None
        assert f"clients are given {process.address}" in process.proc.stderr.read()
    finally:
        process.close()


def test_advertised_host_model() -> None:
    assert advertised_host("127.0.0.1") == "127.0.0.1"
    assert advertised_host("::1") == "::1"
    assert advertised_host("0.0.0.0") == advertised_host("::") == _expected_host()
