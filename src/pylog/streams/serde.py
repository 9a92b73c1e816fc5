"""Serdes: how a stream application turns keys and values into the bytes of a topic, and back.

A :class:`Serde` pairs a serializer and a deserializer. ``None`` (a null key, a tombstone) stays ``None`` both
ways, whatever the serde. The application's defaults (``App(..., key_serde=STRING, value_serde=MSGPACK)``)
match what ``log.producer()`` writes by default (str keys as UTF-8, values as msgpack); each
``stream()``/``table()``/``to()`` may name its own. Internal topics (repartition, changelog) always use msgpack.

msgpack has no tuple: a tuple written to a topic or a store comes back as a list. Stored aggregates and keys
must be msgpack values (None, bool, int, float, str, bytes, lists, dicts).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from pylog.errors import SerializationError

__all__ = ["BYTES", "JSON", "MSGPACK", "MSGPACK_KEY", "STRING", "Serde"]

_pack: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def _unpack(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


def _unpack_key(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False, use_list=False, strict_map_key=False)


@dataclass(frozen=True)
class Serde:
    """A serializer (object -> bytes) and its deserializer (bytes -> object), named for error messages."""

    name: str
    encode: Callable[[Any], bytes]
    decode: Callable[[bytes], Any]

    def serialize(self, obj: Any) -> bytes | None:
        """``obj`` as bytes (None stays None); a failure is a :class:`~pylog.errors.SerializationError`."""
        if obj is None:
            return None
        try:
            out = self.encode(obj)
        except Exception as exc:
            raise SerializationError(f"the {self.name} serde cannot encode {obj!r}: {exc}") from exc
        if not isinstance(out, bytes | bytearray):
            raise SerializationError(f"the {self.name} serde returned {type(out).__name__}, not bytes")
        return bytes(out)

    def deserialize(self, raw: bytes | None) -> Any:
        """The object of ``raw`` (None stays None). Errors propagate: the caller names the record."""
        return None if raw is None else self.decode(raw)


def _utf8(obj: Any) -> bytes:
    if isinstance(obj, bytes | bytearray):
        return bytes(obj)
    if not isinstance(obj, str):
        raise TypeError(f"expected str, got {type(obj).__name__}")
    return obj.encode()


def _identity(obj: Any) -> bytes:
    if not isinstance(obj, bytes | bytearray):
        raise TypeError(f"expected bytes, got {type(obj).__name__}")
    return bytes(obj)


STRING = Serde("string", _utf8, lambda raw: raw.decode())
"""str as UTF-8 (bytes pass through on write)."""
BYTES = Serde("bytes", _identity, bytes)
"""bytes as they are."""
MSGPACK = Serde("msgpack", _pack, _unpack)
"""Any msgpack value (pylog's default value format)."""
JSON = Serde("json", lambda obj: json.dumps(obj, separators=(",", ":")).encode(), json.loads)
"""Any JSON value, compact UTF-8."""
MSGPACK_KEY = Serde("msgpack", _pack, _unpack_key)
"""msgpack for keys: arrays come back as tuples, so a key stays hashable (internal topics and stores)."""
