"""Broker: a single-node Kafka broker over a pylog log directory (``pylog serve``, :func:`pylog.serve`).

The directory stays a normal pylog log while the broker runs: embedded producers and consumers of other
processes use it as before. One broker per log directory: the broker holds an open-file-description lock
(``F_OFD_SETLK``) on one byte far past the end of the directory's ``.lock`` file (byte :data:`LOCK_BYTE`,
which holds no data and never will: the file stays 32 bytes), so a second broker, in this process or another,
is refused with :class:`~pylog.errors.LockError`; the kernel releases the lock when the broker's process
dies, however it dies.

Security (:mod:`pylog.broker.security`, ``docs/security.md``): TLS (``tls_cert``, ``tls_key``, and
``tls_client_ca`` to require client certificates), SASL (``sasl``: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, users
from ``pylog users``), ACLs. A broker that authenticates nobody (neither ``sasl`` nor ``tls_client_ca``)
listens on loopback addresses only unless told ``allow_anonymous=True`` (``--allow-anonymous``), so that
starting it never exposes a log to the network by accident.

Thread-safety: :meth:`Broker.close` may be called from any thread, more than once.
"""

from __future__ import annotations

import dataclasses
import fcntl
import ipaddress
import logging
import os
import re
import socket
import struct
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Final, Self

from pylog.broker.acl_api import acl_handlers
from pylog.broker.acls import AclStore, Authorizer
from pylog.broker.authorize import make_guard
from pylog.broker.context import Context, Options
from pylog.broker.credentials import CredentialStore
from pylog.broker.limits import UNLIMITED, ConnectionLimits
from pylog.broker.metrics import BrokerMetrics, MetricsServer, group_series
from pylog.broker.quota_api import quota_handlers
from pylog.broker.quota_store import QuotaStore
from pylog.broker.quotas import Quotas
from pylog.broker.scram_api import scram_handlers
from pylog.broker.security import Security, parse_mechanisms, tls_context
from pylog.broker.server import Server
from pylog.broker.waiting import FetchWaiters
from pylog.errors import ConfigError, LockError
from pylog.log import Log, open_log

__all__ = ["LOCK_BYTE", "Broker", "check_listen", "parse_address", "serve"]

_log = logging.getLogger("pylog.broker")
LOCK_BYTE: Final = 1 << 40
DEFAULT_LISTEN: Final = "127.0.0.1:9092"
_LOCK: Final = struct.Struct("hhqqi")  # struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid
_WORKERS: Final = 8


def parse_address(address: str, what: str = "listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) as (host, port). Raises :class:`~pylog.errors.ConfigError`."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} address {address!r} is not HOST:PORT (port 0-65535)")
    return host.strip("[]"), int(port)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen(listen: str, allow_anonymous: bool, authenticates: bool = False) -> tuple[str, int]:
    """The (host, port) of ``listen``, refused unless loopback, ``authenticates`` (SASL or client
    certificates are required) or ``allow_anonymous``."""
    host, port = parse_address(listen)
    if not _loopback(host) and not allow_anonymous and not authenticates:
        raise ConfigError(
            f"refusing to listen on {host}: without authentication (--sasl MECHANISMS, or --tls-client-ca) "
            "pylog's broker listens on loopback addresses only (127.0.0.1, ::1, localhost); pass "
            "allow_anonymous=True (--allow-anonymous) to serve the log to anyone who can reach that address"
        )
    return host, port


class Broker:
    """A running broker. Use :func:`serve` (or ``pylog --dir DIR serve``). A context manager.

    ``bootstrap_servers`` is what Kafka clients are given (``"127.0.0.1:PORT"``)."""

    def __init__(
        self,
        log: Log,
        *,
        listen: str = "127.0.0.1:0",
        advertise: str | None = None,
        auto_create_topics: bool = True,
        num_partitions: int = 1,
        allow_anonymous: bool = False,
        max_request_bytes: int = 100 << 20,
        sasl: str | list[str] | tuple[str, ...] | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_client_ca: str | None = None,
        super_users: str | list[str] | tuple[str, ...] | None = None,
        max_connections: int = UNLIMITED,
        max_connections_per_ip: int = UNLIMITED,
        connections_max_idle_ms: int = 600_000,
        producer_byte_rate: int | None = None,
        consumer_byte_rate: int | None = None,
        metrics: str | None = None,
        queued_max_request_bytes: int = 512 << 20,
        request_read_timeout_ms: int | None = None,
        owns_log: bool = False,
    ) -> None:
        limits = ConnectionLimits(
            max_connections,
            max_connections_per_ip,
            connections_max_idle_ms,
            queued_max_request_bytes,
            request_read_timeout_ms,
        )
        security = _security(log.path, sasl, tls_cert, tls_key, tls_client_ca, super_users, limits)
        self._limits = limits
        quota_store = QuotaStore(log.path)
        quota_store.quotas()  # checks the quota file now, not at the first request
        security = dataclasses.replace(
            security,
            quotas=Quotas(quota_store.current, producer_byte_rate, consumer_byte_rate),
            handlers={**security.handlers, **quota_handlers(quota_store)},
        )
        metrics_at = None if metrics is None else parse_address(metrics, "metrics")
        if metrics_at is not None:
            security = dataclasses.replace(security, metrics=BrokerMetrics())
        self._metrics_server: MetricsServer | None = None
        host, port = check_listen(listen, allow_anonymous, security.authenticates)
        if type(num_partitions) is not int or num_partitions < 1:
            raise ConfigError(f"num_partitions must be a positive int, got {num_partitions!r}")
        if type(max_request_bytes) is not int or max_request_bytes < 1024:
            raise ConfigError(f"max_request_bytes must be an int >= 1024, got {max_request_bytes!r}")
        log.check_writable("serve the log to Kafka clients")
        self.log = log
        self._owns_log = owns_log
        self._closed = False
        self._lock_fd = _lock_directory(log.path)
        try:
            self._sock = socket.create_server(
                (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET, reuse_port=False
            )
        except OSError as exc:
            os.close(self._lock_fd)
            raise ConfigError(f"cannot listen on {listen}: {exc.strerror or exc}") from exc
        bound_host, bound_port = self._sock.getsockname()[:2]
        self.host = bound_host
        self.port = int(bound_port)
        if advertise is not None:
            adv_host, adv_port = parse_address(advertise, "advertise")
        else:
            adv_host, adv_port = advertised_host(host), self.port
        self.advertised = _address(adv_host, adv_port or self.port)
        options = Options(
            host=adv_host,
            port=adv_port or self.port,
            auto_create_topics=auto_create_topics,
            num_partitions=num_partitions,
            max_request_bytes=max_request_bytes,
        )
        self._executor = ThreadPoolExecutor(_WORKERS, thread_name_prefix="pylog-broker-io")
        self._ctx = Context(log, options, self._executor, FetchWaiters())
        self._server = Server(self._ctx, self._sock, security)
        if security.metrics is not None:
            security.metrics.add_collector(lambda: group_series(log, self._kafka_group_states))
        try:
            self._server.start()
            if metrics_at is not None and security.metrics is not None:
                try:
                    self._metrics_server = MetricsServer(security.metrics, *metrics_at)
                except OSError as exc:
                    self._server.close()
                    raise ConfigError(f"cannot serve metrics on {metrics}: {exc.strerror or exc}") from exc
        except BaseException:
            self._shutdown()
            raise

    @property
    def bootstrap_servers(self) -> str:
        """``HOST:PORT`` for a Kafka client's ``bootstrap.servers``: the listening address, or the advertised
        one when the broker listens on every interface (``0.0.0.0``, ``::``), an address no client can
        connect to from another machine."""
        if _wildcard(self.host):
            return self.advertised
        return _address(self.host, self.port)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop accepting connections, answer the requests being handled, close the connections, write
        everything acknowledged (and close the log when :func:`serve` opened it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._server.close()
        self._shutdown()

    @property
    def limits(self) -> ConnectionLimits:
        """The connection limits and the request byte budget in force (``limits.budget.peak``: the most
        request bytes ever held at once)."""
        return self._limits

    @property
    def metrics_address(self) -> str | None:
        """``HOST:PORT`` of the Prometheus endpoint (``GET /metrics``), None without ``metrics``."""
        if self._metrics_server is None:
            return None
        return f"{self._metrics_server.host}:{self._metrics_server.port}"

    def _kafka_group_states(self) -> dict[str, str]:
        """The state of each group with Kafka members (read from the metrics thread: a copy of the dict)."""
        coordinator = self._server.coordinator
        if coordinator is None:
            return {}
        return {gid: g.state for gid, g in list(coordinator.groups.items()) if g.members}

    def _shutdown(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.close()
        try:
            self._executor.shutdown(wait=True)
            self._ctx.close()
            self._ctx.waiters.close()
        finally:
            self._sock.close()
            os.close(self._lock_fd)
            if self._owns_log:
                self.log.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Broker({self.log.path!r}, bootstrap_servers={self.bootstrap_servers!r})"


def advertised_host(host: str) -> str:
    """The host put in metadata when none is advertised: the listening host, or for a broker listening on
    every interface the machine's host name (as Kafka advertises a listener without a host), when it
    resolves; else 127.0.0.1, which only clients on this machine can reach (logged: pass ``advertise``)."""
    if not _wildcard(host):
        return host
    name = socket.gethostname()
    try:
        socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        _log.warning(
            "listening on every interface, and this machine's host name %r does not resolve: clients are "
            "given 127.0.0.1, which only clients on this machine reach; pass advertise (--advertise "
            "HOST:PORT) with an address other machines reach",
            name,
        )
        return "127.0.0.1"
    return name


def _wildcard(host: str) -> bool:
    return host in ("", "0.0.0.0", "::", "0:0:0:0:0:0:0:0")


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _security(
    root: str,
    sasl: str | list[str] | tuple[str, ...] | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_client_ca: str | None,
    super_users: str | list[str] | tuple[str, ...] | None,
    limits: ConnectionLimits,
) -> Security:
    mechanisms = parse_mechanisms(sasl)
    if (tls_cert is None) != (tls_key is None) or (tls_client_ca is not None and tls_cert is None):
        raise ConfigError(
            "TLS needs both tls_cert and tls_key (--tls-cert, --tls-key); tls_client_ca needs them"
        )
    credentials = CredentialStore(root)
    if mechanisms and not credentials.users():  # also checks the users file now, not at the first client
        _log.warning("SASL is enabled but %s has no users: add them with 'pylog users add'", root)
    # Kafka separates super.users with ';'; a ',' separates principals too when the next one starts with
    # "User:" (a certificate's subject has commas of its own: "User:CN=a,O=b;User:bob")
    names = (
        re.split(r";|,(?=User:)", super_users) if isinstance(super_users, str) else list(super_users or ())
    )
    supers = frozenset(n.strip() for n in names if n.strip())
    for name in supers:
        if not name.startswith("User:") or name == "User:":
            raise ConfigError(f"a super user is a principal User:NAME, got {name!r}")
    authenticates = bool(mechanisms) or tls_client_ca is not None
    acls = AclStore(root)
    acls.acls()  # checks the ACL file now, not at the first request
    return Security(
        guard=make_guard(Authorizer(acls, supers)) if authenticates else None,
        handlers={**acl_handlers(acls, authenticates), **scram_handlers(credentials)},
        limits=limits,
        mechanisms=mechanisms,
        credentials=credentials,
        ssl_context=None
        if tls_cert is None or tls_key is None
        else tls_context(tls_cert, tls_key, tls_client_ca),
        client_auth=tls_client_ca is not None,
        super_users=supers,
    )


def _lock_directory(path: str) -> int:
    """An OFD lock on :data:`LOCK_BYTE` of ``path/.lock``: the one broker of this directory."""
    fd = os.open(os.path.join(path, ".lock"), os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _LOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, LOCK_BYTE, 1, 0))
    except OSError as exc:
        os.close(fd)
        raise LockError(
            f"another broker serves {path} (pylog serve allows one broker per log directory): stop it, or use "
            "its address"
        ) from exc
    return fd


def serve(path_or_log: str | os.PathLike[str] | Log, listen: str = "127.0.0.1:0", **options: Any) -> Broker:
    """Start a Kafka broker over a log directory (a path, opened and closed by the broker, or an open
    :class:`~pylog.Log`, left open) listening on ``listen`` (``HOST:PORT``; port 0 picks a free one).
    Returns a running :class:`Broker` (its ``bootstrap_servers`` is the address to give Kafka clients).

    ``options``: ``advertise`` (``HOST:PORT`` put in metadata), ``auto_create_topics`` (True),
    ``num_partitions`` (1, for auto-created topics), ``allow_anonymous`` (False: only loopback addresses
    unless clients authenticate), ``max_request_bytes`` (100 MiB), ``sasl`` (``"SCRAM-SHA-256,PLAIN"``),
    ``tls_cert``, ``tls_key``, ``tls_client_ca`` (PEM files), ``super_users`` (``"User:admin,User:ops"``),
    ``max_connections``, ``max_connections_per_ip`` (unlimited), ``connections_max_idle_ms`` (600000),
    ``producer_byte_rate``, ``consumer_byte_rate`` (bytes per second per principal, where no quota set with
    ``pylog quotas`` or AlterClientQuotas applies; unlimited),
    ``metrics`` (``HOST:PORT`` of a Prometheus endpoint, ``GET /metrics``; port 0 picks one),
    ``queued_max_request_bytes`` (512 MiB: requests read and not answered yet, all connections together),
    ``request_read_timeout_ms`` (30000, or ``connections_max_idle_ms`` if shorter: a connection silent that
    long in the middle of a request is closed and its share of ``queued_max_request_bytes`` given back)."""
    if isinstance(path_or_log, Log):
        return Broker(path_or_log, listen=listen, **options)
    authenticates = bool(options.get("sasl")) or options.get("tls_client_ca") is not None
    check_listen(listen, bool(options.get("allow_anonymous")), authenticates)  # before a directory is created
    log = open_log(path_or_log)
    try:
        return Broker(log, listen=listen, owns_log=True, **options)
    except BaseException:
        log.close()
        raise
