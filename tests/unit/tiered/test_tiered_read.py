"""Consumers reading tiered segments from the object store, on file:// and on a moto S3 server on loopback.

Each test produces records (the model: what the producer's futures acknowledged), uploads the sealed segments
with ``Log.tier()``, deletes the local copies with the tiered local retention, and reads across the
remote/local boundary; or opens the log read-only from the object store alone."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

import pylog
from pylog.clock import ManualClock
from pylog.errors import CorruptRecordError, ReadOnlyLogError, RemoteStorageError
from pylog.structs import TopicPartition
from pylog.tiered import fetch
from pylog.tiered.fetch import RemotePartition
from pylog.tiered.store import ObjectStore

TS0 = 1_700_000_000_000
Model = dict[tuple[int, int], tuple[bytes, bytes, int]]


def _open(tmp_path: Path, remote: tuple[str, dict[str, Any]], **kwargs: Any) -> pylog.Log:
    url, options = remote
    kwargs.setdefault("clock", ManualClock(TS0 + 10_000_000))
    return pylog.open(tmp_path / "log", remote_storage=url, remote_storage_options=options, **kwargs)


def _produce(log: pylog.Log, topic: str, n: int, start: int = 0, **config: Any) -> Model:
    p = log.producer(batch_size=400, value_serializer=None, **config)
    sent = []
    for i in range(start, start + n):
        key, value, ts = b"k%d" % i, b"v%d:" % i + bytes(i % 61), TS0 + i
        sent.append((p.send(topic, value, key=key, timestamp_ms=ts), key, value, ts))
    p.flush()
    model = {}
    for fut, key, value, ts in sent:
        meta = fut.get()
        model[(meta.partition, meta.offset)] = (key, value, ts)
    p.close()
    return model


def _tier_and_drop_local(log: pylog.Log, topic: str) -> dict[int, tuple[int, int]]:
    """Roll, upload, then delete every uploaded local segment (local_retention_bytes=0); returns per
    partition ``(remote start, local start)`` and checks that the local start moved."""
    t = log.topic(topic)
    for p in range(t.num_partitions):
        t.partition(p).roll()
    out = {}
    for r in log.tier():
        m = r.manifest
        assert m.log_start_offset is not None and m.log_end_offset is not None
        plog = t.partition(r.partition)
        plog.apply_retention(remote=(m.log_start_offset, m.log_end_offset))
        out[r.partition] = (m.log_start_offset, plog.local_log_start_offset)
        assert plog.local_log_start_offset == m.log_end_offset > m.log_start_offset
    return out


def _read(log: pylog.Log, topic: str, **config: Any) -> list[Any]:
    c = log.consumer(value_deserializer=None, key_deserializer=None, **config)
    tps = log.topic(topic).partitions()
    c.assign(tps)
    c.seek_to_beginning(*tps)
    got = list(c.iterate(timeout_ms=0))
    c.close()
    return got


def _as_model(records: list[Any]) -> Model:
    return {(r.partition, r.offset): (r.key, r.value, r.timestamp) for r in records}


def _topic(log: pylog.Log, name: str = "t", partitions: int = 2, **config: Any) -> None:
    config.setdefault("segment_bytes", 2048)
    log.create_topic(name, partitions, remote_storage_enable=True, local_retention_bytes=0, **config)


def test_a_consumer_reads_across_the_remote_local_boundary(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    with _open(tmp_path, remote) as log:
        _topic(log)
        model = _produce(log, "t", 900)
        bounds = _tier_and_drop_local(log, "t")
        model.update(_produce(log, "t", 300, start=900))  # local only, after the boundary
        got = _read(log, "t")
        assert _as_model(got) == model
        for p in range(2):
            offsets = [r.offset for r in got if r.partition == p]
            assert offsets == list(range(len(offsets)))  # contiguous, in order, from the remote start 0
            assert bounds[p][0] == 0 < bounds[p][1] < offsets[-1]
        # Topic.read paths: PartitionLog.batches() crosses the boundary too
        plog = log.topic("t").partition(0)
        batches = list(plog.batches())
        assert sum(len(b.offsets) for b in batches) == plog.log_end_offset
        # auto_offset_reset="earliest" starts at the remote log start
        c = log.consumer(value_deserializer=None, key_deserializer=None, auto_offset_reset="earliest")
        c.assign(log.topic("t").partitions())
        assert _as_model(list(c.iterate(timeout_ms=0))) == model
        c.close()


def test_beginning_offsets_and_offsets_for_times_cross_the_boundary(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    with _open(tmp_path, remote) as log:
        _topic(log, partitions=1)
        model = _produce(log, "t", 600)
        bounds = _tier_and_drop_local(log, "t")
        model.update(_produce(log, "t", 200, start=600))
        tp = TopicPartition("t", 0)
        c = log.consumer(value_deserializer=None, key_deserializer=None)
        assert c.beginning_offsets([tp]) == {tp: 0}
        assert c.end_offsets([tp]) == {tp: 800}
        local_start = bounds[0][1]
        by_ts = {ts: off for (_, off), (_, _, ts) in model.items()}
        for ts in (TS0 - 5, TS0, TS0 + 17, TS0 + local_start - 1, TS0 + local_start, TS0 + 799):
            want = min((t, by_ts[t]) for t in by_ts if t >= ts)
            hit = c.offsets_for_times({tp: ts})[tp]
            assert hit is not None and (hit.offset, hit.timestamp) == (want[1], want[0])
        assert c.offsets_for_times({tp: TS0 + 800})[tp] is None
        # a seek to the timestamp's offset in a remote segment reads on into the local ones
        hit = c.offsets_for_times({tp: TS0 + 100})[tp]
        assert hit is not None
        c.assign([tp])
        c.seek(tp, hit.offset)
        assert [r.offset for r in c.iterate(timeout_ms=0)] == list(range(hit.offset, 800))
        c.close()


def test_read_committed_skips_an_aborted_transaction_in_a_remote_segment(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    with _open(tmp_path, remote) as log:
        _topic(log, partitions=1)
        model = _produce(log, "t", 50)
        p = log.producer(transactional_id="tx", value_serializer=None)
        p.init_transactions()
        p.begin_transaction()
        for i in range(40):
            p.send("t", b"aborted-%d" % i, timestamp_ms=TS0)
        p.abort_transaction()
        p.begin_transaction()
        committed = [p.send("t", b"committed-%d" % i, timestamp_ms=TS0) for i in range(30)]
        p.commit_transaction()
        p.close()
        for fut, i in zip(committed, range(30), strict=True):
            meta = fut.get()
            model[(0, meta.offset)] = (b"", b"committed-%d" % i, TS0)
        after = _produce(log, "t", 400, start=1000)
        model.update(after)
        _tier_and_drop_local(log, "t")
        assert log.topic("t").partition(0).local_log_start_offset > max(off for _, off in after) - 400
        got = {
            (r.partition, r.offset): (r.key or b"", r.value, r.timestamp)
            for r in _read(log, "t", isolation_level="read_committed")
        }
        assert got == {k: (v[0] or b"", v[1], v[2]) for k, v in model.items()}
        uncommitted = _read(log, "t")
        assert sum(r.value.startswith(b"aborted-") for r in uncommitted) == 40


def test_a_flipped_bit_in_a_remote_log_object_is_a_corrupt_record_error(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    url, options = remote
    with _open(tmp_path, remote) as log:
        _topic(log, partitions=1)
        _produce(log, "t", 300)
        _tier_and_drop_local(log, "t")
        store = ObjectStore(url, **options)
        seg = log.tier()[0].manifest.segments[1]
        data = bytearray(store.get(seg.key))
        data[len(data) // 2] ^= 0x10  # inside a record: only the batch CRC can tell
        store.put(seg.key, bytes(data))
        tp = TopicPartition("t", 0)
        c = log.consumer(value_deserializer=None, key_deserializer=None)
        c.assign([tp])
        c.seek(tp, 0)
        seen: list[int] = []
        with pytest.raises(CorruptRecordError):
            for r in c.iterate(timeout_ms=0):
                seen.append(r.offset)
        assert seen == list(range(len(seen))) and len(seen) < seg.next_offset  # never a wrong record
        c.close()


def test_a_stopped_store_is_a_remote_storage_error_after_bounded_retries(
    tmp_path: Path, s3_remote: tuple[str, dict[str, Any]]
) -> None:
    url, options = s3_remote
    with _open(tmp_path, s3_remote) as log:
        _topic(log, partitions=1)
        model = _produce(log, "t", 300)
        local_start = _tier_and_drop_local(log, "t")[0][1]
        # the store stops: from now on the log's client reaches a port nothing listens on
        stopped = ObjectStore(url, **{**options, "endpoint": _closed_endpoint()})
        log._remote = stopped
        source = log.topic("t").partition(0).remote
        assert isinstance(source, RemotePartition)
        source.cache.store = stopped
        tp = TopicPartition("t", 0)
        c = log.consumer(value_deserializer=None, key_deserializer=None)
        c.assign([tp])
        c.seek(tp, 0)
        with pytest.raises(RemoteStorageError) as info:
            c.poll(timeout_ms=0)
        assert info.value.retriable
        c.seek(tp, local_start)  # the local segments are still served
        got = _as_model(list(c.iterate(timeout_ms=0)))
        assert got == {k: v for k, v in model.items() if k[1] >= local_start}
        c.close()


def _closed_endpoint() -> str:
    """``http://127.0.0.1:<port>`` of a port that was just free (connections to it are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_the_cache_stays_within_its_bound_and_sequential_reads_prefetch(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    bound = 3000
    with _open(tmp_path, remote, remote_cache_bytes=bound) as log:
        _topic(log, partitions=1, segment_bytes=4096)
        model = _produce(log, "t", 1000)
        _tier_and_drop_local(log, "t")
        source = log.topic("t").partition(0).remote
        assert isinstance(source, RemotePartition)
        cache = source.cache
        cache.block_bytes = 1024  # small blocks, so that the bound is tested with many of them
        c = log.consumer(value_deserializer=None, key_deserializer=None, max_partition_fetch_bytes=1024)
        c.assign([TopicPartition("t", 0)])
        c.seek_to_beginning()
        sizes = []
        got = []
        for r in c.iterate(timeout_ms=0):
            got.append(r)
            sizes.append(cache.size)
        c.close()
        assert _as_model(got) == model
        remote_bytes = sum(s.size for s in source.segments())
        assert remote_bytes > 5 * bound
        assert max(sizes) <= bound and cache.size <= bound
        assert cache.prefetched > 0 and cache.requests > 0


def test_read_only_open_of_the_object_store_serves_consumers_and_refuses_writes(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    url, options = remote
    with _open(tmp_path, remote) as log:
        _topic(log, partitions=2)
        _topic(log, "other", partitions=1)
        model = _produce(log, "t", 700)
        _produce(log, "other", 50)
        for name in ("t", "other"):
            for p in range(log.topic(name).num_partitions):
                log.topic(name).partition(p).roll()
        log.tier()
    with pytest.raises(ReadOnlyLogError):
        pylog.open(url, remote_storage_options=options)
    with pylog.open(url, read_only=True, remote_storage_options=options, clock=ManualClock(TS0)) as ro:
        assert ro.topics() == ["other", "t"]
        assert ro.topic("t").num_partitions == 2
        assert _as_model(_read(ro, "t")) == model
        tps = ro.topic("t").partitions()
        c = ro.consumer(value_deserializer=None, key_deserializer=None)
        ends = {tp: max(off for (p, off) in model if p == tp.partition) + 1 for tp in tps}
        assert c.end_offsets(tps) == ends
        assert c.beginning_offsets(tps) == dict.fromkeys(tps, 0)
        hit = c.offsets_for_times({tps[0]: TS0 + 350})[tps[0]]
        want = min((ts, off) for (p, off), (_, _, ts) in model.items() if p == 0 and ts >= TS0 + 350)
        assert hit is not None and (hit.timestamp, hit.offset) == want
        c.close()
        with pytest.raises(ReadOnlyLogError):
            ro.producer()
        with pytest.raises(ReadOnlyLogError):
            ro.create_topic("new")
        with pytest.raises(ReadOnlyLogError):
            ro.tier()
        with pytest.raises(ReadOnlyLogError):
            ro.consumer("t", group_id="g")
        committed = ro.consumer(
            isolation_level="read_committed", value_deserializer=None, key_deserializer=None
        )
        committed.assign(tps)  # read with the decisions tiered with the log (no transaction here)
        committed.seek_to_beginning()
        assert _as_model(list(committed.iterate(timeout_ms=0))) == model
        committed.close()


def test_read_only_still_opens_a_local_directory(tmp_path: Path, remote: tuple[str, dict[str, Any]]) -> None:
    url, options = remote
    with _open(tmp_path, remote) as log:
        _topic(log, partitions=1)
        model = _produce(log, "t", 200)
        _tier_and_drop_local(log, "t")
        model.update(_produce(log, "t", 100, start=200))
    with pylog.open(
        tmp_path / "log", read_only=True, remote_storage=url, remote_storage_options=options
    ) as ro:
        assert ro.topic("t").partition(0).local_log_start_offset > 0
        assert _as_model(_read(ro, "t")) == model  # the tiered segments from the store, the rest local
        with pytest.raises(ReadOnlyLogError):
            ro.producer()


def test_a_read_only_replica_sees_new_uploads_once_its_manifest_is_read_again(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    url, options = remote
    clock = ManualClock(TS0)
    with _open(tmp_path, remote) as log:
        _topic(log, partitions=1)
        first = _produce(log, "t", 200)
        _tier_and_drop_local(log, "t")
        with pylog.open(url, read_only=True, remote_storage_options=options, clock=clock) as ro:
            tp = TopicPartition("t", 0)
            c = ro.consumer(value_deserializer=None, key_deserializer=None)
            c.assign([tp])
            c.seek_to_beginning(tp)
            got = _as_model(list(c.iterate(timeout_ms=0)))
            assert got == first
            more = _produce(log, "t", 150, start=200)
            _tier_and_drop_local(log, "t")
            assert c.end_offsets([tp]) == {tp: 200}  # the manifest read a moment ago still holds
            clock.advance(1000)  # the manifest is read again after a second of the clock
            assert c.end_offsets([tp]) == {tp: 350}
            got.update(_as_model(list(c.iterate(timeout_ms=0))))
            assert got == first | more
            c.close()


def test_a_caught_up_replica_consumer_reads_the_manifest_once_a_second_not_once_a_poll(
    tmp_path: Path, remote: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, options = remote
    clock = ManualClock(TS0)
    reads: list[tuple[str, int]] = []
    real = fetch.read_manifest

    def counted(store: Any, topic: str, partition: int, **kwargs: Any) -> Any:
        reads.append((topic, partition))
        return real(store, topic, partition, **kwargs)

    monkeypatch.setattr(fetch, "read_manifest", counted)
    with _open(tmp_path, remote) as log:
        _topic(log, partitions=2)
        first = _produce(log, "t", 200)
        _tier_and_drop_local(log, "t")
        with pylog.open(url, read_only=True, remote_storage_options=options, clock=clock) as ro:
            c = ro.consumer(value_deserializer=None, key_deserializer=None)
            tps = ro.topic("t").partitions()
            c.assign(tps)
            c.seek_to_beginning(*tps)
            got = _as_model(list(c.iterate(timeout_ms=0)))
            assert got == first
            reads.clear()
            for _ in range(50):  # caught up: no new record, and no manifest read within the second
                assert c.poll(timeout_ms=0) == {}
            assert reads == []
            more = _produce(log, "t", 100, start=200)
            _tier_and_drop_local(log, "t")
            assert c.poll(timeout_ms=0) == {} and reads == []  # uploaded, not seen before the second passes
            clock.advance(1000)
            got.update(_as_model(list(c.iterate(timeout_ms=0))))
            assert got == first | more
            assert sorted(reads) == [("t", 0), ("t", 1)]  # one read per partition for the new second
            c.close()


def test_a_damaged_remote_index_is_not_used_and_reads_stay_correct(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    url, options = remote
    with _open(tmp_path, remote) as log:
        _topic(log, partitions=1, segment_bytes=8192)
        model = _produce(log, "t", 400)
        _tier_and_drop_local(log, "t")
        store = ObjectStore(url, **options)
        seg = log.tier()[0].manifest.segments[0]
        assert seg.index is not None and seg.index.size >= 16
        raw = bytearray(store.get(seg.index.key))
        raw[12:16] = (seg.size - 100).to_bytes(4, "little")  # the second entry points into the wrong place
        store.put(seg.index.key, bytes(raw))
        tp = TopicPartition("t", 0)
        c = log.consumer(value_deserializer=None, key_deserializer=None)
        c.assign([tp])
        for start in (0, seg.next_offset // 2, seg.next_offset - 1):
            c.seek(tp, start)
            got = _as_model(list(c.iterate(timeout_ms=0)))
            assert got == {k: v for k, v in model.items() if k[1] >= start}
        c.close()


def test_an_index_entry_that_points_elsewhere_falls_back_to_the_first_batch(tmp_path: Path) -> None:
    """The partition layer alone, over a source whose index was not caught by a CRC (a wrong entry)."""
    import numpy as np

    from pylog.partition import remote as remote_read
    from pylog.partition.index import OFFSET_ENTRY, TIME_ENTRY
    from pylog.record import decode_batch

    with pylog.open(tmp_path / "log", clock=ManualClock(TS0)) as log:
        log.create_topic("t", 1, segment_bytes=1 << 20)
        model = _produce(log, "t", 300)
        plog = log.topic("t").partition(0)
        plog.roll()
        seg = plog.segments[0]
        data = bytes(seg.view())
        end = seg.next_offset

    class Seg:
        base_offset, next_offset, size, max_timestamp, key = 0, end, len(data), TS0 + 299, "t/0/seg.log"

    class Source:
        standalone = False
        entries = np.array([(0, 0), (100, len(data) - 200)], dtype=OFFSET_ENTRY)  # the 2nd is wrong

        def segments(self, *, refresh: bool = False) -> list[Seg]:
            return [Seg()]

        def read(self, segment: Seg, start: int, length: int) -> bytes:
            return data[start : start + length]

        def offset_index(self, segment: Seg) -> Any:
            return self.entries

        def time_index(self, segment: Seg) -> Any:
            return np.empty(0, dtype=TIME_ENTRY)

    for start in (0, 150, 299):
        found = remote_read.read_raw(Source(), start, 1 << 20)
        assert found is not None
        batches, nxt = found
        offsets = [int(o) for buf, at in batches for o in decode_batch(buf, at).offsets]
        assert offsets[0] <= start and offsets[-1] == 299 and nxt == 300
        assert offsets == list(range(offsets[0], 300))
    assert remote_read.read_raw(Source(), 300, 1 << 20) is None
    assert remote_read.offset_for_time(Source(), TS0 + 123) == (123, model[(0, 123)][2])


def test_a_remote_segment_deleted_under_a_reader_is_out_of_range_and_earliest_moves_on(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    from pylog.errors import OffsetOutOfRangeError
    from pylog.tiered.manifest import PartitionManifest, publish_manifest, read_manifest

    url, options = remote
    with _open(tmp_path, remote) as log:
        _topic(log, partitions=1)
        model = _produce(log, "t", 300)
        _tier_and_drop_local(log, "t")
    tp = TopicPartition("t", 0)
    with pylog.open(url, read_only=True, remote_storage_options=options, clock=ManualClock(TS0)) as ro:
        c = ro.consumer(value_deserializer=None, key_deserializer=None, auto_offset_reset="earliest")
        c.assign([tp])
        assert c.beginning_offsets([tp]) == {tp: 0}  # the reader holds the manifest now
        # remote retention, as another process does it: a new manifest without the first segment, then
        # the segment's objects deleted
        store = ObjectStore(url, **options)
        m, highest = read_manifest(store, "t", 0)
        assert m is not None
        dropped = m.segments[0]
        kept = PartitionManifest(m.topic, m.partition, m.partitions, m.config, m.segments[1:])
        assert publish_manifest(store, kept, highest + 1) is not None
        store.delete(dropped.key)
        c.seek(tp, 0)
        got = _as_model(list(c.iterate(timeout_ms=0)))
        assert got == {
            k: v for k, v in model.items() if dropped.next_offset <= k[1] < m.segments[-1].next_offset
        }
        assert c.beginning_offsets([tp]) == {tp: dropped.next_offset}
        none = ro.consumer(value_deserializer=None, auto_offset_reset="none")
        none.assign([tp])
        none.seek(tp, 0)
        with pytest.raises(OffsetOutOfRangeError):
            none.poll(timeout_ms=0)
        none.close()
        c.close()
