"""The log start offset a partition's ``delete_records`` set (``log-start.offset``).

Without the file, a partition's log start offset is the base offset of its first segment. ``delete_records``
deletes the segments wholly below its offset and writes the offset here, so that the records below it in the
segment holding it are no longer readable either (Kafka's ``log-start-offset-checkpoint``). The log start
offset is then the larger of the two; a file naming an offset past the log end (which a truncation lowers)
counts as the log end.

One 20-byte record, replaced as a whole (temp file, fsync, rename, fsync of the directory)::

    offset size type field
    0      4    u32  magic            b"PLLS"
    4      2    u16  version          1
    6      2    u16  reserved
    8      8    i64  log_start_offset
    16     4    u32  crc              CRC-32C of bytes [0, 16)

Crash contract: the file holds the old or the new offset, never a mix; ``delete_records`` writes it before
it deletes a segment, and only for records already fsynced, so recovery never truncates below it. A missing
or damaged file reads as 0 (the first segment's base offset rules): records are never hidden by damage,
at worst shown again.

Thread-safety: the functions are thread-safe; the partition's write lock serializes writers.
"""

from __future__ import annotations

import os
import struct

from pylog import fs
from pylog.partition import files
from pylog.record import crc32c

__all__ = ["read_log_start", "write_log_start"]

_BODY = struct.Struct("<IHHq")
_CRC = struct.Struct("<I")
_MAGIC = int.from_bytes(b"PLLS", "little")


def read_log_start(directory: str) -> int:
    """The offset in ``directory``'s ``log-start.offset``; 0 when there is none or it is damaged."""
    try:
        raw = fs.FS.read_file(os.path.join(directory, files.LOG_START))
    except FileNotFoundError:
        return 0
    if len(raw) != _BODY.size + _CRC.size or _CRC.unpack_from(raw, _BODY.size)[0] != crc32c(
        raw[: _BODY.size]
    ):
        return 0
    magic, version, _, offset = _BODY.unpack_from(raw)
    return int(offset) if magic == _MAGIC and version == 1 and offset >= 0 else 0


def write_log_start(directory: str, offset: int) -> None:
    """Replace ``directory``'s ``log-start.offset`` with ``offset``, crash-safely."""
    body = _BODY.pack(_MAGIC, 1, 0, offset)
    fs.atomic_write(os.path.join(directory, files.LOG_START), body + _CRC.pack(crc32c(body)))
