"""pylog's JVM reader of a log in an object store (``load("file:///...")``, ``load("s3://...")``).

A log is written, tiered and its local directory deleted; the model is what pylog's consumer reads from the
store (``pylog.open(url, read_only=True)``), and every Spark query is also run on the Python path
(``spark.pylog.native.enabled=false``) and must give the same rows. The S3 store is the moto server of
tests/conftest.py, reached through the fault-injecting proxy of tests/fault/fault_proxy.py: the driver
presigns the GET URLs for the proxy's address, so the executor JVM's requests go through it and the tests can
count them and inject 5xx, cut bodies, 403 and 404 answers. (moto accepts presigned GETs with a Range header,
but does not check their signature or expiry: a refused URL is a 403 the proxy injects.)"""

from __future__ import annotations

import json
import re
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import pytest
from spark_helpers import needs_javac

import pylog
from pylog.clock import ManualClock
from pylog.errors import ConfigError
from pylog.spark import jvm
from pylog.spark.reader import PylogReader
from pylog.spark.remote import PRESIGN_KEY, RemoteRead, jvm_plan, open_store
from pylog.spark.source import read_options
from pylog.tiered.manifest import KEEP_VERSIONS, listed_versions, publish_manifest, read_manifest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fault"))
from fault_proxy import FaultProxy, Rule

pytestmark = [pytest.mark.spark, needs_javac]

TS0 = 1_700_000_000_000
TOPIC = "ev"
N = 1500
Row = tuple[Any, ...]  # partition, offset, key, value, timestamp ms, headers


def _write(path: Path, url: str, options: dict[str, Any]) -> None:
    """``N`` records (msgpack values, some headers, some None keys) to ``TOPIC`` (3 partitions, 4 KiB
    segments), every segment rolled and tiered, then the local directory deleted."""
    with pylog.open(
        path,
        clock=ManualClock(TS0 + 10_000_000),
        remote_storage=url,
        remote_storage_options=options,
        remote_log_manager_task_interval_ms=-1,
    ) as log:
        log.create_topic(TOPIC, 3, segment_bytes=4096, index_interval_bytes=512, remote_storage_enable=True)
        p = log.producer(key_serializer=None, batch_size=700)
        for i in range(N):
            key = None if i % 7 == 0 else b"k%d" % (i % 13)
            headers = [("h", b"%d" % i), ("e", None)] if i % 5 == 0 else None
            p.send(TOPIC, {"n": i, "s": f"s{i}"}, key=key, headers=headers, timestamp_ms=TS0 + i)
        p.close()
        for part in range(3):
            log.topic(TOPIC).partition(part).roll()
        log.tier()
    shutil.rmtree(path)


def _consumer_rows(url: str, options: dict[str, Any]) -> list[Row]:
    with pylog.open(url, read_only=True, remote_storage_options=options) as replica:
        c = replica.consumer(value_deserializer=None, key_deserializer=None)
        tps = replica.topic(TOPIC).partitions()
        c.assign(tps)
        c.seek_to_beginning(*tps)
        got = [
            (r.partition, r.offset, r.key, r.value, r.timestamp, [(k, v) for k, v in r.headers])
            for r in c.iterate(timeout_ms=0)
        ]
        c.close()
    return sorted(got)


def _spark_options(options: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key, value in options.items():
        if key == "retry_config":
            continue
        if isinstance(value, dict):
            out.update({f"remoteStorage.{key}.{k}": str(v).lower() for k, v in value.items()})
        else:
            out[f"remoteStorage.{key}"] = str(value)
    return out


class Store:
    """A tiered log in one object store: its URL, the store options (as ``pylog.open`` and as reader options)
    and the consumer's rows. ``proxy`` fronts the moto server (None for file://)."""

    def __init__(
        self, url: str, options: dict[str, Any], proxy: FaultProxy | None, model: list[Row] | None = None
    ) -> None:
        self.url = url
        self.options = options
        self.reader_options = _spark_options(options)
        self.proxy = proxy
        self.model = _consumer_rows(url, options) if model is None else model


@pytest.fixture(scope="module")
def proxy(moto_s3: tuple[str, dict[str, Any]]) -> Iterator[FaultProxy]:
    _, options = moto_s3
    with FaultProxy(str(options["endpoint"])) as p:
        _PROXIES.append(p)
        yield p
        _PROXIES.remove(p)


def _s3(moto_s3: tuple[str, dict[str, Any]], proxy: FaultProxy, prefix: str, tmp: Path) -> Store:
    bucket, options = moto_s3
    url = f"s3://{bucket}/{prefix}"
    options = {**options, "endpoint": proxy.endpoint}
    _write(tmp / "log", url, options)
    return Store(url, options, proxy)


def _file(tmp: Path) -> Store:
    url = (tmp / "remote").as_uri()
    _write(tmp / "log", url, {})
    return Store(url, {}, None)


@pytest.fixture(scope="module", params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Store:
    """A log tiered to the store, shared by the tests that only read it."""
    tmp = tmp_path_factory.mktemp(f"jvm-remote-{request.param}")
    if request.param == "file":
        return _file(tmp)
    return _s3(request.getfixturevalue("moto_s3"), request.getfixturevalue("proxy"), "jvm-shared", tmp)


@pytest.fixture(params=["file", "s3"])
def own_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A log tiered to a store of this test's own (it damages the store)."""
    if request.param == "file":
        return _file(tmp_path)
    return _s3(
        request.getfixturevalue("moto_s3"), request.getfixturevalue("proxy"), request.node.name, tmp_path
    )


_PROXIES: list[FaultProxy] = []


@pytest.fixture(autouse=True)
def _clear_proxy_rules() -> Iterator[None]:
    """Each test's injected faults end with it."""
    yield
    for p in _PROXIES:
        p.clear()


def _read(spark: Any, st: Store, **options: Any) -> Any:
    reader = spark.read.format("pylog").options(**st.reader_options).option("subscribe", TOPIC)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(st.url)


def _on_jvm(df: Any) -> bool:
    return "(JVM reader)" in str(df._jdf.queryExecution().executedPlan().toString())


def _rows(df: Any) -> list[Row]:
    cols = ["partition", "offset", "key", "value", "unix_millis(timestamp) AS ts", "headers"]
    out = []
    for r in df.selectExpr(*cols).collect():
        headers = [
            (h["key"], None if h["value"] is None else bytes(h["value"])) for h in (r["headers"] or [])
        ]
        out.append((r[0], r[1], _b(r[2]), _b(r[3]), r[4], headers))
    return sorted(out)


def _b(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def _python_path(spark: Any, df_of: Any) -> Any:
    """What ``df_of()`` collects with the JVM reader off."""
    spark.conf.set(jvm.ENABLED, "false")
    try:
        df = df_of()
        assert not _on_jvm(df)
        return _rows(df)
    finally:
        spark.conf.unset(jvm.ENABLED)


def _segment_keys(st: Store, partition: int) -> list[str]:
    manifest, _ = read_manifest(open_store(st.url, st.options), TOPIC, partition)
    assert manifest is not None
    return [s.key for s in manifest.segments]


def test_reads_the_store_on_the_jvm_as_the_python_path_and_the_consumer(spark: Any, store: Store) -> None:
    model = store.model
    assert len(model) == N and len({r[0] for r in model}) == 3
    assert all(len(_segment_keys(store, p)) >= 3 for p in range(3))  # several segments per partition
    df_of = lambda: _read(spark, store, includeHeaders="true", minPartitions=5)  # noqa: E731
    df = df_of()
    assert _on_jvm(df)
    if store.proxy is not None:
        store.proxy.clear()
    got = _rows(df)
    assert got == model
    if store.proxy is not None:  # the executor JVM read the segments through presigned ranged GETs
        gets = store.proxy.seen("GET", r"/segments/.*\.log$")
        assert gets and all(s.range is not None and "X-Amz-Signature=" in s.query for s in gets)
    assert got == _python_path(spark, df_of)


def test_ranges_inside_segments_and_pushed_filters(spark: Any, store: Store) -> None:
    model = store.model
    starting = {TOPIC: {"0": 37, "1": -2, "2": 101}}
    ending = {TOPIC: {"0": 411, "1": 250, "2": -1}}
    lo, hi = TS0 + 300, TS0 + 1200

    def df_of() -> Any:
        return (
            _read(
                spark,
                store,
                includeHeaders="true",
                startingOffsets=json.dumps(starting),
                endingOffsets=json.dumps(ending),
                minPartitions=4,
            )
            .where(f"timestamp >= timestamp_millis({lo}) AND timestamp < timestamp_millis({hi})")
            .where("offset <> 200")
        )

    df = df_of()
    assert _on_jvm(df)
    bounds = {0: (37, 411), 1: (0, 250), 2: (101, 1 << 62)}
    want = [r for r in model if bounds[r[0]][0] <= r[1] < bounds[r[0]][1] and lo <= r[4] < hi and r[1] != 200]
    assert want and _rows(df) == want
    assert _python_path(spark, df_of) == want
    # an offset filter alone (pushed to the planner): a range that starts and ends inside segments
    only = _read(spark, store).where("partition = 1 AND offset >= 123 AND offset < 321")
    assert _on_jvm(only)
    assert sorted(r.offset for r in only.select("offset").collect()) == [
        r[1] for r in model if r[0] == 1 and 123 <= r[1] < 321
    ]


def test_msgpack_value_columns(spark: Any, store: Store) -> None:
    def df_of() -> Any:
        return _read(spark, store, valueFormat="msgpack", valueSchema="n long, s string").select(
            "partition", "offset", "n", "s"
        )

    df = df_of()
    assert _on_jvm(df)
    want = sorted((r[0], r[1], msgpack.unpackb(r[3])["n"], msgpack.unpackb(r[3])["s"]) for r in store.model)
    assert sorted(tuple(r) for r in df.collect()) == want
    spark.conf.set(jvm.ENABLED, "false")
    try:
        assert sorted(tuple(r) for r in df_of().collect()) == want
    finally:
        spark.conf.unset(jvm.ENABLED)


def test_a_bit_flip_in_a_remote_object_is_a_corrupt_record_error_naming_it(
    spark: Any, own_store: Store
) -> None:
    key = _segment_keys(own_store, 1)[1]
    objects = open_store(own_store.url, own_store.options)
    data = bytearray(objects.get(key))
    data[len(data) // 2] ^= 0x10  # inside a record (the header checks pass; the CRC does not)
    objects.put(key, bytes(data))
    df = _read(spark, own_store)
    assert _on_jvm(df)
    with pytest.raises(
        Exception, match=r"pylog\.errors\.CorruptRecordError: corrupt batch in remote segment"
    ) as e:
        df.count()
    assert key in str(e.value)


def _drop_while_read(
    st: Store, partition: int, run: Any, later_publishes: int = 0
) -> tuple[Any, dict[str, Any]]:
    """Run ``run()`` (a Spark query) in a thread; when its task asks the store for the partition's first
    segment, remote retention drops that segment (a manifest version without it is published, then the
    object deleted), ``later_publishes`` more versions are published (uploads after it, which delete the
    older versions), and the request goes on. The segment and ``{"rows": ...}`` or ``{"error": ...}``."""
    assert st.proxy is not None
    objects = open_store(st.url, st.options)
    manifest, _ = read_manifest(objects, TOPIC, partition)
    assert manifest is not None
    first = manifest.segments[0]
    release = threading.Event()
    path = re.escape(first.key) + "$"
    st.proxy.add(Rule(method="GET", path=path, times=1, hold=release))
    result: dict[str, Any] = {}

    def go() -> None:
        try:
            result["rows"] = run()
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=go)
    thread.start()
    try:
        for _ in range(1200):  # the task's request is held (not a timing assumption: up to a minute)
            if st.proxy.seen("GET", path) or not thread.is_alive():
                break
            time.sleep(0.05)
        assert st.proxy.seen("GET", path), "the query never read the segment"
        dropped = publish_manifest(
            objects, replace(manifest, segments=manifest.segments[1:]), manifest.version + 1
        )
        assert dropped is not None
        objects.delete(first.key)
        for n in range(later_publishes):
            assert publish_manifest(objects, dropped, dropped.version + 1 + n)
        if later_publishes > KEEP_VERSIONS:  # the version right after the pinned one is gone too
            prefix = f"{TOPIC}/{partition}/manifest/"
            assert manifest.version + 1 not in listed_versions(objects, prefix)
    finally:
        release.set()
        thread.join(120)
    return first, result


def test_a_segment_dropped_after_planning_follows_fail_on_data_loss(
    spark: Any, moto_s3: tuple[str, dict[str, Any]], proxy: FaultProxy, tmp_path: Path
) -> None:
    st = _s3(moto_s3, proxy, "jvm-dropped", tmp_path)
    df = _read(spark, st).select("partition", "offset")
    assert _on_jvm(df)
    gone, result = _drop_while_read(st, 2, df.collect)
    error = str(result.get("error"))
    assert "pylog.errors.OffsetOutOfRangeError: data loss" in error and gone.key in error, result
    assert "failOnDataLoss=false" in error
    lenient = _read(spark, st, failOnDataLoss="false").select("partition", "offset")
    assert _on_jvm(lenient)
    # the next segment, the first one now; then enough uploads that the versions the plan knew of are deleted
    gone, result = _drop_while_read(st, 2, lenient.collect, later_publishes=3 * KEEP_VERSIONS)
    assert "rows" in result, result
    want = [
        (r[0], r[1])
        for r in st.model
        if not (r[0] == 2 and r[1] < gone.next_offset)  # the earlier segment was dropped before planning
    ]
    assert sorted(tuple(r) for r in result["rows"]) == want


def test_an_object_missing_while_its_manifest_names_it_is_never_skipped(spark: Any, tmp_path: Path) -> None:
    """No manifest was published after the pinned one: a missing object is the store's failure, not
    retention, on both paths and whatever failOnDataLoss says."""
    st = _file(tmp_path)
    key = _segment_keys(st, 1)[2]
    Path(st.url.removeprefix("file://"), key).unlink()
    df = _read(spark, st, failOnDataLoss="false")
    assert _on_jvm(df)
    with pytest.raises(
        Exception, match=r"pylog\.errors\.RemoteStorageError: remote segment .* still names it"
    ) as e:
        df.count()
    assert key in str(e.value)
    spark.conf.set(jvm.ENABLED, "false")
    try:
        with pytest.raises(Exception, match="RemoteStorageError"):
            _read(spark, st, failOnDataLoss="false").count()
    finally:
        spark.conf.unset(jvm.ENABLED)


def test_transient_failures_are_retried(
    spark: Any,
    moto_s3: tuple[str, dict[str, Any]],
    proxy: FaultProxy,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    st = _s3(moto_s3, proxy, "jvm-transient", tmp_path_factory.mktemp("jvm-transient"))
    key = _segment_keys(st, 0)[1]
    path = key.replace(".", r"\.") + "$"
    proxy.clear()  # forget the requests of writing the log and reading the model
    proxy.add(Rule(method="GET", path=path, times=2, status=503))
    proxy.add(Rule(method="GET", path=path, times=1, drop_response_after=100))  # a body cut short
    proxy.add(Rule(method="GET", path=path, times=1, status=500))
    df = _read(spark, st).select("partition", "offset", "value")
    assert _on_jvm(df)
    got = sorted((r[0], r[1], bytes(r[2])) for r in df.collect())
    assert got == [(r[0], r[1], r[3]) for r in st.model]
    tries = [s.action for s in proxy.seen("GET", path)]
    assert tries[:4] == ["status 503", "status 503", "drop response after 100", "status 500"]
    assert tries[4:] and set(tries[4:]) == {"pass"}


def test_a_refused_presigned_url_says_to_raise_the_expiry(spark: Any, store: Store) -> None:
    if store.proxy is None:
        pytest.skip("a file:// store is read as files: nothing is signed")
    store.proxy.add(Rule(method="GET", path=r"/segments/", times=None, status=403))
    df = _read(spark, store, **{"remoteStorage.presignExpirySeconds": "120"})
    assert _on_jvm(df)
    with pytest.raises(Exception, match=r"pylog\.errors\.RemoteStorageError: .*presigned URL") as e:
        df.count()
    assert "remoteStorage.presignExpirySeconds" in str(e.value) and "120 s" in str(e.value)


def test_the_plan_carries_presigned_urls_and_no_credentials(store: Store) -> None:
    opts = {
        "path": store.url,
        "subscribe": TOPIC,
        **store.reader_options,
        "remoteStorage.presignExpirySeconds": "900",
    }
    parts = PylogReader(read_options(opts), "{}").partitions()
    remote = parts[0].spec.remote
    assert isinstance(remote, RemoteRead) and remote.options[PRESIGN_KEY] == 900
    plan = json.loads(jvm_plan(remote))
    segs = [s for tp in plan["segments"] for s in tp[2]]
    assert segs and plan["expirySeconds"] == 900
    for topic, partition, _, newer in plan["segments"]:  # versions after the pinned one, KEEP_VERSIONS apart
        manifest, _ = read_manifest(open_store(store.url, store.options), topic, partition)
        assert manifest is not None and [key for key, _ in newer] == [
            f"{topic}/{partition}/manifest/{manifest.version + 1 + j * KEEP_VERSIONS:020d}.json"
            for j in range(len(newer))
        ]
        assert len(newer) > 1 and all((url is None) == (store.proxy is None) for _, url in newer)
    if store.proxy is None:
        assert plan["store"] == "file" and all(s[5] is None for s in segs)
        assert Path(plan["root"], segs[0][4]).is_file()
    else:
        assert plan["store"] == "signed"
        assert all("X-Amz-Expires=900" in s[5] and s[5].startswith(store.proxy.endpoint) for s in segs)
        secret = "pylog-secret-that-stays-on-the-driver"
        signed = jvm_plan(replace(remote, options={**remote.options, "secret_access_key": secret}))
        assert json.loads(signed)["store"] == "signed" and secret not in signed


@pytest.mark.parametrize("value", ["0", "-5", "604801", "1h", ""])
def test_presign_expiry_is_checked(value: str) -> None:
    with pytest.raises(ConfigError, match="presignExpirySeconds"):
        read_options({"path": "s3://b/p", "subscribe": TOPIC, "remoteStorage.presignExpirySeconds": value})


def test_read_committed_skips_what_the_python_path_and_the_consumer_skip(spark: Any, tmp_path: Path) -> None:
    """Committed, aborted and open transactions between plain records, tiered to a file:// store: the JVM
    reader leaves out the aborted batches the planner marked and ends at the last stable offset."""
    url = (tmp_path / "remote").as_uri()
    with pylog.open(
        tmp_path / "log", clock=ManualClock(TS0), remote_storage=url, remote_log_manager_task_interval_ms=-1
    ) as log:
        log.create_topic(TOPIC, 2, segment_bytes=2048, remote_storage_enable=True)
        plain = log.producer(value_serializer=None)
        for kind in ("committed", "aborted", "open"):
            for i in range(40):
                plain.send(TOPIC, b"plain-%d" % i, timestamp_ms=TS0 + i)
            plain.flush()
            tx = log.producer(transactional_id=kind, value_serializer=None)
            tx.init_transactions()
            tx.begin_transaction()
            for i in range(60):
                tx.send(TOPIC, b"%s-%d" % (kind.encode(), i), timestamp_ms=TS0 + i)
            if kind == "committed":
                tx.commit_transaction()
            elif kind == "aborted":
                tx.abort_transaction()
            else:
                tx.flush()
            tx.close()
        plain.close()
        for part in range(2):
            log.topic(TOPIC).partition(part).roll()
        log.tier()
    shutil.rmtree(tmp_path / "log")
    with pylog.open(url, read_only=True, clock=ManualClock(TS0)) as replica:
        c = replica.consumer(value_deserializer=None, isolation_level="read_committed")
        c.assign(replica.topic(TOPIC).partitions())
        c.seek_to_beginning(*replica.topic(TOPIC).partitions())
        model = sorted((r.partition, r.offset, r.value) for r in c.iterate(timeout_ms=0))
        c.close()
    values = {v for _, _, v in model}
    assert any(v.startswith(b"committed") for v in values)
    assert not any(v.startswith((b"aborted", b"open")) for v in values)
    st = Store(url, {}, None, model=[])

    def df_of() -> Any:
        return _read(spark, st, **{"kafka.isolation.level": "read_committed", "minPartitions": 3})

    df = df_of().select("partition", "offset", "value")
    assert _on_jvm(df)
    assert sorted((r[0], r[1], bytes(r[2])) for r in df.collect()) == model
    spark.conf.set(jvm.ENABLED, "false")
    try:
        python = df_of().select("partition", "offset", "value")
        assert sorted((r[0], r[1], bytes(r[2])) for r in python.collect()) == model
    finally:
        spark.conf.unset(jvm.ENABLED)


def test_the_offset_index_is_only_a_hint(spark: Any, own_store: Store) -> None:
    """Index objects whose entries point one byte past their batches: reads that start inside segments
    walk from each segment's first byte instead, and return the same rows."""
    objects = open_store(own_store.url, own_store.options)
    manifest, _ = read_manifest(objects, TOPIC, 0)
    assert manifest is not None
    damaged = 0
    for seg in manifest.segments:
        if seg.index is None:
            continue
        raw = bytearray(objects.get(seg.index.key))
        for i in range(0, len(raw) - 7, 8):
            pos = int.from_bytes(raw[i + 4 : i + 8], "little")
            raw[i + 4 : i + 8] = (pos + 1).to_bytes(4, "little")
            damaged += 1
        objects.put(seg.index.key, bytes(raw))
    assert damaged
    df = _read(spark, own_store).where("partition = 0 AND offset >= 50").select("offset")
    assert _on_jvm(df)
    assert sorted(r.offset for r in df.collect()) == [
        r[1] for r in own_store.model if r[0] == 0 and r[1] >= 50
    ]


def test_stores_the_jvm_reader_cannot_read_say_why() -> None:
    """A plan the JVM reader cannot use names the reason its task fails with (the driver's scan adds how to
    use the Python path): a scheme other than file:// and s3:// (a tiered log directory's plan too: it also
    names the local log starts at planning), a store the driver cannot sign for."""
    from pylog.tiered.manifest import RemoteSegment

    seg = RemoteSegment(0, 10, 100, TS0, 7, f"{TOPIC}/0/segments/00000000000000000000-ab.log")
    segments = {(TOPIC, 0): (seg,)}
    gcs = json.loads(jvm_plan(RemoteRead("gs://bucket/prefix", {}, segments)))
    assert gcs["store"] == "none" and "gs://" in gcs["reason"]
    bad = {"region": "us-east-1", "client_options": {"timeout": "not a duration"}}
    unsigned = json.loads(jvm_plan(RemoteRead("s3://bucket/prefix", bad, segments)))
    assert unsigned["store"] == "none" and unsigned["reason"].startswith("cannot presign GET URLs")
    tiered = json.loads(jvm_plan(RemoteRead("gs://bucket/prefix", {}, segments, {(TOPIC, 0): 10})))
    assert (
        tiered["store"] == "none"
        and "gs://" in tiered["reason"]
        and tiered["localStarts"] == [[TOPIC, 0, 10]]
    )
    signed = json.loads(
        jvm_plan(
            RemoteRead(
                "s3://bucket/prefix",
                {"region": "us-east-1", "access_key_id": "a", "secret_access_key": "b"},
                segments,
            )
        )
    )
    assert signed["store"] == "signed" and signed["expirySeconds"] == 3600 and signed["localStarts"] == []
    assert signed["segments"] == [
        [TOPIC, 0, [[0, 10, 100, TS0, seg.key, signed["segments"][0][2][0][5], None, None, 0]], []]
    ]
    assert "X-Amz-Expires=3600" in signed["segments"][0][2][0][5]


@pytest.mark.parametrize("fail", ["true", "false"])
def test_a_tiered_directory_local_segment_deleted_during_the_task_is_read_from_the_store(
    spark: Any, moto_s3: tuple[str, dict[str, Any]], proxy: FaultProxy, tmp_path: Path, fail: str
) -> None:
    """A tiered log directory read on the JVM: the task lists the local segments, reads the offsets below
    the local log start from S3 first, and while its first GET is held the local retention deletes the local
    copies of the uploaded segments it listed. Those are read from the store (the pinned segments), every
    offset once, never as data loss (with failOnDataLoss=false too); the rows are the consumer's."""
    bucket, options = moto_s3
    url = f"s3://{bucket}/{tmp_path.name}-tiered"
    options = {**options, "endpoint": proxy.endpoint}
    path = tmp_path / "log"
    retention = 600_000
    clock = ManualClock(TS0)
    with pylog.open(
        path,
        clock=clock,
        remote_storage=url,
        remote_storage_options=options,
        remote_log_manager_task_interval_ms=-1,
    ) as log:
        log.create_topic(
            TOPIC, 1, segment_bytes=4096, remote_storage_enable=True, local_retention_ms=retention
        )
        p = log.producer(key_serializer=None, batch_size=700)
        for group, (ts, n) in enumerate(((TS0, 600), (TS0 + 1_000_000, 600), (TS0 + 2_000_000, 200))):
            for i in range(n):
                p.send(TOPIC, {"n": i, "g": group}, key=b"k%d" % (i % 13), timestamp_ms=ts + i)
            p.flush()
            if group < 2:
                log.topic(TOPIC).partition(0).roll()
                log.tier()
        p.close()
        clock.advance(1_000_000 + retention // 2)  # the first group's local copies go
        log.apply_retention()
        planned = log.topic(TOPIC).partition(0).local_log_start_offset
        assert planned > 0
    with pylog.open(path, read_only=True, remote_storage_options=options, clock=ManualClock(TS0)) as replica:
        c = replica.consumer(value_deserializer=None, key_deserializer=None)
        c.assign(replica.topic(TOPIC).partitions())
        c.seek_to_beginning(*replica.topic(TOPIC).partitions())
        model = sorted((r.partition, r.offset, r.key, r.value) for r in c.iterate(timeout_ms=0))
        c.close()
    assert [r[1] for r in model] == list(range(1400))
    manifest, _ = read_manifest(open_store(url, options), TOPIC, 0)
    assert manifest is not None
    first = re.escape(manifest.segments[0].key) + "$"
    reader_options = _spark_options(options)
    df = (
        spark.read.format("pylog")
        .options(**reader_options)
        .option("subscribe", TOPIC)
        .option("failOnDataLoss", fail)
        .load(str(path))
        .select("partition", "offset", "key", "value")
    )
    assert _on_jvm(df)
    proxy.clear()
    release = threading.Event()
    proxy.add(Rule(method="GET", path=first, times=1, hold=release))
    result: dict[str, Any] = {}

    def go() -> None:
        try:
            result["rows"] = df.collect()
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=go)
    thread.start()
    try:
        for _ in range(1200):  # the task's request is held (not a timing assumption: up to a minute)
            if proxy.seen("GET", first) or not thread.is_alive():
                break
            time.sleep(0.05)
        assert proxy.seen("GET", first), "the query never read the first remote segment"
        before = {f.name for f in (path / f"{TOPIC}-0").glob("*.log")}
        with pylog.open(
            path,
            clock=ManualClock(TS0 + 4_000_000),
            remote_storage_options=options,
            remote_log_manager_task_interval_ms=-1,
        ) as log:
            log.apply_retention()  # the second group's local copies (uploaded) go while the task runs
        after = {f.name for f in (path / f"{TOPIC}-0").glob("*.log")}
        assert before - after, "the local retention deleted nothing"
    finally:
        release.set()
        thread.join(120)
    assert "rows" in result, result
    got = sorted((r[0], r[1], _b(r[2]), _b(r[3])) for r in result["rows"])
    assert got == model, fail
    # the deleted local segments' offsets came from the store: GETs of segments above the planned start
    above = [s for s in manifest.segments if s.base_offset >= planned]
    assert above and all(proxy.seen("GET", re.escape(s.key) + "$") for s in above)
