"""Old manifest versions are deleted as new ones are published: a partition's listing stays short, readers and
restore keep seeing the newest, and a failed deletion never fails an upload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import pylog
from pylog.errors import RemoteStorageError
from pylog.tiered import decisions
from pylog.tiered.manifest import KEEP_VERSIONS, listed_versions, partition_prefix, read_manifest
from pylog.tiered.restore import restore
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
