"""``make demo``: a clickstream through pylog, end to end, on the default log directory (``./pylog-data``).

1. produce a clickstream keyed by user into a partitioned topic (one record at a time, then vectorized);
2. a consumer group of worker processes counts clicks per page, committing after every batch with the
   running counts of each partition in the commit's metadata (so a partition's state moves with it); one
   worker is killed with SIGKILL midway, the group rebalances and the others carry on from the last commit;
3. a Spark job reads the topic with ``spark.read.format("pylog")`` and its aggregate is compared with the
   workers' counts and with what was produced;
4. look records up by offset and by timestamp;
5. simulate a crash: a child process appends and is killed with SIGKILL; reopening recovers every acknowledged
   record and reports what recovery did;
6. apply retention with an injected clock;
7. tier a topic to an object store (a ``file://`` directory next to the log directory, ``<dir>-remote``,
   replaced at each run like the log directory): the background uploader's pass uploads the sealed segments,
   deletes the local copies past ``local_retention_ms``, and a consumer still reads every record.

Run ``python -m pylog.demo [--dir PATH] [--records N] [--workers N] [--no-spark]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

import pylog
from pylog.errors import ConfigError
from pylog.structs import TopicPartition
from pylog.tiered.store import ObjectStore

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


GROUP = "page-counters"


def _tiering_step(path: str) -> bool:
    """Tiered storage on ``file://``: upload, local retention after upload, read back from both tiers."""
    t0 = _step("tiered storage: sealed segments go to an object store, local copies are deleted after upload")
    remote = os.path.abspath(path.rstrip("/")) + "-remote"
    if os.path.exists(remote):
        shutil.rmtree(remote)
    url = "file://" + remote
    clock = pylog.ManualClock(1_700_000_000_000)
    with pylog.open(path, clock=clock, remote_storage=url, remote_log_manager_task_interval_ms=1000) as log:
        log.create_topic(
            "events-tiered", 1, segment_bytes=16 << 10, remote_storage_enable=True, local_retention_ms=60_000
        )
        producer = log.producer()
        plog = log.topic("events-tiered").partition(0)
        for i in range(5000):
            if i == 4000:
                producer.flush()
                plog.roll()
                clock.advance(120_000)  # the first 4,000 records are now past local_retention_ms
            producer.send("events-tiered", {"i": i})
        producer.close()
        plog.roll()
        print(f"   local: {len(plog.segments) - 1} sealed segments, offsets 0..{plog.log_end_offset}")
        manager = log.remote_log_manager
        assert manager is not None
        status = manager.run_once()[TopicPartition("events-tiered", 0)]  # what the thread does each interval
        objects = ObjectStore(url).list("events-tiered/0/")
        print(
            f"   uploaded {status.uploaded} segments ({len(objects)} objects in {remote}); "
            f"deleted {status.deleted_local} local copies past local_retention_ms; the local log now starts at "
            f"{plog.local_log_start_offset} (the young records stay local, and remote too)"
        )
        c = log.consumer("events-tiered", auto_offset_reset="earliest", consumer_timeout_ms=0)
        values = [r.value["i"] for r in c.iterate()]
        c.close()
        print(
            f"   read back {len(values):,} records from remote + local, in order: {values == list(range(5000))}"
        )
    _done(t0, "tiered")
    return values == list(range(5000)) and status.deleted_local > 0


def _worker(path: str, name: str) -> None:
    """A member of the ``page-counters`` group: counts clicks per page for the partitions it owns.

    The counts of a partition travel in the metadata of its committed offset, written together with the
    offset after every batch. A new owner starts from that commit, so records processed after the last
    commit by a worker that died are counted again by exactly one member, and nothing twice."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    with pylog.open(path) as log:
        counts: dict[TopicPartition, collections.Counter[str]] = {}
        consumer = log.consumer(
            group_id=GROUP,
            client_id=name,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            max_poll_records=250,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=300,
        )

        class Listener(pylog.ConsumerRebalanceListener):
            def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
                for tp in assigned:
                    committed = consumer.committed(tp, metadata=True)
                    counts[tp] = collections.Counter(json.loads(committed.metadata) if committed else {})

            def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
                for tp in revoked:
                    counts.pop(tp, None)  # every processed batch is committed already

        consumer.subscribe(["clicks"], listener=Listener())
        while not stop:
            batch = consumer.poll(timeout_ms=200)
            if not batch:
                continue
            commit = {}
            for tp, records in batch.items():
                c = counts.setdefault(tp, collections.Counter())
                for rec in records:
                    c[rec.value["page"]] += 1
                commit[tp] = pylog.OffsetAndMetadata(records[-1].offset + 1, json.dumps(c, sort_keys=True))
            time.sleep(0.01)  # the work a real worker would do per batch
            consumer.commit(commit)
        consumer.close()


def _group_step(path: str, n_workers: int, total: int, expected: collections.Counter[str]) -> bool:
    """Run the worker group, kill one worker midway, and check the committed counts."""
    workers = {
        f"worker-{i}": subprocess.Popen(
            [sys.executable, "-m", "pylog.demo", "--worker", f"worker-{i}", "--dir", path]
        )
        for i in range(n_workers)
    }
    killed = None
    t_start = time.perf_counter()
    try:
        with pylog.open(path) as log:
            ends = {
                tp: log.topic("clicks").partition(tp.partition).log_end_offset
                for tp in log.topic("clicks").partitions()
            }
            shown_generation = -1
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                done = (
                    sum(om.offset for om in log.group_offsets(GROUP).values())
                    if GROUP in log.list_groups()
                    else 0
                )
                desc = log.describe_group(GROUP) if GROUP in log.list_groups() else None
                if desc is not None and desc.state == "Stable" and desc.generation != shown_generation:
                    shown_generation = desc.generation
                    owners = ", ".join(
                        f"{m.client_id}(pid {m.pid}): {','.join(str(tp.partition) for tp in m.assignment) or '-'}"
                        for m in desc.members
                    )
                    print(
                        f"   [{time.perf_counter() - t_start:5.2f} s] generation {desc.generation}: {owners}"
                    )
                if killed is None and done >= total * 0.4:
                    killed = "worker-1"
                    workers[killed].send_signal(signal.SIGKILL)
                    workers[killed].wait()
                    print(
                        f"   [{time.perf_counter() - t_start:5.2f} s] SIGKILL {killed} after {done:,}/{total:,} "
                        "records were committed"
                    )
                offsets = log.group_offsets(GROUP) if GROUP in log.list_groups() else {}
                if all(offsets.get(tp) is not None and offsets[tp].offset == end for tp, end in ends.items()):
                    break
                time.sleep(0.05)
            offsets = log.group_offsets(GROUP)
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in workers.values():
            proc.wait(timeout=30)
    counted: collections.Counter[str] = collections.Counter()
    for om in offsets.values():
        counted.update(json.loads(om.metadata))
    lag = sum(end - (offsets[tp].offset if tp in offsets else 0) for tp, end in ends.items())
    print(f"   committed offsets reach the log end on every partition: {lag == 0}")
    print(
        f"   the workers counted {sum(counted.values()):,} clicks; per page: {dict(sorted(counted.items()))}"
    )
    print(f"   matches what was produced: {counted == expected}")
    return lag == 0 and counted == expected and killed is not None


def _spark_step(path: str, expected: collections.Counter[str]) -> bool:
    import warnings

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    warnings.filterwarnings("ignore", category=FutureWarning, module="pyspark")
    from pyspark.sql import SparkSession

    from pylog.spark import jvm  # needs pyspark: imported only when the Spark step runs

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("pylog-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.host", "127.0.0.1")
    )
    try:
        builder = jvm.configure(builder)
        print("   pylog's JVM reader installed (pylog.spark.jvm.configure)")
    except ConfigError as exc:  # no JDK here: the Python data source reads alone
        print(f"   without pylog's JVM reader: {str(exc).splitlines()[0]}")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        t0 = time.perf_counter()
        df = (
            spark.read.format("pylog")
            .option("subscribe", "clicks")
            .option("valueFormat", "msgpack")
            .option("valueSchema", "user long, page string")
            .load(os.path.abspath(path))
        )
        rows = df.groupBy("page").count().orderBy("page").collect()
        print(
            f'   spark.read.format("pylog") ... groupBy("page").count() in {time.perf_counter() - t0:.2f} s:'
        )
        for row in rows:
            print(f"     {row['page']:<10} {row['count']:>8,}")
        got = collections.Counter({row["page"]: row["count"] for row in rows})
    finally:
        spark.stop()
    print(f"   matches the workers' counts and what was produced: {got == expected}")
    return got == expected


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="pylog-data")
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--workers", type=int, default=3, help="worker processes in the consumer group")
    ap.add_argument("--no-spark", action="store_true", help="skip the Spark step")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.dir)
        return 0
    if args.worker:
        _worker(args.dir, args.worker)
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

        expected = collections.Counter(PAGES[p] for p in pages.tolist())

    t0 = _step(
        f"a consumer group of {args.workers} worker processes counts clicks per page; one is killed midway"
    )
    if not _group_step(args.dir, args.workers, n, expected):
        return 1
    _done(t0, "counted by the group")

    if not args.no_spark:
        t0 = _step("a Spark job reads the topic straight from the segment files")
        if not _spark_step(args.dir, expected):
            return 1
        _done(t0, "aggregated with Spark")

    with pylog.open(args.dir) as log:
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
    if not _tiering_step(args.dir):
        return 1
    print(f"\nAll steps passed. The log is in {os.path.abspath(args.dir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
