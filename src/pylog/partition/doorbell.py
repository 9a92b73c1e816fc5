"""The doorbell of a partition: how a reader waiting for new records learns, in another process, that a writer
published some, without a polling interval.

It lives in the partition's shared ``partition.state`` map (:mod:`pylog.partition.state`, which owns the byte
table): the futex word is the low half of the seqlock counter ``seq`` (bytes 8-11), which every publish
changes, and byte 64 is the ``waiting`` flag::

    waiter (any process)                          writer (holds the partition lock)
    mark = seq & 0xFFFFFFFF                       publish: seq += 1, fields, seq += 1
    look for records (none)                       full fence
    waiting = 1                                   if waiting: waiting = 0; FUTEX_WAKE(&seq, all)
    FUTEX_WAIT(&seq, mark, bounded timeout)

The kernel puts the waiter to sleep only if ``seq`` still equals ``mark`` (checked after queueing it), and the
writer reads ``waiting`` only after its new ``seq`` is visible, so either the waiter sees the new ``seq`` and
returns at once, or the writer sees the flag and wakes it: no wake-up is lost. The writer pays one byte read
when nobody waits; a waiter that was SIGKILLed leaves ``waiting`` set, which costs the next publish one
``FUTEX_WAKE`` (a few microseconds) and clears it, so nothing stays stuck. Every wait is bounded
(:data:`MAX_WAIT_S`) so that a missed wake-up (a writer of an older version, a platform without the futex
ordering above) costs at most that long. A consumer of several partitions waits on all of them at once with
``futex_waitv`` (Linux 5.16+; up to :data:`MAX_BELLS` partitions); without it, on the first one only, with a
short bound.

Why a futex: measured on the 2-core machine of ``docs/benchmarks.md`` (a producer process sending one record
every 200 us, a consumer process in ``poll()``, ``pylog_latency_e2e``), see ``docs/operations.md``: sleeping
in a backoff loop gave p50 161 us; a FIFO per partition costs the writer a ``write()`` system call per publish
(and the FIFO must be opened, kept and drained by every reader); an ``eventfd`` cannot be shared between
unrelated processes; the futex costs the writer nothing while no one waits and one system call when someone
does, and needs no file descriptor.

Only Linux has futexes: elsewhere :func:`available` is False and readers fall back to sleeping in a loop.

Thread-safety: a :class:`Doorbells` belongs to one consumer (not thread-safe); :func:`ring` is called by the
writer under the partition lock. Crash contract: none; nothing here is durable.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import platform
import struct
import sys
import threading
import time

from pylog.partition import files

__all__ = [
    "FENCE",
    "MAX_BELLS",
    "MAX_WAIT_S",
    "WAITING_AT",
    "Doorbell",
    "Doorbells",
    "available",
    "fence",
    "ring",
    "wake",
    "word_address",
]

#: bytes of ``partition.state`` the doorbell needs mapped (the seqlock line and the waiting line)
MAPPED = 128
#: the futex word: the low 32 bits of ``seq`` (little-endian)
WORD_AT = 8
#: the ``waiting`` flag byte
WAITING_AT = 64
#: longest single wait; a wait for longer loops (and looks for records) every MAX_WAIT_S
MAX_WAIT_S = 0.1
#: most partitions waited on at once (the kernel's futex_waitv limit)
MAX_BELLS = 128

_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
_FUTEX2_SIZE_U32 = 0x02
_CLOCK_MONOTONIC = 1
_WAKE_ALL = 0x7FFFFFFF
_SYS = {"x86_64": (202, 449), "aarch64": (98, 449), "arm64": (98, 449)}  # (futex, futex_waitv)
_WORD = struct.Struct("<I")
_L = ctypes.c_long  # syscall(2) takes its arguments as longs
FENCE = threading.Lock()  # acquire+release is an atomic read-modify-write: a full memory fence


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_int64), ("tv_nsec", ctypes.c_int64)]


class _Waitv(ctypes.Structure):
    _fields_ = [
        ("val", ctypes.c_uint64),
        ("uaddr", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]


def _load() -> tuple[object, int, int] | None:
    numbers = _SYS.get(platform.machine())
    if not sys.platform.startswith("linux") or numbers is None:
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)  # releases the GIL
        fn = libc.syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    return fn, numbers[0], numbers[1]


_LIBC = _load()
_waitv_ok = True  # cleared when the kernel answers ENOSYS (older than 5.16)


def available() -> bool:
    """True when this platform has the futex doorbell (Linux on x86-64 or arm64)."""
    return _LIBC is not None


def word_address(m: mmap.mmap) -> int:
    """The address of the futex word in the writable shared map ``m`` (valid while ``m`` is open)."""
    anchor = ctypes.c_char.from_buffer(m)  # a buffer export, dropped at once so that m can be closed
    try:
        return ctypes.addressof(anchor) + WORD_AT
    finally:
        del anchor


def ring(m: mmap.mmap, address: int) -> None:
    """Writer side, right after a publish changed ``seq`` in ``m`` (whose futex word is at ``address``):
    wake the processes waiting on this partition, if any. Costs a fence and a byte read when none waits
    (:class:`~pylog.partition.state.PartitionState` inlines those two and calls :func:`wake`)."""
    fence()
    if m[WAITING_AT]:
        wake(m, address)


def fence() -> None:
    """A full memory fence (an uncontended lock's atomic read-modify-write): the new ``seq`` must be visible
    to other processes before ``waiting`` is read (store-load order, which x86 does not keep on its own)."""
    FENCE.acquire()
    FENCE.release()


def wake(m: mmap.mmap, address: int) -> None:
    """Clear ``waiting`` and wake every process waiting on the futex word at ``address`` of ``m``."""
    m[WAITING_AT] = 0
    if _LIBC is not None:
        fn, futex, _ = _LIBC
        fn(_L(futex), ctypes.c_void_p(address), _L(_FUTEX_WAKE), _L(_WAKE_ALL), None, None, _L(0))  # type: ignore[operator]


class Doorbell:
    """A waiter's own shared map of one partition's ``partition.state`` (128 bytes, no descriptor kept)."""

    __slots__ = ("_map", "address", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_size < MAPPED:
                os.ftruncate(fd, MAPPED)  # a state file of 64 bytes (written before the doorbell existed)
            self._map = mmap.mmap(fd, MAPPED, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.address = word_address(self._map)

    def mark(self) -> int:
        """The futex word now (the low half of ``seq``): what a wait compares against."""
        return int(_WORD.unpack_from(self._map, WORD_AT)[0])

    def arm(self) -> None:
        """Tell writers that someone waits (they clear it when they ring)."""
        self._map[WAITING_AT] = 1

    def close(self) -> None:
        self._map.close()


class Doorbells:
    """The doorbells of the partitions one reader waits on, opened on first use, keyed by state path."""

    def __init__(self) -> None:
        self._bells: dict[str, Doorbell] = {}

    def marks(self, directories: list[str]) -> list[tuple[Doorbell, int]] | None:
        """The doorbell of each partition directory with its current mark (to read BEFORE looking for
        records), or None when they cannot all be waited on (no futex here, too many partitions, a state file
        missing)."""
        if _LIBC is None or not directories or len(directories) > MAX_BELLS:
            return None
        out = []
        bells = self._bells
        paths = [os.path.join(d, files.STATE) for d in directories]
        for path in paths:
            bell = bells.get(path)
            if bell is None:
                try:
                    bell = bells[path] = Doorbell(path)
                except (OSError, ValueError):
                    return None
            out.append((bell, bell.mark()))
        if len(bells) > len(paths) + MAX_BELLS:  # partitions no longer read
            self.retain(paths)
        return out

    def retain(self, paths: list[str]) -> None:
        keep = set(paths)
        for path in [p for p in self._bells if p not in keep]:
            self._bells.pop(path).close()

    def wait(self, marks: list[tuple[Doorbell, int]], timeout_s: float) -> None:
        """Block until a writer publishes in one of the partitions (their ``seq`` differs from its mark), for
        at most ``min(timeout_s, MAX_WAIT_S)`` seconds. May return early (a signal, a spurious wake-up)."""
        global _waitv_ok
        timeout_s = min(timeout_s, MAX_WAIT_S)
        if timeout_s <= 0 or _LIBC is None or not marks:
            return
        for bell, _ in marks:
            bell.arm()
        fn, futex, waitv = _LIBC
        if len(marks) > 1 and _waitv_ok:
            entries = (_Waitv * len(marks))(*(_Waitv(m, b.address, _FUTEX2_SIZE_U32, 0) for b, m in marks))
            end = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + int(timeout_s * 1e9)
            ts = _Timespec(end // 1_000_000_000, end % 1_000_000_000)
            res = fn(_L(waitv), entries, _L(len(marks)), _L(0), ctypes.byref(ts), _L(_CLOCK_MONOTONIC))  # type: ignore[operator]
            if res >= 0 or ctypes.get_errno() != errno.ENOSYS:
                return
            _waitv_ok = False
        if len(marks) > 1:
            timeout_s = min(timeout_s, 0.001)  # only the first one can ring: look at the others soon
        bell, mark = marks[0]
        ts = _Timespec(int(timeout_s), int((timeout_s % 1) * 1e9))
        fn(_L(futex), ctypes.c_void_p(bell.address), _L(_FUTEX_WAIT), _L(mark), ctypes.byref(ts), None, _L(0))  # type: ignore[operator]

    def close(self) -> None:
        for bell in self._bells.values():
            bell.close()
        self._bells.clear()
