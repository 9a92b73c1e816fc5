"""``make demo``: a clickstream through pylog, end to end, on the default log directory (``./pylog-data``).

1. produce a clickstream keyed by user into a partitioned topic (one record at a time, then vectorized);
2. consume it back, counting clicks per page, and check the count against what was produced;
3. look records up by offset and by timestamp;
4. simulate a crash: a child process appends and is killed with SIGKILL; reopening recovers every acknowledged
   record and reports what recovery did;
5. apply retention with an injected clock.

Run ``python -m pylog.demo [--dir PATH] [--records N]``.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

import pylog
from pylog.structs import TopicPartition

PAGES = ["/", "/search", "/cart", "/checkout", "/help"]


def _step(title: str) -> float:
    print(f"\n== {title}")
    return time.perf_counter()


def _done(t0: float, what: str) -> None:
    print(f"   {what} ({time.perf_counter() - t0:.2f} s)")


def _child(path: str) -> None:
    """Appends forever, printing each acknowledged offset; the parent kills it."""
    with pylog.open(path) as log:
        producer = log.producer(acks=1)
        i = 0
        while True:
            meta = producer.send("crash-test", {"n": i}, key=f"k{i % 7}").get()
            print(meta.partition, meta.offset, i, flush=True)
            i += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="pylog-data")
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.dir)
        return 0
    if os.path.exists(args.dir):
        shutil.rmtree(args.dir)
    rng = np.random.default_rng(7)
    n = args.records
    users = rng.integers(0, 5_000, n)
    pages = rng.integers(0, len(PAGES), n)

    t0 = _step(f"produce {n:,} clicks keyed by user into 'clicks' (8 partitions)")
    with pylog.open(args.dir) as log:
        log.create_topic("clicks", partitions=8, segment_bytes=4 << 20)
        producer = log.producer()
        half = n // 2
        for u, pg in zip(users[:half].tolist(), pages[:half].tolist(), strict=True):
            producer.send("clicks", {"user": u, "page": PAGES[pg]}, key=f"user-{u}")
        producer.flush()
        t_send = time.perf_counter() - t0
        print(f"   send() one at a time: {half:,} records, {half / t_send:,.0f} rec/s")
        t1 = time.perf_counter()
        import msgpack

        keys = [f"user-{u}".encode() for u in users[half:].tolist()]
        values = [
            msgpack.packb({"user": u, "page": PAGES[pg]})
            for u, pg in zip(users[half:].tolist(), pages[half:].tolist(), strict=True)
        ]
        producer.send_batch("clicks", keys=keys, values=values)
        print(f"   send_batch(): {n - half:,} records in {time.perf_counter() - t1:.2f} s")
        producer.close()
        desc = log.topic("clicks").describe()
        for p in desc["partitions"]:
            print(
                f"   partition {p['partition']}: offsets {p['log_start_offset']}..{p['log_end_offset']}, "
                f"{p['segments']} segment(s), {p['bytes']:,} bytes"
            )
        _done(t0, "produced")

        t0 = _step("consume everything and count clicks per page")
        consumer = log.consumer("clicks", auto_offset_reset="earliest", consumer_timeout_ms=0)
        counts: collections.Counter[str] = collections.Counter()
        seen = 0
        for rec in consumer.iterate():
            counts[rec.value["page"]] += 1
            seen += 1
        expected = collections.Counter(PAGES[p] for p in pages.tolist())
        print(f"   read {seen:,} records; per page: {dict(sorted(counts.items()))}")
        print(f"   matches what was produced: {counts == expected}")
        _done(t0, "consumed")
        if counts != expected:
            return 1

        t0 = _step("random access: by offset and by timestamp")
        tp = TopicPartition("clicks", 3)
        c2 = log.consumer(consumer_timeout_ms=0)
        c2.assign([tp])
        c2.seek(tp, 1000)
        rec = c2.poll(max_records=1)[tp][0]
        print(f"   clicks-3 offset 1000: key={rec.key!r} value={rec.value}")
        hit = c2.offsets_for_times({tp: rec.timestamp})[tp]
        print(f"   earliest offset with timestamp >= {rec.timestamp}: {hit}")
        _done(t0, "looked up")

    t0 = _step("crash safety: a writer process is killed with SIGKILL mid-stream")
    with pylog.open(args.dir) as log:
        log.create_topic("crash-test", partitions=2)
    child = subprocess.Popen(
        [sys.executable, "-m", "pylog.demo", "--child", "--dir", args.dir], stdout=subprocess.PIPE, text=True
    )
    acked: list[tuple[int, int, int]] = []
    assert child.stdout is not None
    deadline = time.monotonic() + 10
    while len(acked) < 3000 and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        part, off, i = map(int, line.split())
        acked.append((part, off, i))
    child.send_signal(signal.SIGKILL)
    child.wait()
    print(f"   child acknowledged {len(acked):,} records, then was killed")
    with pylog.open(args.dir) as log:
        for name, rep in sorted(log.recovery.items()):
            if name.startswith("crash-test"):
                print(
                    f"   recovery {name}: clean={rep.clean_shutdown} validated {rep.batches_validated} batches, "
                    f"truncated {rep.bytes_truncated} bytes"
                )
        c3 = log.consumer("crash-test", auto_offset_reset="earliest", consumer_timeout_ms=0)
        stored = {(r.partition, r.offset): r.value["n"] for r in c3.iterate()}
        lost = [a for a in acked if stored.get((a[0], a[1])) != a[2]]
        print(f"   acknowledged records present after reopen: {len(acked) - len(lost):,}/{len(acked):,}")
        if lost:
            return 1
    _done(t0, "recovered")

    t0 = _step("retention: whole segments older than retention_ms are deleted (injected clock)")
    clock = pylog.ManualClock(1_700_000_000_000)
    with pylog.open(args.dir, clock=clock) as log:
        log.create_topic("metrics", partitions=1, segment_bytes=64 << 10, retention_ms=60_000)
        producer = log.producer()
        for minute in range(5):
            for i in range(2000):
                producer.send("metrics", {"minute": minute, "i": i})
            producer.flush()
            clock.advance(30_000)
        plog = log.topic("metrics").partition(0)
        before = (plog.log_start_offset, plog.log_end_offset, len(plog.segments))
        deleted = log.apply_retention()["metrics"]
        after = (plog.log_start_offset, plog.log_end_offset, len(plog.segments))
        print(f"   before: offsets {before[0]}..{before[1]} in {before[2]} segments")
        print(
            f"   deleted {deleted} segment(s); after: offsets {after[0]}..{after[1]} in {after[2]} segments"
        )
        producer.close()
    _done(t0, "retention applied")
    print(f"\nAll steps passed. The log is in {os.path.abspath(args.dir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
