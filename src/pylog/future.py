"""A future with kafka-python's shape: what ``consumer.commit_async()`` returns.

``is_done``, ``value`` and ``exception`` are attributes (not methods), as in ``kafka.future.Future``::

    future = consumer.commit_async()
    future.add_callback(print).add_errback(log_it)   # each returns the future, so they chain
    ...
    if future.is_done and future.exception is None:
        ...

``success(value)`` / ``failure(exception)`` resolve it (once); callbacks and errbacks added before run in the
thread that resolves it, those added after run at once in the caller's thread. An exception raised by a
callback is logged and does not stop the others. ``retriable()`` is true for a failure whose error says the
same call may succeed if tried again (its ``retriable`` attribute: every :class:`~pylog.errors.PylogError`
has one, as kafka-python's errors do). ``get(timeout)`` (a pylog extra) waits for the outcome.

:class:`~pylog.producer.FutureRecordMetadata` (what ``producer.send()`` returns) has the same attributes and
methods, built for the send path.

Thread-safety: thread-safe.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from pylog.errors import IllegalStateError, KafkaTimeoutError

__all__ = ["Future", "is_retriable"]

_log = logging.getLogger("pylog.future")


def is_retriable(error: BaseException | None) -> bool:
    """Whether ``error`` says that the same call may succeed if tried again (its ``retriable`` flag)."""
    return error is not None and bool(getattr(error, "retriable", False))


class Future:
    """See the module docstring."""

    __slots__ = ("_callbacks", "_done", "_errbacks", "_lock", "exception", "is_done", "value")

    def __init__(self) -> None:
        self.is_done = False
        self.value: Any = None
        self.exception: BaseException | None = None
        self._callbacks: list[Callable[[Any], Any]] = []
        self._errbacks: list[Callable[[BaseException], Any]] = []
        self._lock = threading.Lock()
        self._done = threading.Event()

    def __repr__(self) -> str:
        state = "pending" if not self.is_done else "failed" if self.exception is not None else "done"
        return f"<Future {state}>"

    def succeeded(self) -> bool:
        return self.is_done and self.exception is None

    def failed(self) -> bool:
        return self.is_done and self.exception is not None

    def retriable(self) -> bool:
        return self.is_done and is_retriable(self.exception)

    def success(self, value: Any) -> Future:
        """Resolve with ``value`` and run the callbacks. A future resolves once: later calls raise."""
        with self._lock:
            self._resolve()
            self.value = value
            self.is_done = True
            callbacks, self._callbacks, self._errbacks = self._callbacks, [], []
        self._done.set()
        for fn in callbacks:
            _run(fn, value, "callback")
        return self

    def failure(self, error: BaseException | type[BaseException]) -> Future:
        """Fail with ``error`` (an exception, or an exception class to instantiate) and run the errbacks."""
        exc = error() if isinstance(error, type) else error
        if not isinstance(exc, BaseException):
            raise TypeError(f"a future fails with an exception, got {error!r}")
        with self._lock:
            self._resolve()
            self.exception = exc
            self.is_done = True
            errbacks, self._callbacks, self._errbacks = self._errbacks, [], []
        self._done.set()
        for fn in errbacks:
            _run(fn, exc, "errback")
        return self

    def _resolve(self) -> None:
        if self.is_done:
            raise IllegalStateError("this future is already resolved")

    def add_callback(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        """Call ``fn(*args, value, **kwargs)`` on success (at once if it already succeeded)."""
        f = functools.partial(fn, *args, **kwargs) if args or kwargs else fn
        with self._lock:
            if not self.is_done:
                self._callbacks.append(f)
                return self
        if self.exception is None:
            _run(f, self.value, "callback")
        return self

    def add_errback(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        """Call ``fn(*args, exception, **kwargs)`` on failure (at once if it already failed)."""
        f = functools.partial(fn, *args, **kwargs) if args or kwargs else fn
        with self._lock:
            if not self.is_done:
                self._errbacks.append(f)
                return self
        if self.exception is not None:
            _run(f, self.exception, "errback")
        return self

    def add_both(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        """``fn`` as both callback and errback: called with the value or the exception."""
        self.add_callback(fn, *args, **kwargs)
        return self.add_errback(fn, *args, **kwargs)

    def chain(self, future: Any) -> Future:
        """Resolve ``future`` (anything with ``success``/``failure``, such as a kafka-python future) as this
        one resolves."""
        self.add_callback(future.success)
        return self.add_errback(future.failure)

    def get(self, timeout: float | None = None) -> Any:
        """Wait up to ``timeout`` seconds (None: forever) for the outcome: the value, or raise the exception
        (:class:`~pylog.errors.KafkaTimeoutError` if it is still pending)."""
        if not self._done.wait(timeout):
            raise KafkaTimeoutError(f"the future was not resolved within {timeout} s")
        if self.exception is not None:
            raise self.exception
        return self.value


def _run(fn: Callable[[Any], Any], arg: Any, what: str) -> None:
    try:
        fn(arg)
    except Exception:
        _log.exception("a future's %s raised", what)
