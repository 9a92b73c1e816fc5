"""Cross-process publication state and the writer lock of one partition.

``partition.state`` is a 128-byte file, memory-mapped shared by every process that opens the partition, and the
target of the partition's writer lock (``flock``: held per open file description, so closing some other
descriptor of the file never drops it, unlike ``fcntl.lockf``). Layout, little-endian int64 slots::

    slot  field               meaning
    0     magic               b"PLPSTAT1" (format version 1)
    1     seq                 seqlock counter: odd while a writer is publishing
    2     log_end_offset      next offset to be written
    3     active_base_offset  base offset of the active (last) segment
    4     active_size         published bytes of the active segment's .log file
    5     layout_epoch        incremented whenever segments are added, deleted or rewritten
    6     active_max_timestamp largest timestamp in the active segment (-1 when empty)
    7     session             the log session that last validated this partition (see pylog.log; 0: none)
    8     waiting             byte 64: 1 when a reader waits for a publish (the doorbell, see below);
                                  bytes 65-71 reserved, 0
    9     deleted             bytes 72-79: b"PLDELETE" once the partition's topic was deleted (see below),
                                  anything else (0 when never set) otherwise; bytes 80-127 reserved, 0

The file is 128 bytes; one of 64 bytes (written before the doorbell existed) is extended with zeros when it is
opened. The doorbell (:mod:`pylog.partition.doorbell`): a reader waiting for records sets ``waiting`` and sleeps
in ``FUTEX_WAIT`` on the low half of ``seq``; :meth:`PartitionState.publish` (and :meth:`~PartitionState.reset`),
after changing ``seq``, reads ``waiting`` and, only when it is set, clears it and wakes the waiters
(``FUTEX_WAKE``): a writer with no reader waiting pays one fence and one byte read per publish.

The deletion marker: a process deleting a topic (``pylog.directory``, after the manifest no longer lists it)
calls :func:`mark_deleted` on each partition's state before it removes the partition's files: under the
writer lock, it sets ``deleted`` (eight bytes, so that a page torn by a power loss, which may hold junk, is
never read as a marker: a partition is never refused by chance). An appender checks it under the same lock (:meth:`PartitionState.deleted`)
and refuses to write, so no append is acknowledged into files that are about to be unlinked, or already are: a
byte read of the shared map instead of an ``fstat`` per append. The file is unlinked only after the marker is
set, and after every other file of the partition, so a process that opens it (again) before the unlink sees
the marker; a process whose partition was suspended (its descriptors closed) reopens it without creating it,
and a missing file means the partition was deleted.
Files removed by other means than pylog's topic deletion (by hand, or by a pylog without the marker) while a
process appends are not detected per append.

Only a process holding the writer lock changes it (the deletion marker is set under it too). Readers take a consistent snapshot without locking (read seq,
read fields, re-read seq): :func:`read_snapshot` is the one implementation of that loop, used by
:class:`PartitionState` and by :func:`read_published` (readers that never write, such as
:mod:`pylog.partition.reader`). The file is shared memory, not durable truth: after a restart of every process
it is rebuilt from the segment files by recovery. A writer killed in the middle of publishing leaves ``seq``
odd; the next lock holder sees that and re-derives the state from the files (``PartitionLog``'s repair).
Thread-safety: the lock is a process-level lock, so callers also hold a ``threading.Lock``.
Crash contract: none needed; nothing in it is durable (see above).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import time
from typing import NamedTuple

from pylog import fs
from pylog.errors import CorruptRecordError, LockError, ReadOnlyLogError, UnsupportedFormatError
from pylog.partition.doorbell import FENCE, MAPPED, WAITING_AT, ring, wake, word_address
from pylog.speedups import core as _core

__all__ = [
    "DELETED_AT",
    "DELETED_MARK",
    "FrozenState",
    "PartitionState",
    "Snapshot",
    "mark_deleted",
    "read_published",
    "read_snapshot",
]

_MAGIC = int.from_bytes(b"PLPSTAT1", "little")
_SIZE = 64
_SLOT = struct.Struct("<q")
_SEQ_AT = 8
_FIELDS = struct.Struct("<5q")  # slots 2..6
_FIELDS_AT = 16
_SPINS = 10_000
#: the deletion marker's byte (slot 9: see the table above)
DELETED_AT = 72
DELETED_MARK = b"PLDELETE"
_MARK_WAIT_S = 5.0  # how long mark_deleted waits for the writer lock
_fence_in, _fence_out = FENCE.acquire, FENCE.release  # doorbell.fence(), inlined on the publish path
_publish = (
    None if _core is None else _core.state_publish
)  # the compiled twin of PartitionState.publish_values


class Snapshot(NamedTuple):
    log_end_offset: int
    active_base_offset: int
    active_size: int
    layout_epoch: int
    active_max_timestamp: int


def read_snapshot(m: mmap.mmap, spins: int = _SPINS) -> Snapshot | None:
    """The seqlock read of a mapped state: a consistent snapshot, or None if a publish stayed in progress
    (``seq`` odd, or changed under the read) for ``spins`` tries."""
    for _ in range(spins):
        s1 = _SLOT.unpack_from(m, _SEQ_AT)[0]
        if s1 & 1:
            continue
        fields = _FIELDS.unpack_from(m, _FIELDS_AT)
        if _SLOT.unpack_from(m, _SEQ_AT)[0] == s1:
            return Snapshot(*fields)
    return None


def read_published(path: str, spins: int = _SPINS) -> Snapshot | None:
    """The state published in the file at ``path``, for a reader that never writes or locks: None when the
    file is missing or no writer ever published (or it is not a state file of this version). Raises
    :class:`CorruptRecordError` when a publish stays in progress (a writer died in the middle of it and no
    writer repaired it yet)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        if os.fstat(fd).st_size < _SIZE:
            return None
        m = mmap.mmap(fd, _SIZE, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    try:
        if _SLOT.unpack_from(m, 0)[0] != _MAGIC:
            return None
        snap = read_snapshot(m, spins)
    finally:
        m.close()
    if snap is None:
        raise CorruptRecordError(f"{path}: a writer stays in the middle of publishing", path=path)
    return snap


def mark_deleted(path: str, wait_s: float = _MARK_WAIT_S) -> None:
    """Set the deletion marker of the state file at ``path`` (nothing when it does not exist), under the
    writer lock: an append under way finishes first, and every later one sees the marker and refuses. The
    caller removes the partition's files afterwards. A lock not had within ``wait_s`` (a writer stopped while
    holding it) does not stop the deletion: the marker is set without it (an append under way may then still
    be acknowledged, as it would have been before the marker existed)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        locked = False
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.001)
        try:
            os.pwrite(fd, DELETED_MARK, DELETED_AT)
        finally:
            if locked:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class PartitionState:
    """The mapped state file and its lock. Not thread-safe on its own."""

    def __init__(self, path: str, *, create: bool = True) -> None:
        self.path = path
        self.fd = fs.FS.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        size = fs.FS.size(self.fd)
        if size < _SIZE:
            fs.FS.pwrite(self.fd, b"\0" * MAPPED, 0)
        elif size < MAPPED:  # a state file from before the doorbell: zeros past the end only
            fs.FS.pwrite(self.fd, b"\0" * (MAPPED - size), size)
        self._map = mmap.mmap(self.fd, MAPPED, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._bell = word_address(self._map)
        self.locked = False

    @property
    def initialized(self) -> bool:
        magic = struct.unpack_from("<q", self._map, 0)[0]
        if magic not in (0, _MAGIC):
            raise UnsupportedFormatError(f"{self.path}: unknown state format")
        return bool(magic == _MAGIC)

    @property
    def session(self) -> int:
        """The log session whose opener validated the files behind this state (0: none yet)."""
        return int(struct.unpack_from("<q", self._map, 56)[0])

    def stamp(self, session: int) -> None:
        """Record that the state was rebuilt from the files in ``session`` (caller holds the lock)."""
        struct.pack_into("<q", self._map, 56, session)

    def lock(self, blocking: bool = True) -> bool:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        except OSError as exc:
            raise LockError(f"cannot lock {self.path}: {exc}") from exc
        self.locked = True
        return True

    def unlock(self) -> None:
        self.locked = False
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    @property
    def seq(self) -> int:
        return int(struct.unpack_from("<q", self._map, 8)[0])

    def deleted(self) -> bool:
        """True when the partition's topic was deleted (the marker, see the module docstring; read with the
        lock held): appends then would go to files nobody can read again."""
        return self._map[DELETED_AT : DELETED_AT + len(DELETED_MARK)] == DELETED_MARK

    def torn(self) -> bool:
        """True when a writer died in the middle of publishing (call with the lock held)."""
        return self.seq & 1 == 1

    def read(self, spins: int = _SPINS) -> Snapshot | None:
        """A consistent snapshot, or None if a publish stayed in progress for ``spins`` tries."""
        return read_snapshot(self._map, spins)

    def publish(self, snap: Snapshot) -> None:
        """Publish ``snap`` (caller holds the lock)."""
        self.publish_values(*snap)

    def publish_values(
        self, log_end_offset: int, active_base_offset: int, active_size: int, layout_epoch: int, max_ts: int
    ) -> int:
        """:meth:`publish` of a snapshot given as its fields (the append path: no tuple built); returns the new
        ``seq``. Compiled (``pylog._speedups.state_publish``: the same stores and doorbell, with a hardware
        fence and a direct ``FUTEX_WAKE``) when it is in use."""
        m = self._map
        if _publish is not None:
            return int(_publish(m, log_end_offset, active_base_offset, active_size, layout_epoch, max_ts))
        seq = struct.unpack_from("<q", m, 8)[0]
        struct.pack_into("<q", m, 8, seq + 1)
        _FIELDS.pack_into(m, 16, log_end_offset, active_base_offset, active_size, layout_epoch, max_ts)
        struct.pack_into("<qq", m, 0, _MAGIC, seq + 2)
        _fence_in()  # the new seq visible to other processes before `waiting` is read
        _fence_out()
        if m[WAITING_AT]:  # a reader waits: ring the doorbell
            wake(m, self._bell)
        return int(seq + 2)

    def reset(self, snap: Snapshot) -> None:
        """Overwrite a torn or stale state with ``snap`` (recovery, lock held)."""
        seq = self.seq
        seq = seq + 1 if seq & 1 else seq
        struct.pack_into("<q", self._map, 8, seq + 1)
        _FIELDS.pack_into(self._map, 16, *snap)
        struct.pack_into("<qq", self._map, 0, _MAGIC, seq + 2)
        ring(self._map, self._bell)

    def close(self) -> None:
        try:
            self._map.close()
        finally:
            fs.FS.close(self.fd)


class FrozenState:
    """The state of a partition of a log opened read-only: derived once from the files, never written, no
    lock (another process cannot write through a read-only log either). Reads see the partition as it was
    when it was opened. Same reading interface as :class:`PartitionState`."""

    locked = False
    initialized = True
    session = 0
    seq = 0

    def __init__(self, path: str, snap: Snapshot) -> None:
        self.path = path
        self._snap = snap

    def read(self, spins: int = 0) -> Snapshot:
        return self._snap

    def torn(self) -> bool:
        return False

    def deleted(self) -> bool:
        return False

    def lock(self, blocking: bool = True) -> bool:
        raise ReadOnlyLogError(f"{self.path}: the log is open read-only")

    def unlock(self) -> None:
        pass

    def publish(self, snap: Snapshot) -> None:
        self.lock()

    def publish_values(self, *values: int) -> int:
        self.lock()
        return 0

    def reset(self, snap: Snapshot) -> None:
        self.lock()

    def stamp(self, session: int) -> None:
        self.lock()

    def close(self) -> None:
        pass
