"""Fault injection below pylog: a recording file-system layer that crashes, fails and loses power on demand.

- :class:`FaultyFileSystem`: an :class:`pylog.fs.FileSystem` that records every operation (:class:`Op`),
  crashes (:class:`SimulatedCrash`) after the k-th mutating one (:data:`MUTATING_OPS`), fails the k-th
  call with ``EIO``/``ENOSPC`` (once or until cleared), and keeps a shadow model of what is durable so that
  :meth:`FaultyFileSystem.power_loss` can rewrite the directory as a power cut would leave it (one of
  :data:`POWER_LOSS_MODES`; what it changed comes back as a :class:`PowerLossReport`).
- :func:`crash_and_reopen`: a power cut of the process holding a log, then recovery.
- :func:`corrupt_segment`: a bit flip, as a failing disk would make.

A :class:`FaultyFileSystem` is thread-safe (one lock around each call and its bookkeeping). It takes effect
through :func:`pylog.fs.install`, which is process-wide: every thread's pylog file operations go through
it while installed. Objects that were open when it crashed or lost power must not be used again: their file
descriptors were closed (as the death of the process would) and the numbers may be reused; the logs among
them are ended with the "process" (:func:`pylog.directory.abandon_logs`), so that neither their ``close()``
nor the one at interpreter exit closes a descriptor that now belongs to another file.
"""

from __future__ import annotations

import errno as _errno
import os
import random
import shutil
import threading
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from pylog import fs
from pylog.clock import Clock
from pylog.directory import abandon_logs
from pylog.errors import PylogError
from pylog.log import Log, open_log

__all__ = [
    "MUTATING_OPS",
    "POWER_LOSS_MODES",
    "FaultyFileSystem",
    "Op",
    "PowerLossMode",
    "PowerLossReport",
    "SimulatedCrash",
    "corrupt_segment",
    "crash_and_reopen",
]


class SimulatedCrash(BaseException):
    """The process "died" at this point. A BaseException so that ``except Exception`` cleanup does not run
    as if it had survived; once raised, every further operation of the layer raises it too."""


#: Operations that change what a power cut would leave (crash points).
MUTATING_OPS = frozenset(
    {"create", "pwrite", "fsync", "fdatasync", "ftruncate", "rename", "unlink", "mkdir", "rmdir", "fsync_dir"}
)

PowerLossMode: TypeAlias = Literal[
    "drop_unsynced", "random_blocks", "torn_zeros", "torn_junk", "process_kill"
]
#: ``drop_unsynced``: file contents roll back to their last fsync, unsynced directory changes are undone;
#: ``random_blocks``: each unsynced block and the size independently keep the old or new contents and each
#: directory keeps a random prefix of its unsynced changes; ``torn_zeros``/``torn_junk``: unsynced directory
#: changes are undone, and every file with unsynced contents keeps its earlier writes but its last write
#: persists torn (a random prefix of the data, then zeros or garbage); ``process_kill``: nothing is lost (the
#: operating system survives), only the process dies.
POWER_LOSS_MODES: tuple[PowerLossMode, ...] = (
    "drop_unsynced",
    "random_blocks",
    "torn_zeros",
    "torn_junk",
    "process_kill",
)


@dataclass(frozen=True)
class Op:
    """One recorded call. ``mutating`` marks crash points (see :data:`MUTATING_OPS`)."""

    index: int
    name: str
    path: str
    detail: str
    mutating: bool


@dataclass
class PowerLossReport:
    """What :meth:`FaultyFileSystem.power_loss` changed, relative to what the crashed process saw."""

    mode: str
    files_changed: list[str] = field(default_factory=list)
    entries_reverted: list[str] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)


@dataclass
class _Node:
    ident: int
    is_dir: bool
    data: bytearray = field(default_factory=bytearray)
    durable: bytes = b""
    entries: dict[str, int] = field(default_factory=dict)
    durable_entries: dict[str, int] = field(default_factory=dict)
    dir_log: list[tuple[str, int | None]] = field(default_factory=list)


@dataclass
class _Tree:
    ident: int
    entries: dict[str, _Tree | int]


@dataclass
class _Write:
    ident: int
    offset: int
    data: bytes
    before: bytes


@dataclass
class _Fault:
    nth: int
    code: int
    persistent: bool
    ops: frozenset[str] | None
    seen: int = 0
    fired: bool = False


class FaultyFileSystem(fs.FileSystem):
    """A file system layer for fault injection under the directory ``root``.

    Every call is performed for real and recorded in :attr:`ops`. Beside it a shadow model of ``root`` is
    kept: per file its current and durable contents (as of its last ``fsync``/``fdatasync``), per
    directory its current and durable entries (as of its last :meth:`fsync_dir`) and the changes since. What
    exists under ``root`` when the layer is created counts as durable (``copy_from`` first copies a
    template directory there).

    - ``crash_after=k``: the first ``k`` counted operations run; the next raises :class:`SimulatedCrash`
      without running, and so does every later one. Counted are the mutating operations
      (:data:`MUTATING_OPS`; an ``open`` that may create or truncate counts as ``create``), or every
      operation with ``count_all=True``. :attr:`mutations` is the number counted so far.
    - :meth:`inject_error`: fail the n-th call (of the named operations) with ``EIO``/``ENOSPC``, once or
      until :meth:`clear_faults`; errors surface as pylog raises them
      (:class:`~pylog.errors.StorageError`/:class:`~pylog.errors.DiskFullError`). A failing ``pwrite``
      writes the first half of its data first; a failing ``fsync`` makes nothing durable.
    - :meth:`power_loss`: kill the "process" (close its descriptors) and rewrite ``root`` as a power cut
      would leave it; afterwards the layer passes calls through again with the new contents as durable.

    Paths outside ``root`` are passed through unmodelled. Thread-safe.
    """

    def __init__(
        self,
        root: str,
        *,
        crash_after: int | None = None,
        count_all: bool = False,
        copy_from: str | None = None,
        block_size: int = 4096,
        real_sync: bool = True,
    ) -> None:
        self.root = os.path.abspath(root)
        if copy_from is not None:
            if os.path.exists(self.root):
                shutil.rmtree(self.root)
            shutil.copytree(copy_from, self.root, symlinks=True)
        os.makedirs(self.root, exist_ok=True)
        self.crash_after = crash_after
        self.count_all = count_all
        self.block_size = block_size
        self.real_sync = real_sync
        self.ops: list[Op] = []
        self.mutations = 0
        self.crashed = False
        #: Where the crash happened (the first :class:`SimulatedCrash`), or None.
        self.crash_point: str | None = None
        self.errors_injected = 0
        #: Indexes (into :attr:`ops`) of the calls that failed with an injected error.
        self.failed_ops: set[int] = set()
        #: Paths found on disk that the model did not know (written around the layer).
        self.untracked: list[str] = []
        self._lock = threading.RLock()
        self._faults: list[_Fault] = []
        self._nodes: dict[int, _Node] = {}
        self._fds: dict[int, int | None] = {}
        self._fd_paths: dict[int, str] = {}
        self._last_write: dict[int, _Write] = {}  # per file: its last unsynced write
        self._baseline()

    # -- model ----------------------------------------------------------------------------------------

    def _new(self, is_dir: bool, data: bytes = b"") -> _Node:
        node = _Node(len(self._nodes) + 1, is_dir, bytearray(data), data)
        self._nodes[node.ident] = node
        return node

    def _baseline(self) -> None:
        self._nodes.clear()
        self._fds.clear()
        self._last_write.clear()
        self._root = self._scan(self.root).ident

    def _scan(self, path: str) -> _Node:
        if os.path.isdir(path) and not os.path.islink(path):
            node = self._new(True)
            for name in sorted(os.listdir(path)):
                node.entries[name] = self._scan(os.path.join(path, name)).ident
            node.durable_entries = dict(node.entries)
            return node
        with open(path, "rb") as f:
            return self._new(False, f.read())

    def _parts(self, path: str) -> list[str] | None:
        full = os.path.abspath(path)
        if full == self.root:
            return []
        if not full.startswith(self.root + os.sep):
            return None
        return full[len(self.root) + 1 :].split(os.sep)

    def _resolve(self, parts: list[str]) -> _Node | None:
        node = self._nodes[self._root]
        for name in parts:
            ident = node.entries.get(name)
            if ident is None:
                return None
            node = self._nodes[ident]
        return node

    def _parent(self, parts: list[str], path: str) -> _Node:
        parent = self._resolve(parts[:-1])
        if parent is None:
            parent = self._adopt(parts[:-1], os.path.dirname(os.path.abspath(path)))
        return parent

    def _adopt(self, parts: list[str], path: str) -> _Node:
        """A path that exists on disk but not in the model was made around this layer: take it as durable."""
        self.untracked.append(path)
        parent = self._nodes[self._root]
        for i, name in enumerate(parts):
            ident = parent.entries.get(name)
            if ident is None:
                sub = os.path.join(self.root, *parts[: i + 1])
                node = self._scan(sub) if os.path.exists(sub) else self._new(True)
                parent.entries[name] = node.ident
                parent.durable_entries[name] = node.ident
                ident = node.ident
            parent = self._nodes[ident]
        return parent

    def _link(self, parent: _Node, name: str, ident: int | None) -> None:
        if ident is None:
            parent.entries.pop(name, None)
        else:
            parent.entries[name] = ident
        parent.dir_log.append((name, ident))

    def _node_for_path(self, path: str) -> _Node | None:
        parts = self._parts(path)
        if parts is None:
            return None
        node = self._resolve(parts)
        if node is None and os.path.exists(path):
            node = self._adopt(parts, path)
        return node

    def _sync(self, node: _Node) -> None:
        if node.is_dir:
            node.durable_entries = dict(node.entries)
            node.dir_log.clear()
        else:
            node.durable = bytes(node.data)
            self._last_write.pop(node.ident, None)

    # -- fault plumbing -------------------------------------------------------------------------------

    def inject_error(
        self,
        nth: int,
        code: int = _errno.EIO,
        *,
        persistent: bool = False,
        ops: Collection[str] | None = None,
    ) -> None:
        """Fail the ``nth`` (0-based) call from now on among ``ops`` (default: every operation) with errno
        ``code``; with ``persistent`` that call and every later matching one fail until
        :meth:`clear_faults`."""
        with self._lock:
            self._faults.append(_Fault(nth, code, persistent, None if ops is None else frozenset(ops)))

    @property
    def first_failed(self) -> int | None:
        """Index (into :attr:`ops`) of the first call that failed with an injected error."""
        return min(self.failed_ops) if self.failed_ops else None

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def fault_fired(self) -> bool:
        with self._lock:
            return any(f.fired for f in self._faults)

    def _enter(self, name: str, path: str, detail: str = "", *, mutating: bool | None = None) -> None:
        """Record the call; raise the crash or the injected error it is due for."""
        counted_name = name
        is_mut = name in MUTATING_OPS if mutating is None else mutating
        if self.crashed:
            raise SimulatedCrash(f"the process already crashed ({name} {path})")
        if self.count_all or is_mut:
            if self.crash_after is not None and self.mutations >= self.crash_after:
                self.crashed = True
                self.crash_point = f"before operation #{self.mutations}: {name} {path}"
                raise SimulatedCrash(f"simulated crash {self.crash_point}")
            self.mutations += 1
        self.ops.append(Op(len(self.ops), counted_name, path, detail, is_mut))
        for fault in self._faults:
            if fault.ops is not None and name not in fault.ops:
                continue
            due = fault.seen == fault.nth or (fault.persistent and fault.seen > fault.nth)
            fault.seen += 1
            if due:
                fault.fired = True
                self.errors_injected += 1
                self.failed_ops.add(len(self.ops) - 1)
                raise fs._translate(OSError(fault.code, os.strerror(fault.code)), name, path)

    def _path_of(self, fd: int) -> str:
        return self._fd_paths.get(fd, f"fd {fd}")

    # -- the layer ------------------------------------------------------------------------------------

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        creating = bool(flags & (os.O_CREAT | os.O_TRUNC))
        with self._lock:
            self._enter("create" if creating else "open", path, oct(flags), mutating=creating)
            parts = self._parts(path)
            node = None if parts is None else self._node_for_path(path)
            fd = super().open(path, flags, mode)
            self._fd_paths[fd] = path
            if parts is not None and node is None:
                node = self._new(os.path.isdir(path))
                self._link(self._parent(parts, path), parts[-1], node.ident)
            if node is not None and flags & os.O_TRUNC and not node.is_dir:
                self._record_write(node, 0, b"", truncate=True)
            self._fds[fd] = None if node is None else node.ident
            return fd

    def close(self, fd: int) -> None:
        with self._lock:
            try:
                self._enter("close", self._path_of(fd))
            except PylogError:
                os.close(fd)  # as on Linux: the descriptor is released even when close reports an error
                self._fds.pop(fd, None)
                raise
            super().close(fd)
            self._fds.pop(fd, None)

    def _record_write(self, node: _Node, offset: int, data: bytes, *, truncate: bool = False) -> None:
        before = bytes(node.data)
        if truncate:
            del node.data[offset:]
        else:
            end = offset + len(data)
            if len(node.data) < offset:
                node.data.extend(bytes(offset - len(node.data)))
            node.data[offset:end] = data
        if not truncate:
            self._last_write[node.ident] = _Write(node.ident, offset, bytes(data), before)

    def _file(self, fd: int) -> _Node | None:
        ident = self._fds.get(fd)
        return None if ident is None else self._nodes[ident]

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        raw = bytes(data)
        with self._lock:
            node = self._file(fd)
            try:
                self._enter("pwrite", self._path_of(fd), f"{len(raw)}@{offset}")
            except PylogError:
                half = raw[: len(raw) // 2]
                if half:
                    super().pwrite(fd, half, offset)
                    if node is not None:
                        self._record_write(node, offset, half)
                raise
            super().pwrite(fd, raw, offset)
            if node is not None:
                self._record_write(node, offset, raw)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        with self._lock:
            self._enter("pread", self._path_of(fd), f"{size}@{offset}")
            return super().pread(fd, size, offset)

    def fsync(self, fd: int) -> None:
        with self._lock:
            self._enter("fsync", self._path_of(fd))
            self._really_sync(fd)
            node = self._file(fd)
            if node is not None:
                self._sync(node)

    def fdatasync(self, fd: int) -> None:
        with self._lock:
            self._enter("fdatasync", self._path_of(fd))
            self._really_sync(fd)
            node = self._file(fd)
            if node is not None:
                self._sync(node)

    def _really_sync(self, fd: int) -> None:
        if self.real_sync:
            super().fsync(fd)
        else:
            try:
                os.fstat(fd)  # without the fsync itself, a bad descriptor still fails
            except OSError as exc:
                raise fs._translate(exc, "fsync", fd) from exc

    def ftruncate(self, fd: int, size: int) -> None:
        with self._lock:
            self._enter("ftruncate", self._path_of(fd), str(size))
            super().ftruncate(fd, size)
            node = self._file(fd)
            if node is not None:
                if size <= len(node.data):
                    self._record_write(node, size, b"", truncate=True)
                else:
                    node.data.extend(bytes(size - len(node.data)))

    def size(self, fd: int) -> int:
        with self._lock:
            self._enter("size", self._path_of(fd))
            return super().size(fd)

    def rename(self, src: str, dst: str) -> None:
        with self._lock:
            self._enter("rename", src, dst)
            node = self._node_for_path(src)
            super().rename(src, dst)
            sp, dp = self._parts(src), self._parts(dst)
            if node is None or sp is None:
                if dp is not None:
                    self._node_for_path(dst)
                return
            self._link(self._parent(sp, src), sp[-1], None)
            if dp is not None:
                self._link(self._parent(dp, dst), dp[-1], node.ident)

    def unlink(self, path: str) -> None:
        with self._lock:
            self._enter("unlink", path)
            self._node_for_path(path)
            super().unlink(path)
            parts = self._parts(path)
            if parts:
                self._link(self._parent(parts, path), parts[-1], None)

    def mkdir(self, path: str) -> None:
        with self._lock:
            self._enter("mkdir", path)
            super().mkdir(path)
            parts = self._parts(path)
            if parts:
                self._link(self._parent(parts, path), parts[-1], self._new(True).ident)

    def rmdir(self, path: str) -> None:
        with self._lock:
            self._enter("rmdir", path)
            self._node_for_path(path)
            super().rmdir(path)
            parts = self._parts(path)
            if parts:
                self._link(self._parent(parts, path), parts[-1], None)

    def fsync_dir(self, path: str) -> None:
        with self._lock:
            self._enter("fsync_dir", path)
            if self.real_sync:
                super().fsync_dir(path)
            elif not os.path.isdir(path):
                raise FileNotFoundError(_errno.ENOENT, "No such directory", path)
            node = self._node_for_path(path)
            if node is not None:
                self._sync(node)

    def listdir(self, path: str) -> list[str]:
        with self._lock:
            self._enter("listdir", path)
            return super().listdir(path)

    # -- crashes --------------------------------------------------------------------------------------

    def kill(self) -> None:
        """The process dies: every descriptor opened through this layer is closed, and the logs holding them
        are ended with it (marked closed, not closed again at interpreter exit: their descriptor numbers
        now belong to the files opened next); later calls raise :class:`SimulatedCrash` until
        :meth:`power_loss` rebuilds the directory."""
        with self._lock:
            self.crashed = True
            held = set(self._fd_paths.values())
            for fd in list(self._fds):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._fds.clear()
            self._fd_paths.clear()
            abandon_logs(held)

    def _real_contents(self) -> dict[int, bytes]:
        """What the files hold on disk now (including writes made around the layer, such as the shared
        memory of ``partition.state``)."""
        out: dict[int, bytes] = {}
        for rel, node in self._walk(current=True):
            if rel and not node.is_dir:
                try:
                    with open(os.path.join(self.root, rel), "rb") as f:
                        out[node.ident] = f.read()
                except OSError:
                    pass
        return out

    def bypassed(self) -> list[str]:
        """Paths under ``root`` that exist on disk but not in the model, or the other way round: what was
        created, renamed or removed around this layer (empty when every change went through it)."""
        with self._lock:
            model = {rel for rel, _ in self._walk(current=True) if rel}
            disk = set()
            for dirpath, dirnames, filenames in os.walk(self.root):
                for name in dirnames + filenames:
                    disk.add(os.path.relpath(os.path.join(dirpath, name), self.root))
            return sorted(model ^ disk) + list(self.untracked)

    def unsynced_files(self) -> list[str]:
        """Paths (relative to ``root``) whose current contents differ from their durable contents."""
        out = []
        for rel, node in self._walk(current=True):
            if not node.is_dir and bytes(node.data) != node.durable:
                out.append(rel)
        return out

    def _walk(self, *, current: bool) -> Iterator[tuple[str, _Node]]:
        stack: list[tuple[str, _Node]] = [("", self._nodes[self._root])]
        while stack:
            rel, node = stack.pop()
            yield rel, node
            if node.is_dir:
                entries = node.entries if current else node.durable_entries
                for name, ident in sorted(entries.items()):
                    stack.append((os.path.join(rel, name) if rel else name, self._nodes[ident]))

    def power_loss(
        self, mode: PowerLossMode = "drop_unsynced", rng: random.Random | None = None
    ) -> PowerLossReport:
        """Kill the process and rewrite ``root`` as the power cut ``mode`` (see :data:`POWER_LOSS_MODES`)
        would leave it. Then the layer is usable again, with the rewritten directory as its durable
        baseline (and no crash or error scheduled)."""
        if mode not in POWER_LOSS_MODES:
            raise ValueError(f"unknown power loss mode {mode!r}; use one of {POWER_LOSS_MODES}")
        rng = rng if rng is not None else random.Random(0)
        with self._lock:
            self.kill()
            report = PowerLossReport(mode)
            torn = self._torn_targets() if mode in ("torn_zeros", "torn_junk") else {}
            contents: dict[int, bytes] = {}
            tree = self._surviving_tree(self._root, mode, rng, report, "")
            on_disk = self._real_contents() if mode == "process_kill" else {}
            for ident in sorted(self._reachable(tree)):
                node = self._nodes[ident]
                if node.is_dir:
                    continue
                if mode == "process_kill":
                    data = on_disk.get(ident, bytes(node.data))
                elif mode == "random_blocks":
                    data = self._mix_blocks(node, rng)
                elif ident in torn:
                    data = self._tear(torn[ident], mode, rng)
                    report.torn.append(
                        f"node {ident}: write of {len(torn[ident].data)} bytes at {torn[ident].offset}"
                    )
                else:
                    data = node.durable
                contents[ident] = data
            self._materialize(tree, contents, report)
            self.crashed = False
            self.crash_point = None
            self.crash_after = None
            self.mutations = 0
            self.ops.clear()
            self._faults.clear()
            self.failed_ops.clear()
            self._baseline()
            return report

    def _surviving_tree(
        self, ident: int, mode: str, rng: random.Random, report: PowerLossReport, rel: str
    ) -> _Tree:
        node = self._nodes[ident]
        if mode == "process_kill":
            entries = dict(node.entries)
        else:
            entries = dict(node.durable_entries)
            keep = rng.randint(0, len(node.dir_log)) if mode == "random_blocks" else 0
            for name, target in node.dir_log[:keep]:
                if target is None:
                    entries.pop(name, None)
                else:
                    entries[name] = target
            if entries != node.entries:
                for name in sorted(set(entries) | set(node.entries)):
                    if entries.get(name) != node.entries.get(name):
                        report.entries_reverted.append(os.path.join(rel, name))
        tree = _Tree(ident, {})
        for name, target in entries.items():
            child = self._nodes[target]
            sub = os.path.join(rel, name) if rel else name
            tree.entries[name] = (
                self._surviving_tree(target, mode, rng, report, sub) if child.is_dir else target
            )
        return tree

    def _reachable(self, tree: _Tree) -> Iterator[int]:
        yield tree.ident
        for value in tree.entries.values():
            if isinstance(value, _Tree):
                yield from self._reachable(value)
            else:
                yield value

    def _mix_blocks(self, node: _Node, rng: random.Random) -> bytes:
        old, new = node.durable, bytes(node.data)
        if old == new:
            return old
        size = rng.choice([len(old), len(new)])
        bs = self.block_size
        out = bytearray()
        for start in range(0, size, bs):
            a = old[start : start + bs].ljust(min(bs, size - start), b"\0")
            b = new[start : start + bs].ljust(min(bs, size - start), b"\0")
            out += (a if a == b or rng.random() < 0.5 else b)[: size - start]
        return bytes(out)

    def _torn_targets(self) -> dict[int, _Write]:
        """Per file with unsynced contents, its last unsynced write."""
        return {
            i: w for i, w in self._last_write.items() if bytes(self._nodes[i].data) != self._nodes[i].durable
        }

    def _tear(self, w: _Write, mode: str, rng: random.Random) -> bytes:
        out = bytearray(w.before)
        if len(out) < w.offset:
            out.extend(bytes(w.offset - len(out)))
        cut = rng.randrange(0, len(w.data)) if w.data else 0
        rest = len(w.data) - cut
        filler = bytes(rest) if mode == "torn_zeros" else rng.randbytes(rest)
        out[w.offset : w.offset + len(w.data)] = w.data[:cut] + filler
        return bytes(out)

    def _materialize(self, tree: _Tree, contents: dict[int, bytes], report: PowerLossReport) -> None:
        before: dict[str, bytes] = {}
        for rel, node in self._walk(current=True):
            if rel and not node.is_dir:
                before[rel] = bytes(node.data)
        for name in os.listdir(self.root):
            full = os.path.join(self.root, name)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)

        def build(path: str, sub: _Tree, rel: str) -> None:
            for name, value in sorted(sub.entries.items()):
                full = os.path.join(path, name)
                rel_name = os.path.join(rel, name) if rel else name
                if isinstance(value, _Tree):
                    os.mkdir(full)
                    build(full, value, rel_name)
                else:
                    data = contents[value]
                    with open(full, "wb") as f:
                        f.write(data)
                    if before.get(rel_name) != data:
                        report.files_changed.append(rel_name)

        build(self.root, tree, "")


def crash_and_reopen(
    log: Log,
    mode: PowerLossMode = "drop_unsynced",
    *,
    rng: random.Random | None = None,
    clock: Clock | None = None,
) -> Log:
    """Power-cut the process that has ``log`` open (the active layer must be a :class:`FaultyFileSystem`
    rooted at ``log.path``) and open the log again, which runs recovery. ``log`` must not be used again."""
    layer = fs.FS
    if not isinstance(layer, FaultyFileSystem) or layer.root != os.path.abspath(log.path):
        raise TypeError("crash_and_reopen needs fs.install(FaultyFileSystem(log.path)) around the log")
    layer.power_loss(mode, rng)
    return open_log(log.path, clock=clock if clock is not None else log.clock, **log.defaults.to_dict())


def corrupt_segment(path: str, rng: random.Random, *, start: int = 0) -> tuple[int, int]:
    """Flip one random bit of the file at ``path`` at or after byte ``start`` (as a failing disk would);
    returns ``(position, bit)``. Written around the file-system layer on purpose."""
    size = os.path.getsize(path)
    if size <= start:
        raise ValueError(f"{path} has no byte at or after {start}")
    position = rng.randrange(start, size)
    bit = rng.randrange(8)
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ (1 << bit)]))
    return position, bit
