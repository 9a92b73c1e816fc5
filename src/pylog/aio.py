"""asyncio clients: :class:`AsyncProducer` and :class:`AsyncConsumer`, which never block the event loop.

They have the semantics of :class:`~pylog.producer.Producer` and :class:`~pylog.consumer.Consumer` (same
configuration names, same acks, same group behaviour) with aiokafka's shape::

    async with AsyncProducer(log, acks="all") as producer:
        metadata = await producer.send_and_wait("clicks", {"page": "/"}, key="user-1")
        future = await producer.send("clicks", {"page": "/cart"})   # queued; await future for the metadata

    async with AsyncConsumer(log, "clicks", group_id="counters", auto_offset_reset="earliest") as consumer:
        async for record in consumer:
            ...
        batches = await consumer.getmany(timeout_ms=100)

How: the producer hands records to one background thread through a lock-free queue (a put costs about a
microsecond on the loop); that thread sends them in bulk, waits for their acknowledgement (the write, or the
fsync with ``acks="all"``, shared by everything queued meanwhile) and resolves the asyncio futures with one
``call_soon_threadsafe`` per bulk. Bad input (an unknown topic, a record too large) fails the future, so
``send_and_wait`` raises the same typed error as ``Producer.send``. The consumer runs every call on its own
single thread (a consumer is not thread-safe), so a long ``poll`` never stalls the loop; rebalance listener
callbacks run on that thread.

Thread-safety: use each object from one event loop.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from pylog.errors import LogClosedError
from pylog.structs import ConsumerRecord, RecordMetadata, TopicPartition

if TYPE_CHECKING:
    from pylog.log import Log

__all__ = ["AsyncConsumer", "AsyncProducer"]

T = TypeVar("T")
_BULK = 4096


class AsyncProducer:
    """An asyncio producer over :class:`~pylog.producer.Producer` (same ``**config``)."""

    def __init__(self, log: Log, **config: Any) -> None:
        self._producer = log.producer(**config)
        self._queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    async def start(self) -> None:
        """Start the background thread (also done by the first send and by ``async with``)."""
        self._ensure_thread()

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pylog-async-producer", daemon=True)
            self._thread.start()

    async def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        *,
        partition: int | None = None,
        headers: Any = None,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue a record; returns a future of its :class:`RecordMetadata` (aiokafka's ``send``)."""
        if self._closed:
            raise LogClosedError("the producer is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[RecordMetadata] = loop.create_future()
        self._ensure_thread()
        self._queue.put((loop, future, topic, value, key, partition, headers, timestamp_ms))
        return future

    async def send_and_wait(
        self, topic: str, value: Any = None, key: Any = None, **kwargs: Any
    ) -> RecordMetadata:
        """Send and wait for the acknowledgement (the write, or the fsync with ``acks="all"``)."""
        return await (await self.send(topic, value, key, **kwargs))

    async def flush(self) -> None:
        """Wait until every record queued so far is acknowledged."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._ensure_thread()
        self._queue.put((loop, future))
        await future

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            items = [item]
            while len(items) < _BULK:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(i is None for i in items)
            sent: list[tuple[Any, asyncio.Future[Any], Any]] = []
            for entry in items:
                if entry is None:
                    continue
                if len(entry) == 2:  # a flush marker: resolved after everything before it
                    sent.append((entry[0], entry[1], None))
                    continue
                loop, future, topic, value, key, partition, headers, ts = entry
                try:
                    pending = self._producer.send(
                        topic, value, key, partition=partition, headers=headers, timestamp_ms=ts
                    )
                except Exception as exc:
                    sent.append((loop, future, exc))
                    continue
                sent.append((loop, future, pending))
            try:
                self._producer.flush()
            except Exception as exc:  # every pending future carries its own error too
                del exc
            results: dict[Any, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
            for loop, future, what in sent:
                if what is None:
                    results.setdefault(loop, []).append((future, True, None))
                elif isinstance(what, BaseException):
                    results.setdefault(loop, []).append((future, False, what))
                else:
                    try:
                        results.setdefault(loop, []).append((future, True, what.get()))
                    except Exception as exc:
                        results.setdefault(loop, []).append((future, False, exc))
            for loop, done in results.items():
                try:
                    loop.call_soon_threadsafe(_resolve, done)
                except RuntimeError:
                    pass  # the loop was closed: nobody is waiting any more
            if stop:
                return

    async def stop(self) -> None:
        """Flush and close (aiokafka's name); ``close()`` is the same."""
        if self._closed:
            return
        await self.flush()
        self._closed = True
        self._queue.put(None)
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
        self._producer.close()

    close = stop

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


def _resolve(done: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for future, ok, value in done:
        if future.done():
            continue  # cancelled by its owner
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


class AsyncConsumer:
    """An asyncio consumer over :class:`~pylog.consumer.Consumer` (same ``*topics`` and ``**config``).

    ``getone()`` and ``async for`` take records from what one ``poll()`` returned, kept here until handed
    out. Those not handed out yet are given back to the consumer (a ``seek`` to the first of them, per
    partition) before any other call runs, so ``position()``, ``commit()``, ``close()``'s commit and a
    rebalance never pass a record this object has not returned; ``getmany()`` returns them first."""

    def __init__(self, log: Log, *topics: str, **config: Any) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pylog-async-consumer")
        self._consumer: Any = None
        self._topics = topics
        self._config = config
        self._log = log
        self._buffer: deque[ConsumerRecord] = deque()
        self._closed = False

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._closed:
            raise LogClosedError("the consumer is closed")
        await self.start()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    async def start(self) -> None:
        if self._consumer is None:
            loop = asyncio.get_running_loop()
            self._consumer = await loop.run_in_executor(
                self._executor, lambda: self._log.consumer(*self._topics, **self._config)
            )

    async def getmany(
        self, timeout_ms: float = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """``poll()`` off the loop: ``{TopicPartition: [ConsumerRecord, ...]}``; the records ``getone()``
        has kept and not returned yet come first (without a poll)."""
        await self.start()
        if self._buffer:
            return self._take(max_records)
        result: dict[TopicPartition, list[ConsumerRecord]] = await self._call(
            self._consumer.poll, timeout_ms, max_records
        )
        return result

    def _take(self, max_records: int | None) -> dict[TopicPartition, list[ConsumerRecord]]:
        n = len(self._buffer) if max_records is None else min(max_records, len(self._buffer))
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        for _ in range(n):
            r = self._buffer.popleft()
            out.setdefault(TopicPartition(r.topic, r.partition), []).append(r)
        return out

    def _give_back(self) -> Callable[[], None]:
        """Empty the records kept and not returned; what the consumer's thread must run first so that its
        position is the first of them again, per partition."""
        first: dict[TopicPartition, int] = {}
        for r in self._buffer:
            first.setdefault(TopicPartition(r.topic, r.partition), r.offset)
        self._buffer.clear()
        consumer = self._consumer

        def rewind() -> None:
            assigned = consumer.assignment()
            for tp, offset in first.items():
                if tp in assigned:
                    consumer.seek(tp, offset)

        return rewind

    async def getone(self) -> ConsumerRecord:
        """The next record, waiting as long as it takes."""
        while not self._buffer:
            got = await self.getmany(timeout_ms=100)
            for records in got.values():
                self._buffer.extend(records)
        return self._buffer.popleft()

    def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ConsumerRecord]:
        """Records until ``consumer_timeout_ms`` passes without one (forever by default)."""
        await self.start()
        wait = self._consumer.consumer_timeout_ms
        step = 100 if wait == float("inf") else wait
        while True:
            while self._buffer:
                yield self._buffer.popleft()
            got = await self.getmany(timeout_ms=step)
            if not got and wait != float("inf"):
                return
            for records in got.values():
                self._buffer.extend(records)

    def __getattr__(self, name: str) -> Any:
        """Every other consumer method (``commit``, ``seek``, ``position``, ``subscribe``, ``assign``, ...)
        as a coroutine run on the consumer's thread."""
        if name.startswith("_"):
            raise AttributeError(name)

        async def method(*args: Any, **kwargs: Any) -> Any:
            await self.start()
            fn = getattr(self._consumer, name)
            if not self._buffer:
                return await self._call(fn, *args, **kwargs)
            rewind = self._give_back()

            def call() -> Any:
                rewind()
                return fn(*args, **kwargs)

            return await self._call(call)

        method.__name__ = name
        return method

    async def stop(self) -> None:
        """Close the consumer (leaving its group) and its thread."""
        if self._closed:
            return
        if self._consumer is not None:
            rewind, close = self._give_back(), self._consumer.close

            def rewind_and_close() -> None:
                try:
                    rewind()
                finally:
                    close()

            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, rewind_and_close)
        self._closed = True
        self._executor.shutdown(wait=True)

    close = stop

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
