"""Tiered storage: upload throughput of ``Log.tier()`` against a plain put of the same bytes.

Every case writes the same records (untimed) to one partition of a topic with 1 MiB segments and seals the
last one, then times the upload of every sealed segment with its ``.index`` and ``.timeindex`` files:

- ``tiered_upload_file`` / ``tiered_upload_s3``: ``Log.tier()``: each object streamed with create-if-absent
  (CRC-32C computed on the way), read back and checked, then one manifest version published; on a
  ``file://`` directory (each object fsynced) and on a moto S3 server on loopback (its own process).
- ``tiered_put_file`` / ``tiered_put_s3``: the floor: ``obstore.put(store, key, Path(file))`` of the same
  files with the same obstore client (the one ``ObjectStore`` wraps), nothing verified or published (and not
  fsynced on ``file://``, as obstore's local store does not).

Throughput is given in records (and MB of record payload) per second, so the pairs compare directly.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.cases import Compare, case
from benchmarks.cases.tiered_read import BUCKET, _start_moto
from benchmarks.cases.workload import arrays, result, skipped

TOPIC = "upload"
SEGMENT_BYTES = 1 << 20


def _fill(log: Any, records: int, seed: int) -> list[str]:
    """Write the records, seal the last segment; the files of the sealed segments."""
    keys, values = arrays(records, seed)
    log.create_topic(TOPIC, partitions=1, segment_bytes=SEGMENT_BYTES, remote_storage_enable=True)
    producer = log.producer(acks=1, value_serializer=None)
    producer.send_batch(TOPIC, keys=keys, values=values)
    producer.close()
    plog = log.topic(TOPIC).partition(0)
    plog.flush()
    plog.roll()
    return [p for seg in plog.segments[:-1] for p in (seg.path, seg.index_path, seg.timeindex_path)]


def _tier(workdir: Path, records: int, seed: int, url: str, options: dict[str, Any]) -> dict[str, Any]:
    import pylog

    with pylog.open(
        workdir / "log",
        remote_storage=url,
        remote_storage_options=options,
        remote_log_manager_task_interval_ms=-1,
    ) as log:
        files = _fill(log, records, seed)
        nbytes = sum(Path(f).stat().st_size for f in files)
        t0 = time.perf_counter()
        results = log.tier()
        seconds = time.perf_counter() - t0
    manifest = results[0].manifest
    if manifest.log_end_offset != records:
        raise RuntimeError(f"tiered up to {manifest.log_end_offset}, wrote {records}")
    return result(records, seconds, objects=len(files), object_mb=round(nbytes / 1e6, 2))


def _put(workdir: Path, records: int, seed: int, url: str, options: dict[str, Any]) -> dict[str, Any]:
    import obstore

    import pylog
    from pylog.tiered.store import ObjectStore

    with pylog.open(workdir / "log", remote_log_manager_task_interval_ms=-1) as log:
        files = _fill(log, records, seed)
        nbytes = sum(Path(f).stat().st_size for f in files)
        client = ObjectStore(url, **options)._store  # the obstore client tier() uses
        t0 = time.perf_counter()
        for i, path in enumerate(files):
            obstore.put(client, f"plain/{i:06d}-{Path(path).name}", Path(path))
        seconds = time.perf_counter() - t0
    return result(records, seconds, objects=len(files), object_mb=round(nbytes / 1e6, 2))


def _on_moto(fn: Any, workdir: Path, records: int, seed: int) -> dict[str, Any]:
    try:
        import moto.server  # noqa: F401
    except ImportError as exc:
        return skipped(f"moto's server mode is not installed (pip install 'moto[server]'): {exc}")
    server, options = _start_moto()
    try:
        out: dict[str, Any] = fn(workdir, records, seed, f"s3://{BUCKET}/upload", options)
        return out
    finally:
        server.terminate()
        server.wait(timeout=30)


@case(
    "tiered_put_file",
    group="durable",
    kind="floor",
    fsync="none (obstore's local store does not fsync)",
    description="`obstore.put(store, key, Path(file))` of every sealed segment file and its indexes, `file://`",
)
def tiered_put_file(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _put(workdir, records, seed, (workdir / "remote").as_uri(), {})


@case(
    "tiered_upload_file",
    group="durable",
    kind="pylog",
    fsync="each object and its new directories fsynced before the manifest names it",
    description="`Log.tier()` of the same sealed segments to `file://`: put, read back and CRC-check, publish",
    compare=(Compare("tiered_put_file"),),
)
def tiered_upload_file(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _tier(workdir, records, seed, (workdir / "remote").as_uri(), {})


@case(
    "tiered_put_s3",
    group="durable",
    kind="floor",
    fsync="n/a (moto S3 server on loopback, in memory)",
    description="`obstore.put(store, key, Path(file))` of every sealed segment file and its indexes, moto S3",
)
def tiered_put_s3(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _on_moto(_put, workdir, records, seed)


@case(
    "tiered_upload_s3",
    group="durable",
    kind="pylog",
    fsync="n/a (moto S3 server on loopback, in memory)",
    description="`Log.tier()` of the same sealed segments to a moto S3 server: put, read back and CRC-check, publish",
    compare=(Compare("tiered_put_s3"),),
)
def tiered_upload_s3(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _on_moto(_tier, workdir, records, seed)
