"""Log: a root directory holding topics, their manifest, and the locks shared by every process using it.

Root directory layout::

    <root>/
        manifest          topics and their configs (format below), replaced atomically
        .lock             every open Log holds a shared flock; the first opener and last closer take it
                          exclusively (that is how a process knows it is alone)
        .open.lock        serializes open, close and manifest changes between processes
        .clean-shutdown   written by the last closer after flushing everything; removed by the next opener
        <topic>-<n>/      one directory per partition (see pylog.partition.files)

Manifest, written temp -> fsync -> rename -> fsync dir::

    line 1   b"pylog-manifest 1 <crc32c of the rest, 8 hex digits>\\n"
    rest     JSON {"topics": {name: {"partitions": n, "config": {...}}}}

Thread-safety: thread-safe. Crash contract: topic creation makes the partition directories durable before the
manifest names them (the manifest is the commit point); deletion removes the topic from the manifest first and
then renames its directories to ``*.deleted`` before removing them. A partition directory that the manifest
does not name is removed when the log is next opened alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from pylog import fs
from pylog.clock import Clock, SystemClock
from pylog.config import TopicConfig
from pylog.errors import (
    ConfigError,
    CorruptRecordError,
    ForkedProcessError,
    InvalidTopicError,
    LogClosedError,
    TopicExistsError,
    UnknownTopicError,
    UnsupportedFormatError,
)
from pylog.partition.log import HandleBudget, PartitionLog, RecoveryReport
from pylog.partition.segment import MapCache
from pylog.record import crc32c
from pylog.topic import Topic

__all__ = ["Log", "open_log", "repair", "validate_topic_name"]

_TOPIC_RE = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_MANIFEST = "manifest"
_MANIFEST_CHECK_MS = 1000  # how often Log.topic() looks for topic changes made by other processes
_MAGIC = b"pylog-manifest 1 "
_FORK_GENERATION = [0]


def _after_fork() -> None:
    _FORK_GENERATION[0] += 1


os.register_at_fork(after_in_child=_after_fork)


def validate_topic_name(name: object) -> str:
    """Kafka's rule: 1-249 characters of ``[a-zA-Z0-9._-]``, not ``.`` or ``..``."""
    if not isinstance(name, str) or not _TOPIC_RE.match(name) or name in (".", ".."):
        raise InvalidTopicError(
            f"invalid topic name {name!r}: use 1-249 characters of [a-zA-Z0-9._-], not '.' or '..'"
        )
    return name


class Log:
    """An open log directory. Use :func:`pylog.open`. A context manager; thread-safe.

    ``max_open_partitions`` and ``max_open_maps`` bound the file descriptors this object keeps open (about
    three per open partition plus one per mapped segment), however many partitions and segments exist."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        max_open_maps: int = 256,
        max_open_partitions: int = 200,
        **defaults: Any,
    ) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.defaults = TopicConfig.from_dict(defaults)
        self.map_cache = MapCache(max_open_maps)
        self.handles = HandleBudget(max_open_partitions)
        self._lock = threading.RLock()
        self._topics: dict[str, Topic] = {}
        self._manifest: dict[str, Any] = {"topics": {}}
        self._manifest_stamp: tuple[int, int] | None = None
        self._closed = False
        self._fork_generation = _FORK_GENERATION[0]
        self.recovery: dict[str, RecoveryReport] = {}
        self._txn_log: Any = None
        self._next_manifest_check = 0.0
        fs.makedirs(self.path)
        self._open_lock_fd = fs.FS.open(os.path.join(self.path, ".open.lock"), os.O_RDWR | os.O_CREAT)
        self._shared_fd = fs.FS.open(os.path.join(self.path, ".lock"), os.O_RDWR | os.O_CREAT)
        try:
            with self._open_guard():
                self._first = _try_flock(self._shared_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._load_manifest()
                if self._first:
                    self._recover_all()
                fcntl.flock(self._shared_fd, fcntl.LOCK_SH)
        except BaseException:
            fs.FS.close(self._open_lock_fd)
            fs.FS.close(self._shared_fd)
            raise

    # -- locks and lifecycle ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _open_guard(self) -> Iterator[None]:
        fcntl.flock(self._open_lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._open_lock_fd, fcntl.LOCK_UN)

    def _check(self) -> None:
        if self._fork_generation != _FORK_GENERATION[0]:
            raise ForkedProcessError(
                f"this Log ({self.path}) was opened before fork(); open it again in the child process"
            )
        if self._closed:
            raise LogClosedError(f"the log at {self.path} is closed")

    def __enter__(self) -> Log:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Log({self.path!r}, topics={sorted(self._manifest['topics'])})"

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Flush and close every partition. The last process to close writes the clean-shutdown marker."""
        with self._lock:
            if self._closed:
                return
            if self._fork_generation != _FORK_GENERATION[0]:
                self._closed = True
                return
            self._closed = True
            try:
                with self._open_guard():
                    for topic in self._topics.values():
                        topic.close()
                    fcntl.flock(self._shared_fd, fcntl.LOCK_UN)
                    if _try_flock(self._shared_fd, fcntl.LOCK_EX | fcntl.LOCK_NB):
                        self._last_close()
                    fcntl.flock(self._shared_fd, fcntl.LOCK_UN)
            finally:
                if self._txn_log is not None:
                    self._txn_log.close()
                fs.FS.close(self._shared_fd)
                fs.FS.close(self._open_lock_fd)

    def _last_close(self) -> None:
        """Alone with the directory: trim unpublished tails, fsync everything, then mark the shutdown clean."""
        for name, meta in self._manifest["topics"].items():
            config = TopicConfig.from_dict(meta["config"])
            for p in range(meta["partitions"]):
                directory = os.path.join(self.path, f"{name}-{p}")
                plog = PartitionLog(directory, name, p, config, self.clock, self.map_cache)
                try:
                    plog.trim_unpublished_tail()
                    plog.flush()
                    plog.checkpoint.write(plog.log_end_offset, sync=True)
                finally:
                    plog.close(flush=False)
        fs.atomic_write(os.path.join(self.path, ".clean-shutdown"), b"clean\n")

    def _recover_all(self) -> None:
        marker = os.path.join(self.path, ".clean-shutdown")
        clean = os.path.exists(marker)
        names = set(self._manifest["topics"])
        for entry in fs.FS.listdir(self.path):
            full = os.path.join(self.path, entry)
            if entry.endswith(".tmp") and os.path.isfile(full):
                fs.FS.unlink(full)  # an atomic_write that never reached its rename
                continue
            if entry.endswith(".deleted") and os.path.isdir(full):
                fs.rmtree(full, ignore_errors=True)
                continue
            m = re.match(r"^(.*)-(\d+)$", entry)
            if m and os.path.isdir(full) and m.group(1) not in names and self._manifest_stamp is not None:
                fs.rmtree(full, ignore_errors=True)
        for name, meta in self._manifest["topics"].items():
            config = TopicConfig.from_dict(meta["config"])
            for p in range(meta["partitions"]):
                directory = os.path.join(self.path, f"{name}-{p}")
                fs.makedirs(directory)
                plog = PartitionLog(
                    directory, name, p, config, self.clock, self.map_cache, recover=True, clean_shutdown=clean
                )
                self.recovery[f"{name}-{p}"] = plog.report
                plog.close(flush=False)
        if clean:
            fs.FS.unlink(marker)
            fs.FS.fsync_dir(self.path)

    # -- manifest ---------------------------------------------------------------------------------------

    def _manifest_path(self) -> str:
        return os.path.join(self.path, _MANIFEST)

    def _load_manifest(self) -> None:
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
        self._manifest = _decode_manifest(raw, path)
        self._manifest_stamp = stamp

    def _write_manifest(self, manifest: dict[str, Any]) -> None:
        body = json.dumps(manifest, sort_keys=True, indent=1).encode()
        fs.atomic_write(self._manifest_path(), _MAGIC + f"{crc32c(body):08x}\n".encode() + body)
        self._manifest = manifest
        st = os.stat(self._manifest_path())
        self._manifest_stamp = (st.st_ino, st.st_mtime_ns)

    def _refresh_manifest(self) -> None:
        self._load_manifest()
        for name in list(self._topics):
            meta = self._manifest["topics"].get(name)
            if meta is None:
                self._topics.pop(name).close()
            elif meta["partitions"] != self._topics[name].num_partitions:
                self._topics[name].grow(meta["partitions"])

    # -- topics -----------------------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1, **config: Any) -> Topic:
        """Create a topic with ``partitions`` partitions and Kafka-named config overrides."""
        self._check()
        validate_topic_name(name)
        if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= 100_000:
            raise ConfigError(f"partitions must be an int in [1, 100000], got {partitions!r}")
        cfg = self.defaults.replace(**config)
        with self._lock, self._open_guard():
            self._load_manifest()
            if name in self._manifest["topics"]:
                raise TopicExistsError(f"topic {name!r} already exists")
            for p in range(partitions):
                self._create_partition_dir(name, p, cfg)
            fs.FS.fsync_dir(self.path)
            manifest = json.loads(json.dumps(self._manifest))
            manifest["topics"][name] = {"partitions": partitions, "config": cfg.to_dict()}
            self._write_manifest(manifest)
        return self.topic(name)

    def _create_partition_dir(self, name: str, p: int, cfg: TopicConfig) -> None:
        directory = os.path.join(self.path, f"{name}-{p}")
        if os.path.exists(directory):
            fs.rmtree(directory)  # leftover of a creation that never reached the manifest
        fs.FS.mkdir(directory)
        plog = PartitionLog(directory, name, p, cfg, self.clock, self.map_cache, recover=True)
        plog.close(flush=False)

    def create_partitions(self, name: str, total: int) -> Topic:
        """Grow ``name`` to ``total`` partitions (like ``kafka-topics --alter --partitions``). Existing records
        stay where they are; keyed records may map to other partitions from now on."""
        self._check()
        with self._lock, self._open_guard():
            self._load_manifest()
            meta = self._manifest["topics"].get(name)
            if meta is None:
                raise UnknownTopicError(f"unknown topic {name!r}")
            current = meta["partitions"]
            if isinstance(total, bool) or not isinstance(total, int) or not current < total <= 100_000:
                raise ConfigError(
                    f"total must be an int in ({current}, 100000] for topic {name!r}, got {total!r}"
                )
            cfg = TopicConfig.from_dict(meta["config"])
            for p in range(current, total):
                self._create_partition_dir(name, p, cfg)
            fs.FS.fsync_dir(self.path)
            manifest = json.loads(json.dumps(self._manifest))
            manifest["topics"][name]["partitions"] = total
            self._write_manifest(manifest)
            self._refresh_manifest()
        return self.topic(name)

    def alter_topic(self, name: str, **config: Any) -> Topic:
        """Change topic configs (for example ``retention_ms``); takes effect for every process on reopen of
        the topic and at once in this one."""
        self._check()
        with self._lock, self._open_guard():
            self._load_manifest()
            meta = self._manifest["topics"].get(name)
            if meta is None:
                raise UnknownTopicError(f"unknown topic {name!r}")
            cfg = TopicConfig.from_dict(meta["config"]).replace(**config)
            manifest = json.loads(json.dumps(self._manifest))
            manifest["topics"][name]["config"] = cfg.to_dict()
            self._write_manifest(manifest)
            topic = self._topics.get(name)
            if topic is not None:
                topic.set_config(cfg)
        return self.topic(name)

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
            topic = Topic(self, name, meta["partitions"], TopicConfig.from_dict(meta["config"]))
            self._topics[name] = topic
            return topic

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
        self._check()
        with self._lock, self._open_guard():
            self._load_manifest()
            meta = self._manifest["topics"].get(name)
            if meta is None:
                raise UnknownTopicError(f"unknown topic {name!r}")
            manifest = json.loads(json.dumps(self._manifest))
            del manifest["topics"][name]
            self._write_manifest(manifest)
            topic = self._topics.pop(name, None)
            if topic is not None:
                topic.close()
            for p in range(meta["partitions"]):
                directory = os.path.join(self.path, f"{name}-{p}")
                if os.path.isdir(directory):
                    fs.FS.rename(directory, directory + ".deleted")
            fs.FS.fsync_dir(self.path)
            for p in range(meta["partitions"]):
                fs.rmtree(os.path.join(self.path, f"{name}-{p}.deleted"), ignore_errors=True)

    # -- clients ----------------------------------------------------------------------------------------

    def producer(self, **config: Any) -> Any:
        """A :class:`~pylog.producer.Producer` writing to this log; with ``enable_idempotence=True`` or a
        ``transactional_id``, an :class:`~pylog.idempotent.IdempotentProducer`."""
        self._check()
        if config.get("enable_idempotence") or config.get("transactional_id") is not None:
            from pylog.idempotent import IdempotentProducer

            return IdempotentProducer(self, **config)
        config.pop("enable_idempotence", None)
        from pylog.producer import Producer

        return Producer(self, **config)

    def transactions(self) -> Any:
        """The :class:`~pylog.transactions.TxnLog` of this directory (producer ids, transaction decisions)."""
        self._check()
        with self._lock:
            if self._txn_log is None:
                from pylog.transactions import TxnLog

                self._txn_log = TxnLog(self.path)
            return self._txn_log

    def consumer(self, *topics: str, **config: Any) -> Any:
        """A :class:`~pylog.consumer.Consumer` reading from this log."""
        from pylog.consumer import Consumer

        self._check()
        return Consumer(self, *topics, **config)

    # -- consumer groups --------------------------------------------------------------------------------

    def list_groups(self) -> list[str]:
        """Ids of the consumer groups of this log, sorted."""
        from pylog.groups import admin

        self._check()
        return admin.list_groups(self)

    def describe_group(self, group_id: str) -> Any:
        """A :class:`~pylog.groups.admin.GroupDescription`: state, generation, members and assignments."""
        from pylog.groups import admin

        self._check()
        return admin.describe_group(self, group_id)

    def group_offsets(self, group_id: str) -> dict[Any, Any]:
        """Committed offsets of a group: ``{TopicPartition: OffsetAndMetadata}``."""
        from pylog.groups import admin

        self._check()
        return admin.group_offsets(self, group_id)

    def group_lag(self, group_id: str) -> dict[Any, int]:
        """Per partition with a committed offset: log end offset minus committed offset."""
        from pylog.groups import admin

        self._check()
        return admin.group_lag(self, group_id)

    def reset_group_offsets(self, group_id: str, offsets: dict[Any, int]) -> None:
        """Set a group's committed offsets; the group must have no live members."""
        from pylog.groups import admin

        self._check()
        admin.reset_group_offsets(self, group_id, offsets)

    def delete_group(self, group_id: str) -> None:
        """Delete a group and its committed offsets; the group must have no live members."""
        from pylog.groups import admin

        self._check()
        admin.delete_group(self, group_id)

    # -- maintenance ------------------------------------------------------------------------------------

    def apply_retention(self) -> dict[str, int]:
        """Run retention on every partition now; returns segments deleted per topic."""
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
                    report[f"{name}-{p}"] = problems
        return report

    def flush(self) -> None:
        """fsync every partition opened by this process."""
        for topic in list(self._topics.values()):
            topic.flush()


def _decode_manifest(raw: bytes, path: str) -> dict[str, Any]:
    head, _, body = raw.partition(b"\n")
    if not head.startswith(b"pylog-manifest "):
        raise CorruptRecordError(f"{path} is not a pylog manifest", path=path)
    if not head.startswith(_MAGIC):
        raise UnsupportedFormatError(f"{path} has an unknown manifest format: {head[:40]!r}")
    try:
        crc = int(head[len(_MAGIC) :], 16)
    except ValueError:
        raise CorruptRecordError(f"{path}: bad manifest header", path=path) from None
    if crc32c(body) != crc:
        raise CorruptRecordError(f"{path}: manifest CRC mismatch", path=path)
    try:
        manifest = json.loads(body)
        for meta in manifest["topics"].values():
            TopicConfig.from_dict(meta["config"])
            if not isinstance(meta["partitions"], int) or meta["partitions"] < 1:
                raise ValueError("bad partition count")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptRecordError(f"{path}: manifest is not valid: {exc}", path=path) from exc
    return dict(manifest)


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
    itself: it raises :class:`LockError` while any process has the log open. Returns
    ``{"topic-partition": [what was dropped, ...]}`` for the partitions it changed."""
    from pylog.errors import LockError
    from pylog.partition.recovery import repair_partition

    root = os.path.abspath(os.fspath(path))
    if not os.path.exists(os.path.join(root, _MANIFEST)):
        raise UnknownTopicError(f"{root} is not a pylog directory (no manifest)")
    open_fd = fs.FS.open(os.path.join(root, ".open.lock"), os.O_RDWR | os.O_CREAT)
    shared_fd = fs.FS.open(os.path.join(root, ".lock"), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(open_fd, fcntl.LOCK_EX)
        if not _try_flock(shared_fd, fcntl.LOCK_EX | fcntl.LOCK_NB):
            raise LockError(f"{root} is open in another process; close it before repair()")
        manifest = _decode_manifest(fs.FS.read_file(os.path.join(root, _MANIFEST)), root)
        out: dict[str, list[str]] = {}
        for name, meta in sorted(manifest["topics"].items()):
            compacted = "compact" in meta["config"].get("cleanup_policy", "delete")
            for p in range(meta["partitions"]):
                directory = os.path.join(root, f"{name}-{p}")
                if os.path.isdir(directory):
                    actions = repair_partition(directory, compacted)
                    if actions:
                        out[f"{name}-{p}"] = actions
        marker = os.path.join(root, ".clean-shutdown")
        if out and os.path.exists(marker):
            fs.FS.unlink(marker)  # the next open revalidates and rebuilds the shared state
            fs.FS.fsync_dir(root)
        return out
    finally:
        fs.FS.close(shared_fd)
        fs.FS.close(open_fd)


def open_log(path: str | os.PathLike[str], *, clock: Clock | None = None, **defaults: Any) -> Log:
    """Open (creating if needed) the log directory at ``path``. ``defaults`` are topic config defaults."""
    return Log(path, clock=clock, **defaults)
