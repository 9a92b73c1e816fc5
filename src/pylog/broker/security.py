"""Who a connection is, and what it may ask before it says so: TLS, SASL and the principal of each connection.

:class:`Security` is the broker's configuration (the SASL mechanisms enabled, the TLS context, whether
clients must present a certificate, the users); :class:`Session` is one connection's state. The server hands
every request to :meth:`Session.handle`, which

- serves SaslHandshake (v0, v1) and SaslAuthenticate (v0-v2) itself: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
  (:mod:`pylog.broker.sasl`); after a SaslHandshake v0 the client's next messages are bare SASL tokens (size
  and bytes, no Kafka header), as Kafka's clients of that version send them;
- before the connection is authenticated (SASL enabled and not done yet) serves ApiVersions and nothing else:
  any other request closes the connection unanswered, so nothing an unauthenticated client sends reaches the
  log;
- answers a failed authentication with SASL_AUTHENTICATION_FAILED (error code 58) and a message that does not
  say whether the user or the password was wrong, then closes the connection (:attr:`Session.close_after`);
- hands every other request to its handler, through the authorizer when one is configured.

Principals are Kafka's: ``User:NAME`` after SASL; with TLS client certificates and no SASL, ``User:`` and the
certificate's subject as an RFC 2253 distinguished name (``User:CN=alice,O=Example``: Kafka's default
``ssl.principal.mapping.rules``); ``User:ANONYMOUS`` when the broker authenticates nobody.

Logs (logger ``pylog.broker``): one line (INFO) per connection opened and closed, with its principal, one per
authentication (the principal, the mechanism, the client's address) and one (WARNING) per refusal; never a
password, a SASL message or a record.

Thread-safety: a :class:`Session` is used by its connection's task only; :class:`Security` is immutable.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from pylog.broker.credentials import MECHANISMS, CredentialStore
from pylog.broker.limits import ConnectionLimits
from pylog.broker.metrics import API_NAMES, BrokerMetrics
from pylog.broker.protocol import ApiError, ErrorCode, Request
from pylog.broker.quotas import Quotas
from pylog.broker.sasl import AuthenticationFailed, Mechanism, PlainServer, ScramServer
from pylog.broker.validate import MalformedRequest, check_request
from pylog.errors import ConfigError

if TYPE_CHECKING:
    from pylog.broker.context import Context

__all__ = ["ANONYMOUS", "Security", "Session", "parse_mechanisms", "subject_name", "tls_context"]

_log = logging.getLogger("pylog.broker")
ANONYMOUS: Final = "User:ANONYMOUS"
_SASL_KEYS: Final = frozenset({17, 36})
_OPEN_KEYS: Final = frozenset({18, 17, 36})  # served before authentication: ApiVersions and SASL itself

Handler = Callable[["Context", Request], Awaitable[dict[str, Any] | None]]
Guard = Callable[["Session", "Context", Request, Handler], Awaitable[dict[str, Any] | None]]


def parse_mechanisms(value: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """``"SCRAM-SHA-256,PLAIN"`` (or a list) as a tuple of known mechanism names; ConfigError otherwise."""
    if value is None:
        return ()
    names = value.split(",") if isinstance(value, str) else list(value)
    out = tuple(dict.fromkeys(n.strip().upper() for n in names if n.strip()))
    unknown = [n for n in out if n not in MECHANISMS]
    if unknown or (names and not out):
        raise ConfigError(
            f"unknown SASL mechanism {', '.join(unknown) or value!r} (known: {', '.join(MECHANISMS)})"
        )
    return out


def tls_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """A server TLS context (TLS 1.2 or later) with ``cert`` and ``key`` (PEM files); with ``client_ca``
    every client must present a certificate signed by it (Kafka's ``ssl.client.auth=required``)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
        if client_ca is not None:
            context.load_verify_locations(client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS certificate, key or client CA: {exc}") from exc
    return context


@dataclass(frozen=True)
class Security:
    """The broker's security settings. The default authenticates nobody (every client is ``User:ANONYMOUS``
    and may do everything): the broker then listens on loopback only unless told ``allow_anonymous``."""

    mechanisms: tuple[str, ...] = ()
    credentials: CredentialStore | None = None
    ssl_context: ssl.SSLContext | None = None
    client_auth: bool = False  # clients present certificates signed by the client CA
    guard: Guard | None = None  # the authorizer's entry point (None: every request allowed)
    super_users: frozenset[str] = field(default_factory=frozenset)
    handlers: Mapping[int, Handler] = field(default_factory=dict)  # APIs served beside the server's
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    quotas: Quotas | None = None  # client quotas of produce and fetch (None: unlimited)
    metrics: BrokerMetrics | None = None

    @property
    def authenticates(self) -> bool:
        return bool(self.mechanisms) or self.client_auth

    def session(self, peer: Any, peercert: dict[str, Any] | None) -> Session:
        return Session(self, peer, peercert)


class Session:
    """One connection's identity and SASL state (see the module docstring)."""

    def __init__(self, security: Security, peer: Any, peercert: dict[str, Any] | None) -> None:
        self.security = security
        self.host = str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)
        self.peer = peer
        self.principal = ANONYMOUS
        self.authenticated = not security.mechanisms
        self.close_after = False  # the answer being written is the connection's last
        self.raw_tokens = False  # after SaslHandshake v0: bare SASL tokens follow
        self.muted_ms = 0  # over a byte-rate quota: the server reads the next request after this long
        self._mechanism: Mechanism | None = None
        if security.client_auth and peercert:
            self.principal = "User:" + subject_name(peercert)

    def opened(self) -> None:
        _log.info("connection from %s opened (%s)", self.peer, self.principal)
        if self.security.metrics is not None:
            self.security.metrics.connection(1)

    def closed(self) -> None:
        _log.info("connection from %s closed (%s)", self.peer, self.principal)
        if self.security.metrics is not None:
            self.security.metrics.connection(-1)

    async def handle(self, ctx: Context, request: Request, handler: Handler | None) -> dict[str, Any] | None:
        key = request.api_key
        try:
            check_request(request.body)
        except MalformedRequest as exc:
            _log.warning("closing the connection from %s: malformed request (%s)", self.peer, exc)
            raise ApiError(ErrorCode.invalid_request, str(exc)) from exc
        if key in _SASL_KEYS:
            if key == 17:
                return self._handshake(request)
            return await self._authenticate(ctx, request)
        if not self.authenticated and key not in _OPEN_KEYS:
            _log.warning(
                "closing the connection from %s: api key %d before SASL authentication", self.peer, key
            )
            raise ApiError(ErrorCode.illegal_sasl_state, "request before authentication")
        handler = handler or self.security.handlers.get(key)
        if handler is None:
            raise ApiError(ErrorCode.unsupported_version, f"api key {key} is not served")
        guard = self.security.guard
        started = ctx.log.clock.monotonic_ms()
        if guard is None or key == 18:
            answer = await handler(ctx, request)
        else:
            answer = await guard(self, ctx, request, handler)
        if key in (0, 1) and self.security.quotas is not None:
            self._throttle(ctx, request, answer, self.security.quotas)
        if self.security.metrics is not None:
            seconds = (ctx.log.clock.monotonic_ms() - started) / 1000
            _measure(self.security.metrics, request, answer, seconds)
        return answer

    def _throttle(
        self, ctx: Context, request: Request, answer: dict[str, Any] | None, quotas: Quotas
    ) -> None:
        """Count the request's record bytes against its quota (:mod:`pylog.broker.quotas`); over it, answer with
        ``throttle_time_ms`` and read nothing more from the connection for that long (:attr:`muted_ms`)."""
        user = self.principal.partition(":")[2]
        now = ctx.log.clock.monotonic_ms()
        decided = quotas.throttle(
            request.api_key, user, request.client_id or "", lambda: _record_bytes(request, answer), now
        )
        ms = decided.ms
        metrics, entity = self.security.metrics, decided.shared_by
        if metrics is not None and entity is not None:
            metrics.quota_bytes(
                "produce" if request.api_key == 0 else "fetch",
                entity.user or "",
                entity.client_id or "",
                decided.nbytes,
                ms,
            )
        if ms:
            self.muted_ms = ms
            if answer is not None:
                answer["throttle_time"] = ms

    # -- SASL ------------------------------------------------------------------------------------------

    def _handshake(self, request: Request) -> dict[str, Any]:
        enabled = list(self.security.mechanisms)
        name = str(request.body.mechanism)
        if self.authenticated or self._mechanism is not None:
            return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": enabled}
        if name not in enabled:
            _log.warning("SASL mechanism %r from %s refused (enabled: %s)", name, self.peer, enabled)
            return {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": enabled}
        credentials = self.security.credentials
        if credentials is None:  # pragma: no cover - Broker always gives a store with mechanisms
            raise ApiError(ErrorCode.illegal_sasl_state, "no users")
        lookup = credentials.lookup
        self._mechanism = PlainServer(lookup) if name == "PLAIN" else ScramServer(name, lookup)
        self.raw_tokens = request.version == 0
        return {"error_code": ErrorCode.none, "mechanisms": enabled}

    async def _authenticate(self, ctx: Context, request: Request) -> dict[str, Any]:
        if self._mechanism is None or self.authenticated:
            self.close_after = True
            return _auth_answer(ErrorCode.illegal_sasl_state, "SaslAuthenticate without a SaslHandshake")
        try:
            answer = await self.step(ctx, bytes(request.body.auth_bytes))
        except AuthenticationFailed as exc:
            self.close_after = True
            return _auth_answer(ErrorCode.sasl_authentication_failed, str(exc))
        return {
            "error_code": ErrorCode.none,
            "error_message": None,
            "auth_bytes": answer,
            "session_lifetime": 0,
        }

    async def step(self, ctx: Context, message: bytes) -> bytes:
        """The mechanism's next step (PLAIN's hashing runs in the thread pool); raises AuthenticationFailed."""
        mechanism = self._mechanism
        if mechanism is None:
            raise AuthenticationFailed("no SASL handshake")
        try:
            if mechanism.name == "PLAIN":
                answer = await ctx.run(mechanism.step, message)
            else:
                answer = mechanism.step(message)
        except AuthenticationFailed as exc:
            _log.warning(
                "SASL %s authentication of %r from %s failed: %s",
                mechanism.name,
                mechanism.user,
                self.peer,
                exc,
            )
            if self.security.metrics is not None:
                self.security.metrics.add("kafka_server_socket_server_metrics_failed_authentication_total")
            raise
        except ConfigError as exc:  # the users file does not check: nobody is authenticated
            _log.error("SASL authentication from %s refused: %s", self.peer, exc)
            raise AuthenticationFailed("Authentication failed: the broker cannot read its users") from exc
        if mechanism.done:
            self.authenticated = True
            self.raw_tokens = False
            self.principal = f"User:{mechanism.user}"
            _log.info(
                "connection from %s authenticated as %s (%s)", self.peer, self.principal, mechanism.name
            )
            if self.security.metrics is not None:
                self.security.metrics.add(
                    "kafka_server_socket_server_metrics_successful_authentication_total"
                )
        return answer

    async def raw_token(self, ctx: Context, frame: bytes) -> bytes | None:
        """The answer frame to a bare SASL token (after SaslHandshake v0); None: close the connection."""
        try:
            answer = await self.step(ctx, frame)
        except AuthenticationFailed:
            return None
        return len(answer).to_bytes(4, "big") + answer


def _measure(metrics: BrokerMetrics, request: Request, answer: dict[str, Any] | None, seconds: float) -> None:
    """Requests, their time, record bytes per topic and partition errors of Produce and Fetch."""
    name = API_NAMES.get(request.api_key, str(request.api_key))
    metrics.request(name, seconds)
    errors = "kafka_network_requestmetrics_errors_total"
    if request.api_key == 0:
        for t in request.body.topic_data:
            size = sum(len(p.records or b"") for p in t.partition_data)
            metrics.add("kafka_server_brokertopicmetrics_bytesin_total", size, topic=str(t.name))
        for t in (answer or {}).get("responses", ()):
            for p in t["partition_responses"]:
                if p["error_code"]:
                    metrics.add(errors, request=name, error=ErrorCode(p["error_code"]).name.upper())
    elif request.api_key == 1 and answer is not None:
        for t in answer.get("responses", ()):
            size = sum(len(p.get("records") or b"") for p in t["partitions"])
            metrics.add("kafka_server_brokertopicmetrics_bytesout_total", size, topic=str(t["topic"]))
            for p in t["partitions"]:
                if p["error_code"]:
                    metrics.add(errors, request=name, error=ErrorCode(p["error_code"]).name.upper())


def _record_bytes(request: Request, answer: dict[str, Any] | None) -> int:
    """The record bytes of a Produce request, or of a Fetch response."""
    if request.api_key == 0:
        return sum(len(p.records or b"") for t in request.body.topic_data for p in t.partition_data)
    if answer is None:
        return 0
    return sum(
        len(p.get("records") or b"") for t in answer.get("responses", ()) for p in t.get("partitions", ())
    )


def _auth_answer(code: ErrorCode, message: str) -> dict[str, Any]:
    return {"error_code": code, "error_message": message, "auth_bytes": b"", "session_lifetime": 0}


def subject_name(peercert: dict[str, Any]) -> str:
    """The certificate's subject as an RFC 2253 name (most specific first: ``CN=alice,O=Example,C=FR``)."""
    short = {
        "commonName": "CN",
        "organizationName": "O",
        "organizationalUnitName": "OU",
        "countryName": "C",
        "stateOrProvinceName": "ST",
        "localityName": "L",
        "streetAddress": "STREET",
        "domainComponent": "DC",
        "userId": "UID",
    }
    parts = []
    for rdn in reversed(peercert.get("subject", ())):
        parts.append("+".join(f"{short.get(k, k)}={_escape(v)}" for k, v in rdn))
    return ",".join(parts)


def _escape(value: str) -> str:
    out = "".join("\\" + c if c in ',+"\\<>;=' else c for c in value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out
