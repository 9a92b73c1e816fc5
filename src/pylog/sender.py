"""The producer's sender thread: the background drain that makes fire-and-forget sends reach the log.

While records keep coming the thread polls instead of being woken by each send (waking a thread cost a
caller that waits on each record about a quarter of its time). The poll interval starts at
:data:`SENDER_POLL_S` and doubles, up to :data:`SENDER_POLL_MAX_S`, each time a poll finds nothing queued
(callers that wait on their records drain them themselves, and a thread that wakes up often takes the GIL
from them); after :data:`SENDER_IDLE_S` without records it blocks until a send wakes it.

Thread-safety: one thread runs :meth:`Sender.run`; :meth:`Sender.wake` and :meth:`Sender.stop` may be called
from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pylog.clock import SystemClock

if TYPE_CHECKING:
    from pylog.accumulator import RecordAccumulator
    from pylog.clock import Clock

__all__ = ["SENDER_GRACE_S", "SENDER_IDLE_S", "SENDER_POLL_MAX_S", "SENDER_POLL_S", "Sender"]

_log = logging.getLogger("pylog.producer")
SENDER_GRACE_S = 0.0005  # how long the sender thread leaves a waiting caller to drain its own record
SENDER_POLL_S = 0.0005  # the sender's poll interval while records keep coming ...
SENDER_POLL_MAX_S = 0.004  # ... doubled up to this while its polls find nothing queued
SENDER_IDLE_S = 0.1  # polling time without records before the sender blocks until woken


class Sender:
    """Drains ``acc`` in the background and runs the callbacks of finished records (``run_callbacks``).

    ``linger_ms`` > 0 makes it wait that long (on ``clock``) before each drain, so that more records go out
    in one batch."""

    def __init__(
        self,
        acc: RecordAccumulator,
        run_callbacks: Callable[[], None],
        *,
        linger_ms: float,
        clock: Clock,
    ) -> None:
        self._acc = acc
        self._run_callbacks = run_callbacks
        self._linger_s = linger_ms / 1000.0
        self._clock = clock
        self._stopped = False
        self._halt = threading.Event()  # set by stop()
        self._wakeup = threading.Event()
        self._thread = threading.Thread(target=self.run, name="pylog-producer-sender", daemon=True)
        acc.wake_sender = self.wake

    def start(self) -> None:
        self._thread.start()

    @property
    def idle(self) -> bool:
        """The thread waits until a send wakes it."""
        return self._acc.sleeping

    def wake(self) -> None:
        self._wakeup.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (what is queued stays queued) and join it unless called from it."""
        self._stopped = True
        self._halt.set()
        self._wakeup.set()
        if self._thread is not threading.current_thread() and self._thread.is_alive():
            self._thread.join(timeout=timeout)

    def _has_work(self) -> bool:
        return bool(self._acc.callbacks) or self._acc.queued()

    def run(self) -> None:
        interval = SENDER_POLL_S
        idle = 0.0
        acc = self._acc
        while not self._stopped:
            if self._has_work():
                interval = SENDER_POLL_S
                idle = 0.0
                self._drain_once()
                continue
            if idle < SENDER_IDLE_S:
                time.sleep(interval)
                idle += interval
                interval = min(interval * 2, SENDER_POLL_MAX_S)
                continue
            acc.sender_sleeps(True)  # from now on every append wakes this thread
            if not self._has_work() and not self._stopped:  # looked at after the flag: no wake-up is lost
                self._wakeup.wait()
            self._wakeup.clear()
            acc.sender_sleeps(False)
            interval = SENDER_POLL_S
            idle = 0.0

    def _drain_once(self) -> None:
        acc = self._acc
        if self._linger_s > 0:
            if isinstance(self._clock, SystemClock):
                self._halt.wait(self._linger_s)  # stop() ends the wait: close() does not wait out linger_ms
            else:
                self._clock.sleep(self._linger_s)
        else:
            # A caller that waits on its future drains the queue itself at once; give it that chance instead
            # of contending for the drain lock (and the GIL) at the same moment.
            time.sleep(SENDER_GRACE_S)
        try:
            if not (acc.acks == "all" and acc.inflight):  # else its end drains (group commit)
                acc.drain_all()
            self._run_callbacks()
        except Exception as exc:  # the log was closed under us; futures carry the errors
            _log.debug("sender stopped: %s", exc)
            if acc.queued():
                time.sleep(SENDER_POLL_S)
