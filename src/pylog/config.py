"""Topic configuration: Kafka's names (snake_case) and defaults.

Every topic stores its full config in the manifest, so a log directory describes itself. Defaults follow
Kafka's broker defaults except where an embedded log needs another one; each such place says so.

| name | default | meaning |
|---|---|---|
| ``segment_bytes`` | 1 GiB | roll the active segment when it would grow past this |
| ``segment_ms`` | 7 days | roll the active segment when a batch is this much newer than its first record |
| ``retention_ms`` | 7 days (-1: keep forever) | delete a segment when its largest timestamp is older |
| ``retention_bytes`` | -1 (no limit) | per partition: delete oldest segments until the rest fit |
| ``cleanup_policy`` | ``"delete"`` | ``"delete"``, ``"compact"`` or ``"compact,delete"`` |
| ``max_message_bytes`` | 1 MiB + 12 | largest batch that may be appended |
| ``message_timestamp_type`` | ``"CreateTime"`` | or ``"LogAppendTime"`` (the log sets timestamps) |
| ``message_timestamp_after_max_ms`` | 3600000 (1 hour, Kafka 4.0's default) | CreateTime: refuse a batch with a record this far ahead of the log's clock |
| ``message_timestamp_before_max_ms`` | 9223372036854775807 (no limit) | CreateTime: refuse a batch with a record this far behind the log's clock |
| ``flush_messages`` | -1 (off) | fsync after this many records |
| ``flush_ms`` | -1 (off) | fsync when the oldest unflushed record is this old |
| ``index_interval_bytes`` | 4096 | bytes of log between offset-index entries |
| ``compression_type`` | ``"none"`` | ``"none"``, ``"gzip"``, ``"snappy"``, ``"zstd"``, ``"lz4"`` (per batch; snappy needs ``pylog[snappy]``) |
| ``min_cleanable_dirty_ratio`` | 0.5 | compaction: dirty share that triggers cleaning |
| ``delete_retention_ms`` | 1 day | compaction: how long tombstones survive |
| ``min_compaction_lag_ms`` | 0 | compaction: records younger than this are not compacted |
| ``remote_storage_enable`` | (off: False) | tiered storage: copy sealed segments to the log's ``remote_storage`` |
| ``local_retention_ms`` | -2 (follow ``retention_ms``; -1: keep forever) | tiered: delete an uploaded local segment this old |
| ``local_retention_bytes`` | -2 (follow ``retention_bytes``; -1: no limit) | tiered: keep at most this many local bytes |

``message_timestamp_after_max_ms`` and ``message_timestamp_before_max_ms`` are Kafka's (3.6+)
``message.timestamp.after.max.ms`` / ``message.timestamp.before.max.ms``, with Kafka 4.0's defaults (before 4.0
the first was unlimited too). Each append of a ``CreateTime`` topic compares the batch's smallest and largest
record timestamps with the log's :class:`~pylog.clock.Clock`; a batch outside the window is refused whole with
:class:`~pylog.errors.InvalidTimestampError`, as Kafka refuses it, and nothing of it is written. Retention
judges a segment by its largest timestamp, so without the first limit one record stamped in the year 3000
would keep its segment (and every later one) forever. ``LogAppendTime`` topics are not checked: the log sets
the timestamps.

``local_retention_ms`` and ``local_retention_bytes`` are Kafka's ``local.retention.ms`` / ``local.retention.bytes``
and are validated as Kafka validates them when ``remote.storage.enable`` is on: at most ``retention_ms`` /
``retention_bytes`` (-1, unlimited, only when the whole log is unlimited too). Kafka ignores them on a topic
without remote storage; pylog refuses to set them there (a :class:`~pylog.errors.ConfigError`), so a value that
would do nothing is never silently kept.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any

from pylog.errors import ConfigError, InvalidTimestampError

__all__ = ["COMPRESSION_TYPES", "TIMESTAMP_TYPES", "TopicConfig"]

COMPRESSION_TYPES = ("none", "gzip", "snappy", "zstd", "lz4")
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
CLEANUP_POLICIES = ("delete", "compact", "compact,delete")

_DAY_MS = 24 * 60 * 60 * 1000
_I64_MAX = 2**63 - 1


@dataclass(frozen=True)
class TopicConfig:
    """A topic's configuration. Immutable; build a changed copy with :meth:`replace`."""

    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * _DAY_MS
    retention_ms: int = 7 * _DAY_MS
    retention_bytes: int = -1
    cleanup_policy: str = "delete"
    max_message_bytes: int = (1 << 20) + 12
    message_timestamp_type: str = "CreateTime"
    message_timestamp_after_max_ms: int = 3_600_000
    message_timestamp_before_max_ms: int = _I64_MAX
    flush_messages: int = -1
    flush_ms: int = -1
    index_interval_bytes: int = 4096
    compression_type: str = "none"
    min_cleanable_dirty_ratio: float = 0.5
    delete_retention_ms: int = _DAY_MS
    min_compaction_lag_ms: int = 0
    remote_storage_enable: bool = False
    local_retention_ms: int = -2
    local_retention_bytes: int = -2

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"{f.name} must be an int, got {value!r}")
        _check_range("segment_bytes", self.segment_bytes, 64, 2**31 - 1)
        _check_range("segment_ms", self.segment_ms, 1, _I64_MAX)
        _check_range("retention_ms", self.retention_ms, -1, _I64_MAX)
        _check_range("retention_bytes", self.retention_bytes, -1, _I64_MAX)
        _check_range("max_message_bytes", self.max_message_bytes, 128, 2**31 - 1)
        _check_range("flush_messages", self.flush_messages, -1, _I64_MAX, zero_ok=False)
        _check_range("flush_ms", self.flush_ms, -1, _I64_MAX)
        _check_range("message_timestamp_after_max_ms", self.message_timestamp_after_max_ms, 0, _I64_MAX)
        _check_range("message_timestamp_before_max_ms", self.message_timestamp_before_max_ms, 0, _I64_MAX)
        _check_range("index_interval_bytes", self.index_interval_bytes, 0, 2**31 - 1)
        _check_range("delete_retention_ms", self.delete_retention_ms, 0, _I64_MAX)
        _check_range("min_compaction_lag_ms", self.min_compaction_lag_ms, 0, _I64_MAX)
        _check_choice("cleanup_policy", self.cleanup_policy, CLEANUP_POLICIES)
        _check_choice("message_timestamp_type", self.message_timestamp_type, TIMESTAMP_TYPES)
        _check_choice("compression_type", self.compression_type, COMPRESSION_TYPES)
        if not isinstance(self.remote_storage_enable, bool):
            raise ConfigError(f"remote_storage_enable must be a bool, got {self.remote_storage_enable!r}")
        if self.remote_storage_enable and self.compacted:
            # as in Kafka: a compacted segment is rewritten in place, which immutable remote copies cannot follow
            raise ConfigError("remote_storage_enable is not supported with cleanup_policy including compact")
        _check_local_retention(
            "local_retention_ms", self.local_retention_ms, "retention_ms", self.retention_ms
        )
        _check_local_retention(
            "local_retention_bytes", self.local_retention_bytes, "retention_bytes", self.retention_bytes
        )
        if not self.remote_storage_enable:
            for name in ("local_retention_ms", "local_retention_bytes"):
                if getattr(self, name) != -2:
                    raise ConfigError(
                        f"{name} applies only to a topic with remote_storage_enable=True (tiered storage); "
                        "leave it at -2"
                    )
        ratio = self.min_cleanable_dirty_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0.0 <= ratio <= 1.0:
            raise ConfigError(f"min_cleanable_dirty_ratio must be a number in [0, 1], got {ratio!r}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TopicConfig:
        """Build a config from ``values``; unknown names raise :class:`ConfigError` naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown topic config {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**values)

    def replace(self, **changes: Any) -> TopicConfig:
        """A copy with ``changes`` applied (validated like a new config)."""
        current = self.to_dict()
        current.update(changes)
        return TopicConfig.from_dict(current)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def compacted(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def deletes(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def effective_local_retention_ms(self) -> int:
        """``local_retention_ms`` with -2 resolved to ``retention_ms`` (-1: unlimited)."""
        return self.retention_ms if self.local_retention_ms == -2 else self.local_retention_ms

    @property
    def effective_local_retention_bytes(self) -> int:
        """``local_retention_bytes`` with -2 resolved to ``retention_bytes`` (-1: unlimited)."""
        return self.retention_bytes if self.local_retention_bytes == -2 else self.local_retention_bytes

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    def check_timestamps(self, low: int, high: int, now: int, what: str) -> None:
        """Raise :class:`~pylog.errors.InvalidTimestampError` when record timestamps ``low`` .. ``high`` (the
        smallest and largest of ``what``, for example a batch) leave this CreateTime topic's window around the
        clock's ``now``: ``message_timestamp_before_max_ms`` behind it, ``message_timestamp_after_max_ms``
        ahead of it (Kafka's rule; the bounds themselves are allowed). LogAppendTime topics take any."""
        if self.message_timestamp_type != "CreateTime":
            return
        if high - now > self.message_timestamp_after_max_ms:
            bad, name, limit, where = (
                high,
                "message_timestamp_after_max_ms",
                self.message_timestamp_after_max_ms,
                "ahead of",
            )
        elif now - low > self.message_timestamp_before_max_ms:
            bad, name, limit, where = (
                low,
                "message_timestamp_before_max_ms",
                self.message_timestamp_before_max_ms,
                "behind",
            )
        else:
            return
        raise InvalidTimestampError(
            f"timestamp {bad} is {abs(bad - now)} ms {where} the log's clock ({now}), more than the topic's "
            f"{name}={limit} allows: {what} was not written"
        )


def _check_range(name: str, value: int, low: int, high: int, *, zero_ok: bool = True) -> None:
    if not low <= value <= high or (value == 0 and not zero_ok):
        raise ConfigError(f"{name} must be in [{low}, {high}]{'' if zero_ok else ' and not 0'}, got {value}")


def _check_local_retention(name: str, value: int, whole_name: str, whole: int) -> None:
    """Kafka's rule: -2 follows ``whole``; else at most ``whole``, and -1 (unlimited) only if ``whole`` is."""
    _check_range(name, value, -2, _I64_MAX)
    if value == -2 or whole == -1:
        return
    if value == -1 or value > whole:
        raise ConfigError(
            f"{name}={value} must be at most {whole_name}={whole} (local data is a part of the whole log); "
            f"-2 follows {whole_name}"
        )


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
