"""State stores: the local state of one task, made fault-tolerant by a changelog topic.

Each stateful operation owns a store, and each task (one input partition of a sub-topology) its own instance.
A store is a Python dict in memory that remembers which keys changed since it was last flushed. At every commit
the task writes the latest value of each changed key (``None``, a tombstone, for a deleted key) to partition
*p* of the compacted topic ``<application_id>-<store>-changelog``, in the same transaction as the task's output
and input offsets. A task assigned to a thread rebuilds its stores from that partition
(:meth:`KeyValueStore.restore`, fed in bulk from Arrow batches): the store then holds exactly the state of the
last committed transaction, whatever happened to the process that wrote it.

Changelog keys and values are msgpack; keys are read back with msgpack arrays as tuples (hashable), values
as lists.

Thread-safety: a store belongs to its task, which runs on one thread; interactive queries from another thread
read it through :meth:`KeyValueStore.get` and :meth:`KeyValueStore.items`, which copy under the GIL.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from pylog.streams.serde import MSGPACK, MSGPACK_KEY

__all__ = [
    "JoinBufferStore",
    "KeyValueStore",
    "SessionStore",
    "SlidingStore",
    "SubscriptionStore",
    "SuppressBuffer",
    "TimedStore",
    "WindowStore",
    "decode_key",
    "encode_key",
]

_MISSING: Any = object()
MISSING: Any = object()  # what an aggregator is given for a key or window without an aggregate yet
STREAM_TIME_KEY = "\x00stream-time"  # the window store's entry for its stream time (user entries are tuples)


def encode_key(key: Any) -> bytes:
    """A store or repartition key as msgpack bytes (a store key is never None)."""
    return MSGPACK_KEY.encode(key)


def decode_key(raw: bytes) -> Any:
    """The key of :func:`encode_key`; msgpack arrays come back as tuples, so keys stay hashable."""
    return MSGPACK_KEY.deserialize(raw)


class KeyValueStore:
    """A key -> value store of one task (see the module docstring). ``changelog`` is its topic, or None
    for a store that is not logged (the test driver's stores are logged all the same)."""

    #: the changelog offset the store holds the state of (a restore reads from there); 0 in memory
    offset = 0
    #: whether the store keeps its state in a file, written by :meth:`checkpoint` after each commit
    persistent = False

    def __init__(self, name: str, changelog: str | None) -> None:
        self.name = name
        self.changelog = changelog
        self._data: dict[Any, Any] = {}
        self._dirty: set[Any] = set()

    def checkpoint(self, offset: int) -> None:
        """The changes taken so far are committed up to changelog ``offset`` (a persistent store saves them)."""

    def restored(self, offset: int) -> None:
        """A restore read the changelog up to ``offset``."""

    def clear(self) -> None:
        """Forget everything (a restore from offset 0 follows)."""
        self._data.clear()
        self._dirty.clear()

    def close(self) -> None:
        """Release what the store holds (files)."""

    # -- reads ----------------------------------------------------------------------------------------

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key``, or ``default``."""
        return self._data.get(key, default)

    def __getitem__(self, key: Any) -> Any:
        return self._data[key]

    def __contains__(self, key: Any) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._data))

    def items(self) -> list[tuple[Any, Any]]:
        """Every ``(key, value)``, in insertion order (a copy)."""
        return list(self._data.items())

    def range(self, low: Any = None, high: Any = None) -> list[tuple[Any, Any]]:
        """``(key, value)`` for ``low <= key <= high`` (a bound of None is open), sorted by key; the keys
        must be comparable with the bounds and each other."""
        keys = sorted(
            k for k in list(self._data) if (low is None or k >= low) and (high is None or k <= high)
        )
        return [(k, self._data[k]) for k in keys if k in self._data]

    def to_dict(self) -> dict[Any, Any]:
        """A copy of the whole store."""
        return dict(self._data)

    # -- writes ---------------------------------------------------------------------------------------

    def put(self, key: Any, value: Any) -> None:
        """Set ``key`` to ``value`` (None deletes it)."""
        if value is None:
            self.delete(key)
            return
        self._data[key] = value
        self._dirty.add(key)

    def delete(self, key: Any) -> None:
        if self._data.pop(key, _MISSING) is not _MISSING:
            self._dirty.add(key)

    # -- changelog ------------------------------------------------------------------------------------

    def take_changes(self) -> list[tuple[bytes, bytes | None]]:
        """The changelog records of the keys changed since the last call (encoded), and forget them."""
        out = []
        data, encode_key, entry, pack = self._data, self._encode_key, self._entry, MSGPACK.encode
        for key in self._dirty:
            value = data.get(key, _MISSING)
            out.append((encode_key(key), None if value is _MISSING else pack(entry(value))))
        self._dirty.clear()
        return out

    def restore(self, keys: Iterable[bytes], values: Iterable[bytes | None]) -> None:
        """Apply changelog records in offset order: the latest value of each key wins, a tombstone removes
        it. Only the surviving keys are decoded."""
        latest = dict(zip(keys, values, strict=True))
        decode = MSGPACK.decode
        self.restore_decoded(
            [self._decode_key(k) for k in latest], [None if v is None else decode(v) for v in latest.values()]
        )

    def restore_decoded(self, keys: list[Any], values: list[Any]) -> None:
        """As :meth:`restore`, with keys and values already decoded (None: a tombstone)."""
        latest = dict(zip(keys, values, strict=True))
        if type(self) is KeyValueStore:  # the plain store: one bulk update, then the tombstones
            self._data.update(latest)
            for key in [k for k, v in latest.items() if v is None]:
                del self._data[key]
        else:
            for key, value in latest.items():
                if value is None:
                    self._forget(key)
                else:
                    self._load(key, value)
        self._dirty.clear()
        self._restored()

    def _forget(self, key: Any) -> None:
        self._data.pop(key, None)

    def _restored(self) -> None:
        pass

    def _encode_key(self, key: Any) -> bytes:
        return encode_key(key)

    def _decode_key(self, raw: bytes) -> Any:
        return decode_key(raw)

    def _entry(self, value: Any) -> Any:
        return value

    def _load(self, key: Any, value: Any) -> None:
        self._data[key] = value

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {len(self._data)} keys)"


class SubscriptionStore(KeyValueStore):
    """The subscriptions of a foreign-key join, on the side of the right table: ``(foreign_key,
    encoded_left_key) -> [left_value_hash, left_partition]``, with an index by foreign key (Kafka's prefix
    scan) so that a change of a right row finds its subscribers without a scan of the store."""

    def __init__(self, name: str, changelog: str | None) -> None:
        super().__init__(name, changelog)
        self._by_fk: dict[Any, dict[bytes, Any]] = {}

    def subscribers(self, foreign_key: Any) -> list[tuple[bytes, Any]]:
        """``(encoded_left_key, [hash, partition])`` of the rows subscribed to ``foreign_key``."""
        return list(self._by_fk.get(foreign_key, {}).items())

    def put(self, key: Any, value: Any) -> None:
        if value is None:
            self.delete(key)
            return
        super().put(key, value)
        self._by_fk.setdefault(key[0], {})[key[1]] = value

    def delete(self, key: Any) -> None:
        super().delete(key)
        self._unindex(key)

    def clear(self) -> None:
        super().clear()
        self._by_fk.clear()

    def _unindex(self, key: Any) -> None:
        rows = self._by_fk.get(key[0])
        if rows is not None:
            rows.pop(key[1], None)
            if not rows:
                del self._by_fk[key[0]]

    def _load(self, key: Any, value: Any) -> None:
        self._data[key] = value
        self._by_fk.setdefault(key[0], {})[key[1]] = value

    def _forget(self, key: Any) -> None:
        self._data.pop(key, None)
        self._unindex(key)


class TimedStore(KeyValueStore):
    """A store of a time-driven operation: it also holds the operation's stream time (the largest event time
    it has seen), logged as the entry ``STREAM_TIME_KEY`` when it moved, so that after a restore late records
    and closings are judged as before."""

    def __init__(self, name: str, changelog: str | None) -> None:
        super().__init__(name, changelog)
        self.stream_time = -1
        self._time_dirty = False

    def advance(self, timestamp: int) -> int:
        """Move the stream time to ``timestamp`` if later; returns the stream time."""
        if timestamp > self.stream_time:
            self.stream_time = timestamp
            self._time_dirty = True
        return self.stream_time

    def take_changes(self) -> list[tuple[bytes, bytes | None]]:
        out = super().take_changes()
        if self._time_dirty:
            out.append((encode_key(STREAM_TIME_KEY), MSGPACK.serialize(self.stream_time)))
            self._time_dirty = False
        return out

    def _load(self, key: Any, value: Any) -> None:
        if key == STREAM_TIME_KEY:
            self.stream_time = max(self.stream_time, int(value))
        else:
            self._load_entry(key, value)

    def _load_entry(self, key: Any, value: Any) -> None:
        self._data[key] = value

    def _restored(self) -> None:
        self._time_dirty = False


class WindowStore(TimedStore):
    """Windowed aggregates: ``(key, window_start) -> (aggregate, max_timestamp)``, plus the stream time of the
    operation (logged too, so late records are judged the same way after a restore), and an index of the
    windows by end time for closing them."""

    def __init__(self, name: str, changelog: str | None, size_ms: int) -> None:
        super().__init__(name, changelog)
        self.size_ms = size_ms
        self._ends: list[tuple[int, int, Any, int]] = []  # heap of (end, seq, key, start); stale ones skipped
        self._seq = itertools.count()  # ties of end time never compare keys (of any type)

    def put(self, key: Any, value: Any) -> None:
        if value is not None and key not in self._data:
            heapq.heappush(self._ends, (key[1] + self.size_ms, next(self._seq), *key))
        super().put(key, value)

    def fold(self, window: tuple[Any, int], timestamp: int, key: Any, value: Any, aggregator: Any) -> Any:
        """Fold ``value`` into the aggregate of ``window`` (``aggregator(key, value, old or MISSING)``), note
        ``timestamp`` as its latest if later, and return the new aggregate (the hot path of windowed
        aggregations: one dict lookup, one store)."""
        data = self._data
        entry = data.get(window)
        if entry is None:
            agg = aggregator(key, value, MISSING)
            heapq.heappush(self._ends, (window[1] + self.size_ms, next(self._seq), *window))
            data[window] = (agg, timestamp)
        else:
            agg = aggregator(key, value, entry[0])
            data[window] = (agg, timestamp if timestamp > entry[1] else entry[1])
        self._dirty.add(window)
        return agg

    def closes_by(self, close_before: int) -> bool:
        """Whether some window ends at or before ``close_before`` (then :meth:`closing` has work)."""
        return bool(self._ends) and self._ends[0][0] <= close_before

    def closing(self, close_before: int) -> list[tuple[Any, int, Any]]:
        """Remove and return ``(key, start, (aggregate, max_timestamp))`` of every window whose end is at or
        before ``close_before``, by end time."""
        out = []
        ends = self._ends
        while ends and ends[0][0] <= close_before:
            _, _, key, start = heapq.heappop(ends)
            entry = self._data.get((key, start), _MISSING)
            if entry is not _MISSING:
                self.delete((key, start))
                out.append((key, start, entry))
        return out

    def fetch(self, key: Any, time_from: int = 0, time_to: int | None = None) -> list[tuple[int, Any]]:
        """``(window_start, aggregate)`` of ``key``'s open windows starting in ``[time_from, time_to]``."""
        found = [
            (start, entry[0])
            for (k, start), entry in list(self._data.items())
            if k == key and start >= time_from and (time_to is None or start <= time_to)
        ]
        return sorted(found)

    def get(self, key: Any, default: Any = None) -> Any:
        """The aggregate of ``(key, window_start)``, or ``default``."""
        entry = self._data.get(key, _MISSING)
        return default if entry is _MISSING else entry[0]

    def entry(self, key: Any) -> tuple[Any, int] | None:
        """``(aggregate, max_timestamp)`` of ``(key, window_start)``, or None."""
        entry = self._data.get(key)
        return None if entry is None else (entry[0], entry[1])

    def items(self) -> list[tuple[Any, Any]]:
        return [(k, entry[0]) for k, entry in list(self._data.items())]

    def to_dict(self) -> dict[Any, Any]:
        return dict(self.items())

    def _entry(self, value: Any) -> Any:
        return list(value)

    def _load_entry(self, key: Any, value: Any) -> None:
        if key not in self._data:
            heapq.heappush(self._ends, (key[1] + self.size_ms, next(self._seq), *key))
        self._data[key] = (value[0], value[1])


class SuppressBuffer(TimedStore):
    """The records a ``suppress(until_time_limit=...)`` holds back: ``key -> (value, buffer_time, timestamp,
    seq, size)``, the key's latest value (None: a deletion to forward) with the event time of the first record
    buffered for it (Kafka's buffer keeps a key's first time), plus the operation's stream time, both logged (the
    changelog value is ``[value, buffer_time, timestamp, seq]``), and a heap by buffer time for the
    evictions. ``bytes`` is the buffer's size as msgpack keys and values."""

    def __init__(self, name: str, changelog: str | None) -> None:
        super().__init__(name, changelog)
        self.bytes = 0
        self._heap: list[tuple[int, int, Any]] = []  # (buffer_time, seq, key); stale entries skipped
        self._seq = itertools.count()

    def buffer(self, key: Any, value: Any, timestamp: int) -> None:
        """Hold ``value`` (None: a deletion) as ``key``'s latest, keeping the key's place in the buffer."""
        old = self._data.get(key)
        size = len(encode_key(key)) + (0 if value is None else len(MSGPACK.encode(value)))
        if old is None:
            seq = next(self._seq)
            heapq.heappush(self._heap, (timestamp, seq, key))
            self._data[key] = (value, timestamp, timestamp, seq, size)
        else:
            self.bytes -= old[4]
            self._data[key] = (value, old[1], timestamp, old[3], size)
        self.bytes += size
        self._dirty.add(key)

    def oldest(self) -> int | None:
        """The buffer time of the oldest key held, or None when empty."""
        heap, data = self._heap, self._data
        while heap and (heap[0][2] not in data or data[heap[0][2]][3] != heap[0][1]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def evict(self) -> tuple[Any, Any, int]:
        """Remove the oldest key and return ``(key, value, timestamp)`` (the buffer must not be empty)."""
        self.oldest()
        _, _, key = heapq.heappop(self._heap)
        value, _, timestamp, _, size = self._data.pop(key)
        self.bytes -= size
        self._dirty.add(key)
        return key, value, timestamp

    def get(self, key: Any, default: Any = None) -> Any:
        """The value held for ``key`` (None for a held deletion), or ``default``."""
        entry = self._data.get(key, _MISSING)
        return default if entry is _MISSING else entry[0]

    def items(self) -> list[tuple[Any, Any]]:
        return [(k, entry[0]) for k, entry in list(self._data.items())]

    def to_dict(self) -> dict[Any, Any]:
        return dict(self.items())

    def put(self, key: Any, value: Any) -> None:
        raise TypeError("a suppression buffer changes through buffer() and evict()")

    def clear(self) -> None:
        super().clear()
        self._heap.clear()
        self.bytes = 0
        self.stream_time = -1

    def _entry(self, value: Any) -> Any:
        return list(value[:4])

    def _load_entry(self, key: Any, value: Any) -> None:
        self._forget(key)
        held, buffer_time, timestamp, seq = value
        size = len(encode_key(key)) + (0 if held is None else len(MSGPACK.encode(held)))
        self._data[key] = (held, buffer_time, timestamp, seq, size)
        self.bytes += size
        heapq.heappush(self._heap, (buffer_time, seq, key))

    def _forget(self, key: Any) -> None:
        old = self._data.pop(key, None)
        if old is not None:
            self.bytes -= old[4]

    def _restored(self) -> None:
        super()._restored()
        self._seq = itertools.count(max((e[3] for e in self._data.values()), default=-1) + 1)


class SessionStore(TimedStore):
    """Session aggregates: ``(key, session_start) -> (aggregate, session_end)``, the stream time (logged, as in
    :class:`WindowStore`), the sessions of each key, and an index of the sessions by close time."""

    def __init__(self, name: str, changelog: str | None, gap_ms: int) -> None:
        super().__init__(name, changelog)
        self.gap_ms = gap_ms
        self._by_key: dict[Any, set[int]] = {}
        self._ends: list[tuple[int, int, Any, int]] = []  # heap of (end, seq, key, start); stale ones skipped
        self._seq = itertools.count()
        self._latest: dict[Any, int] = {}  # (key, start) -> seq of its latest put: its heap entry

    def sessions(self, key: Any) -> list[tuple[int, int, Any]]:
        """``(start, end, aggregate)`` of ``key``'s open sessions, by start."""
        return sorted((start, *self._data[(key, start)][::-1]) for start in self._by_key.get(key, ()))

    def put(self, key: Any, value: Any) -> None:
        if value is None:
            self.delete(key)
            return
        k, start = key
        self._by_key.setdefault(k, set()).add(start)
        seq = next(self._seq)
        self._latest[key] = seq  # older heap entries of this session are stale
        heapq.heappush(self._ends, (value[1], seq, k, start))
        super().put(key, (value[0], value[1]))

    def delete(self, key: Any) -> None:
        self._latest.pop(key, None)
        starts = self._by_key.get(key[0])
        if starts is not None:
            starts.discard(key[1])
            if not starts:
                del self._by_key[key[0]]
        super().delete(key)

    def closing(self, end_before: int) -> list[tuple[Any, int, Any]]:
        """Remove and return ``(key, start, (aggregate, end))`` of every session whose end is before
        ``end_before``, by end."""
        out = []
        ends = self._ends
        while ends and ends[0][0] < end_before:
            _, seq, key, start = heapq.heappop(ends)
            entry = self._data.get((key, start), _MISSING)
            if entry is not _MISSING and self._latest.get((key, start)) == seq:
                self.delete((key, start))
                out.append((key, start, entry))
        return out

    def fetch(self, key: Any) -> list[tuple[int, int, Any]]:
        """``(start, end, aggregate)`` of ``key``'s open sessions."""
        return self.sessions(key)

    def get(self, key: Any, default: Any = None) -> Any:
        """The aggregate of the session ``(key, start)``, or ``default``."""
        entry = self._data.get(key, _MISSING)
        return default if entry is _MISSING else entry[0]

    def items(self) -> list[tuple[Any, Any]]:
        return [((k, start, entry[1]), entry[0]) for (k, start), entry in list(self._data.items())]

    def to_dict(self) -> dict[Any, Any]:
        """``{(key, start, end): aggregate}``."""
        return dict(self.items())

    def _entry(self, value: Any) -> Any:
        return list(value)

    def _load_entry(self, key: Any, value: Any) -> None:
        self.put(key, (value[0], value[1]))

    def _forget(self, key: Any) -> None:
        if key in self._data:
            self.delete(key)


class JoinBufferStore(TimedStore):
    """One side of a stream-stream join: its recent records ``(key, timestamp, seq) -> [value, joined]``
    (``seq`` orders records of one key and time; ``joined``: it met a record of the other side), the join's
    stream time, and per key the records in arrival order."""

    def __init__(self, name: str, changelog: str | None) -> None:
        super().__init__(name, changelog)
        self._by_key: dict[Any, list[tuple[int, int]]] = {}  # key -> [(seq, timestamp)] in arrival order
        self._times: list[tuple[int, int, Any]] = []  # heap of (timestamp, seq, key): what to purge first
        self._next_seq = 0

    def add(self, key: Any, timestamp: int, value: Any, joined: bool = False) -> None:
        seq = self._next_seq
        self._next_seq += 1
        self.put((key, timestamp, seq), [value, joined])

    def mark(self, key: Any, timestamp: int, seq: int) -> None:
        """Note that this record met a record of the other side."""
        entry = self._data[(key, timestamp, seq)]
        if not entry[1]:
            self.put((key, timestamp, seq), [entry[0], True])

    def put(self, key: Any, value: Any) -> None:
        if value is not None and key not in self._data:
            self._by_key.setdefault(key[0], []).append((key[2], key[1]))
            heapq.heappush(self._times, (key[1], key[2], key[0]))
            self._next_seq = max(self._next_seq, key[2] + 1)
        super().put(key, value)

    def matches(self, key: Any, low: int, high: int) -> list[tuple[int, int, Any]]:
        """``(timestamp, seq, value)`` of ``key``'s records with ``low <= timestamp <= high``, in arrival
        order."""
        return [
            (ts, seq, self._data[(key, ts, seq)][0])
            for seq, ts in self._by_key.get(key, ())
            if low <= ts <= high and (key, ts, seq) in self._data
        ]

    def purge(self, before: int) -> list[tuple[Any, int, Any]]:
        """Forget the records older than ``before`` (no later record can join them); returns ``(key,
        timestamp, value)`` of those that never joined, by timestamp then arrival."""
        unjoined = []
        times = self._times
        while times and times[0][0] < before:
            ts, seq, key = heapq.heappop(times)
            entry = self._data.get((key, ts, seq))
            if entry is not None:
                if not entry[1]:
                    unjoined.append((key, ts, entry[0]))
                self.delete((key, ts, seq))
            entries = self._by_key.get(key)
            if entries is not None:
                entries.remove((seq, ts))
                if not entries:
                    del self._by_key[key]
        return unjoined

    def _load_entry(self, key: Any, value: Any) -> None:
        self.put(key, value)

    def _forget(self, key: Any) -> None:
        self._data.pop(key, None)

    def _restored(self) -> None:
        for key in self._by_key:
            self._by_key[key].sort()
        super()._restored()


class SlidingStore(TimedStore):
    """Sliding windows: ``("w", key, start) -> (aggregate, max_timestamp, created)`` for the open windows and
    ``("r", key, timestamp, seq) -> value`` for the records a new window may still need, the stream time, and
    per key the records in arrival order."""

    def __init__(self, name: str, changelog: str | None, difference_ms: int) -> None:
        super().__init__(name, changelog)
        self.difference_ms = difference_ms
        self._records: dict[Any, list[tuple[int, int]]] = {}  # key -> [(seq, timestamp)] in arrival order
        self._windows: dict[Any, set[int]] = {}  # key -> starts of its open windows
        self._seq = 0

    # records
    def add_record(self, key: Any, timestamp: int, value: Any) -> None:
        self.put(("r", key, timestamp, self._seq), value)

    def records(self, key: Any, low: int, high: int) -> list[tuple[int, Any]]:
        """``(timestamp, value)`` of ``key``'s kept records in ``[low, high]``, in arrival order."""
        return [
            (ts, self._data[("r", key, ts, seq)])
            for seq, ts in self._records.get(key, ())
            if low <= ts <= high
        ]

    # windows
    def window_starts(self, key: Any) -> list[int]:
        return sorted(self._windows.get(key, ()))

    def window(self, key: Any, start: int) -> tuple[Any, int, int] | None:
        entry = self._data.get(("w", key, start))
        return None if entry is None else (entry[0], entry[1], entry[2])

    def set_window(self, key: Any, start: int, agg: Any, max_ts: int, created: int) -> None:
        self.put(("w", key, start), (agg, max_ts, created))

    def next_created(self) -> int:
        self._seq += 1
        return self._seq

    def closing(self, end_before: int) -> list[tuple[Any, int, Any, int]]:
        """Remove and return ``(key, start, aggregate, max_timestamp)`` of the windows with ``end <
        end_before``, by end then creation."""
        d = self.difference_ms
        found = []
        for key, starts in list(self._windows.items()):
            for start in list(starts):
                if start + d < end_before:
                    agg, max_ts, created = self._data[("w", key, start)]
                    found.append((start + d, created, key, start, agg, max_ts))
                    self.delete(("w", key, start))
        found.sort(key=lambda f: (f[0], f[1]))
        return [(key, start, agg, max_ts) for _, _, key, start, agg, max_ts in found]

    def purge(self, before: int) -> None:
        """Forget the records with timestamp before ``before`` (every window holding them is closed)."""
        for key, entries in list(self._records.items()):
            for seq, ts in list(entries):
                if ts < before:
                    self.delete(("r", key, ts, seq))

    def put(self, key: Any, value: Any) -> None:
        if value is not None and key not in self._data:
            if key[0] == "r":
                self._records.setdefault(key[1], []).append((key[3], key[2]))
                self._seq = max(self._seq, key[3] + 1)
            else:
                self._windows.setdefault(key[1], set()).add(key[2])
                self._seq = max(self._seq, value[2] + 1)
        super().put(key, value)

    def delete(self, key: Any) -> None:
        if key in self._data:
            if key[0] == "r":
                entries = self._records[key[1]]
                entries.remove((key[3], key[2]))
                if not entries:
                    del self._records[key[1]]
            else:
                starts = self._windows[key[1]]
                starts.discard(key[2])
                if not starts:
                    del self._windows[key[1]]
        super().delete(key)

    def items(self) -> list[tuple[Any, Any]]:
        """``((key, start), aggregate)`` of the open windows."""
        return [((k[1], k[2]), v[0]) for k, v in list(self._data.items()) if k[0] == "w"]

    def to_dict(self) -> dict[Any, Any]:
        return dict(self.items())

    def _entry(self, value: Any) -> Any:
        return list(value) if isinstance(value, tuple) else value

    def _load_entry(self, key: Any, value: Any) -> None:
        self.put(key, tuple(value) if key[0] == "w" else value)

    def _forget(self, key: Any) -> None:
        self.delete(key)

    def _restored(self) -> None:
        for entries in self._records.values():
            entries.sort()
        super()._restored()
