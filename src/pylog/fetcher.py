"""The fetcher: from a partition's position to the records a consumer returns.

One fetch of a partition reads its stored batches from the position on (up to ``max_partition_fetch_bytes``,
at least one batch), and for each batch:

1. under ``read_committed``, applies the transaction visibility rule (:mod:`pylog.partition.visibility`) to the
   batch header: an aborted or control batch is passed over (the position moves past it), an open
   transaction ends the fetch (the last stable offset);
2. decodes the batch into Python lists: on the compiled path (:mod:`pylog.speedups`) in one C loop; on the
   pure-Python path into columns (:mod:`pylog.record`) turned into lists in bulk: offsets and timestamps
   with numpy's ``tolist()``, keys and values split by one ``struct`` call when every record of the batch
   has the same length (else one slice per record);
3. runs the deserializers over whole columns: the default msgpack value deserializer is one
   ``msgpack.Unpacker`` fed the batch's value bytes, checked to end exactly at every record's boundary (else
   each value is decoded on its own, as a custom deserializer always is);
4. builds the :class:`~pylog.structs.ConsumerRecord` tuples in one C loop, or on the pure-Python path with
   ``map``/``zip`` (no Python step per record either way);
5. applies the deserialization error policy (:mod:`pylog.deadletter`) to a record that cannot be decoded:
   ``raise`` ends the fetch before it and keeps the error for the next poll, ``skip`` counts it,
   ``dead_letter`` sends its stored bytes to the dead-letter topic.

The position of the partition (kept in the :class:`~pylog.subscription.Subscription`) moves past what the
fetch returns, never further. A position outside the log (below the log start after retention) is reset by
``auto_offset_reset`` to the log start or end, or raises :class:`~pylog.errors.OffsetOutOfRangeError` under
``"none"``: records below the log start are never returned.

Thread-safety: not thread-safe; it belongs to one consumer.
"""

from __future__ import annotations

import gc
import operator
import struct
from bisect import bisect_left
from collections.abc import Callable
from itertools import accumulate, pairwise, repeat
from typing import TYPE_CHECKING, Any, TypeVar

import msgpack
import numpy as np

from pylog.consumer_config import ConsumerConfig, msgpack_deserializer
from pylog.deadletter import DeadLetters
from pylog.errors import (
    CorruptRecordError,
    DeserializationError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    PylogError,
    UnsupportedFormatError,
)
from pylog.partition.visibility import OPEN, VISIBLE, Visibility
from pylog.record import (
    ATTR_COMPRESSION_MASK,
    DecodedBatch,
    check_crc,
    decode_batch,
    decode_header,
    decode_lists,
)
from pylog.speedups import core as _core
from pylog.structs import ConsumerRecord, Headers, TopicPartition

if TYPE_CHECKING:
    from pylog.directory import LogDirectory
    from pylog.partition.log import PartitionLog
    from pylog.record import BatchHeader
    from pylog.subscription import Subscription

__all__ = ["Fetcher"]

_RESET_ATTEMPTS = 100  # resets of one read whose log start retention keeps moving (each refusal is progress)
_FEW = 32  # batches up to this many records are decoded with struct alone (numpy's per-call cost dominates)
_STRUCTS: dict[tuple[int, int], struct.Struct] = {}  # (length, count) -> "<length>s" * count
_STRUCTS_KEPT = 64
_new_tuple = tuple.__new__
_T = TypeVar("_T")
_first = operator.itemgetter(0)
#: what a stored batch that cannot be read raises (a batch of a newer format is one a reader cannot read either)
_UNREADABLE = (CorruptRecordError, UnsupportedFormatError)

RawRecord = tuple[bytes | None, bytes | None, Headers]


class _Columns:
    """One batch's records from some offset on, as Python lists (keys and values still serialized)."""

    __slots__ = (
        "header",
        "headers",
        "keys",
        "ksizes",
        "offsets",
        "timestamps",
        "value_data",
        "values",
        "vsizes",
    )

    def __init__(self, header: BatchHeader, buf: Any, at: int) -> None:
        self.header = header
        self.value_data: Any = (
            None  # the value bytes back to back, when no value is None (a batch decoded whole)
        )
        if _core is not None:  # the compiled path: one C loop, any batch size
            (_, self.offsets, self.timestamps, self.keys, self.values, self.headers, self.ksizes, self.vsizes,
             self.value_data) = _core.decode_lists(buf, at)  # fmt: skip
            return
        if header.record_count <= _FEW and not header.attributes & ATTR_COMPRESSION_MASK:
            lists = decode_lists(buf, at)
            self.offsets, self.timestamps = lists.offsets, lists.timestamps
            self.keys, self.values, self.headers = lists.keys, lists.values, lists.headers
            self.ksizes, self.vsizes = _sizes(lists.keys), _sizes(lists.values)
            return
        b = decode_batch(buf, at)
        self.offsets = b.offsets.tolist()
        if header.base_timestamp == header.max_timestamp:  # one timestamp (a batch sent at once): one int
            self.timestamps = [header.base_timestamp] * header.record_count
        else:
            self.timestamps = b.timestamps.tolist()
        self.keys, self.ksizes = _split(b.key_data, b.key_offsets, b.key_valid)
        self.values, self.vsizes = _split(b.value_data, b.value_offsets, b.value_valid)
        self.headers = b.headers()
        if b.value_valid.all():
            self.value_data = b.value_data

    def drop_before(self, start: int) -> None:
        """Leave out the records before offset ``start`` (the first batch of a fetch may begin before it)."""
        i = bisect_left(self.offsets, start)
        self.offsets, self.timestamps = self.offsets[i:], self.timestamps[i:]
        self.keys, self.values, self.headers = self.keys[i:], self.values[i:], self.headers[i:]
        self.ksizes, self.vsizes = self.ksizes[i:], self.vsizes[i:]
        self.value_data = None

    def raw(self, i: int) -> RawRecord:
        return (self.keys[i], self.values[i], list(self.headers[i]))


class Fetcher:
    """See the module docstring. ``committed(tp)`` is the group's committed offset of ``tp`` (or None), where
    a partition without a position starts."""

    def __init__(
        self,
        log: LogDirectory,
        subscription: Subscription,
        config: ConsumerConfig,
        dead_letters: DeadLetters,
        committed: Callable[[TopicPartition], int | None],
    ) -> None:
        self.log = log
        self.subscription = subscription
        self.config = config
        self.dead_letters = dead_letters
        #: per partition, the record the "raise" policy stopped at (raised by every poll until a seek)
        self.poison: dict[TopicPartition, DeserializationError] = {}
        #: per partition, an error met after records that are returned (a damaged batch), raised once by the
        #: consumer's next fetch of the partition
        self.pending: dict[TopicPartition, PylogError] = {}
        self._committed = committed
        self._txns: Any = log.txn_decisions() if config.isolation_level == "read_committed" else None
        #: records built by one C call per batch (no deserializer to run between decoding and building)
        self._direct = _core is not None and config.key_deserializer is config.value_deserializer is None
        self._next_expiry_check = 0.0

    # -- positions --------------------------------------------------------------------------------------

    def plog(self, tp: TopicPartition) -> PartitionLog:
        return self.log.topic(tp.topic).partition(tp.partition)

    def reset_position(self, tp: TopicPartition) -> int:
        """The position ``tp`` starts from: the committed offset, else by ``auto_offset_reset``."""
        committed = self._committed(tp)
        reset = self.config.auto_offset_reset
        if committed is not None:
            pos = committed
        elif reset == "earliest":
            pos = self.plog(tp).log_start_offset
        elif reset == "latest":
            pos = self.plog(tp).log_end_offset
        else:
            raise NoOffsetForPartitionError(f"no position for {tp} and auto_offset_reset='none'")
        self.subscription.positions[tp] = pos
        return pos

    def _read(self, tp: TopicPartition, read: Callable[[int, int], list[_T]], limit: int) -> list[_T]:
        """``read(position, limit)`` from the position of ``tp``; a position outside the log is reset first
        (see :meth:`_reset_out_of_range`; the new one is left in the subscription)."""
        positions = self.subscription.positions
        pos = positions.get(tp)
        if pos is None:
            pos = self.reset_position(tp)
        for _ in range(_RESET_ATTEMPTS):
            try:
                return read(pos, limit)
            except OffsetOutOfRangeError as exc:
                # Retention (of this or another process) may move the log start again between the reset
                # and the read: each new refusal means the log start moved on, so reset again.
                pos = positions[tp] = self._reset_out_of_range(tp, pos, exc)
        return read(pos, limit)

    def _reset_out_of_range(self, tp: TopicPartition, pos: int, cause: Exception | None = None) -> int:
        """Kafka's rule for a position outside ``[log_start_offset, log_end_offset]`` (records below the log
        start were deleted by retention or ``delete_records``; a log end below it was truncated by a repair):
        the new position is the one ``auto_offset_reset`` names, the log start (``"earliest"``) or the log
        end (``"latest"``), never the committed offset (which may be as far out); with ``"none"`` it is an
        :class:`~pylog.errors.OffsetOutOfRangeError` and the position stays until a seek."""
        plog = self.plog(tp)
        reset = self.config.auto_offset_reset
        if reset == "earliest":
            return plog.log_start_offset
        if reset == "latest":
            return plog.log_end_offset
        start, end = plog.log_start_offset, plog.log_end_offset
        error = OffsetOutOfRangeError(
            f"the position {pos} of {tp.topic}-{tp.partition} is outside the log [{start}, {end}]"
            f"{' (its records were deleted)' if pos < start else ''} and auto_offset_reset='none': seek to "
            f"an offset in range (seek_to_beginning, seek_to_end, seek)"
        )
        error.__cause__ = cause
        raise error

    # -- fetching ---------------------------------------------------------------------------------------

    def fetch(self, tp: TopicPartition) -> list[ConsumerRecord]:
        """The records of ``tp`` from its position on; its position moves past them (and past the aborted
        transactions met), never further. Under the "raise" policy an undecodable record ends the fetch
        before it, and its error is kept in :attr:`poison`.

        A damaged batch (:class:`~pylog.errors.CorruptRecordError`) ends the fetch before it too: the records
        of the batches before it are returned, the position stays on the damaged batch, and the error is kept
        in :attr:`pending` for the next fetch to raise (it is raised at once when nothing comes before it).
        """
        raw, damage = self._read_intact(tp, self.config.max_partition_fetch_bytes)
        records: list[ConsumerRecord] = []
        try:
            complete = self._decode(tp, raw, records)
        except _UNREADABLE as exc:  # a batch whose CRC does not match
            damage, complete = exc, True
        if damage is not None and complete:
            error = self._damaged_error(tp, self.subscription.positions[tp] or 0, damage)
            if not records:
                raise error
            self.pending[tp] = error
        return records

    def _decode(self, tp: TopicPartition, raw: list[tuple[Any, int]], records: list[ConsumerRecord]) -> bool:
        """Append the records of the batches ``raw`` to ``records``, moving the position of ``tp`` past each
        batch once its records are there. False when it stopped before the end of ``raw`` (an open
        transaction, or a record the "raise" policy stops at)."""
        positions = self.subscription.positions
        pos = positions[tp] or 0
        visibility = self._visibility()
        for buf, at in raw:
            header = decode_header(buf, at)
            if visibility is not None:
                verdict = visibility.classify(header)
                if verdict == OPEN:
                    return False  # an open transaction: the last stable offset
                if verdict != VISIBLE:  # aborted, or a control batch
                    positions[tp] = header.next_offset
                    continue
            if self._direct:  # compiled, no deserializers: the records straight from the batch, in C
                records += _core.decode_records(buf, at, pos, ConsumerRecord, tp.topic, tp.partition)  # type: ignore[union-attr]
                positions[tp] = header.next_offset
                continue
            stop = self._records(tp, _Columns(header, buf, at), pos, records)
            if stop is not None:  # a record that cannot be deserialized, under the "raise" policy
                positions[tp] = stop
                return False
            positions[tp] = header.next_offset
        return True

    def _read_intact(self, tp: TopicPartition, limit: int) -> tuple[list[tuple[Any, int]], PylogError | None]:
        """The stored batches of ``tp`` from its position on (up to ``limit`` bytes), and the damage that
        ended them early (None when none did).

        A read of several batches fails as a whole when one of them is damaged (its header fails the checks),
        which would hide the intact batches before it: the read is then done again one batch at a time, each
        checked whole (its CRC too), up to the damaged one."""
        plog = self.plog(tp)
        try:
            return self._read(tp, plog.read_raw, limit), None
        except _UNREADABLE as exc:
            first = exc
        out: list[tuple[Any, int]] = []
        damage: PylogError | None = first
        offset = self.subscription.positions[tp] or 0
        total = 0
        resets = 0
        while total < limit:
            try:
                got = plog.read_raw(offset, 1)
                if not got:
                    break
                buf, at = got[0]
                header = decode_header(buf, at)
                check_crc(buf, at, header)  # its next offset leads the next read: it must be intact
            except OffsetOutOfRangeError as exc:
                # Retention moved the log start past the position since the first read: what failed that
                # read is deleted, so the position is reset (auto_offset_reset) and read again from there.
                if out or resets >= _RESET_ATTEMPTS:
                    break
                resets += 1
                offset = self.subscription.positions[tp] = self._reset_out_of_range(tp, offset, exc)
                damage = None
                continue
            except _UNREADABLE as exc:
                return out, exc
            out.append((buf, at))
            total += header.batch_length
            offset = header.next_offset
        return out, None if out else damage

    def _damaged_error(self, tp: TopicPartition, pos: int, exc: PylogError) -> PylogError:
        """The error a consumer raises for a damaged batch at offset ``pos`` of ``tp`` (where its position
        stays; the records before it were returned). A batch of an unknown format raises its own error."""
        if not isinstance(exc, CorruptRecordError):
            return exc
        error = CorruptRecordError(
            f"{tp.topic}-{tp.partition}: the stored batch at offset {pos} is damaged ({exc}); the records "
            f"before it were returned and the position stays at {pos}. Run 'pylog verify' for a report",
            path=getattr(exc, "path", None),
            position=getattr(exc, "position", None),
        )
        error.__cause__ = exc
        return error

    def visible_batches(self, tp: TopicPartition, limit: int) -> tuple[list[DecodedBatch], int]:
        """The visible batches (decoded as columns) from the position of ``tp``, and that position; under
        read_committed the position moves past aborted batches when none is visible. A damaged batch ends
        them as it ends :meth:`fetch` (the error is raised now when no batch comes before it, else kept in
        :attr:`pending`)."""
        raw, damage = self._read_intact(tp, limit)
        batches: list[DecodedBatch] = []
        try:
            for buf, at in raw:
                batches.append(decode_batch(buf, at))
        except _UNREADABLE as exc:
            damage = exc
        positions = self.subscription.positions
        start = positions[tp] or 0
        damaged_at = batches[-1].header.next_offset if batches else start
        visibility = self._visibility()
        if visibility is not None:
            batches, skip_to = visibility.visible(batches)
            if not batches and skip_to is not None:
                positions[tp] = skip_to
        if damage is not None:
            end = batches[-1].header.next_offset if batches else positions[tp]
            if end == damaged_at:  # else the batches returned stop before it: the next read meets it
                error = self._damaged_error(tp, damaged_at, damage)
                if not batches:
                    raise error
                self.pending[tp] = error
        return batches, start

    def _records(self, tp: TopicPartition, c: _Columns, start: int, out: list[ConsumerRecord]) -> int | None:
        """Append the batch's records from offset ``start`` on to ``out``. Returns the offset of a record the
        deserializers cannot decode when the policy is to raise (the error is kept for the next poll)."""
        if c.offsets[0] < start:
            c.drop_before(start)
        bad: dict[int, BaseException] = {}
        keys, values = c.keys, c.values
        if self.config.key_deserializer is not None:
            keys = _deserialize(self.config.key_deserializer, keys, bad)
        deser = self.config.value_deserializer
        if deser is msgpack_deserializer and c.value_data is not None:
            values = _unpack_column(c.value_data, c.vsizes, values, bad)
        elif deser is not None:
            values = _deserialize(deser, values, bad)
        # The cyclic GC is paused while the records are built: otherwise every 700 allocations it re-scans the
        # young records of this batch (which cannot form cycles), and that costs more than building them. (A
        # consumer pauses it around the whole fetch, see Consumer._refill; this pause is then a no-op.)
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            recs = _build(tp, c, keys, values)
        finally:
            if paused:
                gc.enable()
        if bad:
            return self._poison_pills(tp, c, recs, bad, out)
        out.extend(recs)
        return None

    def _poison_pills(
        self,
        tp: TopicPartition,
        c: _Columns,
        recs: list[ConsumerRecord],
        bad: dict[int, BaseException],
        out: list[ConsumerRecord],
    ) -> int | None:
        policy = self.dead_letters.policy
        for i, rec in enumerate(recs):
            exc = bad.get(i)
            if exc is None:
                out.append(rec)
            elif policy == "raise":
                err = DeserializationError(
                    f"cannot deserialize record {tp.topic}-{tp.partition} offset {rec.offset}: {exc}; "
                    f"seek to offset {rec.offset + 1} to skip it"
                )
                err.topic_partition, err.offset = tp, rec.offset
                err.__cause__ = exc
                self.poison[tp] = err
                return rec.offset
            elif policy == "dead_letter":
                self.dead_letters.send(
                    tp.topic, tp.partition, rec.offset, rec.timestamp, c.raw(i), exc, "deserialization"
                )
            else:
                self.dead_letters.skipped += 1
        return None

    def raw_record(self, tp: TopicPartition, offset: int) -> RawRecord:
        """The stored key, value and headers of the record at ``offset`` of ``tp``."""
        for buf, at in self.plog(tp).read_raw(offset, 1):
            b = decode_lists(buf, at)
            for i, off in enumerate(b.offsets):
                if off == offset:
                    return (b.keys[i], b.values[i], list(b.headers[i]))
        raise OffsetOutOfRangeError(f"{tp.topic}-{tp.partition} offset {offset} is no longer in the log")

    # -- read_committed ---------------------------------------------------------------------------------

    def _visibility(self) -> Visibility | None:
        """read_committed: the transaction visibility rule for one read, over the transaction log; None for
        read_uncommitted. A transaction still open past its timeout is aborted when the rule meets it."""
        if self._txns is None:
            return None
        return Visibility(self._txns.status, self._abort_expired)

    def _abort_expired(self) -> bool:
        """The rule's ``expire`` callback: abort the transactions open past their timeout (at most once a
        second of the log's clock); True when some were, so the rule asks for the status again."""
        clock = self.log.clock
        now = clock.monotonic_ms()
        if now < self._next_expiry_check:
            return False
        self._next_expiry_check = now + 1000
        return bool(self._txns.abort_expired(clock.time_ms()))


def _build(tp: TopicPartition, c: _Columns, keys: list[Any], values: list[Any]) -> list[ConsumerRecord]:
    """The records, with ``tuple.__new__`` straight from zip's tuples: no Python-level call per record. The
    fields are kafka-python's, in its order: leader_epoch -1 and checksum None (unknown), the header sizes
    computed only for a batch that has headers."""
    headers = c.headers
    if _core is not None:
        sizes = list(map(_header_size, headers)) if any(headers) else None
        return _core.build_records(  # type: ignore[no-any-return]
            ConsumerRecord, tp.topic, tp.partition, c.header.timestamp_type, c.offsets, c.timestamps, keys,
            values, headers, c.ksizes, c.vsizes, sizes,
        )  # fmt: skip
    hsizes: Any = map(_header_size, headers) if any(headers) else repeat(-1)
    return list(
        map(
            _new_tuple,
            repeat(ConsumerRecord),
            zip(
                repeat(tp.topic),
                repeat(tp.partition),
                repeat(-1),
                c.offsets,
                c.timestamps,
                repeat(c.header.timestamp_type),
                keys,
                values,
                headers,
                repeat(None),
                c.ksizes,
                c.vsizes,
                hsizes,
            ),
        )
    )


def _header_size(headers: Headers) -> int:
    """kafka-python's ``serialized_header_size``: the UTF-8 bytes of the keys plus the value bytes, -1 for none."""
    if not headers:
        return -1
    return sum(len(k.encode()) + (0 if v is None else len(v)) for k, v in headers)


def _split(data: memoryview, offsets: Any, valid: Any) -> tuple[list[bytes | None], list[int]]:
    """A key or value column as a list of bytes (None for a null) and their sizes (-1 for a null). When
    every record has one length (fixed-size keys or values, the common case) one ``struct`` call does it."""
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    if n and valid.all():
        size = int(lengths[0])
        if int(lengths.max()) == size == int(lengths.min()):
            return list(_fixed_struct(size, n).unpack_from(data)), [size] * n
    raw = bytes(data)
    out: list[bytes | None] = [raw[a:b] for a, b in pairwise(offsets.tolist())]
    sizes = lengths.tolist()
    if not valid.all():
        for i in np.flatnonzero(~valid).tolist():
            out[i] = None
            sizes[i] = -1
    return out, sizes


def _fixed_struct(size: int, n: int) -> struct.Struct:
    key = (size, n)
    found = _STRUCTS.get(key)
    if found is None:
        if len(_STRUCTS) >= _STRUCTS_KEPT:
            _STRUCTS.clear()
        found = _STRUCTS[key] = struct.Struct(f"{size}s" * n)
    return found


def _sizes(items: list[bytes | None]) -> list[int]:
    """Byte sizes, -1 for None (Kafka's serialized_*_size)."""
    try:
        return list(map(len, items))  # type: ignore[arg-type]
    except TypeError:  # some None among them
        return [-1 if x is None else len(x) for x in items]


def _unpack_column(
    data: Any, sizes: list[int], values: list[Any], bad: dict[int, BaseException]
) -> list[Any]:
    """The default msgpack deserializer over a whole value column: one ``Unpacker`` over the values' bytes,
    accepted only if it yields one object per record ending exactly at each record's end; otherwise (some
    value is not one msgpack object) each value is decoded on its own, which finds the bad ones."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    ends: list[int] = []
    try:
        out = list(map(_first, zip(unpacker, map(ends.append, iter(unpacker.tell, -1)), strict=False)))
    except Exception:
        out = []
    if len(out) == len(values) and ends == list(accumulate(sizes)):
        return out
    return _deserialize(msgpack_deserializer, values, bad)


def _deserialize(fn: Callable[[bytes], Any], items: list[Any], bad: dict[int, BaseException]) -> list[Any]:
    try:
        return [None if x is None else fn(x) for x in items]
    except Exception:
        out = []
        for i, x in enumerate(items):
            try:
                out.append(None if x is None else fn(x))
            except Exception as exc:
                bad.setdefault(i, exc)
                out.append(x)
        return out
