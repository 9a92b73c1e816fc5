"""Tiered storage against a real S3-protocol server on loopback (moto's ThreadedMotoServer, in-process).

The server is the session's (``moto_s3`` in tests/conftest.py), each test on a prefix of its own. Skipped, with
the reason, when moto's server mode is not installed (``pip install 'moto[server]'``, part of
the ``dev`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pylog
from pylog.clock import ManualClock
from pylog.tiered.manifest import PartitionManifest, publish_manifest
from pylog.tiered.restore import restore
from pylog.tiered.store import ObjectStore


def test_s3_round_trip_create_if_absent_and_ranged_reads(
    tmp_path: Path, s3_remote: tuple[str, dict[str, Any]]
) -> None:
    url, s3 = s3_remote
    with pylog.open(
        tmp_path / "log", clock=ManualClock(), remote_storage=url, remote_storage_options=s3
    ) as log:
        log.create_topic("t", 2, segment_bytes=2048, remote_storage_enable=True)
        p = log.producer(batch_size=300, value_serializer=None)
        sent = [(p.send("t", b"value-%d" % i, key=b"%d" % i), i) for i in range(800)]
        p.flush()
        p.close()
        model = {}
        for fut, i in sent:
            meta = fut.get()
            model[(meta.partition, meta.offset)] = (b"%d" % i, b"value-%d" % i)
        for n in range(2):
            log.topic("t").partition(n).roll()
        results = log.tier()
        assert all(r.uploaded for r in results)
        assert all(not r.uploaded for r in log.tier())  # idempotent on S3 too

    store = ObjectStore(url, **s3)
    seg = results[0].manifest.segments[0]
    local = (tmp_path / "log" / "t-0" / f"{seg.base_offset:020d}.log").read_bytes()
    assert store.get_range(seg.key, 61, 100) == local[61:161]
    draft = PartitionManifest("x", 0, 1, {})
    assert publish_manifest(store, draft, 1) is not None
    assert publish_manifest(store, draft, 1) is None  # S3 conditional write: If-None-Match

    restore(url, tmp_path / "restored", remote_storage_options=s3)
    with pylog.open(tmp_path / "restored") as log:
        c = log.consumer(value_deserializer=None, key_deserializer=None)
        tps = log.topic("t").partitions()
        c.assign(tps)
        c.seek_to_beginning(*tps)
        got = {(r.partition, r.offset): (r.key, r.value) for r in c.iterate(timeout_ms=0)}
        c.close()
    assert got == model
