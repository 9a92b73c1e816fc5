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

import os
import struct

from pylog import fs
from pylog.record import crc32c

__all__ = ["RecoveryCheckpoint"]

_SLOT = struct.Struct("<IHHqqII")
_MAGIC = int.from_bytes(b"PLRP", "little")


class RecoveryCheckpoint:
    def __init__(self, path: str) -> None:
        self.path = path

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
        slots = self._slots()
        seq, current = max(slots) if slots else (0, 0)
        if point <= current and slots:
            return
        slot = (seq + 1) % 2
        body = struct.pack("<IHHqq", _MAGIC, 1, 0, seq + 1, point)
        data = body + struct.pack("<II", crc32c(body), 0)
        fd = fs.FS.open(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fs.FS.pwrite(fd, data, slot * 32)
            if sync:
                fs.FS.fdatasync(fd)
        finally:
            fs.FS.close(fd)

    def reset(self, point: int) -> None:
        """Set the recovery point, possibly lower (after truncation), durably."""
        body = struct.pack("<IHHqq", _MAGIC, 1, 0, 1, point)
        fs.atomic_write(self.path, body + struct.pack("<II", crc32c(body), 0) + bytes(32))
