"""Transaction visibility: the one rule of what a ``read_committed`` reader sees (Kafka's isolation levels).

A transaction's records are written to their partitions as they are sent, in batches with the transactional
attribute bit and ``(producer_id, producer_epoch, base_sequence)`` in the header, where pylog stores the
transaction's number in ``base_sequence`` (:mod:`pylog.transactions`). Its outcome is not in the partition: it
is asked of a *status function* ``(producer_id, producer_epoch, txn) -> "committed" | "aborted" | "open"``
(:meth:`pylog.transactions.TxnLog.status`, or statuses resolved earlier and shipped, as Spark's planner does),
which this module takes as an argument, so that the partition layer (the cleaner) can use the rule too.

The rule, per batch, in offset order (Kafka's ``read_committed``, ``KafkaConsumer`` javadoc and KIP-98):

========================================  ============  ================================================
batch                                     verdict       a read_committed reader
========================================  ============  ================================================
not transactional, not control            ``VISIBLE``   returns its records
transactional, transaction committed      ``VISIBLE``   returns its records
transactional, transaction aborted        ``ABORTED``   skips it (aborted records are never returned)
transactional, transaction still open     ``OPEN``      stops before it: its base offset is the last
                                                        stable offset (LSO); nothing at or after it is
                                                        returned until the transaction is decided
control batch (of a decided transaction)  ``CONTROL``   skips it (control records are never returned)
========================================  ============  ================================================

Reading stops at the FIRST open batch even when decided batches follow it, so that a reader returns records in
offset order and never has to go back: the records of a transaction still open are read once it commits (or
skipped once it aborts), never lost. pylog itself writes no control batches (its commit and abort markers are
the records of ``__transactions/decisions.log``); the verdict exists so that a batch with the control bit is
never handed to an application. ``read_uncommitted`` readers do not apply this rule: they return every batch.

A transaction open past its ``transaction_timeout_ms`` is still "open" to the status function: it becomes
aborted when :meth:`~pylog.transactions.TxnLog.abort_expired` records the abort. A :class:`Visibility` may be
given an ``expire`` callback, called when a batch's transaction is open; if it returns True (it aborted
something) the status is asked again. The consumer passes one that runs ``abort_expired`` at most once per
second of its clock; :meth:`pylog.topic.Topic.compact` and :meth:`~pylog.topic.Topic.table` check expiry inside
their status function; Spark's planner is read-only and passes none (an expired transaction holds its readers
at the LSO until a pylog client aborts it).

Statuses are cached for the life of a :class:`Visibility` object: make one per read (or cleaning pass). A
decided status never changes, so the cache can only be stale for an "open" one, and a read stops there anyway.

Thread-safety: a :class:`Visibility` is not thread-safe (its cache is a plain dict); it is meant for one read.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

from pylog.record import ATTR_CONTROL, ATTR_TRANSACTIONAL, BatchHeader

__all__ = [
    "ABORTED",
    "CONTROL",
    "OPEN",
    "VISIBLE",
    "Committed",
    "HasHeader",
    "TxnStatus",
    "Visibility",
    "consistent_cut",
    "is_skipped",
]

#: ``(producer_id, producer_epoch, txn) -> "committed" | "aborted" | "open"`` (:meth:`TxnLog.status`).
TxnStatus = Callable[[int, int, int], str]

VISIBLE: Final = "visible"
ABORTED: Final = "aborted"
OPEN: Final = "open"
CONTROL: Final = "control"

_MARKED: Final = ATTR_TRANSACTIONAL | ATTR_CONTROL


class HasHeader(Protocol):
    """A decoded batch (:class:`~pylog.record.DecodedBatch`, :class:`~pylog.record.RecordLists`)."""

    @property
    def header(self) -> BatchHeader: ...


_B = TypeVar("_B", bound=HasHeader)


@dataclass(frozen=True, slots=True)
class Committed:
    """What a read_committed reader may return of the batches from ``start`` on (Kafka's fetch response:
    the aborted transactions and the last stable offset).

    ``end``: where reading stops: the base offset of the first batch of an open transaction (the LSO), or the
    end of what was scanned. ``skipped``: the offset ranges ``[first, next)`` of aborted and control batches in
    ``[start, end)``, in order, adjacent ones merged. Both are plain ints: picklable and JSON-able."""

    end: int
    skipped: tuple[tuple[int, int], ...]


class Visibility:
    """The rule of the module docstring, over one status function, with statuses cached for one read."""

    def __init__(self, status: TxnStatus, expire: Callable[[], bool] | None = None) -> None:
        self._status = status
        self._expire = expire
        self._cache: dict[tuple[int, int, int], str] = {}

    def status(self, producer_id: int, producer_epoch: int, txn: int) -> str:
        """The (cached) status of a transaction; an open one is asked again after ``expire`` aborted some."""
        key = (producer_id, producer_epoch, txn)
        found = self._cache.get(key)
        if found is None:
            found = self._status(*key)
            if found == "open" and self._expire is not None and self._expire():
                found = self._status(*key)
            self._cache[key] = found
        return found

    def classify(self, h: BatchHeader) -> str:
        """``VISIBLE``, ``ABORTED``, ``OPEN`` or ``CONTROL`` for the batch with header ``h``."""
        attributes = h.attributes
        if not attributes & _MARKED:
            return VISIBLE
        if attributes & ATTR_TRANSACTIONAL:
            state = self.status(h.producer_id, h.producer_epoch, h.base_sequence)
            if state == "open":
                return OPEN
            if state == "aborted":
                return ABORTED
        return CONTROL if attributes & ATTR_CONTROL else VISIBLE

    def visible(self, batches: Iterable[_B]) -> tuple[list[_B], int | None]:
        """The batches a read_committed reader returns of ``batches`` (consecutive, in offset order): those
        before the first open one, aborted and control ones left out. Second: when none is returned but some
        were skipped, the offset after the last skipped one (where the reader's position moves to); else None."""
        out: list[_B] = []
        skip_to = None
        for b in batches:
            verdict = self.classify(b.header)
            if verdict == OPEN:
                break
            if verdict == VISIBLE:
                out.append(b)
            else:
                skip_to = b.header.next_offset
        return out, (skip_to if not out else None)

    def committed(self, headers: Iterable[BatchHeader], start: int, end: int) -> Committed:
        """Scan ``headers`` (consecutive, in offset order) for the records in ``[start, end)``: where a
        read_committed read of them stops and which offsets it skips (see :class:`Committed`)."""
        skipped: list[tuple[int, int]] = []
        if start >= end:
            return Committed(end, ())
        for h in headers:
            if h.base_offset >= end:
                break
            if h.next_offset <= start:
                continue
            verdict = self.classify(h)
            if verdict == OPEN:
                return Committed(max(h.base_offset, start), tuple(skipped))
            if verdict != VISIBLE:
                lo, hi = max(h.base_offset, start), min(h.next_offset, end)
                if skipped and skipped[-1][1] >= lo:
                    skipped[-1] = (skipped[-1][0], hi)
                else:
                    skipped.append((lo, hi))
        return Committed(end, tuple(skipped))


def consistent_cut(
    stable: Mapping[int, int], spans: Iterable[Mapping[int, tuple[int, int]]]
) -> dict[int, int]:
    """The greatest cut (an end offset per partition) at or below ``stable`` (each partition's last stable
    offset) that splits no transaction: of each transaction in ``spans`` (its ``(first offset, offset after
    its last batch)`` in each partition it wrote to) either every batch lies below the cut in every partition,
    or none does. A read of every partition up to the cut shows each transaction whole or not at all.

    A transaction the cut splits (a batch at or past it in some partition) moves the cut of every partition
    it wrote to down to its first batch there; that may split others, which is followed until none is split.
    Cuts only move down, so each transaction is handled at most once: ``O(n log n)`` for ``n`` transactions.
    Pass the committed transactions (an open one lies past the stable offsets already; an aborted one is
    never shown)."""
    cut = dict(stable)
    txns = [dict(t) for t in spans]
    by_partition: dict[int, list[tuple[int, int]]] = {}  # partition -> (offset after its batches, txn)
    for n, txn in enumerate(txns):
        for p, (_, end) in txn.items():
            by_partition.setdefault(p, []).append((end, n))
    for entries in by_partition.values():
        entries.sort(reverse=True)  # the transactions a cut splits in a partition are a prefix of this order
    seen = dict.fromkeys(by_partition, 0)
    done: set[int] = set()
    todo = list(by_partition)
    while todo:
        p = todo.pop()
        entries, i = by_partition[p], seen[p]
        while i < len(entries) and entries[i][0] > cut[p]:
            n = entries[i][1]
            i += 1
            if n in done:
                continue
            done.add(n)
            for q, (first, _) in txns[n].items():
                if first < cut[q]:
                    cut[q] = first
                    todo.append(q)
        seen[p] = i
    return cut


def is_skipped(skipped: Sequence[tuple[int, int]], offset: int) -> bool:
    """Whether ``offset`` lies in one of the sorted, disjoint ranges ``skipped`` (of :class:`Committed`)."""
    i = bisect.bisect_right(skipped, (offset, 1 << 63)) - 1
    return i >= 0 and skipped[i][0] <= offset < skipped[i][1]
