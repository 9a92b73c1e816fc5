"""SegmentList: the ordered segments of one partition, their base offsets and the layout epoch.

Every change to which segment files make up a partition goes through one of its methods (Kafka's
``LogSegments``, zowens/commitlog's ``FileSet``): loading the layout from the directory, a roll
(:meth:`SegmentList.append_segment`), retention (:meth:`SegmentList.remove_oldest`), compaction
(:meth:`SegmentList.replace`), truncation (:meth:`SegmentList.truncate`) and recovery
(:meth:`SegmentList.reset`). Its invariants:

- segments are sorted by base offset, without duplicates; the last one is the active segment (the one appends
  go to), and once a layout is loaded there is at least one;
- ``bases[i] == segments[i].base_offset`` at all times (reads find a segment by bisecting ``bases``);
- ``epoch`` (the ``layout_epoch`` published in ``partition.state``) grows by one with every change of the list
  or of the file behind one of its segments, so that other processes and threads know to reload the layout.

Thread-safety: not thread-safe. Its :class:`~pylog.partition.log.PartitionLog` changes it only while holding
its thread lock and the partition's file lock (:meth:`PartitionLog.locked_for_write`), and publishes the new
epoch in the shared state before anyone else can see the change.

Crash contract: it holds no file of its own and writes nothing; the files behind its segments follow the
rules of :mod:`pylog.partition.segment` and :mod:`pylog.partition.recovery` (segments are created before they
are published, and removed or rewritten two-phase after the layout that no longer names them is published).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import overload

from pylog.partition.segment import MapCache, Segment

__all__ = ["SegmentList"]


class SegmentList:
    """The ordered segments of the partition in ``directory`` (maps of their files bounded by ``cache``).

    ``dense`` is the default for segments it creates: offsets follow each other without gaps (a partition
    that is not compacted)."""

    def __init__(self, directory: str, cache: MapCache, *, dense: bool) -> None:
        self.directory = directory
        self.cache = cache
        self.dense = dense
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self.epoch = -1

    # -- reading -----------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._segments)

    def __iter__(self) -> Iterator[Segment]:
        return iter(self._segments)

    @overload
    def __getitem__(self, i: int) -> Segment: ...

    @overload
    def __getitem__(self, i: slice) -> list[Segment]: ...

    def __getitem__(self, i: int | slice) -> Segment | list[Segment]:
        return self._segments[i]

    def __repr__(self) -> str:
        return f"SegmentList({self._segments!r}, epoch={self.epoch})"

    @property
    def active(self) -> Segment:
        """The last segment, the one appends go to."""
        return self._segments[-1]

    def index_for(self, offset: int) -> int:
        """Index of the segment that holds ``offset`` (the last one whose base offset is at most it; 0 when
        ``offset`` lies before the first)."""
        return max(bisect.bisect_right(self._bases, offset) - 1, 0)

    def by_base(self) -> dict[int, Segment]:
        return dict(zip(self._bases, self._segments, strict=True))

    def new_segment(self, base_offset: int, *, dense: bool | None = None) -> Segment:
        """A segment object for the files at ``base_offset`` (not yet in the list; no file is created)."""
        return Segment(self.directory, base_offset, self.cache, dense=self.dense if dense is None else dense)

    def find_run(self, olds: Sequence[Segment]) -> list[Segment] | None:
        """The segments now in the list that are the sealed run ``olds`` (same base offsets, files and sizes),
        or None when the run changed since ``olds`` were taken (retention, truncation, another cleaner). A
        run that now reaches the active segment has changed too: truncation made one of its segments the
        active one, and the active segment is never rewritten."""
        base = olds[0].base_offset
        sealed = self._bases[:-1]
        i = sealed.index(base) if base in sealed else -1
        group = self._segments[:-1][i : i + len(olds)] if i >= 0 else []
        if [_identity(s) for s in group] != [_identity(s) for s in olds]:
            return None
        return group

    # -- changing ----------------------------------------------------------------------------------------

    def reset(self, segments: list[Segment], epoch: int | None = None) -> None:
        """Take ``segments`` as the whole layout: at ``epoch`` when it was read from the shared state, else
        (recovery) at an epoch above every one this list had."""
        self._segments = list(segments)
        self._bases = [s.base_offset for s in segments]
        self.epoch = max(self.epoch, 0) + 1 if epoch is None else epoch

    def append_segment(self, segment: Segment) -> None:
        """A roll: ``segment`` becomes the active one."""
        if self._segments and segment.base_offset <= self._bases[-1]:
            raise ValueError(f"segment {segment.base_offset} does not follow {self._bases[-1]}")
        self._segments.append(segment)
        self._bases.append(segment.base_offset)
        self.epoch += 1

    def remove_oldest(self, n: int) -> list[Segment]:
        """Retention: take the ``n`` oldest segments out (never the active one) and return them; the caller
        deletes their files once the new layout is published."""
        n = min(n, len(self._segments) - 1)
        doomed = self._segments[:n]
        if doomed:
            self._segments = self._segments[n:]
            self._bases = self._bases[n:]
            self.epoch += 1
        return doomed

    def replace(self, group: list[Segment], fresh: Segment) -> None:
        """Compaction: the consecutive segments ``group`` (from :meth:`find_run`) were rewritten as ``fresh``,
        named by the first one's base offset."""
        i = next(k for k, s in enumerate(self._segments) if s is group[0])
        if fresh.base_offset != group[0].base_offset or self._segments[i : i + len(group)] != group:
            raise ValueError("replace() takes a run of the list and a segment with its base offset")
        self._segments[i : i + len(group)] = [fresh]
        self._bases[i : i + len(group)] = [fresh.base_offset]
        self.epoch += 1

    def truncate(self, offset: int) -> list[Segment]:
        """Truncation to ``offset``: take out every segment but the first whose base offset is at or above it
        and return them (the caller deletes their files). The epoch moves even when none goes: the caller
        also rewrites the file of the segment that becomes the active one."""
        cut = len(self._segments)
        while cut > 1 and self._bases[cut - 1] >= offset:
            cut -= 1
        gone = self._segments[cut:][::-1]  # the newest first, as they are deleted
        del self._segments[cut:]
        del self._bases[cut:]
        self.epoch += 1
        return gone

    def bump_epoch(self) -> None:
        """The file behind a segment changed without the list changing (the active segment was rescanned
        after a writer died mid-publish)."""
        self.epoch += 1

    def release(self, segment: Segment) -> None:
        """Close ``segment``'s descriptors and maps and forget it in the map cache."""
        segment.close_fd()
        segment.drop_map()
        self.cache.forget(segment)


def _identity(seg: Segment) -> tuple[int, int | None, int]:
    return seg.base_offset, seg.ino, seg.size
