"""Small self-checking files and objects (a log directory's manifest, the producers state, tiered storage's
manifests and records): the framing they share.

Each is one header line and a body (UTF-8 JSON, parsed by the module that owns the file)::

    part    bytes   content
    header  1 line  b"<magic> <format> <crc32c of the body, 8 lowercase hex digits>\\n"
    body    rest    the owner's bytes

``<magic>`` names the kind (``pylog-manifest``, ``pylog-producers``, ``pylog-remote-manifest``, ...) and
``<format>`` its format version, a decimal number. A reader trusts the body only when the magic, the format and
the CRC-32C all check: a file of the same magic with another format is
:class:`~pylog.errors.UnsupportedFormatError` (written by another pylog: never guessed at), anything else that
does not check is a :class:`ValueError` the owner turns into its own error (a damaged file, or not pylog's).
"""

from __future__ import annotations

from pylog.errors import UnsupportedFormatError
from pylog.record import crc32c

__all__ = ["frame", "unframe"]


def frame(magic: bytes, version: int, body: bytes) -> bytes:
    """The header line for ``body``, then ``body``."""
    return b"%s %d %08x\n" % (magic, version, crc32c(body)) + body


def unframe(raw: bytes, magic: bytes, version: int, what: str) -> bytes:
    """The body of ``raw`` when its header names ``magic`` and ``version`` and its CRC checks. ``what`` names
    the kind in errors: :class:`ValueError` (not such a record, or damaged), :class:`UnsupportedFormatError`
    (``magic`` with another format version)."""
    head, sep, body = raw.partition(b"\n")
    parts = head.split(b" ")
    if not sep or len(parts) != 3 or parts[0] != magic:
        raise ValueError(f"not a {what}")
    if parts[1] != b"%d" % version:
        raise UnsupportedFormatError(f"{what} format {parts[1]!r} is not known to this pylog")
    if parts[2] != b"%08x" % crc32c(body):
        raise ValueError(f"{what} CRC mismatch")
    return body
