"""Producer: serialize -> partition -> batch -> append -> RecordMetadata, with kafka-python's API.

``send()`` only validates, serializes and queues the record, without a lock (see :mod:`pylog.accumulator`);
records are partitioned in bulk (murmur2 vectorized with numpy) and encoded into one batch per partition when
the queue is drained: when it holds ``max_queued_bytes`` (by that ``send()``), after ``linger_ms`` (by the
background sender thread, for records nobody waits on), on ``flush()``, on ``future.get()`` (in the waiting
caller's thread: no handoff to the sender thread and back), and on ``close()``. Per partition, records are
appended in the order they were sent.

``acks``: ``1`` (default) resolves futures after the batch was written to the operating system (survives a
crash of this process), and so does ``0`` (in one process there is no round trip to skip: a future never
resolves before its record is written, and carries its offset); ``"all"`` after fsync (survives power loss), with one
fsync shared by every batch written before it (group commit).

Timestamps of records sent without ``timestamp_ms`` are taken from the log's clock when their batch is built.

The modules of the write path, as records flow::

    producer.py          Producer (send, send_batch, flush, close, callbacks), FutureRecordMetadata
    producer_config.py   ProducerConfig: every setting's name, type, range and default
    accumulator.py       RecordAccumulator: per-topic queues, their drain into batches, delivery bookkeeping
    batching.py          batch building: sizes, cuts within max_message_bytes, grouping by partition, encoding
    sender.py            Sender: the background thread that drains fire-and-forget sends

Thread-safety: thread-safe. Any number of threads may call ``send`` concurrently.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np
import numpy.typing as npt

from pylog.accumulator import QueuedColumns, QueuedRecords, RecordAccumulator, TopicQueue
from pylog.batching import PER_RECORD, RECORD_OVERHEAD, Column
from pylog.directory import FORK_GENERATION
from pylog.errors import (
    DeliveryError,
    ForkedProcessError,
    InvalidRecordError,
    InvalidTimestampError,
    KafkaTimeoutError,
    LogClosedError,
    RecordTooLargeError,
    SerializationError,
    UnknownPartitionError,
)
from pylog.future import is_retriable
from pylog.metrics import Sensor
from pylog.producer_config import ProducerConfig
from pylog.record import decode_headers, encode_headers
from pylog.sender import SENDER_IDLE_S, Sender
from pylog.structs import RecordMetadata, TopicPartition

if TYPE_CHECKING:
    from pylog.directory import LogDirectory
    from pylog.partition.log import AppendInfo, PartitionLog
    from pylog.topic import Topic

__all__ = ["BatchFuture", "BatchResult", "FutureRecordMetadata", "Producer", "ProducerConfig"]

_log = logging.getLogger("pylog.producer")
_NO_FIELDS: Mapping[str, Any] = MappingProxyType({})
_I64_MAX = 2**63 - 1
_CLIENT_IDS = itertools.count(1)  # numbers the default client_id, as kafka-python does
_SENDER_IDLE_S = SENDER_IDLE_S  # kept under its former name for code that waits for an idle sender


def _default_key(key: Any) -> bytes:
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, bytearray | memoryview):
        return bytes(key)
    raise SerializationError(f"keys must be bytes or str without a key_serializer, got {type(key).__name__}")


class FutureRecordMetadata(tuple[Any, ...]):
    """The result of :meth:`Producer.send`, with kafka-python's ``FutureRecordMetadata`` API: ``get(timeout)``
    waits for the write and returns the :class:`~pylog.structs.RecordMetadata` (or raises the record's error);
    ``is_done``, ``value`` and ``exception`` are attributes (``value``: the metadata once written, else None;
    ``exception``: the error once failed, else None); ``succeeded()``, ``failed()``, ``retriable()``;
    ``add_callback``/``add_errback``/``add_both``/``chain``, each returning the future.

    Looking at ``exception`` (or ``get()``, an errback) counts as seeing a failure: it is then not raised again
    as a :class:`~pylog.errors.DeliveryError` by ``flush()``/``close()``.

    It is a pair ``(queue, record)`` (see :mod:`pylog.accumulator`), a tuple so that ``send`` builds it
    without running Python code; futures compare and hash by identity, like other objects."""

    __slots__ = ()
    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        p: QueuedRecords = self[0]
        state = "pending" if not p.finished else "failed" if self._error() else "done"
        return f"<FutureRecordMetadata {p.queue.name!r} {state}>"

    def get(self, timeout: float | None = None) -> RecordMetadata:
        p: QueuedRecords = self[0]
        record: tuple[Any, ...] = self[1]
        if not p.finished:
            acc = p.queue.acc
            acc.drain_for(p)  # in this thread: no handoff to the sender thread and back
            if not p.finished and not acc.wait_finished(p, timeout):
                raise KafkaTimeoutError(f"record not acknowledged within {timeout} s")
        if p.error is not None and not p.written(record):
            p.observed.add(id(record))
            raise p.error
        return self._metadata()

    def _metadata(self) -> RecordMetadata:
        p: QueuedRecords = self[0]
        record: tuple[Any, ...] = self[1]
        i = p.index_of(record)
        key, value = record[0], record[1]
        topic, partition = p.queue.name, int(p.partitions[i])
        return RecordMetadata(
            topic,
            partition,
            TopicPartition(topic, partition),
            -1 if p.offsets is None else int(p.offsets[i]),
            p.ts[i],
            None,
            -1 if key is None else len(key),
            -1 if value is None else len(value),
            _header_size(record[3]) if len(record) > 3 and record[3] else -1,
        )

    @property
    def is_done(self) -> bool:
        """True once the record was written (with ``acks="all"``: fsynced) or failed."""
        return bool(self[0].finished)

    @property
    def value(self) -> RecordMetadata | None:
        """The record's metadata once it was written, else None (as kafka-python's ``future.value``)."""
        if not self[0].finished or self._error() is not None:
            return None
        return self._metadata()

    @property
    def exception(self) -> BaseException | None:
        """The record's error once it failed, else None. Looking at it counts as seeing the failure."""
        error = self._error()
        if error is not None:
            self[0].observed.add(id(self[1]))
        return error

    def succeeded(self) -> bool:
        return bool(self[0].finished) and self._error() is None

    def failed(self) -> bool:
        return bool(self[0].finished) and self._error() is not None

    def retriable(self) -> bool:
        """True if the record failed with an error whose ``retriable`` flag is set (sending again may work)."""
        return bool(self[0].finished) and is_retriable(self._error())

    def _error(self) -> BaseException | None:
        """The error of this record: its drain failed and it was not among the batches written before."""
        p: QueuedRecords = self[0]
        if p.error is None or p.written(self[1]):
            return None
        return p.error

    def add_callback(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> FutureRecordMetadata:
        """Call ``fn(*args, metadata, **kwargs)`` once the record is written: in the producer's background
        thread or in a ``flush()``, and at once in this thread if it already is (as kafka-python does)."""
        return self._on_done(functools.partial(fn, *args, **kwargs), None)

    def add_errback(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> FutureRecordMetadata:
        """Call ``fn(*args, exception, **kwargs)`` if the record fails. The failure counts as seen: it is
        not raised again by ``flush()``/``close()``."""
        return self._on_done(None, functools.partial(fn, *args, **kwargs))

    def add_both(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> FutureRecordMetadata:
        """``fn`` as both callback and errback: called with the metadata or the exception."""
        call = functools.partial(fn, *args, **kwargs)
        return self._on_done(call, call)

    def chain(self, future: Any) -> FutureRecordMetadata:
        """Resolve ``future`` (anything with ``success(value)``/``failure(exception)``: a
        :class:`pylog.future.Future`, a kafka-python future) with this record's metadata or error."""
        return self._on_done(future.success, future.failure)

    def _on_done(
        self, ok: Callable[[Any], Any] | None, err: Callable[[Any], Any] | None
    ) -> FutureRecordMetadata:
        p: QueuedRecords = self[0]
        if err is not None:
            p.observed.add(id(self[1]))
        if p.finished:  # already written or failed: run it now, in this thread
            _run_callback(self, ok, err)
        else:
            p.queue.acc.callbacks.append((self, ok, err))
            p.queue.acc.on_callback()
        return self


class BatchResult:
    """Answer of :meth:`Producer.send_batch`: per record partition and offset, as numpy arrays."""

    __slots__ = ("offsets", "partitions", "topic")

    def __init__(self, topic: str, partitions: npt.NDArray[np.int32], offsets: npt.NDArray[np.int64]) -> None:
        self.topic = topic
        self.partitions = partitions
        self.offsets = offsets

    def __len__(self) -> int:
        return len(self.offsets)


class BatchFuture:
    """The result of ``send_batch(..., wait=False)``: the records are queued; ``get()`` writes them (in the
    caller's thread, with whatever else is queued) if no drain did yet, and returns their
    :class:`BatchResult`. As on a record's future, ``is_done``, ``value`` and ``exception`` are attributes,
    with ``succeeded()``, ``failed()``, ``retriable()``. A failure reaches the caller through ``get()`` or
    ``exception``, or else as a :class:`~pylog.errors.DeliveryError` from the producer's next
    ``flush()``/``close()``."""

    __slots__ = ("_c",)

    def __init__(self, queued: QueuedColumns) -> None:
        self._c = queued

    def __len__(self) -> int:
        return self._c.n

    @property
    def is_done(self) -> bool:
        """True once the records were written (with ``acks="all"``: fsynced) or failed."""
        return self._c.finished

    @property
    def value(self) -> BatchResult | None:
        """The records' :class:`BatchResult` once written, else None."""
        c = self._c
        if not c.finished or self._error() is not None or c.partitions is None or c.offsets is None:
            return None
        return BatchResult(c.topic, c.partitions, c.offsets)

    @property
    def exception(self) -> BaseException | None:
        """The write's error once finished (None while queued or if it succeeded); it then counts as seen."""
        error = self._error()
        if error is not None:
            self._c.observed.update(range(self._c.n))
        return error

    def succeeded(self) -> bool:
        return self._c.finished and self._error() is None

    def failed(self) -> bool:
        return self._c.finished and self._error() is not None

    def retriable(self) -> bool:
        return self._c.finished and is_retriable(self._error())

    def _error(self) -> BaseException | None:
        c = self._c
        if c.error is None or not c.unwritten():
            return None
        return c.error

    def get(self, timeout: float | None = None) -> BatchResult:
        """Wait until the records are written (with ``acks="all"``: fsynced); raises the write's error."""
        c = self._c
        if not c.finished:
            acc = c.queue.acc
            acc.drain_columns_for(c)
            if not c.finished and not acc.wait_finished(c, timeout):
                raise KafkaTimeoutError(f"records not acknowledged within {timeout} s")
        error = self.exception
        if error is not None:
            raise error
        if c.partitions is None or c.offsets is None:  # finished without an error: both are set
            raise LogClosedError("the records were not written")
        return BatchResult(c.topic, c.partitions, c.offsets)


class Producer:
    """Writes records to a :class:`~pylog.Log`. Obtain with :meth:`pylog.Log.producer`; the settings are
    :class:`~pylog.producer_config.ProducerConfig`'s."""

    def __init__(self, log: LogDirectory, **settings: Any) -> None:
        config = ProducerConfig.from_settings(settings)
        self.log = log
        self.config = config
        self.acks = config.acks
        self.linger_ms = config.linger_ms
        self.batch_size = config.batch_size
        self.compression_type = config.compression_type
        self._key_ser = config.key_serializer
        self._value_ser = config.value_serializer
        self._raw_values = self._value_ser is None
        self._topics = log.open_topics  # the open topics (send's fast lookup; log.topic() opens the others)
        # send's fast path: the queue of each open topic that has received a record (cleared by close)
        self._fast: dict[Topic | None, TopicQueue] = {}
        self._closed = False
        self._fork = log.fork_generation
        self.client_id = config.client_id or f"pylog-producer-{next(_CLIENT_IDS)}"
        self._batches = Sensor(log.clock.monotonic_ms())  # bytes per batch written (metrics())
        self._records = Sensor(
            log.clock.monotonic_ms(), lock=self._batches._lock
        )  # records per batch written
        self._acc = RecordAccumulator(log, config, self._batch_fields, self._metered_append)
        self._sender = Sender(self._acc, self._run_callbacks, linger_ms=config.linger_ms, clock=log.clock)
        self._acc.on_callback = self._sender.wake
        self._sender.start()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} client_id={self.client_id!r} log={self.log.path!r}>"

    @property
    def _sender_idle(self) -> bool:
        """The sender thread sleeps until the next send wakes it."""
        return self._sender.idle

    # -- sending ----------------------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> FutureRecordMetadata:
        """Queue one record; returns a future. Raises at once (writing nothing) for bad input.

        The arguments are kafka-python's, in its order. A record accepted here is written, or its failure
        reaches the caller: through its future (``get()``, ``exception()``, an errback), and otherwise as a
        :class:`~pylog.errors.DeliveryError` from the next :meth:`flush` or :meth:`close`."""
        try:
            t = self._topics.get(topic)
        except TypeError:  # an unhashable topic: the slow path refuses it
            t = None
        q = self._fast.get(t)
        if (
            q is None
            or q.columns  # send_batch(wait=False) calls queued before: the slow path writes them first
            or value is None
            or headers is not None
            or partition is not None
            or timestamp_ms is not None
        ):
            return self._send(topic, value, key, headers, partition, timestamp_ms)
        # The common case, inline (each function call costs as much as a record's share of the drain): an
        # open topic, a key given as bytes, the value serialized or given as bytes, no options.
        ser = self._value_ser
        if ser is None:
            vb = value
        else:
            try:
                vb = ser(value)
            except Exception as exc:
                raise SerializationError(f"value could not be serialized: {exc}") from exc
        if type(vb) is not bytes or type(key) is not bytes:
            return self._send(topic, vb, key, None, None, None, serialized=True)
        size = len(vb) + len(key) + PER_RECORD
        if size > t.config.max_message_bytes - RECORD_OVERHEAD:  # type: ignore[union-attr]
            return self._send(topic, vb, key, None, None, None, serialized=True)
        g = q.gen
        record = (key, vb)
        g.records.append(record)  # no lock: see pylog.accumulator
        g.nbytes += size
        if g.sealed or g.nbytes >= q.drain_at:
            g = self._acc.settle(q, g, record)
        return FutureRecordMetadata((g, record))

    def _send(
        self,
        topic: str,
        value: Any,
        key: Any,
        headers: Sequence[tuple[str, bytes | None]] | None,
        partition: int | None,
        timestamp_ms: int | None,
        *,
        serialized: bool = False,
    ) -> FutureRecordMetadata:
        """:meth:`send` for every case (``serialized``: ``value`` went through the value serializer)."""
        if self._closed:
            raise LogClosedError("the producer is closed")
        t = self._topics.get(topic) if type(topic) is str else None
        if t is None:
            t = self.log.topic(topic)
        if serialized:
            vb: bytes | None = self._check_value(value)
        elif value is None:
            if key is None:
                raise InvalidRecordError("key and value cannot both be None")
            vb = None
        else:
            vb = self._serialize_value(value)
        size = PER_RECORD if vb is None else len(vb) + PER_RECORD
        if type(key) is bytes and self._key_ser is None:
            kb: bytes | None = key
            size += len(key)
        elif key is None:
            if t.config.compacted:
                raise InvalidRecordError(f"topic {topic!r} is compacted: every record needs a key")
            kb = None
        else:
            kb = self._serialize_key(key)
            size += len(kb)
        options: tuple[Any, ...] = ()
        if partition is not None or timestamp_ms is not None or headers:
            options = _record_options(t, topic, partition, timestamp_ms, headers)
            size += len(options[1])
        if size > t.config.max_message_bytes - RECORD_OVERHEAD:
            raise RecordTooLargeError(
                f"record of {size} bytes exceeds max_message_bytes={t.config.max_message_bytes} of {topic!r}"
            )
        q = self._acc.queue(t)
        if q.columns:  # send_batch(wait=False) calls queued before this record are written first
            self._acc.drain_columns(q)
        if self._key_ser is None and not self._closed:
            self._fast[t] = q
        record = (kb, vb, *options)
        return FutureRecordMetadata((self._acc.append(q, record, size), record))

    def _batch_fields(self, tp: TopicPartition) -> Mapping[str, Any]:
        """Producer id, epoch, sequence and transactional flag of the next batch to ``tp`` (none here: set by
        :class:`~pylog.idempotent.IdempotentProducer`)."""
        return _NO_FIELDS

    def _append_batch(
        self, plog: PartitionLog, tp: TopicPartition, batch: bytes | bytearray, fields: Mapping[str, Any]
    ) -> AppendInfo:
        return plog.append(batch)

    def _metered_append(
        self, plog: PartitionLog, tp: TopicPartition, batch: bytes | bytearray, fields: Mapping[str, Any]
    ) -> AppendInfo:
        """:meth:`_append_batch`, counted for :meth:`metrics`."""
        info = self._append_batch(plog, tp, batch, fields)
        self._batches.record_with(
            len(batch), self._records, info.last_offset - info.base_offset + 1, self.log.clock.monotonic_ms()
        )
        return info

    def _serialize_key(self, key: Any) -> bytes:
        if self._key_ser is None:
            return _default_key(key)
        try:
            out = self._key_ser(key)
        except Exception as exc:
            raise SerializationError(f"key_serializer failed: {exc}") from exc
        if not isinstance(out, bytes):
            raise SerializationError(f"key_serializer must return bytes, got {type(out).__name__}")
        return out

    def _check_value(self, value: Any) -> bytes:
        """A value that went through the serializer (or was given as it is stored) as bytes."""
        if type(value) is bytes:
            return value
        if self._value_ser is not None:
            raise SerializationError(f"value_serializer must return bytes, got {type(value).__name__}")
        return self._serialize_value(value)

    def _serialize_value(self, value: Any) -> bytes:
        ser = self._value_ser
        if ser is None:
            if isinstance(value, bytes):
                return value
            if isinstance(value, bytearray | memoryview):
                return bytes(value)
            raise SerializationError(
                f"values must be bytes without a value_serializer, got {type(value).__name__}"
            )
        try:
            out = ser(value)
        except Exception as exc:
            raise SerializationError(f"value could not be serialized: {exc}") from exc
        if not isinstance(out, bytes):
            raise SerializationError(f"value_serializer must return bytes, got {type(out).__name__}")
        return out

    @overload
    def send_batch(
        self,
        topic: str,
        keys: Any = None,
        values: Any = None,
        *,
        partition: int | None = None,
        timestamps: npt.ArrayLike | None = None,
        wait: Literal[True] = True,
    ) -> BatchResult: ...

    @overload
    def send_batch(
        self,
        topic: str,
        keys: Any = None,
        values: Any = None,
        *,
        partition: int | None = None,
        timestamps: npt.ArrayLike | None = None,
        wait: Literal[False],
    ) -> BatchFuture: ...

    def send_batch(
        self,
        topic: str,
        keys: Any = None,
        values: Any = None,
        *,
        partition: int | None = None,
        timestamps: npt.ArrayLike | None = None,
        wait: bool = True,
    ) -> BatchResult | BatchFuture:
        """Append many already-serialized records in one call (the vectorized path, no per-record queue).

        ``keys``/``values``: a list of bytes (or None), a 2-D ``uint8`` numpy array (fixed-width records), or a
        pyarrow binary array. Keyed records are partitioned with murmur2 computed for all keys at once.
        Returns per-record partitions and offsets. Honours ``acks`` like :meth:`send`.

        ``wait=False`` checks the records (bad input raises at once, queueing nothing), queues them and
        returns a :class:`BatchFuture` at once, as :meth:`send` does for one record: a drain (the background
        thread, ``flush()``, the future's ``get()``, or the queue reaching ``max_queued_bytes``) writes the
        columns of many such calls together, as one batch where they have the same shape (fixed-width or
        null keys and values of the same widths, no ``partition`` or ``timestamps`` of their own). The
        columns are referenced, not copied, until written: do not change a numpy array passed in before
        then. Per partition, records keep the order of the calls, :meth:`send` included."""
        if self._closed:
            raise LogClosedError("the producer is closed")
        t = self._topics.get(topic) if type(topic) is str else None
        if t is None:
            t = self.log.topic(topic)
        kcol = Column.of(keys, "keys")
        vcol = Column.of(values, "values")
        n = max(len(kcol), len(vcol))
        if kcol.is_none:
            kcol = Column.nulls(n)
        if vcol.is_none:
            vcol = Column.nulls(n)
        if len(kcol) != n or len(vcol) != n:
            raise InvalidRecordError(f"keys ({len(kcol)}) and values ({len(vcol)}) differ in length")
        if not wait:
            if n == 0:
                raise InvalidRecordError("send_batch(wait=False) needs at least one record")
            return BatchFuture(self._acc.queue_columns(t, kcol, vcol, partition, timestamps))
        if n == 0:
            return BatchResult(topic, np.zeros(0, np.int32), np.zeros(0, np.int64))
        parts, offsets = self._acc.write_columns(t, kcol, vcol, partition, timestamps)
        return BatchResult(topic, parts, offsets)

    # -- metadata and metrics ---------------------------------------------------------------------------

    def partitions_for(self, topic: str) -> set[int]:
        """The partition numbers of ``topic`` (kafka-python's call). A topic that does not exist is an
        :class:`~pylog.errors.UnknownTopicError` at once (kafka-python waits ``max_block_ms`` for a broker to
        create it, then raises ``KafkaTimeoutError``)."""
        return set(range(self.log.topic(topic).num_partitions))

    def metrics(self, raw: bool = False) -> dict[Any, Any]:
        """kafka-python's shape, ``{"producer-metrics": {name: value}}`` (``raw=True``:
        ``{(group, name): value}``), counting the batches written (by :meth:`send`, :meth:`send_batch`): the
        ``-total`` names since the producer was created, ``-rate`` per second, ``-avg``/``-max`` over the last
        30 s: ``record-send-total``, ``record-send-rate``, ``byte-total``, ``byte-rate``, ``batch-size-avg``,
        ``batch-size-max`` (bytes of one batch as written), ``records-per-request-avg`` (records per batch)."""
        now = self.log.clock.monotonic_ms()
        batches, records = self._batches, self._records
        values = {
            "record-send-total": float(records.total),
            "record-send-rate": records.rate(now),
            "byte-total": float(batches.total),
            "byte-rate": batches.rate(now),
            "batch-size-avg": batches.avg(now),
            "batch-size-max": batches.max(now),
            "records-per-request-avg": records.avg(now),
        }
        if raw:
            return {("producer-metrics", name): v for name, v in values.items()}
        return {"producer-metrics": values}

    def bootstrap_connected(self) -> bool:
        """kafka-python's check of its broker connection: True while this producer and its log are open."""
        return not self._closed and not self.log.closed

    # -- lifecycle --------------------------------------------------------------------------------------

    def _run_callbacks(self) -> None:
        if not self._acc.callbacks:
            return
        callbacks = self._acc.callbacks
        ready = [c for c in callbacks if c[0].is_done]
        for c in ready:
            try:  # claims the callback: list.remove is atomic, so of two threads running callbacks (two
                callbacks.remove(c)  # flushes, or a flush beside the sender thread) exactly one runs it
            except ValueError:
                continue
            _run_callback(*c)

    def flush(self, timeout: float | None = None) -> None:
        """Write (and with ``acks="all"`` fsync) every queued record; callbacks run before it returns.

        Raises :class:`~pylog.errors.DeliveryError` if records sent since the last flush could not be written
        and nobody has seen their failure through their futures; the error says how many and why (each
        failure is reported once). :class:`~pylog.errors.KafkaTimeoutError` if another thread's write held
        the queue past ``timeout`` seconds."""
        if self._fork != self.log.fork_generation or self.log.fork_generation != _fork_now():
            raise ForkedProcessError("this producer was created before fork(); create a new one in the child")
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        # Under the drain lock (reentrant): waits for a write another thread has under way (send_batch
        # columns are written under it), for at most ``timeout``.
        if not self._acc.drain_lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            raise KafkaTimeoutError(
                f"flush did not complete within {timeout} s: another thread's write holds it"
            )
        try:
            self._acc.drain_all()
        finally:
            self._acc.drain_lock.release()
        for p in list(self._acc.inflight):  # drained by other threads: their appends or fsyncs are under way
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if not p.finished and not self._acc.wait_finished(p, left):
                raise KafkaTimeoutError(f"flush did not complete within {timeout} s")
        self._run_callbacks()
        self._raise_unseen_failures()

    def _raise_unseen_failures(self) -> None:
        failed = self._acc.take_failed()
        unseen = [(p, p.unwritten() - len(p.observed)) for p in failed]
        unseen = [(p, n) for p, n in unseen if n > 0]
        if not unseen:
            return
        count = sum(n for _, n in unseen)
        errors: list[BaseException] = []
        for p, _ in unseen:
            if p.error is not None and all(repr(e) != repr(p.error) for e in errors):
                errors.append(p.error)
        first = errors[0]
        topics = sorted({p.topic for p, _ in unseen})
        raise DeliveryError(
            f"{count} records sent to {', '.join(map(repr, topics))} were not written: "
            f"{type(first).__name__}: {first}"
            + (f" (and {len(errors) - 1} other errors)" if len(errors) > 1 else ""),
            count=count,
            errors=errors,
        ) from first

    def close(self, timeout: float | None = None) -> None:
        """Flush and stop. Further sends raise LogClosedError.

        Records still queued are written first; if the log was closed under the producer they cannot be, and
        they fail with :class:`~pylog.errors.LogClosedError`. Either way a failure nobody saw through a future
        is raised as :class:`~pylog.errors.DeliveryError` (after the producer is closed)."""
        if self._closed:
            return
        try:
            if not self.log.closed:
                try:
                    self.flush(timeout)
                except KafkaTimeoutError:
                    self._fail_unwritten(
                        f"the producer was closed before they were written (within {timeout} s)"
                    )
                    raise
            else:
                self._acc.fail_queued(
                    LogClosedError(f"the log at {self.log.path} was closed before the producer")
                )
                self._raise_unseen_failures()
        finally:
            self._closed = True
            self._fast.clear()  # send() takes its slow path, which refuses
            self._sender.stop()

    def _fail_unwritten(self, why: str) -> None:
        """Fail the records still queued (their futures raise :class:`~pylog.errors.KafkaTimeoutError`), unless
        another thread's write holds the queue: those it writes yet."""
        if self._acc.drain_lock.acquire(timeout=0.1):
            try:
                self._acc.fail_queued(KafkaTimeoutError(why))
            finally:
                self._acc.drain_lock.release()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _record_options(
    t: Topic, topic: str, partition: Any, timestamp_ms: Any, headers: Any
) -> tuple[int, bytes, int]:
    """Check and encode :meth:`Producer.send`'s optional arguments: (timestamp or -1, encoded headers,
    partition or -1), as a queued record holds them."""
    if partition is None:
        part = -1
    elif (
        isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < t.num_partitions
    ):
        raise UnknownPartitionError(
            f"partition {partition!r} does not exist in topic {topic!r} (0..{t.num_partitions - 1})"
        )
    else:
        part = partition
    if timestamp_ms is None:
        ts = -1
    elif (
        isinstance(timestamp_ms, bool)
        or not isinstance(timestamp_ms, int)
        or not 0 <= timestamp_ms <= _I64_MAX
    ):
        raise InvalidTimestampError(f"timestamp_ms must be an int in [0, 2**63-1], got {timestamp_ms!r}")
    else:
        ts = timestamp_ms
        # outside the topic's window: refused here, alone, rather than with the batch it would join
        t.config.check_timestamps(ts, ts, t.env.clock.time_ms(), f"the record for {topic!r}")
    return ts, encode_headers(headers) if headers else b"", part


def _run_callback(future: Any, ok: Callable[[Any], Any] | None, err: Callable[[Any], Any] | None) -> None:
    """Run the callback or the errback of a finished future, as its outcome says; an exception it raises is
    logged (as kafka-python does) and does not stop the others."""
    try:
        if future.succeeded() and ok is not None:
            ok(future.get())
        elif future.failed() and err is not None:
            exc = future.exception
            if exc is not None:
                err(exc)
    except Exception as exc:
        _log.warning("producer callback raised: %s", exc)


def _header_size(encoded: bytes) -> int:
    """kafka-python's ``serialized_header_size`` of headers stored as ``encoded``: the UTF-8 bytes of the keys
    plus the value bytes."""
    return sum(len(k.encode()) + (0 if v is None else len(v)) for k, v in decode_headers(encoded))


def _fork_now() -> int:
    return FORK_GENERATION[0]
