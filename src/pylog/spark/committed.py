"""``kafka.isolation.level=read_committed`` for Spark reads: resolved by the driver, applied by the tasks.

What a read_committed read returns is decided by pylog's one visibility rule
(:mod:`pylog.partition.visibility`): records of aborted transactions and control batches are skipped, and
reading stops at the first batch of a transaction still open (the last stable offset, LSO).

Where the rule runs. When a query is planned (batch: ``partitions()``; streaming: ``latestOffset()`` and
``partitions()``), the planner reads the transaction decisions of the log directory with
:class:`~pylog.transactions.TxnDecisions` (read only: it creates, locks and changes no file), walks the batch
headers of each planned offset range and applies the rule. Each range then ends at the LSO at most and
carries the offset ranges of the batches to skip (:attr:`~pylog.spark.options.OffsetRange.skipped`), plain
ints shipped in the pickled input partition and in the JSON plan of the JVM reader: as Kafka's fetch response
carries the aborted transactions and the LSO to a consumer. The tasks, in Python (:mod:`pylog.spark.batches`)
or in the JVM (``SegmentReader``), then stay simple file readers that leave those batches out; they never
read the transaction log. Why the driver and not the tasks:

- one snapshot of the decisions for the whole query: every task (and a retried one) returns the same rows,
  whatever is decided meanwhile, and a streaming batch reads exactly the offsets its end offset promised;
- executors only need the segment files, and no Java copy of the decisions format or of the rule exists;
- the cost is a walk over batch headers at planning (64 bytes per batch, no payload read), only for
  read_committed reads. Decisions are final, so a range planned below the LSO never changes meaning.

A log in an object store (``load("s3://bucket/prefix")``, :mod:`pylog.spark.remote`): the planner reads the
transaction decisions tiered with the log (:class:`pylog.tiered.decisions.RemoteDecisions`, the newest
decisions manifest read once for the planning step) and walks the batches of each planned range in the
remote segments its view pinned (through the planner's block cache: there is no header-only ranged read, so
planning reads the range's bytes once). The store's decisions lag the writing log's by at most one tiering
pass: a transaction decided there but not uploaded yet is still open here, so the range ends before it (the
LSO) and a later query or micro-batch reads it; the rule never returns an aborted record nor skips a
committed one because of the lag.

A streaming source never reports an end offset past a partition's LSO, so the records of a transaction still
open are read in a later micro-batch once it commits (or skipped once it aborts), never lost. Spark's reader is
read-only: a transaction open past its timeout keeps holding it at the LSO until a pylog client (a
read_committed consumer, the producer's restart, ``Topic.compact``) records the abort, where pylog's
consumer aborts it itself.
"""

from __future__ import annotations

from collections.abc import Iterator

from pylog.errors import IllegalStateError
from pylog.partition.remote import read_raw
from pylog.partition.visibility import Committed, Visibility
from pylog.record import BatchHeader, decode_header
from pylog.spark.options import OffsetRange
from pylog.spark.remote import READ_BYTES, PinnedSegments, RemotePartitionView, is_url
from pylog.spark.snapshot import PartitionView, walk
from pylog.tiered.decisions import RemoteDecisions
from pylog.tiered.store import ObjectStore
from pylog.transactions import TxnDecisions

__all__ = ["committed_range", "visibility"]


def visibility(path: str) -> Visibility:
    """The rule over the decisions of the log at ``path`` (a directory, or an object-store URL), for one
    planning step (statuses cached)."""
    if is_url(path):
        return _StoreVisibility(path)
    return Visibility(TxnDecisions(path).status)


class _StoreVisibility(Visibility):
    """The rule of a log in an object store: statuses from the decisions tiered with it, read once for the
    planning step from the store of the first partition view it is applied to (:func:`committed_range`
    binds it; the views of one planning step share one store)."""

    def __init__(self, url: str) -> None:
        super().__init__(self._status_of)
        self.url = url
        self.decisions: RemoteDecisions | None = None

    def bind(self, store: ObjectStore) -> None:
        if self.decisions is None:
            self.decisions = RemoteDecisions(store, None)  # no clock: one snapshot, never re-read

    def _status_of(self, producer_id: int, producer_epoch: int, txn: int) -> str:
        if self.decisions is None:
            raise IllegalStateError(f"the read_committed rule of {self.url} was used before a view bound it")
        return self.decisions.status(producer_id, producer_epoch, txn)


def committed_range(view: PartitionView, rng: OffsetRange, rule: Visibility) -> OffsetRange:
    """``rng`` as a read_committed read sees it: ending at the LSO at most, with its skipped offsets."""
    if rng.size <= 0:
        return rng
    if isinstance(view, RemotePartitionView):
        if isinstance(rule, _StoreVisibility):
            rule.bind(view.store)
        headers = _remote_headers(view, rng.start, rng.end)
    else:
        headers = _headers(view, rng.start, rng.end)
    found: Committed = rule.committed(headers, rng.start, rng.end)
    return OffsetRange(rng.topic, rng.partition, rng.start, found.end, found.skipped)


def _remote_headers(view: RemotePartitionView, start: int, end: int) -> Iterator[BatchHeader]:
    """The headers of the batches holding offsets in ``[start, end)`` in the remote segments the view pinned,
    in order (read through the planner's cache, each batch's bounds checked by :func:`read_raw`)."""
    source = PinnedSegments(view.cache, view.topic, view.partition, view.remote_segments)
    offset = start
    while offset < end:
        got = read_raw(source, offset, READ_BYTES)
        if got is None:
            return
        batches, nxt = got
        for buf, at in batches:
            h = decode_header(buf, at, len(buf))
            if h.base_offset >= end:
                return
            yield h
        offset = max(nxt, offset + 1)


def _headers(view: PartitionView, start: int, end: int) -> Iterator[BatchHeader]:
    """The headers of the batches holding offsets in ``[start, end)``, in order (no payload is read)."""
    for seg in view.segments_for(start, end):
        try:
            buf = seg.view()
        except FileNotFoundError:
            continue  # deleted since the view was built: the task reports the data loss
        pos = seg.position_for(buf, start) if seg.base_offset < start else 0
        for _, h in walk(buf, pos, seg.size, seg.path):
            if h.base_offset >= end:
                return
            yield h
