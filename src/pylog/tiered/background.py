"""The remote log manager: tiering passes of one log, on demand and from one background thread.

A pass (:meth:`RemoteLogManager.run_once`), for every partition of every topic with ``remote_storage_enable``:

1. upload its sealed segments and publish a manifest (:func:`~pylog.tiered.uploader.tier_partition`); the
   offsets the published manifest covers are remembered (in memory: after a restart they are read from the
   newest manifest again when first needed; until they are known nothing tiered is deleted locally);
2. local retention with the offsets the manifest confirms (:func:`confirmed_range`: the run of local sealed
   segments it names exactly, same offsets and size) (:meth:`PartitionLog.apply_retention
   <pylog.partition.log.PartitionLog.apply_retention>`): an uploaded segment past ``local_retention_ms`` /
   ``local_retention_bytes`` is deleted locally; a segment not uploaded (or rewritten since) stays;
3. whole-log retention of its remote segments (:func:`~pylog.tiered.retention.apply_remote_retention`).

Before the partitions, the remote deletions of deleted topics that are not finished (``Log.delete_topic`` runs
one at once; one that failed, the store down, is retried here: :func:`~pylog.tiered.retention.delete_remote_topic`).
A topic created again with the same name is not tiered (nor its local copies deleted by the tiered retention)
until the deletion of the old one finished, so it never merges into the old topic's manifests. A failure is
recorded on the topic's partitions in :meth:`~RemoteLogManager.status` and logged.

Then, when the log tiers any topic, the transaction decisions (:func:`~pylog.tiered.decisions.upload_decisions`):
after the segments, so that the producers state uploaded with them covers the producer ids of the segments
of the pass. A failure is recorded in :meth:`~RemoteLogManager.decisions_status` as one of a partition is.

A failure of one partition (the store down, a 503 after the retries, a diverged local log) is recorded in
:meth:`~RemoteLogManager.status` (``last_error``, ``failures``), logged as a warning on the ``pylog.tiered``
logger, and the pass goes on with the next partition; the next pass retries it. Nothing of a failed partition
is deleted locally in that pass.

The background thread (:meth:`~RemoteLogManager.start`) runs a pass every ``interval_ms``
(Kafka's ``remote.log.manager.task.interval.ms``, default 30 s as in Kafka), judged on the injected clock's
monotonic time: it waits on an event for at most the time left (and at most one second of real time, so a
manual clock that was moved is noticed), and :meth:`~RemoteLogManager.wake` makes it look at once. An
exception never ends the thread; it never touches a producer's path (appends do not wait for it).

Thread-safety: thread-safe; passes (background and :meth:`~RemoteLogManager.tier` on demand) are serialized
by one lock. Crash contract: a pass only uploads, publishes new manifest versions and deletes what the
manifests allow (see :mod:`pylog.tiered.uploader` and :mod:`pylog.tiered.retention`); a kill at any point
leaves local segments that were not confirmed remote, and at most unnamed remote objects that a later pass
sweeps.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace

from pylog.clock import Clock
from pylog.directory import LogDirectory
from pylog.errors import ConfigError
from pylog.partition.log import PartitionLog
from pylog.structs import TopicPartition
from pylog.tiered.decisions import DecisionsResult, upload_decisions
from pylog.tiered.fetch import RemotePartition
from pylog.tiered.manifest import PartitionManifest, read_manifest
from pylog.tiered.retention import (
    RemoteRetentionResult,
    apply_remote_retention,
    delete_remote_topic,
    pending_deletions,
    remove_pending_deletion,
)
from pylog.tiered.store import ObjectStore
from pylog.tiered.uploader import TierResult, tier_partition
from pylog.transactions import TXN_DIR

__all__ = [
    "DEFAULT_INTERVAL_MS",
    "DecisionsTierStatus",
    "PartitionTierStatus",
    "RemoteLogManager",
    "check_interval",
    "confirmed_range",
]

DEFAULT_INTERVAL_MS = 30_000  # Kafka's remote.log.manager.task.interval.ms default
_MAX_WAIT_S = 1.0  # the thread looks at the clock at least this often (a manual clock may have moved)
log = logging.getLogger("pylog.tiered")


def check_interval(interval_ms: object) -> int:
    """``remote_log_manager_task_interval_ms``: an int > 0, or -1 (no background thread: tier() on demand)."""
    if (
        isinstance(interval_ms, bool)
        or not isinstance(interval_ms, int)
        or not (interval_ms > 0 or interval_ms == -1)
    ):
        raise ConfigError(
            f"remote_log_manager_task_interval_ms must be an int > 0 (milliseconds) or -1 (no background "
            f"uploader), got {interval_ms!r}"
        )
    return interval_ms


@dataclass(frozen=True)
class PartitionTierStatus:
    """What the manager knows of one tiered partition.

    ``remote_start`` / ``remote_end``: the offsets the newest manifest it saw covers (None: unknown or empty);
    ``uploaded``: segments this manager uploaded; ``deleted_local`` / ``deleted_remote``: segments deleted by
    local and by whole-log retention; ``failures``: failed passes in a row (0 after a success);
    ``total_failures``: all failed passes; ``last_error``: the message of the last failure (None once a pass
    succeeded after it); ``last_success_ms`` / ``last_error_ms``: clock times of the last success and failure."""

    topic: str
    partition: int
    remote_start: int | None = None
    remote_end: int | None = None
    uploaded: int = 0
    deleted_local: int = 0
    deleted_remote: int = 0
    failures: int = 0
    total_failures: int = 0
    last_error: str | None = None
    last_error_ms: int | None = None
    last_success_ms: int | None = None


@dataclass(frozen=True)
class DecisionsTierStatus:
    """What the manager knows of the transaction decisions in the store (:mod:`pylog.tiered.decisions`):
    ``remote_end``: bytes of ``decisions.log`` the newest manifest it published or read holds (None: none
    yet); ``uploaded``: bytes it uploaded; the failure fields as :class:`PartitionTierStatus`'s."""

    remote_end: int | None = None
    uploaded: int = 0
    failures: int = 0
    total_failures: int = 0
    last_error: str | None = None
    last_error_ms: int | None = None
    last_success_ms: int | None = None


class RemoteLogManager:
    """Tiering of one log directory to one object store (see the module docstring). ``store`` opens the
    store when first needed; ``interval_ms`` is the background period (-1: no thread)."""

    def __init__(
        self,
        directory: LogDirectory,
        store: Callable[[], ObjectStore],
        clock: Clock,
        *,
        interval_ms: int = DEFAULT_INTERVAL_MS,
    ) -> None:
        self.directory = directory
        self.interval_ms = check_interval(interval_ms)
        # the store, once a pass opened it: close() stops its uploads
        self._opened: ObjectStore | None = None
        self._open_store = store
        self._clock = clock
        self._pass_lock = threading.Lock()  # one pass at a time
        self._lock = threading.Lock()  # the status below
        self._status: dict[TopicPartition, PartitionTierStatus] = {}
        self._manifests: dict[TopicPartition, PartitionManifest | None] = {}  # the newest seen, per partition
        self._decisions = DecisionsTierStatus()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0

    # -- knowledge of the remote end ------------------------------------------------------------------------

    def status(self) -> dict[TopicPartition, PartitionTierStatus]:
        """A copy of the status of every tiered partition a pass (or a range lookup) has seen."""
        with self._lock:
            return dict(self._status)

    def remote_range(self, topic: str, partition: int) -> tuple[int, int] | None:
        """``(start, end)`` of the partition's newest manifest (see :meth:`remote_manifest`); None when it
        names no segment or cannot be read."""
        return _range(self.remote_manifest(topic, partition))

    def remote_manifest(
        self, topic: str, partition: int, *, strict: bool = False
    ) -> PartitionManifest | None:
        """The partition's newest manifest: remembered (every upload and retention pass of this manager
        updates it), or read from the store when not known yet (after a restart). None when there is none, or
        when the store cannot be read (recorded as a failure; with ``strict`` raised instead)."""
        tp = TopicPartition(topic, partition)
        with self._lock:
            if self._manifests.get(tp) is not None:
                return self._manifests[tp]
        try:
            manifest, _ = read_manifest(self._store(), topic, partition)
        except Exception as exc:  # unknown stays unknown: nothing tiered is deleted locally
            if strict:
                raise
            self._failed(tp, exc)
            return None
        self._saw(tp, manifest)
        return manifest

    def _update(self, tp: TopicPartition, **changes: object) -> PartitionTierStatus:
        with self._lock:
            current = self._status.get(tp) or PartitionTierStatus(tp.topic, tp.partition)
            new = replace(current, **changes)  # type: ignore[arg-type]
            self._status[tp] = new
            return new

    def _saw(self, tp: TopicPartition, manifest: PartitionManifest | None) -> None:
        found = _range(manifest)
        with self._lock:
            self._manifests[tp] = manifest
        self._update(tp, remote_start=found[0] if found else None, remote_end=found[1] if found else None)

    def _failed(self, tp: TopicPartition, exc: BaseException, *, what: str = "tiering") -> None:
        prefix = "" if what == "tiering" else f"{what}: "
        with self._lock:
            current = self._status.get(tp) or PartitionTierStatus(tp.topic, tp.partition)
            self._status[tp] = replace(
                current,
                failures=current.failures + 1,
                total_failures=current.total_failures + 1,
                last_error=f"{prefix}{type(exc).__name__}: {exc}",
                last_error_ms=self._clock.time_ms(),
            )
        if self._stop.is_set():  # close() stopped it: a normal close says nothing
            log.debug("%s %s-%d stopped by close: %s", what, tp.topic, tp.partition, exc)
        else:
            log.warning("%s %s-%d failed (retried next pass): %s", what, tp.topic, tp.partition, exc)

    # -- passes -----------------------------------------------------------------------------------------

    def _tiered(self) -> list[tuple[str, int, int]]:
        """``(topic, partition, partition count)`` of every partition of every tiered topic."""
        out: list[tuple[str, int, int]] = []
        for name in self.directory.topics():
            topic = self.directory.topic(name)
            if topic.config.remote_storage_enable:
                out.extend((name, p, topic.num_partitions) for p in range(topic.num_partitions))
        return out

    def tier(self) -> list[TierResult]:
        """Upload every tiered partition now (no retention), then the transaction decisions; raises the first
        failure (after recording it)."""
        results = []
        with self._pass_lock:
            pending = self._finish_deletions()
            blocked = sorted(name for name, _, _ in self._tiered() if name in pending)
            if blocked:  # created again while the old topic's remote data is not deleted yet
                raise pending[blocked[0]]
            tiered = bool(self._tiered())
            for name, p, count in self._tiered():
                tp = TopicPartition(name, p)
                try:
                    plog = self.directory.topic(name).partition(p)
                    result = tier_partition(self._store(), plog, count)
                except Exception as exc:
                    self._failed(tp, exc)
                    raise
                _show(plog, result.manifest)
                self._succeeded(tp, result)
                results.append(result)
            if tiered:
                self.upload_decisions(strict=True)
        return results

    # -- deleted topics -------------------------------------------------------------------------------------

    def delete_remote_topic(self, topic: str) -> BaseException | None:
        """Finish the remote deletion of the deleted ``topic`` now (and of any other pending one): None when
        done, else the failure (recorded and logged; the next pass retries it)."""
        with self._pass_lock:
            return self._finish_deletions().get(topic)

    def _finish_deletions(self) -> dict[str, BaseException]:
        """Run the pending remote deletions (pass lock held); ``{topic: failure}`` of those still pending."""
        failed: dict[str, BaseException] = {}
        for name, topic_id in pending_deletions(self.directory.path).items():
            with self._lock:  # what was known of the deleted topic is no longer true of a new one
                for tp in [tp for tp in self._manifests if tp.topic == name]:
                    del self._manifests[tp]
            if self.directory.has_topic(name) and self.directory.topic(name).topic_id == topic_id:
                remove_pending_deletion(self.directory.path, name)  # its local delete never committed
                continue
            try:
                delete_remote_topic(self._store(), name)
            except Exception as exc:
                failed[name] = exc
                with self._lock:
                    known = [tp for tp in self._status if tp.topic == name] or [TopicPartition(name, 0)]
                for tp in known:
                    self._failed(tp, exc, what="deleting the remote data of the deleted topic")
                continue
            remove_pending_deletion(self.directory.path, name)
            with self._lock:
                for tp in [tp for tp in self._status if tp.topic == name]:
                    del self._status[tp]
        return failed

    # -- transaction decisions ------------------------------------------------------------------------------

    def decisions_status(self) -> DecisionsTierStatus:
        """What the passes did with the transaction decisions (see :class:`DecisionsTierStatus`)."""
        with self._lock:
            return self._decisions

    def upload_decisions(self, *, strict: bool = False) -> DecisionsResult | None:
        """Upload the transaction decisions now (:func:`~pylog.tiered.decisions.upload_decisions`); None when
        this log has no transaction directory (no producer id was ever handed out: nothing to upload). A
        failure is recorded and logged (and raised with ``strict``)."""
        if not os.path.isdir(os.path.join(self.directory.path, TXN_DIR)):
            return None
        try:
            result = upload_decisions(self._store(), self.directory.transactions())
        except Exception as exc:
            with self._lock:
                current = self._decisions
                self._decisions = replace(
                    current,
                    failures=current.failures + 1,
                    total_failures=current.total_failures + 1,
                    last_error=f"{type(exc).__name__}: {exc}",
                    last_error_ms=self._clock.time_ms(),
                )
            if self._stop.is_set():  # close() stopped it: a normal close says nothing
                log.debug("uploading the transaction decisions stopped by close: %s", exc)
            else:
                log.warning("uploading the transaction decisions failed (retried next pass): %s", exc)
            if strict:
                raise
            return None
        with self._lock:
            current = self._decisions
            self._decisions = replace(
                current,
                remote_end=result.manifest.end if result.manifest is not None else current.remote_end,
                uploaded=current.uploaded + result.uploaded,
                failures=0,
                last_error=None,
                last_success_ms=self._clock.time_ms(),
            )
        return result

    def _succeeded(self, tp: TopicPartition, result: TierResult) -> None:
        found = _range(result.manifest)
        with self._lock:
            self._manifests[tp] = result.manifest
            current = self._status.get(tp) or PartitionTierStatus(tp.topic, tp.partition)
            self._status[tp] = replace(
                current,
                remote_start=found[0] if found else None,
                remote_end=found[1] if found else None,
                uploaded=current.uploaded + len(result.uploaded),
                failures=0,
                last_error=None,
                last_success_ms=self._clock.time_ms(),
            )

    def run_once(self) -> dict[TopicPartition, PartitionTierStatus]:
        """One pass (upload, local retention, whole-log retention) over every tiered partition; failures are
        recorded, not raised. The status of every partition after it."""
        with self._pass_lock:
            pending = self._finish_deletions()
            tiered = self._tiered()
            for name, p, count in tiered:
                if self._stop.is_set():
                    break
                if name in pending:
                    continue  # a topic of the same name was deleted and its remote data is not deleted yet
                tp = TopicPartition(name, p)
                try:
                    plog = self.directory.topic(name).partition(p)
                    result = tier_partition(self._store(), plog, count)
                    _show(plog, result.manifest)
                    self._succeeded(tp, result)
                    self._retention(tp, result.manifest)
                except Exception as exc:
                    self._failed(tp, exc)
            if tiered and not self._stop.is_set():
                self.upload_decisions()
            self.passes += 1
        return self.status()

    def apply_retention(self, topic: str) -> int:
        """Local and whole-log retention of one tiered topic with the remote offsets known now (read from
        the store when not known); local segments deleted. A failure is recorded and raised."""
        t = self.directory.topic(topic)
        deleted = 0
        with self._pass_lock:
            pending = self._finish_deletions()
            if topic in pending:
                raise pending[topic]
            for p in range(t.num_partitions):
                tp = TopicPartition(topic, p)
                try:
                    deleted += self._retention(tp, None)
                except Exception as exc:
                    self._failed(tp, exc)
                    raise
        return deleted

    def _retention(self, tp: TopicPartition, manifest: PartitionManifest | None) -> int:
        """Local retention with the offsets the manifest confirms (it, or the newest known), then the remote
        retention."""
        plog = self.directory.topic(tp.topic).partition(tp.partition)
        if manifest is None:  # a failure to read the manifest is raised (the caller records it)
            manifest = self.remote_manifest(tp.topic, tp.partition, strict=True)
        deleted = plog.apply_retention(remote=confirmed_range(plog, manifest))
        if manifest is None or manifest.log_end_offset is None:
            return deleted  # no remote segment: nothing to drop, and no end to sweep below
        end = manifest.log_end_offset
        local_bytes = sum(s.size for s in plog.segments if s.base_offset >= end)
        result: RemoteRetentionResult = apply_remote_retention(
            self._store(),
            tp.topic,
            tp.partition,
            plog.config,
            self._clock.time_ms(),
            local_start=plog.local_log_start_offset,
            local_bytes=local_bytes,
        )
        if result.manifest is None:
            return deleted
        _show(plog, result.manifest)
        with self._lock:
            self._manifests[tp] = result.manifest
            current = self._status.get(tp) or PartitionTierStatus(tp.topic, tp.partition)
            after = _range(result.manifest)
            self._status[tp] = replace(
                current,
                remote_start=after[0] if after else None,
                remote_end=after[1] if after else None,
                deleted_local=current.deleted_local + deleted,
                deleted_remote=current.deleted_remote + len(result.dropped),
            )
        return deleted

    # -- the background thread --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background thread (once; nothing when ``interval_ms`` is -1)."""
        if self.interval_ms < 0 or self._thread is not None:
            return
        self._thread = threading.Thread(
            target=_loop,
            args=(weakref.ref(self), self._stop, self._wake, self._clock, self.interval_ms),
            name="pylog-remote-log-manager",
            daemon=True,
        )
        self._thread.start()

    def wake(self) -> None:
        """Make the thread look at the clock now (a test that moved a manual clock calls it)."""
        self._wake.set()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _store(self) -> ObjectStore:
        store = self._open_store()
        self._opened = store
        return store

    def close(self, timeout: float = 10.0) -> bool:
        """Stop the thread: the pass running stops after its partition, and an upload in progress stops at its
        next chunk boundary (:meth:`ObjectStore.stop_uploads <pylog.tiered.store.ObjectStore.stop_uploads>`:
        nothing of it is named or left visible; the partition's failure is recorded, the next open uploads it
        again); waits at most ``timeout`` seconds. True when the thread has ended (False: another store call
        still runs, such as a chunk's PUT to a store that stalls; it ends by itself, as a daemon, leaving at most
        unnamed objects). Uploads through this manager's store fail from then on."""
        self._stop.set()
        self._wake.set()
        if self._opened is not None:
            self._opened.stop_uploads()
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()


def _loop(
    ref: weakref.ReferenceType[RemoteLogManager],
    stop: threading.Event,
    wake: threading.Event,
    clock: Clock,
    interval_ms: int,
) -> None:
    """The thread: a pass every ``interval_ms`` of ``clock``. It holds the manager (and so the log) only
    during a pass: a log dropped without close() is still collected, and the thread then ends."""
    due = clock.monotonic_ms() + interval_ms
    while not stop.is_set():
        left = due - clock.monotonic_ms()
        if left > 0:
            wake.wait(min(left / 1000.0, _MAX_WAIT_S))
            wake.clear()
            if ref() is None:
                return
            continue
        manager = ref()
        if manager is None:
            return
        try:
            manager.run_once()
        except Exception as exc:  # a bug, or the log closed under it: never end the thread
            if stop.is_set():
                log.debug("tiering pass stopped by close: %r", exc)
            else:
                log.warning("tiering pass failed: %r", exc)
        del manager
        due = clock.monotonic_ms() + interval_ms


def confirmed_range(plog: PartitionLog, manifest: PartitionManifest | None) -> tuple[int, int] | None:
    """``(start, end)`` for :meth:`PartitionLog.apply_retention <pylog.partition.log.PartitionLog.apply_retention>`:
    ``start`` is the manifest's first offset, ``end`` the end of the run of local sealed segments from there
    that the manifest names exactly (same base and next offsets, same size). A local segment the manifest
    does not name as it is (the local log was truncated and rewritten after its upload) ends the run: it and
    every later one stay. None when the manifest names no segment."""
    if manifest is None or not manifest.segments:
        return None
    start = manifest.segments[0].base_offset
    named = {s.base_offset: s for s in manifest.segments}
    end = start
    for seg in plog.segments[:-1]:
        if seg.next_offset <= start:
            continue  # below the remote log: the whole-log retention decides
        remote = named.get(seg.base_offset)
        if remote is None or (remote.next_offset, remote.size) != (seg.next_offset, seg.size):
            break
        end = seg.next_offset
    return start, end


def _show(plog: PartitionLog, manifest: PartitionManifest) -> None:
    """Hand a manifest this process just published to the partition's remote reader (it reads it at once)."""
    if isinstance(plog.remote, RemotePartition):
        plog.remote.saw(manifest)


def _range(manifest: PartitionManifest | None) -> tuple[int, int] | None:
    if manifest is None or manifest.log_start_offset is None or manifest.log_end_offset is None:
        return None
    return manifest.log_start_offset, manifest.log_end_offset
