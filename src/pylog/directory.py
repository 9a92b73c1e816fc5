"""LogDirectory: a root directory holding topics, their manifest, and the locks shared by every process using it.

The storage half of :class:`pylog.Log` (the facade in :mod:`pylog.log` adds the clients: producers, consumers,
group administration). Clients are handed a ``LogDirectory``, never the facade.

Root directory layout::

    <root>/
        manifest          topics, their configs and unfinished topic changes (format below), replaced atomically
        .lock             every open Log holds a shared flock; the first opener and last closer take it
                          exclusively (that is how a process knows it is alone). Its first 24 bytes are the
                          session header (below), changed only under .open.lock
        .open.lock        serializes open, close and manifest changes between processes
        .clean-shutdown   written by the last closer after flushing everything; removed by the next opener
        <topic>-<n>/      one directory per partition (see pylog.partition.files)
        __groups/         consumer groups (pylog.groups.store)
        __transactions/   producer ids and transaction decisions (pylog.transactions)

Manifest, written temp -> fsync -> rename -> fsync dir::

    line 1   b"pylog-manifest 1 <crc32c of the rest, 8 hex digits>\\n"
    rest     JSON {"topics": {name: {"partitions": n, "config": {...}}},
                   "creating": {name: n}, "deleting": {name: n}}

Session header in ``.lock`` (three little-endian int64; shared memory between processes, not durable)::

    offset  field      meaning
    0       opens      Log objects open on the directory (each open adds one, each close takes one away)
    8       session    random id chosen by the first opener; partitions validated in this session carry it
    16      clean      1 if the session started from a clean shutdown
    24      checked    mtime (ns) of the root when its entries were last found to be pylog's own (0: unknown)

Opening after a clean shutdown touches no partition: each partition is validated by the first process that
uses it in the session (:class:`~pylog.partition.log.PartitionLog` compares the id in its state file). After an
unclean shutdown the first opener recovers every partition before anyone uses the log. Closing costs what was
written: every process fsyncs the partitions it wrote when it closes, so the last closer only writes the marker,
unless a process died with the log open (``opens`` did not drop to zero): then it trims and fsyncs every
partition used in the session first.

What pylog deletes: only what it can prove it created. A directory is initialised only if it is new, empty or
holds nothing but pylog's own entries; anything else is refused (:class:`~pylog.errors.NotALogDirectoryError`).
Topic creation records the topic under ``creating`` in the manifest before it makes the partition directories
(and refuses to start if one exists already); deletion moves the topic from ``topics`` to ``deleting`` before it
removes them. An interrupted creation is rolled back, an interrupted deletion finished, from those entries only.
Unknown entries of a log directory are kept, with an :class:`~pylog.errors.UnknownEntryWarning`.

Thread-safety: thread-safe. Crash contract: the manifest is the commit point of every topic change; partition
directories named by ``creating`` or ``deleting`` are the only ones pylog ever removes.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import os
import random
import re
import secrets
import stat
import struct
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

from pylog import fs
from pylog.clock import Clock, SystemClock
from pylog.config import TopicConfig
from pylog.errors import (
    ConfigError,
    CorruptRecordError,
    DeliveryError,
    DiskFullError,
    ForkedProcessError,
    InvalidTopicError,
    LockError,
    LogClosedError,
    NotALogDirectoryError,
    PermissionDeniedError,
    ReadOnlyLogError,
    StorageError,
    TopicExistsError,
    UnknownEntryWarning,
    UnknownTopicError,
)
from pylog.framing import frame, unframe
from pylog.partition import files
from pylog.partition.cleaner import mark_compacted
from pylog.partition.log import HandleBudget, PartitionLog, RecoveryReport
from pylog.partition.recovery import repair_partition
from pylog.partition.remote import RemoteSegments
from pylog.partition.segment import MapCache
from pylog.partition.state import mark_deleted
from pylog.topic import Topic, TopicEnv
from pylog.transactions import TxnDecisions, TxnLog

__all__ = [
    "FORK_GENERATION",
    "LogDirectory",
    "abandon_logs",
    "check_access",
    "decode_manifest",
    "repair",
    "validate_topic_name",
]

_TOPIC_RE = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_MANIFEST = "manifest"
_MANIFEST_CHECK_MS = 1000  # how often Log.topic() looks for topic changes made by other processes
_MAGIC = b"pylog-manifest"
_FORMAT = 1
FORK_GENERATION = [0]
_MARKER = ".clean-shutdown"
_HEADER = struct.Struct("<qqqq")  # the session header in .lock: opens, session, clean, checked mtime
# Entries of a log root that pylog creates (partition directories aside); temp files are atomic_write's.
_OWN_FILES = frozenset({_MANIFEST, ".lock", ".open.lock", _MARKER, _MANIFEST + ".tmp", _MARKER + ".tmp"})
# tiered storage: the remote_storage URL the log was last opened with (owner: pylog/tiered/location.py)
_OWN_FILES |= {"remote_storage", "remote_storage.tmp"}
# tiered storage: deleted topics whose remote data is still to be deleted (owner: pylog/tiered/retention.py)
_OWN_FILES |= {"remote_deletions", "remote_deletions.tmp"}
_OWN_DIRS = frozenset({"__groups", "__transactions"})
# the broker's users and ACLs (owner: pylog/broker/securefile.py)
_OWN_DIRS |= {"__security"}
_OPEN_LOGS: weakref.WeakSet[LogDirectory] = weakref.WeakSet()


class Closeable(Protocol):
    def close(self, timeout: float | None = None) -> None: ...


P = TypeVar("P", bound=Closeable)
#: tiered storage: ``(topic, partition, config) -> `` the partition's remote segments, or None (not tiered)
RemoteFactory = Callable[[str, int, TopicConfig], RemoteSegments | None]


def _after_fork() -> None:
    FORK_GENERATION[0] += 1


os.register_at_fork(after_in_child=_after_fork)


def validate_topic_name(name: object) -> str:
    """Kafka's rule: 1-249 characters of ``[a-zA-Z0-9._-]``, not ``.`` or ``..``."""
    if not isinstance(name, str) or not _TOPIC_RE.match(name) or name in (".", ".."):
        raise InvalidTopicError(
            f"invalid topic name {name!r}: use 1-249 characters of [a-zA-Z0-9._-], not '.' or '..'"
        )
    return name


class LogDirectory:
    """An open log directory: topics, partitions, sessions and the transaction log. :class:`pylog.Log` (what
    :func:`pylog.open` returns) is this plus the clients. A context manager; thread-safe.

    ``max_open_partitions`` and ``max_open_maps`` bound the file descriptors this object keeps open (about
    three per open partition plus one per mapped segment), however many partitions and segments exist."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        max_open_maps: int = 256,
        max_open_partitions: int = 200,
        read_only: bool = False,
        remote_segments: RemoteFactory | None = None,
        remote_manifest: dict[str, Any] | None = None,
        **defaults: Any,
    ) -> None:
        # tiered storage: the source of each tiered partition's remote segments; with ``remote_manifest``
        # (the topics found in the object store) the log has no local directory and ``path`` is its URL
        self.remote_segments = remote_segments
        self._standalone = remote_manifest is not None
        self.path = os.fspath(path) if self._standalone else os.path.abspath(os.fspath(path))
        #: where consumer groups keep their files (``<groups_root>/__groups/``, :mod:`pylog.groups.store`):
        #: the log directory itself; None for a log read from an object store, unless the facade sets the
        #: local directory its groups use (``groups_dir``, :mod:`pylog.groups.replica`)
        self.groups_root: str | None = None if self._standalone else self.path
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.defaults = TopicConfig.from_dict(defaults)
        self.map_cache = MapCache(max_open_maps)
        self.handles = HandleBudget(max_open_partitions)
        self._lock = threading.RLock()
        self._topics: dict[str, Topic] = {}
        self._manifest: dict[str, Any] = {"topics": {}}
        self._manifest_stamp: tuple[int, int] | None = None
        # the manifest's config dict each open topic was last checked against (see _refresh_manifest)
        self._topic_configs: dict[str, dict[str, Any]] = {}
        self._closed = False
        self._fork_generation = FORK_GENERATION[0]
        self.recovery: dict[str, RecoveryReport] = {}
        self._txn_log: TxnLog | None = None
        self._txn_reader: TxnDecisions | None = None  # read_committed reads of a read-only directory
        self._next_manifest_check = 0.0
        self._producers: weakref.WeakSet[Closeable] = weakref.WeakSet()
        self.session = 0
        self.clean_start = True
        self._checked_mtime = 0
        if remote_manifest is not None:
            self.read_only = True
            self._manifest = _copy(remote_manifest)
            self._open_lock_fd = self._shared_fd = -1
            _OPEN_LOGS.add(self)
            return
        check_access(self.path, "read")
        self.read_only = read_only or _not_writable(self.path)
        if self.read_only:
            self._open_read_only()
            return
        _prepare_directory(self.path)
        try:
            self._open_lock_fd = fs.FS.open(os.path.join(self.path, ".open.lock"), os.O_RDWR | os.O_CREAT)
        except StorageError as exc:
            if exc.errno not in _READ_ONLY_ERRNOS:
                raise
            self.read_only = True  # a read-only file system, or a directory this user cannot write
            self._open_read_only()
            return
        try:
            self._shared_fd = fs.FS.open(os.path.join(self.path, ".lock"), os.O_RDWR | os.O_CREAT)
        except BaseException:
            fs.FS.close(self._open_lock_fd)
            raise
        try:
            with self._open_guard():
                self._first = _try_flock(self._shared_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._init_manifest()
                self._load_manifest()
                if self._first:
                    self._start_session()
                else:
                    self._join_session()
                fcntl.flock(self._shared_fd, fcntl.LOCK_SH)
        except BaseException:
            fs.FS.close(self._open_lock_fd)
            fs.FS.close(self._shared_fd)
            raise
        _OPEN_LOGS.add(self)

    def _open_read_only(self) -> None:
        """Open without writing anything: no locks, no recovery, no session. Each partition is read as its
        files hold it when first used (see :class:`~pylog.partition.log.PartitionLog`)."""
        if not os.path.isdir(self.path) or not os.path.exists(self._manifest_path()):
            raise NotALogDirectoryError(
                f"{self.path} is not a pylog log directory (no manifest), and it is opened read-only",
                path=self.path,
            )
        self._load_manifest()
        self._open_lock_fd = self._shared_fd = -1
        _OPEN_LOGS.add(self)

    def _check_writable(self, what: str) -> None:
        self._check()
        if self.read_only:
            raise ReadOnlyLogError(
                f"cannot {what}: the log at {self.path} is open read-only (its directory cannot be written, or "
                "read_only=True was given); reads work"
            )

    # -- locks and lifecycle ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _open_guard(self) -> Iterator[None]:
        fcntl.flock(self._open_lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._open_lock_fd, fcntl.LOCK_UN)

    def _check(self) -> None:
        if self._fork_generation != FORK_GENERATION[0]:
            raise ForkedProcessError(
                f"this Log ({self.path}) was opened before fork(); open it again in the child process"
            )
        if self._closed:
            raise LogClosedError(f"the log at {self.path} is closed")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r}, topics={sorted(self._manifest['topics'])})"

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, timeout: float | None = None) -> None:
        """Close the producers this log created (each flushes first: records they accepted are written), then
        flush and close every partition. The last process to close writes the clean-shutdown marker.

        Raises :class:`~pylog.errors.DeliveryError` (after closing everything) if records a producer accepted
        could not be written and nobody looked at their futures, and
        :class:`~pylog.errors.KafkaTimeoutError` if the producers' flushes took longer than ``timeout`` s in
        all (their records still queued then fail with :class:`~pylog.errors.LogClosedError`)."""
        with self._lock:
            if self._closed:
                return
            if self._fork_generation != FORK_GENERATION[0]:
                self._closed = True
                return
            failures = self._close_producers(timeout)
            self._closed = True
            if self.read_only:
                for topic in self._topics.values():
                    topic.close(flush=False)
                _OPEN_LOGS.discard(self)
                return
            try:
                with self._open_guard():
                    for topic in self._topics.values():
                        topic.close()
                    opens = self._leave_session()
                    fcntl.flock(self._shared_fd, fcntl.LOCK_UN)
                    if _try_flock(self._shared_fd, fcntl.LOCK_EX | fcntl.LOCK_NB):
                        self._last_close(opens)
                    fcntl.flock(self._shared_fd, fcntl.LOCK_UN)
            finally:
                _OPEN_LOGS.discard(self)
                if self._txn_log is not None:
                    self._txn_log.close()
                fs.FS.close(self._shared_fd)
                fs.FS.close(self._open_lock_fd)
        if failures:
            raise _merge_failures(failures)

    def _close_producers(self, timeout: float | None = None) -> list[Exception]:
        failures: list[Exception] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        for producer in list(self._producers):
            try:
                producer.close(None if deadline is None else max(deadline - time.monotonic(), 0.0))
            except Exception as exc:  # raised once everything is closed
                failures.append(exc)
        return failures

    def register_producer(self, producer: P) -> P:
        """Have :meth:`close` close ``producer`` first (it flushes: the records it accepted are written)."""
        self._producers.add(producer)
        return producer

    def check_open(self) -> None:
        """Raise :class:`~pylog.errors.LogClosedError` when closed, :class:`~pylog.errors.ForkedProcessError`
        in a child process of the one that opened it."""
        self._check()

    def check_writable(self, what: str) -> None:
        """Also raise :class:`~pylog.errors.ReadOnlyLogError` when the log is read-only (``what`` names the
        refused action)."""
        self._check_writable(what)

    @property
    def fork_generation(self) -> int:
        """The process generation this object was opened in (it changes in a child after ``fork()``)."""
        return self._fork_generation

    @property
    def open_topics(self) -> Mapping[str, Topic]:
        """The topics this object has open, by name: a live view (no manifest check; :meth:`topic` opens the
        others)."""
        return self._topics

    # -- sessions ---------------------------------------------------------------------------------------

    def _read_header(self) -> tuple[int, int, int, int]:
        raw = fs.FS.pread(self._shared_fd, _HEADER.size, 0)
        if len(raw) < _HEADER.size:
            return 0, 0, 1, 0
        opens, session, clean, checked = _HEADER.unpack(raw)
        return int(opens), int(session), int(clean), int(checked)

    def _write_header(self, opens: int) -> None:
        header = _HEADER.pack(opens, self.session, int(self.clean_start), self._checked_mtime)
        fs.FS.pwrite(self._shared_fd, header, 0)

    def _start_session(self) -> None:
        """Alone with the directory: settle unfinished topic changes, then either trust a clean shutdown
        (touching no partition) or recover every partition."""
        marker = os.path.join(self.path, _MARKER)
        self.clean_start = os.path.exists(marker)
        self.session = random.SystemRandom().randrange(1, 1 << 62)
        self._checked_mtime = self._read_header()[3]
        for temp in (_MANIFEST + ".tmp", _MARKER + ".tmp"):  # atomic_write's, never renamed: ours
            if os.path.isfile(os.path.join(self.path, temp)):
                fs.FS.unlink(os.path.join(self.path, temp))
        self._settle_topic_changes()
        self._check_entries()
        if self.clean_start:
            # first, durably: from here on the files may change, and the next opener must not trust them
            fs.FS.unlink(marker)
            fs.FS.fsync_dir(self.path)
        else:
            self._recover_all()
        self._checked_mtime = _mtime(self.path)  # the entries as checked (the marker is gone)
        self._write_header(1)

    def _join_session(self) -> None:
        opens, self.session, clean, self._checked_mtime = self._read_header()
        self.clean_start = bool(clean)
        if not self.session:  # a directory last opened by a pylog without session headers
            self.session = random.SystemRandom().randrange(1, 1 << 62)
        self._write_header(max(opens, 0) + 1)

    def _leave_session(self) -> int:
        opens, _, _, self._checked_mtime = self._read_header()
        opens = max(opens - 1, 0)
        self._write_header(opens)
        return opens

    def _last_close(self, opens: int) -> None:
        """Alone with the directory. Every process that closed fsynced what it wrote; if one died with the log
        open (``opens`` > 0), trim the unpublished tails it may have left and fsync every partition used in
        this session first. Then mark the shutdown clean."""
        if opens > 0:
            for name, meta in self._manifest["topics"].items():
                config = TopicConfig.from_dict(meta["config"])
                for p in range(meta["partitions"]):
                    self._settle_partition(files.partition_dir(self.path, name, p), name, p, config)
        unchanged = self._checked_mtime == _mtime(self.path)  # no entry added or removed in the session
        try:
            fs.atomic_write(os.path.join(self.path, _MARKER), b"clean\n")
        except DiskFullError:
            # no room for the marker (everything else is durable): the next opener recovers the log, as after
            # a crash, which is safe and writes nothing it cannot defer
            with contextlib.suppress(FileNotFoundError):
                fs.FS.unlink(os.path.join(self.path, _MARKER + ".tmp"))
            self._checked_mtime = 0
            self._write_header(0)
            return
        self._checked_mtime = _mtime(self.path) if unchanged else 0
        self._write_header(0)

    def _settle_partition(self, directory: str, name: str, p: int, config: TopicConfig) -> None:
        if not os.path.exists(os.path.join(directory, files.STATE)):
            return  # never used: nothing to settle
        plog = PartitionLog(directory, name, p, config, self.clock, self.map_cache, session=self.session)
        try:
            plog.trim_unpublished_tail()
            plog.flush()
            plog.checkpoint.write(plog.log_end_offset, sync=True)
        finally:
            plog.close(flush=False)

    def _recover_all(self) -> None:
        for name, meta in self._manifest["topics"].items():
            config = TopicConfig.from_dict(meta["config"])
            for p in range(meta["partitions"]):
                directory = files.partition_dir(self.path, name, p)
                fs.makedirs(directory)
                if not fs.FS.listdir(directory):
                    continue  # never used: nothing to recover (its files appear on first use)
                plog = PartitionLog(
                    directory,
                    name,
                    p,
                    config,
                    self.clock,
                    self.map_cache,
                    recover=True,
                    clean_shutdown=False,
                    session=self.session,
                )
                self.recovery[files.partition_dir_name(name, p)] = plog.report
                plog.close(flush=False)

    def _check_entries(self) -> None:
        """Warn about (and keep) entries of the root that pylog did not create. Skipped when the root has not
        changed since the last session checked it (its mtime, kept in the session header)."""
        if self.clean_start and self._checked_mtime and self._checked_mtime == _mtime(self.path):
            return
        expected = {
            files.partition_dir_name(name, p)
            for name, meta in self._manifest["topics"].items()
            for p in range(meta["partitions"])
        }
        unknown = set(fs.FS.listdir(self.path)).difference(expected, _OWN_FILES, _OWN_DIRS)
        if unknown:
            shown = ", ".join(sorted(unknown)[:10]) + (", ..." if len(unknown) > 10 else "")
            warnings.warn(
                f"{self.path} holds {_entries(len(unknown))} pylog did not create ({shown}); they are kept "
                "untouched: move them out of the log directory",
                UnknownEntryWarning,
                stacklevel=4,
            )

    # -- manifest ---------------------------------------------------------------------------------------

    def _manifest_path(self) -> str:
        return os.path.join(self.path, _MANIFEST)

    def _init_manifest(self) -> None:
        """Write an empty manifest into a directory that has none (``_prepare_directory`` checked it holds
        nothing but pylog's own entries). From then on the directory is a pylog log."""
        if not os.path.exists(self._manifest_path()):
            self._write_manifest({"topics": {}})

    def _load_manifest(self) -> None:
        if self._standalone:
            return  # the topics found in the object store when it was opened
        path = self._manifest_path()
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._manifest = {"topics": {}}
            self._manifest_stamp = None
            return
        stamp = (st.st_ino, st.st_mtime_ns)
        if stamp == self._manifest_stamp:
            return
        raw = fs.FS.read_file(path)
        self._manifest = decode_manifest(raw, path)
        self._manifest_stamp = stamp

    def _write_manifest(self, manifest: dict[str, Any]) -> None:
        fs.atomic_write(self._manifest_path(), _encode_manifest(manifest))
        self._manifest = manifest
        st = os.stat(self._manifest_path())
        self._manifest_stamp = (st.st_ino, st.st_mtime_ns)

    def _refresh_manifest(self) -> None:
        self._load_manifest()
        for name in list(self._topics):
            meta = self._manifest["topics"].get(name)
            if meta is None or meta.get("id") != self._topics[name].topic_id:
                # deleted by another process (and maybe created again: another topic of the same name): the
                # files this object has open are gone
                self._topics.pop(name).close(flush=False)
                continue
            if meta["partitions"] != self._topics[name].num_partitions:
                self._topics[name].grow(meta["partitions"])
            seen = meta["config"]  # a new dict each time the manifest is read: compared once per read
            if self._topic_configs.get(name) is not seen:
                self._topic_configs[name] = seen
                if seen != self._topics[name].config.to_dict():
                    # altered by another process: its retention, cleanup policy and limits apply here too
                    # (Kafka applies a topic's new config on every broker)
                    self._topics[name].set_config(TopicConfig.from_dict(seen))

    # -- topics -----------------------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1, **config: Any) -> Topic:
        """Create a topic with ``partitions`` partitions and Kafka-named config overrides."""
        self._check_writable("create a topic")
        validate_topic_name(name)
        if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= 100_000:
            raise ConfigError(f"partitions must be an int in [1, 100000], got {partitions!r}")
        cfg = self.defaults.replace(**config)
        with self._lock, self._open_guard():
            self._load_manifest()
            self._settle_topic_changes()
            if name in self._manifest["topics"]:
                raise TopicExistsError(f"topic {name!r} already exists")
            self._make_partition_dirs(name, 0, partitions)
            manifest = _copy(self._manifest)
            manifest["topics"][name] = {
                "partitions": partitions,
                "config": cfg.to_dict(),
                "id": secrets.token_hex(8),
            }
            manifest["creating"].pop(name, None)
            self._write_manifest(manifest)
        return self.topic(name)

    def _make_partition_dirs(self, name: str, first: int, end: int) -> None:
        """Create the (empty) directories of partitions ``first..end-1`` of ``name``, recorded under
        ``creating`` in the manifest first, so that an interrupted creation can be rolled back without
        guessing. A partition's files are created when it is first used. Refuses, creating nothing, if one of
        the directories exists: pylog does not adopt or replace what it did not create."""
        dirs = [files.partition_dir(self.path, name, p) for p in range(first, end)]
        taken = [d for d in dirs if os.path.lexists(d)]
        if taken:
            raise NotALogDirectoryError(
                f"cannot create partitions {first}..{end - 1} of topic {name!r}: {taken[0]} exists and is not "
                f"part of the log{f' ({len(taken)} such entries)' if len(taken) > 1 else ''}; move it away",
                path=taken[0],
            )
        manifest = _copy(self._manifest)
        manifest["creating"][name] = [first, end]
        self._write_manifest(manifest)
        made = 0
        try:
            for d in dirs:
                fs.FS.mkdir(d)
                made += 1
        except BaseException:
            for d in dirs[:made]:
                fs.rmtree(d, ignore_errors=True)
            manifest = _copy(self._manifest)
            manifest["creating"].pop(name, None)
            self._write_manifest(manifest)
            raise
        fs.FS.fsync_dir(self.path)

    def _settle_topic_changes(self) -> None:
        """Roll back a topic creation and finish a deletion that a crash interrupted (open guard held). Only
        the partition directories the manifest names under ``creating``/``deleting`` are removed."""
        creating = self._manifest.get("creating", {})
        deleting = self._manifest.get("deleting", {})
        if not creating and not deleting:
            return
        for name, (first, end) in creating.items():
            known = self._manifest["topics"].get(name, {}).get("partitions", 0)
            for p in range(max(first, known), end):
                fs.rmtree(files.partition_dir(self.path, name, p), ignore_errors=True)
        for name, count in deleting.items():
            for p in range(count):
                directory = files.partition_dir(self.path, name, p)
                # appenders in other processes refuse from here on (see pylog.partition.state); the marked
                # state file goes last, so that a process reopening it meanwhile sees the marker
                with contextlib.suppress(OSError):
                    mark_deleted(os.path.join(directory, files.STATE))
                fs.rmtree(directory, ignore_errors=True, last=files.STATE)
        fs.FS.fsync_dir(self.path)
        manifest = _copy(self._manifest)
        manifest["creating"], manifest["deleting"] = {}, {}
        self._write_manifest(manifest)

    def create_partitions(self, name: str, total: int) -> Topic:
        """Grow ``name`` to ``total`` partitions (like ``kafka-topics --alter --partitions``). Existing records
        stay where they are; keyed records may map to other partitions from now on."""
        self._check_writable("add partitions")
        with self._lock, self._open_guard():
            self._load_manifest()
            self._settle_topic_changes()
            meta = self._manifest["topics"].get(name)
            if meta is None:
                raise UnknownTopicError(f"unknown topic {name!r}")
            current = meta["partitions"]
            if isinstance(total, bool) or not isinstance(total, int) or not current < total <= 100_000:
                raise ConfigError(
                    f"total must be an int in ({current}, 100000] for topic {name!r}, got {total!r}"
                )
            self._make_partition_dirs(name, current, total)
            manifest = _copy(self._manifest)
            manifest["topics"][name]["partitions"] = total
            manifest["creating"].pop(name, None)
            self._write_manifest(manifest)
            self._refresh_manifest()
        return self.topic(name)

    def alter_topic(self, name: str, **config: Any) -> Topic:
        """Change topic configs (for example ``retention_ms``); takes effect at once in this process, and in
        another one that has the log open when it next looks at the manifest: in :meth:`topics`,
        :meth:`apply_retention` and :meth:`topic` (there at most once a second). Invalid values raise :class:`ConfigError` and change nothing, as
        does turning ``remote_storage_enable`` off (the records in remote storage would be lost to readers)."""
        self._check_writable("change a topic")
        with self._lock, self._open_guard():
            self._load_manifest()
            meta = self._manifest["topics"].get(name)
            if meta is None:
                raise UnknownTopicError(f"unknown topic {name!r}")
            old = TopicConfig.from_dict(meta["config"])
            cfg = old.replace(**config)
            if old.remote_storage_enable and not cfg.remote_storage_enable:
                # the records tiered to the object store would be read no more (their local copies may be
                # gone) and no retention would reach them again; Kafka refuses it too
                raise ConfigError(
                    f"remote_storage_enable cannot be turned off for topic {name!r}: its records in remote "
                    "storage would become unreadable; delete the topic to drop them"
                )
            if cfg.remote_storage_enable and not old.remote_storage_enable:
                self._check_tierable(name, meta["partitions"])
            if old.compacted and not cfg.compacted:
                # compaction's gaps stay in the cleaned segments: mark them before the manifest forgets
                for p in range(meta["partitions"]):
                    directory = files.partition_dir(self.path, name, p)
                    if os.path.isdir(directory):
                        mark_compacted(directory)
            manifest = _copy(self._manifest)
            manifest["topics"][name]["config"] = cfg.to_dict()
            self._write_manifest(manifest)
            topic = self._topics.get(name)
            if topic is not None:
                topic.set_config(cfg)
        return self.topic(name)

    def _check_tierable(self, name: str, partitions: int) -> None:
        """Raise :class:`ConfigError` when a partition of topic ``name`` was compacted: tiered storage reads
        and restores its segments with offsets that follow each other, which compaction's gaps break (Kafka
        does not tier compacted topics either)."""
        for p in range(partitions):
            if files.offsets_may_skip(files.partition_dir(self.path, name, p), False):
                raise ConfigError(
                    f"remote_storage_enable cannot be turned on for topic {name!r}: partition {p} was "
                    "compacted, and tiered storage needs offsets without gaps"
                )

    def topic(self, name: str) -> Topic:
        """The open :class:`Topic` ``name``; raises :class:`UnknownTopicError` if it does not exist."""
        self._check()
        if type(name) is not str:
            validate_topic_name(name)  # raises InvalidTopicError
        with self._lock:
            topic = self._topics.get(name)
            if topic is not None:
                now = self.clock.monotonic_ms()
                if now < self._next_manifest_check:
                    return topic
                # another process may have added partitions or deleted the topic (Kafka's clients refresh
                # their metadata periodically too)
                self._next_manifest_check = now + _MANIFEST_CHECK_MS
            self._refresh_manifest()
            topic = self._topics.get(name)
            if topic is not None:
                return topic
            meta = self._manifest["topics"].get(name)
            if meta is None:
                validate_topic_name(name)
                raise UnknownTopicError(f"unknown topic {name!r}")
            config = TopicConfig.from_dict(meta["config"])
            topic = Topic(self._topic_env(), name, meta["partitions"], config, meta.get("id"))
            self._topics[name] = topic
            return topic

    def _topic_env(self) -> TopicEnv:
        return TopicEnv(
            path=self.path,
            clock=self.clock,
            map_cache=self.map_cache,
            handles=self.handles,
            session=self.session,
            clean_start=self.clean_start,
            read_only=self.read_only,
            recovery=self.recovery,
            txn_decisions=self.txn_decisions,
            remote=self.remote_segments,
        )

    def topics(self) -> list[str]:
        """Names of all topics, sorted."""
        self._check()
        with self._lock:
            self._refresh_manifest()
            return sorted(self._manifest["topics"])

    def has_topic(self, name: str) -> bool:
        return name in self.topics()

    def delete_topic(self, name: str) -> None:
        """Delete a topic and all its data."""
        self._check_writable("delete a topic")
        with self._lock, self._open_guard():
            self._load_manifest()
            self._settle_topic_changes()
            meta = self._manifest["topics"].get(name)
            if meta is None:
                raise UnknownTopicError(f"unknown topic {name!r}")
            manifest = _copy(self._manifest)
            del manifest["topics"][name]
            manifest["deleting"][name] = meta["partitions"]
            try:
                self._write_manifest(manifest)  # the commit point: from here on the topic is gone
            except DiskFullError:
                # a full disk: make room for the manifest from the topic's index files (hints, rebuilt from
                # the log when missing), the only files of it that may go before the commit point
                self._drop_indexes(name, meta["partitions"])
                self._write_manifest(manifest)
            topic = self._topics.pop(name, None)
            if topic is not None:
                topic.close(flush=False)
            self._settle_topic_changes()

    def _drop_indexes(self, name: str, partitions: int) -> None:
        """Delete the index files of topic ``name`` (and the manifest's temp file a failed write left)."""
        with contextlib.suppress(FileNotFoundError):
            fs.FS.unlink(self._manifest_path() + ".tmp")
        for p in range(partitions):
            directory = files.partition_dir(self.path, name, p)
            try:
                entries = fs.FS.listdir(directory)
            except FileNotFoundError:
                continue
            for entry in entries:
                parsed = files.parse_segment_name(entry)
                if parsed is not None and parsed[1] in (files.INDEX, files.TIMEINDEX):
                    with contextlib.suppress(FileNotFoundError):
                        fs.FS.unlink(os.path.join(directory, entry))

    def transactions(self) -> TxnLog:
        """The :class:`~pylog.transactions.TxnLog` of this directory (producer ids, transaction decisions)."""
        self._check_writable("use transactions (read_committed reads and transactional producers need them)")
        with self._lock:
            if self._txn_log is None:
                self._txn_log = TxnLog(self.path)
            return self._txn_log

    def txn_decisions(self) -> TxnDecisions:
        """What ``read_committed`` readers ask for transaction outcomes: this directory's
        :meth:`transactions` (which also aborts the transactions past their timeout). A read-only directory
        answers from ``decisions.log`` without writing (:class:`~pylog.transactions.TxnDecisions`: a
        transaction past its timeout stays open, and readers stop before it, until a writer aborts it). A log
        read from an object store (:class:`pylog.Log` opened by URL) answers from the store's copy of the
        decisions."""
        if not self.read_only:
            return self.transactions()
        with self._lock:
            if self._txn_reader is None:
                self._txn_reader = TxnDecisions(self.path)
            return self._txn_reader

    # -- maintenance ------------------------------------------------------------------------------------

    def apply_retention(self) -> dict[str, int]:
        """Run retention on every partition now; returns segments deleted per topic."""
        self._check_writable("apply retention")
        return {name: self.topic(name).apply_retention() for name in self.topics()}

    def verify(self) -> dict[str, list[str]]:
        """Check every batch and index of every partition without changing anything.

        Returns ``{"topic-partition": [problem, ...]}`` with an entry only for partitions that have problems."""
        report: dict[str, list[str]] = {}
        for name in self.topics():
            topic = self.topic(name)
            for p in range(topic.num_partitions):
                problems = topic.partition(p).verify()
                if problems:
                    report[files.partition_dir_name(name, p)] = problems
        return report

    def flush(self) -> None:
        """fsync every partition opened by this process."""
        for topic in list(self._topics.values()):
            topic.flush()


def _encode_manifest(manifest: dict[str, Any]) -> bytes:
    body = json.dumps(manifest, sort_keys=True, indent=1).encode()
    return frame(_MAGIC, _FORMAT, body)


def decode_manifest(raw: bytes, path: str) -> dict[str, Any]:
    try:
        body = unframe(raw, _MAGIC, _FORMAT, f"pylog manifest {path}")
    except ValueError as exc:
        raise CorruptRecordError(f"{path}: {exc}", path=path) from None
    try:
        manifest = json.loads(body)
        for meta in manifest["topics"].values():
            TopicConfig.from_dict(meta["config"])
            if not isinstance(meta["partitions"], int) or meta["partitions"] < 1:
                raise ValueError("bad partition count")
        manifest.setdefault("creating", {})
        manifest.setdefault("deleting", {})
        for first, end in manifest["creating"].values():
            if not isinstance(first, int) or not isinstance(end, int) or not 0 <= first < end:
                raise ValueError("bad partition range being created")
        for count in manifest["deleting"].values():
            if not isinstance(count, int) or count < 1:
                raise ValueError("bad partition count being deleted")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptRecordError(f"{path}: manifest is not valid: {exc}", path=path) from exc
    return dict(manifest)


_READ_ONLY_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


def check_access(path: str, needed: str) -> None:
    """Raise :class:`~pylog.errors.PermissionDeniedError` when ``path`` is a directory this process cannot
    ``needed`` ("read": read and search it; "write": create and remove its entries). Nothing else."""
    mode = os.R_OK | os.X_OK if needed == "read" else os.W_OK | os.X_OK
    effective = os.access in os.supports_effective_ids
    if not os.path.isdir(path) or os.access(path, mode, effective_ids=effective):
        return
    if needed == "read":
        what = "cannot read the log directory"
        why = "it needs read and search (r-x) permission on it"
    else:
        what = "cannot change the log directory"
        why = "it needs write (w) permission on it and on its files"
    raise PermissionDeniedError(
        f"permission denied: {what} {path}: {_who(path)}; {why}", path=path, needed=needed
    )


def _who(path: str) -> str:
    """This process's user, and the owner and mode of ``path``."""
    try:
        st = os.stat(path)
        owner = f"owned by uid {st.st_uid} with mode {stat.filemode(st.st_mode)}"
    except OSError:
        owner = "its owner and mode unknown"
    return f"this process runs as uid {os.geteuid()}, the directory is {owner}"


def _not_writable(path: str) -> bool:
    """An existing directory this process cannot write (a read-only mount, another user's snapshot)."""
    return os.path.isdir(path) and not os.access(path, os.W_OK)


def _mtime(path: str) -> int:
    return os.stat(path).st_mtime_ns


def _copy(manifest: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(manifest))
    out.setdefault("creating", {})
    out.setdefault("deleting", {})
    return out


def _prepare_directory(path: str) -> None:
    """Create ``path`` if it does not exist; refuse a file, and a non-empty directory that is not a log."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise NotALogDirectoryError(f"{path} exists and is not a directory", path=path)
    if not os.path.exists(path):
        fs.makedirs(path)
        return
    if os.path.exists(os.path.join(path, _MANIFEST)):
        return
    foreign = sorted(e for e in fs.FS.listdir(path) if e not in _OWN_FILES and e not in _OWN_DIRS)
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise NotALogDirectoryError(
            f"{path} is not a pylog log directory (it has no manifest) and is not empty: it holds "
            f"{_entries(len(foreign), 'other ')} ({shown}). Open an empty or new directory, or an existing log; "
            "if this is a log whose manifest was lost, `pylog repair` rebuilds it",
            path=path,
        )


def _entries(n: int, kind: str = "") -> str:
    return f"1 {kind}entry" if n == 1 else f"{n} {kind}entries"


def _merge_failures(failures: list[Exception]) -> Exception:
    if len(failures) == 1 or not all(isinstance(f, DeliveryError) for f in failures):
        return failures[0]
    delivery = [f for f in failures if isinstance(f, DeliveryError)]
    count = sum(f.count for f in delivery)
    errors = [e for f in delivery for e in f.errors]
    merged = DeliveryError(
        f"{count} records accepted by send() were not written: " + "; ".join(str(f) for f in failures),
        count=count,
        errors=errors,
    )
    merged.__cause__ = failures[0]
    return merged


#: how long an interpreter exit waits, in all, for the producers of open logs to write what they hold
EXIT_FLUSH_TIMEOUT_S = 30.0


def _close_at_exit() -> None:
    """At interpreter exit, close the logs still open: their producers flush first (as kafka-python's
    producers do at exit), within :data:`EXIT_FLUSH_TIMEOUT_S` in all, and the shutdown is clean. A failure
    (records that could not be written, or not within the bound) is printed: there is no caller left."""
    deadline = time.monotonic() + EXIT_FLUSH_TIMEOUT_S
    for log in list(_OPEN_LOGS):
        try:
            log.close(timeout=max(deadline - time.monotonic(), 0.0))
        except Exception as exc:
            print(f"pylog: closing {log.path} at exit failed: {type(exc).__name__}: {exc}", file=sys.stderr)


atexit.register(_close_at_exit)


def abandon_logs(paths: Collection[str]) -> list[str]:
    """End the open logs that hold a file at one of ``paths`` as the death of their process would: they are
    marked closed without a single file operation and are not closed at interpreter exit. Returns their paths.

    For fault injection only (:meth:`pylog.testing.FaultyFileSystem.kill`): a simulated crash closes the
    descriptors of ``paths`` under the logs that hold them, and the numbers go to the files opened next. A
    later ``close()`` of such a log, or the one at exit, would close those files instead of its own."""
    held = {os.path.abspath(p) for p in paths}
    dead = []
    for log in list(_OPEN_LOGS):
        if log.path and any(p.startswith(os.path.join(os.path.abspath(log.path), "")) for p in held):
            log._closed = True
            _OPEN_LOGS.discard(log)
            dead.append(log.path)
    return dead


def _try_flock(fd: int, flags: int) -> bool:
    try:
        fcntl.flock(fd, flags)
        return True
    except BlockingIOError:
        return False


def repair(path: str | os.PathLike[str]) -> dict[str, list[str]]:
    """Truncate every partition of the log at ``path`` at its first invalid batch and report what was dropped.

    This is the only operation that drops data below the durable point (for example a batch whose CRC fails
    after a disk error); run :meth:`Log.verify` first to see what it would touch. It needs the directory to
    itself: it raises :class:`LockError` while any process has the log open. A manifest that is missing or
    damaged is rebuilt from the partition directories, and what had to be assumed (partition counts, default
    configs) is reported under the key ``"manifest"``. Returns ``{"topic-partition": [what was done, ...]}``
    for the partitions it changed."""
    root = os.path.abspath(os.fspath(path))
    if not os.path.isdir(root):
        raise NotALogDirectoryError(f"{root} is not a directory", path=root)
    check_access(root, "read")
    check_access(root, "write")
    try:
        return _repair(root)
    except StorageError as exc:
        if exc.errno not in _READ_ONLY_ERRNOS:
            raise
        raise PermissionDeniedError(
            f"repair needs to write the files of the log directory {root}, and {exc}; {_who(root)}",
            path=root,
            needed="write",
        ) from exc


def _repair(root: str) -> dict[str, list[str]]:
    manifest_path = os.path.join(root, _MANIFEST)
    if not os.path.exists(manifest_path) and not any(_partition_dirs(root)):
        raise NotALogDirectoryError(
            f"{root} is not a pylog directory (no manifest, no partitions)", path=root
        )
    open_fd = fs.FS.open(os.path.join(root, ".open.lock"), os.O_RDWR | os.O_CREAT)
    shared_fd = fs.FS.open(os.path.join(root, ".lock"), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(open_fd, fcntl.LOCK_EX)
        if not _try_flock(shared_fd, fcntl.LOCK_EX | fcntl.LOCK_NB):
            raise LockError(f"{root} is open in another process; close it before repair()")
        out: dict[str, list[str]] = {}
        try:
            manifest = decode_manifest(fs.FS.read_file(manifest_path), root)
        except (FileNotFoundError, CorruptRecordError) as exc:
            manifest, notes = _rebuild_manifest(root, exc)
            out["manifest"] = notes
        for name, meta in sorted(manifest["topics"].items()):
            compacted = "compact" in meta["config"].get("cleanup_policy", "delete")
            for p in range(meta["partitions"]):
                directory = files.partition_dir(root, name, p)
                if os.path.isdir(directory) and os.listdir(directory):
                    actions = repair_partition(directory, compacted)
                    if actions:
                        out[files.partition_dir_name(name, p)] = actions
        marker = os.path.join(root, _MARKER)
        if out and os.path.exists(marker):
            fs.FS.unlink(marker)  # the next open revalidates and rebuilds the shared state
            fs.FS.fsync_dir(root)
        return out
    finally:
        fs.FS.close(shared_fd)
        fs.FS.close(open_fd)


def _partition_dirs(root: str) -> tuple[dict[str, set[int]], dict[str, set[int]]]:
    """Directories of ``root`` named like partitions (``<topic>-<n>``): those that hold pylog files and the
    empty ones, each as ``{topic: {partition, ...}}``. A topic never written to has only empty directories
    (partition files are created on first use)."""
    found: dict[str, set[int]] = {}
    empty: dict[str, set[int]] = {}
    for entry in fs.FS.listdir(root):
        parsed = files.parse_partition_dir_name(entry)
        full = os.path.join(root, entry)
        if parsed is None or not _TOPIC_RE.match(parsed[0]) or not os.path.isdir(full):
            continue
        names = os.listdir(full)
        if files.STATE in names or any(files.parse_segment_name(n) for n in names):
            found.setdefault(parsed[0], set()).add(parsed[1])
        elif not names:
            empty.setdefault(parsed[0], set()).add(parsed[1])
    return found, empty


def _rebuild_manifest(root: str, cause: BaseException) -> tuple[dict[str, Any], list[str]]:
    """A manifest for the partition directories found in ``root``, written atomically; returns it with the
    assumptions made.

    A name with a directory holding pylog files is a topic with partitions up to its highest directory. A
    name with only empty directories is a topic only when they are exactly ``<name>-0`` .. ``<name>-<n-1>``,
    as ``create_topic`` leaves a topic never written to; other empty directories are not adopted (and said
    so): nothing proves pylog made them."""
    notes = [
        f"the manifest could not be read ({type(cause).__name__}: {cause}); rebuilt from the directories"
    ]
    manifest: dict[str, Any] = {"topics": {}, "creating": {}, "deleting": {}}
    defaults = TopicConfig().to_dict()
    found, empty = _partition_dirs(root)
    for name, parts in sorted(empty.items()):
        if name in found:
            found[name] |= parts
        elif parts == set(range(len(parts))):
            found[name] = parts
        else:
            dirs = ", ".join(files.partition_dir_name(name, p) for p in sorted(parts))
            notes.append(
                f"empty directories {dirs} are not taken as a topic (not {name}-0 onwards, as pylog creates "
                "them); they are kept: remove them to create the topic again"
            )
    for name, parts in sorted(found.items()):
        count = max(parts) + 1
        missing = sorted(set(range(count)) - parts)
        for p in missing:
            fs.makedirs(files.partition_dir(root, name, p))
        manifest["topics"][name] = {"partitions": count, "config": defaults}
        note = f"topic {name!r}: {count} partitions (the highest directory found), default configs assumed"
        if missing:
            note += f"; partitions {missing} had no directory and were created empty"
        notes.append(note + " (change them with `pylog topics alter` if they differed)")
    fs.atomic_write(os.path.join(root, _MANIFEST), _encode_manifest(manifest))
    return manifest, notes
