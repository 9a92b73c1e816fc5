"""Topic: a named set of partitions sharing one config.

Thread-safety: thread-safe (partitions are opened lazily under a lock). Partition logs are opened on first
use, so a log with thousands of partitions costs nothing until they are touched.
"""

from __future__ import annotations

import bisect
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
from pylog.partition.remote import describe as describe_partition
from pylog.partition.visibility import OPEN, VISIBLE, Visibility, consistent_cut
from pylog.record import ATTR_TRANSACTIONAL as _TXN
from pylog.record import BatchHeader, DecodedBatch, decode_batch, decode_header
from pylog.structs import TopicPartition

if TYPE_CHECKING:
    from pylog.clock import Clock
    from pylog.partition.cleaner import CleanResult
    from pylog.partition.log import HandleBudget, RecoveryReport
    from pylog.partition.remote import RemoteSegments
    from pylog.partition.segment import MapCache
    from pylog.transactions import TxnDecisions

__all__ = ["Topic", "TopicEnv"]

_DEFAULT: Any = object()


def msgpack_value(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


@dataclass
class _TableScan:
    """One partition read for :meth:`Topic.table`: its batches below the last stable offset, whether each is
    hidden (aborted, or a control batch), and the span ``(first, next)`` of each committed transaction in it."""

    batches: list[DecodedBatch]
    hidden: list[bool]
    stable: int
    spans: dict[tuple[int, int, int], tuple[int, int]]
    start: int = 0  # the log start: records below it in the first batch were deleted (delete_records)


def _table_scan(plog: PartitionLog, visibility: Visibility | None) -> _TableScan:
    """Read ``plog`` from its start: every batch below its first open transaction (all of them without
    ``visibility``), and the headers of the batches after it for the committed transactions' spans."""
    scan = _TableScan([], [], -1, {})
    offset, end = plog.log_start_offset, plog.log_end_offset
    scan.start = offset
    while offset < end:
        chunk = plog.read_raw(offset, 8 << 20)
        if not chunk:
            break
        for buf, at in chunk:
            if scan.stable >= 0:  # past the last stable offset: only the committed transactions' spans
                h = decode_header(buf, at)
                if visibility is not None and visibility.classify(h) == VISIBLE and h.attributes & _TXN:
                    _span(scan, h)
                offset = h.next_offset
                continue
            b = decode_batch(buf, at)
            verdict = visibility.classify(b.header) if visibility is not None else VISIBLE
            if verdict == OPEN:
                scan.stable = b.header.base_offset  # the last stable offset: nothing after it is visible yet
                offset = b.header.next_offset
                continue
            scan.batches.append(b)
            scan.hidden.append(verdict != VISIBLE)
            if verdict == VISIBLE and b.header.attributes & _TXN:
                _span(scan, b.header)
            offset = b.header.next_offset
    if scan.stable < 0:
        scan.stable = offset
    return scan


def _span(scan: _TableScan, h: BatchHeader) -> None:
    key = (h.producer_id, h.producer_epoch, h.base_sequence)
    first, _ = scan.spans.get(key, (h.base_offset, 0))
    scan.spans[key] = (first, h.next_offset)


def _table_apply(scan: _TableScan, cut: int, out: dict[bytes, bytes]) -> None:
    """Apply the latest record of every key of ``scan``'s batches below offset ``cut`` to ``out`` (a
    tombstone deletes its key; hidden batches are skipped)."""
    n = bisect.bisect_left([b.header.base_offset for b in scan.batches], cut)
    batches, hidden = scan.batches[:n], scan.hidden[:n]
    if not batches:
        return
    counts = [len(b.offsets) for b in batches]
    shown = ~np.repeat(np.array(hidden, dtype=np.bool_), counts)
    if batches[0].header.base_offset < scan.start:
        shown &= np.concatenate([b.offsets for b in batches]) >= scan.start
    mask = latest_mask(batches, shown)
    at = 0
    for b, count in zip(batches, counts, strict=True):
        idx = np.flatnonzero(mask[at : at + count])
        at += count
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
        # not under self._lock: callers hold the log's lock, which partition() takes inside this one
        self.config = config
        for number, plog in list(self._partitions.items()):
            plog.config = config
            if plog.remote is None and self.env.remote is not None:
                # tiered storage turned on: the segments it uploads and then deletes locally are read from
                # the object store from now on, as in a partition opened after the change
                plog.remote = self.env.remote(self.name, number, config)

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
        """The state of a transaction, for the cleaner: an open one past its timeout is aborted first (by a
        writable log; a read-only one answers from the decisions as they are)."""
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
        atomic: bool = True,
    ) -> dict[Any, Any]:
        """The stream-table view: the latest value of every key, read from the beginning of every partition
        (a tombstone removes its key; for a key in several partitions the highest partition wins). Values are
        msgpack-decoded unless ``value_deserializer`` says otherwise (``None``: raw bytes); keys are bytes
        unless ``key_deserializer`` is given.

        ``isolation_level="read_committed"`` ignores records of aborted transactions and shows committed
        transactions whole: each partition is read up to its first open transaction (its last stable offset,
        as a read_committed consumer reads it), and further down to the first batch of any committed
        transaction that a partition's stop would otherwise cut in two (it wrote past that stop somewhere), so
        that a transaction over several partitions is in the table entirely or not at all
        (:func:`~pylog.partition.visibility.consistent_cut`); what follows such a stop in its partition shows
        once the open transaction is decided. ``atomic=False`` keeps each partition's own last stable offset
        (Kafka's per-partition rule: a committed transaction may then show in one partition and not yet in
        another). Transactions count as decided as they were when the call began (a commit during the read
        shows at the next call, whole). Compaction never changes this view. The latest record of each key is found with
        numpy over whole columns (:mod:`pylog.partition.keymap`): only the surviving keys and values become
        Python objects."""
        if isolation_level not in ("read_uncommitted", "read_committed"):
            raise ConfigError(
                f"isolation_level must be read_uncommitted or read_committed, got {isolation_level!r}"
            )
        if not isinstance(atomic, bool):
            raise ConfigError(f"atomic must be a bool, got {atomic!r}")
        visibility = None
        if isolation_level == "read_committed":
            txns = self.env.txn_decisions()
            txns.abort_expired(self.env.clock.time_ms())  # those past their timeout: aborted, not open
            visibility = Visibility(txns.frozen_status())  # decided before any partition is read
        scans = [_table_scan(self.partition(p), visibility) for p in range(self.num_partitions)]
        cut = {p: scan.stable for p, scan in enumerate(scans)}
        if visibility is not None and atomic:
            spans: dict[tuple[int, int, int], dict[int, tuple[int, int]]] = {}
            for p, scan in enumerate(scans):
                for txn, span in scan.spans.items():
                    spans.setdefault(txn, {})[p] = span
            cut = consistent_cut(cut, spans.values())
        latest: dict[bytes, bytes] = {}
        for p, scan in enumerate(scans):
            _table_apply(scan, cut[p], latest)
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
        """Partitions with start/end offsets, segment count and bytes (what ``kafka-topics --describe`` shows);
        for a tiered partition (or a log opened from its URL) the whole log's, and the local and remote parts
        (:func:`pylog.partition.remote.describe` lists the fields)."""
        parts = []
        for p in range(self.num_partitions):
            plog = self.partition(p)
            info = describe_partition(plog.segments, plog.remote)
            if plog.remote is None:  # delete_records may have moved it past the first segment's base offset
                info["log_start_offset"] = plog.log_start_offset
            parts.append({"partition": p, **info})
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
