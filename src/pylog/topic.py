"""Topic: a named set of partitions sharing one config.

Thread-safety: thread-safe (partitions are opened lazily under a lock). Partition logs are opened on first
use, so a log with thousands of partitions costs nothing until they are touched.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from pylog.config import TopicConfig
from pylog.errors import UnknownPartitionError
from pylog.partition.log import PartitionLog
from pylog.structs import TopicPartition

if TYPE_CHECKING:
    from pylog.log import Log

__all__ = ["Topic"]


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
        plog = self._partitions.get(number)
        if plog is not None:
            return plog
        if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number < self.num_partitions:
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
        return sum(self.partition(p).apply_retention() for p in range(self.num_partitions))

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
