"""Transactions: producer ids and epochs, the commit decisions, and what ``read_committed`` readers see.

Files, under the log root::

    __transactions/
        lock            flock: serializes producer-id allocation, epoch bumps and decisions
        producers       JSON, replaced atomically: {"next_pid": int, "ids": {transactional_id: {"pid", "epoch",
                        "txn", "open": null | {"txn", "started_ms", "timeout_ms"}}}}
        decisions.log   append-only, fsynced records (format below): the commit point of every transaction

``decisions.log`` is a sequence of :mod:`pylog.journal` records (each payload stored twice, each copy with
its CRC-32C) whose payload is msgpack ``[kind, producer_id, producer_epoch, txn]``; kind "C" commit, "A"
abort, "E" epoch (this epoch is now the producer id's current one); or ``["M", [[producer_id,
producer_epoch, txn], ...]]``: one commit of several transactions (of several transactional ids) at once,
written by :meth:`TxnLog.commit_many` (Spark's streaming sink commits the transactions of all the tasks of a
micro-batch with it). A transaction has at most one decision: the first one in the file counts.

A transaction's records are written to their partitions as they are sent, in batches with the transactional
attribute bit and ``(producer_id, producer_epoch, base_sequence = txn)`` in the header; its committed group
offsets go to the group's offset log tagged with the same triple. Nothing of it counts until its decision:
a "C" record, appended and fsynced after every batch and offset of the transaction is durable, makes all of
it visible at once, to ``read_committed`` consumers and to the group; an "A" record (an explicit abort, a
producer restarting with the same ``transactional_id``, or ``transaction_timeout_ms`` passing) hides all of
it. A batch of an epoch older than its producer id's current one without a "C" is aborted: a fenced
("zombie") producer can still write bytes, but never make them visible.

What a reader sees is decided by one rule, :mod:`pylog.partition.visibility`, over :meth:`TxnDecisions.status`:
a ``read_committed`` reader stops at the first transactional batch that has no decision yet (Kafka's last
stable offset) and skips aborted ones; ``read_uncommitted`` (the default, as in Kafka) returns everything.
Readers that must not write (Spark's planner) read the decisions with :class:`TxnDecisions`, which creates,
locks and changes no file; they cannot abort a transaction past its timeout, only a :class:`TxnLog` can.

Tiered storage copies ``decisions.log`` to the object store with the ``producers`` state read with it
(:meth:`TxnLog.snapshot`, :mod:`pylog.tiered.decisions`); readers of the store apply the copy with
:meth:`TxnDecisions.apply`, the parser of the file, and ``pylog restore`` installs it (:meth:`TxnLog.install`).

Thread-safety: a :class:`TxnLog` (or :class:`TxnDecisions`) may be shared by threads; changes take the flock,
so processes share it too.
Crash contract: a transaction is committed iff its "C" record (or an "M" record naming it) is in
``decisions.log`` before any "A" record for it; a torn last record was never acknowledged and is ignored.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgpack

from pylog import fs, journal
from pylog.errors import CorruptRecordError, IllegalStateError, ProducerFencedError
from pylog.framing import frame, unframe

__all__ = ["ABORTED", "COMMITTED", "MAX_EPOCH", "OPEN", "TXN_DIR", "TxnDecisions", "TxnLog"]

TXN_DIR = "__transactions"
_PRODUCERS_MAGIC = b"pylog-producers"
MAX_EPOCH = 32767  # producer_epoch is an i16 in a batch header
COMMITTED, ABORTED, OPEN = "committed", "aborted", "open"


class TxnDecisions:
    """The decisions of one log directory, read only: :meth:`status` of any transaction, from
    ``decisions.log`` (re-read as it grows). Creates, locks and changes no file: a directory without
    transactions has every transaction open (none can be in a partition then)."""

    def __init__(self, root: str) -> None:
        self.directory = os.path.join(root, TXN_DIR)
        self._decisions_path = os.path.join(self.directory, "decisions.log")
        self._thread_lock = threading.RLock()
        self._decisions: dict[tuple[int, int, int], str] = {}
        self._epochs: dict[int, int] = {}
        self._read = (-1, 0)  # (inode, bytes applied)

    def _note(self, kind: str, pid: int, epoch: int, txn: int) -> None:
        if kind == "E":
            self._epochs[pid] = max(self._epochs.get(pid, -1), epoch)
        else:
            # the first decision counts: a crash after a commit's record but before the producers file says
            # so leaves the transaction "open" there, and the next init() appends an "A" that must not undo it
            self._decisions.setdefault((pid, epoch, txn), COMMITTED if kind == "C" else ABORTED)

    def _note_payload(self, payload: bytes) -> None:
        fields = msgpack.unpackb(payload)
        if fields[0] == "M":
            for pid, epoch, txn in fields[1]:
                self._note("C", pid, epoch, txn)
        else:
            kind, pid, epoch, txn = fields
            self._note(kind, pid, epoch, txn)

    def _refresh(self) -> None:
        try:
            fd = os.open(self._decisions_path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            st = os.fstat(fd)
            ino, done = self._read
            if ino != st.st_ino:
                self._decisions, self._epochs, done = {}, {}, 0
            if st.st_size <= done:
                self._read = (st.st_ino, done)
                return
            raw = os.pread(fd, st.st_size - done, done)
        finally:
            os.close(fd)
        used = self.apply(raw, done, self._decisions_path)
        self._read = (st.st_ino, done + used)

    def apply(self, raw: bytes, position: int, source: str, *, whole: bool = False) -> int:
        """Apply ``raw``, the bytes of ``decisions.log`` from byte ``position`` on (following what was
        applied before), wherever they were read from (the file, or the object store's copy:
        :mod:`pylog.tiered.decisions`); the bytes used (a torn record at the end is left out, unless ``whole``:
        then it is an error too). :class:`~pylog.errors.CorruptRecordError` naming ``source`` for a damaged
        record, before anything of ``raw`` is applied."""
        records, used = journal.parse(raw, position, source)
        if whole and used != len(raw):
            raise CorruptRecordError(
                f"{source}: damaged or torn record at position {position + used}",
                path=source,
                position=position + used,
            )
        for _, payload in records:
            self._note_payload(payload)
        return used

    def reset(self) -> None:
        """Forget every decision applied (a reader about to apply a decisions file from its start again)."""
        self._decisions, self._epochs = {}, {}

    def decided(self) -> tuple[dict[tuple[int, int, int], str], dict[int, int]]:
        """Copies of what was applied: ``{(producer_id, epoch, txn): COMMITTED | ABORTED}`` and each producer
        id's current epoch (``{producer_id: epoch}``)."""
        with self._thread_lock:
            return dict(self._decisions), dict(self._epochs)

    def abort_expired(self, now_ms: int) -> int:
        """A reader that cannot write aborts nothing: 0 (:meth:`TxnLog.abort_expired` records the aborts)."""
        return 0

    def frozen_status(self) -> Callable[[int, int, int], str]:
        """A status function (as :meth:`status`) over the decisions made up to now: later ones are not seen,
        their transactions stay open to it. Every batch of a transaction is written before its decision, so a
        reader that takes this first and then reads partitions to their ends finds every batch of each
        transaction it sees committed (a read of several partitions then shows none of them in part)."""
        with self._thread_lock:
            self._refresh()
            decisions, epochs = dict(self._decisions), dict(self._epochs)

        def status(pid: int, epoch: int, txn: int) -> str:
            found = decisions.get((pid, epoch, txn))
            if found is not None:
                return found
            return ABORTED if epochs.get(pid, -1) > epoch else OPEN

        return status

    def status(self, pid: int, epoch: int, txn: int) -> str:
        """``COMMITTED``, ``ABORTED`` or ``OPEN`` for the transaction a batch belongs to (the status function
        of :class:`pylog.partition.visibility.Visibility`)."""
        key = (pid, epoch, txn)
        found = self._decisions.get(key)
        if found is None:
            with self._thread_lock:
                self._refresh()
            found = self._decisions.get(key)
        if found is not None:
            return found
        if self._epochs.get(pid, -1) > epoch:
            return ABORTED  # written by a fenced producer: can never commit
        return OPEN


class TxnLog(TxnDecisions):
    """The transaction state of one log directory (see the module docstring): producers, and the decisions
    it appends."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        fs.makedirs(self.directory)
        self._lock_fd = fs.FS.open(os.path.join(self.directory, "lock"), os.O_RDWR | os.O_CREAT)
        self._producers_path = os.path.join(self.directory, "producers")
        self._depth = 0

    def close(self) -> None:
        with contextlib.suppress(OSError):
            fs.FS.close(self._lock_fd)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
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

    # -- producers --------------------------------------------------------------------------------------

    def _load(self) -> dict[str, Any]:
        try:
            with open(self._producers_path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return {"next_pid": 0, "ids": {}}
        try:
            body = unframe(raw, _PRODUCERS_MAGIC, 1, f"producers file {self._producers_path}")
        except ValueError as exc:
            raise CorruptRecordError(str(exc), path=self._producers_path) from None
        state: dict[str, Any] = json.loads(body)
        return state

    def _store(self, state: dict[str, Any]) -> None:
        body = json.dumps(state, sort_keys=True).encode()
        fs.atomic_write(self._producers_path, frame(_PRODUCERS_MAGIC, 1, body))

    def snapshot(self, known: int = 0) -> tuple[dict[str, Any], bytes]:
        """The producers state and the valid bytes of ``decisions.log`` (a torn last record left out) as of one
        moment: read under the lock, so the state is the one after the last decision in the bytes. The file is
        fsynced first, so the bytes returned survive a crash of this machine (what the object store's copy of
        the decisions, :mod:`pylog.tiered.decisions`, is made of). The first ``known`` bytes are not parsed
        again (the caller checks them otherwise: a CRC). Changes nothing."""
        with self.lock():
            state = self._load()
            try:
                fd = os.open(self._decisions_path, os.O_RDONLY)
            except FileNotFoundError:
                return state, b""
            try:
                os.fsync(fd)
                raw = os.pread(fd, os.fstat(fd).st_size, 0)
            finally:
                os.close(fd)
        known = min(max(known, 0), len(raw))
        try:
            _, used = journal.parse(raw[known:], known, self._decisions_path)
        except CorruptRecordError:  # ``known`` is no record boundary of this file: parse it all
            known = 0
            _, used = journal.parse(raw, 0, self._decisions_path)
        return state, raw[: known + used]

    def install(
        self, state: dict[str, Any], decisions: bytes, aborts: Sequence[tuple[int, int, int]] = ()
    ) -> None:
        """Set up this new transaction directory from a copy (``pylog restore``): ``decisions`` (whole
        journal records) becomes ``decisions.log`` and ``state`` the producers file (both written
        crash-safely), then an "A" record is appended for each ``(producer_id, epoch, txn)`` of ``aborts``.
        :class:`~pylog.errors.IllegalStateError` if the directory has decisions or producers already;
        :class:`~pylog.errors.CorruptRecordError` if ``decisions`` does not parse whole."""
        with self.lock():
            if os.path.exists(self._decisions_path) or os.path.exists(self._producers_path):
                raise IllegalStateError(f"{self.directory} holds transactions already: nothing installed")
            _, used = journal.parse(decisions, 0, self._decisions_path)
            if used != len(decisions):
                raise CorruptRecordError(
                    f"the decisions to install end in a torn record at {used}", path=self._decisions_path
                )
            if decisions:
                fs.atomic_write(self._decisions_path, decisions)
            self._store(state)
            for pid, epoch, txn in aborts:
                self._append("A", pid, epoch, txn)

    def allocate_pid(self) -> int:
        """A producer id for an idempotent producer without a transactional id."""
        with self.lock():
            state = self._load()
            pid = int(state["next_pid"])
            state["next_pid"] = pid + 1
            self._store(state)
            return pid

    def init(self, transactional_id: str) -> tuple[int, int]:
        """Register (or re-register) ``transactional_id``: abort its open transaction, bump its epoch (fencing
        any older instance) and return ``(producer_id, epoch)``."""
        with self.lock():
            state = self._load()
            entry = state["ids"].get(transactional_id)
            if entry is None:
                entry = {"pid": int(state["next_pid"]), "epoch": -1, "txn": 0, "open": None}
                state["next_pid"] = entry["pid"] + 1
                state["ids"][transactional_id] = entry
            if entry["open"] is not None:
                self._append("A", entry["pid"], entry["epoch"], entry["open"]["txn"])
                entry["open"] = None
            self._bump_epoch(state, entry)
            self._store(state)
            return entry["pid"], entry["epoch"]

    def _bump_epoch(self, state: dict[str, Any], entry: dict[str, Any]) -> None:
        """The next epoch of ``entry`` (fencing the current one); past :data:`MAX_EPOCH` (a batch header holds
        an i16) the transactional id gets a new producer id at epoch 0, as in Kafka, and the old id is fenced."""
        if entry["epoch"] >= MAX_EPOCH:
            self._append("E", entry["pid"], entry["epoch"] + 1, 0)
            entry["pid"], entry["epoch"] = int(state["next_pid"]), -1
            state["next_pid"] = entry["pid"] + 1
        entry["epoch"] += 1
        self._append("E", entry["pid"], entry["epoch"], 0)

    def _entry(self, state: dict[str, Any], transactional_id: str, pid: int, epoch: int) -> dict[str, Any]:
        entry: dict[str, Any] | None = state["ids"].get(transactional_id)
        if entry is None or entry["pid"] != pid or entry["epoch"] != epoch:
            raise ProducerFencedError(
                f"producer for transactional_id {transactional_id!r} (epoch {epoch}) was fenced by a newer "
                "instance or its transaction timed out; close it (a new producer with the same id takes over)"
            )
        return entry

    def begin(self, transactional_id: str, pid: int, epoch: int, now_ms: int, timeout_ms: int) -> int:
        """Open the next transaction; returns its number."""
        with self.lock():
            state = self._load()
            entry = self._entry(state, transactional_id, pid, epoch)
            txn = int(entry["txn"]) + 1
            entry["txn"] = txn
            entry["open"] = {"txn": txn, "started_ms": now_ms, "timeout_ms": timeout_ms}
            self._store(state)
            return txn

    def end(self, transactional_id: str, pid: int, epoch: int, txn: int, *, commit: bool) -> None:
        """Decide the open transaction ``txn``: the "C"/"A" record is the commit point."""
        with self.lock():
            state = self._load()
            entry = self._entry(state, transactional_id, pid, epoch)
            if entry["open"] is None or entry["open"]["txn"] != txn:
                raise ProducerFencedError(
                    f"transaction {txn} of {transactional_id!r} is no longer open (it timed out and was aborted)"
                )
            self._append("C" if commit else "A", pid, epoch, txn)
            entry["open"] = None
            self._store(state)

    def commit_many(self, txns: Sequence[tuple[str, int, int, int]]) -> None:
        """Commit several open transactions ``(transactional_id, producer_id, epoch, txn)`` with one decision
        record: all of them become visible at once, or (a crash before the record is durable) none. Raises
        :class:`~pylog.errors.ProducerFencedError`, deciding nothing, if any of them is not open (fenced, timed
        out, aborted or already decided)."""
        if not txns:
            return
        with self.lock():
            state = self._load()
            entries = []
            for tid, pid, epoch, txn in txns:
                entry = self._entry(state, tid, pid, epoch)
                if entry["open"] is None or entry["open"]["txn"] != txn:
                    raise ProducerFencedError(
                        f"transaction {txn} of {tid!r} is no longer open (it timed out or was aborted)"
                    )
                entries.append(entry)
            self._append_payload(msgpack.packb(["M", [[pid, epoch, txn] for _, pid, epoch, txn in txns]]))
            for entry in entries:
                entry["open"] = None
            self._store(state)

    def abort_expired(self, now_ms: int) -> int:
        """Abort transactions open longer than their timeout, fencing their producers; returns how many."""
        with self.lock():
            state = self._load()
            n = 0
            for entry in state["ids"].values():
                opened = entry["open"]
                if opened is not None and now_ms - opened["started_ms"] > opened["timeout_ms"]:
                    self._append("A", entry["pid"], entry["epoch"], opened["txn"])
                    entry["open"] = None
                    self._bump_epoch(state, entry)
                    n += 1
            if n:
                self._store(state)
            return n

    # -- decisions --------------------------------------------------------------------------------------

    def _append(self, kind: str, pid: int, epoch: int, txn: int) -> None:
        self._append_payload(msgpack.packb([kind, pid, epoch, txn]))

    def _append_payload(self, payload: bytes) -> None:
        self._refresh()
        record = journal.encode(payload)
        fd = fs.FS.open(self._decisions_path, os.O_RDWR | os.O_CREAT)
        try:
            ino = os.fstat(fd).st_ino
            valid = self._read[1] if self._read[0] == ino else 0
            if fs.FS.size(fd) > valid:
                fs.FS.ftruncate(fd, valid)  # a torn record of a crashed append: never acknowledged
            fs.FS.pwrite(fd, record, valid)
            fs.FS.fsync(fd)
        finally:
            fs.FS.close(fd)
        if valid == 0:
            fs.FS.fsync_dir(self.directory)
        self._note_payload(payload)
        self._read = (ino, valid + len(record))
