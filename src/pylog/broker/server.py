"""The broker's network server: Kafka's framing over TCP, one asyncio event loop in its own thread.

Each connection is read frame by frame: a 4-byte big-endian size, then that many bytes. A size over
``max_request_bytes`` (Kafka's ``socket.request.max.bytes``, 100 MiB) or negative closes that connection
without reading the frame, so one client cannot make the broker allocate more than that; a frame that cannot
be decoded closes that connection too, and so does a request begun and then left without a byte for
``request_read_timeout_ms`` (see :mod:`pylog.broker.limits`). Nothing one connection does affects the
others. Requests of one connection are answered in the order they came (Kafka's guarantee: a client
pipelines them), one at a time; disk work runs in a thread pool, so a slow fsync or a long-polling fetch of
one connection does not hold the event loop.

Why asyncio: a Kafka consumer spends most of its time in long-polling fetches, so a broker holds many idle or
waiting connections: a coroutine costs a few KiB, where a thread per connection costs a stack and a scheduler
entry; the blocking parts (appends, fsyncs, reads of segments) run in a bounded pool of threads.

Shutdown (:meth:`Server.close`): stop accepting, let every request being handled finish and answer it, close
the connections, then stop the loop.

Thread-safety: :meth:`Server.close` may be called from any thread; everything else runs in the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Final

from pylog.broker import fetch, idempotence, meta, produce, transactions
from pylog.broker.admin import Admin
from pylog.broker.context import Context
from pylog.broker.groups import Coordinator
from pylog.broker.metrics import BrokerMetrics
from pylog.broker.protocol import (
    ApiError,
    Request,
    UnsupportedRequest,
    encode_response,
    encode_unsupported,
    read_request,
    warm_up,
)
from pylog.broker.security import Security, Session

__all__ = ["HANDLERS", "Server"]

_log = logging.getLogger("pylog.broker")
_SASL_MAX_BYTES: Final = 512 << 10  # requests before authentication (Kafka's sasl.server.max.receive.size)

Handler = Callable[[Context, Request], Awaitable[dict[str, Any] | None]]

HANDLERS: Final[dict[int, Handler]] = {
    0: produce.produce,
    1: fetch.fetch,
    2: fetch.list_offsets,
    3: meta.metadata,
    18: meta.api_versions,
    22: idempotence.init_producer_id,
    24: transactions.add_partitions,
    25: transactions.add_offsets,
    26: transactions.end_txn,
    28: transactions.txn_offset_commit,
}


class Server:
    """Serves ``ctx`` on the listening socket ``sock`` from a thread of its own (started by :meth:`start`)."""

    def __init__(self, ctx: Context, sock: socket.socket, security: Security | None = None) -> None:
        self.ctx = ctx
        self._security = security or Security()
        self._sock = sock
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="pylog-broker", daemon=True)
        self._ready = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._connections: dict[asyncio.Task[None], bool] = {}  # task -> handling a request now
        self._stopping = False
        self._error: BaseException | None = None
        self._handlers: dict[int, Handler] = dict(HANDLERS)
        self.coordinator: Coordinator | None = None  # the Kafka groups, once the event loop runs

    def start(self) -> None:
        warm_up()
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def close(self, timeout: float = 30.0) -> None:
        if self._thread.is_alive() and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(timeout)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._stopped = asyncio.Event()
        coordinator = self.coordinator = Coordinator(self.ctx)
        self._handlers = {
            **HANDLERS,
            8: coordinator.offset_commit,
            9: coordinator.offset_fetch,
            10: coordinator.find_coordinator,
            11: coordinator.join_group,
            12: coordinator.heartbeat,
            13: coordinator.leave_group,
            14: coordinator.sync_group,
            **Admin(coordinator).handlers(),
        }
        try:
            server = await asyncio.start_server(
                self._connection, sock=self._sock, limit=1 << 14, ssl=self._security.ssl_context
            )
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        await self._stopped.wait()
        self._stopping = True
        # Accept no more, then let the connections already accepted get their transports and tasks before the
        # server closes (on 3.11 a transport made after Server.close() fails an assertion and leaks its socket).
        with contextlib.suppress(NotImplementedError, ValueError, OSError):
            self._loop.remove_reader(self._sock.fileno())
        for _ in range(3):
            await asyncio.sleep(0)
        server.close()  # no new connections
        self.ctx.waiters.release()  # long-polling fetches answer now
        for group in coordinator.groups.values():  # members waiting in a rebalance are answered now
            for member in group.members.values():
                for fut in (member.join, member.sync):
                    if fut is not None and not fut.done():
                        fut.cancel()
        # Every request being handled is answered before any connection closes: librdkafka closes its
        # coordinator connection, with the OffsetCommit in flight, as soon as another connection to the
        # broker closes, and its retry to the next broker is then refused (UNKNOWN_MEMBER_ID) even though
        # this one wrote the commit.
        await self._all_answered()
        for task, busy in list(self._connections.items()):
            if not busy:
                task.cancel()  # waiting for a request
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=30)
        coordinator.close()
        await server.wait_closed()
        for _ in range(3):  # closed transports finish closing their sockets before the loop closes
            await asyncio.sleep(0)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = False
        peer = writer.get_extra_info("peername")
        session = self._security.session(peer, writer.get_extra_info("peercert"))
        limits = self._security.limits
        if not limits.admit(session.host):  # over max_connections or max_connections_per_ip
            self._connections.pop(task, None)
            writer.close()
            return
        session.opened()
        try:
            await self._serve(reader, writer, peer, session)
        except asyncio.CancelledError:
            pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            _log.exception("connection from %s failed", peer)
        finally:
            session.closed()
            limits.release(session.host)
            self._connections.pop(task, None)
            writer.close()

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: Any, session: Session
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        limits, metrics = self._security.limits, self._security.metrics
        idle = partial(_close_idle, writer, peer, metrics)
        while not self._stopping:
            limit = self.ctx.options.max_request_bytes if session.authenticated else _SASL_MAX_BYTES
            head = await _read_within(reader, 4, limits.idle_s, idle)  # what has come of the size prefix
            if len(head) < 4:  # the request has begun: the rest of its size prefix comes within the limit
                if not head:
                    return
                head += await _read_frame(reader, writer, 4 - len(head), limits.request_read_s, peer, metrics)
            size = int.from_bytes(head, "big", signed=True)
            if size < 0 or size > limit:
                _log.warning(
                    "closing the connection from %s: a request of %d bytes (socket.request.max.bytes is %d)",
                    peer,
                    size,
                    limit,
                )
                _closed(metrics, "max_request_bytes")
                return
            budget = limits.budget  # bytes of requests read and not yet answered
            await budget.acquire(size)
            try:
                answer = await self._request(reader, writer, size, peer, session)
            finally:
                budget.release(size)
            if answer is False or answer is True:
                return
            if answer is not None:
                writer.write(answer)
                del answer  # a connection waiting for its next request holds neither this one nor its answer
                await writer.drain()
            if self._stopping:  # closed once the requests of the other connections are answered too
                self._connections[task] = False
                await self._all_answered()
                return
            if session.close_after:
                return
            if session.muted_ms:  # over a byte-rate quota: the next request waits (KIP-219)
                await asyncio.sleep(session.muted_ms / 1000)
                session.muted_ms = 0
            self._connections[task] = False

    async def _all_answered(self, timeout: float = 30.0) -> None:
        """While the broker stops: wait until no connection is handling a request (bounded by ``timeout``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while any(self._connections.values()) and loop.time() < deadline:
            await asyncio.sleep(0.005)

    async def _request(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        size: int,
        peer: Any,
        session: Session,
    ) -> bytes | bool | None:
        """Read the ``size`` bytes of a request and answer it (see :meth:`_answer`). Its bytes are freed when
        this returns; its share of the request budget is given back by the caller before the answer is
        written, so a client that does not read its answers holds no budget."""
        security = self._security
        frame = await _read_frame(
            reader, writer, size, security.limits.request_read_s, peer, security.metrics
        )
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = True
        if session.raw_tokens:  # after SaslHandshake v0: a bare SASL token
            return await session.raw_token(self.ctx, frame) or False
        request = _decode(frame, peer)
        del frame  # the request holds copies of what it needs: the frame is not kept beside them
        if not isinstance(request, Request):
            return request
        return await self._answer(request, peer, session)

    async def _answer(self, request: Request, peer: Any, session: Session) -> bytes | bool | None:
        """The response frame, None when the request expects none (acks=0), False to close the connection."""
        try:
            data = await session.handle(self.ctx, request, self._handlers.get(request.api_key))
        except ApiError as exc:
            _log.warning("request %s from %s failed: %s", request.api_key, peer, exc)
            return False
        if data is None:
            return None
        return encode_response(request, data)


def _decode(frame: bytes, peer: Any) -> Request | bytes | bool:
    """The request in ``frame``; else the answer to send (an api key or version not served) or False to close
    the connection (a malformed frame)."""
    try:
        return read_request(frame)
    except UnsupportedRequest as exc:
        answer = encode_unsupported(exc.api_key, exc.version, exc.correlation_id)
        if answer is None:
            _log.warning("closing the connection from %s: %s", peer, exc)
            return False
        return answer
    except Exception as exc:  # kio raises several types for a malformed frame
        _log.warning("closing the connection from %s: malformed request (%s)", peer, exc)
        return False


async def _read_frame(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    size: int,
    timeout_s: float,
    peer: Any,
    metrics: BrokerMetrics | None,
) -> bytes:
    """The ``size`` bytes of a request, read as they arrive. A client that sends none of them for
    ``timeout_s`` (request_read_timeout_ms, 30 s by default: see :mod:`pylog.broker.limits`) has its
    connection closed, so a client stalled in the middle of a request does not hold its share of the
    request budget, and with it the requests of others, for long. The limit is between two reads, not for
    the whole request: a slow client whose bytes keep coming is read to the end. Raises
    :class:`asyncio.IncompleteReadError` when the connection ends first."""
    stalled = partial(_close_stalled, writer, peer, timeout_s, metrics)
    chunks: list[bytes] = []
    left = size
    while left:
        chunk = await _read_within(reader, left, timeout_s, stalled)
        if not chunk:
            raise asyncio.IncompleteReadError(b"", size)
        chunks.append(chunk)
        left -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _read_within(
    reader: asyncio.StreamReader, n: int, timeout_s: float, on_silence: Callable[[], None]
) -> bytes:
    """``await reader.read(n)``, calling ``on_silence()`` (which closes the connection, ending the read)
    when nothing comes for ``timeout_s``. The silence is the client's, not the broker's: the check is made
    one turn of the event loop after the timer fires, so bytes that had arrived by then (the loop itself
    was held up: the process paused, the machine suspended) wake this read first and count as progress."""
    loop = asyncio.get_running_loop()
    returned = False

    def check() -> None:
        if not returned:
            on_silence()

    timer = loop.call_later(timeout_s, loop.call_soon, check)
    try:
        chunk = await reader.read(n)
        returned = True
        return chunk
    finally:
        timer.cancel()


def _close_stalled(
    writer: asyncio.StreamWriter, peer: Any, timeout_s: float, metrics: BrokerMetrics | None
) -> None:
    """request_read_timeout_ms passed without a byte of a begun request: close (its read then ends)."""
    _log.warning(
        "closing the connection from %s: no byte of its request for %g s (request_read_timeout_ms)",
        peer,
        timeout_s,
    )
    _closed(metrics, "request_read_timeout_ms")
    writer.close()


def _close_idle(writer: asyncio.StreamWriter, peer: Any, metrics: BrokerMetrics | None) -> None:
    """connections.max.idle.ms passed without a request: close (the read waiting for one then ends)."""
    _log.info("closing the connection from %s: idle longer than connections_max_idle_ms", peer)
    _closed(metrics, "connections_max_idle_ms")
    writer.close()


def _closed(metrics: BrokerMetrics | None, limit: str) -> None:
    """Count a connection the broker closed for ``limit`` (``pylog_connections_closed_total``)."""
    if metrics is not None:
        metrics.add("pylog_connections_closed_total", limit=limit)
