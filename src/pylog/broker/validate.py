"""Requests whose fields break their schema's promises, refused before any handler sees them.

kio reads a null (length -1) array or string where Kafka's schema says the field is not nullable, and hands
it on as None; a handler typed by the schema then fails on it. :func:`check_request` walks a decoded request
(its nested entities too) and raises :class:`MalformedRequest` for a None in a field the schema does not
declare nullable; the broker then closes that connection, as it does for any frame it cannot decode (Kafka's
broker refuses such a request while parsing it).

Thread-safety: thread-safe (the per-class field lists are cached idempotently).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

__all__ = ["MalformedRequest", "check_request"]


class MalformedRequest(ValueError):
    """A request with a null where its schema allows none."""


def check_request(entity: Any) -> None:
    """Raise :class:`MalformedRequest` when ``entity`` (a kio request or nested entity) holds a None in a
    non-nullable field, at any depth."""
    kind: Any = type(entity)
    for name, nullable, nested in _fields(kind):
        value = getattr(entity, name)
        if value is None:
            if not nullable:
                raise MalformedRequest(
                    f"{type(entity).__name__}.{name} is null, which its schema does not allow"
                )
            continue
        if nested:
            for item in value if isinstance(value, tuple) else (value,):
                if dataclasses.is_dataclass(item):
                    check_request(item)


@functools.cache
def _fields(cls: Any) -> list[tuple[str, bool, bool]]:
    """Per field: its name, whether it is nullable, whether it holds entities (directly or in a tuple)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        nullable = typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(
            tp
        )
        inner = [a for a in typing.get_args(tp) if a is not type(None)] if nullable else [tp]
        base = inner[0] if len(inner) == 1 else None
        if typing.get_origin(base) is tuple:
            base = typing.get_args(base)[0]
        nested = isinstance(base, type) and dataclasses.is_dataclass(base)
        out.append((f.name, nullable, nested))
    return out
