"""A consumer group's files: its membership state and its committed offsets, shared by every process.

Layout, one directory per group under the log root::

    __groups/
        g-<group id, percent-encoded>/
            group.lock        flock: every change to the group happens while holding it (exclusive)
            state             membership, generation and assignment; replaced atomically (format below)
            offsets.log       committed offsets: an append-only log, compacted by rewriting (format below)
            members/<id>.lock held (flock, exclusive) by a live dynamic member: a member whose lock can be
                              taken by someone else has died, and is removed without waiting for its session

``state`` (a header line, then JSON)::

    line 1   b"pylog-group 1 <crc32c of the rest, 8 hex digits>\\n"
    rest     {"group_id", "state", "generation", "assignor", "protocol", "leader", "rebalance",
              "topics", "members": {member_id: {...}}, "static": {group_instance_id: member_id}}

``offsets.log``, a sequence of :mod:`pylog.journal` records (each payload stored twice, each copy with its
CRC-32C) whose payload is msgpack ``[timestamp_ms, generation, member_id, [[topic, partition, offset,
metadata], ...]]`` and, for offsets committed by a transaction, a fifth element ``[producer_id,
producer_epoch, txn]``; offset -1 deletes the entry.

A transactional record counts once its transaction is committed (:mod:`pylog.transactions`), at its own
place in the file; it is ignored if the transaction was aborted, and waits while it is open.

The last record for a partition wins. A record is acknowledged only after its fsync. A torn record at the
end of the file (a crash during an append that was never acknowledged) is ignored and cut off by the next
append; a damaged record followed by intact ones is corruption: :class:`~pylog.errors.CorruptRecordError`
naming the file and position. The file is rewritten with only the live entries (temp, fsync, rename, fsync
directory) when it has grown to many times their size.

Thread-safety: a :class:`GroupStore` may be used from several threads; :meth:`GroupStore.lock` serializes
them within the process and, through ``flock``, with every other process. Crash contract: ``state`` is always
either the old or the new version; ``offsets.log`` loses at most a commit that was not acknowledged.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, unquote

import msgpack

from pylog import fs, journal
from pylog.errors import ConfigError, CorruptRecordError, InvalidOffsetError, UnsupportedFormatError
from pylog.record import crc32c
from pylog.structs import OffsetAndMetadata, TopicPartition
from pylog.transactions import TxnLog

__all__ = ["GROUPS_DIR", "GroupStore", "group_ids", "to_topic_partition", "validate_group_id"]

GROUPS_DIR = "__groups"
_STATE_MAGIC = b"pylog-group 1 "
_COMPACT_MIN_BYTES = 256 << 10
_MAX_GROUP_ID = 200


def validate_group_id(group_id: object) -> str:
    if not isinstance(group_id, str) or not group_id or len(group_id) > _MAX_GROUP_ID or "\0" in group_id:
        raise ConfigError(
            f"group_id must be a non-empty str of at most {_MAX_GROUP_ID} characters, got {group_id!r}"
        )
    return group_id


def to_topic_partition(key: Any) -> TopicPartition:
    """``key`` as a TopicPartition; :class:`~pylog.errors.InvalidOffsetError` when it is not one."""
    topic: object
    partition: object
    try:
        topic, partition = key
    except (TypeError, ValueError):
        raise InvalidOffsetError(f"not a TopicPartition(topic, partition): {key!r}") from None
    if not isinstance(topic, str) or isinstance(partition, bool) or not isinstance(partition, int):
        raise InvalidOffsetError(f"not a TopicPartition(topic: str, partition: int): {key!r}")
    return TopicPartition(topic, partition)


def _dirname(group_id: str) -> str:
    return "g-" + quote(group_id, safe="")


def group_ids(root: str) -> list[str]:
    """Ids of the groups that have a directory under ``root``, sorted."""
    try:
        names = os.listdir(os.path.join(root, GROUPS_DIR))
    except FileNotFoundError:
        return []
    return sorted(unquote(n[2:]) for n in names if n.startswith("g-") and not n.endswith(".deleted"))


def empty_state(group_id: str) -> dict[str, Any]:
    return {
        "group_id": group_id,
        "state": "Empty",
        "generation": 0,
        "assignor": None,
        "protocol": None,
        "leader": None,
        "rebalance": None,
        "rebalance_id": 0,
        "topics": {},
        "members": {},
        "static": {},
    }


class GroupStore:
    """The files of one group (see the module docstring for their format and contracts)."""

    def __init__(self, root: str, group_id: str, *, create: bool = True) -> None:
        self.group_id = validate_group_id(group_id)
        self.root = root
        self.directory = os.path.join(root, GROUPS_DIR, _dirname(group_id))
        self.state_path = os.path.join(self.directory, "state")
        self.offsets_path = os.path.join(self.directory, "offsets.log")
        self.members_dir = os.path.join(self.directory, "members")
        if create:
            fs.makedirs(self.members_dir)
        elif not os.path.isdir(self.directory):
            raise ConfigError(f"unknown consumer group {group_id!r}")
        self._lock_fd = fs.FS.open(os.path.join(self.directory, "group.lock"), os.O_RDWR | os.O_CREAT)
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        self._set_at: dict[TopicPartition, int] = {}  # file position of the record that set each offset
        self._pending: list[tuple[int, tuple[int, int, int], list[Any]]] = []  # open transactions' records
        self._txn_log: Any = None
        self._offsets_stamp: tuple[int, int] = (-1, -1)  # (inode, bytes read)
        self._offsets_tail = b""  # the last bytes read: tells a reused inode number from the same file
        self._state_cache: tuple[bytes, dict[str, Any]] | None = None
        self._closed = False

    def close(self) -> None:
        with self._thread_lock:
            if not self._closed:
                self._closed = True
                fs.FS.close(self._lock_fd)
                if self._txn_log is not None:
                    self._txn_log.close()

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive access to the group, across threads and processes (re-entrant within a thread)."""
        with self._thread_lock:
            if self._depth == 0:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    # -- state ------------------------------------------------------------------------------------------

    def state_stamp(self) -> tuple[int, int, int]:
        """Changes whenever ``state`` is replaced (cheap: one stat)."""
        try:
            st = os.stat(self.state_path)
        except FileNotFoundError:
            return (0, 0, 0)
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def read_state(self) -> dict[str, Any]:
        """The current state (a fresh copy the caller may change). The file is always read: a stat stamp
        cannot tell two versions apart when they have the same size, the same coarse mtime and a reused
        inode number, and acting on a stale state under the lock would undo another member's change."""
        try:
            with open(self.state_path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return empty_state(self.group_id)
        cached = self._state_cache
        if cached is not None and cached[0] == raw:
            return copy.deepcopy(cached[1])
        state = _decode_state(raw, self.state_path)
        self._state_cache = (raw, state)
        return copy.deepcopy(state)

    def write_state(self, state: dict[str, Any]) -> None:
        body = json.dumps(state, sort_keys=True, separators=(",", ":")).encode()
        raw = _STATE_MAGIC + f"{crc32c(body):08x}\n".encode() + body
        fs.atomic_write(self.state_path, raw)
        self._state_cache = (raw, json.loads(body))

    # -- member liveness --------------------------------------------------------------------------------

    def member_lock_path(self, member_id: str) -> str:
        return os.path.join(self.members_dir, quote(member_id, safe="") + ".lock")

    def hold_member_lock(self, member_id: str) -> int:
        """Create and lock the member's liveness file; the returned descriptor keeps it held."""
        fd = fs.FS.open(self.member_lock_path(member_id), os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def member_is_dead(self, member_id: str) -> bool:
        """True when nobody holds the member's liveness lock (its process died or it closed uncleanly)."""
        path = self.member_lock_path(member_id)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # also releases the probe's lock
        return True

    def remove_member_lock(self, member_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.member_lock_path(member_id))

    # -- committed offsets ------------------------------------------------------------------------------

    def offsets(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """Committed offsets, the latest per partition (read incrementally: only new records are parsed).

        The file read so far is recognised by its inode number and the bytes just before where reading
        stopped: a compaction by another process replaces the file, and the new one may get the old inode
        number back once that is free, so the number alone could make this resume in the middle of a record
        of another file."""
        with self._thread_lock:  # the async-commit thread appends while the user's thread reads
            try:
                fd = os.open(self.offsets_path, os.O_RDONLY)
            except FileNotFoundError:
                self._forget_offsets()
                return {}
            try:
                self._read_offsets(fd)
            finally:
                os.close(fd)
            if self._pending:
                self._resolve_pending()
            return dict(self._offsets)

    def _forget_offsets(self) -> None:
        self._offsets, self._set_at, self._pending = {}, {}, []
        self._offsets_stamp, self._offsets_tail = (-1, -1), b""

    def _read_offsets(self, fd: int) -> None:
        st = os.fstat(fd)
        ino, done = self._offsets_stamp
        tail = self._offsets_tail
        back = len(tail)
        same = ino == st.st_ino and back <= done <= st.st_size
        raw = os.pread(fd, st.st_size - done + back, done - back) if same else b""
        if not same or raw[:back] != tail:
            self._forget_offsets()
            done, back = 0, 0
            raw = os.pread(fd, st.st_size, 0)
        used = self._apply(raw[back:], done, st.st_size) if len(raw) > back else 0
        self._remember_read(st.st_ino, done + used, raw[: back + used])

    def _remember_read(self, ino: int, done: int, raw_until_done: bytes) -> None:
        """``raw_until_done`` ends at file position ``done``."""
        self._offsets_stamp = (ino, done)
        self._offsets_tail = raw_until_done[-16:]

    def _txn_status(self, txn: tuple[int, int, int]) -> str:
        if self._txn_log is None:
            self._txn_log = TxnLog(self.root)
        status: str = self._txn_log.status(*txn)
        return status

    def _resolve_pending(self) -> None:
        still = []
        for position, txn, entries in self._pending:
            status = self._txn_status(txn)
            if status == "committed":
                self._set_entries(entries, position)
            elif status == "open":
                still.append((position, txn, entries))
        self._pending = still

    def _set_entries(self, entries: list[Any], position: int) -> None:
        for topic, partition, offset, metadata in entries:
            tp = TopicPartition(topic, partition)
            if position < self._set_at.get(tp, -1):
                continue  # a later record already set it
            self._set_at[tp] = position
            if offset < 0:
                self._offsets.pop(tp, None)
            else:
                self._offsets[tp] = OffsetAndMetadata(offset, metadata)

    def _apply(self, raw: bytes, base: int, size: int) -> int:
        """Apply whole records of ``raw`` (file bytes from ``base``); returns the bytes used. A torn record at
        the end is left for later (it may still be being written, or be cut off by the next append)."""
        records, used = journal.parse(raw, base, self.offsets_path)
        for position, payload in records:
            try:
                fields = msgpack.unpackb(payload)
                entries = fields[3]
                if len(fields) > 4:
                    txn = (int(fields[4][0]), int(fields[4][1]), int(fields[4][2]))
                    status = self._txn_status(txn)
                    if status == "open":
                        self._pending.append((position, txn, entries))
                    elif status == "committed":
                        self._set_entries(entries, position)
                else:
                    self._set_entries(entries, position)
            except (ValueError, TypeError, IndexError, msgpack.UnpackException) as exc:
                raise CorruptRecordError(
                    f"{self.offsets_path}: bad committed-offset record at position {position}: {exc}",
                    path=self.offsets_path,
                    position=position,
                ) from exc
        return used

    def append_offsets(
        self,
        entries: list[tuple[str, int, int, str]],
        *,
        generation: int,
        member_id: str,
        now_ms: int,
        txn: tuple[int, int, int] | None = None,
    ) -> None:
        """Durably record ``entries`` ``(topic, partition, offset, metadata)``; call while holding :meth:`lock`.
        Returns after the fsync: the commit is acknowledged."""
        current = self.offsets()  # brings the in-memory view up to date and finds the valid end
        fields: list[Any] = [now_ms, generation, member_id, [list(e) for e in entries]]
        if txn is not None:
            fields.append(list(txn))
        payload = msgpack.packb(fields)
        record = journal.encode(payload)
        fd = fs.FS.open(self.offsets_path, os.O_RDWR | os.O_CREAT)
        try:
            ino = os.fstat(fd).st_ino
            if self._offsets_stamp[0] != ino:  # the file did not exist when offsets() looked
                self._forget_offsets()
            valid = max(self._offsets_stamp[1], 0)
            size = fs.FS.size(fd)
            if size > valid:
                fs.FS.ftruncate(fd, valid)  # a torn record left by a crash
            fs.FS.pwrite(fd, record, valid)
            fs.FS.fsync(fd)
            new_size = valid + len(record)
        finally:
            fs.FS.close(fd)
        if valid == 0:
            fs.FS.fsync_dir(self.directory)
        self._apply(record, valid, new_size)
        self._remember_read(ino, new_size, self._offsets_tail + record)
        del current
        if new_size > _COMPACT_MIN_BYTES and new_size > 8 * self._live_bytes() and not self._pending:
            self._rewrite_offsets(now_ms)

    def _live_bytes(self) -> int:
        """About the size of the file rewritten with only the live entries (each stored twice)."""
        entries = sum(len(tp.topic) + len(om.metadata.encode()) + 24 for tp, om in self._offsets.items())
        return 2 * entries + 64

    def _rewrite_offsets(self, now_ms: int) -> None:
        entries = [
            (tp.topic, tp.partition, om.offset, om.metadata) for tp, om in sorted(self._offsets.items())
        ]
        payload = msgpack.packb([now_ms, -1, "", [list(e) for e in entries]])
        fs.atomic_write(self.offsets_path, journal.encode(payload))
        self._forget_offsets()
        self.offsets()

    def delete_files(self) -> None:
        """Remove the group's directory (two-phase: rename, fsync the parent, then remove)."""
        parent = os.path.dirname(self.directory)
        doomed = self.directory + ".deleted"
        fs.rmtree(doomed, ignore_errors=True)
        fs.FS.rename(self.directory, doomed)
        fs.FS.fsync_dir(parent)
        fs.rmtree(doomed, ignore_errors=True)


def _decode_state(raw: bytes, path: str) -> dict[str, Any]:
    head, _, body = raw.partition(b"\n")
    if not head.startswith(b"pylog-group "):
        raise CorruptRecordError(f"{path} is not a pylog group state file", path=path)
    if not head.startswith(_STATE_MAGIC):
        raise UnsupportedFormatError(f"{path} has an unknown group state format: {head[:40]!r}")
    try:
        crc = int(head[len(_STATE_MAGIC) :], 16)
    except ValueError:
        raise CorruptRecordError(f"{path}: bad group state header", path=path) from None
    if crc32c(body) != crc:
        raise CorruptRecordError(f"{path}: group state CRC mismatch", path=path)
    try:
        state = json.loads(body)
        if not isinstance(state, dict) or not isinstance(state.get("members"), dict):
            raise ValueError("not a group state")
    except ValueError as exc:
        raise CorruptRecordError(f"{path}: group state is not valid: {exc}", path=path) from exc
    return state
