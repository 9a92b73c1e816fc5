"""PartitionLog: the append-only, segmented log of one partition.

Thread-safety: thread-safe. An ``RLock`` serializes the threads of one process; the ``flock`` on
``partition.state`` serializes appending processes. Any number of processes may read and append to the same
partition directory; readers never block writers and never see a half-written batch (a batch is visible only
after the writer publishes the new size in the shared state). Every change takes the two locks in that order
and then catches up with what other processes published, in one place (:meth:`PartitionLog.locked_for_write`,
also used by the cleaner); the segment layout it changes is kept by a
:class:`~pylog.partition.segments.SegmentList`, the only code that changes the list of segments.

Crash contract:
- ``append`` returns after the batch was handed to the operating system (it survives a process kill);
  ``flush`` returns after fsync (it survives power loss). Concurrent flushes share one fsync (group commit).
- The recovery point (``recovery.checkpoint``) only moves to offsets that were fsynced. After an unclean
  shutdown everything at or after it is revalidated batch by batch (bounds, CRC, increasing offsets); a torn or
  junk tail there is truncated and the dropped bytes are reported. Corruption below it is never truncated.
- Every destructive change is two-phase: segments are deleted by renaming to ``.deleted`` first; truncation of
  published data writes a ``.cleaned`` copy, renames it to ``.swap``, then over the ``.log``.
"""

from __future__ import annotations

import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import NamedTuple, TypeVar

import numpy as np

from pylog import fs
from pylog.clock import Clock
from pylog.config import TopicConfig
from pylog.errors import (
    ConfigError,
    CorruptRecordError,
    InvalidOffsetError,
    LogClosedError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    UnknownTopicError,
    UnsupportedFormatError,
)
from pylog.partition import files
from pylog.partition.checkpoint import RecoveryCheckpoint
from pylog.partition.cleaner import CleanResult, TxnStatus, clean_partition
from pylog.partition.logstart import read_log_start, write_log_start
from pylog.partition.reader import walk_headers
from pylog.partition.recovery import RecoveryReport, recover_partition, rescan_active, truncate_segments
from pylog.partition.remote import RemoteSegments
from pylog.partition.remote import offset_for_time as remote_offset_for_time
from pylog.partition.remote import read_raw as remote_read_raw
from pylog.partition.segment import MapCache, Segment, inode_of
from pylog.partition.segments import SegmentList
from pylog.partition.state import FrozenState, PartitionState, Snapshot
from pylog.record import (
    ATTR_COMPRESSION_MASK,
    ATTR_CONTROL,
    ATTR_LOG_APPEND_TIME,
    ATTRIBUTES_AT,
    BASE_OFFSET_AT,
    BASE_TIMESTAMP_AT,
    BATCH_LENGTH_AT,
    CRC_AT,
    CRC_START,
    HEADER,
    HEADER_SIZE,
    LAST_DELTA_AT,
    BatchHeader,
    DecodedBatch,
    crc32c,
    decode_batch,
    decode_header,
)

__all__ = ["AppendInfo", "HandleBudget", "PartitionLog", "RecoveryReport"]

_MAX_REL = 0xFFFFFFFF
_I16, _I32, _U32, _I64 = struct.Struct("<h"), struct.Struct("<i"), struct.Struct("<I"), struct.Struct("<q")
_TIMESTAMPS = struct.Struct("<qq")
_SPLIT_WRITE_BYTES = 64 << 10  # batches from this size on are not copied to patch their base offset
#: an acknowledgement's flush fsyncs the active segment's indexes at most this often (see _flush_locked)
INDEX_SYNC_MS = 1000


class AppendInfo(NamedTuple):
    """Where an appended batch landed. ``log_append_time`` is -1 unless the topic uses LogAppendTime. (A
    tuple: built once per append, where a frozen dataclass cost a microsecond.)"""

    base_offset: int
    last_offset: int
    log_append_time: int


_STALE_LAYOUT_RETRIES = 3  # reloads of the layout when a segment file vanished under a read
_T = TypeVar("_T")


class HandleBudget:
    """Bounds how many partitions keep their files open (state map, lock and segment descriptors).

    Touching a partition marks it recently used; past ``max_open`` the least recently used idle partition is
    suspended (its descriptors closed) and reopens by itself on next use. A partition busy in another thread
    is skipped. Thread-safe."""

    def __init__(self, max_open: int = 200) -> None:
        self.max_open = max_open
        self._lru: OrderedDict[int, PartitionLog] = OrderedDict()
        self._lock = threading.Lock()
        self._last: PartitionLog | None = None

    def touch(self, plog: PartitionLog) -> None:
        if self._last is plog:  # already the most recently used (the common case: one busy partition)
            return
        with self._lock:
            self._last = plog
            key = id(plog)
            if key in self._lru:
                self._lru.move_to_end(key)
                return
            self._lru[key] = plog
            victims = []
            while len(self._lru) > self.max_open:
                _, old = self._lru.popitem(last=False)
                victims.append(old)
                if old is self._last:
                    self._last = None
        for old in victims:
            if not old.suspend():
                with self._lock:
                    self._lru[id(old)] = old

    def forget(self, plog: PartitionLog) -> None:
        with self._lock:
            self._lru.pop(id(plog), None)
            if plog is self._last:
                self._last = None

    def __len__(self) -> int:
        return len(self._lru)


class PartitionLog:
    """One partition's segments, offsets, appends, reads, rolls, flushes, retention and truncation."""

    def __init__(
        self,
        directory: str,
        topic: str,
        partition: int,
        config: TopicConfig,
        clock: Clock,
        cache: MapCache,
        *,
        recover: bool = False,
        clean_shutdown: bool = True,
        handles: HandleBudget | None = None,
        session: int = 0,
        read_only: bool = False,
        remote: RemoteSegments | None = None,
    ) -> None:
        if remote is not None and remote.standalone and not read_only:
            raise ConfigError("a partition without local segments (read from the object store) is read-only")
        self.directory = directory
        #: tiered storage: the source of this partition's segments in the object store (reads of offsets
        #: below the local log start go there), or None
        self.remote = remote
        self.topic = topic
        self.partition = partition
        self.config = config
        self.clock = clock
        self._lock = threading.RLock()
        self._flush_lock = threading.Lock()  # held by the thread running the shared fsync
        self._flush_done = threading.Condition(threading.Lock())  # notified when a shared fsync ends
        self._flushing = False
        # offsets may skip: the topic is compacted, or compaction cleaned this partition before its
        # cleanup_policy changed (a segment that was cleaned keeps its gaps)
        self.gapped = files.offsets_may_skip(directory, config.compacted)
        self._segments = SegmentList(directory, cache, dense=not self.gapped)
        self._write_locks = (_WriteLock(self, appending=False), _WriteLock(self, appending=True))
        self._seq_seen = -1
        self._closed = False
        self._unflushed_records = 0
        self._first_unflushed_ms = -1.0
        self._index_synced_ms = -1.0  # when an acknowledgement's flush last fsynced the indexes (-1: never)
        self._held_index = False  # a sealed segment has index entries a full disk held back
        self.flushed_offset = 0
        self._checkpointed = 0  # the recovery point as last written by this object (-1: not known)
        self.report = RecoveryReport()
        self.validated = False  # True when opening it rebuilt the shared state from the files (``report``)
        self._handles = handles
        self._suspended = False
        self._hint: tuple[int, int, int, int] | None = None
        self.read_only = read_only
        self.checkpoint = RecoveryCheckpoint(os.path.join(directory, files.CHECKPOINT))
        self._log_start = read_log_start(directory)  # set by delete_records; reloaded with the layout
        self._state: PartitionState | FrozenState
        if read_only:
            self._state = FrozenState(os.path.join(directory, files.STATE), self._snapshot_of_files())
            self._refresh()
        else:
            self._state = PartitionState(os.path.join(directory, files.STATE))
            if recover or (session and self._state.session != session) or not self._state.initialized:
                self._validate(recover, clean_shutdown, session)
            else:
                self._refresh()
        self.flushed_offset = self._checkpointed = self.checkpoint.read()

    def _snapshot_of_files(self) -> Snapshot:
        """For a read-only log: the partition as its files hold it, nothing written. The active segment is
        checked batch by batch (CRCs too) and ends at its last valid batch; a torn tail is ignored, not cut."""
        if self.remote is not None and self.remote.standalone:
            return Snapshot(0, 0, 0, 0, -1)  # no local directory: every segment is in the object store
        bases = files.live_segment_bases(fs.FS.listdir(self.directory))
        if not bases:
            return Snapshot(0, 0, 0, 0, -1)  # never used: its files would appear on first use
        seg = self._segments.new_segment(bases[-1])
        result = seg.scan(0, seg.file_size(), verify=True, index_interval=self.config.index_interval_bytes)
        seg.drop_map()
        return Snapshot(seg.next_offset, seg.base_offset, result.end, 0, seg.max_timestamp)

    def _validate(self, recover: bool, clean_shutdown: bool, session: int) -> None:
        """Rebuild the shared state from the files: always with ``recover``, else only if no process did so in
        this log ``session`` yet (the first user of a partition after a clean shutdown pays for it, not the
        opener of the log: see :mod:`pylog.log`). Re-checked under the partition lock, so one process does it.
        The session is compared first: a state file from an earlier session is not trusted at all (it is not
        durable, and after a power loss it may hold anything)."""
        self._state.lock()
        try:
            if recover or (session and self._state.session != session) or not self._state.initialized:
                self.report = recover_partition(self, clean_shutdown)
                self.validated = True
                if session:
                    self._state.stamp(session)
                return
        finally:
            self._state.unlock()
        self._refresh()  # another process validated it meanwhile

    # -- public properties ------------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        """The first offset of the log: of its remote segments when it has some below the local ones; past
        the first local segment's base offset, the one :meth:`delete_records` set."""
        if self.remote is None:
            with self._lock:
                self._refresh()
                return self._start_locked()
        local = self.local_log_start_offset
        segments = self.remote.segments()
        if self.remote.standalone:
            return segments[0].base_offset if segments else 0
        return min(segments[0].base_offset, local) if segments else local

    def _start_locked(self) -> int:
        """The log start offset (lock held): the first segment's base offset, or the larger offset
        :meth:`delete_records` set, at most the log end offset."""
        base = self._segments[0].base_offset
        if self._log_start <= base:
            return base
        return min(self._log_start, self._segments[-1].next_offset)

    @property
    def local_log_start_offset(self) -> int:
        """The first offset of the segments on the local disk."""
        with self._lock:
            self._refresh()
            return self._segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        if self.remote is not None and self.remote.standalone:
            segments = self.remote.segments()
            return segments[-1].next_offset if segments else 0
        with self._lock:
            self._refresh()
            return self._segments[-1].next_offset

    @property
    def recovery_point(self) -> int:
        return self.checkpoint.read()

    @property
    def segments(self) -> list[Segment]:
        with self._lock:
            self._refresh()
            return list(self._segments)

    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def __repr__(self) -> str:
        return f"PartitionLog({self.topic}-{self.partition})"

    # -- shared state -----------------------------------------------------------------------------------

    def _snapshot(self) -> Snapshot:
        active = self._segments[-1]
        return Snapshot(
            active.next_offset, active.base_offset, active.size, self._segments.epoch, active.max_timestamp
        )

    def _publish(self) -> None:
        active = self._segments[-1]
        self._seq_seen = self._state.publish_values(
            active.next_offset, active.base_offset, active.size, self._segments.epoch, active.max_timestamp
        )

    def _ready(self) -> None:
        """Check the partition is open, reopen its shared state if it was suspended, and mark it used."""
        if self._closed:
            raise LogClosedError(f"partition {self.topic}-{self.partition} is closed")
        if self._suspended:
            if not self.read_only:
                try:  # never created again: a missing state file means the partition was deleted
                    self._state = PartitionState(os.path.join(self.directory, files.STATE), create=False)
                except FileNotFoundError:
                    raise UnknownTopicError(
                        f"partition {self.topic}-{self.partition} was deleted (its topic was deleted by "
                        "another process or Log)"
                    ) from None
            self._suspended = False
        if self._handles is not None:
            self._handles.touch(self)

    def _refresh(self) -> None:
        """Bring the in-memory view up to what other processes (or threads) published."""
        self._ready()
        seq = self._state.seq
        if seq == self._seq_seen:
            return
        snap = self._state.read()
        if snap is None:  # a writer died while publishing: repair under the lock
            self._state.lock()
            try:
                if self._state.torn():
                    self._repair()
                snap = self._state.read()
            finally:
                self._state.unlock()
            if snap is None:
                raise CorruptRecordError(f"{self._state.path}: state cannot be read")
        self._apply(snap)
        self._seq_seen = seq

    def _apply(self, snap: Snapshot) -> None:
        if snap.layout_epoch != self._segments.epoch or not len(self._segments):
            self._load_layout(snap)
            return
        active = self._segments[-1]
        if active.size != snap.active_size:
            if active.size < snap.active_size:
                self._scan_tail(active, snap.active_size)
            else:
                self._load_layout(snap)

    def _scan_tail(self, seg: Segment, new_size: int) -> None:
        start = seg.size
        seg.size = new_size
        seg.scan(start, new_size, verify=False, index_interval=self.config.index_interval_bytes)

    def _load_layout(self, snap: Snapshot) -> None:
        """Bring the segment list in line with the directory. Another process may delete a listed segment
        (retention, compaction) before it is opened here: the directory is then listed again."""
        for _ in range(_STALE_LAYOUT_RETRIES):
            try:
                self._load_layout_once(snap)
                return
            except FileNotFoundError:
                continue
        self._load_layout_once(snap)

    def _load_layout_once(self, snap: Snapshot) -> None:
        if not self.gapped and files.offsets_may_skip(self.directory, self.config.compacted):
            # the topic became compacted after this partition was opened, and a cleaner (maybe in another
            # process, which leaves the marker before its first swap) may have removed offsets: from now on
            # base offsets are checked to increase, not to follow each other
            self.gapped = True
            self._segments.dense = False
            for listed_seg in self._segments:
                listed_seg.dense = False
        self.checkpoint.forget()  # a truncation elsewhere may have replaced the file
        self._checkpointed = -1  # ... and lowered the recovery point: the next flush writes it again
        standalone = self.remote is not None and self.remote.standalone
        listed = [] if standalone else fs.FS.listdir(self.directory)
        bases = files.live_segment_bases(listed, snap.active_base_offset)
        known = self._segments.by_base()
        segments: list[Segment] = []
        for i, base in enumerate(bases):
            last = i == len(bases) - 1
            size = snap.active_size if last else None
            seg = known.get(base)
            if seg is not None and seg.ino is not None and seg.ino != inode_of(seg.path):
                seg = None  # rewritten by compaction (a new file under the same name): open it afresh
            if seg is None and not last and _empty_file(files.segment_path(self.directory, base, files.LOG)):
                continue  # left by a roll that failed before publishing it: holds nothing
            if seg is not None and seg.unflushed is False and seg.fd is not None and not last:
                seg.close_fd()  # rolled by another process: this one no longer writes it
            want = size if size is not None else (seg.file_size() if seg is not None else 0)
            if seg is None or seg.size > want:
                seg = self._open_segment(base, size)
            elif seg.size < want:
                self._scan_tail(seg, want)
            segments.append(seg)
        for old in self._segments:
            if old not in segments:
                old.close_fd()
                old.drop_map()
        if not segments and self.read_only:
            segments = [self._segments.new_segment(0, dense=False)]  # never used: empty
        if not segments:
            raise CorruptRecordError(f"{self.directory}: no segment files")
        self._segments.reset(segments, snap.layout_epoch)
        self._log_start = read_log_start(self.directory)  # delete_records changes it with the layout epoch

    def _open_segment(self, base: int, size: int | None) -> Segment:
        """Open an existing segment: trust the published size, load (or rebuild in memory) its indexes, and
        find its end offset by scanning from the last indexed batch."""
        seg = self._segments.new_segment(base)
        interval = self.config.index_interval_bytes
        result = seg.load_trusted(seg.file_size() if size is None else size, interval)
        if result is None:
            result = seg.scan(0, seg.size, verify=False, index_interval=interval)
        elif (
            size is None and seg.index_pending
        ):  # sealed, its index files a prefix (a full disk held the rest)
            self._held_index = True  # the next flush writes the rest
        if result.error is not None:
            raise result.error
        return seg

    def _repair(self) -> None:
        """Re-derive the active segment's published size after a writer died mid-publish (lock held)."""
        rescan_active(self)
        self._segments.bump_epoch()
        self._state.reset(self._snapshot())

    # -- appending --------------------------------------------------------------------------------------

    def append(self, batch: bytes | bytearray) -> AppendInfo:
        """Append one encoded batch (built with base offset 0); returns where it landed.

        The base offset (outside the CRC, as in Kafka) is assigned here under the partition lock. For
        LogAppendTime topics the batch timestamps are set to the clock's time and the CRC recomputed.
        A ``bytes`` batch is not modified: a copy of its header is patched (of the whole batch when small). A
        small ``bytearray`` is handed over: it is patched in place, not copied.
        """
        if len(batch) > self.config.max_message_bytes:
            raise RecordTooLargeError(
                f"batch of {len(batch)} bytes exceeds max_message_bytes={self.config.max_message_bytes} "
                f"for topic {self.topic!r}"
            )
        if len(batch) < _SPLIT_WRITE_BYTES or self.config.log_append_time:
            buf, rest = (batch if type(batch) is bytearray else bytearray(batch)), None
        else:  # a large batch is written as its patched header and the rest as given, not copied
            view = memoryview(batch)
            buf, rest = bytearray(view[:HEADER_SIZE]), view[HEADER_SIZE:]
        with self.locked_for_write(appending=True):
            return self._append_locked(buf, rest)

    def locked_for_write(self, *, appending: bool = False) -> _WriteLock:
        """Hold the partition for a change (``with plog.locked_for_write() as segments:``): the thread lock,
        then the file lock (``flock`` on ``partition.state``), then catch up with what other processes
        published (repairing a torn publish). Gives the segment list, which the caller may change; it
        publishes the change with :meth:`publish` before the block ends. Every writer (append, roll,
        retention, truncation, the cleaner's swaps) goes through here, so the lock order is always thread
        lock, then file lock. Not reentrant (the file lock is released when the inner block ends).

        ``appending`` skips the lock-free catch-up before the file lock (the catch-up under it suffices) and
        refuses to go on when the partition's topic was deleted meanwhile (by another process or Log): an
        append there would be acknowledged into unlinked files and lost. The deleting process sets the
        deletion marker of ``partition.state`` under this file lock before it removes any file
        (:func:`~pylog.partition.state.mark_deleted`), so the check is a byte read of the shared map, not a
        system call."""
        return self._write_locks[appending]

    def publish(self) -> None:
        """Publish the segment list (its active segment's end and size, its layout epoch) in the shared state,
        where other processes and threads pick it up. Only inside :meth:`locked_for_write`."""
        self._publish()

    @property
    def segment_list(self) -> SegmentList:
        """The owner of the segment layout. Read it under the partition's locks; recovery (which runs with
        the file lock held, before any other thread has the partition) changes it through its methods."""
        return self._segments

    def reset_state(self) -> None:
        """Overwrite a torn or stale shared state with the in-memory layout (recovery, file lock held)."""
        self._state.reset(self._snapshot())
        self._seq_seen = self._state.seq

    def _sync_for_write(self) -> None:
        """With the lock held: repair a torn publish, then catch up with appends of other processes.

        Catching up scans the new batch headers into the in-memory indexes. Index entries follow one
        deterministic rule from the batch sequence, so entries derived here equal the ones the other writer
        wrote to the index files, and writing them again is idempotent."""
        seq = self._state.seq
        if seq & 1:  # torn: a writer died while publishing
            self._repair()
            seq = self._state.seq
        if seq != self._seq_seen:
            snap = self._state.read()
            if snap is not None:
                self._apply(snap)
                self._seq_seen = self._state.seq

    def _append_locked(self, buf: bytearray, rest: memoryview | None = None) -> AppendInfo:
        now = self.clock.time_ms()
        c = self.config
        newest = now  # the batch's largest timestamp once stamped (LogAppendTime: now)
        if c.message_timestamp_type == "CreateTime":
            low, newest = _TIMESTAMPS.unpack_from(buf, BASE_TIMESTAMP_AT)  # smallest and largest in the batch
            if (
                newest - now > c.message_timestamp_after_max_ms
                or now - low > c.message_timestamp_before_max_ms
            ):
                self._check_timestamps(buf, now, low, newest)
        last_delta = _I32.unpack_from(buf, LAST_DELTA_AT)[0]
        active = self._segments[-1]
        size = len(buf) if rest is None else len(buf) + len(rest)
        if self._should_roll(active, size, last_delta, newest):
            active = self._roll()
        base = active.next_offset
        _I64.pack_into(buf, BASE_OFFSET_AT, base)
        append_time = -1
        if self.config.log_append_time:
            append_time = now
            _restamp(buf, now)
        header = BatchHeader._make(HEADER.unpack_from(buf, 0))  # as patched
        active.append(buf, header, self.config.index_interval_bytes, rest)
        self._publish()
        active.write_due_index_entries()  # after the publish: the files never index an unpublished batch
        self._unflushed_records += header.record_count
        if self._first_unflushed_ms < 0:
            self._first_unflushed_ms = self.clock.monotonic_ms()
        if self.config.flush_messages > 0 or self.config.flush_ms >= 0:
            self._maybe_flush_by_policy()
        return AppendInfo(base, base + last_delta, append_time)

    def _check_timestamps(self, buf: bytearray, now: int, low: int, high: int) -> None:
        """Refuse a CreateTime batch holding a timestamp outside the topic's window around ``now`` (Kafka's
        ``message.timestamp.after.max.ms`` / ``before.max.ms``): whole, before anything is written. Control
        batches (transaction markers, stamped by pylog) pass."""
        if not _I16.unpack_from(buf, ATTRIBUTES_AT)[0] & ATTR_CONTROL:
            self.config.check_timestamps(
                low, high, now, f"the batch of {self.topic}-{self.partition} holding it"
            )

    def _should_roll(self, active: Segment, size: int, last_delta: int, newest: int) -> bool:
        """Kafka's ``LogSegment.shouldRoll``: the batch would overflow ``segment_bytes`` or the relative
        offsets, or it is ``segment_ms`` newer than the segment's first batch. Time is measured between record
        timestamps (``newest`` is the incoming batch's largest), as Kafka does, not from the wall clock: a log
        fed old records (a replay, a migration) fills its segments instead of rolling one per batch."""
        if active.size == 0:
            return False
        if active.size + size > self.config.segment_bytes:
            return True
        if active.next_offset + last_delta - active.base_offset > _MAX_REL:
            return True
        return active.first_timestamp >= 0 and newest - active.first_timestamp >= self.config.segment_ms

    def roll(self) -> Segment:
        """Close the active segment and start a new one at the log end offset (no-op if it is empty)."""
        with self.locked_for_write():
            if self._segments[-1].size == 0:
                return self._segments[-1]
            return self._roll()

    def _roll(self) -> Segment:
        old = self._segments[-1]
        if not old.write_index_entries():  # a full disk: its index files stay a valid prefix
            self._held_index = True  # ... and the next flush writes the rest
        if old.file_size() > old.size:  # unpublished bytes of a writer that died: never visible to anyone
            fs.FS.ftruncate(old.open_fd(), old.size)
        old.flush()
        old.close_fd()
        seg = self._segments.new_segment(old.next_offset)
        fd = fs.FS.open(seg.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        seg.fd = fd
        seg.ino = os.fstat(fd).st_ino
        try:
            for path in (seg.index_path, seg.timeindex_path):
                if os.path.exists(path):
                    fs.FS.unlink(path)
            fs.FS.fsync_dir(self.directory)
        except OSError:
            # never published: remove it, or appends that go on into the old segment would overlap it
            try:
                seg.close_fd()
                fs.FS.unlink(seg.path)
            except OSError:
                pass  # an empty leftover is skipped by _load_layout and removed by recovery
            raise
        self._segments.append_segment(seg)
        self._publish()
        # the final time entry only now: a roll killed before the publish leaves the old segment active,
        # and an active segment's index files must not hold it (the next writer's entries would not match)
        try:
            old.seal()
        except OSError:
            pass  # its index without the final entry is a valid prefix
        self._advance_recovery_point(seg.base_offset, sync=True)
        return seg

    # -- flushing ---------------------------------------------------------------------------------------

    def _maybe_flush_by_policy(self) -> None:
        c = self.config
        due = c.flush_messages > 0 and self._unflushed_records >= c.flush_messages
        if not due and c.flush_ms >= 0 and self._first_unflushed_ms >= 0:
            due = self.clock.monotonic_ms() - self._first_unflushed_ms >= c.flush_ms
        if due:
            self._flush_locked()

    def flush(self, up_to: int | None = None) -> int:
        """fsync everything appended so far (or at least up to offset ``up_to``); returns the durable offset.

        Group commit: one fsync covers every append that reached the file before it started. A caller whose
        offset an fsync already covered returns at once; while an fsync is in flight, callers wait for it
        instead of queueing their own, return if it covered them, and otherwise one of them runs the next
        fsync for all of them (never a thread whose offset is already durable)."""
        if (up_to is not None and self.flushed_offset >= up_to) or self.read_only:
            return self.flushed_offset
        with self._flush_done:
            while self._flushing:
                self._flush_done.wait()
                if up_to is not None and self.flushed_offset >= up_to:
                    return self.flushed_offset
            self._flushing = True
        try:
            with self._flush_lock:
                return self._flush_locked(full=up_to is None)
        finally:
            with self._flush_done:
                self._flushing = False
                self._flush_done.notify_all()

    def _flush_locked(self, *, full: bool = True) -> int:
        """fsync what was appended. A flush for an acknowledgement (``full=False``, the acks="all" path)
        fsyncs the active segment's index files at most once per :data:`INDEX_SYNC_MS`: the records are
        durable after the log's fsync alone, and indexes can be rebuilt. The recovery point (whose index
        entries recovery trusts) then stays where the indexes were last fsynced, and the records past it are
        revalidated by recovery after a crash, as Kafka does with its lazily checkpointed recovery point."""
        with self._lock:
            self._refresh()
            active = self._segments[-1]
            target = active.next_offset
            changes = active.index_changes
            pending = [s for s in self._segments if s.unflushed] or [active]
            if self._held_index:  # sealed segments whose last index entries a full disk held back
                pending += [s for s in self._segments[:-1] if s.index_pending and s not in pending]
            for seg in pending:  # under the lock: appends add index entries (the fsyncs need not be)
                seg.write_index_entries()
            if self._held_index:
                self._held_index = any(s.index_pending for s in self._segments[:-1])
        now = self.clock.monotonic_ms()
        lazy = not full and self._index_synced_ms >= 0 and now - self._index_synced_ms < INDEX_SYNC_MS
        for seg in pending:
            seg.flush(write_index=False, sync_index=not (lazy and seg is active))
        if not lazy:
            self._index_synced_ms = now
        self._unflushed_records = 0
        self._first_unflushed_ms = -1.0
        # the checkpoint first: a flush that raised never counts as done
        if target > self._checkpointed and active.index_synced >= changes:  # else it stays (see above)
            self._advance_recovery_point(target, sync=False)
        if target > self.flushed_offset:
            self.flushed_offset = target
        return self.flushed_offset

    def _advance_recovery_point(self, point: int, *, sync: bool) -> None:
        self.checkpoint.write(point, sync=sync)
        self._checkpointed = max(self._checkpointed, point)

    # -- reading ----------------------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int = 1 << 20) -> list[DecodedBatch]:
        """Decoded batches starting with the one holding ``offset`` (the first may start before it), up to
        about ``max_bytes`` (always at least one batch when ``offset`` < log end). CRC-checked."""
        return [decode_batch(view, pos) for view, pos in self.read_raw(offset, max_bytes)]

    def read_raw(self, offset: int, max_bytes: int = 1 << 20) -> list[tuple[memoryview | bytes, int]]:
        """Like :meth:`read` but returns ``(buffer, position)`` pairs of undecoded batches."""
        _check_offset(offset)
        if self.remote is not None:
            got = self._read_remote(self.remote, offset, max_bytes)
            if got is not None:
                return got
        return self._reloading(lambda: self._read_raw(offset, max_bytes))

    def _read_remote(
        self, remote: RemoteSegments, offset: int, max_bytes: int
    ) -> list[tuple[memoryview | bytes, int]] | None:
        """Tiered storage: the batches from ``offset`` on when they are not on the local disk (None when they
        are). Reads of the object store run without the partition's locks held. An offset between the remote
        log end and the local log start (segments deleted locally that were never uploaded) reads on from the
        local log start, as a read of a compacted log reads on from the next offset that is left."""
        standalone = remote.standalone
        local_start = 0 if standalone else self.local_log_start_offset
        if not standalone and offset >= local_start:
            return None
        found = remote_read_raw(remote, offset, max_bytes)
        if found is not None:
            return found[0]
        segments = remote.segments()
        end = segments[-1].next_offset if segments else 0
        if standalone:
            if offset > end:
                raise OffsetOutOfRangeError(
                    f"offset {offset} is out of range [{segments[0].base_offset if segments else 0}, {end}] "
                    f"for {self.topic}-{self.partition}"
                )
            return []
        if segments and end <= offset:
            return self._reloading(lambda: self._read_raw(local_start, max_bytes))
        return None

    def _reloading(self, read: Callable[[], _T]) -> _T:
        """Run ``read``; when a segment file vanished under it (another process deleted it, by retention or
        compaction, after this one last loaded the layout, and may not have published the new layout yet),
        reload the layout from the directory and run it again. An offset no longer in the log then raises
        OffsetOutOfRangeError."""
        for _ in range(_STALE_LAYOUT_RETRIES):
            try:
                return read()
            except FileNotFoundError:
                with self._lock:
                    self._refresh()
                    snap = self._state.read()
                    if snap is not None:
                        self._load_layout(snap)
        return read()

    def _read_raw(self, offset: int, max_bytes: int) -> list[tuple[memoryview | bytes, int]]:
        with self._lock:
            self._refresh()
            end = self._segments[-1].next_offset
            # (a tiered partition's log start is its remote log's: delete_records refuses tiered topics)
            start = self._start_locked() if self.remote is None else self._segments[0].base_offset
            if offset < start or offset > end:
                raise OffsetOutOfRangeError(
                    f"offset {offset} is out of range [{start}, {end}] for {self.topic}-{self.partition}"
                )
            out: list[tuple[memoryview | bytes, int]] = []
            total = 0
            i = self._segments.index_for(offset)
            last = len(self._segments) - 1
            while i <= last and total < max_bytes:
                seg = self._segments[i]
                if seg.size == 0 or seg.next_offset <= offset:
                    i += 1
                    continue
                first = 0
                # the segment's first batch (in a compacted segment it may start after the base offset)
                expect: tuple[int, bool] | None = (seg.base_offset, seg.dense)
                if not out:
                    hint = self._hint
                    if (
                        hint is not None
                        and hint[0] == offset
                        and hint[1] == seg.base_offset
                        and hint[3] == self._segments.epoch
                    ):
                        first = hint[2]
                        expect = (offset, False)  # continues the batch the previous read ended with
                    else:
                        first = seg.position_for(offset)
                        expect = None  # checked by the index walk
                pos = self._read_segment(seg, first, max_bytes - total, i == last, out, expect)
                total += pos - first
                if pos < seg.size:  # budget used up inside this segment
                    self._hint = (_next_of(out), seg.base_offset, pos, self._segments.epoch)
                    break
                self._hint = (seg.next_offset, seg.base_offset, pos, self._segments.epoch)
                i += 1
            return out

    def _read_segment(
        self,
        seg: Segment,
        first: int,
        budget: int,
        active: bool,
        out: list[tuple[memoryview | bytes, int]],
        expect: tuple[int, bool] | None = None,
    ) -> int:
        """Append whole batches of ``seg`` from file position ``first`` to ``out`` within ``budget`` bytes
        (always at least one batch); returns the file position after the last batch taken.

        The base offset is outside the CRC: each batch must continue the one before it (exactly in a dense
        segment), and the first one must carry the base offset ``expect`` names (``(offset, exact)``).

        A window is ``(buffer, shift, limit)``: file position ``p`` is ``buffer[p + shift]`` for
        ``p < limit``."""
        expected, exact = expect if expect is not None else (-1, False)
        pos = first
        window = _window(seg, pos, max(budget, HEADER_SIZE), active)
        while pos < seg.size:
            buf, shift, limit = window
            if pos + HEADER_SIZE > limit:
                if limit >= seg.size:
                    raise CorruptRecordError(
                        f"truncated batch header at position {pos}", path=seg.path, position=pos
                    )
                if pos > first:  # the window ends inside this header: the budget is used up
                    break
                window = _window(seg, pos, max(budget, HEADER_SIZE), active)
                continue
            length = _I32.unpack_from(buf, pos + shift + BATCH_LENGTH_AT)[0]
            if pos + length > limit and pos + length <= seg.size:
                if pos > first:
                    break
                window = _window(seg, pos, length, active)
                continue
            try:
                h = decode_header(buf, pos + shift, limit + shift)
            except CorruptRecordError as exc:
                exc.path, exc.position = seg.path, pos
                raise
            if (
                expected >= 0
                and h.base_offset != expected
                and (exact or seg.dense or h.base_offset < expected)
            ):
                raise CorruptRecordError(
                    f"batch at position {pos} has base offset {h.base_offset}, expected {expected}",
                    path=seg.path,
                    position=pos,
                )
            expected, exact = h.next_offset, False
            out.append((buf, pos + shift))
            pos += h.batch_length
            if pos - first >= budget:
                break
        return pos

    def batches(self, start_offset: int | None = None) -> Iterator[DecodedBatch]:
        """Every batch from ``start_offset`` (default: log start) to the current end, decoded and checked."""
        offset = self.log_start_offset if start_offset is None else start_offset
        while True:
            got = self.read(offset, 4 << 20)
            if not got:
                return
            yield from got
            offset = got[-1].header.next_offset

    def headers(self, start_offset: int, end_offset: int, max_bytes: int = 4 << 20) -> Iterator[BatchHeader]:
        """The header of every batch from the one holding ``start_offset`` until ``end_offset`` is passed,
        read ``max_bytes`` at a time (not CRC-checked; the records are not decoded). The last read may yield
        batches past ``end_offset`` (written meanwhile). A start below the log start, or one that retention
        or ``delete_records`` moves the log start past meanwhile, reads on from the log start. Thread-safe
        (each read is); the batches read are those of the moment of each read."""
        offset = start_offset
        while offset < end_offset:
            try:
                chunk = self.read_raw(offset, max_bytes)
            except OffsetOutOfRangeError:
                if offset >= self.log_start_offset:
                    raise
                offset = self.log_start_offset
                continue
            if not chunk:
                return
            for buf, at in chunk:
                h = decode_header(buf, at)
                offset = h.next_offset
                yield h

    def offset_for_time(self, timestamp: int) -> tuple[int, int] | None:
        """The earliest (offset, timestamp) whose timestamp is >= ``timestamp``, or None (remote segments
        first, when the log has some)."""
        if self.remote is not None:
            found = remote_offset_for_time(self.remote, timestamp)
            if found is not None or self.remote.standalone:
                return found
        return self._reloading(lambda: self._offset_for_time(timestamp))

    def _offset_for_time(self, timestamp: int) -> tuple[int, int] | None:
        with self._lock:
            self._refresh()
            start = self._start_locked() if self.remote is None else 0  # records below it are deleted
            for seg in self._segments:
                if seg.size == 0 or seg.max_timestamp < timestamp or seg.next_offset <= start:
                    continue
                buf = seg.view()
                pos = seg.position_for_time(timestamp)
                for p, h in walk_headers(buf, pos, seg.size):
                    if h.max_timestamp >= timestamp and h.next_offset > start:
                        b = decode_batch(buf, p)
                        hits = ((b.timestamps >= timestamp) & (b.offsets >= start)).nonzero()[0]
                        if len(hits):
                            i = int(hits[0])
                            return int(b.offsets[i]), int(b.timestamps[i])
            return None

    # -- retention and truncation -----------------------------------------------------------------------

    def apply_retention(self, *, remote: tuple[int, int] | None = None) -> int:
        """Delete whole segments past ``retention_ms`` (judged on each segment's largest timestamp) or beyond
        ``retention_bytes``; rolls the active segment first when it alone breaches. Returns segments deleted.

        Tiered storage (``remote_storage_enable``): ``remote`` is ``(start, end)``, the offsets the partition's
        remote manifest covers, as the caller last saw it published (None: not known, or nothing uploaded).
        A local segment is then deleted only when that manifest names it (it lies within ``[start, end)``) and
        its local retention passed (``local_retention_ms`` / ``local_retention_bytes``, -2 following
        ``retention_ms`` / ``retention_bytes``); a segment below ``start`` (the remote log start moved past
        it) goes when the whole-log retention passed. A segment not yet uploaded stays, even past
        ``retention_ms``, and with ``remote`` None nothing is deleted."""
        c = self.config
        if not c.deletes:
            return 0
        if c.remote_storage_enable:
            if remote is None:
                return 0  # upload not confirmed: nothing of a tiered topic is deleted locally
            if c.effective_local_retention_ms < 0 and c.effective_local_retention_bytes < 0:
                return 0  # (the local retention is unlimited only where the whole log's is)
        elif c.retention_ms < 0 and c.retention_bytes < 0:
            return 0
        with self.locked_for_write():
            return self._retention_locked(self.clock.time_ms(), remote if c.remote_storage_enable else None)

    def _retention_locked(self, now: int, remote: tuple[int, int] | None = None) -> int:
        c = self.config
        keep_ms, keep_bytes = c.retention_ms, c.retention_bytes
        if remote is not None:  # tiered: the local copies follow the local retention
            keep_ms, keep_bytes = c.effective_local_retention_ms, c.effective_local_retention_bytes
        active = self._segments[-1]
        expired_active = keep_ms >= 0 and active.size and now - active.max_timestamp > keep_ms
        oversize_active = keep_bytes >= 0 and active.size > keep_bytes and len(self._segments) == 1
        if expired_active or oversize_active:
            self._roll()  # sealed, so it can be deleted (tiered: uploaded first, by the next pass)
        total = sum(s.size for s in self._segments)
        doomed: list[Segment] = []
        for seg in self._segments[:-1]:
            by_time = keep_ms >= 0 and now - seg.max_timestamp > keep_ms
            by_size = keep_bytes >= 0 and total - seg.size >= keep_bytes
            if remote is not None:
                start, end = remote
                if seg.next_offset <= start:  # before the remote log: only the whole-log retention applies
                    by_time = c.retention_ms >= 0 and now - seg.max_timestamp > c.retention_ms
                    by_size = c.retention_bytes >= 0 and total - seg.size >= c.retention_bytes
                elif not (start <= seg.base_offset and seg.next_offset <= end):
                    break  # not named by the remote manifest (not uploaded yet): it and every later one stay
            if not (by_time or by_size):
                break
            doomed.append(seg)
            total -= seg.size
        if not doomed:
            return 0
        self._segments.remove_oldest(len(doomed))
        self._publish()
        for seg in doomed:
            seg.delete_files()
        fs.FS.fsync_dir(self.directory)
        return len(doomed)

    def compact(self, *, force: bool = True, txn_status: TxnStatus | None = None) -> CleanResult:
        """One log-cleaner pass now (:mod:`pylog.partition.cleaner`), for topics whose ``cleanup_policy``
        includes ``compact``. ``force`` ignores ``min_cleanable_dirty_ratio``; without ``txn_status`` the
        cleaner stops before the first segment holding a transactional batch."""
        if not self.config.compacted:
            raise ConfigError(
                f"topic {self.topic!r} has cleanup_policy={self.config.cleanup_policy!r}, not compact"
            )
        return clean_partition(self, self.clock.time_ms(), force=force, txn_status=txn_status)

    def delete_records(self, offset: int) -> int:
        """Delete the records below ``offset`` (Kafka's ``deleteRecords``); returns the log start offset after
        it (Kafka's low watermark): ``offset``, or the log start offset when it was already past it.

        The log start offset is written to the partition's ``log-start.offset``
        (:mod:`pylog.partition.logstart`): the records below it are no longer read, by any process. Every
        segment whose records all lie below it is deleted (at the log end offset the active segment is
        rolled first, so that everything goes); the records below it in the segment holding it stay on disk
        until retention deletes that segment. The records up to ``offset`` are fsynced first, so that no
        recovery truncates the log below its start. Raises :class:`~pylog.errors.OffsetOutOfRangeError` for
        an offset past the log end, :class:`~pylog.errors.ConfigError` for a topic whose policy does not
        delete (compact only) or a tiered one (its local segments are deleted only once uploaded)."""
        _check_offset(offset)
        if not self.config.deletes or self.config.remote_storage_enable:
            raise ConfigError(
                f"records of {self.topic}-{self.partition} cannot be deleted: cleanup_policy="
                f"{self.config.cleanup_policy!r}, remote_storage_enable={self.config.remote_storage_enable}"
            )
        self.flush(up_to=offset)
        with self.locked_for_write():
            end = self._segments[-1].next_offset
            if offset > min(end, self.flushed_offset):  # (appends after the flush: past the end it saw)
                raise OffsetOutOfRangeError(
                    f"offset {offset} is past the log end offset {end} of {self.topic}-{self.partition}"
                )
            if offset > self._start_locked():
                self._set_log_start(offset)
                self._segments.bump_epoch()  # other processes reload the layout, and the log start with it
                self._publish()
            if offset == end and self._segments[-1].size:
                self._roll()  # sealed, so that it can go too
            doomed = 0
            while doomed < len(self._segments) - 1 and self._segments[doomed].next_offset <= offset:
                doomed += 1
            if doomed:
                gone = self._segments.remove_oldest(doomed)
                self._publish()
                for seg in gone:
                    seg.delete_files()
                fs.FS.fsync_dir(self.directory)
            return self._start_locked()

    def _set_log_start(self, offset: int) -> None:
        write_log_start(self.directory, offset)
        self._log_start = offset

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is >= ``offset``; returns the new log end offset.

        Truncation works on batch boundaries, as Kafka's does: a batch holding ``offset`` is removed whole."""
        _check_offset(offset)
        with self.locked_for_write():
            # the log start goes below the truncation first (to the base of the segment holding it: at most
            # the new log end), then up to the new log end: a crash between shows records again, and new
            # records appended after the truncation are never hidden
            old_start = self._log_start
            if old_start > offset:
                self._set_log_start(self._segments[self._segments.index_for(offset)].base_offset)
            truncate_segments(self, offset)
            if old_start > offset and self._segments[-1].next_offset > self._log_start:
                self._set_log_start(self._segments[-1].next_offset)
            self._checkpointed = -1  # truncation reset the recovery point: the next flush writes it again
            self._publish()
            if self.flushed_offset > self._segments[-1].next_offset:
                self.flushed_offset = self._segments[-1].next_offset
            return self._segments[-1].next_offset

    # -- checking ---------------------------------------------------------------------------------------

    def verify(self) -> list[str]:
        """Walk every batch (bounds, CRC, full decode, increasing offsets) and every index (entries must equal
        what a scan of the log derives). Changes nothing; returns one line per problem found."""
        problems: list[str] = []
        with self._lock:
            self._refresh()
            segments = list(self._segments)
        expected = segments[0].base_offset
        for seg in segments:
            if expected < 0:  # the previous segment ended in a damaged batch: its end is unknown
                expected = seg.base_offset
            buf = seg.view()
            pos = 0
            intact = True
            rebuilt = self._segments.new_segment(seg.base_offset, dense=False)
            batches: list[tuple[int, int, int]] = []  # (relative base offset, position, max timestamp)
            while pos < seg.size:
                try:
                    h = decode_header(buf, pos, seg.size)
                    decode_batch(buf, pos)
                except (CorruptRecordError, UnsupportedFormatError) as exc:
                    problems.append(f"{seg.path}: position {pos}: {exc}")
                    intact = False
                    expected = -1
                    break
                if h.base_offset < expected or (seg.dense and h.base_offset != expected):
                    problems.append(
                        f"{seg.path}: position {pos}: offset {h.base_offset}, expected {expected}"
                    )
                rebuilt._account(pos, h, self.config.index_interval_bytes)
                batches.append((h.base_offset - seg.base_offset, pos, h.max_timestamp))
                expected = h.next_offset
                pos += h.batch_length
            if intact:
                if seg is not segments[-1]:
                    rebuilt.add_final_time_entry()  # what the roll that sealed it added
                problems.extend(_compare_index(seg, rebuilt, seg is segments[-1], batches))
        return problems

    # -- closing ----------------------------------------------------------------------------------------

    def close(self, *, flush: bool = True) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                # its topic was deleted: nothing to keep (a suspended partition's state file is gone by then)
                gone = (
                    not os.path.exists(os.path.join(self.directory, files.STATE))
                    if self._suspended
                    else self._state.deleted()
                )
                if (
                    flush
                    and not gone
                    and (
                        any(s.unflushed for s in self._segments)
                        or self._checkpointed < self.flushed_offset
                        or self._held_index
                    )
                ):
                    self._flush_locked()
            finally:
                self._closed = True
                for seg in self._segments:
                    self._segments.release(seg)
                if not self._suspended:
                    self._state.close()
                self.checkpoint.close()
                if self._handles is not None:
                    self._handles.forget(self)

    def suspend(self) -> bool:
        """Close this partition's descriptors until it is next used (False if it is busy right now)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._closed or self._suspended:
                return True
            if not self._flush_lock.acquire(blocking=False):
                return False
            try:
                for seg in self._segments:
                    self._segments.release(seg)
                self._state.close()
                self.checkpoint.close()
                self._suspended = True
                return True
            finally:
                self._flush_lock.release()
        finally:
            self._lock.release()

    def trim_unpublished_tail(self) -> None:
        """At a clean shutdown (no other process open): drop bytes past the published size of the active
        segment, left by writers that died before publishing."""
        active = self._segments[-1]
        if active.file_size() > active.size:
            fd = active.open_fd()
            fs.FS.ftruncate(fd, active.size)


class _WriteLock:
    """The context manager :meth:`PartitionLog.locked_for_write` returns (a class rather than a generator:
    it is on the path of every append, where a generator-based one cost several microseconds)."""

    __slots__ = ("_appending", "_plog")

    def __init__(self, plog: PartitionLog, *, appending: bool) -> None:
        self._plog = plog
        self._appending = appending

    def __enter__(self) -> SegmentList:
        plog = self._plog
        plog._lock.acquire()
        try:
            if self._appending:
                plog._ready()  # catching up with other writers is done under the file lock
            else:
                plog._refresh()
            plog._state.lock()
        except BaseException:
            plog._lock.release()
            raise
        try:
            if self._appending and plog._state.deleted():
                raise UnknownTopicError(
                    f"partition {plog.topic}-{plog.partition} was deleted (its topic was deleted by another "
                    "process or Log): nothing was written"
                )
            plog._sync_for_write()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return plog._segments

    def __exit__(self, *exc: object) -> None:
        try:
            self._plog._state.unlock()
        finally:
            self._plog._lock.release()


def _empty_file(path: str) -> bool:
    try:
        return os.path.getsize(path) == 0
    except FileNotFoundError:
        return False


def _compare_index(
    seg: Segment, rebuilt: Segment, active: bool, batches: list[tuple[int, int, int]]
) -> list[str]:
    """Index entries on disk must be a prefix of what a scan derives (the active segment's files are written a
    group of entries at a time, so they may not exist yet), or, when the segment was indexed with another
    ``index_interval_bytes`` (the topic's config changed while it was written), entries that lead every lookup
    to the right batch (:func:`_index_sound`)."""
    out = []
    for name, path, derived in (
        ("index", seg.index_path, rebuilt.offset_index.entries),
        ("timeindex", seg.timeindex_path, rebuilt.time_index.entries),
    ):
        try:
            raw = fs.FS.read_file(path)
        except FileNotFoundError:
            if seg.size and not active:
                out.append(f"{path}: missing (rebuildable)")
            continue
        on_disk = np.frombuffer(raw[: len(raw) - len(raw) % derived.dtype.itemsize], dtype=derived.dtype)
        if len(raw) % derived.dtype.itemsize or not (
            np.array_equal(on_disk, derived[: len(on_disk)]) or _index_sound(name, on_disk, batches)
        ):
            out.append(f"{path}: {name} entries do not match the log (rebuildable)")
    return out


def _index_sound(name: str, entries: np.ndarray, batches: list[tuple[int, int, int]]) -> bool:
    """Entries of another density than a scan derives that still serve every lookup: offset entries
    ``(rel, pos)`` name real batches, in increasing order; time entries ``(ts, rel)`` start at a real batch
    and ``ts`` is at least every timestamp before it (a lookup for a later time may skip those batches) and
    at most the segment's largest, with ``ts`` increasing and ``rel`` not decreasing."""
    if not batches or not len(entries):
        return not len(entries)
    rels = np.array([b[0] for b in batches], dtype=np.int64)
    positions = np.array([b[1] for b in batches], dtype=np.int64)
    before = np.maximum.accumulate(np.array([-1] + [b[2] for b in batches[:-1]], dtype=np.int64))
    rel = entries["rel"].astype(np.int64)
    i = np.searchsorted(rels, rel)
    found = (i < len(rels)) & (rels[np.minimum(i, len(rels) - 1)] == rel)
    if not found.all():
        return False
    if name == "index":
        return bool(
            np.all(np.diff(rel) > 0) and np.array_equal(positions[i], entries["pos"].astype(np.int64))
        )
    ts = entries["ts"]
    return bool(
        np.all(np.diff(ts) > 0)
        and np.all(np.diff(rel) >= 0)
        and np.all(ts >= before[i])
        and np.all(ts <= max(b[2] for b in batches))
    )


def _window(seg: Segment, pos: int, length: int, active: bool) -> tuple[memoryview | bytes, int, int]:
    buf, at = seg.read_range(pos, length, active=active)
    shift = at - pos
    return buf, shift, min(len(buf) - shift, seg.size)


def _next_of(out: list[tuple[memoryview | bytes, int]]) -> int:
    buf, pos = out[-1]
    return BatchHeader._make(HEADER.unpack_from(buf, pos)).next_offset


def _restamp(buf: bytearray, now: int) -> None:
    """Set a batch's timestamps to ``now`` (LogAppendTime) and recompute its CRC. The payload's first byte is
    its timestamp width (``pylog.record``): 0 means every record carries the base timestamp, so only such
    batches (or compressed ones, whose payload cannot be checked here) can be restamped in the header."""
    attributes = _I16.unpack_from(buf, ATTRIBUTES_AT)[0] | ATTR_LOG_APPEND_TIME
    _I16.pack_into(buf, ATTRIBUTES_AT, attributes)
    _TIMESTAMPS.pack_into(buf, BASE_TIMESTAMP_AT, now, now)  # base_timestamp, max_timestamp
    if buf[HEADER_SIZE] != 0 and not (attributes & ATTR_COMPRESSION_MASK):
        raise CorruptRecordError("LogAppendTime batches must be built with constant timestamps")
    _U32.pack_into(buf, CRC_AT, crc32c(memoryview(buf)[CRC_START:]))


def _check_offset(offset: object) -> None:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidOffsetError(f"offset must be an int >= 0, got {offset!r}")
