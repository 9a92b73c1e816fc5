"""The broker's private files: ``<root>/__security/`` (users and their credentials, ACLs).

Both files hold what decides who may read and write the log, so they are written and read more carefully than
pylog's other small files:

- the directory is created mode 0700 and each file mode 0600 (whatever the umask), so only their owner reads
  them; a file that others may read or write is refused (:class:`~pylog.errors.ConfigError`, "chmod 600"), as
  ssh refuses a private key others can read;
- each file is one self-checking frame (:mod:`pylog.framing`: a header line with the magic, the format
  version and the CRC-32C of the JSON body), replaced two-phase: ``<name>.tmp`` written (mode 0600) and
  fsynced, renamed over ``<name>``, the directory fsynced; after a crash it holds the old contents or the new,
  never a mix;
- changes are read-modify-write under an exclusive ``flock`` of ``__security/.lock``, so two commands
  changing users or ACLs at once lose neither change;
- a running broker sees changes without a restart: :class:`Watched` re-reads a file when its inode, size or
  modification time changed (one ``stat`` per use, or at most one per ``interval`` seconds).

Thread-safety: :class:`Watched` is thread-safe; the functions are safe between threads and processes as said
above.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from pylog.errors import ConfigError

__all__ = ["SECURITY_DIR", "Watched", "locked", "read_private", "security_dir", "write_private"]

SECURITY_DIR = "__security"
T = TypeVar("T")


def security_dir(root: str, create: bool = False) -> str:
    """``<root>/__security``, created (mode 0700, the parents as needed) when ``create``."""
    path = os.path.join(root, SECURITY_DIR)
    if create and not os.path.isdir(path):
        os.makedirs(root, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        _fsync_dir(root)
    return path


@contextlib.contextmanager
def locked(directory: str) -> Iterator[None]:
    """An exclusive ``flock`` of ``directory/.lock`` for the ``with`` block (read-modify-write of a file)."""
    fd = os.open(os.path.join(directory, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def read_private(path: str) -> bytes | None:
    """The bytes of ``path``, None when it does not exist. Raises :class:`ConfigError` when users other than
    its owner may read or write it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        mode = os.fstat(fd).st_mode
        if mode & 0o077:
            raise ConfigError(
                f"{path} may be read or written by other users (mode {stat.filemode(mode)}): it holds "
                f"credentials or access rules; run 'chmod 600 {path}'"
            )
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_private(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` two-phase (see the module docstring), mode 0600."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a .tmp left by a crash may have been created with another mode
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    _fsync_dir(os.path.dirname(path) or ".")


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Watched(Generic[T]):
    """The parsed contents of a file, re-read when it changed: ``load(path)`` parses it (None: absent)."""

    def __init__(self, path: str, load: Callable[[str], T], interval: float = 0.0) -> None:
        self.path = path
        self._load = load
        self._interval = interval
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._value: T | None = None
        self._checked = -float("inf")

    def get(self) -> T:
        with self._lock:
            now = time.monotonic()
            if self._value is None or now - self._checked >= self._interval:
                self._checked = now
                stamp = _stamp(self.path)
                if self._value is None or stamp != self._stamp:
                    self._value = self._load(self.path)
                    self._stamp = stamp
            return self._value


def _stamp(path: str) -> tuple[int, int, int]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return (0, 0, 0)
    return (st.st_ino, st.st_size, st.st_mtime_ns)
