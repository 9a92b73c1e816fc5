"""DescribeClientQuotas (API 48) and AlterClientQuotas (API 49): Kafka admin clients manage the client quotas
(the same ``__security/quotas`` as ``pylog quotas``; see :mod:`pylog.broker.quotas` for their meaning).

Authorized like Kafka's: DescribeClientQuotas needs DESCRIBE_CONFIGS on the cluster, AlterClientQuotas
ALTER_CONFIGS on the cluster (:mod:`pylog.broker.authorize`).

- DescribeClientQuotas: a filter is a list of components (entity type ``user`` or ``client-id``, match type 0:
  the exact name, 1: the default entity, 2: any entity of that type, the default included); an entity matches
  when every component matches it and, with ``strict``, it names no other type. Answered with every matching
  entity and its values (the default entity's name is null); an invalid filter with INVALID_REQUEST (42), a
  quota file that does not check with INVALID_CONFIG (40).
- AlterClientQuotas: each entry (an entity and its operations: set a key to a value, or remove it) is
  checked on its own; the valid entries are applied together in one write (none with ``validate_only``), the
  others answered INVALID_REQUEST (42) with the reason. An entity naming a type twice, a type other than
  ``user`` and ``client-id`` (Kafka's ``ip`` quotas are not enforced), an unknown or unsupported key, a value
  that is not a whole number >= 1 or a key twice in one entry are invalid. When the quota file does not
  check (INVALID_CONFIG, 40) or cannot be written (UNKNOWN_SERVER_ERROR, -1), nothing changes and every valid
  entry is answered so.

Thread-safety: handlers run in the event loop; file changes go through
:class:`~pylog.broker.quota_store.QuotaStore` in the thread pool.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from pylog.broker.protocol import ErrorCode, Request
from pylog.broker.quota_store import Change, QuotaStore
from pylog.broker.quotas import DEFAULT, ENTITY_TYPES, QuotaEntity, check_quota
from pylog.errors import ConfigError

if TYPE_CHECKING:
    from pylog.broker.context import Context

__all__ = ["quota_handlers"]

_log = logging.getLogger("pylog.broker")
_EXACT: Final = 0
_DEFAULT: Final = 1
_SPECIFIED: Final = 2
Handler = Callable[["Context", Request], Awaitable[dict[str, Any] | None]]


def quota_handlers(store: QuotaStore) -> dict[int, Handler]:
    """The two handlers over ``store``."""

    async def describe(ctx: Context, request: Request) -> dict[str, Any]:
        body = request.body
        try:
            wanted = _filter(body.components)
        except ConfigError as exc:
            return _describe_error(ErrorCode.invalid_request, str(exc))
        try:
            quotas = await ctx.run(store.quotas)
        except ConfigError as exc:  # the file does not check
            return _describe_error(ErrorCode.invalid_config, str(exc))
        entries = [
            {
                "entity": [{"entity_type": t, "entity_name": n} for t, n in entity.parts()],
                "values": [{"key": k, "value": float(v)} for k, v in sorted(values.items())],
            }
            for entity, values in sorted(quotas.items(), key=lambda item: item[0].sort_key())
            if _matches(entity, wanted, bool(body.strict))
        ]
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "entries": entries}

    async def alter(ctx: Context, request: Request) -> dict[str, Any]:
        results: list[dict[str, Any]] = []
        valid: list[Change] = []
        for entry in request.body.entries:
            echoed = [{"entity_type": e.entity_type, "entity_name": e.entity_name} for e in entry.entity]
            try:
                valid.append(_change(entry))
                results.append({"error_code": ErrorCode.none, "error_message": None, "entity": echoed})
            except ConfigError as exc:
                results.append(
                    {"error_code": ErrorCode.invalid_request, "error_message": str(exc), "entity": echoed}
                )
        if valid:
            try:
                await ctx.run(store.alter, valid, bool(request.body.validate_only))
            except (ConfigError, OSError) as exc:  # the file does not check, or cannot be written: unchanged
                code = (
                    ErrorCode.invalid_config
                    if isinstance(exc, ConfigError)
                    else ErrorCode.unknown_server_error
                )
                _log.error("quotas not changed: %s", exc)
                for r in results:
                    if r["error_code"] == ErrorCode.none:
                        r.update(error_code=code, error_message=f"quotas not changed: {exc}")
        return {"throttle_time": 0, "entries": results}

    return {48: describe, 49: alter}


def _describe_error(code: ErrorCode, message: str) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": code, "error_message": message, "entries": None}


def _name(entity_type: str, name: str | None) -> str:
    if name == DEFAULT:
        raise ConfigError(f"{DEFAULT!r} is the default entity's name on disk: send a null name for it")
    if entity_type not in ENTITY_TYPES:
        raise ConfigError(
            f"quota entity type {entity_type!r} is not supported (supported: {', '.join(ENTITY_TYPES)})"
        )
    return DEFAULT if name is None else name


def _entity(parts: Any) -> QuotaEntity:
    names: dict[str, str] = {}
    for part in parts:
        entity_type = str(part.entity_type)
        if entity_type in names:
            raise ConfigError(f"quota entity type {entity_type!r} given twice")
        names[entity_type] = _name(entity_type, part.entity_name)
    if not names:
        raise ConfigError("an empty quota entity")
    return QuotaEntity(names.get("user"), names.get("client-id")).checked()


def _change(entry: Any) -> Change:
    entity = _entity(entry.entity)
    values: dict[str, float | None] = {}
    for op in entry.ops:
        key = str(op.key)
        if key in values:
            raise ConfigError(f"quota {key} given twice for {entity.describe()}")
        values[key] = None if op.remove else float(op.value)
        if op.remove:
            check_quota(key, 1)  # a known key
        else:
            check_quota(key, float(op.value))
    return entity, values


def _filter(components: Any) -> dict[str, tuple[int, str | None]]:
    out: dict[str, tuple[int, str | None]] = {}
    for c in components:
        entity_type = str(c.entity_type)
        match_type = int(c.match_type)
        if entity_type in out:
            raise ConfigError(f"quota entity type {entity_type!r} given twice in the filter")
        if entity_type not in ENTITY_TYPES:
            raise ConfigError(
                f"quota entity type {entity_type!r} is not supported (supported: {', '.join(ENTITY_TYPES)})"
            )
        if match_type not in (_EXACT, _DEFAULT, _SPECIFIED):
            raise ConfigError(f"unknown match type {match_type} (0: exact name, 1: default, 2: any)")
        if match_type == _EXACT and c.match is None:
            raise ConfigError(f"an exact match of {entity_type} needs a name")
        out[entity_type] = (match_type, None if c.match is None else str(c.match))
    return out


def _matches(entity: QuotaEntity, wanted: dict[str, tuple[int, str | None]], strict: bool) -> bool:
    names = dict(entity.parts())  # type -> name, None: default
    for entity_type, (match_type, name) in wanted.items():
        if entity_type not in names:
            return False
        if match_type == _EXACT and names[entity_type] != name:
            return False
        if match_type == _DEFAULT and names[entity_type] is not None:
            return False
    return not strict or set(names) <= set(wanted)
