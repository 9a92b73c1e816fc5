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

A streaming source never reports an end offset past a partition's LSO, so the records of a transaction still
open are read in a later micro-batch once it commits (or skipped once it aborts), never lost. Spark's reader is
read-only: a transaction open past its timeout keeps holding it at the LSO until a pylog client (a
read_committed consumer, the producer's restart, ``Topic.compact``) records the abort, where pylog's
consumer aborts it itself.
"""

from __future__ import annotations

from collections.abc import Iterator

from pylog.partition.visibility import Committed, Visibility
from pylog.record import BatchHeader
from pylog.spark.options import OffsetRange
from pylog.spark.snapshot import PartitionView, walk
from pylog.transactions import TxnDecisions

__all__ = ["committed_range", "visibility"]


def visibility(path: str) -> Visibility:
    """The rule over the decisions of the log at ``path``, for one planning step (statuses cached)."""
    return Visibility(TxnDecisions(path).status)


def committed_range(view: PartitionView, rng: OffsetRange, rule: Visibility) -> OffsetRange:
    """``rng`` as a read_committed read sees it: ending at the LSO at most, with its skipped offsets."""
    if rng.size <= 0:
        return rng
    found: Committed = rule.committed(_headers(view, rng.start, rng.end), rng.start, rng.end)
    return OffsetRange(rng.topic, rng.partition, rng.start, found.end, found.skipped)


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
