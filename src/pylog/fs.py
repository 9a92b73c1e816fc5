"""The one I/O layer every pylog file operation goes through.

Storage code never calls ``os.write``/``os.fsync``/``os.rename`` directly: it calls the methods of the object in
:data:`FS`. Tests swap that object (:func:`install`) for one that fails the k-th call, crashes, or records what
was synced, which is how the crash-point and I/O-error tests reach every operation.

Errors from the operating system are translated once, here: ``ENOSPC``/``EDQUOT`` become
:class:`~pylog.errors.DiskFullError`, anything else :class:`~pylog.errors.StorageError`; the original ``OSError``
is chained. ``FileNotFoundError`` passes through unchanged because callers handle it as a normal case.

A failed ``fsync`` is never retried as if it had succeeded: the error propagates and the caller does not
acknowledge anything it covered (the "fsyncgate" rule).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

from pylog.errors import DiskFullError, StorageError

__all__ = ["FS", "FileSystem", "atomic_write", "install", "makedirs", "rmtree"]


def _translate(exc: OSError, what: str, path: str | int) -> OSError:
    if isinstance(exc, FileNotFoundError | FileExistsError):
        return exc
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(exc.errno, f"no space left on device during {what} of {path}")
    if exc.errno == errno.EFBIG:  # a file-size limit (RLIMIT_FSIZE, or the file system's): out of space too
        return DiskFullError(exc.errno, f"file size limit reached during {what} of {path}")
    return StorageError(exc.errno or 0, f"{what} failed on {path}: {exc.strerror or exc}")


class FileSystem:
    """Thin wrappers over ``os``; every method may raise StorageError/DiskFullError. Thread-safe."""

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        try:
            return os.open(path, flags | os.O_CLOEXEC, mode)
        except OSError as exc:
            raise _translate(exc, "open", path) from exc

    def close(self, fd: int) -> None:
        try:
            os.close(fd)
        except OSError as exc:
            raise _translate(exc, "close", fd) from exc

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Write all of ``data`` at ``offset`` (retrying short writes)."""
        try:
            done = os.pwrite(fd, data, offset)
        except OSError as exc:
            raise _translate(exc, "write", fd) from exc
        if done == len(data):  # (callers pass byte buffers: len() is their size in bytes)
            return
        view = memoryview(data)[done:]
        offset += done
        try:
            while view:
                done = os.pwrite(fd, view, offset)
                view = view[done:]
                offset += done
        except OSError as exc:
            raise _translate(exc, "write", fd) from exc

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        try:
            return os.pread(fd, size, offset)
        except OSError as exc:
            raise _translate(exc, "read", fd) from exc

    def fsync(self, fd: int) -> None:
        try:
            os.fsync(fd)
        except OSError as exc:
            raise _translate(exc, "fsync", fd) from exc

    def fdatasync(self, fd: int) -> None:
        try:
            os.fdatasync(fd)
        except OSError as exc:
            raise _translate(exc, "fdatasync", fd) from exc

    def ftruncate(self, fd: int, size: int) -> None:
        try:
            os.ftruncate(fd, size)
        except OSError as exc:
            raise _translate(exc, "truncate", fd) from exc

    def size(self, fd: int) -> int:
        try:
            return os.fstat(fd).st_size
        except OSError as exc:
            raise _translate(exc, "stat", fd) from exc

    def rename(self, src: str, dst: str) -> None:
        try:
            os.rename(src, dst)
        except OSError as exc:
            raise _translate(exc, "rename", src) from exc

    def unlink(self, path: str) -> None:
        try:
            os.unlink(path)
        except OSError as exc:
            raise _translate(exc, "unlink", path) from exc

    def mkdir(self, path: str) -> None:
        try:
            os.mkdir(path)
        except OSError as exc:
            raise _translate(exc, "mkdir", path) from exc

    def rmdir(self, path: str) -> None:
        try:
            os.rmdir(path)
        except OSError as exc:
            raise _translate(exc, "rmdir", path) from exc

    def fsync_dir(self, path: str) -> None:
        """Make directory entries created, renamed or removed in ``path`` durable."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise _translate(exc, "open", path) from exc
        try:
            os.fsync(fd)
        except OSError as exc:
            raise _translate(exc, "fsync", path) from exc
        finally:
            os.close(fd)

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except OSError as exc:
            raise _translate(exc, "listdir", path) from exc

    def read_file(self, path: str) -> bytes:
        fd = self.open(path, os.O_RDONLY)
        try:
            size = self.size(fd)
            return self.pread(fd, size, 0)
        finally:
            self.close(fd)


#: The active I/O layer. Storage modules look it up at call time (``fs.FS.pwrite(...)``).
FS: FileSystem = FileSystem()


@contextlib.contextmanager
def install(layer: FileSystem) -> Iterator[FileSystem]:
    """Use ``layer`` for every pylog file operation inside the ``with`` block (tests inject faults this way)."""
    global FS
    previous, FS = FS, layer
    try:
        yield layer
    finally:
        FS = previous


def atomic_write(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` crash-safely: write a temp file, fsync, rename over, fsync the directory.

    After a crash the file holds either the old or the new contents, never a mix.
    """
    layer = FS
    tmp = path + ".tmp"
    fd = layer.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        layer.pwrite(fd, data, 0)
        layer.fsync(fd)
    finally:
        layer.close(fd)
    layer.rename(tmp, path)
    layer.fsync_dir(os.path.dirname(path) or ".")


def makedirs(path: str) -> None:
    """Create directory ``path`` and any missing parents through the active layer, durably: each parent is
    fsynced after an entry was created in it. An existing directory is left alone."""
    layer = FS
    missing: list[str] = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        try:
            layer.mkdir(directory)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
            continue  # created concurrently by another process
        layer.fsync_dir(os.path.dirname(directory) or ".")


def rmtree(path: str, *, ignore_errors: bool = False, last: str | None = None) -> None:
    """Remove the directory tree at ``path`` (children first) through the active layer.

    Entries already gone are skipped. The removal is not durable by itself: fsync the parent directory when
    it must survive a crash. With ``ignore_errors`` a :class:`StorageError` leaves the rest in place silently.
    ``last`` names an entry of ``path`` removed after all the others (a partition's ``partition.state``, whose
    deletion marker must outlive its segment files).
    """
    layer = FS
    try:
        names = layer.listdir(path)
    except FileNotFoundError:
        return
    except OSError:
        if ignore_errors:
            return
        raise
    if last is not None:
        names = sorted(names, key=lambda name: name == last)  # stable: the listing's order otherwise
    for name in names:
        full = os.path.join(path, name)
        try:
            if os.path.isdir(full) and not os.path.islink(full):
                rmtree(full, ignore_errors=ignore_errors)
            else:
                layer.unlink(full)
        except FileNotFoundError:
            pass
        except OSError:
            if not ignore_errors:
                raise
    try:
        layer.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:
        if not ignore_errors:
            raise
