"""A fault-injecting HTTP proxy for object-store tests (standard library only).

:class:`FaultProxy` listens on 127.0.0.1 (an ephemeral port) in front of an upstream HTTP server (the moto S3
server of the tests) and forwards each request on a fresh upstream connection, unless a :class:`Rule` the
test installed matches it. A rule matches by method and by a regular expression searched in the request path,
applies to its next ``times`` matching requests (``None``: every one) and does one of:

- ``status``: answer that HTTP status (500, 503...) itself, forwarding nothing;
- ``delay``: wait that many seconds before forwarding;
- ``hold``: wait until the test sets the :class:`threading.Event` before forwarding (a store that stalls);
- ``drop_request_after``: forward the request head and only that many bytes of its body upstream, then
  close both connections (a connection lost in the middle of an upload);
- ``drop_response_after``: forward the whole request, then send the client the response head and only that
  many bytes of the body (at most all but the last one: the answer is always cut), then close; an answer with
  an empty body (a PUT's) is not sent at all: the server did the work, its answer was lost.

Every request is recorded (:attr:`FaultProxy.requests`: method, path, ``Range`` header, what was done) so a
test can count attempts. Thread-safety: rules and the record are guarded by one lock; each client connection
is served by its own thread (``ThreadingHTTPServer``).
"""

from __future__ import annotations

import http.client
import http.server
import re
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

__all__ = ["FaultProxy", "Rule", "Seen"]


@dataclass
class Rule:
    """One injected behaviour; see the module docstring."""

    method: str | None = None
    path: str | None = None  # a regular expression searched in the request path
    times: int | None = 1  # matching requests it applies to; None: all
    status: int | None = None
    delay: float = 0.0
    hold: threading.Event | None = None
    drop_request_after: int | None = None
    drop_response_after: int | None = None
    hits: int = field(default=0, init=False)

    def matches(self, method: str, path: str) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.method is not None and self.method != method:
            return False
        return self.path is None or re.search(self.path, path) is not None

    def describe(self) -> str:
        if self.status is not None:
            return f"status {self.status}"
        if self.drop_request_after is not None:
            return f"drop request after {self.drop_request_after}"
        if self.drop_response_after is not None:
            return f"drop response after {self.drop_response_after}"
        if self.hold is not None:
            return "hold"
        return f"delay {self.delay}"


@dataclass(frozen=True)
class Seen:
    """One request the proxy received: method, path (no query), query, Range header, and what it did."""

    method: str
    path: str
    query: str
    range: str | None
    action: str


class FaultProxy:
    """The proxy: ``endpoint`` is its URL; :meth:`add` installs a rule (first match wins, in order)."""

    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.hostname is None or parsed.port is None:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream = (parsed.hostname, parsed.port)
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self.requests: list[Seen] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _serve(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        """Remove every rule (requests in flight keep theirs) and forget the record."""
        with self._lock:
            self._rules.clear()
            self.requests.clear()

    def seen(self, method: str | None = None, path: str | None = None) -> list[Seen]:
        """The recorded requests with that method and whose path the expression matches."""
        with self._lock:
            return [
                s
                for s in self.requests
                if (method is None or s.method == method) and (path is None or re.search(path, s.path))
            ]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        method = h.command
        split = urllib.parse.urlsplit(h.path)
        body = _read_body(h)
        with self._lock:
            rule = next((r for r in self._rules if r.matches(method, split.path)), None)
            if rule is not None:
                rule.hits += 1
            self.requests.append(
                Seen(
                    method,
                    split.path,
                    split.query,
                    h.headers.get("Range"),
                    rule.describe() if rule else "pass",
                )
            )
        if rule is not None and rule.status is not None:
            payload = b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"
            h.send_response(rule.status)
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            if method != "HEAD":
                h.wfile.write(payload)
            return
        if rule is not None and rule.delay:
            time.sleep(rule.delay)
        if rule is not None and rule.hold is not None:
            rule.hold.wait(60)
        if rule is not None and rule.drop_request_after is not None:
            self._forward_partial(h, body[: rule.drop_request_after])
            h.close_connection = True
            _abort(h.connection)
            return
        status, reason, headers, data = self._forward(h, body)
        if rule is not None and rule.drop_response_after is not None and not data:
            h.close_connection = True  # nothing to cut in an empty body: the whole answer is lost
            _abort(h.connection)
            return
        h.send_response_only(status, reason)
        for name, value in headers:
            if name.lower() not in ("connection", "transfer-encoding", "content-length", "keep-alive"):
                h.send_header(name, value)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if rule is not None and rule.drop_response_after is not None:
            h.wfile.write(data[: min(rule.drop_response_after, max(len(data) - 1, 0))])
            h.wfile.flush()
            h.close_connection = True
            _abort(h.connection)
            return
        if method != "HEAD":
            h.wfile.write(data)

    def _forward(
        self, h: http.server.BaseHTTPRequestHandler, body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            conn.putrequest(h.command, h.path, skip_host=True, skip_accept_encoding=True)
            for name, value in h.headers.items():
                if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                    conn.putheader(name, value)
            if body or h.command in ("PUT", "POST"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.reason, resp.getheaders(), data
        finally:
            conn.close()

    def _forward_partial(self, h: http.server.BaseHTTPRequestHandler, part: bytes) -> None:
        """Send the request head (with the whole body's Content-Length) and ``part`` of the body, then close."""
        with socket.create_connection(self.upstream, timeout=30) as s:
            head = [f"{h.command} {h.path} HTTP/1.1"]
            head += [f"{name}: {value}" for name, value in h.headers.items() if name.lower() != "connection"]
            s.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + part)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(5)
            try:
                while s.recv(65536):
                    pass
            except OSError:
                pass


def _read_body(h: http.server.BaseHTTPRequestHandler) -> bytes:
    if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(out)
            out += h.rfile.read(size)
            h.rfile.readline()
    length = int(h.headers.get("Content-Length") or 0)
    return h.rfile.read(length) if length else b""


def _abort(conn: socket.socket) -> None:
    """Close the client connection at once (a reset, not an orderly end of the response)."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    except OSError:
        pass
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
