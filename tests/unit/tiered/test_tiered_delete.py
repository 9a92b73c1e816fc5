"""Deleting a tiered topic deletes its remote data: a tombstone manifest per partition first, then the objects
the manifests named and pylog's pattern objects, then the older manifest versions. Readers (a log opened
read-only from the store, restore, remote_topics) no longer see the topic; a topic created again with the same
name tiers above the tombstone and shows only its own records; a store that is down at delete time, or a crash
between the phases, is finished by a later pass.

Checked against models: the records each topic was sent (what the producer's futures acknowledged) against
what a restore of the store holds, and the store's keys against the manifests' names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from store_faults import ALL, FaultyStore

import pylog
from pylog.clock import ManualClock
from pylog.errors import CorruptRecordError, RemoteStorageError
from pylog.structs import TopicPartition
from pylog.tiered.manifest import (
    decode_manifest,
    encode_manifest,
    fence_key,
    manifest_key,
    read_manifest,
    remote_topics,
)
from pylog.tiered.restore import restore
from pylog.tiered.retention import (
    PENDING_FILE,
    add_pending_deletion,
    delete_remote_topic,
    pending_deletions,
)
from pylog.tiered.store import ObjectStore

Model = dict[tuple[int, int], bytes]


def _open(root: Path, remote: tuple[str, dict[str, Any]]) -> pylog.Log:
    url, options = remote
    return pylog.open(
        root,
        clock=ManualClock(),
        remote_storage=url,
        remote_storage_options=options,
        remote_log_manager_task_interval_ms=-1,
    )


def _create(log: pylog.Log, topic: str, partitions: int) -> None:
    log.create_topic(topic, partitions, segment_bytes=1024, remote_storage_enable=True)


def _tiered_store(tmp_path: Path, remote: tuple[str, dict[str, Any]], n: int) -> ObjectStore:
    """The store after a log tiered ``n`` records of a topic ``t`` of 2 partitions (the log closed)."""
    with _open(tmp_path / "log", remote) as log:
        _create(log, "t", 2)
        _produce(log, "t", n, b"v")
        log.tier()
    return _store(remote)


def _produce(log: pylog.Log, topic: str, n: int, tag: bytes) -> Model:
    p = log.producer(batch_size=200, value_serializer=None)
    futs = [(p.send(topic, tag + b"-%d" % i, partition=i % 2), i) for i in range(n)]
    p.flush()
    p.close()
    out = {}
    for fut, i in futs:
        meta = fut.get()
        out[(meta.partition, meta.offset)] = tag + b"-%d" % i
    for part in range(2):
        log.topic(topic).partition(part).roll()
    return out


def _restored(remote: tuple[str, dict[str, Any]], target: Path) -> dict[str, Model]:
    """Every record of the store, per topic, through a full restore (CRCs, manifests, Log.verify())."""
    url, options = remote
    restore(url, target, remote_storage_options=options)
    out: dict[str, Model] = {}
    with pylog.open(target, clock=ManualClock()) as log:
        for name in log.topics():
            c = log.consumer(value_deserializer=None)
            tps = log.topic(name).partitions()
            c.assign(tps)
            c.seek_to_beginning(*tps)
            out[name] = {(r.partition, r.offset): r.value for r in c.iterate(timeout_ms=0)}
            c.close()
    return out


def _store(remote: tuple[str, dict[str, Any]]) -> ObjectStore:
    return ObjectStore(remote[0], **remote[1])


def _keys(store: ObjectStore, prefix: str) -> set[str]:
    return {info.key for info in store.list(prefix)}


def _tombstones(store: ObjectStore, topic: str, partitions: int) -> set[str]:
    """The keys of the tombstones of ``topic``, checked to be tombstones, and of the fences of every version
    below them (each deleted version's number stays taken)."""
    keys = set()
    for p in range(partitions):
        manifest, highest = read_manifest(store, topic, p, tombstones=True)
        assert manifest is not None and manifest.deleted and manifest.segments == ()
        assert manifest.version == highest
        assert read_manifest(store, topic, p) == (None, highest)
        keys.add(manifest_key(topic, p, manifest.version))
        keys.update(fence_key(f"{topic}/{p}/manifest/", v) for v in range(1, manifest.version))
    return keys


def test_deleting_a_tiered_topic_deletes_its_remote_data_and_a_new_topic_of_its_name_starts_clean(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    with _open(tmp_path / "log", remote) as log:
        _create(log, "t", 2)
        _create(log, "u", 2)
        _produce(log, "t", 300, b"old")
        kept = _produce(log, "u", 200, b"u")
        log.tier()
        store = _store(remote)
        before_u = _keys(store, "u/")
        old_t = _keys(store, "t/")
        assert any("/segments/" in k for k in old_t)
        versions = {p: read_manifest(store, "t", p)[1] for p in range(2)}

        log.delete_topic("t")

        # only the tombstones are left of t; u is untouched; nothing is pending
        assert _keys(store, "t/") == _tombstones(store, "t", 2)
        assert {p: read_manifest(store, "t", p, tombstones=True)[1] for p in range(2)} == {
            p: v + 1 for p, v in versions.items()
        }
        assert _keys(store, "u/") == before_u
        assert pending_deletions(str(tmp_path / "log")) == {}
        assert not (tmp_path / "log" / PENDING_FILE).exists()
        assert sorted(remote_topics(store)["topics"]) == ["u"]
        assert not any(s.topic == "t" for s in log.tier_status())
        with pylog.open(remote[0], read_only=True, remote_storage_options=remote[1]) as ro:
            assert ro.topics() == ["u"]
        assert _restored(remote, tmp_path / "r1") == {"u": kept}

        # the same name again: its manifests go above the tombstones, and only its records are seen
        _create(log, "t", 2)
        fresh = _produce(log, "t", 120, b"new")
        results = [r for r in log.tier() if r.topic == "t"]
        assert all(r.manifest.version == versions[r.partition] + 2 for r in results)
        assert all(r.uploaded for r in results)
    assert _restored(remote, tmp_path / "r2") == {"t": fresh, "u": kept}


def test_with_the_store_down_the_local_delete_proceeds_and_a_later_pass_deletes_the_remote_data(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    url, options = remote
    with _open(tmp_path / "log", remote) as log:
        flaky = FaultyStore(url, down=frozenset(), **options)
        log._remote = flaky  # the log's store: its operations fail while flaky.down names them
        _create(log, "t", 2)
        _produce(log, "t", 200, b"old")
        log.tier()
        flaky.down = ALL
        log.delete_topic("t")
        assert log.topics() == []
        assert "t" in pending_deletions(str(tmp_path / "log"))
        status = log.tier_status()
        assert status[TopicPartition("t", 0)].failures == 1
        assert "deleting the remote data of the deleted topic" in (
            status[TopicPartition("t", 0)].last_error or ""
        )

        # created again while the store is down: nothing of it is tiered, nor merged into the old manifests
        _create(log, "t", 2)
        fresh = _produce(log, "t", 100, b"new")
        with pytest.raises(RemoteStorageError):
            log.tier()
        flaky.down = frozenset({"delete"})  # reachable but deletes fail: phase 1 only
        log.remote_log_manager.run_once()  # type: ignore[union-attr]
        store = _store(remote)
        assert "t" not in remote_topics(store)["topics"]  # tombstoned: readers skip it already
        assert any("/segments/" in k for k in _keys(store, "t/"))  # its objects are still there
        assert "t" in pending_deletions(str(tmp_path / "log"))

        flaky.down = frozenset()
        log.remote_log_manager.run_once()  # type: ignore[union-attr]
        assert pending_deletions(str(tmp_path / "log")) == {}
        status = log.tier_status()
        assert status[TopicPartition("t", 0)].last_error is None
        for p in range(2):
            manifest, _ = read_manifest(store, "t", p)
            assert manifest is not None and manifest.segments
            named = {k for s in manifest.segments for k in (s.key, s.index and s.index.key) if k}
            segments = {k for k in _keys(store, f"t/{p}/segments/")}
            assert named <= segments
            assert len(segments) == 3 * len(manifest.segments)  # no object of the old topic is left
    assert _restored(remote, tmp_path / "r") == {"t": fresh}


def test_a_deletion_recorded_before_a_local_delete_that_never_committed_deletes_nothing(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    root = tmp_path / "log"
    with _open(root, remote) as log:
        _create(log, "t", 2)
        model = _produce(log, "t", 150, b"v")
        log.tier()
        # a crash right after the record was written, before the local delete committed
        add_pending_deletion(str(root), "t", log.topic("t").topic_id)
        before = _keys(_store(remote), "t/")
        log.remote_log_manager.run_once()  # type: ignore[union-attr]
        assert pending_deletions(str(root)) == {}
        assert _keys(_store(remote), "t/") >= before
    assert _restored(remote, tmp_path / "r") == {"t": model}


def test_only_pylog_keys_are_deleted_and_a_second_deletion_is_a_no_op(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    store = _tiered_store(tmp_path, remote, 150)
    foreign = {
        "t/0/segments/notes.txt",
        "t/0/segments/00000000000000000000-XYZ.log",
        "t/0/other",
        "t/x/manifest/1",
    }
    for key in foreign:
        store.put(key, b"not pylog's")
    orphan = "t/1/segments/00000000000000099999-0123456789abcdef.log"  # a crashed upload's object
    store.put(orphan, b"partial")
    result = delete_remote_topic(store, "t")
    assert result.tombstoned == (0, 1)
    assert orphan in result.deleted
    assert _keys(store, "t/") == foreign | _tombstones(store, "t", 2)
    again = delete_remote_topic(store, "t")
    assert (again.tombstoned, again.deleted) == ((), ())


def test_a_tombstone_round_trips_and_an_ordinary_manifest_has_no_deleted_field(tmp_path: Path) -> None:
    store = ObjectStore((tmp_path / "s").as_uri())
    with _open(tmp_path / "log", ((tmp_path / "s").as_uri(), {})) as log:
        log.create_topic("t", 1, remote_storage_enable=True)
        log.tier()
    manifest, _ = read_manifest(store, "t", 0)
    assert manifest is not None and not manifest.deleted
    raw = store.get(manifest_key("t", 0, manifest.version))
    assert b'"deleted"' not in raw
    assert encode_manifest(decode_manifest(raw)) == raw
    delete_remote_topic(store, "t")
    tomb, _ = read_manifest(store, "t", 0, tombstones=True)
    assert tomb is not None and tomb.deleted and tomb.version == manifest.version + 1
    raw = store.get(manifest_key("t", 0, tomb.version))
    assert b'"deleted":true' in raw
    assert decode_manifest(raw) == tomb
    assert (tomb.config, tomb.partitions) == (manifest.config, manifest.partitions)


def test_a_pending_deletion_file_is_pylog_s_own_and_is_checked(
    tmp_path: Path, recwarn: pytest.WarningsRecorder
) -> None:
    root = tmp_path / "log"
    with _open(root, ((tmp_path / "s").as_uri(), {})) as log:
        log.create_topic("t", 1, remote_storage_enable=True)
        add_pending_deletion(str(root), "gone", "0123456789abcdef")
        assert pending_deletions(str(root)) == {"gone": "0123456789abcdef"}
    with _open(root, ((tmp_path / "s").as_uri(), {})):
        pass
    assert not [w for w in recwarn if "did not create" in str(w.message)]  # no UnknownEntryWarning
    raw = (root / PENDING_FILE).read_bytes()
    (root / PENDING_FILE).write_bytes(raw[:-3] + b"X" + raw[-2:])
    with pytest.raises(CorruptRecordError):
        pending_deletions(str(root))


def test_a_topic_created_again_with_fewer_partitions_is_listed_with_its_own_count(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    with _open(tmp_path / "log", remote) as log:
        _create(log, "t", 3)
        log.tier()
        log.delete_topic("t")
        _create(log, "t", 1)
        _create(log, "u", 1)
        log.tier()
    store = _store(remote)
    topics = remote_topics(store)["topics"]
    assert {name: meta["partitions"] for name, meta in topics.items()} == {"t": 1, "u": 1}
    with pylog.open(remote[0], read_only=True, remote_storage_options=remote[1]) as ro:
        assert ro.topic("t").num_partitions == 1


def test_a_deletion_that_stopped_after_the_first_tombstone_hides_the_topic_and_is_finished_later(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    from pylog.tiered.retention import _tombstone

    store = _tiered_store(tmp_path, remote, 200)
    segments = {k for k in _keys(store, "t/") if "/segments/" in k}
    _tombstone(store, "t", 0)  # a crash right after the first partition's tombstone
    assert remote_topics(store)["topics"] == {}
    with pylog.open(remote[0], read_only=True, remote_storage_options=remote[1]) as ro:
        assert ro.topics() == []
    assert {k for k in _keys(store, "t/") if "/segments/" in k} == segments  # nothing deleted yet
    result = delete_remote_topic(store, "t")
    assert result.tombstoned == (1,)
    assert segments <= set(result.deleted)
    assert _keys(store, "t/") == _tombstones(store, "t", 2)


def test_delete_many_removes_every_key_and_ignores_one_already_gone(
    remote: tuple[str, dict[str, Any]],
) -> None:
    store = _store(remote)
    keys = [f"d/{i}/x" for i in range(5)]
    for key in keys:
        store.put(key, b"x")
    store.put("d/kept", b"y")
    store.delete_many([keys[0], "d/never-there", *keys[1:]])
    assert [o.key for o in store.list("d/")] == ["d/kept"]
    store.delete_many([])
    assert [o.key for o in store.list("d/")] == ["d/kept"]
