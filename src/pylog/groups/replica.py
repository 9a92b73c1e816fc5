"""The groups directory of a read replica: where consumer groups keep their files for a log read from an object
store (``pylog.open(url, read_only=True, groups_dir=path)``).

A log directory keeps its groups in itself (``<root>/__groups/``, :mod:`pylog.groups.store`). A log opened
from an object store has no local directory, so its groups live in the local directory given as
``groups_dir``, with the same layout: every process on the machine that opens the URL with the same
``groups_dir`` meets the others there, exactly as processes sharing a log directory do::

    <groups_dir>/
        replica_of        the URL of the log these groups read (format below), written when the directory is
                          first used; a later open of another URL with this directory is refused
        __groups/         the groups (pylog.groups.store), created by the first member

``replica_of`` (replaced two-phase: ``replica_of.tmp`` written and fsynced, renamed over, directory fsynced):

| part | bytes | content |
|---|---|---|
| header | 1 line | ``b"pylog-replica-groups 1 <crc32c of the body, 8 lowercase hex digits>\\n"`` |
| body | rest | UTF-8 JSON object ``{"url": "<url>"}`` (the URL as opened, without trailing ``/``) |

What is accepted as ``groups_dir``: a new directory whose parent exists (it is created), an empty directory,
or one this function set up for the same URL. Refused, with nothing written: a path whose parent does not
exist, a file, a log directory, a directory holding anything else, one set up for another URL
(:class:`~pylog.errors.ConfigError`), and one this process cannot write
(:class:`~pylog.errors.ReadOnlyLogError`). pylog creates only ``replica_of`` and ``__groups/`` in it, and
deletes only what :mod:`pylog.groups.store` deletes (a deleted group's own directory).

Thread-safety: :func:`open_groups_dir` may be called from several threads and processes at once: it checks
and records under an exclusive ``flock`` of the directory itself. Crash contract: ``replica_of`` holds the URL or is absent; a
directory left empty by a crash before it was written is accepted again.
"""

from __future__ import annotations

import fcntl
import json
import os

from pylog import fs
from pylog.errors import ConfigError, ReadOnlyLogError
from pylog.framing import frame, unframe
from pylog.groups.store import GROUPS_DIR

__all__ = ["FILE_NAME", "open_groups_dir", "read_replica_of"]

FILE_NAME = "replica_of"
_MAGIC = b"pylog-replica-groups"
_FORMAT = 1
_OWN = frozenset({FILE_NAME, FILE_NAME + ".tmp", GROUPS_DIR})
#: entries that mark a log directory (pylog.directory): a log keeps its groups in itself
_LOG_ENTRIES = ("manifest", ".lock", ".open.lock")


def _canonical(url: str) -> str:
    return url.rstrip("/") if url.rstrip("/").partition("://")[2] else url


def read_replica_of(path: str) -> str | None:
    """The URL recorded in the groups directory ``path``, or None when none is recorded.
    :class:`~pylog.errors.ConfigError` when the record does not check (it is not pylog's)."""
    record = os.path.join(path, FILE_NAME)
    try:
        raw = fs.FS.read_file(record)
    except FileNotFoundError:
        return None
    try:
        url = json.loads(unframe(raw, _MAGIC, _FORMAT, f"replica groups record {record}"))["url"]
        if not isinstance(url, str):
            raise ValueError("the URL is not a string")
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"groups_dir {path} holds a {FILE_NAME} file that is not a pylog record ({exc}): give an empty or "
            "new directory"
        ) from None
    return url


def open_groups_dir(groups_dir: object, url: str) -> str:
    """Check (and on first use create) ``groups_dir`` as the groups directory of the log at ``url``; returns
    its absolute path. See the module docstring for what is accepted and refused."""
    if not isinstance(groups_dir, str | os.PathLike):
        raise ConfigError(f"groups_dir must be a path (str or os.PathLike), got {groups_dir!r}")
    raw_path = os.fspath(groups_dir)
    if not isinstance(raw_path, str) or not raw_path or "\0" in raw_path:
        raise ConfigError(f"groups_dir must be a non-empty path, got {groups_dir!r}")
    path = os.path.abspath(raw_path)
    url = _canonical(url)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ConfigError(f"groups_dir {path} exists and is not a directory")
    if not os.path.exists(path):
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            raise ConfigError(
                f"groups_dir {path} does not exist, nor does its parent directory {parent}: create the parent "
                "first (pylog creates only the last directory of the path)"
            )
        _check_writable(parent, path)
        try:
            fs.FS.mkdir(path)
        except FileExistsError:
            pass  # created by another process meanwhile: checked below
        else:
            fs.FS.fsync_dir(parent)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # one check-and-record at a time (threads and processes)
        _check_and_record(path, url)
    finally:
        os.close(fd)
    return path


def _check_and_record(path: str, url: str) -> None:
    entries = set(fs.FS.listdir(path))
    if any(name in entries for name in _LOG_ENTRIES):
        raise ConfigError(
            f"groups_dir {path} is a pylog log directory: a log directory keeps its own groups; give the groups "
            "of a replica a directory of their own"
        )
    recorded = read_replica_of(path)
    foreign = sorted(entries - _OWN) if recorded is not None else sorted(entries - {FILE_NAME + ".tmp"})
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise ConfigError(
            f"groups_dir {path} holds {len(foreign)} entries pylog did not create there ({shown}): give an "
            "empty or new directory, or the groups_dir this URL was opened with before"
        )
    if recorded is not None and recorded != url:
        raise ConfigError(
            f"groups_dir {path} holds the consumer groups of {recorded}, not of {url}: give each replicated "
            "log its own groups_dir"
        )
    _check_writable(path, path)
    if recorded is None:
        body = json.dumps({"url": url}, sort_keys=True).encode()
        fs.atomic_write(os.path.join(path, FILE_NAME), frame(_MAGIC, _FORMAT, body))


def _check_writable(directory: str, groups_dir: str) -> None:
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ReadOnlyLogError(
            f"groups_dir {groups_dir}: {directory} cannot be written by this process; consumer groups write "
            "their state and committed offsets there"
        )
