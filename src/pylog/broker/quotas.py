"""Byte-rate quotas (Kafka's KIP-13 produce and fetch quotas, with KIP-219's throttling).

Each principal (``User:NAME``; for anonymous clients their ``client.id``) may produce ``producer_byte_rate``
and fetch ``consumer_byte_rate`` bytes per second, measured over the last ``window_ms`` (10 s, Kafka's 11
one-second samples). A response that takes a client over its quota is sent at once with
``throttle_time_ms`` = the time the client must wait for its rate to come back to the quota, at most the
window ((observed - quota) / quota x window, Kafka's formula), and the broker reads nothing more from that
connection for that long (the client's next request waits), as Kafka's broker mutes the channel. Clients
also honour ``throttle_time_ms`` themselves. Bytes are record bytes: the record batches of a produce
request, those of a fetch response.

Thread-safety: used from the broker's event loop only; time from the log's clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from pylog.errors import ConfigError

__all__ = ["ByteRate", "Quotas"]

WINDOW_MS: Final = 10_000


@dataclass
class ByteRate:
    """Bytes per key over a sliding window, and the throttle time a new amount leads to."""

    bytes_per_s: int
    window_ms: int = WINDOW_MS
    _samples: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)
    _totals: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if type(self.bytes_per_s) is not int or self.bytes_per_s < 1:
            raise ConfigError(f"a byte rate quota must be a positive int, got {self.bytes_per_s!r}")

    def record(self, key: str, nbytes: int, now_ms: float) -> int:
        """Count ``nbytes`` for ``key`` at ``now_ms``; the throttle time in ms (0: within the quota)."""
        samples = self._samples.setdefault(key, deque())
        total = self._totals.get(key, 0) + nbytes
        samples.append((now_ms, nbytes))
        while samples and samples[0][0] <= now_ms - self.window_ms:
            total -= samples.popleft()[1]
        if not samples:
            del self._samples[key]
            self._totals.pop(key, None)
            return 0
        self._totals[key] = total
        allowed = self.bytes_per_s * self.window_ms / 1000
        if total <= allowed:
            return 0
        return min(int((total - allowed) / self.bytes_per_s * 1000), self.window_ms)


@dataclass
class Quotas:
    producer: ByteRate | None = None
    consumer: ByteRate | None = None

    @classmethod
    def of(cls, producer_byte_rate: int | None, consumer_byte_rate: int | None) -> Quotas:
        return cls(
            None if producer_byte_rate is None else ByteRate(producer_byte_rate),
            None if consumer_byte_rate is None else ByteRate(consumer_byte_rate),
        )

    def throttle(self, api_key: int, key: str, nbytes: Callable[[], int], now_ms: float) -> int:
        """The throttle time (ms) of a Produce (0) or Fetch (1) of ``key`` moving ``nbytes()`` record bytes."""
        rate = self.producer if api_key == 0 else self.consumer if api_key == 1 else None
        if rate is None:
            return 0
        return rate.record(key, nbytes(), now_ms)
