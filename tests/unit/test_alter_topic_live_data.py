"""Changing a topic's config while it holds data: every acknowledged record stays readable with its offset,
key, value, timestamp and headers, in this process and after a reopen (clean, and unclean), ``verify()``
reports nothing, ``pylog.repair`` drops nothing, committed group offsets stay valid, new appends follow the
new config as Kafka applies it, and a refused change leaves the manifest as it was.

Each test keeps a model of what was acknowledged, ``(partition, offset) -> (key, value, timestamp,
timestamp_type, headers)``, and compares the whole topic against it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

import pylog
from pylog.clock import ManualClock
from pylog.errors import ConfigError, InvalidRecordError, RecordTooLargeError
from pylog.partitioner import partition_for_key
from pylog.structs import TopicPartition

Row = tuple[bytes | None, bytes | None, int, int, tuple[tuple[str, bytes], ...]]
Model = dict[tuple[int, int], Row]

T0 = 1_700_000_000_000
CREATE_TIME, LOG_APPEND_TIME = 0, 1
MARKER = ".clean-shutdown"


def _send(
    log: pylog.Log,
    topic: str,
    rows: Iterable[tuple[bytes | None, bytes, int]],
    *,
    append_time: int | None = None,
    **config: Any,
) -> Model:
    """Send ``(key, value, timestamp)`` rows with a header each; the model of what was acknowledged. With
    ``append_time`` the topic stamps records itself (LogAppendTime) and the model expects that timestamp."""
    p = log.producer(value_serializer=None, key_serializer=None, **config)
    sent = []
    for key, value, ts in rows:
        headers = [("h", value[:3])]
        sent.append(
            (p.send(topic, value, key=key, timestamp_ms=ts, headers=headers), key, value, ts, headers)
        )
    p.flush()
    model: Model = {}
    for fut, key, value, ts, headers in sent:
        meta = fut.get()
        ts_type, stamp = (CREATE_TIME, ts) if append_time is None else (LOG_APPEND_TIME, append_time)
        assert meta.timestamp == stamp
        model[(meta.partition, meta.offset)] = (key, value, stamp, ts_type, tuple(headers))
    p.close()
    return model


def _rows(start: int, n: int, *, keyed: bool = True, size: int = 40) -> list[tuple[bytes | None, bytes, int]]:
    return [
        (b"k%d" % (i % 7) if keyed else None, (b"v%06d" % i).ljust(size, b"."), T0 + i)
        for i in range(start, start + n)
    ]


def _read(log: pylog.Log, topic: str) -> Model:
    c = log.consumer(value_deserializer=None, key_deserializer=None)
    tps = log.topic(topic).partitions()
    c.assign(tps)
    c.seek_to_beginning(*tps)
    got: Model = {
        (r.partition, r.offset): (r.key, r.value, r.timestamp, r.timestamp_type, tuple(r.headers))
        for r in c.iterate(timeout_ms=0)
    }
    c.close()
    return got


def _check_reopened(root: Path, topic: str, model: Model, *, unclean: bool, **open_args: Any) -> None:
    """Reopen ``root`` (after removing the clean-shutdown marker when ``unclean``): the topic reads back as
    ``model``, verify() finds nothing, and repair() then drops nothing."""
    if unclean:
        (root / MARKER).unlink()
    with pylog.open(root, **open_args) as log:
        assert _read(log, topic) == model
        assert log.verify() == {}
    assert pylog.repair(root) == {}
    with pylog.open(root, **open_args) as log:
        assert _read(log, topic) == model


def _manifest(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.glob("manifest*")))


# -- message_timestamp_type ------------------------------------------------------------------------------


@pytest.mark.parametrize("unclean", [False, True])
@pytest.mark.parametrize("before,after", [("CreateTime", "LogAppendTime"), ("LogAppendTime", "CreateTime")])
def test_a_timestamp_type_change_stamps_only_new_records(
    tmp_path: Path, before: str, after: str, unclean: bool
) -> None:
    root = tmp_path / "log"
    clock = ManualClock(T0 + 10_000)
    with pylog.open(root, clock=clock) as log:
        log.create_topic("t", 2, segment_bytes=4096, message_timestamp_type=before)
        stamp = clock.time_ms() if before == "LogAppendTime" else None
        model = _send(log, "t", _rows(0, 150), append_time=stamp)
        log.alter_topic("t", message_timestamp_type=after)
        clock.advance(5_000)
        stamp = clock.time_ms() if after == "LogAppendTime" else None
        model |= _send(log, "t", _rows(150, 150), append_time=stamp)
        assert _read(log, "t") == model
    _check_reopened(root, "t", model, unclean=unclean, clock=clock)


# -- max_message_bytes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("unclean", [False, True])
def test_max_message_bytes_lowered_below_stored_batches_keeps_them_readable(
    tmp_path: Path, unclean: bool
) -> None:
    root = tmp_path / "log"
    with pylog.open(root) as log:
        log.create_topic("t", 1, segment_bytes=1 << 20)
        model = _send(log, "t", _rows(0, 20, size=3000), linger_ms=5, batch_size=64 << 10)
        biggest = max(len(v[1] or b"") for v in model.values())
        log.alter_topic("t", max_message_bytes=1024)
        with pytest.raises(RecordTooLargeError):
            _send(log, "t", _rows(20, 1, size=biggest))
        assert _read(log, "t") == model  # the refusal wrote nothing
        model |= _send(log, "t", _rows(21, 10, size=100))
        assert _read(log, "t") == model
    _check_reopened(root, "t", model, unclean=unclean)


# -- compression_type, index_interval_bytes, segment_bytes ---------------------------------------------------


@pytest.mark.parametrize("unclean", [False, True])
def test_compression_and_index_interval_changes_keep_old_batches_readable(
    tmp_path: Path, unclean: bool
) -> None:
    root = tmp_path / "log"
    with pylog.open(root) as log:
        log.create_topic("t", 1, segment_bytes=8192, index_interval_bytes=128)
        model = _send(log, "t", _rows(0, 200))
        log.alter_topic("t", compression_type="gzip", index_interval_bytes=0)
        model |= _send(log, "t", _rows(200, 200), linger_ms=5)
        log.alter_topic("t", compression_type="zstd", index_interval_bytes=100_000)
        model |= _send(log, "t", _rows(400, 200), linger_ms=5)
        assert _read(log, "t") == model
        c = log.consumer(value_deserializer=None, key_deserializer=None)
        tp = TopicPartition("t", 0)
        c.assign([tp])
        for offset in (0, 199, 200, 333, 400, 599):  # every index density finds the record
            c.seek(tp, offset)
            first = next(iter(c.iterate(timeout_ms=0)))
            assert first.offset == offset and first.value == model[(0, offset)][1]
        c.close()
    _check_reopened(root, "t", model, unclean=unclean)


@pytest.mark.parametrize("before,after", [(4096, 0), (0, 4096), (128, 100_000)])
def test_index_interval_bytes_changed_mid_segment_verifies_clean(
    tmp_path: Path, before: int, after: int
) -> None:
    """A segment indexed partly at one density and partly at another is sound: verify() reports nothing,
    and every offset and time lookup finds its record."""
    root = tmp_path / "log"
    with pylog.open(root) as log:
        log.create_topic("t", 1, index_interval_bytes=before)
        model = _send(log, "t", _rows(0, 150), batch_size=300)
        log.alter_topic("t", index_interval_bytes=after)
        model |= _send(log, "t", _rows(150, 150), batch_size=300)
        assert log.verify() == {}
        plog = log.topic("t").partition(0)
        plog.roll()
        assert log.verify() == {}
        for offset in range(0, 300, 7):
            assert plog.offset_for_time(T0 + offset) == (offset, T0 + offset)
            assert offset in plog.read(offset)[0].offsets
    _check_reopened(root, "t", model, unclean=True)


def test_segment_bytes_lowered_below_the_active_segment_rolls_on_the_next_append(tmp_path: Path) -> None:
    root = tmp_path / "log"
    with pylog.open(root) as log:
        log.create_topic("t", 1)
        model = _send(log, "t", _rows(0, 100))
        plog = log.topic("t").partition(0)
        assert len(plog.segments) == 1 and plog.segments[0].size > 1024
        log.alter_topic("t", segment_bytes=1024)
        model |= _send(log, "t", _rows(100, 1))
        assert [s.base_offset for s in plog.segments] == [0, 100]
        model |= _send(log, "t", _rows(101, 100), batch_size=300)  # batches that fit a segment
        assert len(plog.segments) > 3 and all(s.size <= 1024 for s in plog.segments[1:])
    _check_reopened(root, "t", model, unclean=True)


# -- retention_ms ----------------------------------------------------------------------------------------


def test_retention_ms_lowered_deletes_the_old_segments_by_the_new_value(tmp_path: Path) -> None:
    root = tmp_path / "log"
    day = 24 * 3600 * 1000
    clock = ManualClock(T0 + 3 * day)
    with pylog.open(root, clock=clock) as log:
        log.create_topic("t", 1, segment_bytes=2048, retention_ms=7 * day)
        old = _send(log, "t", [(k, v, ts) for k, v, ts in _rows(0, 100)])  # 3 days old
        young = _send(log, "t", [(k, v, ts + 3 * day - 1000) for k, v, ts in _rows(100, 100)])
        log.topic("t").partition(0).roll()
        assert log.apply_retention() == {"t": 0}
        log.alter_topic("t", retention_ms=day)
        deleted = log.apply_retention()["t"]
        assert deleted > 0
        start = log.topic("t").partition(0).log_start_offset
        assert start == 100  # every segment holding only old records went, no young one
        assert _read(log, "t") == young
        model = young | _send(log, "t", _rows(200, 10), append_time=None)
        assert set(old).isdisjoint(model)
    _check_reopened(root, "t", model, unclean=True, clock=clock)


# -- cleanup_policy delete -> compact --------------------------------------------------------------------


@pytest.mark.parametrize("unclean", [False, True])
def test_compacting_a_topic_with_keyless_records_keeps_them(tmp_path: Path, unclean: bool) -> None:
    """Kafka refuses keyless records on a compacted topic at produce time; its cleaner would drop the ones
    already there. pylog's cleaner keeps every keyless record (it cannot tell which is obsolete)."""
    root = tmp_path / "log"
    with pylog.open(root) as log:
        log.create_topic("t", 1, segment_bytes=1024, min_cleanable_dirty_ratio=0.0)
        keyless = _send(log, "t", _rows(0, 60, keyed=False))
        keyed = _send(log, "t", _rows(60, 140))
        c = log.consumer(group_id="g", value_deserializer=None)
        c.assign([TopicPartition("t", 0)])
        c.commit({TopicPartition("t", 0): pylog.OffsetAndMetadata(150, "")})
        c.close()
        log.alter_topic("t", cleanup_policy="compact")
        with pytest.raises(InvalidRecordError):
            _send(log, "t", _rows(200, 1, keyed=False))
        log.topic("t").partition(0).roll()
        results = log.topic("t").compact()
        assert results and sum(r.records_removed for r in results) > 0
        # the model of compaction: every keyless record and the latest record of each key
        latest: dict[bytes, tuple[int, int]] = {}
        for pos, row in sorted(keyed.items()):
            assert row[0] is not None
            latest[row[0]] = pos
        model = keyless | {pos: keyed[pos] for pos in latest.values()}
        assert _read(log, "t") == model
        model |= _send(log, "t", _rows(200, 5))
        c = log.consumer(group_id="g", value_deserializer=None)
        assert c.committed(TopicPartition("t", 0)) == 150
        c.close()
    _check_reopened(root, "t", model, unclean=unclean)


def test_a_cleaned_topic_given_retention_deletes_by_it_and_its_group_resumes_at_the_log_start(
    tmp_path: Path,
) -> None:
    root = tmp_path / "log"
    day = 24 * 3600 * 1000
    clock = ManualClock(T0 + 3 * day)
    with pylog.open(root, clock=clock) as log:
        log.create_topic("t", 1, segment_bytes=1024, cleanup_policy="compact")
        _send(log, "t", _rows(0, 300))  # 3 days old, 7 keys
        young = [(b"y%d" % i, v, ts + 3 * day - 1000) for i, (_, v, ts) in enumerate(_rows(300, 100))]
        model = _send(log, "t", young)
        plog = log.topic("t").partition(0)
        plog.roll()
        assert sum(r.records_removed for r in log.topic("t").compact()) > 0
        tp = TopicPartition("t", 0)
        c = log.consumer(group_id="g", value_deserializer=None)
        c.assign([tp])
        c.commit({tp: pylog.OffsetAndMetadata(150, "")})  # a position compaction emptied
        c.close()
        log.alter_topic("t", cleanup_policy="compact,delete", retention_ms=day)
        assert log.apply_retention()["t"] > 0
        assert plog.log_start_offset == 300
        assert _read(log, "t") == model
        # the commit now lies below the log start: out of range, so auto_offset_reset decides (as in Kafka)
        c = log.consumer(
            group_id="g", key_deserializer=None, value_deserializer=None, auto_offset_reset="earliest"
        )
        c.assign([tp])
        assert c.committed(tp) == 150
        got = [(r.offset, r.key) for r in c.iterate(timeout_ms=0)]
        c.close()
        assert got == [(o, model[(0, o)][0]) for _, o in sorted(model)]  # from the log start, nothing skipped
    _check_reopened(root, "t", model, unclean=True, clock=clock)


_READER = textwrap.dedent(
    """
    import json, sys
    import pylog

    log = pylog.open(sys.argv[1])

    def read():
        c = log.consumer(value_deserializer=None, key_deserializer=None)
        tps = log.topic("t").partitions()
        c.assign(tps)
        c.seek_to_beginning(*tps)
        rows = [[r.partition, r.offset, r.key.decode(), r.value.decode()] for r in c.iterate(timeout_ms=0)]
        c.close()
        return rows

    print(json.dumps(read()), flush=True)
    sys.stdin.readline()  # the other process made the topic compacted and cleaned it
    print(json.dumps(read()), flush=True)
    log.close()
    """
)


def test_a_process_that_opened_the_topic_before_it_became_compacted_reads_it_after_cleaning(
    tmp_path: Path,
) -> None:
    """A reader that opened the partition while the topic was not compacted reads the cleaned segments
    another process swapped in (their offsets skip) instead of failing with CorruptRecordError."""
    root = tmp_path / "log"
    with pylog.open(root) as log:
        log.create_topic("t", 1, segment_bytes=1024)
        keyed = _send(log, "t", _rows(0, 200))
        with subprocess.Popen(
            [sys.executable, "-c", _READER, str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as child:
            assert child.stdin is not None and child.stdout is not None
            try:
                first = json.loads(child.stdout.readline())
                assert [(p, o) for p, o, _, _ in first] == sorted(keyed)
                log.alter_topic("t", cleanup_policy="compact")
                log.topic("t").partition(0).roll()
                assert sum(r.records_removed for r in log.topic("t").compact()) > 0
                child.stdin.write("\n")
                child.stdin.flush()
                second = json.loads(child.stdout.readline())
                assert child.wait(timeout=120) == 0
            finally:
                if child.poll() is None:
                    child.kill()
        latest: dict[bytes, tuple[int, int]] = {}
        for pos, row in sorted(keyed.items()):
            assert row[0] is not None
            latest[row[0]] = pos
        model = {pos: keyed[pos] for pos in latest.values()}
        assert _read(log, "t") == model
        assert {(p, o): (k.encode(), v.encode()) for p, o, k, v in second} == {
            pos: row[:2] for pos, row in model.items()
        }
    _check_reopened(root, "t", model, unclean=True)


_RETAINER = textwrap.dedent(
    """
    import json, sys
    import pylog
    from pylog.clock import ManualClock

    day = 24 * 3600 * 1000
    log = pylog.open(sys.argv[1], clock=ManualClock(int(sys.argv[2]) + 30 * day))
    p = log.producer(value_serializer=None)
    topic = log.topic("t")
    print(json.dumps(topic.config.to_dict()), flush=True)
    sys.stdin.readline()  # the other process changed the topic's config
    deleted = log.apply_retention()["t"]
    failed = ""
    try:
        p.send("t", b"keyless").get()
    except pylog.errors.InvalidRecordError as exc:
        failed = type(exc).__name__
    print(json.dumps([deleted, topic.config.to_dict(), failed]), flush=True)
    p.close()
    log.close()
    """
)


def test_another_process_applies_the_new_config(tmp_path: Path) -> None:
    """A process that has the topic open when another one changes its config uses the new one: its
    retention keeps what the new retention_ms keeps, its producer refuses keyless records once the topic
    is compacted (Kafka applies a topic's config on every broker)."""
    root = tmp_path / "log"
    with pylog.open(root, clock=ManualClock(T0)) as log:
        log.create_topic("t", 1, segment_bytes=1024, retention_ms=24 * 3600 * 1000)
        model = _send(log, "t", [(b"u%d" % i, v, ts) for i, (_, v, ts) in enumerate(_rows(0, 200))])
        log.topic("t").partition(0).roll()
        with subprocess.Popen(
            [sys.executable, "-c", _RETAINER, str(root), str(T0)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as child:
            assert child.stdin is not None and child.stdout is not None
            try:
                assert json.loads(child.stdout.readline())["retention_ms"] == 24 * 3600 * 1000
                altered = log.alter_topic("t", retention_ms=-1, cleanup_policy="compact,delete").config
                child.stdin.write("\n")
                child.stdin.flush()
                deleted, config, failed = json.loads(child.stdout.readline())
                assert child.wait(timeout=120) == 0
            finally:
                if child.poll() is None:
                    child.kill()
        assert (deleted, config, failed) == (0, altered.to_dict(), "InvalidRecordError")
        assert _read(log, "t") == model
    _check_reopened(root, "t", model, unclean=True)


# -- partitions ------------------------------------------------------------------------------------------


def test_partitions_grown_place_new_keyed_records_by_murmur2_and_leave_old_ones(tmp_path: Path) -> None:
    root = tmp_path / "log"
    with pylog.open(root) as log:
        log.create_topic("t", 2)
        model = _send(log, "t", _rows(0, 100))
        for (p, _), row in model.items():
            assert row[0] is not None and p == partition_for_key(row[0], 2)
        log.create_partitions("t", 5)
        new = _send(log, "t", _rows(100, 100))
        for (p, _), row in new.items():
            assert row[0] is not None and p == partition_for_key(row[0], 5)
        model |= new
        assert _read(log, "t") == model
    _check_reopened(root, "t", model, unclean=True)


# -- refused changes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"segment_bytes": 10},
        {"max_message_bytes": "big"},
        {"cleanup_policy": "compact,delete,", "retention_ms": 5},
        {"message_timestamp_type": "Now"},
        {"compression_type": "brotli"},
        {"local_retention_ms": 1000},
        {"remote_storage_enable": True, "cleanup_policy": "compact"},
        {"no_such_config": 1},
        {"index_interval_bytes": -1},
    ],
)
def test_an_invalid_change_raises_config_error_and_changes_nothing(
    tmp_path: Path, change: dict[str, Any]
) -> None:
    root = tmp_path / "log"
    with pylog.open(root) as log:
        log.create_topic("t", 1, retention_ms=60_000)
        model = _send(log, "t", _rows(0, 10))
        before, config = _manifest(root), log.topic("t").config
        with pytest.raises(ConfigError):
            log.alter_topic("t", **change)
        assert _manifest(root) == before and log.topic("t").config == config
    _check_reopened(root, "t", model, unclean=False)


# -- remote_storage_enable -------------------------------------------------------------------------------


def test_turning_remote_storage_off_is_refused_and_the_tiered_records_stay_readable(tmp_path: Path) -> None:
    """Once a topic's segments are tiered and their local copies deleted, a topic without remote storage
    would read from its first local segment on: the tiered records would be gone for every reader (and the
    remote retention would never reach them). Kafka refuses to turn it off while keeping the data; so does
    pylog."""
    root, remote = tmp_path / "log", (tmp_path / "remote").as_uri()
    clock = ManualClock(T0 + 1000)
    with pylog.open(root, clock=clock, remote_storage=remote) as log:
        log.create_topic("t", 1, segment_bytes=2048, remote_storage_enable=True, local_retention_ms=1000)
        model = _send(log, "t", _rows(900, 100))
        log.topic("t").partition(0).roll()
        log.tier()
        clock.advance(10_000)
        assert log.apply_retention()["t"] > 0
        assert log.topic("t").partition(0).local_log_start_offset == 100
        before = _manifest(root)
        with pytest.raises(ConfigError, match="remote_storage_enable"):
            log.alter_topic("t", remote_storage_enable=False, local_retention_ms=-2)
        assert _manifest(root) == before
        assert log.topic("t").config.remote_storage_enable
    with pylog.open(root, clock=clock, remote_storage=remote) as log:
        assert log.topic("t").partition(0).log_start_offset == 0
        assert _read(log, "t") == model


def test_turning_remote_storage_on_reads_the_tiered_records_in_the_same_process(tmp_path: Path) -> None:
    """The partitions this process opened before the change read the segments local retention deleted after
    their upload from the object store, as partitions opened after it do."""
    root, remote = tmp_path / "log", (tmp_path / "remote").as_uri()
    clock = ManualClock(T0 + 1000)
    with pylog.open(root, clock=clock, remote_storage=remote) as log:
        log.create_topic("t", 1, segment_bytes=2048)
        model = _send(log, "t", _rows(900, 100))
        log.alter_topic("t", remote_storage_enable=True, local_retention_ms=1000)
        log.topic("t").partition(0).roll()
        assert sum(len(r.uploaded) for r in log.tier()) > 0
        clock.advance(10_000)
        assert log.apply_retention()["t"] > 0
        model |= _send(log, "t", _rows(1000, 10))
        assert _read(log, "t") == model
    _check_reopened(root, "t", model, unclean=True, clock=clock, remote_storage=remote)


def test_a_tiered_topic_follows_lowered_local_and_whole_log_retention(tmp_path: Path) -> None:
    root, remote = tmp_path / "log", (tmp_path / "remote").as_uri()
    day = 24 * 3600 * 1000
    clock = ManualClock(T0 + 3 * day)
    with pylog.open(root, clock=clock, remote_storage=remote) as log:
        log.create_topic("t", 1, segment_bytes=2048, remote_storage_enable=True, retention_ms=7 * day)
        old = _send(log, "t", _rows(0, 100))  # 3 days old
        young = _send(log, "t", [(k, v, ts + 3 * day - 1000) for k, v, ts in _rows(100, 100)])
        plog = log.topic("t").partition(0)
        plog.roll()
        log.tier()
        assert log.apply_retention() == {"t": 0}
        log.alter_topic("t", local_retention_ms=1000)
        assert log.apply_retention()["t"] > 0
        assert (plog.log_start_offset, plog.local_log_start_offset) == (0, 100)  # the old ones from remote
        assert _read(log, "t") == old | young
        log.alter_topic("t", retention_ms=day, local_retention_ms=-2)
        log.apply_retention()
        assert plog.log_start_offset == 100
        assert _read(log, "t") == young
        model = young | _send(log, "t", [(k, v, clock.time_ms()) for k, v, _ in _rows(200, 10)])
    _check_reopened(root, "t", model, unclean=True, clock=clock, remote_storage=remote)


def test_a_once_compacted_topic_cannot_be_tiered(tmp_path: Path) -> None:
    """Compaction's gaps stay in the cleaned segments after the topic's policy becomes delete; tiered
    storage reads segments whose offsets follow each other, so their records would be unreadable once their
    local copies went (CorruptRecordError 'batch has base offset 293, expected 0'). Refused, as Kafka does
    not tier compacted topics."""
    root, remote = tmp_path / "log", (tmp_path / "remote").as_uri()
    with pylog.open(root, remote_storage=remote) as log:
        log.create_topic("t", 2, segment_bytes=1024, cleanup_policy="compact")
        keyed = _send(log, "t", _rows(0, 300))
        for p in range(2):
            log.topic("t").partition(p).roll()
        assert sum(r.records_removed for r in log.topic("t").compact()) > 0
        model = _read(log, "t")
        log.alter_topic("t", cleanup_policy="delete")
        before = _manifest(root)
        with pytest.raises(ConfigError, match="compacted"):
            log.alter_topic("t", remote_storage_enable=True, local_retention_ms=1000)
        assert _manifest(root) == before and not log.topic("t").config.remote_storage_enable
        assert set(model) < set(keyed)
        model |= _send(log, "t", _rows(300, 10))
    _check_reopened(root, "t", model, unclean=True, remote_storage=remote)


# -- a second process has the log open during the change --------------------------------------------------

_WRITER = textwrap.dedent(
    """
    import json, os, signal, sys
    import pylog

    root, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    log = pylog.open(root)
    p = log.producer(value_serializer=None, key_serializer=None)

    def send(start):
        out = []
        for i in range(start, start + n):
            key, value = b"k%d" % (i % 7), (b"w%06d" % i).ljust(40, b".")
            meta = p.send(topic, value, key=key, headers=[("h", value[:3])]).get()
            out.append([meta.partition, meta.offset, key.decode(), value.decode(), meta.timestamp])
        return out

    print(json.dumps(send(0)), flush=True)
    sys.stdin.readline()  # the other process changed the topic's config
    print(json.dumps(send(n)), flush=True)
    sys.stdin.readline()
    os.kill(os.getpid(), signal.SIGKILL)  # an unclean shutdown, every record acknowledged
    """
)


def _from_writer(line: str) -> Model:
    model: Model = {}
    for p, offset, key, value, ts in json.loads(line):
        v = value.encode()
        model[(p, offset)] = (key.encode(), v, ts, CREATE_TIME, (("h", v[:3]),))
    return model


@pytest.mark.parametrize(
    "change",
    [
        {"message_timestamp_type": "LogAppendTime"},
        {"max_message_bytes": 200},
        {"segment_bytes": 512, "index_interval_bytes": 0},
        {"segment_bytes": 512},
        {"index_interval_bytes": 0},
        {"cleanup_policy": "compact"},
        {"compression_type": "gzip"},
    ],
)
def test_a_change_while_another_process_writes_loses_nothing(tmp_path: Path, change: dict[str, Any]) -> None:
    """The writer keeps its config until it reopens the topic (the documented contract); whatever it and
    this process acknowledged before and after the change, and after the writer is killed, is read back."""
    root = tmp_path / "log"
    with pylog.open(root) as log:
        log.create_topic("t", 2, segment_bytes=4096)
    with subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(root), "t", "50"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdin is not None and child.stdout is not None
        try:
            model = _from_writer(child.stdout.readline())
            with pylog.open(root, clock=ManualClock(T0)) as log:
                log.alter_topic("t", **change)
                child.stdin.write("\n")
                child.stdin.flush()
                model |= _from_writer(child.stdout.readline())
                stamp = log.clock.time_ms() if "message_timestamp_type" in change else None
                rows = [(k, v[:30], log.clock.time_ms()) for k, v, _ in _rows(100, 20)]
                model |= _send(log, "t", rows, append_time=stamp)
                child.stdin.write("\n")
                child.stdin.flush()
                assert child.wait(timeout=120) == -signal.SIGKILL
                assert _read(log, "t") == model
        finally:
            if child.poll() is None:
                child.kill()
    _check_reopened(root, "t", model, unclean=True, clock=ManualClock(T0))
