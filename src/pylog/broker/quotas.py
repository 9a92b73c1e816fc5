"""Client quotas (Kafka's KIP-13 byte-rate quotas, KIP-55's user and client-id entities, KIP-219's throttling).

**Entities.** A quota is set on a Kafka quota entity: a user (``user``: the principal's name, ``alice`` for
``User:alice``, ``ANONYMOUS`` when the broker authenticates nobody), a client id (``client-id``: the
``client.id`` a client sends), or a (user, client-id) pair; either part may be the default entity
(:data:`DEFAULT`, Kafka's ``<default>``), which applies to every user or client id that has no quota of its
own. Quotas are kept in ``<root>/__security/quotas`` (:mod:`pylog.broker.quota_store`), set with ``pylog
quotas`` or a Kafka admin client (AlterClientQuotas).

**Precedence.** For a client (user U, client id C) and each quota key separately, the first of these entities
that has the key gives the quota, as Kafka's ``DefaultQuotaCallback`` does:

1. ``users/U/clients/C``
2. ``users/U/clients/<default>``
3. ``users/U``
4. ``users/<default>/clients/C``
5. ``users/<default>/clients/<default>``
6. ``users/<default>``
7. ``clients/C``
8. ``clients/<default>``

The entity found also says who shares the quota (Kafka's quota metric tags): levels 1, 2, 4 and 5 count each
(user, client id) pair apart, levels 3 and 6 all the clients of the user together, levels 7 and 8 each client
id (whoever its user). When no entity has the key, the broker's own ``producer_byte_rate`` /
``consumer_byte_rate`` options apply (each authenticated user, or each client id of anonymous clients);
without them, the client is unlimited.

**Keys.** ``producer_byte_rate`` (record bytes of Produce requests) and ``consumer_byte_rate`` (record bytes
of Fetch responses), in bytes per second, measured over the last ``window_ms`` (10 s, Kafka's 11 one-second
samples). A response that takes its entity over the quota is sent at once with ``throttle_time_ms`` = the time
the entity must wait for its rate to come back to the quota, at most the window ((observed - quota) / quota x
window, Kafka's formula), and the broker reads nothing more from that connection for that long (the client's
next request waits), as Kafka's broker mutes the channel. Clients also honour ``throttle_time_ms``
themselves. A throttled Fetch still carries the records it read (Kafka's broker answers it empty and counts
nothing, so there a fetch larger than a small quota's window is never answered). Kafka's ``request_percentage``, ``controller_mutation_rate`` and ``connection_creation_rate``
are refused (:class:`~pylog.errors.ConfigError`): pylog's broker does not enforce them.

Memory: one window per entity that produced or fetched under a quota in the last ``window_ms``, holding a
sample (about 100 bytes) per request that moved bytes in that time; windows idle for a whole window are
dropped (checked every 1024 requests).

Thread-safety: :class:`ByteRate` and :class:`Quotas` are used from the broker's event loop only; time from the
log's clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from pylog.errors import ConfigError

__all__ = [
    "CONSUMER",
    "DEFAULT",
    "ENTITY_TYPES",
    "PRODUCER",
    "QUOTA_KEYS",
    "UNSUPPORTED_KEYS",
    "ByteRate",
    "Match",
    "QuotaEntity",
    "Quotas",
    "Throttle",
    "check_quota",
    "resolve",
]

WINDOW_MS: Final = 10_000
DEFAULT: Final = "<default>"  # the default entity of a type (Kafka's "<default>"; null on the wire)
ENTITY_TYPES: Final = ("user", "client-id")
PRODUCER: Final = "producer_byte_rate"
CONSUMER: Final = "consumer_byte_rate"
QUOTA_KEYS: Final = (PRODUCER, CONSUMER)
UNSUPPORTED_KEYS: Final = ("request_percentage", "controller_mutation_rate", "connection_creation_rate")
_MAX_RATE: Final = (1 << 63) - 1
_SWEEP_EVERY: Final = 1024
_MAX_RESOLVED: Final = 10_000  # clients whose quotas are remembered between two reads of the file


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """A quota entity: ``user`` and ``client_id`` are a name, :data:`DEFAULT` (every one without a quota of
    its own), or None (the entity does not name that type). At least one is not None."""

    user: str | None = None
    client_id: str | None = None

    def __post_init__(self) -> None:
        if self.user is None and self.client_id is None:
            raise ConfigError("a quota entity names a user, a client id, or both")

    def checked(self) -> QuotaEntity:
        """This entity if a quota may be set on it (names are text without control characters, a user name
        is not empty), else :class:`ConfigError`."""
        for value, what in ((self.user, "user"), (self.client_id, "client id")):
            if value is not None and (
                not isinstance(value, str) or any(ord(c) < 32 or ord(c) == 127 for c in value)
            ):
                raise ConfigError(f"a quota {what} must be text without control characters, got {value!r}")
        if self.user == "":
            raise ConfigError("a quota user must not be empty")
        return self

    def sort_key(self) -> tuple[bool, str, bool, str]:
        """Users first (by name), then client ids alone."""
        return (self.user is None, self.user or "", self.client_id is not None, self.client_id or "")

    def parts(self) -> list[tuple[str, str | None]]:
        """Kafka's (entity type, name) pairs; None names the default entity."""
        out: list[tuple[str, str | None]] = []
        if self.user is not None:
            out.append(("user", None if self.user == DEFAULT else self.user))
        if self.client_id is not None:
            out.append(("client-id", None if self.client_id == DEFAULT else self.client_id))
        return out

    def describe(self) -> str:
        """Kafka's wording: ``user=alice, client-id=<default>``."""
        return ", ".join(f"{t}={DEFAULT if n is None else n}" for t, n in self.parts())


def check_quota(key: str, value: float) -> int:
    """``value`` as the int a byte-rate ``key`` holds; :class:`ConfigError` for another key or a value that is
    not a positive whole number of bytes per second."""
    if key in UNSUPPORTED_KEYS:
        raise ConfigError(
            f"quota {key} is not enforced by pylog's broker (supported: {', '.join(QUOTA_KEYS)})"
        )
    if key not in QUOTA_KEYS:
        raise ConfigError(f"unknown quota {key!r} (supported: {', '.join(QUOTA_KEYS)})")
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise ConfigError(f"quota {key} must be a number, got {value!r}")
    if not 1 <= value <= _MAX_RATE or value != int(value):  # the range first: int(inf) raises
        raise ConfigError(f"quota {key} must be a whole number of bytes per second >= 1, got {value!r}")
    return int(value)


@dataclass(frozen=True, slots=True)
class Match:
    """The quota that applies to a client: ``rate`` (bytes per second), the entity it was set on (None: the
    broker's own option) and ``shared_by``, the entity whose clients count their bytes together."""

    rate: int
    entity: QuotaEntity | None
    shared_by: QuotaEntity


def resolve(
    configs: Mapping[QuotaEntity, Mapping[str, int]], key: str, user: str, client_id: str
) -> Match | None:
    """The quota ``key`` of the client (``user``, ``client_id``) by Kafka's precedence (module docstring);
    None when no entity has it."""
    pair = QuotaEntity(user, client_id)
    alone = QuotaEntity(user, None)
    client = QuotaEntity(None, client_id)
    for entity, shared_by in (
        (pair, pair),
        (QuotaEntity(user, DEFAULT), pair),
        (alone, alone),
        (QuotaEntity(DEFAULT, client_id), pair),
        (QuotaEntity(DEFAULT, DEFAULT), pair),
        (QuotaEntity(DEFAULT, None), alone),
        (client, client),
        (QuotaEntity(None, DEFAULT), client),
    ):
        values = configs.get(entity)
        if values is not None and key in values:
            return Match(values[key], entity, shared_by)
    return None


@dataclass
class ByteRate:
    """Bytes per key over a sliding window, and the throttle time a new amount leads to."""

    bytes_per_s: int
    window_ms: int = WINDOW_MS
    _samples: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)
    _totals: dict[str, int] = field(default_factory=dict)
    _records: int = 0

    def __post_init__(self) -> None:
        if type(self.bytes_per_s) is not int or self.bytes_per_s < 1:
            raise ConfigError(f"a byte rate quota must be a positive int, got {self.bytes_per_s!r}")

    def record(self, key: str, nbytes: int, now_ms: float, bytes_per_s: int | None = None) -> int:
        """Count ``nbytes`` for ``key`` at ``now_ms``; the throttle time in ms (0: within the quota) against
        ``bytes_per_s`` (default: this rate's)."""
        rate = self.bytes_per_s if bytes_per_s is None else bytes_per_s
        self._records += 1
        if self._records % _SWEEP_EVERY == 0:
            self._sweep(now_ms)
        samples = self._samples.setdefault(key, deque())
        total = self._totals.get(key, 0) + nbytes
        if nbytes:  # an empty fetch (a long poll) changes nothing: no sample kept
            samples.append((now_ms, nbytes))
        while samples and samples[0][0] <= now_ms - self.window_ms:
            total -= samples.popleft()[1]
        if not samples:
            del self._samples[key]
            self._totals.pop(key, None)
            return 0
        self._totals[key] = total
        allowed = rate * self.window_ms / 1000
        if total <= allowed:
            return 0
        return min(int((total - allowed) / rate * 1000), self.window_ms)

    def __len__(self) -> int:
        """The keys with bytes in their window (or not swept yet)."""
        return len(self._samples)

    def _sweep(self, now_ms: float) -> None:
        """Drop the keys whose newest sample left the window (clients gone quiet)."""
        for key in [k for k, s in self._samples.items() if s[-1][0] <= now_ms - self.window_ms]:
            del self._samples[key]
            self._totals.pop(key, None)


@dataclass(frozen=True, slots=True)
class Throttle:
    """What :meth:`Quotas.throttle` decided: ``ms`` to wait (0: none), the entity whose quota counted the
    request (None: no quota applies) and the ``nbytes`` it counted."""

    ms: int
    shared_by: QuotaEntity | None = None
    nbytes: int = 0


_NO_THROTTLE: Final = Throttle(0)


class Quotas:
    """The quotas in force: those of ``source`` (a callable returning the stored quotas, e.g.
    :meth:`~pylog.broker.quota_store.QuotaStore.quotas`), then the broker's options."""

    def __init__(
        self,
        source: Callable[[], Mapping[QuotaEntity, Mapping[str, int]]] | None = None,
        producer_byte_rate: int | None = None,
        consumer_byte_rate: int | None = None,
        window_ms: int = WINDOW_MS,
    ) -> None:
        self._source = source
        self._fallback = {PRODUCER: producer_byte_rate, CONSUMER: consumer_byte_rate}
        for key, value in self._fallback.items():
            if value is not None and (type(value) is not int or value < 1):
                raise ConfigError(f"{key} must be a positive int, got {value!r}")
        self._rates = {PRODUCER: ByteRate(1, window_ms), CONSUMER: ByteRate(1, window_ms)}
        # what match() resolved from the quotas last read (the same mapping until the file changes)
        self._resolved_from: object = None
        self._resolved: dict[tuple[str, str, str], Match | None] = {}

    @classmethod
    def of(cls, producer_byte_rate: int | None, consumer_byte_rate: int | None) -> Quotas:
        """The broker's options alone (no stored quotas)."""
        return cls(None, producer_byte_rate, consumer_byte_rate)

    def match(self, key: str, user: str, client_id: str) -> Match | None:
        """The quota ``key`` of (``user``, ``client_id``): stored, else the broker's option, else None."""
        if self._source is not None:
            configs = self._source()
            if configs is not self._resolved_from:  # a new file read: forget what was resolved
                self._resolved_from = configs
                self._resolved.clear()
            elif len(self._resolved) > _MAX_RESOLVED:
                self._resolved.clear()
            wanted = (key, user, client_id)
            if wanted in self._resolved:
                found = self._resolved[wanted]
            else:
                found = self._resolved[wanted] = resolve(configs, key, user, client_id) if configs else None
            if found is not None:
                return found
        rate = self._fallback[key]
        if rate is None:
            return None
        shared_by = QuotaEntity(None, client_id) if user == "ANONYMOUS" else QuotaEntity(user, None)
        return Match(rate, None, shared_by)

    def throttle(
        self, api_key: int, user: str, client_id: str, nbytes: Callable[[], int], now_ms: float
    ) -> Throttle:
        """The throttle of a Produce (0) or Fetch (1) by (``user``, ``client_id``) moving ``nbytes()`` record
        bytes."""
        key = PRODUCER if api_key == 0 else CONSUMER if api_key == 1 else None
        if key is None:
            return _NO_THROTTLE
        found = self.match(key, user, client_id)
        if found is None:
            return _NO_THROTTLE
        counted = nbytes()
        ms = self._rates[key].record(_window_key(found.shared_by), counted, now_ms, found.rate)
        return Throttle(ms, found.shared_by, counted)

    def windows(self) -> int:
        """How many entities have bytes counted (memory)."""
        return sum(len(r) for r in self._rates.values())


def _window_key(entity: QuotaEntity) -> str:
    return repr((entity.user, entity.client_id))
