"""Where the time of one call goes: the CPU cost of pylog's per-record paths and of their parts.

    python benchmarks/costs.py            # a markdown table on stdout (best of 3 per row, CPU time)

Each row times one operation in a loop in this process with ``time.process_time`` (all threads, user and
system time), so that other processes on the machine change the figures less than they change wall time;
the best of three passes counts. The records are the benchmark suite's: a 16-byte key and a 100-byte value.
The floors are the loops the write-path goals compare with (``benchmarks/cases/floors.py``). The table is
what ``docs/performance.md`` quotes.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import struct
import tempfile
import time
from collections.abc import Callable

import msgpack
import numpy as np

import pylog
from pylog.partitioner import murmur2
from pylog.record import encode_one

KEY, VALUE = b"k" * 16, b"x" * 100


def best(fn: Callable[[int], object], n: int, passes: int = 3) -> float:
    """Microseconds of CPU per operation: ``fn(n)`` runs ``n`` of them; the fastest of ``passes`` counts."""
    out = []
    for _ in range(passes):
        t0 = time.process_time()
        fn(n)
        out.append((time.process_time() - t0) / n)
    return 1e6 * min(out)


def measure(workdir: str, scale: float) -> list[tuple[str, float]]:
    def n(count: int) -> int:
        return max(1, int(count * scale))

    rows: list[tuple[str, float]] = []
    now = int(time.time() * 1000)  # a current timestamp: an old one would roll a segment per append
    batch = encode_one(KEY, VALUE, now)
    scratch = os.open(os.path.join(workdir, "scratch"), os.O_RDWR | os.O_CREAT)
    floor = os.open(os.path.join(workdir, "floor"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    log = pylog.open(os.path.join(workdir, "log"))
    try:
        for name in ("append", "get", "send", "durable", "paper"):
            log.create_topic(name, 1)
        log.create_topic("keyed", 8)
        keys16 = [os.urandom(16) for _ in range(1000)]
        plog = log.topic("append").partition(0)

        def flocks(count: int) -> None:
            for _ in range(count):
                fcntl.flock(scratch, fcntl.LOCK_EX)
                fcntl.flock(scratch, fcntl.LOCK_UN)

        def fsync_loop(count: int) -> None:
            for _ in range(count):
                os.write(floor, batch)
                os.fsync(floor)

        pack = msgpack.packb
        packer = msgpack.Packer().pack
        frame = struct.Struct("<I").pack

        def buffered_loop(count: int) -> None:
            with open(os.path.join(workdir, "stream"), "wb", buffering=1 << 20) as f:
                write = f.write
                for _ in range(count):
                    b = packer((KEY, VALUE))
                    write(frame(len(b)) + b)

        rows.append(
            ("floor: `msgpack` pack + frame + buffered write per record", best(buffered_loop, n(300_000)))
        )
        rows.append(
            (
                "floor: `msgpack.packb` + `os.write` per record",
                best(lambda c: [os.write(floor, pack(VALUE)) for _ in range(c)], n(100_000)),
            )
        )
        rows.append(("floor: `os.write` + `os.fsync` per record (CPU only)", best(fsync_loop, n(2_000))))
        rows.append(
            (
                "`record.encode_one`: a batch of one record",
                best(lambda c: [encode_one(KEY, VALUE, now) for _ in range(c)], n(50_000)),
            )
        )
        rows.append(
            (
                "`PartitionLog.append` of that batch (locks, write, publish, index)",
                best(lambda c: [plog.append(bytearray(batch)) for _ in range(c)], n(50_000)),
            )
        )
        rows.append(("- of which `flock` + unlock (the cross-process lock)", best(flocks, n(50_000))))
        rows.append(
            (
                "- of which the deletion check (the marker byte of `partition.state`)",
                best(lambda c: [plog._state.deleted() for _ in range(c)], n(50_000)),
            )
        )
        rows.append(
            (
                "- (what that check cost before the marker: an `fstat` for the link count)",
                best(lambda c: [os.fstat(scratch).st_nlink for _ in range(c)], n(50_000)),
            )
        )

        def publishes(count: int) -> None:
            with plog.locked_for_write():
                for _ in range(count):
                    plog.publish()

        rows.append(
            ("- of which the publish of the new end (seqlock + doorbell check)", best(publishes, n(50_000)))
        )

        def lock_only(count: int) -> None:
            lock = plog.locked_for_write(appending=True)
            for _ in range(count):
                with lock:
                    pass

        rows.append(
            (
                "- of which taking and releasing the partition (thread lock, `flock`, catch-up)",
                best(lock_only, n(50_000)),
            )
        )
        rows.append(
            (
                "- of which `pwrite` of the batch",
                best(lambda c: [os.pwrite(scratch, batch, 0) for _ in range(c)], n(50_000)),
            )
        )

        rows.append(
            (
                "`partitioner.murmur2` of a 16-byte key (the keyed partition of one record)",
                best(lambda c: [murmur2(KEY) for _ in range(c)], n(100_000)),
            )
        )

        p1 = log.producer(acks=1, value_serializer=None)
        pa = log.producer(acks="all", value_serializer=None)
        try:
            rows.append(
                (
                    "`send(...).get()`, acks=1: the whole call",
                    best(lambda c: [p1.send("get", VALUE, key=KEY).get() for _ in range(c)], n(30_000)),
                )
            )
            rows.append(
                (
                    "`send(...).get()`, acks=1, 8 partitions, keyed: the whole call",
                    best(
                        lambda c: [p1.send("keyed", VALUE, key=keys16[i % 1000]).get() for i in range(c)],
                        n(30_000),
                    ),
                )
            )
            rows.append(
                (
                    "`send(...)`, acks=1, fire and forget (drains and `flush()` amortized)",
                    best(
                        lambda c: ([p1.send("send", VALUE, key=KEY) for _ in range(c)], p1.flush()),
                        n(300_000),
                    ),
                )
            )
            rows.append(
                (
                    '`send(...).get()`, acks="all" (CPU; the fsync\'s wait comes on top)',
                    best(lambda c: [pa.send("durable", VALUE, key=KEY).get() for _ in range(c)], n(2_000)),
                )
            )
            keys = np.frombuffer(os.urandom(16 * 50), dtype=np.uint8).reshape(50, 16)
            values = np.frombuffer(os.urandom(200 * 50), dtype=np.uint8).reshape(50, 200)
            rows.append(
                (
                    "`send_batch` of 50 x 200 B, `wait=False`, per call (drains amortized)",
                    best(
                        lambda c: (
                            [p1.send_batch("paper", keys=keys, values=values, wait=False) for _ in range(c)],
                            p1.flush(),
                        ),
                        n(20_000),
                    ),
                )
            )
        finally:
            p1.close()
            pa.close()

        consumer = log.consumer(
            "send", auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None
        )
        total = log.topic("send").partition(0).log_end_offset

        def iterate(count: int) -> None:
            consumer.seek_to_beginning()
            seen = sum(1 for _ in consumer)
            if seen != count:
                raise RuntimeError(f"iterated {seen} records, expected {count}")

        rows.append(("`for r in consumer`, per record", best(iterate, total)))
        consumer.close()
    finally:
        log.close()
        os.close(scratch)
        os.close(floor)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every loop's count (default 1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        rows = measure(workdir, args.scale)
    print("| operation | CPU per call (us) |")
    print("|---|---:|")
    for name, us in rows:
        print(f"| {name} | {us:,.2f} |")


if __name__ == "__main__":
    main()
