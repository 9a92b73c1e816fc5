"""Connection limits of the broker (Kafka's ``max.connections``, ``max.connections.per.ip``,
``connections.max.idle.ms`` and ``queued.max.request.bytes``, and pylog's ``request_read_timeout_ms``).

- At most ``max_connections`` connections at once, and ``max_connections_per_ip`` from one client address: a
  connection over either is closed as soon as it is accepted, before anything is read from it, with a log
  line (Kafka closes a connection over the per-address limit the same way; over the total it stops accepting
  for a while, which a closed connection tells a client as clearly).
- A connection that sends no request for ``connections_max_idle_ms`` (10 minutes by default) between two
  requests is closed. The time spent handling a request (a long-polling fetch) does not count.
- A connection that has begun a request (sent a byte of its size prefix) and then sends no byte of it for
  ``request_read_timeout_ms`` (30 s by default, never longer than ``connections_max_idle_ms``) is closed,
  and the share of the request budget its request holds is given back: a client that stalls in the middle
  of a request does not hold the budget, and with it the requests of every other client, for the 10 minutes
  of the idle limit (Kafka has no such limit; its idle check counts from the last byte read, whether or not
  a request is complete). The limit is between two bytes, not for the whole request: a slow link whose
  bytes keep coming is never cut. Both limits count the client's silence, not the broker's: bytes that
  arrived while the broker's event loop was held up (its process paused) are read, not cut. Why 30 s: a Kafka client gives up on a request after its
  ``request.timeout.ms`` (30 s for the Java client, kafka-python and librdkafka's producer; 40 s for
  aiokafka) and retries it on a new connection, so a client silent that long in the middle of its own
  request has abandoned it (or its network has); the time a request waits for budget before it is read
  does not count.
- At most ``queued_max_request_bytes`` (512 MiB by default; Kafka's ``queued.max.request.bytes``) of requests
  are read and not yet answered at once, all connections together (:class:`RequestBudget`): a connection
  whose next request does not fit waits, its bytes left in the socket (asyncio stops reading a connection
  whose buffer holds 128 KiB), so many clients sending large requests at once make the broker read them in
  turn (first come, first served) instead of holding them all in memory. A request larger than the whole
  budget is read when nothing else is. A request's bytes are counted from its size prefix until its answer
  is ready (the answer is then written without holding budget, so a client that does not read its answers
  holds none) and are freed then: a connection waiting for its next request holds nothing of the last.

Thread-safety: used from the broker's event loop only.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Final

from pylog.errors import ConfigError

__all__ = ["REQUEST_READ_TIMEOUT_MS", "UNLIMITED", "ConnectionLimits", "RequestBudget"]

_log = logging.getLogger("pylog.broker")
UNLIMITED: Final = 2**31 - 1  # Kafka's default for both limits
REQUEST_READ_TIMEOUT_MS: Final = 30_000  # the default: Kafka clients' request.timeout.ms (module docstring)


class RequestBudget:
    """Bytes of requests in the broker at once (see the module docstring); waiters served in order."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.in_use = 0
        self.peak = 0  # the most ever in use (tests and post-mortems)
        self._waiters: deque[tuple[asyncio.Future[None], int]] = deque()

    def _fits(self, n: int) -> bool:
        return self.in_use == 0 or self.in_use + n <= self.max_bytes

    def _take(self, n: int) -> None:
        self.in_use += n
        self.peak = max(self.peak, self.in_use)

    async def acquire(self, n: int) -> None:
        if not self._waiters and self._fits(n):
            self._take(n)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((future, n))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # granted, then cancelled: give it back
                self.release(n)
            else:
                self._wake()
            raise

    def release(self, n: int) -> None:
        self.in_use -= n
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            future, n = self._waiters[0]
            if future.done():
                self._waiters.popleft()
            elif self._fits(n):
                self._waiters.popleft()
                self._take(n)
                future.set_result(None)
            else:
                return


@dataclass
class ConnectionLimits:
    max_connections: int = UNLIMITED
    max_connections_per_ip: int = UNLIMITED
    connections_max_idle_ms: int = 600_000
    queued_max_request_bytes: int = 512 << 20
    request_read_timeout_ms: int | None = None  # None: REQUEST_READ_TIMEOUT_MS, or the idle limit if shorter
    _open: dict[str, int] = field(default_factory=dict)
    _total: int = 0
    budget: RequestBudget = field(init=False)

    def __post_init__(self) -> None:
        for name in (
            "max_connections",
            "max_connections_per_ip",
            "connections_max_idle_ms",
            "queued_max_request_bytes",
        ):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        timeout = self.request_read_timeout_ms
        if timeout is None:
            self.request_read_timeout_ms = min(REQUEST_READ_TIMEOUT_MS, self.connections_max_idle_ms)
        elif type(timeout) is not int or timeout < 1:
            raise ConfigError(f"request_read_timeout_ms must be a positive int, got {timeout!r}")
        elif timeout > self.connections_max_idle_ms:
            raise ConfigError(
                f"request_read_timeout_ms ({timeout}) must not be longer than connections_max_idle_ms "
                f"({self.connections_max_idle_ms}): a client silent in the middle of a request would "
                "otherwise be given longer than one silent between requests"
            )
        self.budget = RequestBudget(self.queued_max_request_bytes)

    @property
    def idle_s(self) -> float:
        """``connections_max_idle_ms`` in seconds: the longest silence between two requests."""
        return self.connections_max_idle_ms / 1000

    @property
    def request_read_s(self) -> float:
        """``request_read_timeout_ms`` in seconds: the longest silence in the middle of a request."""
        return (self.request_read_timeout_ms or REQUEST_READ_TIMEOUT_MS) / 1000

    def admit(self, host: str) -> bool:
        """Count a new connection from ``host``; False (and a log line) when it is over a limit."""
        if self._total >= self.max_connections:
            _log.warning(
                "refusing a connection from %s: %d connections open (max_connections)", host, self._total
            )
            return False
        if self._open.get(host, 0) >= self.max_connections_per_ip:
            _log.warning(
                "refusing a connection from %s: %d connections open from it (max_connections_per_ip)",
                host,
                self._open[host],
            )
            return False
        self._open[host] = self._open.get(host, 0) + 1
        self._total += 1
        return True

    def release(self, host: str) -> None:
        """The connection of ``host`` :meth:`admit` counted is closed."""
        left = self._open.get(host, 0) - 1
        if left > 0:
            self._open[host] = left
        else:
            self._open.pop(host, None)
        self._total -= 1
