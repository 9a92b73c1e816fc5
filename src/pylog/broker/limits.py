"""Connection limits of the broker (Kafka's ``max.connections``, ``max.connections.per.ip`` and
``connections.max.idle.ms``).

- At most ``max_connections`` connections at once, and ``max_connections_per_ip`` from one client address: a
  connection over either is closed as soon as it is accepted, before anything is read from it, with a log
  line (Kafka closes a connection over the per-address limit the same way; over the total it stops accepting
  for a while, which a closed connection tells a client as clearly).
- A connection that sends no request for ``connections_max_idle_ms`` (10 minutes by default) between two
  requests is closed. The time spent handling a request (a long-polling fetch) does not count.

Thread-safety: used from the broker's event loop only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Final

from pylog.errors import ConfigError

__all__ = ["UNLIMITED", "ConnectionLimits"]

_log = logging.getLogger("pylog.broker")
UNLIMITED: Final = 2**31 - 1  # Kafka's default for both limits


@dataclass
class ConnectionLimits:
    max_connections: int = UNLIMITED
    max_connections_per_ip: int = UNLIMITED
    connections_max_idle_ms: int = 600_000
    _open: dict[str, int] = field(default_factory=dict)
    _total: int = 0

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_connections_per_ip", "connections_max_idle_ms"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")

    @property
    def idle_s(self) -> float:
        return self.connections_max_idle_ms / 1000

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
