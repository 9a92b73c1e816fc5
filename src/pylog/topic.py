"""Topic: a named set of partitions sharing one config.

Thread-safety: thread-safe (partitions are opened lazily under a lock). Partition logs are opened on first
use, so a log with thousands of partitions costs nothing until they are touched.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np
import numpy.typing as npt

from pylog.config import TopicConfig
from pylog.errors import ConfigError, UnknownPartitionError
from pylog.partition import files
from pylog.partition.keymap import latest_mask
from pylog.partition.log import PartitionLog
from pylog.partition.visibility import OPEN, VISIBLE, Visibility
from pylog.record import DecodedBatch, decode_batch
from pylog.structs import TopicPartition

if TYPE_CHECKING:
    from pylog.clock import Clock
    from pylog.partition.cleaner import CleanResult, TxnStatus
    from pylog.partition.log import HandleBudget, RecoveryReport
    from pylog.partition.remote import RemoteSegments
    from pylog.partition.segment import MapCache
    from pylog.transactions import TxnDecisions

__all__ = ["Topic", "TopicEnv"]

_DEFAULT: Any = object()


def msgpack_value(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


def _table_of(plog: PartitionLog, status: TxnStatus | None, out: dict[bytes, bytes]) -> None:
    """Apply the latest record of every key of ``plog`` to ``out`` (a tombstone deletes its key). With
    ``status``, aborted transactions are skipped and reading stops at the first open one."""
    batches: list[DecodedBatch] = []
    aborted: list[bool] = []
    visibility = Visibility(status) if status is not None else None
    offset, end = plog.log_start_offset, plog.log_end_offset
    while offset < end:
        chunk = plog.read_raw(offset, 8 << 20)
        if not chunk:
            break
        for buf, at in chunk:
            b = decode_batch(buf, at)
            verdict = visibility.classify(b.header) if visibility is not None else VISIBLE
            if verdict == OPEN:
                offset = end  # the last stable offset: nothing after it is visible yet
                break
            batches.append(b)
            aborted.append(verdict != VISIBLE)  # aborted, or a control batch
            offset = b.header.next_offset
    if not batches:
        return
    counts = [len(b.offsets) for b in batches]
    mask = latest_mask(batches, ~np.repeat(np.array(aborted, dtype=np.bool_), counts))
    at = 0
    for b, n in zip(batches, counts, strict=True):
        idx = np.flatnonzero(mask[at : at + n])
        at += n
        if not len(idx):
            continue
        alive = b.value_valid[idx]
        for key in _pick(b.key_data, b.key_offsets, idx[~alive]):
            out.pop(key, None)
        live = idx[alive]
        out.update(
            zip(
                _pick(b.key_data, b.key_offsets, live),
                _pick(b.value_data, b.value_offsets, live),
                strict=True,
            )
        )


def _pick(data: memoryview, bounds: npt.NDArray[np.int64], idx: npt.NDArray[np.intp]) -> list[bytes]:
    """Entries ``idx`` of an Arrow-style column, as bytes."""
    if not len(idx):
        return []
    raw = bytes(data)
    return [raw[a:z] for a, z in zip(bounds[idx].tolist(), bounds[idx + 1].tolist(), strict=True)]


@dataclass(frozen=True)
class TopicEnv:
    """What a topic's partitions need from the log directory that opens them."""

    path: str  # the log root
    clock: Clock
    map_cache: MapCache
    handles: HandleBudget
    session: int  # the directory's session id (see pylog.directory)
    clean_start: bool  # the session started from a clean shutdown
    read_only: bool
    recovery: dict[str, RecoveryReport]  # filled in as partitions are opened: "topic-partition" -> report
    # the transaction decisions read_committed reads and compaction need: the directory's transaction log
    # (opened on first use), or its decisions read without writing for a read-only log
    txn_decisions: Callable[[], TxnDecisions]
    # tiered storage: (topic, partition, config) -> the partition's remote segments (None: not tiered)
    remote: Callable[[str, int, TopicConfig], RemoteSegments | None] | None = None


class Topic:
    """Partitions of one topic. Obtain with :meth:`pylog.Log.topic` or :meth:`pylog.Log.create_topic`."""

    def __init__(
        self, env: TopicEnv, name: str, partitions: int, config: TopicConfig, topic_id: str | None = None
    ) -> None:
        self.env = env
        self.name = name
        self.topic_id = topic_id  # random, given at creation: a topic deleted and created again is another
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
                directory = files.partition_dir(self.env.path, self.name, number)
                plog = PartitionLog(
                    directory,
                    self.name,
                    number,
                    self.config,
                    self.env.clock,
                    self.env.map_cache,
                    handles=self.env.handles,
                    session=self.env.session,
                    clean_shutdown=self.env.clean_start,
                    read_only=self.env.read_only,
                    remote=None
                    if self.env.remote is None
                    else self.env.remote(self.name, number, self.config),
                )
                self._partitions[number] = plog
                if plog.validated:
                    self.env.recovery[files.partition_dir_name(self.name, number)] = plog.report
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

    def apply_retention(self, remote: Mapping[int, tuple[int, int]] | None = None) -> int:
        """Retention (``delete`` policy) and, for compacted topics, a cleaning pass when the dirty ratio (or a
        tombstone due to expire) asks for one. Returns segments deleted by retention.

        Tiered storage: ``remote`` maps a partition to the ``(start, end)`` offsets its published remote
        manifest covers; a partition of a ``remote_storage_enable`` topic missing from it deletes nothing
        locally (see :meth:`PartitionLog.apply_retention <pylog.partition.log.PartitionLog.apply_retention>`)."""
        ranges = remote or {}
        deleted = sum(
            self.partition(p).apply_retention(remote=ranges.get(p)) for p in range(self.num_partitions)
        )
        if self.config.compacted:
            self.compact(force=False)
        return deleted

    def compact(self, *, force: bool = True) -> list[CleanResult]:
        """Run the log cleaner on every partition now (see :mod:`pylog.partition.cleaner`); returns one
        :class:`~pylog.partition.cleaner.CleanResult` per partition. ``force`` ignores
        ``min_cleanable_dirty_ratio``. Only for topics whose ``cleanup_policy`` includes ``compact``."""
        return [
            self.partition(p).compact(force=force, txn_status=self._txn_status)
            for p in range(self.num_partitions)
        ]

    def _txn_status(self, producer_id: int, producer_epoch: int, txn: int) -> str:
        """The state of a transaction, for the cleaner and ``table(read_committed)``: an open one past its
        timeout is aborted first (by a writable log; a read-only one answers from the decisions as they are)."""
        txns = self.env.txn_decisions()
        status = str(txns.status(producer_id, producer_epoch, txn))
        if status == "open" and txns.abort_expired(self.env.clock.time_ms()):
            status = str(txns.status(producer_id, producer_epoch, txn))
        return status

    def table(
        self,
        *,
        key_deserializer: Callable[[bytes], Any] | None = None,
        value_deserializer: Callable[[bytes], Any] | None = _DEFAULT,
        isolation_level: str = "read_uncommitted",
    ) -> dict[Any, Any]:
        """The stream-table view: the latest value of every key, read from the beginning of every partition
        (a tombstone removes its key; for a key in several partitions the highest partition wins). Values are
        msgpack-decoded unless ``value_deserializer`` says otherwise (``None``: raw bytes); keys are bytes
        unless ``key_deserializer`` is given.

        ``isolation_level="read_committed"`` ignores records of aborted transactions and reads each partition
        up to its first open transaction, as a read_committed consumer does; compaction never changes that
        view. The latest record of each key is found with numpy over whole columns
        (:mod:`pylog.partition.keymap`): only the surviving keys and values become Python objects."""
        if isolation_level not in ("read_uncommitted", "read_committed"):
            raise ConfigError(
                f"isolation_level must be read_uncommitted or read_committed, got {isolation_level!r}"
            )
        status = self._txn_status if isolation_level == "read_committed" else None
        latest: dict[bytes, bytes] = {}
        for p in range(self.num_partitions):
            _table_of(self.partition(p), status, latest)
        decode_value = msgpack_value if value_deserializer is _DEFAULT else value_deserializer
        if key_deserializer is None and decode_value is None:
            return dict(latest)
        return {
            (key_deserializer(k) if key_deserializer else k): (decode_value(v) if decode_value else v)
            for k, v in latest.items()
        }

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

    def close(self, *, flush: bool = True) -> None:
        """Close every opened partition (fsyncing what was written unless ``flush`` is False, as for a topic
        another process deleted). Every partition is closed even if one fails; the first error is raised."""
        first: BaseException | None = None
        with self._lock:
            for plog in self._partitions.values():
                try:
                    plog.close(flush=flush)
                except Exception as exc:
                    first = first or exc
            self._partitions.clear()
        if first is not None:
            raise first
