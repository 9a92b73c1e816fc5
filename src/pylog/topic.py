"""Topic: a named set of partitions sharing one config.

Thread-safety: thread-safe (partitions are opened lazily under a lock). Partition logs are opened on first
use, so a log with thousands of partitions costs nothing until they are touched.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from pylog.config import TopicConfig
from pylog.errors import UnknownPartitionError
from pylog.partition.log import PartitionLog
from pylog.structs import TopicPartition

if TYPE_CHECKING:
    from pylog.log import Log

__all__ = ["Topic"]

_DEFAULT: Any = object()


def msgpack_value(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


class Topic:
    """Partitions of one topic. Obtain with :meth:`pylog.Log.topic` or :meth:`pylog.Log.create_topic`."""

    def __init__(self, log: Log, name: str, partitions: int, config: TopicConfig) -> None:
        self.log = log
        self.name = name
        self.num_partitions = partitions
        self.config = config
        self._partitions: dict[int, PartitionLog] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Topic({self.name!r}, partitions={self.num_partitions})"

    def partitions(self) -> list[TopicPartition]:
        return [TopicPartition(self.name, p) for p in range(self.num_partitions)]

    def partition(self, number: int) -> PartitionLog:
        """The :class:`PartitionLog` of partition ``number``."""
        if type(number) is int:  # not bool, not a float equal to an int
            plog = self._partitions.get(number)
            if plog is not None:
                return plog
        if type(number) is not int or not 0 <= number < self.num_partitions:
            raise UnknownPartitionError(
                f"partition {number!r} does not exist in topic {self.name!r} "
                f"(partitions 0..{self.num_partitions - 1})"
            )
        with self._lock:
            plog = self._partitions.get(number)
            if plog is None:
                directory = os.path.join(self.log.path, f"{self.name}-{number}")
                plog = PartitionLog(
                    directory,
                    self.name,
                    number,
                    self.config,
                    self.log.clock,
                    self.log.map_cache,
                    handles=self.log.handles,
                )
                self._partitions[number] = plog
            return plog

    def grow(self, partitions: int) -> None:
        self.num_partitions = partitions

    def set_config(self, config: TopicConfig) -> None:
        self.config = config
        for plog in self._partitions.values():
            plog.config = config

    def beginning_offsets(self) -> dict[int, int]:
        return {p: self.partition(p).log_start_offset for p in range(self.num_partitions)}

    def end_offsets(self) -> dict[int, int]:
        return {p: self.partition(p).log_end_offset for p in range(self.num_partitions)}

    def apply_retention(self) -> int:
        """Retention (``delete`` policy) and, for compacted topics, a cleaning pass when the dirty ratio asks
        for one. Returns segments deleted by retention."""
        deleted = sum(self.partition(p).apply_retention() for p in range(self.num_partitions))
        if self.config.compacted:
            self.compact(force=False)
        return deleted

    def compact(self, *, force: bool = True) -> list[Any]:
        """Run the log cleaner on every partition now (see :mod:`pylog.partition.cleaner`); returns one
        :class:`~pylog.partition.cleaner.CleanResult` per partition. ``force`` ignores
        ``min_cleanable_dirty_ratio``. Only for topics whose ``cleanup_policy`` includes ``compact``."""
        from pylog.errors import ConfigError
        from pylog.partition.cleaner import clean_partition

        if not self.config.compacted:
            raise ConfigError(
                f"topic {self.name!r} has cleanup_policy={self.config.cleanup_policy!r}, not compact"
            )
        now = self.log.clock.time_ms()
        return [clean_partition(self.partition(p), now, force=force) for p in range(self.num_partitions)]

    def table(
        self,
        *,
        key_deserializer: Callable[[bytes], Any] | None = None,
        value_deserializer: Callable[[bytes], Any] | None = _DEFAULT,
    ) -> dict[Any, Any]:
        """The stream-table view: the latest value of every key, read from the beginning of every partition
        (a tombstone removes its key). Values are msgpack-decoded unless ``value_deserializer`` says otherwise
        (``None``: raw bytes); keys are bytes unless ``key_deserializer`` is given."""
        from pylog.record import decode_batch

        latest: dict[bytes, bytes | None] = {}
        for p in range(self.num_partitions):
            plog = self.partition(p)
            offset, end = plog.log_start_offset, plog.log_end_offset
            while offset < end:
                chunk = plog.read_raw(offset, 8 << 20)
                if not chunk:
                    break
                for buf, at in chunk:
                    b = decode_batch(buf, at)
                    first = int(np.searchsorted(b.offsets, offset))
                    latest.update(
                        (k, v)
                        for k, v in zip(b.keys()[first:], b.values()[first:], strict=True)
                        if k is not None
                    )
                    offset = b.header.next_offset
        decode_value = msgpack_value if value_deserializer is _DEFAULT else value_deserializer
        out: dict[Any, Any] = {}
        for k, v in latest.items():
            if v is None:
                continue
            out[key_deserializer(k) if key_deserializer else k] = decode_value(v) if decode_value else v
        return out

    def flush(self) -> None:
        for plog in list(self._partitions.values()):
            plog.flush()

    def describe(self) -> dict[str, Any]:
        """Partitions with start/end offsets, segment count and bytes (what ``kafka-topics --describe`` shows)."""
        parts = []
        for p in range(self.num_partitions):
            plog = self.partition(p)
            segs = plog.segments
            parts.append(
                {
                    "partition": p,
                    "log_start_offset": segs[0].base_offset,
                    "log_end_offset": segs[-1].next_offset,
                    "segments": len(segs),
                    "bytes": sum(s.size for s in segs),
                }
            )
        return {"topic": self.name, "partitions": parts, "config": self.config.to_dict()}

    def close(self) -> None:
        with self._lock:
            for plog in self._partitions.values():
                plog.close()
            self._partitions.clear()
