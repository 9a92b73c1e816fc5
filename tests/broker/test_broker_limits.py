"""Connection limits: max_connections, max_connections_per_ip, connections_max_idle_ms,
request_read_timeout_ms and the request budget, seen from raw sockets; the broker keeps serving the others."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
import tracemalloc
import urllib.request
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from kafka_support import WAIT_S, BrokerProcess, wait_until

import pylog
import pylog.broker.server as server_module
from pylog.broker.limits import REQUEST_READ_TIMEOUT_MS, ConnectionLimits
from pylog.cli._app import main as pylog_main
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
    with pylog.serve(log_dir, connections_max_idle_ms=200, metrics="127.0.0.1:0") as broker:
        with socket.create_connection((broker.host, broker.port)) as idle:
            assert api_versions(idle) == 1
            assert closed(idle)
        assert broker.metrics_address is not None
        assert closes_counted(broker.metrics_address) == {"connections_max_idle_ms": 1}
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
    request_read_timeout_ms without a byte (by default connections_max_idle_ms when that is shorter than
    30 s, as here) its connection is closed and the budget given back, so a request that did not fit beside
    it is read and answered."""
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


def closes_counted(metrics_address: str) -> dict[str, float]:
    """pylog_connections_closed_total per limit, scraped from the broker's Prometheus endpoint."""
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=WAIT_S) as response:
        text = response.read().decode()
    prefix = 'pylog_connections_closed_total{limit="'
    return {
        line[len(prefix) :].split('"', 1)[0]: float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


_LONG_IDLE_MS = 300_000  # connections_max_idle_ms far beyond any wait of these tests
_ANSWER_WAIT_S = 20.0  # generous beside a limit of 0.5 s, short beside the idle limit


def test_a_stalled_request_is_closed_after_request_read_timeout_ms_long_before_the_idle_limit(
    log_dir: Path,
) -> None:
    """With connections_max_idle_ms of 5 minutes and request_read_timeout_ms of 0.5 s: a client that sends
    half a request and stalls is closed after the shorter limit, its share of the budget is given back, and
    the request of a second client, which did not fit in the budget beside it, is answered (it waited for
    budget, not for the idle limit). The broker keeps serving: a new connection is answered. The close is
    counted in pylog_connections_closed_total under its limit."""
    with pylog.serve(
        log_dir,
        queued_max_request_bytes=1 << 20,
        max_request_bytes=4 << 20,
        connections_max_idle_ms=_LONG_IDLE_MS,
        request_read_timeout_ms=500,
        metrics="127.0.0.1:0",
    ) as broker:
        address = (broker.host, broker.port)
        budget = broker.limits.budget
        with socket.create_connection(address) as stalled, socket.create_connection(address) as other:
            frame = _api_versions_frame(1, 600 << 10)
            stalled.sendall(frame[: len(frame) // 2])
            wait_until(lambda: budget.in_use == len(frame) - 4, "the stalled request's bytes reserved")
            other.sendall(_api_versions_frame(2, 600 << 10))  # does not fit beside it: waits its turn
            other.settimeout(_ANSWER_WAIT_S)
            assert _answered(other) == 2
            assert closed(stalled)
            assert api_versions(other, 3) == 3  # the other connection is still served
        wait_until(lambda: budget.in_use == 0, "every request's bytes given back")
        with socket.create_connection(address) as later:
            assert api_versions(later, 4) == 4
        assert broker.metrics_address is not None
        assert closes_counted(broker.metrics_address) == {"request_read_timeout_ms": 1}


def test_a_client_stalled_in_its_size_prefix_is_closed_after_request_read_timeout_ms(log_dir: Path) -> None:
    """Two bytes of a request's 4-byte size prefix begin the request: a client that stalls there is closed
    after request_read_timeout_ms, not after connections_max_idle_ms; a connection that sent nothing yet
    between two requests is left open."""
    with pylog.serve(log_dir, connections_max_idle_ms=_LONG_IDLE_MS, request_read_timeout_ms=500) as broker:
        address = (broker.host, broker.port)
        with socket.create_connection(address) as stalled, socket.create_connection(address) as idle:
            assert api_versions(idle) == 1
            frame = _api_versions_frame(1, 0)
            stalled.sendall(frame[:2])
            stalled.settimeout(_ANSWER_WAIT_S)
            assert stalled.recv(1) == b""  # closed by the broker
            assert api_versions(idle, 2) == 2  # idle far longer than 0.5 s between its requests: still open


def test_a_slow_client_whose_bytes_keep_coming_is_read_to_the_end(log_dir: Path) -> None:
    """request_read_timeout_ms is a limit between two bytes, not for the whole request: a client that
    trickles a request (size prefix included) in 40 pieces, 0.1 s apart, takes several times the 1.5 s limit
    in all and is answered; so is its next request on the same connection."""
    with (
        pylog.serve(log_dir, connections_max_idle_ms=_LONG_IDLE_MS, request_read_timeout_ms=1500) as broker,
        socket.create_connection((broker.host, broker.port)) as slow,
    ):
        slow.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        frame = _api_versions_frame(7, 4000)
        step = -(-(len(frame) - 4) // 37)
        pieces = [frame[:1], frame[1:2], frame[2:4]]  # the size prefix a byte or two at a time
        pieces += [frame[start : start + step] for start in range(4, len(frame), step)]
        assert len(pieces) == 40 and b"".join(pieces) == frame
        began = time.monotonic()
        for piece in pieces:
            slow.sendall(piece)
            time.sleep(0.1)
        assert time.monotonic() - began > 2 * 1.5  # the whole request took longer than the limit
        slow.settimeout(WAIT_S)
        assert _answered(slow) == 7
        assert api_versions(slow, 8) == 8


def test_bytes_that_came_while_the_broker_was_held_up_are_read_not_cut(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limits count the client's silence, not the broker's: while the broker's event loop is held up
    for 3 s (as when its process is paused), a client in the middle of a request sends the rest of it. When
    the loop runs again its 0.5 s timer has expired, but the bytes are there: the request is read and
    answered, and the connection stays open."""
    blocking = threading.Event()
    original = server_module.HANDLERS[18]

    async def holds_the_loop(ctx: Any, request: Any) -> Any:
        if request.correlation_id == 99:
            blocking.set()
            time.sleep(3.0)  # holds the event loop itself, not only this request
        return await original(ctx, request)

    monkeypatch.setitem(server_module.HANDLERS, 18, holds_the_loop)
    with pylog.serve(
        log_dir, connections_max_idle_ms=_LONG_IDLE_MS, request_read_timeout_ms=500, metrics="127.0.0.1:0"
    ) as broker:
        address = (broker.host, broker.port)
        budget = broker.limits.budget
        with socket.create_connection(address) as client, socket.create_connection(address) as holder:
            frame = _api_versions_frame(1, 2000)
            client.sendall(frame[: len(frame) // 2])
            wait_until(lambda: budget.in_use == len(frame) - 4, "the request's bytes reserved")
            holder.sendall(_api_versions_frame(99, 0))
            assert blocking.wait(WAIT_S)
            client.sendall(frame[len(frame) // 2 :])  # while the loop is held up
            client.settimeout(WAIT_S)
            assert _answered(client) == 1
            assert api_versions(client, 2) == 2
            holder.settimeout(WAIT_S)
            assert _answered(holder) == 99
        assert broker.metrics_address is not None
        assert closes_counted(broker.metrics_address) == {}


def test_request_read_timeout_ms_is_checked(log_dir: Path) -> None:
    """request_read_timeout_ms: a positive int of milliseconds, not longer than connections_max_idle_ms;
    by default 30 s, or connections_max_idle_ms when that is shorter."""
    assert ConnectionLimits().request_read_timeout_ms == REQUEST_READ_TIMEOUT_MS == 30_000
    assert ConnectionLimits(connections_max_idle_ms=1000).request_read_timeout_ms == 1000
    limits = ConnectionLimits(connections_max_idle_ms=1000, request_read_timeout_ms=1000)
    assert limits.request_read_s == 1.0
    bad: list[dict[str, Any]] = [
        {"request_read_timeout_ms": 0},
        {"request_read_timeout_ms": -1},
        {"request_read_timeout_ms": 1.5},
        {"request_read_timeout_ms": "30000"},
        {"request_read_timeout_ms": True},
        {"request_read_timeout_ms": 600_001},  # longer than connections_max_idle_ms' default
        {"request_read_timeout_ms": 2000, "connections_max_idle_ms": 1000},
    ]
    for options in bad:
        with pytest.raises(ConfigError, match="request_read_timeout_ms"):
            pylog.serve(log_dir, **options)
    with pylog.serve(log_dir, request_read_timeout_ms=600_000) as broker:  # as long as the idle limit
        assert broker.limits.request_read_timeout_ms == 600_000


def test_serve_request_read_timeout_ms_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``pylog serve --request-read-timeout-ms``: a value longer than --connections-max-idle-ms is refused
    with a message naming both; a valid one closes a client stalled in the middle of a request."""
    status = pylog_main(
        [
            "--dir",
            str(tmp_path / "refused"),
            "serve",
            "--connections-max-idle-ms",
            "1000",
            "--request-read-timeout-ms",
            "2000",
        ]
    )
    assert status == 1
    err = capsys.readouterr().err
    assert "request_read_timeout_ms" in err and "connections_max_idle_ms" in err
    broker = BrokerProcess(
        tmp_path / "log", "--connections-max-idle-ms", str(_LONG_IDLE_MS), "--request-read-timeout-ms", "500"
    )
    try:
        host, port = broker.address.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as stalled:
            frame = _api_versions_frame(1, 4000)
            stalled.sendall(frame[:100])
            stalled.settimeout(_ANSWER_WAIT_S)
            assert stalled.recv(1) == b""
    finally:
        broker.close()


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
