"""Tiered storage over a faulty network: the S3 store (moto on loopback) behind a fault-injecting proxy
(:mod:`fault_proxy`) that answers 500 or 503, stalls, or drops a connection in the middle of an upload or a
ranged read. Retries are small (``MAX_RETRIES``, millisecond backoff) so every test takes seconds; bounds are
asserted by counting the requests the proxy saw, never by time."""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fault_proxy import FaultProxy, Rule

import pylog
from pylog.clock import ManualClock
from pylog.errors import RemoteStorageError
from pylog.structs import TopicPartition
from pylog.tiered.manifest import fence_key, manifest_key, read_manifest, remote_topics
from pylog.tiered.restore import restore
from pylog.tiered.store import ObjectStore

MAX_RETRIES = 2
TS0 = 1_700_000_000_000
SEG_LOG = r"/segments/\d+-[^/]+\.log$"
MANIFEST = r"/manifest/\d+\.json$"

Model = dict[int, tuple[bytes, bytes]]


@pytest.fixture
def net(moto_s3: tuple[str, dict[str, Any]], request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A fresh prefix of the moto bucket: ``url``, ``direct`` (options straight to moto), ``options``
    (through the proxy, small retries) and ``proxy``."""
    bucket, direct = moto_s3
    with FaultProxy(str(direct["endpoint"])) as proxy:
        fast = {
            "init_backoff": timedelta(milliseconds=1),
            "max_backoff": timedelta(milliseconds=4),
            "base": 2,
        }
        options = {
            **direct,
            "endpoint": proxy.endpoint,
            "retry_config": {
                "max_retries": MAX_RETRIES,
                "backoff": fast,
                "retry_timeout": timedelta(seconds=30),
            },
        }
        url = f"s3://{bucket}/net-{request.node.name[:40]}-{secrets.token_hex(4)}"
        yield {"url": url, "direct": direct, "options": options, "proxy": proxy}


def _open(tmp_path: Path, net: dict[str, Any], **kwargs: Any) -> pylog.Log:
    kwargs.setdefault("clock", ManualClock(TS0 + 10_000_000, auto_advance=False))
    kwargs.setdefault("remote_log_manager_task_interval_ms", -1)
    return pylog.open(
        tmp_path / "log", remote_storage=net["url"], remote_storage_options=net["options"], **kwargs
    )


def _produce(log: pylog.Log, n: int, start: int = 0) -> Model:
    p = log.producer(batch_size=300, value_serializer=None)
    sent = [
        (p.send("t", b"v%d:" % i + bytes(i % 61), key=b"k%d" % i, partition=0), i)
        for i in range(start, start + n)
    ]
    p.flush()
    p.close()
    return {f.get().offset: (b"k%d" % i, b"v%d:" % i + bytes(i % 61)) for f, i in sent}


def _read(log: pylog.Log) -> Model:
    c = log.consumer(value_deserializer=None, key_deserializer=None)
    tp = TopicPartition("t", 0)
    c.assign([tp])
    c.seek_to_beginning(tp)
    try:
        return {r.offset: (r.key, r.value) for r in c.iterate(timeout_ms=0)}
    finally:
        c.close()


def _restored(net: dict[str, Any], target: Path) -> Model:
    """The records of the segments the remote manifest names (restored straight from moto)."""
    restore(net["url"], target, remote_storage_options=net["direct"])
    with pylog.open(target, clock=ManualClock()) as log:
        return _read(log) if "t" in log.topics() else {}


def _manifest(net: dict[str, Any]) -> Any:
    return read_manifest(ObjectStore(net["url"], **net["direct"]), "t", 0)[0]


def _named(model: Model, manifest: Any) -> Model:
    if manifest is None:
        return {}
    return {o: r for o, r in model.items() if manifest.log_start_offset <= o < manifest.log_end_offset}


def _local_bases(log: pylog.Log) -> list[int]:
    return [s.base_offset for s in log.topic("t").partition(0).segments]


def _wait(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Wait (real time, bounded: a hang fails) for a thread to reach a state; never decides a verdict."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _sealed_log(tmp_path: Path, net: dict[str, Any], n: int = 300, **config: Any) -> tuple[pylog.Log, Model]:
    log = _open(tmp_path, net)
    config.setdefault("segment_bytes", 2048)
    log.create_topic("t", 1, remote_storage_enable=True, **config)
    model = _produce(log, n)
    log.topic("t").partition(0).roll()
    return log, model


# --- uploads -------------------------------------------------------------------------------------------------


def test_transient_500_and_503_on_uploads_are_retried_and_the_upload_completes(
    tmp_path: Path, net: dict[str, Any]
) -> None:
    proxy: FaultProxy = net["proxy"]
    log, model = _sealed_log(tmp_path, net)
    with log:
        seg_rule = proxy.add(Rule(method="PUT", path=SEG_LOG, status=503, times=MAX_RETRIES))
        man_rule = proxy.add(Rule(method="PUT", path=MANIFEST, status=500, times=1))
        get_rule = proxy.add(Rule(method="GET", path=SEG_LOG, status=503, times=1))  # the read-back check
        (result,) = log.tier()
        assert (
            result.uploaded and result.manifest.log_end_offset == log.topic("t").partition(0).log_end_offset
        )
        assert (seg_rule.hits, man_rule.hits, get_rule.hits) == (MAX_RETRIES, 1, 1)
        assert _restored(net, tmp_path / "restored") == model


def test_a_store_that_keeps_failing_publishes_nothing_keeps_local_segments_and_a_later_pass_completes(
    tmp_path: Path, net: dict[str, Any]
) -> None:
    proxy: FaultProxy = net["proxy"]
    log, model = _sealed_log(tmp_path, net, 200, local_retention_bytes=0)
    with log:
        (first,) = log.tier()  # the baseline manifest
        baseline = _manifest(net)
        assert baseline is not None and first.uploaded
        model |= _produce(log, 200, start=200)
        log.topic("t").partition(0).roll()
        bases = _local_bases(log)

        proxy.clear()
        proxy.add(Rule(method="PUT", times=None, status=503))
        with pytest.raises(RemoteStorageError):
            log.tier()
        # bounded: the first write of the upload was tried 1 + MAX_RETRIES times, then nothing else was written
        puts = proxy.seen("PUT")
        assert len(puts) == 1 + MAX_RETRIES and len({p.path for p in puts}) == 1
        assert _manifest(net) == baseline  # the previous manifest stays authoritative
        assert _restored(net, tmp_path / "r1") == _named(model, baseline)

        manager = log.remote_log_manager
        assert manager is not None
        status = manager.run_once()[TopicPartition("t", 0)]  # a background pass: upload fails, retention runs
        assert status.last_error is not None and status.failures == 2
        # local retention (local_retention_bytes=0) removed only what the baseline names; the rest stays
        assert _local_bases(log) == bases  # a pass whose upload failed deletes nothing locally
        log.apply_retention()  # local retention (local_retention_bytes=0) removes only what the baseline names
        kept = [b for b in bases if b >= baseline.log_end_offset]
        assert _local_bases(log) == kept
        assert log.topic("t").partition(0).local_log_start_offset == baseline.log_end_offset
        assert _read(log) == model  # every acknowledged record: remote below the local start, local above

        proxy.clear()
        status = manager.run_once()[TopicPartition("t", 0)]  # the store is back: the pass completes
        assert status.failures == 0 and status.last_error is None
        final = _manifest(net)
        assert (
            final is not None and final.log_end_offset == log.topic("t").partition(0).local_log_start_offset
        )
        assert (
            _restored(net, tmp_path / "r2")
            == _named(model, final)
            == {o: r for o, r in model.items() if o < final.log_end_offset}
        )
        assert _read(log) == model


@pytest.mark.parametrize("where", ["request-start", "request-middle", "request-end", "response-lost"])
def test_a_connection_dropped_during_a_segment_upload_never_publishes_a_partial_segment(
    tmp_path: Path, net: dict[str, Any], where: str
) -> None:
    proxy: FaultProxy = net["proxy"]
    log, model = _sealed_log(tmp_path, net, 300, local_retention_bytes=0)
    with log:
        plog = log.topic("t").partition(0)
        size = plog.segments[0].size
        cut = {"request-start": 1, "request-middle": size // 2, "request-end": size - 1}.get(where)
        if cut is None:
            rule = proxy.add(Rule(method="PUT", path=SEG_LOG, drop_response_after=0, times=1))
        else:
            rule = proxy.add(Rule(method="PUT", path=SEG_LOG, drop_request_after=cut, times=1))
        store = ObjectStore(net["url"], **net["direct"])
        before = {o.key for o in store.list()}
        (result,) = log.tier()  # one dropped connection: the client's retry completes the upload
        assert rule.hits == 1 and result.uploaded
        # the object whose PUT lost its answer was written whole by the first attempt, and is the one named
        dropped = next(s.path for s in proxy.seen("PUT", SEG_LOG) if s.action != "pass")
        assert any(dropped.endswith("/" + seg.key) for seg in result.manifest.segments)
        assert {o.key for o in store.list()} - before >= {s.key for s in result.manifest.segments}
        manifest = _manifest(net)
        assert _restored(net, tmp_path / "r1") == _named(model, manifest)
        log.apply_retention()
        assert _read(log) == model  # every acknowledged record stays readable, locally or remotely

        proxy.clear()
        model |= _produce(log, 100, start=300)
        plog.roll()
        log.tier()  # a later pass completes
        final = _manifest(net)
        assert final is not None and final.log_end_offset == plog.log_end_offset - _active_records(log)
        assert _restored(net, tmp_path / "r2") == _named(model, final)
        log.apply_retention()
        assert _read(log) == model


def _active_records(log: pylog.Log) -> int:
    plog = log.topic("t").partition(0)
    return plog.log_end_offset - plog.segments[-1].base_offset


def test_the_lost_answer_to_a_manifest_publish_is_resolved_by_the_retry(
    tmp_path: Path, net: dict[str, Any]
) -> None:
    proxy: FaultProxy = net["proxy"]
    log, model = _sealed_log(tmp_path, net, 300)
    with log:
        rule = proxy.add(Rule(method="PUT", path=MANIFEST, drop_response_after=0, times=1))
        (result,) = log.tier()  # the retry finds the version taken, reads it: it is this upload's
        assert rule.hits == 1 and result.uploaded == result.manifest.segments  # reported as this call's
        store = ObjectStore(net["url"], **net["direct"])
        assert [o.key.rsplit("/", 1)[1] for o in store.list("t/0/manifest/")] == [f"{1:020d}.json"]
        final = _manifest(net)
        assert final == result.manifest
        assert final.log_end_offset == log.topic("t").partition(0).segments[-1].base_offset
        assert _restored(net, tmp_path / "r2") == _named(model, final) == model


# --- reads ---------------------------------------------------------------------------------------------------


def _tiered_below_local_start(tmp_path: Path, net: dict[str, Any]) -> tuple[pylog.Log, Model]:
    """A log whose first segments were uploaded and then deleted locally (reads below the local start go to
    the store)."""
    log, model = _sealed_log(tmp_path, net, 400, local_retention_bytes=0)
    log.tier()
    log.apply_retention()
    model |= _produce(log, 20, start=400)
    assert log.topic("t").partition(0).local_log_start_offset > 0
    return log, model


def test_transient_errors_on_remote_reads_are_retried_and_the_records_are_exact(
    tmp_path: Path, net: dict[str, Any]
) -> None:
    proxy: FaultProxy = net["proxy"]
    log, model = _tiered_below_local_start(tmp_path, net)
    with log:
        proxy.clear()
        r503 = proxy.add(Rule(method="GET", path=SEG_LOG, status=503, times=MAX_RETRIES))
        r500 = proxy.add(Rule(method="GET", path=r"\.(index|timeindex|json)$", status=500, times=1))
        assert _read(log) == model
        assert r503.hits == MAX_RETRIES and r500.hits == 1


@pytest.mark.parametrize("cut", [0, 1, 100, 1000])
def test_a_ranged_read_cut_once_is_resumed_for_the_missing_range_and_the_records_are_exact(
    tmp_path: Path, net: dict[str, Any], cut: int
) -> None:
    proxy: FaultProxy = net["proxy"]
    log, model = _tiered_below_local_start(tmp_path, net)
    with log:
        proxy.clear()
        once = proxy.add(Rule(method="GET", path=SEG_LOG, drop_response_after=cut, times=1))
        assert _read(log) == model  # one cut answer: the records, never an error
        assert once.hits == 1
        seen = proxy.seen("GET", SEG_LOG)
        first = next(i for i, s in enumerate(seen) if s.action.startswith("drop response"))
        start, end = _range(seen[first].range)
        # the cut request was asked again for the bytes it had not received, and only those
        again = [s for s in seen[first + 1 :] if s.path == seen[first].path and _range(s.range)[1] == end]
        assert again and _range(again[0].range) == (start + cut, end), [s.range for s in seen]

    proxy.clear()
    always = proxy.add(Rule(method="GET", path=SEG_LOG, drop_response_after=cut, times=None))
    with _open(tmp_path, net) as log, pytest.raises(RemoteStorageError):  # a cold remote cache
        _reread_remote(log)
    assert always.hits >= 1
    # a read whose every answer is cut ends in a typed error after the store's retries, each retry asking for
    # the part still missing: a chain of requests ending at one byte is at most 1 + MAX_RETRIES long
    chains: dict[tuple[str, int], list[int]] = {}
    for s in proxy.seen("GET", SEG_LOG):
        start, end = _range(s.range)
        chains.setdefault((s.path, end), []).append(start)
    assert chains and max(len(c) for c in chains.values()) == 1 + MAX_RETRIES, chains
    for (_, end), starts in chains.items():
        # the proxy lets through ``cut`` bytes of each answer, and never its last byte
        assert all(b == a + min(cut, end - a) for a, b in itertools.pairwise(starts)), chains


def _range(header: str | None) -> tuple[int, int]:
    """``(first, last)`` byte of a ``Range: bytes=first-last`` header."""
    assert header is not None and header.startswith("bytes="), header
    first, _, last = header[len("bytes=") :].partition("-")
    return int(first), int(last)


def _reread_remote(log: pylog.Log) -> Model:
    """Read the partition from offset 0 (below the local log start: from the store)."""
    c = log.consumer(value_deserializer=None, key_deserializer=None)
    tp = TopicPartition("t", 0)
    c.assign([tp])
    c.seek(tp, 0)
    try:
        return {r.offset: (r.key, r.value) for r in c.iterate(timeout_ms=0)}
    finally:
        c.close()


def _assert_bounded(proxy: FaultProxy) -> None:
    """Each distinct ranged GET of a segment object was tried at most 1 + MAX_RETRIES times, and the one that
    failed exactly that many."""
    attempts = Counter((s.path, s.range) for s in proxy.seen("GET", SEG_LOG))
    assert attempts and max(attempts.values()) == 1 + MAX_RETRIES, attempts


def test_a_store_that_is_down_fails_reads_with_a_typed_error_after_bounded_retries(
    tmp_path: Path, net: dict[str, Any]
) -> None:
    proxy: FaultProxy = net["proxy"]
    log, model = _tiered_below_local_start(tmp_path, net)
    with log:
        local_start = log.topic("t").partition(0).local_log_start_offset
        proxy.clear()
        proxy.add(Rule(method="GET", path=SEG_LOG, status=503, times=None))
        with pytest.raises(RemoteStorageError):
            _reread_remote(log)
        _assert_bounded(proxy)
        # local records stay readable while the store is down
        c = log.consumer(value_deserializer=None, key_deserializer=None)
        tp = TopicPartition("t", 0)
        c.assign([tp])
        c.seek(tp, local_start)
        assert {r.offset: (r.key, r.value) for r in c.iterate(timeout_ms=0)} == {
            o: r for o, r in model.items() if o >= local_start
        }
        c.close()


def test_read_only_open_of_the_store_retries_transient_errors_and_fails_typed_when_down(
    tmp_path: Path, net: dict[str, Any]
) -> None:
    proxy: FaultProxy = net["proxy"]
    log, model = _sealed_log(tmp_path, net, 400)
    with log:
        log.tier()
        named = _named(model, _manifest(net))
    assert named
    proxy.clear()
    rules = [proxy.add(Rule(method=m, status=s, times=1)) for m, s in (("GET", 503), ("GET", 500))]
    seg = proxy.add(Rule(method="GET", path=SEG_LOG, status=503, times=MAX_RETRIES))
    with pylog.open(
        net["url"], read_only=True, remote_storage_options=net["options"], clock=ManualClock(TS0)
    ) as ro:
        assert _read(ro) == named
    assert all(r.hits == 1 for r in rules) and seg.hits == MAX_RETRIES

    proxy.clear()
    proxy.add(Rule(status=503, times=None))
    with pytest.raises(RemoteStorageError):
        pylog.open(net["url"], read_only=True, remote_storage_options=net["options"], clock=ManualClock(TS0))
    attempts = Counter((s.method, s.path, s.query, s.range) for s in proxy.requests)
    assert attempts and max(attempts.values()) == 1 + MAX_RETRIES, attempts


# --- a slow store --------------------------------------------------------------------------------------------


def test_a_topic_deleted_while_the_store_refuses_deletes_is_hidden_at_once_and_emptied_by_a_later_pass(
    tmp_path: Path, net: dict[str, Any]
) -> None:
    proxy: FaultProxy = net["proxy"]
    log, _ = _sealed_log(tmp_path, net)
    with log:
        log.tier()
        store = ObjectStore(net["url"], **net["direct"])
        assert store.list("t/0/segments/")
        proxy.clear()
        # obstore deletes an S3 object with a DeleteObjects request (POST /<bucket>?delete)
        refused = proxy.add(Rule(method="POST", path=r"^/[^/]+$", status=503, times=None))
        log.delete_topic("t")  # the local delete proceeds; the remote one fails after the client's retries
        assert log.topics() == []
        assert refused.hits == 1 + MAX_RETRIES  # one object's DELETE, retried, then the deletion stopped
        status = log.tier_status()[TopicPartition("t", 0)]
        assert status.last_error is not None and "deleting the remote data" in status.last_error
        assert remote_topics(store)["topics"] == {}  # the tombstone is published: no reader sees the topic
        assert store.list("t/0/segments/")  # its objects are still there

        proxy.clear()
        assert log.remote_log_manager is not None
        log.remote_log_manager.run_once()  # the store is back: the pass finishes the deletion
        # in two DeleteObjects requests: the segment objects, then the older manifest versions
        assert len(proxy.seen("POST", r"^/[^/]+$")) == 2
        assert store.list("t/0/segments/") == []
        # only the tombstone, and the fence of the version below it (its number stays taken)
        assert [o.key for o in store.list("t/")] == [
            fence_key("t/0/manifest/", 1),
            manifest_key("t", 0, 2),
        ]
        assert TopicPartition("t", 0) not in log.tier_status()
    assert _restored(net, tmp_path / "r") == {}


def test_a_stalled_background_upload_does_not_block_the_writer_or_local_reads(
    tmp_path: Path, net: dict[str, Any]
) -> None:
    proxy: FaultProxy = net["proxy"]
    clock = ManualClock(TS0, auto_advance=False)
    release = threading.Event()
    proxy.add(Rule(method="PUT", path=SEG_LOG, hold=release, times=1))
    proxy.add(Rule(method="PUT", delay=0.01, times=None))  # every other write is slow
    log = _open(tmp_path, net, clock=clock, remote_log_manager_task_interval_ms=1000)
    try:
        log.create_topic("t", 1, segment_bytes=2048, remote_storage_enable=True)
        model = _produce(log, 200)
        log.topic("t").partition(0).roll()
        manager = log.remote_log_manager
        assert manager is not None
        clock.advance(1000)
        manager.wake()
        _wait(lambda: bool(proxy.seen("PUT", SEG_LOG)), "the background upload to reach the store")
        # the upload is stalled in the store: the writer and local readers go on
        for k in range(5):
            model |= _produce(log, 100, start=200 + 100 * k)
            assert _read(log) == model
        assert manager.passes == 0 and _manifest(net) is None  # the upload had not finished meanwhile
        release.set()
        _wait(lambda: manager.passes >= 1, "the stalled pass to finish")
        status = log.tier_status()[TopicPartition("t", 0)]
        assert status.last_error is None and status.uploaded > 0
        assert _restored(net, tmp_path / "r") == _named(model, _manifest(net)) != {}
    finally:
        release.set()
        log.close()
