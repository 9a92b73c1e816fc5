"""Old manifest versions are deleted as new ones are published: a partition's listing stays short, readers and
restore keep seeing the newest, and a failed deletion never fails an upload."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import pylog
from pylog.errors import RemoteStorageError
from pylog.tiered import decisions
from pylog.tiered.manifest import (
    KEEP_VERSIONS,
    PartitionManifest,
    decode_fence,
    fence_key,
    listed_versions,
    manifest_key,
    partition_prefix,
    publish_manifest,
    read_manifest,
)
from pylog.tiered.restore import restore
from pylog.tiered.retention import delete_remote_topic
from pylog.tiered.store import ObjectStore


def _tier_rounds(log: pylog.Log, rounds: int) -> list[int]:
    """Produce, roll and tier ``rounds`` times (a committed transaction each round too); the versions published."""
    producer = log.producer(value_serializer=None)
    tx = log.producer(transactional_id="tx", value_serializer=None)
    tx.init_transactions()
    published = []
    for r in range(rounds):
        for i in range(5):
            producer.send("t", b"%d-%d" % (r, i), partition=0)
        producer.flush()
        tx.begin_transaction()
        tx.send("t", b"tx-%d" % r, partition=0)
        tx.commit_transaction()
        log.topic("t").partition(0).roll()
        (result,) = log.tier()
        published.append(result.manifest.version)
    producer.close()
    tx.close()
    return published


def test_a_publish_keeps_only_the_newest_versions_and_readers_see_everything(tmp_path: Path) -> None:
    url = (tmp_path / "remote").as_uri()
    rounds = KEEP_VERSIONS * 3
    with pylog.open(tmp_path / "log", remote_storage=url, remote_log_manager_task_interval_ms=-1) as log:
        log.create_topic("t", 1, remote_storage_enable=True)
        published = _tier_rounds(log, rounds)
        end = log.topic("t").partition(0).log_end_offset  # every segment sealed and tiered
    assert published == sorted(published) and len(set(published)) == rounds
    store = ObjectStore(url)
    left = listed_versions(store, f"{partition_prefix('t', 0)}manifest/")
    assert left == list(range(published[-1] - KEEP_VERSIONS + 1, published[-1] + 1))
    kept_decisions = listed_versions(store, f"{decisions.PREFIX}manifest/")
    assert 0 < len(kept_decisions) <= KEEP_VERSIONS
    manifest, highest = read_manifest(store, "t", 0)
    assert manifest is not None and (manifest.version, highest) == (published[-1], published[-1])
    assert manifest.log_end_offset == end == rounds * 6
    ends = restore(url, tmp_path / "restored")
    assert ends[pylog.TopicPartition("t", 0)].log_end_offset == end
    with pylog.open(tmp_path / "restored", read_only=True) as restored:
        c = restored.consumer(isolation_level="read_committed", value_deserializer=None)
        c.assign([pylog.TopicPartition("t", 0)])
        c.seek_to_beginning()
        values = sorted(r.value for r in c.iterate(timeout_ms=0))
        c.close()
    assert values == sorted(
        [b"%d-%d" % (r, i) for r in range(rounds) for i in range(5)] + [b"tx-%d" % r for r in range(rounds)]
    )


def test_a_failed_deletion_of_old_versions_does_not_fail_the_upload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url = (tmp_path / "remote").as_uri()

    real = ObjectStore.delete_many

    def refuse(self: Any, keys: Any) -> None:
        if any("/manifest/" in key for key in keys):
            raise RemoteStorageError("delete refused", key=str(keys[0]))
        real(self, keys)

    with pylog.open(tmp_path / "log", remote_storage=url, remote_log_manager_task_interval_ms=-1) as log:
        log.create_topic("t", 1, remote_storage_enable=True)
        monkeypatch.setattr(ObjectStore, "delete_many", refuse)
        published = _tier_rounds(log, KEEP_VERSIONS + 2)
        prefix = f"{partition_prefix('t', 0)}manifest/"
        assert listed_versions(ObjectStore(url), prefix) == list(
            range(1, published[-1] + 1)
        )  # nothing deleted
        assert "could not delete old manifest versions" in caplog.text
        monkeypatch.undo()
        published += _tier_rounds(log, 1)  # the next publish deletes what was left
    assert listed_versions(ObjectStore(url), prefix)[0] == published[-1] - KEEP_VERSIONS + 1


# -- a version number is published once, whatever was deleted --------------------------------------------------


def _draft(writer: str) -> PartitionManifest:
    return PartitionManifest("t", 0, 1, {"writer": writer})


def test_a_deleted_version_number_is_never_published_again(remote: tuple[str, dict[str, Any]]) -> None:
    """A writer that lags behind tries every version the others published and deleted: each is refused, the
    objects it made are gone, and the newest manifest is untouched (partition and decisions manifests)."""
    url, options = remote
    store = ObjectStore(url, **options)
    top = KEEP_VERSIONS + 4
    for v in range(1, top + 1):
        assert publish_manifest(store, _draft("first"), v) is not None
    prefix = f"{partition_prefix('t', 0)}manifest/"
    kept = list(range(top - KEEP_VERSIONS + 1, top + 1))
    assert listed_versions(store, prefix) == kept
    for v in range(1, top + 1):  # deleted ones and present ones alike
        assert publish_manifest(store, _draft("lagging"), v) is None, v
    assert listed_versions(store, prefix) == kept  # what the lagging writer made was withdrawn
    assert read_manifest(store, "t", 0) == (replace(_draft("first"), version=top), top)
    for v in range(1, top - KEEP_VERSIONS + 1):
        assert decode_fence(store.get(fence_key(prefix, v)))[0] == v

    first = decisions.DecisionsManifest(0, 0)
    for v in range(1, top + 1):
        assert decisions.publish_manifest(store, first, v) is not None
    lagging = decisions.DecisionsManifest(0, 0, producers={"next_pid": 7, "ids": {}})
    for v in range(1, top + 1):
        assert decisions.publish_manifest(store, lagging, v) is None, v
    assert listed_versions(store, f"{decisions.PREFIX}manifest/") == kept
    assert decisions.read_manifest(store) == (replace(first, version=top), top)


def test_a_version_deleted_by_a_topic_deletion_is_never_published_again(
    remote: tuple[str, dict[str, Any]],
) -> None:
    url, options = remote
    store = ObjectStore(url, **options)
    for v in (1, 2, 3):
        assert publish_manifest(store, _draft("first"), v) is not None
    result = delete_remote_topic(store, "t")
    assert result.tombstoned == (0,)
    for v in (1, 2, 3):  # a writer that read the versions before the deletion
        assert publish_manifest(store, _draft("lagging"), v) is None, v
    assert listed_versions(store, f"{partition_prefix('t', 0)}manifest/") == [4]  # only the tombstone
    assert publish_manifest(store, _draft("again"), 5) is not None  # a topic created again goes on above


class _OthersGoOn(ObjectStore):
    """After this writer creates manifest version ``at``, another writer (another store object) publishes
    ``KEEP_VERSIONS + 1`` versions above it, deleting (and fencing) this writer's version before it lists."""

    def __init__(self, url: str, options: dict[str, Any], at: int) -> None:
        super().__init__(url, **options)
        self.other, self.at = ObjectStore(url, **options), at

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> Any:
        written = super().put(key, data, if_absent=if_absent)
        if written and key == manifest_key("t", 0, self.at):
            for v in range(self.at + 1, self.at + KEEP_VERSIONS + 2):
                assert publish_manifest(self.other, _draft("other"), v) is not None
        return written


def test_a_version_deleted_by_others_right_after_its_publish_was_published(
    remote: tuple[str, dict[str, Any]],
) -> None:
    """The fence the other writer wrote names this writer's object: the publish counts (no false loss)."""
    url, options = remote
    store = _OthersGoOn(url, options, 1)
    assert publish_manifest(store, _draft("slow"), 1) == replace(_draft("slow"), version=1)
    prefix = f"{partition_prefix('t', 0)}manifest/"
    assert 1 not in listed_versions(store, prefix)  # deleted by the other writer, fenced first
    assert store.get_if_exists(fence_key(prefix, 1)) is not None
    assert publish_manifest(ObjectStore(url, **options), _draft("lagging"), 1) is None


def test_a_publish_whose_listing_fails_asks_the_fence(
    remote: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, options = remote
    store = ObjectStore(url, **options)
    for v in range(1, KEEP_VERSIONS + 3):
        assert publish_manifest(store, _draft("first"), v) is not None

    def refuse(self: Any, prefix: str = "") -> Any:
        raise RemoteStorageError("list refused", key=prefix)

    monkeypatch.setattr(ObjectStore, "list", refuse)
    assert publish_manifest(store, _draft("lagging"), 1) is None  # fenced
    assert publish_manifest(store, _draft("next"), KEEP_VERSIONS + 3) is not None  # never used: no fence
    monkeypatch.undo()
    assert read_manifest(store, "t", 0)[1] == KEEP_VERSIONS + 3
