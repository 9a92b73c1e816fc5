"""Producer: serialize -> partition -> batch -> append -> RecordMetadata, with kafka-python's API.

``send()`` only validates, serializes and queues the record (cheap); records are partitioned in bulk (murmur2
vectorized with numpy) and encoded into one batch per partition when the queue is drained: when it holds
enough bytes, after ``linger_ms`` (a background sender thread), on ``flush()``, on ``future.get()``, and on
``close()``. Per partition, records are appended in the order they were sent.

``acks``: ``0`` resolves futures at once (offset -1); ``1`` (default) after the batch was written to the
operating system (survives a crash of this process); ``"all"`` after fsync (survives power loss), with one
fsync shared by every batch written before it (group commit).

Timestamps of records sent without ``timestamp_ms`` are taken from the log's clock when their batch is built.

``batch_size`` bounds the bytes of one batch written to a partition. Its embedded default is 256 KiB, larger
than Kafka's 16 KiB: there is no network request to size, and bigger batches cost readers less per record.

Thread-safety: thread-safe. Any number of threads may call ``send`` concurrently.
"""

from __future__ import annotations

import functools
import logging
import operator
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np
import numpy.typing as npt

from pylog.directory import FORK_GENERATION
from pylog.errors import (
    ConfigError,
    DeliveryError,
    ForkedProcessError,
    InvalidRecordError,
    InvalidTimestampError,
    KafkaTimeoutError,
    LogClosedError,
    RecordTooLargeError,
    SerializationError,
    UnknownPartitionError,
    UnknownTopicError,
)
from pylog.partitioner import KEYLESS_RUN_BYTES, StickyPartitioner, partitions_for_keys
from pylog.record import (
    HEADER_SIZE,
    LAYOUT_SIZE,
    encode_batch,
    encode_columns,
    encode_headers,
    item_lengths,
)
from pylog.structs import RecordMetadata, TopicPartition

if TYPE_CHECKING:
    from pylog.directory import LogDirectory
    from pylog.partition.log import AppendInfo, PartitionLog
    from pylog.topic import Topic

__all__ = ["BatchResult", "FutureRecordMetadata", "Producer"]

_log = logging.getLogger("pylog.producer")
_MSGPACK = msgpack.Packer(use_bin_type=True, autoreset=True).pack
_DEFAULT: Any = object()
_NO_FIELDS: Mapping[str, Any] = MappingProxyType({})
_I64_MAX = 2**63 - 1
_PER_RECORD = 8  # bytes of column overhead budgeted per record in the queue's byte count
# The most column bytes a record can cost in a batch (8 B timestamp delta, 4 B each offset delta, key, value and
# headers length): batches are cut with it, so a batch of records that each fit max_message_bytes fits too.
_PER_RECORD_MAX = 24
_SENDER_GRACE_S = 0.0005  # how long the sender thread leaves a waiting caller to drain its own record
_SENDER_POLL_S = 0.0005  # the sender's poll interval while records keep coming ...
_SENDER_POLL_MAX_S = 0.004  # ... doubled up to this while its polls find nothing queued
_SENDER_IDLE_S = 0.1  # polling time without records before the sender blocks until woken
_FIELDS = 5  # items per queued record (see _Pending)
_SMALL_BATCH = 32  # chunks up to this many records go through encode_batch (struct only, lower latency)
_RECORD_OVERHEAD = HEADER_SIZE + LAYOUT_SIZE + 16  # a batch of one record: header, layout, widest lengths


def _default_key(key: Any) -> bytes:
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, bytearray | memoryview):
        return bytes(key)
    raise SerializationError(f"keys must be bytes or str without a key_serializer, got {type(key).__name__}")


class _Pending:
    """Records queued for one topic, drained together.

    ``send`` adds each record as five consecutive items of ``records`` (key, value, timestamp or -1, encoded
    headers, partition or -1): extending one flat list is cheaper than appending to five, and the drain splits
    it into columns with slices. ``plain`` stays True while no record has a partition, timestamp or headers
    of its own."""

    __slots__ = (
        "error",
        "finished",
        "headers",
        "keys",
        "nbytes",
        "observed",
        "offsets",
        "partitions",
        "plain",
        "producer",
        "records",
        "topic",
        "ts",
        "values",
    )

    def __init__(self, producer: Producer, topic: str) -> None:
        self.producer = producer
        self.topic = topic
        self.records: list[Any] = []
        self.plain = True
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.ts: list[int] = []
        self.headers: list[bytes] = []
        self.partitions: list[int] = []
        self.nbytes = 0
        self.finished = False  # written (or failed); waiters are woken through the producer's condition
        self.error: BaseException | None = None
        self.observed: set[int] = set()  # records of a failed drain whose failure reached the user
        self.offsets: npt.NDArray[np.int64] | range | None = None

    def written(self, i: int) -> bool:
        """Record ``i`` reached the log (a drain that failed part way wrote the batches before the failure)."""
        offsets = self.offsets
        return offsets is not None and int(offsets[i]) >= 0

    def unwritten(self) -> int:
        offsets = self.offsets
        if offsets is None:
            return len(self.keys)
        return 0 if isinstance(offsets, range) else int((offsets < 0).sum())

    def split(self) -> None:
        """Turn the queued records into the column lists (once, when drained)."""
        r, self.records = self.records, []
        self.keys, self.values, self.ts, self.headers, self.partitions = (
            r[0::_FIELDS],
            r[1::_FIELDS],
            r[2::_FIELDS],
            r[3::_FIELDS],
            r[4::_FIELDS],
        )


class FutureRecordMetadata:
    """The result of :meth:`Producer.send`. ``get()`` waits for the write and returns RecordMetadata."""

    __slots__ = ("_i", "_p")

    def __init__(self, pending: _Pending, index: int) -> None:
        self._p = pending
        self._i = index

    def get(self, timeout: float | None = None) -> RecordMetadata:
        p = self._p
        if not p.finished:
            p.producer._drain_for(p, timeout)
            if not p.finished and not p.producer._wait_finished(p, timeout):
                raise KafkaTimeoutError(f"record not acknowledged within {timeout} s")
        error = self._error()
        if error is not None:
            p.observed.add(self._i)
            raise error
        i = self._i
        key, value = p.keys[i], p.values[i]
        offset = -1 if p.offsets is None else int(p.offsets[i])
        return RecordMetadata(
            p.topic,
            p.partitions[i],
            offset,
            p.ts[i],
            -1 if key is None else len(key),
            -1 if value is None else len(value),
        )

    def is_done(self) -> bool:
        return self._p.finished

    def succeeded(self) -> bool:
        return self._p.finished and self._error() is None

    def failed(self) -> bool:
        return self._p.finished and self._error() is not None

    def exception(self) -> BaseException | None:
        error = self._error()
        if error is not None:
            self._p.observed.add(self._i)
        return error

    def _error(self) -> BaseException | None:
        """The error of this record: its drain failed and it was not among the batches written before."""
        p = self._p
        if p.error is None or p.written(self._i):
            return None
        return p.error

    def add_callback(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> FutureRecordMetadata:
        """Call ``fn(*args, metadata, **kwargs)`` once the record is acknowledged (as kafka-python does; at
        the next flush or from the sender thread if it already is)."""
        self._p.producer._callbacks.append((self, functools.partial(fn, *args, **kwargs), None))
        self._p.producer._wake()
        return self

    def add_errback(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> FutureRecordMetadata:
        """Call ``fn(*args, exception, **kwargs)`` if the record fails. The failure counts as seen: it is
        not raised again by ``flush()``/``close()``."""
        self._p.observed.add(self._i)
        self._p.producer._callbacks.append((self, None, functools.partial(fn, *args, **kwargs)))
        self._p.producer._wake()
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


class Producer:
    """Writes records to a :class:`~pylog.Log`. Obtain with :meth:`pylog.Log.producer`."""

    def __init__(
        self,
        log: LogDirectory,
        *,
        acks: int | str = 1,
        linger_ms: float = 0,
        batch_size: int = 262144,
        key_serializer: Callable[[Any], bytes] | None = None,
        value_serializer: Callable[[Any], bytes] | None = _DEFAULT,
        compression_type: str | None = None,
        max_queued_bytes: int = 1 << 20,
        **unknown: Any,
    ) -> None:
        if unknown:
            extra = (
                " (retries and retry_backoff_ms need enable_idempotence=True)"
                if {"retries", "retry_backoff_ms"} & set(unknown)
                else ""
            )
            raise ConfigError(f"unknown producer config {', '.join(sorted(unknown))}{extra}")
        if acks not in (0, 1, "all", -1):
            raise ConfigError(f"acks must be 0, 1 or 'all', got {acks!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if not isinstance(linger_ms, int | float) or linger_ms < 0:
            raise ConfigError(f"linger_ms must be >= 0, got {linger_ms!r}")
        if compression_type not in (None, "none", "gzip", "zstd", "lz4"):
            raise ConfigError(f"compression_type must be none, gzip, zstd or lz4, got {compression_type!r}")
        if key_serializer is not None and not callable(key_serializer):
            raise ConfigError(
                f"key_serializer must be a callable returning bytes or None, got {key_serializer!r}"
            )
        if (
            value_serializer is not _DEFAULT
            and value_serializer is not None
            and not callable(value_serializer)
        ):
            raise ConfigError(
                f"value_serializer must be a callable returning bytes, or None for values given as bytes, got "
                f"{value_serializer!r}"
            )
        if (
            isinstance(max_queued_bytes, bool)
            or not isinstance(max_queued_bytes, int)
            or max_queued_bytes < 1
        ):
            raise ConfigError(f"max_queued_bytes must be an int >= 1, got {max_queued_bytes!r}")
        self.log = log
        self.acks = "all" if acks == -1 else acks
        self.linger_ms = float(linger_ms)
        self.batch_size = batch_size
        self.compression_type = compression_type
        self._key_ser = key_serializer
        self._value_ser: Callable[[Any], bytes] | None = (
            _MSGPACK if value_serializer is _DEFAULT else value_serializer
        )
        self._raw_values = self._value_ser is None
        self._max_queued = max(max_queued_bytes, batch_size)
        self._lock = threading.Lock()
        self._drain_lock = threading.RLock()
        self._pending: dict[str, _Pending] = {}
        self._topics = log.open_topics  # the open topics (send's fast lookup; log.topic() opens the others)
        self._sticky = StickyPartitioner(min(batch_size, KEYLESS_RUN_BYTES))
        self._closed = False
        self._callbacks: list[tuple[FutureRecordMetadata, Any, Any]] = []
        self._failed: list[_Pending] = []  # failed drains not yet reported by flush()/close()
        self._inflight: set[_Pending] = set()  # taken from the queue, not yet finished (fsync under way)
        self._wakeup = threading.Event()
        self._finished_cond = threading.Condition()
        self._finish_waiters = 0
        self._sender_idle = False  # blocked on _wakeup (set by the sender thread only)
        self._fork = log.fork_generation
        self._sender = threading.Thread(target=self._run_sender, name="pylog-producer-sender", daemon=True)
        self._sender.start()

    # -- sending ----------------------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> FutureRecordMetadata:
        """Queue one record; returns a future. Raises at once (writing nothing) for bad input.

        The arguments are kafka-python's, in its order. A record accepted here is written, or its failure
        reaches the caller: through its future (``get()``, ``exception()``, an errback), and otherwise as a
        :class:`~pylog.errors.DeliveryError` from the next :meth:`flush` or :meth:`close`."""
        if self._closed:
            raise LogClosedError("the producer is closed")
        t = self._topics.get(topic) if type(topic) is str else None
        if t is None:
            t = self.log.topic(topic)
        # the common case first: bytes given as they are stored, no partition, timestamp or headers
        if type(value) is bytes and self._raw_values:
            vb: bytes | None = value
            size = len(value) + _PER_RECORD
        elif value is None:
            if key is None:
                raise InvalidRecordError("key and value cannot both be None")
            vb = None
            size = _PER_RECORD
        else:
            vb = self._serialize_value(value)
            size = len(vb) + _PER_RECORD
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
        plain = partition is None and timestamp_ms is None and not headers
        if plain:
            record: tuple[Any, ...] = (kb, vb, -1, b"", -1)
        else:
            part, ts, hb = _record_options(t, topic, partition, timestamp_ms, headers)
            size += len(hb)
            record = (kb, vb, ts, hb, part)
        if size > t.config.max_message_bytes - _RECORD_OVERHEAD:
            raise RecordTooLargeError(
                f"record of {size} bytes exceeds max_message_bytes={t.config.max_message_bytes} of {topic!r}"
            )
        with self._lock:
            p = self._pending.get(topic)
            if p is None:
                p = self._pending[topic] = _Pending(self, topic)
                if self._sender_idle:
                    self._wakeup.set()
            records = p.records
            i = len(records) // _FIELDS
            records += record
            nbytes = p.nbytes = p.nbytes + size
            if not plain:
                p.plain = False
        if nbytes >= self._max_queued:
            self._drain_topic(topic, p)
        return FutureRecordMetadata(p, i)

    def _batch_fields(self, tp: TopicPartition) -> Mapping[str, Any]:
        """Producer id, epoch, sequence and transactional flag of the next batch to ``tp`` (none here: set by
        :class:`~pylog.idempotent.IdempotentProducer`)."""
        return _NO_FIELDS

    def _append_batch(
        self, plog: PartitionLog, tp: TopicPartition, batch: bytes, fields: Mapping[str, Any]
    ) -> AppendInfo:
        return plog.append(batch)

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

    # -- draining ---------------------------------------------------------------------------------------

    def _take(self, topic: str, p: _Pending | None = None) -> _Pending | None:
        with self._lock:
            cur = self._pending.get(topic)
            if cur is None or (p is not None and cur is not p):
                return None
            return self._pending.pop(topic)

    def _drain_topic(self, topic: str, p: _Pending | None = None) -> None:
        """Append the records queued for ``topic`` (under the drain lock, which keeps them in order), then,
        with ``acks="all"``, wait for their fsync outside it: drains of other threads append meanwhile, and
        the partition's next fsync covers them all (group commit)."""
        with self._drain_lock:
            taken = self._take(topic, p)
            if taken is None:
                return
            self._inflight.add(taken)
            durable = self._write(topic, taken)
        try:
            if durable:
                self._make_durable(topic, taken, durable)
        finally:
            self._inflight.discard(taken)

    def _drain_all(self) -> None:
        for topic in list(self._pending):
            self._drain_topic(topic)

    def _drain_for(self, p: _Pending, timeout: float | None) -> None:
        """Drain ``p`` for a caller waiting on one of its records. With ``acks="all"`` and an fsync of this
        producer under way, first wait for that fsync: the records sent meanwhile then go out as one batch
        with one fsync (group commit), instead of one batch and one fsync per waiting caller."""
        if self.acks == "all" and self._inflight:
            with self._finished_cond:
                self._finish_waiters += 1
                try:
                    self._finished_cond.wait_for(
                        lambda: p.finished or not self._inflight or self._pending.get(p.topic) is not p,
                        timeout,
                    )
                finally:
                    self._finish_waiters -= 1
        if not p.finished:
            self._drain_topic(p.topic, p)

    def _make_durable(self, topic: str, p: _Pending, durable: list[tuple[PartitionLog, int]]) -> None:
        try:
            for plog, up_to in durable:
                plog.flush(up_to)
        except BaseException as exc:
            self._fail(topic, p, exc)
        finally:
            self._finish(p)

    def _fail(self, topic: str, p: _Pending, exc: BaseException) -> None:
        if self.acks == "all":
            p.offsets = None  # not durable: none of them is acknowledged
        p.error = self._typed(topic, exc)
        with self._lock:
            self._failed.append(p)
        _log.debug("producer write to %s failed: %r", topic, exc)

    def _finish(self, p: _Pending) -> None:
        p.finished = True
        self._inflight.discard(p)
        if self._finish_waiters:  # read after setting finished: see _wait_finished
            with self._finished_cond:
                self._finished_cond.notify_all()

    def _write(self, topic: str, p: _Pending) -> list[tuple[PartitionLog, int]]:
        """Append ``p``'s records; returns what must be fsynced before they are acknowledged (``acks="all"``),
        else marks them finished."""
        durable: list[tuple[PartitionLog, int]] = []
        try:
            self._append_pending(topic, p, durable)
        except BaseException as exc:
            self._fail(topic, p, exc)
            durable = []
        if not durable:
            self._finish(p)
        return durable

    def _append_pending(self, topic: str, p: _Pending, durable: list[tuple[PartitionLog, int]]) -> None:
        p.split()
        t = self.log.topic(topic)
        n = len(p.keys)
        now = self.log.clock.time_ms()
        if n <= _SMALL_BATCH and t.num_partitions == 1 and self._fits_one_batch(t, p, n):
            self._write_small(t, p, now, durable)
            return
        if p.plain or t.config.log_append_time:
            ts = np.full(n, now, dtype=np.int64)
            p.ts = [now] * n
        else:
            ts = np.asarray(p.ts, dtype=np.int64)
            ts[ts < 0] = now
            p.ts = ts.tolist()
        parts = self._assign_partitions(t, p)
        offsets = np.full(n, -1, dtype=np.int64)
        p.offsets = offsets  # filled batch by batch: a failure part way fails only the rest
        self._append_groups(t, p, parts, ts, offsets, durable)

    def _typed(self, topic: str, exc: BaseException) -> BaseException:
        """The error to report for a failed drain: a topic deleted under the producer (its files vanish) is
        :class:`UnknownTopicError`, not an ``OSError``."""
        if isinstance(exc, FileNotFoundError | LogClosedError) and not self.log.closed:
            try:
                gone = not self.log.has_topic(topic)
            except Exception:
                gone = False
            if gone:
                typed = UnknownTopicError(f"topic {topic!r} was deleted before these records were written")
                typed.__cause__ = exc
                return typed
        return exc

    def _write_small(self, t: Topic, p: _Pending, now: int, durable: list[tuple[PartitionLog, int]]) -> None:
        """:meth:`_write` for a few records to a one-partition topic (a caller waiting on each send): one
        batch, built and acknowledged without numpy, whose per-call overhead would dominate."""
        n = len(p.keys)
        if p.plain or t.config.log_append_time:
            p.ts = [now] * n
        else:
            p.ts = [now if x < 0 else x for x in p.ts]
        p.partitions = [0] * n
        plog = t.partition(0)
        tp = TopicPartition(plog.topic, 0)
        fields = self._batch_fields(tp)
        headers = p.headers if not p.plain and any(p.headers) else None
        compression = self.compression_type or t.config.compression_type
        batch = encode_batch(0, p.keys, p.values, p.ts, headers, compression=compression, **fields)
        info = self._append_batch(plog, tp, batch, fields)
        if info.log_append_time >= 0:
            p.ts = [info.log_append_time] * n
        p.offsets = range(info.base_offset, info.last_offset + 1)
        if self.acks == "all":
            durable.append((plog, info.last_offset + 1))

    def _fits_one_batch(self, t: Topic, p: _Pending, n: int) -> bool:
        if n == 1:
            return True  # send() checked that a record fits on its own
        compression = self.compression_type or t.config.compression_type
        limit = _payload_limit(min(t.config.max_message_bytes, self.batch_size), compression)
        return p.nbytes + n * (_PER_RECORD_MAX - _PER_RECORD) <= limit

    def _assign_partitions(self, t: Topic, p: _Pending) -> npt.NDArray[np.int32]:
        n = t.num_partitions
        if n == 1:
            p.partitions = [0] * len(p.keys)
            return np.zeros(len(p.keys), dtype=np.int32)
        parts = np.asarray(p.partitions, dtype=np.int32)
        free = np.flatnonzero(parts < 0)
        if len(free):
            keys = p.keys
            keyed = [i for i in free.tolist() if keys[i] is not None]
            if keyed:
                parts[keyed] = partitions_for_keys([keys[i] for i in keyed], n)  # type: ignore[misc]
            if len(keyed) < len(free):
                keyless = [i for i in free.tolist() if keys[i] is None]
                values, headers = p.values, p.headers
                sizes = [len(values[i] or b"") + len(headers[i]) + _PER_RECORD for i in keyless]
                parts[keyless] = self._sticky.partitions(
                    t.name, n, sizes, lambda q: t.partition(q).log_end_offset, t
                )
        p.partitions = parts.tolist()
        return parts

    def _append_groups(
        self,
        t: Topic,
        p: _Pending,
        parts: npt.NDArray[np.int32],
        ts: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
        durable: list[tuple[PartitionLog, int]],
    ) -> None:
        n = len(p.keys)
        groups = [np.arange(n)] if t.num_partitions == 1 else _group(parts)
        compression = self.compression_type or t.config.compression_type
        limit = _payload_limit(min(t.config.max_message_bytes, self.batch_size), compression)
        columns = _Columns(p)
        flush_to: dict[int, int] = {}
        for idx in groups:
            part = int(parts[idx[0]])
            plog = t.partition(part)
            tp = TopicPartition(plog.topic, plog.partition)
            for whole in _cut(idx, columns.sizes, limit):
                for chunk, batch, fields in self._encoded(
                    whole, tp, t.config.max_message_bytes, lambda c, f: columns.encode(c, ts, compression, f)
                ):
                    info = self._append_batch(plog, tp, batch, fields)
                    offsets[chunk] = np.arange(info.base_offset, info.last_offset + 1)
                    if info.log_append_time >= 0:
                        for i in chunk.tolist():
                            p.ts[i] = info.log_append_time
                    flush_to[part] = info.last_offset + 1
        if self.acks == "all":
            durable.extend((t.partition(part), up_to) for part, up_to in flush_to.items())

    def _encoded(
        self,
        chunk: npt.NDArray[np.intp],
        tp: TopicPartition,
        max_bytes: int,
        encode: Callable[[npt.NDArray[np.intp], Mapping[str, Any]], bytes],
    ) -> Iterator[tuple[npt.NDArray[np.intp], bytes, Mapping[str, Any]]]:
        """Encode ``chunk`` as one batch, or, should it come out larger than ``max_bytes`` (compression that
        grows the data), as halves, recursively: records that fit on their own never fail for being batched
        together. Each batch's fields are taken when it is about to be appended (they follow the appends)."""
        fields = self._batch_fields(tp)
        batch = encode(chunk, fields)
        if len(batch) <= max_bytes or len(chunk) == 1:
            yield chunk, batch, fields
            return
        half = len(chunk) // 2
        yield from self._encoded(chunk[:half], tp, max_bytes, encode)
        yield from self._encoded(chunk[half:], tp, max_bytes, encode)

    def send_batch(
        self,
        topic: str,
        keys: Any = None,
        values: Any = None,
        *,
        partition: int | None = None,
        timestamps: npt.ArrayLike | None = None,
    ) -> BatchResult:
        """Append many already-serialized records in one call (the vectorized path, no per-record queue).

        ``keys``/``values``: a list of bytes (or None), a 2-D ``uint8`` numpy array (fixed-width records), or a
        pyarrow binary array. Keyed records are partitioned with murmur2 computed for all keys at once.
        Returns per-record partitions and offsets. Honours ``acks`` like :meth:`send`."""
        if self._closed:
            raise LogClosedError("the producer is closed")
        t = self.log.topic(topic)
        kcol = _Column.of(keys, "keys")
        vcol = _Column.of(values, "values")
        n = max(len(kcol), len(vcol))
        if n == 0:
            return BatchResult(topic, np.zeros(0, np.int32), np.zeros(0, np.int64))
        if kcol.is_none:
            kcol = _Column.nulls(n)
        if vcol.is_none:
            vcol = _Column.nulls(n)
        if len(kcol) != n or len(vcol) != n:
            raise InvalidRecordError(f"keys ({len(kcol)}) and values ({len(vcol)}) differ in length")
        sizes, largest = self._batch_sizes(t, kcol, vcol)
        now = self.log.clock.time_ms()
        ts: npt.NDArray[np.int64] | None = None  # None: every record gets ``now``
        if timestamps is not None:
            ts = np.asarray(timestamps, dtype=np.int64)
            if ts.shape != (n,) or (ts < 0).any():
                raise InvalidTimestampError("timestamps must be n integers >= 0")
            if t.config.log_append_time:
                ts = None
        if largest + HEADER_SIZE + LAYOUT_SIZE > t.config.max_message_bytes:
            raise RecordTooLargeError(f"a record exceeds max_message_bytes={t.config.max_message_bytes}")
        parts = self._batch_partitions(t, kcol, vcol, partition, n)
        offsets = np.empty(n, dtype=np.int64)
        compression = self.compression_type or t.config.compression_type
        limit = _payload_limit(t.config.max_message_bytes, compression)
        with self._drain_lock:
            self._drain_topic(topic)
            if t.num_partitions == 1 or partition is not None:
                groups: list[tuple[int, list[Any]]] = [(int(parts[0]), _runs(n, sizes, limit))]
            else:
                groups = [
                    (int(parts[idx[0]]), _cut(idx, _sizes_of(sizes, n), limit)) for idx in _group(parts)
                ]
            for part, chunks in groups:
                plog = t.partition(part)
                tp = TopicPartition(plog.topic, plog.partition)
                for sel in chunks:
                    kl, kd = kcol.take(sel)
                    vl, vd = vcol.take(sel)
                    chunk_ts = np.full(len(kl), now, dtype=np.int64) if ts is None else ts[sel]
                    fields = self._batch_fields(tp)
                    batch = encode_columns(0, kl, kd, vl, vd, chunk_ts, compression=compression, **fields)
                    info = self._append_batch(plog, tp, batch, fields)
                    offsets[sel] = np.arange(info.base_offset, info.last_offset + 1)
                if self.acks == "all":
                    last = chunks[-1]
                    plog.flush(int(offsets[last.stop - 1 if isinstance(last, slice) else last[-1]]) + 1)
        return BatchResult(topic, parts, offsets)

    def _batch_sizes(self, t: Topic, kcol: _Column, vcol: _Column) -> tuple[int | npt.NDArray[np.int64], int]:
        """Check :meth:`send_batch`'s records for nulls; returns their sizes (one int when all have the same)
        and the largest."""
        if kcol.width is not None and vcol.width is not None:
            if kcol.width < 0 and vcol.width < 0:
                raise InvalidRecordError("a record has both key and value None")
            if t.config.compacted and kcol.width < 0:
                raise InvalidRecordError(f"topic {t.name!r} is compacted: every record needs a key")
            sizes: int | npt.NDArray[np.int64] = max(kcol.width, 0) + max(vcol.width, 0) + _PER_RECORD_MAX
            largest = int(sizes)
        else:
            klens, vlens = kcol.lens, vcol.lens
            if ((klens < 0) & (vlens < 0)).any():
                raise InvalidRecordError("a record has both key and value None")
            if t.config.compacted and (klens < 0).any():
                raise InvalidRecordError(f"topic {t.name!r} is compacted: every record needs a key")
            sizes = np.maximum(klens, 0) + np.maximum(vlens, 0) + _PER_RECORD_MAX
            largest = int(sizes.max())
        return sizes, largest

    def _batch_partitions(
        self, t: Topic, kcol: _Column, vcol: _Column, partition: int | None, n: int
    ) -> npt.NDArray[np.int32]:
        if partition is not None:
            if (
                isinstance(partition, bool)
                or not isinstance(partition, int)
                or not 0 <= partition < t.num_partitions
            ):
                raise UnknownPartitionError(f"partition {partition!r} does not exist in topic {t.name!r}")
            return np.full(n, partition, dtype=np.int32)
        if t.num_partitions == 1:
            return np.zeros(n, dtype=np.int32)
        parts = np.zeros(n, dtype=np.int32)
        keyed = kcol.lens >= 0
        if keyed.all():
            parts[:] = kcol.partitions(t.num_partitions)
        else:
            idx = np.flatnonzero(keyed)
            if len(idx):
                parts[idx] = partitions_for_keys(kcol.as_list(idx), t.num_partitions)
            keyless = np.flatnonzero(~keyed)
            sizes = np.maximum(vcol.lens[keyless], 0) + _PER_RECORD
            parts[keyless] = self._sticky.partitions(
                t.name, t.num_partitions, sizes, lambda q: t.partition(q).log_end_offset, t
            )
        return parts

    # -- lifecycle --------------------------------------------------------------------------------------

    def _wait_finished(self, p: _Pending, timeout: float | None) -> bool:
        """Wait until another thread finished writing ``p`` (a waiter registers before it checks, and the
        writer checks for waiters after it marked ``p`` finished, so no wake-up is lost)."""
        with self._finished_cond:
            self._finish_waiters += 1
            try:
                return self._finished_cond.wait_for(lambda: p.finished, timeout)
            finally:
                self._finish_waiters -= 1

    def _wake(self) -> None:
        self._wakeup.set()

    def _run_sender(self) -> None:
        """The background drain (what makes fire-and-forget sends reach the log).

        While records keep coming the thread polls instead of being woken by each send (waking a thread cost
        a caller that waits on each record about a quarter of its time). The poll interval starts at
        :data:`_SENDER_POLL_S` and doubles, up to :data:`_SENDER_POLL_MAX_S`, each time a poll finds nothing
        queued (callers that wait on their records drain them themselves, and a thread that wakes up often
        takes the GIL from them); after :data:`_SENDER_IDLE_S` without records it blocks until a send wakes
        it."""
        interval = _SENDER_POLL_S
        idle = 0.0
        while not self._closed:
            if self._pending or self._callbacks:
                interval = _SENDER_POLL_S
                idle = 0.0
                if self.linger_ms > 0:
                    self.log.clock.sleep(self.linger_ms / 1000.0)
                else:
                    # A caller that waits on its future drains the queue itself at once; give it that chance
                    # instead of contending for the drain lock (and the GIL) at the same moment.
                    time.sleep(_SENDER_GRACE_S)
                try:
                    if not (self.acks == "all" and self._inflight):  # else its end drains (group commit)
                        self._drain_all()
                    self._run_callbacks()
                except Exception as exc:  # the log was closed under us; futures carry the errors
                    _log.debug("sender stopped: %s", exc)
                    if self._pending:
                        time.sleep(_SENDER_POLL_S)
                continue
            if idle < _SENDER_IDLE_S:
                time.sleep(interval)
                idle += interval
                interval = min(interval * 2, _SENDER_POLL_MAX_S)
                continue
            self._sender_idle = True
            if not self._pending and not self._callbacks and not self._closed:  # re-checked: see send()
                self._wakeup.wait()
            self._wakeup.clear()
            self._sender_idle = False
            interval = _SENDER_POLL_S
            idle = 0.0

    def _run_callbacks(self) -> None:
        if not self._callbacks:
            return
        ready = [c for c in self._callbacks if c[0].is_done()]
        for c in ready:
            self._callbacks.remove(c)
            future, ok, err = c
            try:
                if future.succeeded() and ok is not None:
                    ok(future.get())
                elif future.failed() and err is not None:
                    exc = future.exception()
                    if exc is not None:
                        err(exc)
            except Exception as exc:
                _log.warning("producer callback raised: %s", exc)

    def flush(self, timeout: float | None = None) -> None:
        """Write (and with ``acks="all"`` fsync) every queued record; callbacks run before it returns.

        Raises :class:`~pylog.errors.DeliveryError` if records sent since the last flush could not be written
        and nobody has seen their failure through their futures; the error says how many and why (each
        failure is reported once). :class:`~pylog.errors.KafkaTimeoutError` if another thread's write held
        the queue past ``timeout`` seconds."""
        if self._fork != self.log.fork_generation or self.log.fork_generation != _fork_now():
            raise ForkedProcessError("this producer was created before fork(); create a new one in the child")
        self._drain_all()
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        for p in list(self._inflight):  # drained by other threads: their appends or fsyncs are under way
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if not p.finished and not self._wait_finished(p, left):
                raise KafkaTimeoutError(f"flush did not complete within {timeout} s")
        self._run_callbacks()
        self._raise_unseen_failures()

    def _raise_unseen_failures(self) -> None:
        with self._lock:
            failed, self._failed = self._failed, []
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
                self.flush(timeout)
            else:
                self._fail_queued(
                    LogClosedError(f"the log at {self.log.path} was closed before the producer")
                )
                self._raise_unseen_failures()
        finally:
            self._closed = True
            self._wakeup.set()
            if self._sender is not threading.current_thread():
                self._sender.join(timeout=5)

    def _fail_queued(self, exc: BaseException) -> None:
        with self._drain_lock:
            with self._lock:
                queued, self._pending = list(self._pending.values()), {}
            for p in queued:
                p.split()
                p.error = exc
                p.finished = True
                with self._lock:
                    self._failed.append(p)
            with self._finished_cond:
                self._finished_cond.notify_all()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Columns:
    """The drained records of a :class:`_Pending` as columns, encoded into batches chunk by chunk.

    The lengths are computed once for the whole drain; a chunk of contiguous records is encoded from list
    slices (no gather), a large one with :func:`~pylog.record.encode_columns` directly."""

    def __init__(self, p: _Pending) -> None:
        self.keys, self.values = p.keys, p.values
        self.headers = p.headers if not p.plain and any(p.headers) else None
        self.key_lens, self.key_nulls = item_lengths(self.keys)
        self.value_lens, self.value_nulls = item_lengths(self.values)
        self.header_lens = None if self.headers is None else item_lengths(self.headers)[0]
        sizes = np.maximum(self.key_lens, 0)
        sizes += np.maximum(self.value_lens, 0)
        sizes += _PER_RECORD_MAX
        if self.header_lens is not None:
            sizes += self.header_lens
        self.sizes = sizes

    def encode(
        self,
        chunk: npt.NDArray[np.intp],
        ts: npt.NDArray[np.int64],
        compression: str,
        fields: Mapping[str, Any],
    ) -> bytes:
        a, b = int(chunk[0]), int(chunk[-1]) + 1
        if b - a == len(chunk):  # contiguous: slice the lists instead of gathering
            keys, values = self.keys[a:b], self.values[a:b]
            hdrs = None if self.headers is None else self.headers[a:b]
            sel: slice | npt.NDArray[np.intp] = slice(a, b)
        else:
            pick = operator.itemgetter(*chunk.tolist())
            keys, values = _as_list(pick(self.keys), len(chunk)), _as_list(pick(self.values), len(chunk))
            hdrs = None if self.headers is None else _as_list(pick(self.headers), len(chunk))
            sel = chunk
        if hdrs is not None and not any(hdrs):
            hdrs = None  # no record of this chunk has headers: no headers column
        if len(keys) <= _SMALL_BATCH and compression == "none":
            return encode_batch(0, keys, values, ts[sel], hdrs, **fields)
        return encode_columns(
            0,
            self.key_lens[sel],
            b"".join([k for k in keys if k] if self.key_nulls else keys),  # type: ignore[arg-type]
            self.value_lens[sel],
            b"".join([v for v in values if v] if self.value_nulls else values),  # type: ignore[arg-type]
            ts[sel],
            None if self.header_lens is None or hdrs is None else self.header_lens[sel],
            b"" if hdrs is None else b"".join(hdrs),
            compression=compression,
            **fields,
        )


def _record_options(
    t: Topic, topic: str, partition: Any, timestamp_ms: Any, headers: Any
) -> tuple[int, int, bytes]:
    """Check and encode :meth:`Producer.send`'s optional arguments: (partition or -1, timestamp or -1,
    encoded headers)."""
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
    return part, ts, encode_headers(headers) if headers else b""


def _fork_now() -> int:
    return FORK_GENERATION[0]


def _group(parts: npt.NDArray[np.int32]) -> list[npt.NDArray[np.intp]]:
    order = np.argsort(parts, kind="stable")
    sorted_parts = parts[order]
    cuts = np.flatnonzero(np.diff(sorted_parts)) + 1
    return list(np.split(order, cuts))


def _as_list(picked: Any, n: int) -> list[Any]:
    return [picked] if n == 1 else list(picked)


def _payload_limit(max_bytes: int, compression: str | None) -> int:
    """Bytes of records (as budgeted by ``_PER_RECORD_MAX``) that one batch of at most ``max_bytes`` holds;
    compressed payloads keep room for incompressible data (gzip, lz4 and zstd grow it by under 1/250)."""
    limit = max_bytes - HEADER_SIZE - LAYOUT_SIZE
    if compression not in (None, "none"):
        limit = limit * 250 // 251 - 64
    return max(limit, 1)


def _sizes_of(sizes: int | npt.NDArray[np.int64], n: int) -> npt.NDArray[np.int64]:
    return np.full(n, sizes, dtype=np.int64) if isinstance(sizes, int) else sizes


def _runs(n: int, sizes: int | npt.NDArray[np.int64], limit: int) -> list[slice]:
    """:func:`_cut` for the records ``0..n-1`` in order, as slices (arithmetic when all sizes are equal)."""
    if isinstance(sizes, int):
        per = max(limit // sizes, 1)
        return [slice(a, min(a + per, n)) for a in range(0, n, per)]
    return [slice(int(c[0]), int(c[-1]) + 1) for c in _cut(np.arange(n), sizes, limit)]


def _cut(idx: npt.NDArray[np.intp], sizes: npt.NDArray[np.int64], limit: int) -> list[npt.NDArray[np.intp]]:
    """Split ``idx`` into runs whose summed ``sizes`` stay within ``limit``."""
    s = sizes[idx]
    if int(s.sum()) <= limit:
        return [idx]
    out = []
    csum = np.cumsum(s)
    start = 0
    base = 0
    while start < len(idx):
        end = int(np.searchsorted(csum, base + limit, side="right"))
        end = max(end, start + 1)
        out.append(idx[start:end])
        base = int(csum[end - 1])
        start = end
    return out


class _Column:
    """A column of byte strings given as a list, a 2-D uint8 array or a pyarrow binary array.

    ``width`` is the length every record has (fixed-width arrays; -1 for a column of nulls), or None; the
    per-record ``lens`` of such a column are only built when asked for."""

    def __init__(
        self, lens: npt.NDArray[np.int64] | None, data: Any, kind: str, raw: Any, *, n: int, width: int | None
    ) -> None:
        self._lens = lens
        self.data = data
        self.kind = kind
        self.raw = raw
        self.n = n
        self.width = width

    @property
    def lens(self) -> npt.NDArray[np.int64]:
        if self._lens is None:
            self._lens = np.full(self.n, -1 if self.width is None else self.width, dtype=np.int64)
        return self._lens

    @property
    def is_none(self) -> bool:
        return self.kind == "none"

    def __len__(self) -> int:
        return self.n

    @classmethod
    def nulls(cls, n: int) -> _Column:
        return cls(None, None, "nulls", None, n=n, width=-1)

    @classmethod
    def of(cls, col: Any, what: str) -> _Column:
        if col is None:
            return cls(np.zeros(0, dtype=np.int64), None, "none", None, n=0, width=None)
        if isinstance(col, np.ndarray):
            if col.dtype != np.uint8 or col.ndim != 2:
                raise InvalidRecordError(f"{what} as a numpy array must be 2-D uint8 (one row per record)")
            raw = np.ascontiguousarray(col)
            return cls(None, raw, "fixed", raw, n=col.shape[0], width=col.shape[1])
        if type(col).__module__.startswith("pyarrow"):
            import pyarrow as pa

            arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
            if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
                raise InvalidRecordError(f"{what} as a pyarrow array must be binary")
            offs = np.frombuffer(
                arr.buffers()[1], dtype=np.int32 if pa.types.is_binary(arr.type) else np.int64
            )
            offs = offs[arr.offset : arr.offset + len(arr) + 1].astype(np.int64)
            lens = np.diff(offs)
            if arr.null_count:
                lens[np.asarray(arr.is_null())] = -1
            data = (
                np.frombuffer(arr.buffers()[2], dtype=np.uint8)
                if arr.buffers()[2] is not None
                else np.zeros(0, np.uint8)
            )
            return cls(lens, (offs, data), "arrow", arr, n=len(lens), width=None)
        if isinstance(col, list | tuple):
            for x in col:
                if x is not None and not isinstance(x, bytes):
                    raise SerializationError(
                        f"{what} must be bytes or None in send_batch, got {type(x).__name__}"
                    )
            return cls(item_lengths(col)[0], None, "list", list(col), n=len(col), width=None)
        raise InvalidRecordError(
            f"{what} must be a list of bytes, a 2-D uint8 array or a pyarrow binary array"
        )

    def take(self, sel: slice | npt.NDArray[np.intp]) -> tuple[npt.NDArray[np.int64], bytes | memoryview]:
        """Lengths and concatenated bytes of the records ``sel`` (a slice, or indexes)."""
        if self.width is not None:
            count = len(range(self.n)[sel]) if isinstance(sel, slice) else len(sel)
            lens = np.full(count, self.width, dtype=np.int64)
            if self.kind == "nulls":
                return lens, b""
            if isinstance(sel, slice):
                return lens, memoryview(self.raw[sel]).cast("B")
            return lens, self.raw[sel].tobytes()
        lens = self.lens[sel]
        if isinstance(sel, slice):
            a, b, _ = sel.indices(self.n)
            if self.kind == "arrow":
                offs, data = self.data
                return lens, data[int(offs[a]) : int(offs[b])].data
            return lens, b"".join([x for x in self.raw[a:b] if x])
        if self.kind == "arrow":
            offs, data = self.data
            return lens, b"".join(data[int(offs[i]) : int(offs[i + 1])].tobytes() for i in sel.tolist())
        raw = self.raw
        return lens, b"".join([raw[i] for i in sel.tolist() if raw[i]])

    def as_list(self, idx: npt.NDArray[np.intp]) -> list[bytes]:
        if self.kind == "fixed":
            return [bytes(r) for r in self.raw[idx]]
        if self.kind == "arrow":
            offs, data = self.data
            return [data[int(offs[i]) : int(offs[i + 1])].tobytes() for i in idx.tolist()]
        return [self.raw[i] for i in idx.tolist()]

    def partitions(self, n: int) -> npt.NDArray[np.int32]:
        if self.kind == "fixed":
            from pylog.partitioner import murmur2_fixed

            return ((murmur2_fixed(self.raw).astype(np.int64) & 0x7FFFFFFF) % n).astype(np.int32)
        return partitions_for_keys(self.as_list(np.arange(len(self.lens))), n)
