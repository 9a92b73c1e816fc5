"""The durable recovery point of a partition (``recovery.checkpoint``).

Everything below the recovery point is known to be on stable storage: recovery after an unclean shutdown
revalidates only what lies at or after it, and corruption below it is reported, never truncated.

Two 32-byte slots, written alternately in place, so a torn write can only damage the slot being written::

    offset size type field
    0      4    u32  magic           b"PLRP"
    4      2    u16  version         1
    6      2    u16  reserved
    8      8    i64  sequence        slot generation; the valid slot with the highest sequence wins
    16     8    i64  recovery_point  next offset after durable data
    24     4    u32  crc             CRC-32C of bytes [0, 24)
    28     4    u32  reserved

Crash contract: the value written is always an offset that was already fsynced, so whichever slot survives a
crash names durable data. If both slots are damaged the recovery point is 0 (everything is revalidated).
Callers serialize writes with the partition lock.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading

from pylog import fs
from pylog.errors import DiskFullError
from pylog.record import crc32c

__all__ = ["RecoveryCheckpoint"]

_SLOT = struct.Struct("<IHHqqII")
_BODY = struct.Struct("<IHHqq")
_TAIL = struct.Struct("<II")
_MAGIC = int.from_bytes(b"PLRP", "little")


class RecoveryCheckpoint:
    """The recovery point of one partition.

    A write after each flush is on the acks="all" path, so the file stays open and the slot last written is
    remembered: such a write is one ``pwrite``. A write with ``sync`` (a roll, recovery) reads the slots again
    first, and :meth:`forget` (after the partition's layout changed: another process may have reset the file,
    which replaces it) drops what is remembered. Whatever another process wrote meanwhile, every slot holds a
    durable offset, so a stale memory can only leave the point lower than it could be (more to revalidate),
    never name data that is not durable.

    Thread-safety: thread-safe (writes, :meth:`forget` and :meth:`close` serialize on an internal lock, so
    the descriptor is never used after it was closed)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._mu = threading.Lock()
        self._fd = -1
        self._last: tuple[int, int] | None = None  # (sequence, point) of the newest slot, when known

    def _slots(self) -> list[tuple[int, int]]:
        try:
            raw = fs.FS.read_file(self.path)
        except FileNotFoundError:
            return []
        out = []
        for i in range(2):
            chunk = raw[i * 32 : i * 32 + 32]
            if len(chunk) < 32:
                continue
            magic, version, _, seq, point, crc, _ = _SLOT.unpack(chunk)
            if magic == _MAGIC and version == 1 and crc == crc32c(chunk[:24]) and point >= 0:
                out.append((seq, point))
        return out

    def read(self) -> int:
        """The recovery point (0 when no valid slot exists)."""
        slots = self._slots()
        return max(slots)[1] if slots else 0

    def write(self, point: int, *, sync: bool) -> None:
        """Record ``point`` (never moves backwards); ``sync`` makes the checkpoint itself durable."""
        with self._mu:
            last = None if sync else self._last
            if last is None:
                slots = self._slots()
                last = max(slots) if slots else (0, -1)
            seq, current = last
            if point <= current:
                self._last = last
                return
            body = _BODY.pack(_MAGIC, 1, 0, seq + 1, point)
            data = body + _TAIL.pack(crc32c(body), 0)
            if self._fd < 0:
                self._fd = fs.FS.open(self.path, os.O_RDWR | os.O_CREAT)
            try:
                fs.FS.pwrite(self._fd, data, (seq + 1) % 2 * 32)
                if sync:
                    fs.FS.fdatasync(self._fd)
            except BaseException:
                self._forget()
                raise
            self._last = (seq + 1, point)

    def forget(self) -> None:
        """Close the file and forget the slots (the file may have been replaced)."""
        with self._mu:
            self._forget()

    close = forget

    def _forget(self) -> None:
        self._last = None
        fd, self._fd = self._fd, -1
        if fd >= 0:
            fs.FS.close(fd)

    def reset(self, point: int) -> None:
        """Set the recovery point, possibly lower (after truncation), durably.

        The file is replaced (temp, fsync, rename). On a full disk it is rewritten in place instead, which
        needs no space: first the slot that does not hold the newest value (a crash during that write
        leaves the old point, as if the reset had not begun: recovery lowers it again), then the other."""
        self.forget()
        body = struct.pack("<IHHqq", _MAGIC, 1, 0, 1, point)
        try:
            fs.atomic_write(self.path, body + struct.pack("<II", crc32c(body), 0) + bytes(32))
        except DiskFullError:
            with contextlib.suppress(FileNotFoundError):
                fs.FS.unlink(self.path + ".tmp")
            self._reset_in_place(point)

    def _reset_in_place(self, point: int) -> None:
        slots = self._slots()
        seq, _ = max(slots) if slots else (0, 0)
        fd = fs.FS.open(self.path, os.O_RDWR)
        try:
            for step in (1, 2):
                body = _BODY.pack(_MAGIC, 1, 0, seq + step, point)
                fs.FS.pwrite(fd, body + _TAIL.pack(crc32c(body), 0), (seq + step) % 2 * 32)
                fs.FS.fdatasync(fd)
        finally:
            fs.FS.close(fd)
