"""Spark reading a log straight from its object store (``load("s3://bucket/prefix")``, ``load("file:///...")``).

Each log is written, tiered with ``Log.tier()`` and then its whole local directory is deleted: Spark has only
the object store. The model is what pylog's own consumer reads from the same store
(``pylog.open(url, read_only=True)``), checked against what the producer acknowledged. Spark queries are few
(one session, see tests/spark/conftest.py); the data-loss, streaming-offset and option cases run the reader's
planning and task code in this process."""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import HAS_JAVAC

import pylog
from pylog.clock import ManualClock
from pylog.errors import (
    ConfigError,
    OffsetOutOfRangeError,
    ReadOnlyLogError,
    RemoteStorageError,
    UnknownTopicError,
)
from pylog.spark.options import Options
from pylog.spark.reader import PylogReader, PylogStreamReader, RangePartition, _read
from pylog.spark.snapshot import check_log_dir, open_partition
from pylog.spark.source import read_options
from pylog.tiered.manifest import publish_manifest, read_manifest
from pylog.tiered.store import ObjectStore

pytestmark = pytest.mark.spark

TS0 = 1_700_000_000_000
TOPIC = "events"
Row = tuple[int, int, bytes | None, bytes | None, int]  # partition, offset, key, value, timestamp ms
KAFKA_JSON = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": n, "type": t, "nullable": True, "metadata": {}}
            for n, t in (
                ("key", "binary"),
                ("value", "binary"),
                ("topic", "string"),
                ("partition", "integer"),
                ("offset", "long"),
                ("timestamp", "timestamp"),
                ("timestampType", "integer"),
            )
        ],
    }
)


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """``(url, options)`` of an empty object store: a file:// directory, or a fresh prefix of the moto bucket."""
    if request.param == "file":
        return (tmp_path / "remote").as_uri(), {}
    bucket, options = request.getfixturevalue("moto_s3")
    return f"s3://{bucket}/{request.node.name}", dict(options)


def _spark_options(options: dict[str, Any]) -> dict[str, str]:
    """The store options as reader options ``remoteStorage.<key>`` (strings, durations in ms)."""
    out = {}
    for key, value in options.items():
        if isinstance(value, dict):
            for sub, v in value.items():
                if isinstance(v, dict):
                    for leaf, w in v.items():
                        out[f"remoteStorage.{key}.{sub}.{leaf}"] = _text(w)
                else:
                    out[f"remoteStorage.{key}.{sub}"] = _text(v)
        else:
            out[f"remoteStorage.{key}"] = _text(value)
    return out


def _text(value: Any) -> str:
    if isinstance(value, timedelta):
        return f"{int(value.total_seconds() * 1000)}ms"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _write(
    tmp_path: Path, url: str, options: dict[str, Any], n: int, start: int = 0, *, keep: bool = False
) -> dict[tuple[int, int], Row]:
    """Produce ``n`` records to ``TOPIC`` (3 partitions, small segments), roll and tier every partition, then
    delete the whole local log directory (unless ``keep``). Returns what the producer acknowledged."""
    path = tmp_path / "log"
    with pylog.open(
        path,
        clock=ManualClock(TS0 + 10_000_000),
        remote_storage=url,
        remote_storage_options=options,
        remote_log_manager_task_interval_ms=-1,
    ) as log:
        if TOPIC not in log.topics():
            log.create_topic(TOPIC, 3, segment_bytes=4096, remote_storage_enable=True)
        p = log.producer(value_serializer=None, key_serializer=None, batch_size=600)
        sent = []
        for i in range(start, start + n):
            key = None if i % 11 == 0 else b"k%d" % (i % 17)
            value = None if i % 13 == 0 and key is not None else b"v%d-" % i + bytes(i % 37)
            sent.append((p.send(TOPIC, value, key=key, timestamp_ms=TS0 + i), key, value, TS0 + i))
        p.flush()
        acked = {}
        for fut, key, value, ts in sent:
            meta = fut.get()
            acked[(meta.partition, meta.offset)] = (meta.partition, meta.offset, key, value, ts)
        p.close()
        for part in range(3):
            log.topic(TOPIC).partition(part).roll()
        log.tier()
    if not keep:
        shutil.rmtree(path)
    return acked


def _consumer_rows(url: str, options: dict[str, Any]) -> list[Row]:
    """The model: every record pylog's consumer reads from the log opened read-only from the store."""
    with pylog.open(url, read_only=True, remote_storage_options=options) as replica:
        c = replica.consumer(value_deserializer=None, key_deserializer=None)
        tps = replica.topic(TOPIC).partitions()
        c.assign(tps)
        c.seek_to_beginning(*tps)
        got = [(r.partition, r.offset, r.key, r.value, r.timestamp) for r in c.iterate(timeout_ms=0)]
        c.close()
    return sorted(got)


def _spark_rows(df: Any) -> list[Row]:
    out = df.selectExpr("partition", "offset", "key", "value", "unix_millis(timestamp) AS ts").collect()
    return sorted((r[0], r[1], _b(r[2]), _b(r[3]), r[4]) for r in out)


def _b(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def _rows_of(parts: list[RangePartition]) -> list[Row]:
    """What the tasks of a planned read return (run here, as an executor would)."""
    out: list[Row] = []
    for part in parts:
        for rb in _read(part):
            cols = rb.to_pydict()
            for p, o, k, v, ts in zip(
                cols["partition"], cols["offset"], cols["key"], cols["value"], cols["timestamp"], strict=True
            ):
                out.append((p, o, k, v, int(ts.timestamp() * 1000)))
    return sorted(out)


def test_spark_reads_the_object_store_as_the_consumer_does(
    spark: Any, tmp_path: Path, store: tuple[str, dict[str, Any]]
) -> None:
    url, options = store
    acked = _write(tmp_path, url, options, 3000)
    model = _consumer_rows(url, options)
    assert model == sorted(acked.values())  # every acknowledged record was tiered (all segments rolled)
    opts = _spark_options(options)

    df = spark.read.format("pylog").options(**opts).option("subscribe", TOPIC).option("minPartitions", 4)
    df = df.load(url)
    assert _spark_rows(df) == model
    if HAS_JAVAC:  # pylog's JVM reader reads file:// and s3:// stores (tests/spark/test_jvm_remote.py)
        assert "(JVM reader)" in df._jdf.queryExecution().executedPlan().toString()

    starting = {TOPIC: {"0": 5, "2": -2}}
    ending = {TOPIC: {"0": 700, "2": -1}}
    cutoff = TS0 + 1500
    df = (
        spark.read.format("pylog")
        .options(**opts)
        .option("assign", json.dumps({TOPIC: [0, 2]}))
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        .load(url)
        .where(f"timestamp >= timestamp_millis({cutoff})")
    )
    want = [
        r
        for r in model
        if ((r[0] == 0 and 5 <= r[1] < 700) or r[0] == 2) and r[4] >= cutoff  # partition 2: earliest..latest
    ]
    assert want and _spark_rows(df) == want


def test_stream_reads_new_manifests_each_trigger(spark: Any, tmp_path: Path) -> None:
    url = (tmp_path / "remote").as_uri()
    first = _write(tmp_path, url, {}, 900, keep=True)
    reader = PylogStreamReader(
        Options({"path": url, "subscribe": TOPIC, "startingOffsets": "earliest"}), KAFKA_JSON
    )
    start = reader.initialOffset()
    assert start == {TOPIC: {"0": 0, "1": 0, "2": 0}}
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    ends = {}
    for p in range(3):
        ends[str(p)] = max((o + 1 for (q, o) in first if q == p), default=0)
    assert end == {TOPIC: ends}  # the manifest ends: everything tiered
    batch1 = _rows_of(reader.partitions(start, end))
    assert batch1 == sorted(first.values())

    second = _write(tmp_path, url, {}, 600, start=900)  # the writer tiers more, then its directory goes
    end2 = reader.latestOffset(end, reader.getDefaultReadLimit())
    assert end2 != end  # the next trigger sees the new manifest versions
    batch2 = _rows_of(reader.partitions(end, end2))
    assert sorted(batch1 + batch2) == _consumer_rows(url, {})

    query = (
        spark.readStream.format("pylog")
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 500)
        .load(url)
        .writeStream.format("memory")
        .queryName("remote_stream")
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(120)
        got = _spark_rows(spark.table("remote_stream"))
    finally:
        query.stop()
    assert got == _consumer_rows(url, {})
    assert len(got) == len(first) + len(second)


def _drop_first_segment(url: str, partition: int) -> tuple[int, int]:
    """Remote retention of the writer: a manifest without the partition's first segment, then its objects
    deleted. Returns the dropped offsets ``[base, next)``."""
    st = ObjectStore(url)
    manifest, highest = read_manifest(st, TOPIC, partition)
    assert manifest is not None and len(manifest.segments) > 1
    dropped = manifest.segments[0]
    published = publish_manifest(st, replace(manifest, segments=manifest.segments[1:]), highest + 1)
    assert published is not None
    for meta in (dropped, dropped.index, dropped.timeindex):
        if meta is not None:
            st.delete(meta.key)
    return dropped.base_offset, dropped.next_offset


def test_a_pinned_segment_gone_is_data_loss(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = (tmp_path / "remote").as_uri()
    acked = _write(tmp_path, url, {}, 1500)
    model = sorted(acked.values())
    strict = PylogReader(Options({"path": url, "subscribe": TOPIC}), KAFKA_JSON).partitions()
    lenient = PylogReader(Options({"path": url, "subscribe": TOPIC, "failOnDataLoss": "false"}), KAFKA_JSON)
    lenient_parts = lenient.partitions()
    assert _rows_of(strict) == model  # the pinned plan reads everything while it is there

    lo, hi = _drop_first_segment(url, 1)  # after planning, before the tasks run
    with pytest.raises(OffsetOutOfRangeError, match=rf"data loss reading {TOPIC}-1 .*failOnDataLoss=false"):
        _rows_of(strict)
    with caplog.at_level(logging.WARNING, logger="pylog.spark"):
        got = _rows_of(lenient_parts)
    assert got == [r for r in model if not (r[0] == 1 and lo <= r[1] < hi)]
    assert f"offsets {lo}..{hi - 1}" in caplog.text

    # a new plan starts where the newest manifest does: nothing lost, nothing to warn about
    assert _rows_of(PylogReader(Options({"path": url, "subscribe": TOPIC}), KAFKA_JSON).partitions()) == got


def test_an_object_missing_that_the_manifest_names_is_a_store_error(tmp_path: Path) -> None:
    url = (tmp_path / "remote").as_uri()
    _write(tmp_path, url, {}, 300)
    st = ObjectStore(url)
    manifest, _ = read_manifest(st, TOPIC, 0)
    assert manifest is not None
    parts = PylogReader(Options({"path": url, "assign": json.dumps({TOPIC: [0]})}), KAFKA_JSON).partitions()
    os.remove(os.path.join(str(tmp_path / "remote"), manifest.segments[-1].key))
    with pytest.raises(RemoteStorageError, match="no such object"):
        _rows_of(parts)


def test_option_errors(tmp_path: Path) -> None:
    url = (tmp_path / "remote").as_uri()
    _write(tmp_path, url, {}, 50)
    base = {"path": "s3://bucket/prefix", "subscribe": TOPIC}
    cases = {
        "remoteStorage.regoin": "did you mean 'remoteStorage.region'",
        "remoteStorag.region": "did you mean 'remoteStorage.region'",
        "remoteStorage.client_options.allow_htp": "did you mean 'remoteStorage.client_options.allow_http'",
        "remoteStorage.retry_config.max_retry": "did you mean 'remoteStorage.retry_config.max_retries'",
    }
    for name, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            Options({**base, name: "x"})
    with pytest.raises(ConfigError, match=r"remoteStorage\.retry_config\.max_retries must be a number"):
        Options({**base, "remoteStorage.retry_config.max_retries": "many"})
    with pytest.raises(ConfigError, match=r"must be a duration such as"):
        Options({**base, "remoteStorage.retry_config.retry_timeout": "soon"})
    opts = Options(
        {**base, "remoteStorage.aws_region": "eu-west-1", "remoteStorage.retry_config.retry_timeout": "2s"}
    )
    assert opts.remote_storage_options == {
        "aws_region": "eu-west-1",
        "retry_config": {"retry_timeout": timedelta(seconds=2)},
    }
    with pytest.raises(ConfigError, match=r"remoteStorage\.\* options are for a log in an object store"):
        Options({"path": str(tmp_path), "subscribe": TOPIC, "remoteStorage.region": "eu-west-1"})
    assert Options(
        {"path": url, "subscribe": TOPIC, "kafka.isolation.level": "read_committed"}
    ).read_committed

    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="no such directory"):
        Options({"path": missing.as_uri(), "subscribe": TOPIC}).log_view()
    assert not missing.exists()  # a reader creates nothing
    with pytest.raises(UnknownTopicError, match=f"topics: {TOPIC}"):
        PylogReader(Options({"path": url, "subscribe": "nope"}), KAFKA_JSON).partitions()
    with pytest.raises(ReadOnlyLogError, match="object-store URL"):
        check_log_dir(url)  # the writers' check: a log in a store is read-only


def test_timestamp_options_resolve_through_the_remote_time_indexes(tmp_path: Path) -> None:
    url = (tmp_path / "remote").as_uri()
    model = sorted(_write(tmp_path, url, {}, 2000).values())
    lo, hi = TS0 + 333, TS0 + 1500  # timestamps grow with the offsets of every partition
    reader = PylogReader(
        Options({"path": url, "subscribe": TOPIC, "startingTimestamp": str(lo), "endingTimestamp": str(hi)}),
        KAFKA_JSON,
    )
    assert _rows_of(reader.partitions()) == [r for r in model if lo <= r[4] < hi]
    late = Options({"path": url, "subscribe": TOPIC, "startingTimestamp": str(TS0 + 10**6)})
    with pytest.raises(OffsetOutOfRangeError, match="no record at or after timestamp"):
        PylogReader(late, KAFKA_JSON).partitions()


# -- a log directory whose topic is tiered: its remote segments below the local log start are read too ----

GROUPS = ((0, 1500), (1_000_000, 1000), (2_000_000, 500))  # (timestamp base, records) produced in turn
LOCAL_RETENTION_MS = 600_000


def _tiered_dir(tmp_path: Path, url: str, options: dict[str, Any]) -> tuple[Path, dict[tuple[int, int], Row]]:
    """A log directory whose topic is tiered to ``url``: the first group of records is produced, rolled and
    tiered, the second too, the third only produced (some of it sealed, none uploaded); then the local
    retention (``LOCAL_RETENTION_MS`` by the log's clock) deletes the first group's local copies. Each
    partition then has segments only in the store, in both places, and only on the local disk."""
    path = tmp_path / "tiered-log"
    acked: dict[tuple[int, int], Row] = {}
    clock = ManualClock(TS0)
    with pylog.open(
        path,
        clock=clock,
        remote_storage=url,
        remote_storage_options=options,
        remote_log_manager_task_interval_ms=-1,
    ) as log:
        log.create_topic(
            TOPIC, 3, segment_bytes=4096, remote_storage_enable=True, local_retention_ms=LOCAL_RETENTION_MS
        )
        p = log.producer(value_serializer=None, key_serializer=None, batch_size=600)
        i = 0
        for g, (ts_base, n) in enumerate(GROUPS):
            sent = []
            for _ in range(n):
                key = None if i % 11 == 0 else b"k%d" % (i % 17)
                value = None if i % 13 == 0 and key is not None else b"v%d-" % i + bytes(i % 37)
                ts = TS0 + ts_base + i
                sent.append((p.send(TOPIC, value, key=key, timestamp_ms=ts), key, value, ts))
                i += 1
            p.flush()
            for fut, key, value, ts in sent:
                meta = fut.get()
                acked[(meta.partition, meta.offset)] = (meta.partition, meta.offset, key, value, ts)
            if g < 2:
                for part in range(3):
                    log.topic(TOPIC).partition(part).roll()
                log.tier()
        p.close()
        clock.advance(GROUPS[1][0] + LOCAL_RETENTION_MS // 2)  # the first group is past the local retention
        log.apply_retention()
        for part in range(3):
            pl = log.topic(TOPIC).partition(part)
            manifest, _ = read_manifest(ObjectStore(url, **options), TOPIC, part)
            assert manifest is not None
            remote_end = manifest.segments[-1].next_offset
            assert 0 == pl.log_start_offset < pl.local_log_start_offset < remote_end < pl.log_end_offset
    return path, acked


def _dir_consumer_rows(path: Path, options: dict[str, Any], clock: ManualClock | None = None) -> list[Row]:
    """The model: what pylog's consumer of the log directory (its recorded URL) reads from the beginning."""
    with pylog.open(
        path, read_only=True, remote_storage_options=options, clock=clock or ManualClock(TS0 + 3_000_000)
    ) as log:
        c = log.consumer(value_deserializer=None, key_deserializer=None)
        tps = log.topic(TOPIC).partitions()
        c.assign(tps)
        c.seek_to_beginning(*tps)
        got = [(r.partition, r.offset, r.key, r.value, r.timestamp) for r in c.iterate(timeout_ms=0)]
        c.close()
    return sorted(got)


def _local_starts(path: Path) -> dict[int, int]:
    return {p: open_partition(str(path), TOPIC, p).log_start_offset for p in range(3)}


def _plan(raw: dict[str, str]) -> list[RangePartition]:
    return PylogReader(read_options(raw), KAFKA_JSON).partitions()


def _on_jvm(df: Any) -> bool:
    return "(JVM reader)" in str(df._jdf.queryExecution().executedPlan().toString())


class _Planned:
    """A Spark query of rows, planned now (the scan's input partitions made, its segments pinned) and run
    later by :meth:`rows`: what the log holds between the two is the test's to change. The rows travel as
    one string (an aggregation, with adaptive execution off so the planned scan is the one that runs)."""

    def __init__(self, spark: Any, df: Any) -> None:
        self.spark = spark
        spark.conf.set("spark.sql.adaptive.enabled", "false")
        try:
            row = "concat_ws(' ', partition, offset, coalesce(hex(key), '-'), coalesce(hex(value), '-'), "
            row += "unix_millis(timestamp))"
            agg = df.selectExpr(f"array_join(collect_list({row}), '\\n') AS s")
            self.plan = agg._jdf.queryExecution().executedPlan()
        finally:
            spark.conf.unset("spark.sql.adaptive.enabled")
        assert "(JVM reader)" in self.plan.toString()
        leaves = self.plan.collectLeaves()
        scan = leaves.apply(0)
        assert scan.getClass().getSimpleName() == "BatchScanExec"
        assert scan.inputPartitions().size() > 0  # planned now, kept by the scan for its execution

    def rows(self) -> list[Row]:
        text = self.plan.executeCollect()[0].getUTF8String(0).toString()
        out: list[Row] = []
        for line in text.splitlines():
            p, o, k, v, ts = line.split(" ")
            out.append((int(p), int(o), _hex(k), _hex(v), int(ts)))
        return sorted(out)


def _hex(text: str) -> bytes | None:
    return None if text == "-" else bytes.fromhex(text)


def test_a_tiered_log_directory_is_read_with_its_remote_segments(
    tmp_path: Path, store: tuple[str, dict[str, Any]]
) -> None:
    url, options = store
    path, acked = _tiered_dir(tmp_path, url, options)
    model = _dir_consumer_rows(path, options)
    assert model == sorted(acked.values())  # the consumer reads the store below the local log start
    base = {"path": str(path), "subscribe": TOPIC, **_spark_options(options)}
    for splits in ("1", "7"):  # every offset exactly once, also with ranges split across the boundary
        parts = _plan({**base, "minPartitions": splits})
        got = _rows_of(parts)
        assert got == model
        assert len({(r[0], r[1]) for r in got}) == len(got)

    # ranges spanning the remote and the local segments, and ones inside either
    local = _local_starts(path)
    starting = {TOPIC: {"0": 3, "1": local[1] - 1, "2": local[2] + 5}}
    ending = {TOPIC: {"0": local[0] + 40, "1": local[1] + 1, "2": -1}}
    raw = {**base, "startingOffsets": json.dumps(starting), "endingOffsets": json.dumps(ending)}
    want = [
        r
        for r in model
        if (r[0] == 0 and 3 <= r[1] < local[0] + 40)
        or (r[0] == 1 and local[1] - 1 <= r[1] < local[1] + 1)
        or (r[0] == 2 and r[1] >= local[2] + 5)
    ]
    assert _rows_of(_plan(raw)) == want

    # timestamps resolve through the remote time indexes first, then the local ones
    lo, hi = TS0 + 700, TS0 + GROUPS[1][0] + 1600  # in the first group (remote only), in the second
    raw = {**base, "startingTimestamp": str(lo), "endingTimestamp": str(hi)}
    assert _rows_of(_plan(raw)) == [r for r in model if lo <= r[4] < hi]

    # a stream from the earliest offset: the remote log start, then on into the local segments
    reader = PylogStreamReader(read_options({**base, "startingOffsets": "earliest"}), KAFKA_JSON)
    start = reader.initialOffset()
    assert start == {TOPIC: {"0": 0, "1": 0, "2": 0}}
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert _rows_of(reader.partitions(start, end)) == model


def test_tiered_directory_remote_segment_dropped_after_planning_is_data_loss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = (tmp_path / "remote").as_uri()
    path, acked = _tiered_dir(tmp_path, url, {})
    model = _dir_consumer_rows(path, {})
    assert model == sorted(acked.values())
    base = {"path": str(path), "subscribe": TOPIC}
    strict = _plan(base)
    lenient = _plan({**base, "failOnDataLoss": "false"})
    assert _rows_of(strict) == model

    lo, hi = _drop_first_segment(url, 1)  # remote retention after planning: only the store held it
    assert hi <= _local_starts(path)[1]
    with pytest.raises(
        OffsetOutOfRangeError, match=rf"data loss reading {TOPIC}-1 .*dropped from the object store"
    ):
        _rows_of(strict)
    with caplog.at_level(logging.WARNING, logger="pylog.spark"):
        got = _rows_of(lenient)
    assert got == [r for r in model if not (r[0] == 1 and lo <= r[1] < hi)]
    assert f"offsets {lo}..{hi - 1}" in caplog.text
    assert _rows_of(_plan(base)) == got  # a new plan starts at the new remote log start


def test_tiered_directory_segments_deleted_locally_after_planning_are_read_from_the_store(
    tmp_path: Path,
) -> None:
    """The local retention deletes segments after the query was planned: those the pinned manifest names,
    and those uploaded after planning (found in the newest manifest); every offset is still read once."""
    url = (tmp_path / "remote").as_uri()
    path, acked = _tiered_dir(tmp_path, url, {})
    model = _dir_consumer_rows(path, {})
    assert model == sorted(acked.values())
    planned = _local_starts(path)
    parts = _plan({"path": str(path), "subscribe": TOPIC, "minPartitions": "5"})
    with pylog.open(path, clock=ManualClock(TS0 + GROUPS[2][0] + 2 * LOCAL_RETENTION_MS)) as log:
        for part in range(3):
            log.topic(TOPIC).partition(part).roll()
        log.tier()  # the third group is uploaded now, after planning
        log.apply_retention()  # and every uploaded local copy is past the local retention
        ends = {p: log.topic(TOPIC).partition(p).log_end_offset for p in range(3)}
    assert _local_starts(path) == ends  # nothing left locally but the empty active segments
    assert all(planned[p] < ends[p] for p in range(3))
    assert _rows_of(parts) == model


def _tiered_transactions_dir(tmp_path: Path, url: str) -> tuple[Path, dict[str, list[Row]]]:
    """A tiered log directory with committed and aborted transactions in segments only the store holds (the
    first round, tiered, then deleted locally by the local retention), and committed, aborted and open ones
    in the local segments (the second round). Returns the records written, by kind."""
    path = tmp_path / "tiered-txn-log"
    written: dict[str, list[Row]] = {"plain": [], "committed": [], "aborted": [], "open": []}
    clock = ManualClock(TS0)
    with pylog.open(path, clock=clock, remote_storage=url, remote_log_manager_task_interval_ms=-1) as log:
        log.create_topic(
            TOPIC, 3, segment_bytes=2048, remote_storage_enable=True, local_retention_ms=LOCAL_RETENTION_MS
        )
        plain = log.producer(value_serializer=None, key_serializer=None)
        count = 0

        def send(producer: Any, kind: str, n: int, ts_base: int) -> None:
            nonlocal count
            sent = []
            for _ in range(n):
                value = b"%s-%d" % (kind.encode(), count)
                sent.append(
                    (producer.send(TOPIC, value, key=b"k%d" % count, timestamp_ms=ts_base + count), count)
                )
                count += 1
            producer.flush()
            for fut, i in sent:
                meta = fut.get()
                row = (meta.partition, meta.offset, b"k%d" % i, b"%s-%d" % (kind.encode(), i), ts_base + i)
                written[kind].append(row)

        for round_, ts_base, kinds in (
            (0, TS0, ("committed", "aborted")),
            (1, TS0 + 1_000_000, ("committed", "aborted", "open")),
        ):
            send(plain, "plain", 40, ts_base)
            for kind in kinds:
                tx = log.producer(
                    transactional_id=f"{kind}-{round_}", value_serializer=None, key_serializer=None
                )
                tx.init_transactions()
                tx.begin_transaction()
                send(tx, kind, 60, ts_base)
                if kind == "committed":
                    tx.commit_transaction()
                elif kind == "aborted":
                    tx.abort_transaction()
                tx.close()
                send(plain, "plain", 20, ts_base)
            if round_ == 0:
                for part in range(3):
                    log.topic(TOPIC).partition(part).roll()
                log.tier()
        plain.close()
        clock.advance(1_000_000 + LOCAL_RETENTION_MS // 2)  # the first round is past the local retention
        log.apply_retention()
        for part in range(3):
            assert log.topic(TOPIC).partition(part).local_log_start_offset > 0
    return path, written


def test_tiered_directory_read_committed_reads_the_remote_segments_with_the_log_decisions(
    tmp_path: Path,
) -> None:
    url = (tmp_path / "remote").as_uri()
    path, written = _tiered_transactions_dir(tmp_path, url)
    with pylog.open(path, clock=ManualClock(TS0), remote_log_manager_task_interval_ms=-1) as log:  # no expiry
        c = log.consumer(value_deserializer=None, key_deserializer=None, isolation_level="read_committed")
        tps = log.topic(TOPIC).partitions()
        c.assign(tps)
        c.seek_to_beginning(*tps)
        model = sorted((r.partition, r.offset, r.key, r.value, r.timestamp) for r in c.iterate(timeout_ms=0))
        c.close()
    _check_committed_model(model, written)
    local = _local_starts(path)
    aborted_remote = [r for r in written["aborted"] if r[1] < local[r[0]]]
    assert aborted_remote and any(r[1] < local[r[0]] for r in written["committed"])  # remote transactions
    raw = {"path": str(path), "subscribe": TOPIC, "kafka.isolation.level": "read_committed"}
    parts = _plan(raw)
    assert any(s[0] < local[r.partition] for part in parts for r in part.ranges for s in r.skipped)
    assert _rows_of(parts) == model
    assert _rows_of(_plan({**raw, "minPartitions": "7"})) == model
    starting = {
        TOPIC: {str(p): o for p, o in local.items()}
    }  # from the local log starts: the local part only
    assert _rows_of(_plan({**raw, "startingOffsets": json.dumps(starting)})) == [
        r for r in model if r[1] >= local[r[0]]
    ]
    stream = PylogStreamReader(read_options({**raw, "startingOffsets": "earliest"}), KAFKA_JSON)
    start = stream.initialOffset()
    end = stream.latestOffset(start, stream.getDefaultReadLimit())
    lso = {p: min(o for q, o, *_ in written["open"] if q == p) for p in range(3)}
    assert json.loads(json.dumps(end)) == {TOPIC: {str(p): lso[p] for p in range(3)}}  # never past the LSO
    assert _rows_of(stream.partitions(start, end)) == model


def test_tiered_directory_plans_carry_the_store_for_the_jvm_reader(tmp_path: Path) -> None:
    """The JSON plan pylog's JVM reader reads: the directory, failOnDataLoss as asked, the store; the pickled
    RemoteRead's JVM plan names the store's directory, the local log starts at planning and the pinned
    segments of every range (those still local too: the local retention may delete them before the task)."""
    from pylog.spark.remote import jvm_plan

    url = (tmp_path / "remote").as_uri()
    path, _ = _tiered_dir(tmp_path, url, {})
    local = _local_starts(path)
    base = {"path": str(path), "subscribe": TOPIC}
    from_local = {"startingOffsets": json.dumps({TOPIC: {str(p): o for p, o in local.items()}})}
    for raw, fail in (({**base, "failOnDataLoss": "false"}, False), ({**base, **from_local}, True)):
        for part in _plan(raw):
            plan = json.loads(part.__reduce__()[1][0])
            assert plan["tiered"] == url and plan["failOnDataLoss"] is fail and plan["path"] == str(path)
            remote = part.spec.remote
            assert remote is not None
            jvm = json.loads(jvm_plan(remote))
            assert jvm["store"] == "file" and Path(jvm["root"]) == tmp_path / "remote"
            assert {(t, p): o for t, p, o in jvm["localStarts"]} == {
                (TOPIC, r.partition): local[r.partition] for r in part.ranges
            }
            for t, p, segs, newer in jvm["segments"]:
                manifest, _ = read_manifest(ObjectStore(url), t, p)
                assert manifest is not None
                assert newer[0][0].endswith(f"{manifest.version + 1:020d}.json")
                rng = next(r for r in part.ranges if r.partition == p)
                want = [
                    s.key for s in manifest.segments if s.base_offset < rng.end and s.next_offset > rng.start
                ]
                assert [s[4] for s in segs] == want


def test_spark_reads_a_tiered_log_directory(
    spark: Any, tmp_path: Path, store: tuple[str, dict[str, Any]]
) -> None:
    from pylog.spark.jvm import ENABLED

    url, options = store
    path, acked = _tiered_dir(tmp_path, url, options)
    model = _dir_consumer_rows(path, options)
    assert model == sorted(acked.values())
    opts = _spark_options(options)
    spark.conf.set(ENABLED, "false")
    try:
        df = spark.read.format("pylog").options(**opts).option("subscribe", TOPIC).option("minPartitions", 4)
        assert _spark_rows(df.load(str(path))) == model
        query = (
            spark.readStream.format("pylog")
            .options(**opts)
            .option("subscribe", TOPIC)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", 700)
            .load(str(path))
            .writeStream.format("memory")
            .queryName(f"tiered_dir_{store[0][:2]}")
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination(120)
            assert _spark_rows(spark.table(f"tiered_dir_{store[0][:2]}")) == model
        finally:
            query.stop()
    finally:
        spark.conf.unset(ENABLED)
    if not HAS_JAVAC:
        return
    # pylog's JVM reader: the remote segments below the local log start, then the local ones
    local = _local_starts(path)
    starting = {TOPIC: {"0": 3, "1": local[1] - 1, "2": local[2] + 5}}
    ending = {TOPIC: {"0": local[0] + 40, "1": local[1] + 1, "2": -1}}
    spanning = {"startingOffsets": json.dumps(starting), "endingOffsets": json.dumps(ending)}
    want = [
        r
        for r in model
        if (r[0] == 0 and 3 <= r[1] < local[0] + 40)
        or (r[0] == 1 and local[1] - 1 <= r[1] < local[1] + 1)
        or (r[0] == 2 and r[1] >= local[2] + 5)
    ]
    lo, hi = TS0 + 700, TS0 + GROUPS[1][0] + 1600
    for extra, rows in (
        ({"minPartitions": "7"}, model),
        ({"failOnDataLoss": "false"}, model),
        (spanning, want),
        ({"startingTimestamp": str(lo), "endingTimestamp": str(hi)}, [r for r in model if lo <= r[4] < hi]),
    ):
        df = spark.read.format("pylog").options(**opts, **extra).option("subscribe", TOPIC).load(str(path))
        assert _on_jvm(df)
        assert _spark_rows(df) == rows, extra
        assert (
            _rows_of(_plan({"path": str(path), "subscribe": TOPIC, **opts, **extra})) == rows
        )  # Python path
    # pushed filters: a timestamp range inside the remote segments, one across the boundary
    df = spark.read.format("pylog").options(**opts).option("subscribe", TOPIC).load(str(path))
    for cond, keep in (
        (f"timestamp < timestamp_millis({TS0 + 900})", lambda r: r[4] < TS0 + 900),
        (f"offset >= {local[1] - 3} AND partition = 1", lambda r: r[0] == 1 and r[1] >= local[1] - 3),
    ):
        filtered = df.where(cond)
        assert _on_jvm(filtered)
        assert _spark_rows(filtered) == [r for r in model if keep(r)], cond


def _write_transactions(tmp_path: Path, url: str, options: dict[str, Any]) -> dict[str, list[Row]]:
    """Plain records, a committed, an aborted and an open transaction over the 3 partitions of ``TOPIC``
    (small segments: transactions span segments), all tiered, then the local directory deleted. The rows
    written, by kind."""
    path = tmp_path / "txn-log"
    written: dict[str, list[Row]] = {"plain": [], "committed": [], "aborted": [], "open": []}
    with pylog.open(
        path,
        clock=ManualClock(TS0 + 10_000_000),
        remote_storage=url,
        remote_storage_options=options,
        remote_log_manager_task_interval_ms=-1,
    ) as log:
        log.create_topic(TOPIC, 3, segment_bytes=2048, remote_storage_enable=True)
        plain = log.producer(value_serializer=None, key_serializer=None)

        def send(producer: Any, kind: str, n: int) -> None:
            futs = [
                (producer.send(TOPIC, b"%s-%d" % (kind.encode(), i), key=b"k%d" % i, timestamp_ms=TS0 + i), i)
                for i in range(n)
            ]
            producer.flush()
            for fut, i in futs:
                meta = fut.get()
                written[kind].append(
                    (meta.partition, meta.offset, b"k%d" % i, b"%s-%d" % (kind.encode(), i), TS0 + i)
                )

        send(plain, "plain", 60)
        for kind in ("committed", "aborted", "open"):
            tx = log.producer(transactional_id=kind, value_serializer=None, key_serializer=None)
            tx.init_transactions()
            tx.begin_transaction()
            send(tx, kind, 90)
            if kind == "committed":
                tx.commit_transaction()
            elif kind == "aborted":
                tx.abort_transaction()
            tx.close()
            send(plain, "plain", 30)
        plain.close()
        for part in range(3):
            log.topic(TOPIC).partition(part).roll()
        log.tier()
    shutil.rmtree(path)
    return written


def _committed_consumer_rows(url: str, options: dict[str, Any]) -> list[Row]:
    """The model: what pylog's read_committed consumer of the log opened from the store reads."""
    with pylog.open(url, read_only=True, remote_storage_options=options, clock=ManualClock(TS0)) as replica:
        c = replica.consumer(value_deserializer=None, key_deserializer=None, isolation_level="read_committed")
        tps = replica.topic(TOPIC).partitions()
        c.assign(tps)
        c.seek_to_beginning(*tps)
        got = [(r.partition, r.offset, r.key, r.value, r.timestamp) for r in c.iterate(timeout_ms=0)]
        c.close()
    return sorted(got)


def _check_committed_model(model: list[Row], written: dict[str, list[Row]]) -> None:
    """The consumer's rows, against what was written: no aborted or open record, every committed one, and
    every plain record before its partition's open transaction."""
    first_open = {
        p: min(o for q, o, *_ in written["open"] if q == p) for p in {r[0] for r in written["open"]}
    }
    want = sorted(
        r for kind in ("plain", "committed") for r in written[kind] if r[1] < first_open.get(r[0], 1 << 62)
    )
    assert model == want


def test_read_committed_plans_of_a_url_use_the_tiered_decisions(tmp_path: Path) -> None:
    url = (tmp_path / "remote").as_uri()
    written = _write_transactions(tmp_path, url, {})
    model = _committed_consumer_rows(url, {})
    _check_committed_model(model, written)
    raw = {"path": url, "subscribe": TOPIC, "kafka.isolation.level": "read_committed"}
    parts = _plan(raw)
    assert any(r.skipped for part in parts for r in part.ranges)  # the aborted batches are left out
    assert _rows_of(parts) == model
    assert _rows_of(_plan({**raw, "minPartitions": "7"})) == model
    stream = PylogStreamReader(read_options({**raw, "startingOffsets": "earliest"}), KAFKA_JSON)
    start = stream.initialOffset()
    end = stream.latestOffset(start, stream.getDefaultReadLimit())
    lso = {p: min(o for q, o, *_ in written["open"] if q == p) for p in range(3)}
    assert json.loads(json.dumps(end)) == {TOPIC: {str(p): lso[p] for p in range(3)}}  # never past the LSO
    assert _rows_of(stream.partitions(start, end)) == model


def test_spark_reads_a_url_read_committed_as_the_consumer_does(
    spark: Any, tmp_path: Path, store: tuple[str, dict[str, Any]]
) -> None:
    url, options = store
    written = _write_transactions(tmp_path, url, options)
    model = _committed_consumer_rows(url, options)
    _check_committed_model(model, written)
    df = (
        spark.read.format("pylog")
        .options(**_spark_options(options))
        .option("subscribe", TOPIC)
        .option("kafka.isolation.level", "read_committed")
        .load(url)
    )
    assert _spark_rows(df) == model


@pytest.mark.parametrize("at_call", [1, 4, 5])
def test_tiered_directory_local_retention_during_a_task_reads_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_call: int
) -> None:
    """The local retention deletes uploaded segments while a task runs: after it read the local log start
    (call 1), after it listed a partition's local segments (4), after the segment reader listed them (5).
    The offsets gone locally are read from the store, each once; with failOnDataLoss=false too."""
    import pylog.spark.batches as batches_module
    import pylog.spark.reader as reader_module

    url = (tmp_path / "remote").as_uri()
    path, acked = _tiered_dir(tmp_path, url, {})
    model = _dir_consumer_rows(path, {})
    assert model == sorted(acked.values())
    parts = _plan({"path": str(path), "subscribe": TOPIC, "failOnDataLoss": "false"})
    real = open_partition
    calls: list[int] = []

    def opening(*args: Any) -> Any:
        view = real(*args)
        calls.append(1)
        if len(calls) == at_call:  # every uploaded local copy is past the local retention now
            with pylog.open(path, clock=ManualClock(TS0 + GROUPS[2][0])) as log:
                calls.append(sum(log.apply_retention().values()))
        return view

    monkeypatch.setattr(reader_module, "open_partition", opening)
    monkeypatch.setattr(batches_module, "open_partition", opening)
    before = _local_starts(path)
    assert _rows_of(parts) == model
    assert len(calls) > at_call and calls[at_call] > 0  # the retention ran, and deleted segments
    assert all(_local_starts(path)[p] > before[p] for p in range(3))


@pytest.mark.skipif(not HAS_JAVAC, reason="pylog's JVM reader needs javac")
@pytest.mark.parametrize("change", ["local retention", "uploaded and deleted"])
def test_jvm_reader_of_a_tiered_directory_reads_segments_deleted_locally_after_planning(
    spark: Any, tmp_path: Path, store: tuple[str, dict[str, Any]], change: str
) -> None:
    """After the query was planned, the local retention deletes local copies: of segments the pinned manifest
    names ("local retention"), or of segments uploaded after planning ("uploaded and deleted": the newest
    manifest names them). The JVM reader reads them from the store, each offset once, never as data loss;
    except that it cannot sign URLs for objects uploaded after planning on S3: that task fails, saying to
    re-run (never fewer rows)."""
    url, options = store
    path, acked = _tiered_dir(tmp_path, url, options)
    model = _dir_consumer_rows(path, options)
    assert model == sorted(acked.values())
    planned_starts = _local_starts(path)
    reader = spark.read.format("pylog").options(**_spark_options(options)).option("subscribe", TOPIC)
    planned = _Planned(
        spark, reader.option("failOnDataLoss", "false").option("minPartitions", 5).load(str(path))
    )
    with pylog.open(
        path,
        clock=ManualClock(TS0 + GROUPS[2][0] + 2 * LOCAL_RETENTION_MS),
        remote_storage_options=options,
        remote_log_manager_task_interval_ms=-1,
    ) as log:
        if change == "uploaded and deleted":
            for part in range(3):
                log.topic(TOPIC).partition(part).roll()
            log.tier()
        assert sum(log.apply_retention().values()) > 0
    starts = _local_starts(path)
    assert all(starts[p] > planned_starts[p] for p in range(3))
    if change == "uploaded and deleted" and url.startswith("s3://"):
        with pytest.raises(
            Exception, match=r"RemoteStorageError: offsets .* after the query was planned.*Re-run"
        ):
            planned.rows()
        return
    assert planned.rows() == model


@pytest.mark.skipif(not HAS_JAVAC, reason="pylog's JVM reader needs javac")
def test_jvm_reader_of_a_tiered_directory_follows_fail_on_data_loss(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A pinned remote segment dropped by remote retention after planning: failOnDataLoss=true fails the task
    with OffsetOutOfRangeError, false skips those offsets only, as the Python path does."""
    url = (tmp_path / "remote").as_uri()
    path, _ = _tiered_dir(tmp_path, url, {})
    model = _dir_consumer_rows(path, {})
    reader = spark.read.format("pylog").option("subscribe", TOPIC)
    strict = _Planned(spark, reader.load(str(path)))
    lenient = _Planned(spark, reader.option("failOnDataLoss", "false").load(str(path)))
    python_lenient = _plan({"path": str(path), "subscribe": TOPIC, "failOnDataLoss": "false"})
    lo, hi = _drop_first_segment(url, 1)
    with pytest.raises(Exception, match=rf"OffsetOutOfRangeError: data loss reading {TOPIC}-1 .*dropped"):
        strict.rows()
    got = lenient.rows()
    assert got == [r for r in model if not (r[0] == 1 and lo <= r[1] < hi)]
    assert got == _rows_of(python_lenient)


@pytest.mark.skipif(not HAS_JAVAC, reason="pylog's JVM reader needs javac")
def test_jvm_reader_of_a_tiered_directory_read_committed(spark: Any, tmp_path: Path) -> None:
    url = (tmp_path / "remote").as_uri()
    path, written = _tiered_transactions_dir(tmp_path, url)
    with pylog.open(path, clock=ManualClock(TS0), remote_log_manager_task_interval_ms=-1) as log:
        c = log.consumer(value_deserializer=None, key_deserializer=None, isolation_level="read_committed")
        tps = log.topic(TOPIC).partitions()
        c.assign(tps)
        c.seek_to_beginning(*tps)
        model = sorted((r.partition, r.offset, r.key, r.value, r.timestamp) for r in c.iterate(timeout_ms=0))
        c.close()
    _check_committed_model(model, written)
    for splits in ("1", "7"):
        df = (
            spark.read.format("pylog")
            .option("subscribe", TOPIC)
            .option("kafka.isolation.level", "read_committed")
            .option("minPartitions", splits)
            .load(str(path))
        )
        assert _on_jvm(df)
        assert _spark_rows(df) == model
    raw = {"path": str(path), "subscribe": TOPIC, "kafka.isolation.level": "read_committed"}
    assert _rows_of(_plan(raw)) == model  # the Python path's tasks


@pytest.mark.skipif(not HAS_JAVAC, reason="pylog's JVM reader needs javac")
def test_a_directory_tiering_to_a_store_the_jvm_reader_cannot_read_stays_on_the_python_path(
    spark: Any, tmp_path: Path
) -> None:
    from pylog.tiered.location import write_remote_storage

    url = (tmp_path / "remote").as_uri()
    path, _ = _tiered_dir(tmp_path, url, {})
    df = spark.read.format("pylog").option("subscribe", TOPIC).load(str(path))
    assert _on_jvm(df)
    write_remote_storage(str(path), "gs://bucket/prefix")
    df = spark.read.format("pylog").option("subscribe", TOPIC).load(str(path))
    assert not _on_jvm(df)
