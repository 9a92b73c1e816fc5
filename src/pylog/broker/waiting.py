"""Long-polling fetches woken by pylog's doorbell (:mod:`pylog.partition.doorbell`), not by a timer.

A Fetch with ``max_wait_ms`` and ``min_bytes`` that finds too little data waits for a writer to publish in one
of its partitions: the broker's own produce requests, an embedded producer in another process, anything that
appends to the log directory rings the partition's doorbell. Each waiting fetch registers the doorbell marks
it took *before* it read (so a publish between its read and its registration is not missed: the mark differs
and it is woken at once) with one thread, :class:`FetchWaiters`, which waits on the union of the doorbells
with ``futex_waitv`` and wakes, in the event loop, every fetch whose partitions changed.

The thread also waits on a futex word of its own (the *control* word, in an anonymous shared map): a fetch
that registers rings it, so that the thread, possibly asleep on the doorbells of other fetches, starts
waiting on the new fetch's doorbells at once instead of after its current wait (up to :data:`MAX_WAIT_S`).

Without futexes (not Linux) the doorbell thread falls back to re-checking every :data:`MAX_WAIT_S` seconds.

Thread-safety: :meth:`FetchWaiters.marks` and :meth:`FetchWaiters.wait` may be called from any thread or
coroutine; the doorbell map objects are used under the lock, or by the doorbell thread alone.
"""

from __future__ import annotations

import asyncio
import mmap
import struct
import threading
from dataclasses import dataclass, field
from typing import cast

from pylog.partition.doorbell import MAX_WAIT_S, WAITING_AT, Doorbell, Doorbells, wake, word_address

__all__ = ["FetchWaiters", "Marks"]

Marks = list[tuple[Doorbell, int]]


@dataclass(eq=False)
class _Waiter:
    marks: Marks
    loop: asyncio.AbstractEventLoop
    event: asyncio.Event = field(default_factory=asyncio.Event)


class _Control:
    """The doorbell thread's own futex word (duck-typed as a :class:`Doorbell` for ``Doorbells.wait``)."""

    _WORD = struct.Struct("<I")

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, 128)
        self.address = word_address(self._map)

    def mark(self) -> int:
        return int(self._WORD.unpack_from(self._map, 8)[0])

    def arm(self) -> None:
        self._map[WAITING_AT] = 1

    def ring(self) -> None:
        self._WORD.pack_into(self._map, 8, (self.mark() + 1) & 0xFFFFFFFF)
        if self._map[WAITING_AT]:
            wake(self._map, self.address)

    def close(self) -> None:
        self._map.close()


class FetchWaiters:
    """The doorbell thread of a broker: wakes waiting fetches when their partitions change."""

    def __init__(self) -> None:
        self._bells = Doorbells()
        self._control = _Control()
        self._lock = threading.Condition()
        self._waiting: list[_Waiter] = []
        self._closed = False
        self.released = False  # the broker is stopping: waits end at once
        self._thread = threading.Thread(target=self._run, name="pylog-broker-doorbell", daemon=True)
        self._thread.start()

    def marks(self, directories: list[str]) -> Marks | None:
        """The doorbells of these partition directories with their marks now (take them BEFORE reading)."""
        with self._lock:
            return self._bells.marks(directories)

    async def wait(self, marks: Marks | None, timeout_s: float) -> None:
        """Until a partition of ``marks`` changes, or ``timeout_s`` passes (without marks: the timeout only)."""
        if timeout_s <= 0 or self.released:
            return
        if not marks:
            await asyncio.sleep(min(timeout_s, MAX_WAIT_S))
            return
        waiter = _Waiter(marks, asyncio.get_running_loop())
        with self._lock:
            self._waiting.append(waiter)
            self._lock.notify()
            self._control.ring()
        try:
            await asyncio.wait_for(waiter.event.wait(), timeout_s)
        except TimeoutError:
            pass
        finally:
            with self._lock:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)

    def release(self) -> None:
        """End every wait now and make later ones return at once (the broker is stopping: long-polling
        fetches answer with what they have)."""
        with self._lock:
            self.released = True
            waiting, self._waiting = self._waiting, []
        for w in waiting:
            w.loop.call_soon_threadsafe(w.event.set)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._control.ring()
        self._thread.join(timeout=5)
        with self._lock:
            self._bells.close()
            self._control.close()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._waiting and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                waiting = list(self._waiting)
                control = self._control.mark()  # before looking: a registration after this rings it
                fired = [w for w in waiting if _changed(w.marks)]
                for w in fired:
                    self._waiting.remove(w)
            for w in fired:
                w.loop.call_soon_threadsafe(w.event.set)
            if fired:
                continue
            union: dict[int, tuple[Doorbell, int]] = {
                id(self._control): (cast(Doorbell, self._control), control)
            }
            for w in waiting:
                for bell, mark in w.marks:
                    union.setdefault(id(bell), (bell, mark))
            try:
                self._bells.wait(list(union.values())[:128], MAX_WAIT_S)
            except (ValueError, OSError):  # a doorbell closed meanwhile: its waiters re-read
                pass


def _changed(marks: Marks) -> bool:
    try:
        return any(bell.mark() != mark for bell, mark in marks)
    except (ValueError, OSError):
        return True
