"""A group's heartbeat table: one memory-mapped slot per member, written by its owner without any lock.

``heartbeats`` (in the group's directory) is shared memory between every process that has the group open.
A member refreshes its heartbeat and records the rebalances it joins in its own slot; every other member
reads the slots without locking, to expel members whose session expired and to see whether a rebalance
can complete. The header also publishes the version of the group's ``state`` file, so that a member can
tell in one memory read that the state did not change (see :mod:`pylog.groups.store`). All integers are
little-endian int64.

Header (64 bytes)::

    offset  size  field
    0       8     magic          b"PLGHBT01" (format version 1)
    8       8     state_seq      2 * version of the published ``state``; odd while a writer replaces it
    16      8     scan_ms        CLOCK_MONOTONIC ms of the last group-wide liveness scan (a throttle)
    24      8     capacity       number of slots the file holds (it only grows)
    32      8     incarnation    random, chosen when the file is created: a cache of ``state`` made for
                                 another incarnation of the group directory (deleted, created again) is stale
    40      24    reserved       zero

Slot ``i`` (64 bytes at ``64 + 64 * i``)::

    offset  size  field
    0       8     seq            seqlock counter: odd while the owner writes the slot
    8       8     tag            the owner's tag: the first 8 bytes of blake2b(member_id), as int64 (0: never used)
    16      8     heartbeat_ms   the owner's last heartbeat (the group clock's ``time_ms``)
    24      8     joined         id of the last rebalance the owner joined
    32      8     pid            the owner's process id
    40      24    reserved       zero

Which member owns which slot is recorded in the group's state (``members[id]["slot"]``); a slot's ``tag``
tells a reader whether the slot still belongs to the member the state names (a slot is reused once its
member left). Only the owner writes its slot (seq odd, fields, seq even); a reader retries while ``seq`` is
odd or changed under it, so a torn read is never used. The header's ``state_seq`` and ``capacity`` are
written only under the group lock; ``scan_ms`` by anyone (two scans at once do the same work twice).

Thread-safety: one :class:`HeartbeatTable` per :class:`~pylog.groups.store.GroupStore`; its writes are
serialized by a lock, reads take none. Crash contract: none needed: the table is shared memory, not durable
truth. A member killed in the middle of a write leaves its slot's ``seq`` odd: readers then see no
heartbeat from it, which is what a dead member deserves (its liveness lock is free as well). The file is
never shrunk (a process that has it mapped would get SIGBUS), only grown under the group lock.
"""

from __future__ import annotations

import functools
import hashlib
import mmap
import os
import struct
import threading
import time
from typing import NamedTuple

from pylog import fs
from pylog.errors import UnsupportedFormatError

__all__ = ["HEADER_SIZE", "SLOT_SIZE", "HeartbeatTable", "Slot", "member_tag"]

MAGIC = int.from_bytes(b"PLGHBT01", "little")
HEADER_SIZE = 64
SLOT_SIZE = 64
_INITIAL_SLOTS = 64
_I64 = struct.Struct("<q")
_HEADER = struct.Struct("<qqqq")  # magic, state_seq, scan_ms, capacity
_FIELDS = struct.Struct("<qqqq")  # tag, heartbeat_ms, joined, pid
_STATE_SEQ_AT = 8
_SCAN_AT = 16
_CAPACITY_AT = 24
_INCARNATION_AT = 32
_SPINS = 1000


class Slot(NamedTuple):
    tag: int
    heartbeat_ms: int
    joined: int
    pid: int


@functools.lru_cache(maxsize=4096)
def member_tag(member_id: str) -> int:
    """The slot tag of ``member_id`` (never 0, the tag of a slot nobody used)."""
    tag = int.from_bytes(hashlib.blake2b(member_id.encode(), digest_size=8).digest(), "little", signed=True)
    return tag or 1


def monotonic_ms() -> int:
    """CLOCK_MONOTONIC in ms: the same clock in every process of the machine (for the scan throttle)."""
    return time.monotonic_ns() // 1_000_000


class HeartbeatTable:
    """The mapped ``heartbeats`` file of one group (layout in the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = fs.FS.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._write_lock = threading.Lock()
        self._map: mmap.mmap | None = None
        self._slots = 0
        self._remap()

    # -- mapping ----------------------------------------------------------------------------------------

    def _remap(self) -> None:
        size = os.fstat(self._fd).st_size
        if size < HEADER_SIZE:
            self._map, self._slots = None, 0
            return
        # the previous map is not closed: another thread may be reading it; it goes with its last reference
        self._map = mmap.mmap(self._fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._slots = (size - HEADER_SIZE) // SLOT_SIZE
        magic = _I64.unpack_from(self._map, 0)[0]
        if magic not in (0, MAGIC):
            raise UnsupportedFormatError(f"{self.path}: unknown heartbeat table format")

    @property
    def initialized(self) -> bool:
        return self._map is not None and _I64.unpack_from(self._map, 0)[0] == MAGIC

    def initialize(self) -> None:
        """Write the header and the first slots (call under the group lock, when not :attr:`initialized`)."""
        if self.initialized:
            return
        size = HEADER_SIZE + SLOT_SIZE * _INITIAL_SLOTS
        if os.fstat(self._fd).st_size < size:
            fs.FS.ftruncate(self._fd, size)
        incarnation = int.from_bytes(os.urandom(8), "little", signed=True) or 1
        fs.FS.pwrite(self._fd, _I64.pack(incarnation), _INCARNATION_AT)
        fs.FS.pwrite(self._fd, _HEADER.pack(MAGIC, 0, 0, _INITIAL_SLOTS), 0)
        self._remap()

    def ensure_capacity(self, slots: int) -> None:
        """Grow the file to hold at least ``slots`` slots (call under the group lock)."""
        if self._map is None:
            self.initialize()
        capacity = self.capacity()
        if slots > capacity:
            new = max(slots, 2 * capacity)
            fs.FS.ftruncate(self._fd, HEADER_SIZE + SLOT_SIZE * new)
            fs.FS.pwrite(self._fd, _I64.pack(new), _CAPACITY_AT)
        if slots > self._slots:
            self._remap()

    def incarnation(self) -> int:
        """The random id of this table file (0: not initialized)."""
        return 0 if self._map is None else int(_I64.unpack_from(self._map, _INCARNATION_AT)[0])

    def capacity(self) -> int:
        return 0 if self._map is None else int(_I64.unpack_from(self._map, _CAPACITY_AT)[0])

    def _mapped(self, slot: int) -> mmap.mmap | None:
        if slot >= self._slots:
            if slot >= self.capacity():
                return None
            self._remap()
        return self._map

    # -- header -----------------------------------------------------------------------------------------

    def state_seq(self) -> int:
        """The published state's ``2 * version`` (odd while a writer replaces it; -1: no table yet)."""
        m = self._map
        if m is None:
            return -1
        return int(_I64.unpack_from(m, _STATE_SEQ_AT)[0])

    def set_state_seq(self, seq: int) -> None:
        """Publish ``seq`` (call under the group lock)."""
        if self._map is not None:
            _I64.pack_into(self._map, _STATE_SEQ_AT, seq)

    def scan_due(self, interval_ms: int) -> bool:
        """True, and the scan time recorded, when no member of the group scanned in the last ``interval_ms``."""
        m = self._map
        if m is None:
            return True
        now = monotonic_ms()
        if now - _I64.unpack_from(m, _SCAN_AT)[0] < interval_ms:
            return False
        _I64.pack_into(m, _SCAN_AT, now)
        return True

    # -- slots ------------------------------------------------------------------------------------------

    def write(self, slot: int, fields: Slot) -> None:
        """Write a whole slot (by its owner only): seq odd, the fields, seq even."""
        with self._write_lock:
            m = self._mapped(slot)
            if m is None:
                return  # the table was never grown to this slot: the writer is not a member any more
            at = HEADER_SIZE + SLOT_SIZE * slot
            seq = _I64.unpack_from(m, at)[0]
            seq = seq + 1 if seq & 1 == 0 else seq  # odd: left so by an owner that died mid-write
            _I64.pack_into(m, at, seq)
            _FIELDS.pack_into(m, at + 8, *fields)
            _I64.pack_into(m, at, seq + 1)

    def read(self, slot: int) -> Slot | None:
        """A consistent copy of the slot, or None (no such slot, or its owner stays in the middle of a write)."""
        m = self._mapped(slot)
        if m is None:
            return None
        at = HEADER_SIZE + SLOT_SIZE * slot
        for _ in range(_SPINS):
            s1 = _I64.unpack_from(m, at)[0]
            if s1 & 1:
                continue
            fields = _FIELDS.unpack_from(m, at + 8)
            if _I64.unpack_from(m, at)[0] == s1:
                return Slot(*fields)
        return None

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        fs.FS.close(self._fd)
