"""The ``remote_storage`` file of a log directory: the object-store URL the log was last opened with.

A log opened with ``remote_storage=URL`` records the URL in ``<root>/remote_storage``, so a later open without
the argument (``pylog.open(path)``, the CLI) still tiers to, and reads from, the same store. Only the URL is
kept: ``remote_storage_options`` (credentials, endpoints, retry settings) are never written to disk; give them
again at each open (or use the ``AWS_*`` environment variables).

File (replaced two-phase: ``remote_storage.tmp`` written and fsynced, renamed over, directory fsynced):

| part | bytes | content |
|---|---|---|
| header | 1 line | ``b"pylog-remote-storage 1 <crc32c of the body, 8 lowercase hex digits>\\n"`` |
| body | rest | UTF-8 JSON object ``{"remote_storage": "<url>"}`` |

A file whose header or CRC does not check is ignored (as if absent, with a warning); one of another format
version raises :class:`~pylog.errors.UnsupportedFormatError`.

Thread-safety: the functions are thread-safe; two processes opening one directory with different URLs leave
the last one written. Crash contract: the file holds the old URL or the new one, never a mix.
"""

from __future__ import annotations

import json
import os
import warnings

from pylog import fs
from pylog.framing import frame, unframe

__all__ = ["FILE_NAME", "read_remote_storage", "write_remote_storage"]

FILE_NAME = "remote_storage"
_MAGIC = b"pylog-remote-storage"
_FORMAT = 1


def read_remote_storage(root: str) -> str | None:
    """The URL recorded in the log directory ``root``; None when there is none (or it does not check)."""
    path = os.path.join(root, FILE_NAME)
    try:
        raw = fs.FS.read_file(path)
    except FileNotFoundError:
        return None
    try:
        url = json.loads(unframe(raw, _MAGIC, _FORMAT, f"remote storage record {path}"))["remote_storage"]
        if not isinstance(url, str):
            raise ValueError("not a string")
    except (ValueError, KeyError, TypeError) as exc:
        warnings.warn(f"{path} does not check ({exc}); ignored", RuntimeWarning, stacklevel=3)
        return None
    return url


def write_remote_storage(root: str, url: str) -> None:
    """Record ``url`` in the log directory ``root`` (two-phase, see the module docstring)."""
    body = json.dumps({"remote_storage": url}, sort_keys=True).encode()
    fs.atomic_write(os.path.join(root, FILE_NAME), frame(_MAGIC, _FORMAT, body))
