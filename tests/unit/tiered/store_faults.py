"""An object store for tests of tiered storage whose operations fail on demand (a store that cannot be
reached), installed as a log's store with ``log._remote = store``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pylog.errors import RemoteStorageError
from pylog.tiered.store import ObjectStore

__all__ = ["ALL", "FaultyStore"]

ALL = frozenset({"put", "get", "list", "delete"})


class FaultyStore(ObjectStore):
    """An :class:`ObjectStore` whose operations named in ``down`` (``"put"`` covers ``put_file``) raise a
    :class:`RemoteStorageError` saying ``store down``; set ``down`` to ``frozenset()`` to bring it back."""

    def __init__(self, url: str, *, down: frozenset[str] = ALL, **options: Any) -> None:
        super().__init__(url, **options)
        self.down = down

    def _check(self, op: str, key: str) -> None:
        if op in self.down:
            raise RemoteStorageError(f"store down: {op} {key}", key=key)

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        self._check("put", key)
        return super().put(key, data, if_absent=if_absent)

    def put_file(self, key: str, path: str, length: int, *, if_absent: bool = True) -> tuple[int, int]:
        self._check("put", key)
        return super().put_file(key, path, length, if_absent=if_absent)

    def get(self, key: str) -> bytes:
        self._check("get", key)
        return super().get(key)

    def list(self, prefix: str = "") -> list[Any]:
        self._check("list", prefix)
        return super().list(prefix)

    def delete(self, key: str) -> None:
        self._check("delete", key)
        super().delete(key)

    def delete_many(self, keys: Sequence[str]) -> None:
        self._check("delete", keys[0] if keys else "")
        super().delete_many(keys)
