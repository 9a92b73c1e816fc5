"""Connection limits: max_connections, max_connections_per_ip and connections_max_idle_ms, seen from raw
sockets; the broker keeps serving the others."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from kafka_support import WAIT_S, BrokerProcess, wait_until

import pylog
import pylog.broker.server as server_module
from pylog.errors import ConfigError


def api_versions(sock: socket.socket, correlation: int = 1) -> int:
    """Send ApiVersions v0; the correlation id of the answer (ConnectionError if the broker closed)."""
    payload = struct.pack(">hhih", 18, 0, correlation, 1) + b"t"
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    head = _read(sock, 8)
    _read(sock, struct.unpack(">i", head[:4])[0] - 4)
    return int(struct.unpack(">i", head[4:])[0])


def _read(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed by the broker")
        buf += chunk
    return buf


def closed(sock: socket.socket) -> bool:
    """The broker closed ``sock`` (waits up to WAIT_S for it)."""
    sock.settimeout(WAIT_S)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_connections_per_address_and_in_total(log_dir: Path) -> None:
    with pylog.serve(log_dir, max_connections_per_ip=2) as broker:
        address = (broker.host, broker.port)
        first, second = socket.create_connection(address), socket.create_connection(address)
        assert api_versions(first) == 1 and api_versions(second) == 1
        third = socket.create_connection(address)
        assert closed(third)  # over the limit: closed before anything is read
        first.close()
        for _ in range(100):  # the broker sees the close, then admits a new connection
            fourth = socket.create_connection(address)
            try:
                assert api_versions(fourth, 4) == 4
                break
            except ConnectionError:
                fourth.close()
        else:
            pytest.fail("no connection admitted after one was closed")
        assert api_versions(second, 2) == 2  # the others were served throughout
        for s in (second, third, fourth):
            s.close()
    with (
        pylog.serve(log_dir, max_connections=1) as broker,
        socket.create_connection((broker.host, broker.port)) as one,
    ):
        assert api_versions(one) == 1
        with socket.create_connection((broker.host, broker.port)) as two:
            assert closed(two)
        assert api_versions(one, 2) == 2


def test_idle_connections_are_closed(log_dir: Path) -> None:
    with pylog.serve(log_dir, connections_max_idle_ms=200) as broker:
        with socket.create_connection((broker.host, broker.port)) as idle:
            assert api_versions(idle) == 1
            assert closed(idle)
        # a client that reconnects when needed keeps working
        producer = ck.Producer({"bootstrap.servers": broker.bootstrap_servers, "acks": "all"})
        producer.produce("t", value=b"v")
        assert producer.flush(WAIT_S) == 0
        del producer


def test_limits_are_checked(log_dir: Path) -> None:
    for bad in ({"max_connections": 0}, {"max_connections_per_ip": -1}, {"connections_max_idle_ms": 0}):
        with pytest.raises(ConfigError):
            pylog.serve(log_dir, **bad)


def test_request_bytes_are_bounded(log_dir: Path) -> None:
    """30 clients each sending a 200 KiB request at once, with a 1 MiB budget: every one is answered, and the
    broker never held more than 1 MiB of requests (one request alone may exceed it: it is read when nothing
    else is)."""
    padding = b"\0" * (200 << 10)  # after an ApiVersions v0 header: ignored, but read and held
    with pylog.serve(log_dir, queued_max_request_bytes=1 << 20, max_request_bytes=4 << 20) as broker:
        socks = [socket.create_connection((broker.host, broker.port)) for _ in range(30)]
        for i, s in enumerate(socks):
            payload = struct.pack(">hhih", 18, 0, i, 1) + b"t" + padding
            s.sendall(struct.pack(">i", len(payload)) + payload)
        answered = 0
        for i, s in enumerate(socks):
            head = _read(s, 8)
            _read(s, struct.unpack(">i", head[:4])[0] - 4)
            answered += struct.unpack(">i", head[4:])[0] == i
            s.close()
        assert answered == 30
        budget = broker.limits.budget
        assert 0 < budget.peak <= 1 << 20
        wait_until(lambda: budget.in_use == 0, "every request's bytes given back")
        with socket.create_connection((broker.host, broker.port)) as big:  # larger than the budget
            payload = struct.pack(">hhih", 18, 0, 99, 1) + b"t" + b"\0" * (2 << 20)
            big.sendall(struct.pack(">i", len(payload)) + payload)
            head = _read(big, 8)
            assert struct.unpack(">i", head[4:])[0] == 99
        assert budget.peak > 1 << 20


def _api_versions_frame(correlation: int, padding: int) -> bytes:
    """ApiVersions v0 followed by ``padding`` zero bytes (read and held by the broker, then ignored)."""
    payload = struct.pack(">hhih", 18, 0, correlation, 1) + b"t" + b"\0" * padding
    return struct.pack(">i", len(payload)) + payload


def _answered(sock: socket.socket) -> int:
    head = _read(sock, 8)
    _read(sock, struct.unpack(">i", head[:4])[0] - 4)
    return int(struct.unpack(">i", head[4:])[0])


def test_a_client_stalled_in_the_middle_of_a_request_is_closed_and_blocks_no_other(log_dir: Path) -> None:
    """A client that sends half a request and then nothing holds its share of the request budget; after
    connections_max_idle_ms without a byte its connection is closed and the budget given back, so a request
    that did not fit beside it is read and answered."""
    with pylog.serve(
        log_dir, queued_max_request_bytes=1 << 20, max_request_bytes=4 << 20, connections_max_idle_ms=1000
    ) as broker:
        address = (broker.host, broker.port)
        budget = broker.limits.budget
        with socket.create_connection(address) as stalled:
            frame = _api_versions_frame(1, 600 << 10)
            stalled.sendall(frame[: len(frame) // 2])
            wait_until(lambda: budget.in_use == len(frame) - 4, "the stalled request's bytes reserved")
            other = socket.create_connection(address)
            other.sendall(_api_versions_frame(2, 600 << 10))  # does not fit beside it: waits its turn
            other.settimeout(WAIT_S)
            assert _answered(other) == 2
            assert closed(stalled)
            other.close()
        wait_until(lambda: budget.in_use == 0, "every request's bytes given back")


def test_an_answered_request_is_not_held_while_its_connection_waits_for_the_next(log_dir: Path) -> None:
    """The bytes of a request are freed once it is answered, although its connection stays open: 20
    connections of one 1 MiB request each hold nothing of them afterwards (the broker's memory follows the
    request budget, not the connections times the largest request)."""
    tracemalloc.start()
    try:
        with pylog.serve(log_dir, queued_max_request_bytes=1 << 20, max_request_bytes=4 << 20) as broker:
            address = (broker.host, broker.port)
            socks = [socket.create_connection(address) for _ in range(20)]
            try:
                for i, s in enumerate(socks):  # every connection's first request, then the baseline
                    s.sendall(_api_versions_frame(i, 0))
                    assert _answered(s) == i
                before, _ = tracemalloc.get_traced_memory()
                for i, s in enumerate(socks):
                    s.sendall(_api_versions_frame(100 + i, 1 << 20))
                for i, s in enumerate(socks):
                    assert _answered(s) == 100 + i
                wait_until(lambda: broker.limits.budget.in_use == 0, "every request's bytes given back")
                held, _ = tracemalloc.get_traced_memory()
            finally:
                for s in socks:
                    s.close()
    finally:
        tracemalloc.stop()
    assert held - before < 4 << 20, f"{(held - before) >> 20} MiB held after 20 answered 1 MiB requests"


def test_serve_max_request_bytes_option(tmp_path: Path) -> None:
    """``pylog serve --max-request-bytes`` (socket.request.max.bytes): a request of that size is answered, a
    larger one closes its connection unread."""
    broker = BrokerProcess(tmp_path / "log", "--max-request-bytes", "4096")
    try:
        host, port = broker.address.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as ok:
            frame = _api_versions_frame(7, 0)
            ok.sendall(_api_versions_frame(7, 4096 - (len(frame) - 4)))  # exactly 4096 bytes after the size
            ok.settimeout(WAIT_S)
            assert _answered(ok) == 7
        with socket.create_connection((host, int(port))) as big:
            big.sendall(_api_versions_frame(8, 4097 - (len(frame) - 4))[:100])
            assert closed(big)
    finally:
        broker.close()


def test_a_request_being_handled_holds_what_it_decoded_and_not_its_frame(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While 8 requests of 1 MiB are being handled, the broker holds what their decoding kept (here nothing:
    the padding after an ApiVersions request is not part of it), not the 8 MiB of frames."""
    entered: list[int] = []
    release = threading.Event()
    original = server_module.HANDLERS[18]

    async def held(ctx: Any, request: Any) -> Any:
        entered.append(request.correlation_id)
        while not release.is_set():
            await asyncio.sleep(0.01)
        return await original(ctx, request)

    monkeypatch.setitem(server_module.HANDLERS, 18, held)
    tracemalloc.start()
    try:
        with pylog.serve(log_dir, queued_max_request_bytes=16 << 20, max_request_bytes=4 << 20) as broker:
            socks = [socket.create_connection((broker.host, broker.port)) for _ in range(8)]
            try:
                before, _ = tracemalloc.get_traced_memory()
                for i, s in enumerate(socks):
                    s.sendall(_api_versions_frame(i, 1 << 20))
                wait_until(lambda: len(entered) == 8, "8 requests being handled")
                held_bytes, _ = tracemalloc.get_traced_memory()
                release.set()
                for i, s in enumerate(socks):
                    assert _answered(s) == i
            finally:
                release.set()
                for s in socks:
                    s.close()
    finally:
        tracemalloc.stop()
    assert held_bytes - before < 3 << 20, (
        f"{(held_bytes - before) >> 20} MiB held by 8 requests being handled"
    )
