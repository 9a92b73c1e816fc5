"""Small append-only journals (committed offsets, transaction decisions): the record codec they share.

Every record holds its payload twice, each copy with its own CRC, so that one damaged bit never loses an
acknowledged record and a torn append is told apart from corruption::

    offset       size  type  field
    0            4     u32   length       of the payload
    4            4     u32   length       the same again
    8            n     -     payload
    8 + n        4     u32   crc          CRC-32C of the payload
    12 + n       n     -     payload      the same again
    12 + 2n      4     u32   crc          CRC-32C of the second copy

A record is valid when, for one of its length fields, either copy matches its CRC. At the end of the file an
invalid or incomplete record is a torn append (it was never acknowledged: appends are acknowledged after
their fsync) and is ignored, then cut off by the next append; an invalid record followed by more data is
corruption: :class:`~pylog.errors.CorruptRecordError` naming the file and position.
"""

from __future__ import annotations

import struct

from pylog.errors import CorruptRecordError
from pylog.record import crc32c

__all__ = ["encode", "parse"]

_LEN = struct.Struct("<II")
_CRC = struct.Struct("<I")
_MAX = 1 << 26  # a journal record is small; a larger length is damage


def encode(payload: bytes) -> bytes:
    n = len(payload)
    crc = _CRC.pack(crc32c(payload))
    return _LEN.pack(n, n) + payload + crc + payload + crc


def _record(raw: bytes, pos: int) -> tuple[bytes, int] | None:
    """``(payload, end)`` of a valid record at ``pos``, else None."""
    if pos + _LEN.size > len(raw):
        return None
    for n in dict.fromkeys(_LEN.unpack_from(raw, pos)):
        end = pos + 16 + 2 * n
        if n > _MAX or end > len(raw):
            continue
        first = raw[pos + 8 : pos + 8 + n]
        if crc32c(first) == _CRC.unpack_from(raw, pos + 8 + n)[0]:
            return first, end
        second = raw[pos + 12 + n : pos + 12 + 2 * n]
        if crc32c(second) == _CRC.unpack_from(raw, pos + 12 + 2 * n)[0]:
            return second, end
    return None


def parse(raw: bytes, base: int, path: str) -> tuple[list[tuple[int, bytes]], int]:
    """The valid records of ``raw`` (file bytes from position ``base``) as ``(position, payload)``, and the
    number of bytes they use (a torn record at the end is left out)."""
    out: list[tuple[int, bytes]] = []
    pos = 0
    while pos < len(raw):
        found = _record(raw, pos)
        if found is None:
            if _torn_tail(raw, pos):
                break
            raise CorruptRecordError(
                f"{path}: damaged record at position {base + pos}", path=path, position=base + pos
            )
        payload, end = found
        out.append((base + pos, payload))
        pos = end
    return out, pos


def _torn_tail(raw: bytes, pos: int) -> bool:
    """True when nothing valid follows ``pos``: the damage is the last, unacknowledged append."""
    if pos + _LEN.size > len(raw):
        return True
    for n in _LEN.unpack_from(raw, pos):
        end = pos + 16 + 2 * n
        if n <= _MAX and end >= len(raw):
            return True  # the record (by one of its lengths) reaches the end of the file
    # a length too damaged to say where the record ends: look for any valid record after it
    return not any(_record(raw, p) is not None for p in range(pos + 1, len(raw) - 15))
