"""Tiered storage: a consumer reading segments from the object store against the same records read locally.

Both cases write the same records (untimed) to one partition of a topic with 16 MiB segments, then time
``for rec in consumer.iterate()`` from the earliest offset, raw bytes, in a freshly opened log.

- ``tiered_local_read``: the segments are on the local disk (warm page cache).
- ``tiered_remote_read``: the sealed segments were uploaded (``Log.tier()``) to a moto S3 server on
  loopback, started as its own process (as a real server would be: it does not share the consumer's GIL),
  and their local copies deleted by the tiered local retention; every record comes from the object store
  through ranged GETs, the block cache (cold at the start) and its prefetch of the next 16 MiB window.

Segments are 16 MiB (Kafka's default is 1 GiB): moto answers a ranged GET by copying the whole object, and
its cost is per request as much as per byte, so on it tiny segments measure moto's request overhead (with
1 MiB segments the remote read reached about 0.37x here) and huge ones its copying.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.cases import Compare, case
from benchmarks.cases.workload import arrays, result, settle, skipped

TOPIC = "tiered"
SEGMENT_BYTES = 16 << 20
BUCKET = "pylog-bench"


def _fill(log: Any, records: int, seed: int, **config: Any) -> None:
    keys, values = arrays(records, seed)
    log.create_topic(TOPIC, partitions=1, segment_bytes=SEGMENT_BYTES, **config)
    producer = log.producer(acks=1, value_serializer=None)
    producer.send_batch(TOPIC, keys=keys, values=values)
    producer.close()


def _read(log: Any) -> tuple[int, float]:
    consumer = log.consumer(
        TOPIC, auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None
    )
    n = 0
    t0 = time.perf_counter()
    for _rec in consumer.iterate():
        n += 1
    seconds = time.perf_counter() - t0
    consumer.close()
    return n, seconds


@case(
    "tiered_local_read",
    group="read",
    kind="pylog",
    fsync="n/a (read)",
    description="`for rec in consumer.iterate()` over a topic of 16 MiB segments on the local disk",
)
def tiered_local_read(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    import pylog

    with pylog.open(workdir / "local") as log:
        _fill(log, records, seed)
    settle([workdir])
    with pylog.open(workdir / "local") as log:
        n, seconds = _read(log)
    if n != records:
        raise RuntimeError(f"read {n} records, wrote {records}")
    return result(records, seconds)


@case(
    "tiered_remote_read",
    group="read",
    kind="pylog",
    fsync="n/a (read)",
    description=(
        "`for rec in consumer.iterate()` over the same records tiered to a moto S3 server on loopback (its own "
        "process), local copies deleted: ranged GETs through the block cache, cold at the start, with prefetch"
    ),
    compare=(Compare("tiered_local_read", at_least=0.5),),
)
def tiered_remote_read(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    try:
        import moto.server  # noqa: F401
    except ImportError as exc:
        return skipped(f"moto's server mode is not installed (pip install 'moto[server]'): {exc}")
    import pylog

    server, options = _start_moto()
    try:
        url = f"s3://{BUCKET}/bench"
        with pylog.open(workdir / "log", remote_storage=url, remote_storage_options=options) as log:
            _fill(log, records, seed, remote_storage_enable=True, local_retention_bytes=0)
            plog = log.topic(TOPIC).partition(0)
            plog.roll()
            manifest = log.tier()[0].manifest
            if manifest.log_start_offset is None or manifest.log_end_offset is None:
                raise RuntimeError("nothing was tiered")
            plog.apply_retention(remote=(manifest.log_start_offset, manifest.log_end_offset))
            if plog.local_log_start_offset != records:
                raise RuntimeError(
                    f"local copies not deleted: local log starts at {plog.local_log_start_offset}"
                )
        with pylog.open(workdir / "log", remote_storage=url, remote_storage_options=options) as log:
            n, seconds = _read(log)
            source = log.topic(TOPIC).partition(0).remote
            cache = getattr(source, "cache", None)
            stats = {
                "gets": getattr(cache, "requests", 0),
                "prefetched_blocks": getattr(cache, "prefetched", 0),
            }
    finally:
        server.terminate()
        server.wait(timeout=30)
    if n != records:
        raise RuntimeError(f"read {n} records, wrote {records}")
    return result(records, seconds, **stats)


def _start_moto() -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT")).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError("the moto S3 server did not start") from None
            time.sleep(0.1)
    options = {
        "endpoint": endpoint,
        "region": "us-east-1",
        "access_key_id": "testing",
        "secret_access_key": "testing",
        "client_options": {"allow_http": True},
    }
    return server, options
