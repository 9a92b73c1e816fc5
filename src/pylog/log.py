"""Log: the facade :func:`pylog.open` returns. A :class:`~pylog.directory.LogDirectory` (topics, partitions,
sessions, transactions) that also creates the clients (producers, consumers) and administers consumer groups.

Nothing below this module imports it: producers, consumers and groups are handed the
:class:`~pylog.directory.LogDirectory` they work on (the import-linter contracts in ``pyproject.toml`` keep it so).

Thread-safety: thread-safe, as :class:`~pylog.directory.LogDirectory`.
"""

from __future__ import annotations

import os
from typing import Any

from pylog.clock import Clock
from pylog.config import TopicConfig
from pylog.consumer import Consumer
from pylog.directory import LogDirectory, check_access, repair, validate_topic_name
from pylog.errors import ConfigError, IllegalStateError, NotALogDirectoryError, ReadOnlyLogError
from pylog.groups import admin
from pylog.groups.admin import GroupDescription
from pylog.groups.replica import open_groups_dir
from pylog.groups.store import groups_root
from pylog.idempotent import IdempotentProducer
from pylog.producer import Producer
from pylog.structs import OffsetAndMetadata, TopicPartition
from pylog.tiered.background import DEFAULT_INTERVAL_MS, PartitionTierStatus, RemoteLogManager, check_interval
from pylog.tiered.decisions import RemoteDecisions
from pylog.tiered.fetch import DEFAULT_CACHE_BYTES, RemoteCache, RemotePartition
from pylog.tiered.location import read_remote_storage, write_remote_storage
from pylog.tiered.manifest import holds_log, remote_topics
from pylog.tiered.retention import add_pending_deletion
from pylog.tiered.store import ObjectStore, check_store, local_path
from pylog.tiered.uploader import TierResult, tier_partition
from pylog.transactions import TxnDecisions

__all__ = ["Log", "open_log", "repair", "validate_topic_name"]


class Log(LogDirectory):
    """An open log directory and its clients. Use :func:`pylog.open`. A context manager; thread-safe.

    ``max_open_partitions`` and ``max_open_maps`` bound the file descriptors this object keeps open (about
    three per open partition plus one per mapped segment), however many partitions and segments exist.

    ``remote_storage`` is the object-store URL of tiered storage (``s3://bucket/prefix``, ``file:///path``),
    ``remote_storage_options`` its client options (see :mod:`pylog.tiered.store`); :meth:`tier` uses them,
    and reads of tiered topics below the local log start go there, through a cache of at most
    ``remote_cache_bytes`` (:mod:`pylog.tiered.fetch`). A ``path`` that is itself an object-store URL opens
    the log read-only from the object store, with no local directory (``read_only=True`` is required); its
    consumer groups then keep their files in ``groups_dir``, a local directory shared by the group's processes
    (:mod:`pylog.groups.replica`; without it, ``group_id`` is refused).

    A writable log with a ``remote_storage`` runs one background thread that tiers its enabled topics every
    ``remote_log_manager_task_interval_ms`` (Kafka's ``remote.log.manager.task.interval.ms``, 30 s; -1: no
    thread, :meth:`tier` and :meth:`apply_retention` on demand), see :mod:`pylog.tiered.background`. The URL
    is recorded in the log directory (:mod:`pylog.tiered.location`), so a later open without it uses it
    again; the options are not recorded."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        remote_storage: str | None = None,
        remote_storage_options: dict[str, Any] | None = None,
        remote_cache_bytes: int = DEFAULT_CACHE_BYTES,
        remote_log_manager_task_interval_ms: int = DEFAULT_INTERVAL_MS,
        groups_dir: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> None:
        check_interval(remote_log_manager_task_interval_ms)
        self._manager: RemoteLogManager | None = None
        url = path if isinstance(path, str) and "://" in path else None
        recorded = url is None and remote_storage is None
        if recorded:
            remote_storage = _recorded_remote_storage(path)
        if remote_storage is not None or url is not None:
            try:  # before anything is recorded or opened: a mistyped URL or option is refused here
                check_store(url if url is not None else remote_storage, remote_storage_options)
            except ConfigError as exc:
                if recorded:
                    raise ConfigError(
                        f"{exc} (the URL recorded in {os.path.join(os.fspath(path), 'remote_storage')}; open "
                        "with remote_storage=URL to replace it)"
                    ) from exc
                raise
        local = local_path(url) if url is not None else None
        if url is not None and local is not None and not os.path.isdir(local):
            raise NotALogDirectoryError(
                f"{url} holds no pylog log ({local} does not exist): check the URL", path=url
            )
        if url is not None:
            if not kwargs.get("read_only"):
                raise ReadOnlyLogError(
                    f"a log in an object store ({url}) is opened with read_only=True; to write it, restore it "
                    "into a directory first (pylog restore)"
                )
            if remote_storage not in (None, url):
                raise ConfigError(f"remote_storage={remote_storage!r} differs from the URL opened ({url})")
            remote_storage = url
        if groups_dir is not None and url is None:
            raise ConfigError(
                "groups_dir is for a log opened from an object store (pylog.open(url, read_only=True, "
                "groups_dir=...)); a log directory keeps its consumer groups in itself"
            )
        self.remote_storage = remote_storage
        self.remote_storage_options = dict(remote_storage_options or {})
        self.remote_cache_bytes = remote_cache_bytes
        self._remote: ObjectStore | None = None
        self._remote_cache: RemoteCache | None = None
        self._remote_decisions: RemoteDecisions | None = None
        if remote_storage is not None:
            RemoteCache.check(remote_cache_bytes)
        manifest = remote_topics(self._store()) if url is not None else None
        if (
            url is not None
            and manifest is not None
            and not manifest["topics"]
            and not holds_log(self._store())
        ):
            raise NotALogDirectoryError(
                f"{url} holds no pylog log (no remote manifest, not even of a deleted topic): check the URL and "
                "its prefix, or tier the log there first",
                path=url,
            )
        # after the store answered: a URL that cannot be opened leaves no groups directory behind
        replica_root = (
            open_groups_dir(groups_dir, url) if groups_dir is not None and url is not None else None
        )
        super().__init__(
            path,
            remote_segments=self._remote_segments if remote_storage is not None else None,
            remote_manifest=manifest,
            **kwargs,
        )
        if replica_root is not None:
            self.groups_root = replica_root
        if remote_storage is not None and url is None and not self.read_only:
            self._start_manager(remote_storage, remote_log_manager_task_interval_ms)

    def close(self, timeout: float | None = None) -> None:
        if self._manager is not None:
            self._manager.close()  # before the partitions close under it (bounded wait)
        try:
            super().close(timeout)
        finally:
            if self._remote_cache is not None:
                self._remote_cache.close()

    # -- reading tiered storage ---------------------------------------------------------------------------

    def _start_manager(self, url: str, interval_ms: int) -> None:
        if read_remote_storage(self.path) != url:
            write_remote_storage(self.path, url)
        self._manager = RemoteLogManager(self, self._store, self.clock, interval_ms=interval_ms)
        self._manager.start()

    def _store(self) -> ObjectStore:
        if self._remote is None:
            if self.remote_storage is None:
                raise IllegalStateError("no remote_storage URL: pylog.open(path, remote_storage=...)")
            self._remote = ObjectStore(self.remote_storage, **self.remote_storage_options)
        return self._remote

    def _remote_segments(self, topic: str, partition: int, config: TopicConfig) -> RemotePartition | None:
        """The source of a tiered partition's remote segments (handed to its PartitionLog)."""
        standalone = self.remote_storage == self.path
        if not (config.remote_storage_enable or standalone):
            return None
        with self._lock:
            if self._remote_cache is None:
                self._remote_cache = RemoteCache(self._store(), self.remote_cache_bytes)
            cache = self._remote_cache
        return RemotePartition(cache, topic, partition, self.clock, standalone=standalone)

    def txn_decisions(self) -> TxnDecisions:
        """What ``read_committed`` readers ask for transaction outcomes: for a log read from an object store,
        the decisions tiered with it (:class:`~pylog.tiered.decisions.RemoteDecisions`, re-read at most once a
        second of the log's clock, as the segment manifests are); else the directory's transaction log."""
        if self.remote_storage is None or self.remote_storage != self.path:
            return super().txn_decisions()
        self.check_open()
        with self._lock:
            if self._remote_decisions is None:
                self._remote_decisions = RemoteDecisions(self._store(), self.clock)
            return self._remote_decisions

    # -- clients ----------------------------------------------------------------------------------------

    def producer(self, **config: Any) -> Producer:
        """A :class:`~pylog.producer.Producer` writing to this log; with ``enable_idempotence=True`` or a
        ``transactional_id``, an :class:`~pylog.idempotent.IdempotentProducer`."""
        self.check_writable("create a producer")
        if config.get("enable_idempotence") or config.get("transactional_id") is not None:
            return self.register_producer(IdempotentProducer(self, **config))
        config.pop("enable_idempotence", None)
        return self.register_producer(Producer(self, **config))

    def consumer(self, *topics: str, **config: Any) -> Consumer:
        """A :class:`~pylog.consumer.Consumer` reading from this log."""
        self.check_open()
        if config.get("group_id") is not None:
            self._check_groups_writable("join a consumer group (it commits offsets); read without group_id")
        return Consumer(self, *topics, **config)

    def delete_topic(self, name: str) -> None:
        """Delete a topic and all its data, and the offsets consumer groups committed for it.

        With a ``remote_storage``, its data in the object store too (:func:`~pylog.tiered.retention.delete_remote_topic`:
        a tombstone manifest for each partition first, then the objects): the deletion is recorded in the log
        directory before the local delete, run after it, and forgotten once done. When the store cannot be
        reached the local delete still happens; the remote deletion is logged as a warning, shown in
        :meth:`tier_status` (``last_error`` of the topic's partitions) and retried by every later tiering pass,
        which also holds back a topic created again with the same name until it is done."""
        manager = self._manager
        if manager is not None and self.has_topic(name):
            add_pending_deletion(self.path, name, self.topic(name).topic_id)
        super().delete_topic(name)
        admin.forget_topic_offsets(self.path, name, self.clock.time_ms())
        if manager is not None:
            manager.delete_remote_topic(name)

    # -- tiered storage ---------------------------------------------------------------------------------

    def tier(self, *, roll: bool = False) -> list[TierResult]:
        """Copy the sealed segments of every topic with ``remote_storage_enable`` to ``remote_storage`` now,
        then publish each partition's remote manifest; one :class:`~pylog.tiered.uploader.TierResult` per
        partition (``uploaded`` is empty when there was nothing new). With ``roll``, the active segment of
        each of those partitions is rolled first when it holds records, so everything written so far is
        uploaded (a device about to shut down; rolling often makes many small segments). Never deletes
        anything: retention (:meth:`apply_retention`, or the background pass) deletes the local copies it
        confirmed. A read-only log refuses (it publishes manifests): :class:`~pylog.errors.ReadOnlyLogError`."""
        self.check_writable("tier segments to the object store (it publishes remote manifests)")
        if self.remote_storage is None:
            raise IllegalStateError("tier() needs a remote_storage URL: pylog.open(path, remote_storage=...)")
        if roll:
            for name in self.topics():
                topic = self.topic(name)
                if topic.config.remote_storage_enable:
                    for p in range(topic.num_partitions):
                        topic.partition(p).roll()  # a no-op for an empty active segment
        if self._manager is not None:
            return self._manager.tier()
        results = []
        for name in self.topics():
            topic = self.topic(name)
            if topic.config.remote_storage_enable:
                for p in range(topic.num_partitions):
                    plog = topic.partition(p)
                    result = tier_partition(self._store(), plog, topic.num_partitions)
                    if isinstance(plog.remote, RemotePartition):
                        plog.remote.saw(result.manifest)  # its readers see the new segments at once
                    results.append(result)
        return results

    def tier_status(self) -> dict[TopicPartition, PartitionTierStatus]:
        """Per tiered partition: the remote offsets known, segments uploaded and deleted, and failures
        (``last_error``, ``failures`` in a row) of the background uploader and :meth:`tier`."""
        self.check_open()
        return self._manager.status() if self._manager is not None else {}

    @property
    def remote_log_manager(self) -> RemoteLogManager | None:
        """The tiering passes of this log (None without ``remote_storage`` or when read-only): its
        ``run_once()`` runs a pass now; tests drive it with a manual clock."""
        return self._manager

    def apply_retention(self) -> dict[str, int]:
        """Run retention on every partition now; local segments deleted per topic. A topic with
        ``remote_storage_enable`` deletes only local segments its remote manifest names (and whose
        ``local_retention_ms`` / ``local_retention_bytes`` passed), then drops remote segments past
        ``retention_ms`` / ``retention_bytes`` (needs ``remote_storage``; without it nothing of the topic is
        deleted)."""
        self.check_writable("apply retention")
        out = {}
        for name in self.topics():
            topic = self.topic(name)
            if topic.config.remote_storage_enable and self._manager is not None:
                out[name] = self._manager.apply_retention(name)
            else:
                out[name] = topic.apply_retention()
        return out

    # -- consumer groups --------------------------------------------------------------------------------

    @property
    def _replica_groups(self) -> bool:
        """True for a log read from an object store whose consumer groups live in a local ``groups_dir``."""
        return self.remote_storage == self.path and self.groups_root is not None

    def _check_groups_writable(self, what: str) -> None:
        """Group changes need a writable log directory, or the ``groups_dir`` of a log read from an object
        store (the log itself stays read-only)."""
        if self._replica_groups:
            self.check_open()
        elif self.remote_storage == self.path:
            self.check_open()
            groups_root(self)  # raises ReadOnlyLogError naming groups_dir
        else:
            self.check_writable(what)

    def list_groups(self) -> list[str]:
        """Ids of the consumer groups of this log, sorted."""
        self.check_open()
        return admin.list_groups(self)

    def describe_group(self, group_id: str) -> GroupDescription:
        """A :class:`~pylog.groups.admin.GroupDescription`: state, generation, members and assignments."""
        self.check_open()
        return admin.describe_group(self, group_id)

    def group_offsets(self, group_id: str) -> dict[TopicPartition, OffsetAndMetadata]:
        """Committed offsets of a group: ``{TopicPartition: OffsetAndMetadata}``."""
        self.check_open()
        return admin.group_offsets(self, group_id)

    def group_lag(self, group_id: str) -> dict[TopicPartition, int]:
        """Per partition with a committed offset: log end offset minus committed offset."""
        self.check_open()
        return admin.group_lag(self, group_id)

    def reset_group_offsets(self, group_id: str, offsets: dict[TopicPartition, int]) -> None:
        """Set a group's committed offsets; the group must have no live members."""
        self._check_groups_writable("reset group offsets")
        admin.reset_group_offsets(self, group_id, offsets)

    def delete_group(self, group_id: str) -> None:
        """Delete a group and its committed offsets; the group must have no live members."""
        self._check_groups_writable("delete a group")
        admin.delete_group(self, group_id)


def open_log(
    path: str | os.PathLike[str],
    *,
    clock: Clock | None = None,
    read_only: bool = False,
    remote_storage: str | None = None,
    remote_storage_options: dict[str, Any] | None = None,
    remote_cache_bytes: int = DEFAULT_CACHE_BYTES,
    remote_log_manager_task_interval_ms: int = DEFAULT_INTERVAL_MS,
    groups_dir: str | os.PathLike[str] | None = None,
    **defaults: Any,
) -> Log:
    """Open (creating if needed) the log directory at ``path``. ``defaults`` are topic config defaults.
    ``remote_storage`` (an object-store URL) and its ``remote_storage_options`` are for :meth:`Log.tier` and
    for reads of tiered segments (through a cache of at most ``remote_cache_bytes``). ``path`` may be an
    object-store URL itself, with ``read_only=True``: the log is then read from the object store alone (the
    topics and partitions its remote manifests name), with no local directory; consumers read it (``assign``,
    ``seek``, ``poll``), and with ``groups_dir`` (a local directory, created if new; the processes of a group
    give the same one) consumers with a ``group_id`` too: joins, rebalances, commits, ``describe_group``,
    ``group_lag`` against the log end offsets seen in the store, ``reset_group_offsets``, ``delete_group``, as
    on a log directory. ``groups_dir`` records the URL it serves and refuses another one, a log directory and
    a directory holding anything else (:class:`~pylog.errors.ConfigError`), and one this process cannot write
    (:class:`~pylog.errors.ReadOnlyLogError`). A writable log with ``remote_storage`` tiers its enabled topics
    from a background thread every ``remote_log_manager_task_interval_ms`` (default 30000; -1: none), and
    records the URL in the directory: a later open without ``remote_storage`` uses it (not the options).

    ``read_only=True`` (or a directory this process cannot write) opens it without writing anything: reads
    see each partition as its files hold it when first used; writes raise
    :class:`~pylog.errors.ReadOnlyLogError`."""
    return Log(
        path,
        clock=clock,
        read_only=read_only,
        remote_storage=remote_storage,
        remote_storage_options=remote_storage_options,
        remote_cache_bytes=remote_cache_bytes,
        remote_log_manager_task_interval_ms=remote_log_manager_task_interval_ms,
        groups_dir=groups_dir,
        **defaults,
    )


def _recorded_remote_storage(path: str | os.PathLike[str]) -> str | None:
    """The ``remote_storage`` URL recorded in an existing log directory, or None."""
    root = os.path.abspath(os.fspath(path))
    check_access(root, "read")  # unreadable: PermissionDeniedError, not an error about a file in it
    return read_remote_storage(root) if os.path.isdir(root) else None
