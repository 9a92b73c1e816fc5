"""What every request handler of the broker is given: the log, the broker's options, its producers, the
doorbell waiters and the thread pool that runs blocking work (disk reads, appends, fsyncs).

Thread-safety: thread-safe (the producers are; :meth:`Context.writer` is created once under a lock).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pylog.broker.idempotence import KafkaWriter, Sequences
from pylog.broker.transactions import Transactions
from pylog.broker.waiting import FetchWaiters
from pylog.log import Log

__all__ = ["NODE_ID", "Context", "Options"]

NODE_ID = 0
T = TypeVar("T")


@dataclass(frozen=True)
class Options:
    """The broker's settings (Kafka's names in the comments)."""

    host: str  # advertised host (advertised.listeners)
    port: int
    auto_create_topics: bool = True  # auto.create.topics.enable
    num_partitions: int = 1  # num.partitions
    max_request_bytes: int = 100 << 20  # socket.request.max.bytes
    cluster_id: str = "pylog"


@dataclass
class Context:
    log: Log
    options: Options
    executor: ThreadPoolExecutor
    waiters: FetchWaiters
    _writers: dict[bool, KafkaWriter] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # one write at a time per partition from this broker, so that a Kafka batch gets consecutive offsets
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    # idempotent producers' epochs and last batches (used under write_lock)
    sequences: Sequences = field(default_factory=Sequences)
    # the pylog transactional producers serving Kafka transactional ids
    transactions: Transactions = field(default_factory=Transactions)

    _next_expiry_check: float = 0.0

    def expire_transactions(self, txns: Any) -> bool:
        """The visibility rule's ``expire`` callback: abort transactions open past their timeout (at most once
        a second of the log's clock, as pylog's consumers do); True when some were."""
        now = self.log.clock.monotonic_ms()
        with self._lock:
            if now < self._next_expiry_check:
                return False
            self._next_expiry_check = now + 1000
        return bool(txns.abort_expired(self.log.clock.time_ms()))

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the broker's thread pool."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def writer(self, durable: bool) -> KafkaWriter:
        """The producer writing Kafka clients' records as they sent them (bytes in, bytes stored);
        ``durable``: acks=all, each write fsynced before it returns."""
        with self._lock:
            producer = self._writers.get(durable)
            if producer is None:
                self.log.check_writable("create a producer")
                producer = self._writers[durable] = self.log.register_producer(
                    KafkaWriter(self.log, acks="all" if durable else 1, value_serializer=None, linger_ms=0)
                )
            return producer

    def close(self) -> None:
        with self._lock:
            writers = list(self._writers.values())
            self._writers.clear()
        for producer in writers:
            producer.close()
        self.transactions.close()
