"""Producer settings: kafka-python's names, every one checked when the producer is created.

A bad setting is a :class:`~pylog.errors.ConfigError` naming the setting, the value given and what is
allowed, raised before the producer starts its sender thread. An unknown name is refused with the closest
known one (``lingr_ms`` -> ``linger_ms``); network settings of Kafka clients (``bootstrap_servers``) do not
apply to an embedded log and are refused too.

Setting, default, allowed values::

    acks               1          0, 1, "all" (-1 is taken as "all")
    linger_ms          0          an int or float >= 0
    batch_size         262144     an int >= 1: bytes of one batch written to a partition
    key_serializer     None       None (keys given as bytes or str) or a callable returning bytes
    value_serializer   msgpack    None (values given as bytes) or a callable returning bytes
    compression_type   None       None, "none", "gzip", "snappy", "zstd", "lz4" (None: the topic's
                                  compression_type; "snappy" needs the cramjam package: pylog[snappy])
    max_queued_bytes   1048576    an int >= 1: queued bytes that make send() write them itself
                                  (never below batch_size)
    client_id          None       None or a str: the producer's name in its repr (None: "pylog-producer-N")

``batch_size`` is 256 KiB instead of Kafka's 16 KiB: there is no network request to size, and bigger batches
cost readers less per record. The idempotent producer's settings (``enable_idempotence``,
``transactional_id``, ``transaction_timeout_ms``, ``retries``, ``retry_backoff_ms``) are checked by
:mod:`pylog.idempotent`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import msgpack

from pylog.errors import ConfigError
from pylog.record import check_codec

__all__ = ["ACKS", "COMPRESSION_TYPES", "IDEMPOTENCE_SETTINGS", "ProducerConfig", "msgpack_serializer"]

ACKS = (0, 1, "all")
COMPRESSION_TYPES = (None, "none", "gzip", "snappy", "zstd", "lz4")
#: Settings of :class:`~pylog.idempotent.IdempotentProducer`; a plain producer refuses them with a hint.
IDEMPOTENCE_SETTINGS = (
    "enable_idempotence",
    "transactional_id",
    "transaction_timeout_ms",
    "retries",
    "retry_backoff_ms",
)

msgpack_serializer: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True, autoreset=True).pack
_DEFAULT_BATCH_SIZE = 262_144
_DEFAULT_MAX_QUEUED = 1 << 20


def _bad(name: str, value: object, allowed: str) -> ConfigError:
    return ConfigError(f"{name} must be {allowed}, got {value!r}")


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(name, value, "an int >= 1")


@dataclass(frozen=True)
class ProducerConfig:
    """A producer's settings (see the module docstring), checked when built. ``acks`` is stored as ``0``,
    ``1`` or ``"all"``; :meth:`from_settings` builds one from keyword arguments, refusing unknown names."""

    acks: int | str = 1
    linger_ms: float = 0.0
    batch_size: int = _DEFAULT_BATCH_SIZE
    key_serializer: Callable[[Any], bytes] | None = None
    value_serializer: Callable[[Any], bytes] | None = field(default=msgpack_serializer)
    compression_type: str | None = None
    max_queued_bytes: int = _DEFAULT_MAX_QUEUED
    client_id: str | None = None

    def __post_init__(self) -> None:
        acks = self.acks
        if isinstance(acks, bool) or acks not in (*ACKS, -1):
            raise _bad("acks", acks, "0, 1 or 'all'")
        if acks == -1:
            object.__setattr__(self, "acks", "all")
        linger = self.linger_ms
        if isinstance(linger, bool) or not isinstance(linger, int | float) or not linger >= 0:
            raise _bad("linger_ms", linger, "an int or float >= 0")
        object.__setattr__(self, "linger_ms", float(linger))
        _positive_int("batch_size", self.batch_size)
        _positive_int("max_queued_bytes", self.max_queued_bytes)
        if self.client_id is not None and not isinstance(self.client_id, str):
            raise _bad("client_id", self.client_id, "a str or None")
        if self.compression_type not in COMPRESSION_TYPES:
            raise _bad(
                "compression_type", self.compression_type, "None, 'none', 'gzip', 'snappy', 'zstd' or 'lz4'"
            )
        if self.compression_type is not None:
            check_codec(self.compression_type)
        if self.key_serializer is not None and not callable(self.key_serializer):
            raise _bad("key_serializer", self.key_serializer, "a callable returning bytes, or None")
        if self.value_serializer is not None and not callable(self.value_serializer):
            raise _bad(
                "value_serializer",
                self.value_serializer,
                "a callable returning bytes, or None for values given as bytes",
            )

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> ProducerConfig:
        """Build a config from keyword arguments; an unknown name raises :class:`ConfigError` naming the
        closest known one."""
        unknown = sorted(set(settings) - _KNOWN)
        if unknown:
            raise ConfigError(_unknown_message(unknown))
        return cls(**settings)

    @property
    def queue_bytes(self) -> int:
        """Queued bytes at which ``send()`` writes the queue itself (never below one batch)."""
        return max(self.max_queued_bytes, self.batch_size)


_KNOWN = frozenset(f.name for f in fields(ProducerConfig))


def _unknown_message(unknown: list[str]) -> str:
    hints = []
    for name in unknown:
        if name in IDEMPOTENCE_SETTINGS:
            hints.append(f"{name} needs enable_idempotence=True")
            continue
        close = difflib.get_close_matches(name, [*_KNOWN, *IDEMPOTENCE_SETTINGS], n=1, cutoff=0.6)
        if close:
            hints.append(f"{name}: did you mean {close[0]}?")
    known = ", ".join(sorted(_KNOWN))
    detail = f" ({'; '.join(hints)})" if hints else ""
    return f"unknown producer config {', '.join(unknown)}{detail}; known: {known}"
