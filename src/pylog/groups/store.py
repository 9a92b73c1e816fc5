"""A consumer group's files: its membership state, heartbeats and committed offsets, shared by every process.

Layout, one directory per group under the log root (or, for a log read from an object store, under its
``groups_dir``: :mod:`pylog.groups.replica`)::

    __groups/
        g-<group id, percent-encoded>/
            group.lock        flock: exclusive for every change of ``state``; shared while a commit checks
                              the member's generation and appends (so a commit never races a fencing)
            state             membership, generation and assignment; replaced atomically (format below)
            heartbeats        memory-mapped: one slot per member (heartbeat, joined rebalance) and the
                              version of ``state`` (:mod:`pylog.groups.liveness`)
            offsets.lock      flock: serializes appends to (and rewrites of) ``offsets.log``
            offsets.log       committed offsets: an append-only log, compacted by rewriting (format below)
            members/<id>.lock held (flock, exclusive) by a live dynamic member: a member whose lock can be
                              taken by someone else has died, and is removed without waiting for its session
            kafka.lock        held (flock, exclusive) by pylog's broker while Kafka clients are members of
                              the group (:mod:`pylog.broker.groups`): pylog consumers may not join then

``state`` (format 2)::

    offset  size  field
    0       14    b"pylog-group 2 " (magic and format version)
    14      8     CRC-32C of the body, 8 lowercase hex digits
    22      1     b"\\n"
    23      n     body: a msgpack map (below)

The body: ``version`` (incremented by every write; ``heartbeats`` publishes it), ``group_id``, ``state``
(``Empty``, ``PreparingRebalance``, ``Stable``), ``generation``, ``assignor``, ``protocol``, ``leader``,
``rebalance`` (``{id, started_ms, deadline_ms, not_before_ms, reasons}`` or nil), ``rebalance_id``, ``topics``
(``{topic: partitions}`` of the last assignment), ``static`` (``{group_instance_id: member_id}``) and
``members``, ``{member_id: {slot, instance_id, client_id, host, pid, topics, pattern, assignor,
session_timeout_ms, rebalance_timeout_ms, since_ms, generation, assignment}}`` where ``assignment`` is
``{topic: [partition, ...]}`` (sorted) and ``slot`` the member's slot in ``heartbeats``. A member's
heartbeat and the rebalance it last joined are in its slot, not here: they change without rewriting the
state.

Format 1 (pylog before heartbeats moved out of the state) is read as well: line 1 ``b"pylog-group 1 <crc>\\n"``,
then JSON with the same fields except ``version`` and ``slot``, assignments as ``[[topic, partition], ...]``
and per member ``heartbeat_ms``, ``joined``, ``owned``. It is converted when read (its members have no slot:
their heartbeat is taken as the one the file recorded) and written back in format 2 by the next change.

Reading without the lock: ``state`` is replaced by a rename, so a read always sees one whole version. A
reader keeps the last version it decoded and reuses it while ``heartbeats`` publishes that version
(:meth:`GroupStore.state_view`: one memory read, no system call). A writer (under the exclusive lock) first
makes the published sequence odd, replaces the file, then publishes ``2 * version``: a writer that died in
between leaves it odd, and readers then read the file until the next writer publishes again.

``offsets.log``, a sequence of :mod:`pylog.journal` records (each payload stored twice, each copy with its
CRC-32C) whose payload is msgpack ``[timestamp_ms, generation, member_id, [[topic, partition, offset,
metadata], ...]]`` and, for offsets committed by a transaction, a fifth element ``[producer_id,
producer_epoch, txn]``; offset -1 deletes the entry.

A transactional record counts once its transaction is committed (:mod:`pylog.transactions`), at its own
place in the file; it is ignored if the transaction was aborted, and waits while it is open.

The last record for a partition wins. A record is acknowledged only after its fsync, which runs after the
append lock is released, so the fsyncs of members committing at once overlap. A torn record at the end of the
file (a crash during an append that was never acknowledged) is ignored and cut off by the next append; a
damaged record followed by intact ones is corruption: :class:`~pylog.errors.CorruptRecordError` naming the
file and position. The file is rewritten with only the live entries (temp, fsync, rename, fsync directory)
when it has grown to many times their size.

Thread-safety: a :class:`GroupStore` may be used from several threads; :meth:`GroupStore.lock` serializes
them within the process and, through ``flock``, with every other process. Crash contract: ``state`` is always
either the old or the new version; ``offsets.log`` loses at most a commit that was not acknowledged;
``heartbeats`` holds nothing durable.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import msgpack

from pylog import fs, journal
from pylog.errors import (
    ConfigError,
    CorruptRecordError,
    InvalidOffsetError,
    ReadOnlyLogError,
    UnsupportedFormatError,
)
from pylog.groups.liveness import HeartbeatTable, Slot, member_tag
from pylog.record import crc32c
from pylog.structs import OffsetAndMetadata, TopicPartition
from pylog.transactions import TxnLog

if TYPE_CHECKING:
    from pylog.directory import LogDirectory

__all__ = [
    "GROUPS_DIR",
    "GroupStore",
    "PendingSync",
    "compact_partitions",
    "group_ids",
    "groups_root",
    "partitions_of",
    "to_topic_partition",
    "validate_group_id",
]

GROUPS_DIR = "__groups"
#: state path -> (heartbeat table incarnation, (version, msgpack body, decoded state)): the last version
#: decoded in this process, shared by its stores of the group
_DECODED: dict[str, tuple[int, tuple[int, bytes, dict[str, Any]]]] = {}
#: group directory -> what this process read of its offsets.log (see _CommittedOffsets)
_COMMITTED: dict[str, _CommittedOffsets] = {}
_COMMITTED_LOCK = threading.Lock()
_STATE_MAGIC = b"pylog-group 2 "
_STATE_MAGIC_V1 = b"pylog-group 1 "
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


def compact_partitions(tps: Iterable[TopicPartition]) -> dict[str, list[int]]:
    """Partitions as the state stores them: ``{topic: [partition, ...]}``, topics and partitions sorted."""
    out: dict[str, list[int]] = {}
    for tp in sorted(tps):
        out.setdefault(tp.topic, []).append(tp.partition)
    return out


def partitions_of(compact: Mapping[str, Iterable[int]]) -> set[TopicPartition]:
    """The set of partitions of a ``{topic: [partition, ...]}`` map."""
    return {TopicPartition(topic, p) for topic, ps in compact.items() for p in ps}


def groups_root(log: LogDirectory) -> str:
    """The directory holding ``log``'s groups (``log.groups_root``): the log directory itself, or the
    ``groups_dir`` of a log read from an object store (:mod:`pylog.groups.replica`). Such a log opened without
    one has none: :class:`~pylog.errors.ReadOnlyLogError`, naming the option."""
    root = log.groups_root
    if root is None:
        raise ReadOnlyLogError(
            f"the log at {log.path} is read from an object store and has no local directory for consumer groups "
            "(their membership and committed offsets): open it with groups_dir=<a local directory>, shared by "
            "the processes of the group, or read without group_id"
        )
    return root


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
        "version": 0,
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


class PendingSync:
    """A commit written to ``offsets.log`` but not yet fsynced: :meth:`sync` acknowledges it."""

    def __init__(self, fd: int | None, directory: str | None) -> None:
        self._fd = fd  # None: already on disk
        self._directory = directory  # fsynced too when the append created the file

    def sync(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            fs.FS.fsync(fd)
        finally:
            fs.FS.close(fd)
        if self._directory is not None:
            fs.FS.fsync_dir(self._directory)


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
        self._offsets_lock_fd = fs.FS.open(
            os.path.join(self.directory, "offsets.lock"), os.O_RDWR | os.O_CREAT
        )
        self.table = HeartbeatTable(os.path.join(self.directory, "heartbeats"))
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._shared = False
        self._committed = _CommittedOffsets.acquire(root, self.directory)
        self._state_cache: tuple[int, bytes, dict[str, Any]] | None = None  # (version, raw, decoded)
        self._closed = False
        if not self.table.initialized:
            with self.lock():
                self.table.initialize()

    def close(self) -> None:
        with self._thread_lock:
            if not self._closed:
                self._closed = True
                fs.FS.close(self._lock_fd)
                fs.FS.close(self._offsets_lock_fd)
                self.table.close()
                self._committed.release()

    @contextlib.contextmanager
    def lock(self, *, shared: bool = False) -> Iterator[None]:
        """The group lock across threads and processes (re-entrant within a thread): exclusive to change the
        state; ``shared`` to act on a state that must not change meanwhile (a commit's fencing check)."""
        with self._thread_lock:
            if self._depth == 0:
                fcntl.flock(self._lock_fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
                self._shared = shared
            elif self._shared and not shared:
                raise RuntimeError("the group lock is held shared by this thread: it cannot be upgraded")
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    # -- state ------------------------------------------------------------------------------------------

    def state_seq(self) -> int:
        """Changes whenever ``state`` is replaced: one read of shared memory, no system call."""
        return self.table.state_seq()

    def state_view(self) -> Mapping[str, Any]:
        """The current state, shared: the caller must not change it (it is the cached copy every later call
        returns until the state changes). Needs no lock: the file is read only when ``heartbeats`` publishes
        a version other than the cached one."""
        return self._current()[2]

    def read_state(self) -> dict[str, Any]:
        """The current state, as a copy the caller may change and pass to :meth:`write_state` (call under the
        exclusive lock). The copy is two levels deep: the top level, ``rebalance``, ``topics``, ``static``,
        ``members`` and each member's record are new dicts; lists and assignments inside a record are shared
        with the cached view, so the protocol replaces them, never changes them in place."""
        view = self._current()[2]
        state = dict(view)
        for key in ("rebalance", "topics", "static"):
            if isinstance(view.get(key), dict):
                state[key] = dict(view[key])
        state["members"] = {mid: dict(m) for mid, m in view["members"].items()}
        return state

    def _current(self) -> tuple[int, bytes, dict[str, Any]]:
        """(version, msgpack body, decoded body) of the state now in the file. The decoded state is shared
        by the stores of the group in this process (members of one group decode each version once)."""
        cached = self._state_cache
        seq = self.table.state_seq()
        if cached is not None and seq == 2 * cached[0]:
            return cached
        incarnation = self.table.incarnation()
        shared = _DECODED.get(self.state_path)
        if shared is not None and shared[0] == incarnation and seq == 2 * shared[1][0]:
            self._state_cache = shared[1]
            return shared[1]
        try:
            with open(self.state_path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            empty = empty_state(self.group_id)
            return (0, msgpack.packb(empty), empty)
        fresh = _decode_state(raw, self.state_path)
        if fresh[0] > 0:  # a format 1 state (version 0) is read every time: its writers publish nothing
            self._state_cache = fresh
            _DECODED[self.state_path] = (incarnation, fresh)
        return fresh

    def write_state(self, state: dict[str, Any]) -> None:
        """Replace the state (call under the exclusive lock, with a state from :meth:`read_state`). The dict
        becomes the cached view: the caller must not change it afterwards."""
        version = int(state.get("version", 0)) + 1
        state["version"] = version
        body = msgpack.packb(state)
        raw = _STATE_MAGIC + f"{crc32c(body):08x}\n".encode() + body
        self.table.set_state_seq(2 * version - 1)
        tmp = self.state_path + ".tmp"
        fd = fs.FS.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            fs.FS.pwrite(fd, raw, 0)
            fs.FS.fsync(fd)  # the rename below then replaces the old version by a whole new one
        finally:
            fs.FS.close(fd)
        fs.FS.rename(tmp, self.state_path)
        # No directory fsync: after a power loss the old version may come back, which is the crash contract
        # (the state only describes live members, and none survive a power loss).
        self._state_cache = (version, body, state)
        _DECODED[self.state_path] = (self.table.incarnation(), self._state_cache)
        self.table.set_state_seq(2 * version)

    # -- heartbeats -------------------------------------------------------------------------------------

    def free_slot(self, state: Mapping[str, Any]) -> int:
        """The lowest slot no member of ``state`` uses; the table grows to hold it (exclusive lock)."""
        used = {m.get("slot") for m in state["members"].values()}
        slot = 0
        while slot in used:
            slot += 1
        self.table.ensure_capacity(slot + 1)
        return slot

    def slot_of(self, member_id: str, member: Mapping[str, Any]) -> Slot | None:
        """The member's slot, if it still holds it (its tag matches)."""
        index = member.get("slot")
        if index is None:
            return None
        slot = self.table.read(index)
        if slot is None or slot.tag != member_tag(member_id):
            return None
        return slot

    def last_heartbeat(self, member_id: str, member: Mapping[str, Any]) -> int:
        """The member's last heartbeat (its slot's, or the time it joined if its slot does not name it)."""
        slot = self.slot_of(member_id, member)
        since = int(member.get("since_ms", 0))
        return since if slot is None else max(slot.heartbeat_ms, since)

    def joined(self, member_id: str, member: Mapping[str, Any]) -> int:
        """The id of the last rebalance the member joined (-1 if its slot does not name it)."""
        slot = self.slot_of(member_id, member)
        return -1 if slot is None else slot.joined

    # -- member liveness --------------------------------------------------------------------------------

    def member_lock_path(self, member_id: str) -> str:
        return os.path.join(self.members_dir, quote(member_id, safe="") + ".lock")

    def hold_member_lock(self, member_id: str) -> int:
        """Create and lock the member's liveness file; the returned descriptor keeps it held."""
        fd = fs.FS.open(self.member_lock_path(member_id), os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def hold_kafka_lock(self) -> int | None:
        """Take the group's ``kafka.lock`` (pylog's broker, while Kafka clients are members): the descriptor
        that keeps it held, or None when another broker holds it. Call under :meth:`lock`."""
        fd = fs.FS.open(os.path.join(self.directory, "kafka.lock"), os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fs.FS.close(fd)
            return None
        return fd

    def kafka_clients(self) -> bool:
        """True while pylog's broker has Kafka clients as members of this group (it holds ``kafka.lock``)."""
        try:
            fd = os.open(os.path.join(self.directory, "kafka.lock"), os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

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
        """Committed offsets, the latest per partition (read incrementally, see :class:`_CommittedOffsets`)."""
        return self._committed.offsets()

    def append_offsets(
        self,
        entries: list[tuple[str, int, int, str]],
        *,
        generation: int,
        member_id: str,
        now_ms: int,
        txn: tuple[int, int, int] | None = None,
    ) -> None:
        """Durably record ``entries`` ``(topic, partition, offset, metadata)``; returns after the fsync: the
        commit is acknowledged."""
        self.write_offsets(entries, generation=generation, member_id=member_id, now_ms=now_ms, txn=txn).sync()

    def write_offsets(
        self,
        entries: list[tuple[str, int, int, str]],
        *,
        generation: int,
        member_id: str,
        now_ms: int,
        txn: tuple[int, int, int] | None = None,
    ) -> PendingSync:
        """Append ``entries`` ``(topic, partition, offset, metadata)`` under the append lock (``offsets.lock``),
        and return what acknowledges them: :meth:`PendingSync.sync`, the fsync, which the caller runs after
        releasing its locks, so that the fsyncs of members committing at once overlap."""
        fields: list[Any] = [now_ms, generation, member_id, [list(e) for e in entries]]
        if txn is not None:
            fields.append(list(txn))
        record = journal.encode(msgpack.packb(fields))
        with self._committed.lock:
            self._committed.find_end()  # catch up before taking the append lock, so it is held briefly
            fcntl.flock(self._offsets_lock_fd, fcntl.LOCK_EX)
            try:
                return self._committed.append(record, now_ms)
            finally:
                fcntl.flock(self._offsets_lock_fd, fcntl.LOCK_UN)

    def delete_files(self) -> None:
        """Remove the group's directory (two-phase: rename, fsync the parent, then remove)."""
        parent = os.path.dirname(self.directory)
        doomed = self.directory + ".deleted"
        fs.rmtree(doomed, ignore_errors=True)
        fs.FS.rename(self.directory, doomed)
        fs.FS.fsync_dir(parent)
        fs.rmtree(doomed, ignore_errors=True)


class _CommittedOffsets:
    """What this process has read of a group's ``offsets.log``, shared by its stores of the group (members
    of one group in one process read each record once). Counted references: the last store to close it
    closes it. Thread-safety: :attr:`lock` guards everything.
    """

    def __init__(self, root: str, directory: str) -> None:
        self.root = root
        self.directory = directory
        self.offsets_path = os.path.join(directory, "offsets.log")
        self.lock = threading.RLock()
        self.users = 0
        self._offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        self._set_at: dict[TopicPartition, int] = {}  # file position of the record that set each offset
        self._pending: list[tuple[int, tuple[int, int, int], list[Any]]] = []  # open transactions' records
        self._unapplied: list[tuple[int, bytes]] = []  # (position, payload) read and checked, not applied
        self._txn_log: Any = None
        self._offsets_stamp: tuple[int, int] = (-1, -1)  # (inode, bytes read)
        self._offsets_tail = b""  # the last bytes read: tells a reused inode number from the same file
        self._check_at = 0  # the file size at which to consider a rewrite next

    @classmethod
    def acquire(cls, root: str, directory: str) -> _CommittedOffsets:
        with _COMMITTED_LOCK:
            found = _COMMITTED.get(directory)
            if found is None:
                found = _COMMITTED[directory] = cls(root, directory)
            found.users += 1
            return found

    def release(self) -> None:
        with _COMMITTED_LOCK:
            self.users -= 1
            if self.users > 0:
                return
            if _COMMITTED.get(self.directory) is self:
                del _COMMITTED[self.directory]
        with self.lock:
            if self._txn_log is not None:
                self._txn_log.close()
                self._txn_log = None

    def offsets(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """Committed offsets, the latest per partition (read incrementally: only new records are parsed).

        The file read so far is recognised by its inode number and the bytes just before where reading
        stopped: a compaction by another process replaces the file, and the new one may get the old inode
        number back once that is free, so the number alone could make this resume in the middle of a record
        of another file."""
        with self.lock:  # the async-commit thread appends while the user's thread reads
            try:
                fd = os.open(self.offsets_path, os.O_RDONLY)
            except FileNotFoundError:
                self._forget_offsets()
                return {}
            try:
                self._read_offsets(fd)
            finally:
                os.close(fd)
            self._apply_read()
            if self._pending:
                self._resolve_pending()
            return dict(self._offsets)

    def find_end(self) -> None:
        """Read (without applying) what other processes appended, to find where the valid records end."""
        try:
            fd = os.open(self.offsets_path, os.O_RDONLY)
        except FileNotFoundError:
            self._forget_offsets()
            return
        try:
            self._read_offsets(fd)
        finally:
            os.close(fd)

    def _forget_offsets(self) -> None:
        self._offsets, self._set_at, self._pending, self._unapplied = {}, {}, [], []
        self._offsets_stamp, self._offsets_tail, self._check_at = (-1, -1), b"", 0

    def _apply_read(self) -> None:
        """Apply the records read (and CRC-checked) but not applied yet: an append only needs to know where
        the valid records end, so other members' commits are decoded when someone asks for the offsets."""
        records, self._unapplied = self._unapplied, []
        for position, payload in records:
            self._apply_record(position, payload)

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
        used = self._take(raw[back:], done) if len(raw) > back else 0
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

    def _take(self, raw: bytes, base: int) -> int:
        """Check the whole records of ``raw`` (file bytes from ``base``) and keep them to apply; returns the
        bytes used. A torn record at the end is left for later (it may still be being written, or be cut off by
        the next append)."""
        records, used = journal.parse(raw, base, self.offsets_path)
        self._unapplied.extend(records)
        return used

    def _apply_record(self, position: int, payload: bytes) -> None:
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

    def append(self, record: bytes, now_ms: int) -> PendingSync:
        """Append ``record`` (the caller holds :attr:`lock` and the append lock, ``offsets.lock``)."""
        self.find_end()
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
            new_size = valid + len(record)
        except BaseException:
            fs.FS.close(fd)
            raise
        pending = PendingSync(fd, self.directory if valid == 0 else None)
        self._take(record, valid)
        self._remember_read(ino, new_size, self._offsets_tail + record)
        if new_size < max(_COMPACT_MIN_BYTES, self._check_at):
            return pending
        # the live size decides (looked at again after another eighth of growth: it costs a pass over every
        # committed offset, under the append lock), and the rewrite copies the applied entries
        self._check_at = new_size + new_size // 8
        self._apply_read()
        if new_size > 8 * self._live_bytes() and not self._pending:
            pending.sync()  # the rewrite below copies this record: it is on disk first
            self._rewrite_offsets(now_ms)
            return PendingSync(None, None)
        return pending

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


_HEAD_SIZE = len(_STATE_MAGIC) + 9  # magic, 8 hex digits of CRC-32C, b"\n"


def _decode_state(raw: bytes, path: str) -> tuple[int, bytes, dict[str, Any]]:
    """(version, msgpack body, decoded body) of a state file of either format."""
    if not raw.startswith(b"pylog-group "):
        raise CorruptRecordError(f"{path} is not a pylog group state file", path=path)
    if raw.startswith(_STATE_MAGIC_V1):
        state = _from_v1(_checked_body(raw, raw.find(b"\n") + 1, path), path)
        return (0, msgpack.packb(state), state)
    if not raw.startswith(_STATE_MAGIC):
        head = raw.partition(b"\n")[0]
        raise UnsupportedFormatError(
            f"{path} has an unknown group state format: {head[:40]!r} (written by a newer pylog: open the "
            "log directory with that version, or delete the group once its members stopped)"
        )
    body = _checked_body(raw, _HEAD_SIZE, path)
    try:
        state = msgpack.unpackb(body)
        if not isinstance(state, dict) or not isinstance(state.get("members"), dict):
            raise ValueError("not a group state")
        version = state["version"]
        if not isinstance(version, int) or version < 1:
            raise ValueError(f"bad version {version!r}")
    except (ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptRecordError(f"{path}: group state is not valid: {exc}", path=path) from exc
    return (version, body, state)


def _checked_body(raw: bytes, start: int, path: str) -> bytes:
    """The body of a state file whose header (magic, CRC in hex, newline) ends at ``start``."""
    magic = len(_STATE_MAGIC)
    if start != _HEAD_SIZE or raw[start - 1 : start] != b"\n":
        raise CorruptRecordError(f"{path}: bad group state header", path=path)
    try:
        crc = int(raw[magic : start - 1], 16)
    except ValueError:
        raise CorruptRecordError(f"{path}: bad group state header", path=path) from None
    body = raw[start:]
    if crc32c(body) != crc:
        raise CorruptRecordError(f"{path}: group state CRC mismatch", path=path)
    return body


def _from_v1(body: bytes, path: str) -> dict[str, Any]:
    """A format 1 state (JSON, written by pylog before heartbeats moved out of it) in the format 2 shape."""
    try:
        old = json.loads(body)
        if not isinstance(old, dict) or not isinstance(old.get("members"), dict):
            raise ValueError("not a group state")
        state = {k: v for k, v in old.items() if k != "members"}
        state["version"] = 0
        state.setdefault("rebalance_id", 0)
        state["members"] = {
            mid: {
                **{k: v for k, v in m.items() if k not in ("heartbeat_ms", "joined", "owned", "assignment")},
                "slot": None,
                "since_ms": m["heartbeat_ms"],
                "assignment": compact_partitions(TopicPartition(t, p) for t, p in m["assignment"]),
            }
            for mid, m in old["members"].items()
        }
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptRecordError(f"{path}: group state is not valid: {exc}", path=path) from exc
    return state
