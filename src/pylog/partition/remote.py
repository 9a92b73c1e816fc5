"""Remote segments: a source of sealed segments below the local log start, and how a partition reads them.

A partition of a topic with ``remote_storage_enable`` may have segments that live only in an object store
(tiered storage: the local copies were deleted after their upload). The partition layer cannot import the
object-store code (it sits above this one), so it names what it needs as a Protocol, :class:`RemoteSegments`,
which :mod:`pylog.tiered.fetch` implements and the log directory hands to each partition of such a topic.

The source only lists segments (from the newest remote manifest) and returns bytes of them; everything a
read checks is done here, with the same code as a local read:

- the position of an offset comes from the segment's offset index (a hint: the batch there must carry the
  entry's offset, else the walk starts at the segment's first byte), so only the needed byte range is fetched;
- every batch header is decoded and bounds-checked by :func:`pylog.record.decode_header` (as every header
  walk of pylog does), every base offset must continue the one before it exactly (remote topics are never
  compacted, so their segments are dense), and a segment must end at the offset its manifest names;
- the batches are returned undecoded, as ``(buffer, position)`` pairs, exactly as a local read returns them:
  whoever decodes them (:func:`pylog.record.decode_batch`, :func:`pylog.record.decode_lists`) checks the
  CRC, so a flipped bit in a remote object is a :class:`~pylog.errors.CorruptRecordError`, never a wrong
  record.

Thread-safety: the functions hold no state; a source states its own (the tiered one is thread-safe).
Crash contract: nothing here writes anything.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from pylog.errors import CorruptRecordError, OffsetOutOfRangeError, StorageError, UnsupportedFormatError
from pylog.record import HEADER_SIZE, BatchHeader, decode_batch, decode_header

__all__ = [
    "RemoteSegment",
    "describe",
    "RemoteSegments",
    "offset_for_time",
    "read_raw",
    "segment_at",
]

Buffer = memoryview | bytes

_I32 = struct.Struct("<i")
_BATCH_LENGTH_AT = 8  # the batch_length field of the header (pylog.record's byte table)
MIN_READ = 64 << 10  # a read fetches at least this many bytes (one request for many small batches)


class RemoteSegment(Protocol):
    """One sealed segment in the object store, as its manifest names it."""

    @property
    def base_offset(self) -> int: ...

    @property
    def next_offset(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def max_timestamp(self) -> int: ...

    @property
    def key(self) -> str: ...


class RemoteSegments(Protocol):
    """A source of sealed segments below the local log start (or of all segments, when ``standalone``: a
    log opened read-only from the object store has no local segments at all)."""

    @property
    def standalone(self) -> bool: ...

    def segments(self, *, refresh: bool = False) -> Sequence[RemoteSegment]:
        """The remote segments, ascending and contiguous (possibly none). ``refresh`` reads the newest
        manifest now; otherwise a recently read one may be returned."""
        ...

    def read(self, segment: RemoteSegment, start: int, length: int) -> Buffer:
        """Bytes ``[start, start + length)`` of ``segment``'s ``.log`` object (clamped to its size)."""
        ...

    def offset_index(self, segment: RemoteSegment) -> np.ndarray[Any, Any]:
        """The segment's offset index entries (``pylog.partition.index.OFFSET_ENTRY``), empty if none."""
        ...

    def time_index(self, segment: RemoteSegment) -> np.ndarray[Any, Any]:
        """The segment's time index entries (``pylog.partition.index.TIME_ENTRY``), empty if none."""
        ...


def describe(local: Sequence[Any], remote: RemoteSegments | None) -> dict[str, Any]:
    """What :meth:`Topic.describe <pylog.topic.Topic.describe>` shows of a partition whose local segments are
    ``local`` (objects with ``base_offset``, ``next_offset``, ``size``) and whose remote source is ``remote``.

    ``log_start_offset`` and ``log_end_offset`` are the whole log's (as ``beginning_offsets`` and
    ``end_offsets``), ``segments`` and ``bytes`` the segments holding it: the local ones plus the remote ones
    wholly below the local log start (a segment both uploaded and still local counts once). With a remote
    source, also ``local_log_start_offset``, ``local_segments``, ``local_bytes`` (what is on disk; None, 0, 0
    for a log opened from its URL) and ``remote_log_start_offset``, ``remote_log_end_offset`` (None when the
    manifest names no segment), ``remote_segments``, ``remote_bytes`` (what the newest manifest names: bytes
    tiered). A store that cannot be read leaves the remote fields None and adds ``remote_error``; for a log
    opened from its URL it raises."""
    standalone = remote is not None and remote.standalone
    mine = [] if standalone else list(local)
    local_start = mine[0].base_offset if mine else None
    out: dict[str, Any] = {
        "log_start_offset": local_start if local_start is not None else 0,
        "log_end_offset": mine[-1].next_offset if mine else 0,
        "segments": len(mine),
        "bytes": sum(s.size for s in mine),
    }
    if remote is None:
        return out
    out.update(local_log_start_offset=local_start, local_segments=len(mine), local_bytes=out["bytes"])
    try:
        found = list(remote.segments())
    except StorageError as exc:
        if standalone:
            raise
        none = dict.fromkeys(
            ("remote_log_start_offset", "remote_log_end_offset", "remote_segments", "remote_bytes")
        )
        out.update(none, remote_error=str(exc))
        return out
    below = [s for s in found if local_start is None or s.next_offset <= local_start]
    if found:
        out["log_start_offset"] = (
            found[0].base_offset if local_start is None else min(found[0].base_offset, local_start)
        )
    if not mine and found:
        out["log_end_offset"] = found[-1].next_offset
    out["segments"] += len(below)
    out["bytes"] += sum(s.size for s in below)
    out.update(
        remote_log_start_offset=found[0].base_offset if found else None,
        remote_log_end_offset=found[-1].next_offset if found else None,
        remote_segments=len(found),
        remote_bytes=sum(s.size for s in found),
    )
    return out


def segment_at(segments: Sequence[RemoteSegment], offset: int) -> int:
    """Index of the segment holding ``offset`` (-1 if it lies outside every segment)."""
    i = bisect.bisect_right([s.base_offset for s in segments], offset) - 1
    if i < 0 or offset >= segments[i].next_offset:
        return -1
    return i


def read_raw(
    source: RemoteSegments, offset: int, max_bytes: int
) -> tuple[list[tuple[Buffer, int]], int] | None:
    """Undecoded batches from the one holding ``offset`` on, about ``max_bytes`` of them (at least one),
    within the remote segments, and the offset after the last one. None when ``offset`` is at or past the
    remote log end (the caller reads on locally). :class:`OffsetOutOfRangeError` below the remote log start."""
    segments = source.segments()
    i = segment_at(segments, offset)
    # A log read from the object store alone, asked for an offset at or past its remote end (a consumer
    # caught up, polling), sees new uploads when the source's recently read manifest expires: reading the
    # manifest again on every poll would send one request per partition per poll. Otherwise the manifest is
    # read now: the offset may be in a newer one (uploaded since), or gone from it (dropped by retention).
    caught_up = source.standalone and (not segments or offset >= segments[-1].next_offset)
    if i < 0 and not caught_up:
        segments = source.segments(refresh=True)
        i = segment_at(segments, offset)
    if i < 0:
        if segments and offset < segments[0].base_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is below the remote log start {segments[0].base_offset}"
            )
        return None
    out: list[tuple[Buffer, int]] = []
    total = 0
    nxt = offset
    for seg in segments[i:]:
        first = not out
        for buf, at, h in _batches(source, seg, offset if first else seg.base_offset, max_bytes - total):
            if h.last_offset < offset:
                continue
            out.append((buf, at))
            total += h.batch_length
            nxt = h.next_offset
            if total >= max_bytes:
                return out, nxt
    return out, nxt


def offset_for_time(source: RemoteSegments, timestamp: int) -> tuple[int, int] | None:
    """The earliest ``(offset, timestamp)`` of the remote segments whose timestamp is >= ``timestamp``."""
    for seg in source.segments():
        if 0 <= seg.max_timestamp < timestamp:
            continue
        start = seg.base_offset
        entries = source.time_index(seg)
        if len(entries):
            below = int(np.searchsorted(entries["ts"], timestamp, side="left")) - 1
            if below >= 0:  # batches before the indexed one of the last entry < timestamp hold smaller ones
                start = seg.base_offset + int(entries["rel"][below])
        for buf, at, h in _batches(source, seg, start, 1 << 62):
            if h.max_timestamp >= timestamp:
                b = decode_batch(buf, at)
                hits = (b.timestamps >= timestamp).nonzero()[0]
                if len(hits):
                    k = int(hits[0])
                    return int(b.offsets[k]), int(b.timestamps[k])
    return None


def _batches(
    source: RemoteSegments, seg: RemoteSegment, offset: int, budget: int
) -> Iterator[tuple[Buffer, int, BatchHeader]]:
    """``(buffer, position, header)`` of the batches of ``seg`` from the indexed one at or before ``offset``
    on, reading about ``budget`` bytes at a time; every base offset checked against its predecessor."""
    pos, expected = _index_floor(source, seg, offset)
    walk = _walk(source, seg, pos, expected, budget)
    try:
        first = next(walk, None)
    except CorruptRecordError:
        if pos == 0:
            raise
        # the index pointed at something that is not the batch it names: walk from the first byte
        yield from _walk(source, seg, 0, seg.base_offset, budget)
        return
    if first is not None:
        yield first
        yield from walk


def _index_floor(source: RemoteSegments, seg: RemoteSegment, offset: int) -> tuple[int, int]:
    """``(position, base offset)`` of the greatest indexed batch at or before ``offset`` (the first batch if
    the index has none or does not check)."""
    entries = source.offset_index(seg)
    i = (
        int(np.searchsorted(entries["rel"], offset - seg.base_offset, side="right")) - 1
        if len(entries)
        else -1
    )
    if i < 0:
        return 0, seg.base_offset
    pos = int(entries["pos"][i])
    if pos >= seg.size:
        return 0, seg.base_offset
    return pos, seg.base_offset + int(entries["rel"][i])


def _walk(
    source: RemoteSegments, seg: RemoteSegment, pos: int, expected: int, budget: int
) -> Iterator[tuple[Buffer, int, BatchHeader]]:
    size = seg.size
    want = max(budget, MIN_READ)
    buf: Buffer = b""
    shift = pos  # file position p is buf[p - shift]
    while pos < size:
        at = pos - shift
        if at + HEADER_SIZE > len(buf):
            buf, shift = _fetch(source, seg, pos, max(want, HEADER_SIZE)), pos
            at = 0
            if len(buf) < HEADER_SIZE:
                raise _corrupt(seg, pos, "truncated batch header")
        length = _I32.unpack_from(buf, at + _BATCH_LENGTH_AT)[0]
        if length >= HEADER_SIZE and pos + length <= size and at + length > len(buf):
            buf, shift = _fetch(source, seg, pos, max(want, length)), pos
            at = 0
        try:
            h = decode_header(buf, at, min(len(buf), size - shift))
        except CorruptRecordError as exc:
            raise _corrupt(seg, pos, str(exc)) from exc
        except UnsupportedFormatError as exc:
            raise UnsupportedFormatError(f"remote segment {seg.key}: {exc}") from exc
        if h.base_offset != expected:
            raise _corrupt(seg, pos, f"batch has base offset {h.base_offset}, expected {expected}")
        yield buf, at, h
        expected = h.next_offset
        pos += h.batch_length
    if expected != seg.next_offset:
        raise _corrupt(seg, pos, f"segment ends at offset {expected}, its manifest says {seg.next_offset}")


def _fetch(source: RemoteSegments, seg: RemoteSegment, pos: int, length: int) -> Buffer:
    want = min(length, seg.size - pos)
    buf = source.read(seg, pos, want)
    if len(buf) < want:
        raise _corrupt(seg, pos, f"object holds {pos + len(buf)} bytes, its manifest says {seg.size}")
    return buf


def _corrupt(seg: RemoteSegment, pos: int, what: str) -> CorruptRecordError:
    return CorruptRecordError(
        f"corrupt batch in remote segment {seg.key} at position {pos}: {what}", path=seg.key, position=pos
    )
