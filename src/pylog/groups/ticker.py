"""One heartbeat thread per group and process, for all of that process's members of the group.

A member's background work (:meth:`pylog.groups.member.GroupMember._tick`) is short: a write to its
heartbeat slot when one is due, one read of the published state version. A thread per member would wake a
hundred threads twenty times a second for a hundred members, and each wake-up takes the GIL from the
threads doing real work (a consumer's ``poll()`` waits for it after every system call). So the members of
one group in one process share a :class:`Ticker`: a daemon thread that wakes every 50 ms and ticks each of
them in turn. The group-wide scan (dead members, new topics, due rebalances) is asked for once per wake-up
and done by one member.

Thread-safety: :func:`register` and :func:`unregister` may be called from any thread; once
:func:`unregister` returns, the member's tick is not running and will not run again (unless called from the
ticker's own thread, inside that tick). After ``fork()`` the child starts with no tickers: a member that
finds its ticker dead registers again (``GroupMember.poll`` does). Crash contract: none (nothing durable).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Protocol

__all__ = ["Tickable", "Ticker", "register", "unregister"]

TICK_S = 0.05


class Tickable(Protocol):
    """What a ticker drives: a member's background step (``scan``: do the group-wide scan too)."""

    def background_tick(self, scan: bool) -> bool:
        """One step; False when the member wants no more ticks (its log was closed)."""
        ...

    def scan_due(self) -> bool:
        """Whether the group-wide scan is due (asked once per wake-up, of the first member)."""
        ...


class Ticker:
    """The thread of one group directory in this process and the members it ticks."""

    def __init__(self, key: str, name: str) -> None:
        self.key = key
        self.members: dict[int, tuple[Tickable, threading.Lock]] = {}
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        stop = threading.Event()
        while not stop.wait(TICK_S):
            with _LOCK:
                members = list(self.members.values())
                if not members:
                    if _TICKERS.get(self.key) is self:
                        del _TICKERS[self.key]
                    return
            scan = members[0][0].scan_due()
            for member, busy in members:
                with busy:
                    if id(member) not in self.members:
                        continue  # unregistered meanwhile
                    if not member.background_tick(scan):
                        self._drop(member)
                scan = False

    def _drop(self, member: Tickable) -> None:
        with _LOCK:
            self.members.pop(id(member), None)


_LOCK = threading.Lock()
_TICKERS: dict[str, Ticker] = {}


def register(member: Tickable, key: str, name: str) -> threading.Thread:
    """Have ``member`` ticked by the ticker of ``key`` (a group directory), starting one if needed; returns
    the ticker's thread (alive while it ticks anyone)."""
    with _LOCK:
        ticker = _TICKERS.get(key)
        if ticker is None or (not ticker.thread.is_alive() and ticker.thread.ident is not None):
            ticker = _TICKERS[key] = Ticker(key, name)
        ticker.members[id(member)] = (member, threading.Lock())
        if ticker.thread.ident is None:
            ticker.thread.start()
        return ticker.thread


def unregister(member: Tickable, key: str) -> None:
    """Stop ticking ``member``; waits for a tick of it in progress on another thread."""
    with _LOCK:
        ticker = _TICKERS.get(key)
        entry = None if ticker is None else ticker.members.pop(id(member), None)
    if entry is not None and ticker is not None and threading.current_thread() is not ticker.thread:
        with entry[1]:
            pass


def _after_fork() -> None:
    global _LOCK
    _LOCK = threading.Lock()
    _TICKERS.clear()


_reset: Callable[[], None] = _after_fork
os.register_at_fork(after_in_child=_reset)
