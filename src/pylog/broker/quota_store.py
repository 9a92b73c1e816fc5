"""The client quotas of a log directory: ``<root>/__security/quotas`` (``pylog quotas``, AlterClientQuotas).

What the quotas mean and which one applies to a client: :mod:`pylog.broker.quotas`.

File (owner of the format; mirrored in ``docs/format.md``), written as :mod:`pylog.broker.securefile` says
(mode 0600, two-phase, under ``__security/.lock``):

| part | bytes | content |
|---|---|---|
| header | 1 line | ``b"pylog-quotas 1 <crc32c of the body, 8 lowercase hex digits>\\n"`` |
| body | rest | UTF-8 JSON object ``{"quotas": [{"user": U, "client-id": C, "values": {KEY: N, ...}}, ...]}`` |

``user`` and ``client-id`` are a name, ``"<default>"`` (the default entity) or absent (the entity does not
name that type); KEY is ``producer_byte_rate`` or ``consumer_byte_rate``, N a positive int. An entity with no
values is not kept. A file that does not check is a :class:`~pylog.errors.ConfigError` (the broker refuses to
start; a running broker keeps the quotas it read last, and logs the error, as when it cannot read it).

Thread-safety: :class:`QuotaStore` is thread-safe.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import types
from collections.abc import Iterable, Mapping
from typing import Any, Final

from pylog.broker.quotas import QuotaEntity, check_quota
from pylog.broker.securefile import Watched, locked, read_private, security_dir, write_private
from pylog.errors import ConfigError
from pylog.framing import frame, unframe

__all__ = ["QUOTAS_FILE", "Change", "QuotaStore"]

_log = logging.getLogger("pylog.broker")
QUOTAS_FILE: Final = "quotas"
_MAGIC: Final = b"pylog-quotas"
_FORMAT: Final = 1
Quotas = Mapping[QuotaEntity, Mapping[str, int]]
# a change: the entity, then per key the new value or None (remove it)
Change = tuple[QuotaEntity, Mapping[str, float | None]]


class QuotaStore:
    """The quotas of the log directory ``root``: :meth:`quotas` sees changes of other processes at its next
    call."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.path = os.path.join(security_dir(root), QUOTAS_FILE)
        self._watched = Watched(self.path, _load)
        self._lock = threading.Lock()
        self._last_good: Quotas = types.MappingProxyType({})
        self._reported: str | None = None

    def quotas(self) -> Quotas:
        """Every entity with quotas and its values. Raises :class:`ConfigError` when the file does not check."""
        return self._watched.get()

    def current(self) -> Quotas:
        """:meth:`quotas`, or those read last when the file stopped checking or cannot be read (the error
        logged once): the broker's produce and fetch answers never fail for it."""
        try:
            got = self._watched.get()
        except (ConfigError, OSError) as exc:
            with self._lock:
                if self._reported != str(exc):
                    self._reported = str(exc)
                    _log.error("keeping the quotas read before: %s", exc)
                return self._last_good
        with self._lock:
            self._last_good = got
            self._reported = None
        return got

    def alter(self, changes: Iterable[Change], validate_only: bool = False) -> Quotas:
        """Apply ``changes`` in order, in one write (none: :class:`ConfigError` for the first bad one and
        nothing written); ``validate_only``: check them only. Returns the quotas after."""
        wanted = list(changes)
        checked = [(entity.checked(), _checked_values(values)) for entity, values in wanted]
        with locked(security_dir(self.root, create=True)):
            current = {e: dict(v) for e, v in _load(self.path).items()}
            for entity, values in checked:
                row = current.setdefault(entity, {})
                for key, value in values.items():
                    if value is None:
                        row.pop(key, None)
                    else:
                        row[key] = value
                if not row:
                    del current[entity]
            if not validate_only and current != _load(self.path):
                write_private(self.path, _dump(current))
        return _frozen(current)

    def remove(self, entity: QuotaEntity, keys: Iterable[str] | None = None) -> dict[str, int]:
        """Remove the quotas ``keys`` (None: all) of ``entity``; returns those that were set."""
        wanted = None if keys is None else set(keys)
        directory = security_dir(self.root)
        if not os.path.isdir(directory):
            return {}
        with locked(directory):
            current = {e: dict(v) for e, v in _load(self.path).items()}
            row = current.get(entity, {})
            gone = {k: v for k, v in row.items() if wanted is None or k in wanted}
            if gone:
                for key in gone:
                    del row[key]
                if not row:
                    del current[entity]
                write_private(self.path, _dump(current))
        return gone


def _checked_values(values: Mapping[str, float | None]) -> dict[str, int | None]:
    return {key: None if value is None else check_quota(key, value) for key, value in values.items()}


def _frozen(quotas: Mapping[QuotaEntity, Mapping[str, int]]) -> Quotas:
    return types.MappingProxyType({e: types.MappingProxyType(dict(v)) for e, v in quotas.items()})


def _load(path: str) -> Quotas:
    raw = read_private(path)
    if raw is None:
        return types.MappingProxyType({})
    try:
        data = json.loads(unframe(raw, _MAGIC, _FORMAT, f"quota file {path}"))
        out: dict[QuotaEntity, dict[str, int]] = {}
        for row in data["quotas"]:
            entity = QuotaEntity(row.get("user"), row.get("client-id")).checked()
            if entity in out or not row["values"]:
                raise ValueError(f"entity {entity.describe()} is there twice or without values")
            out[entity] = {k: check_quota(k, v) for k, v in row["values"].items()}
        return _frozen(out)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"{path} does not check ({exc}): restore it from a backup, or delete it and set the quotas again"
        ) from exc


def _dump(quotas: Mapping[QuotaEntity, Mapping[str, int]]) -> bytes:
    rows: list[dict[str, Any]] = []
    for entity in sorted(quotas, key=QuotaEntity.sort_key):
        row: dict[str, Any] = {}
        if entity.user is not None:
            row["user"] = entity.user
        if entity.client_id is not None:
            row["client-id"] = entity.client_id
        row["values"] = dict(sorted(quotas[entity].items()))
        rows.append(row)
    return frame(_MAGIC, _FORMAT, json.dumps({"quotas": rows}, sort_keys=True).encode())
