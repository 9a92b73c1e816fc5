"""``pylog verify``, ``pylog repair`` and ``pylog bench``.

``verify`` checks every batch (bounds, CRC, decode, increasing offsets) and every index of every partition with
``Log.verify()``, changing nothing, and exits with status 1 when it finds a problem, printing one line per
problem with the file and position. If the log cannot even be opened because durable data is corrupt, that
is reported the same way. Note that opening a log that was not shut down cleanly runs recovery first, which
truncates a torn tail past the recovery point; what recovery did is reported too.

``repair`` runs ``pylog.repair(path)``, the only operation that drops corrupt durable data: each damaged
partition is truncated at its first bad batch, and every record from there on is dropped. It needs the
directory to itself.

``bench`` is a quick throughput check of this machine: it produces records with ``send()`` (one call per
record) and with ``send_batch()`` (vectorized), then consumes them all, in a temporary directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

import numpy as np

import pylog
from pylog.cli._common import (
    Output,
    Parents,
    UsageError,
    check_log_dir,
    described,
    log_dir,
    open_log,
)
from pylog.errors import CorruptRecordError

if TYPE_CHECKING:
    from pylog.cli._common import Subparsers
    from pylog.log import Log

__all__ = ["register"]


_VERIFY_HELP = """\
Check every batch of every segment of every partition (length bounds, CRC-32C, decoding, increasing
offsets) and every offset and time index against its segment, like a full read of the log. Prints one line
per problem, naming the partition, the file and the byte position, then a summary; with --json
{"ok", "partitions", "problems", "recovery"}.

Changes no record. Opening a log directory that was not shut down cleanly runs recovery first (as any
command that opens it does): a torn tail left by a crash, past what was acknowledged durable, is truncated
and missing or damaged indexes are rebuilt. verify reports what recovery did ("recovered on open: ...").

Exit status: 0 no problem found; 1 problems found (damage below the durable point, which only
'pylog repair' removes), or the log directory does not exist or cannot be opened."""

_REPAIR_HELP = """\
Drop the damaged part of every partition: each partition is truncated at its first batch that fails its
checks, and EVERY record from that batch to the end of the partition is deleted, including good records
that follow the damage. Run 'pylog verify' first to see where the damage is, and copy the log directory
if the records after it matter ('pylog dump --print-data' shows what the damaged segment still holds).

On disk: truncates or deletes the segment files from the first bad batch on (their indexes follow); a
missing or damaged manifest is rebuilt from the partition directories (what had to be assumed, such as
default configs, is reported). Offsets from the truncation point on are given to new records again;
consumers and groups positioned past the new log end start again from their auto_offset_reset. This is
the only command that drops stored records. It needs the directory to itself: no other process may have
the log open.

Prints what was dropped per partition, or "Nothing to repair."; with --json {"topic-partition": [what was
done, ...]}.

Exit status: 0 repaired, or nothing to repair; 1 the directory does not exist or is not a log directory,
or another process has the log open."""

_BENCH_HELP = """\
Measure this machine: produce --records records with one send() call per record, then as many with
send_batch() (vectorized), then consume all of them, and print records/s and MB/s for each phase (with
--json, the figures and a description of the machine).

Works in a new temporary directory, deleted at the end: the log directory (--dir) is not used or changed.

Exit status: 0 done; 1 a phase failed; 2 a usage error (such as --records below 1)."""


def register(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "verify",
        parents=parents.base,
        help="check every batch and index; exit 1 on problems",
        **described(_VERIFY_HELP),
    )
    p.set_defaults(func=verify)

    p = sub.add_parser(
        "repair",
        parents=parents.base,
        help="truncate each damaged partition at its first bad batch (drops every record from there on)",
        **described(_REPAIR_HELP),
    )
    p.set_defaults(func=repair)

    p = sub.add_parser(
        "bench",
        parents=parents.json_only,
        help="measure produce and consume throughput in a temp dir",
        **described(_BENCH_HELP),
    )
    p.add_argument("--records", type=int, default=200_000, metavar="N", help="records per phase (200000)")
    p.add_argument("--record-size", type=int, default=100, metavar="BYTES", help="value size (100)")
    p.add_argument("--partitions", type=int, default=1, metavar="P", help="partitions of the topic (1)")
    p.add_argument("--acks", choices=["0", "1", "all"], default="1", help="producer acks (1)")
    p.set_defaults(func=bench)


# -- verify and repair ------------------------------------------------------------------------------------


def verify(args: argparse.Namespace) -> int:
    out = Output(args)
    recovery: dict[str, Any] = {}
    checked = 0
    try:
        with open_log(args) as log:
            problems = log.verify()
            checked = sum(log.topic(name).num_partitions for name in log.topics())
            recovery = _recovery(log)
    except CorruptRecordError as exc:
        problems = {"(open)": [str(exc)]}
    if out.json:
        out.document({"ok": not problems, "partitions": checked, "problems": problems, "recovery": recovery})
        return 1 if problems else 0
    for name, report in sorted(recovery.items()):
        for line in _recovery_lines(report):
            out.line(f"{name}: recovered on open: {line}")
    for name, lines in sorted(problems.items()):
        for line in lines:
            out.line(f"{name}: {line}")
    if problems:
        count = sum(len(lines) for lines in problems.values())
        out.line(f"FAILED: {count} problems in {len(problems)} partitions")
        return 1
    out.line(f"OK: {checked} partitions checked, no problems")
    return 0


def _recovery(log: Log) -> dict[str, Any]:
    """What opening had to repair, for partitions where it did more than routine work."""
    out = {}
    for name, report in log.recovery.items():
        rebuilt = report.clean_shutdown and report.indexes_rebuilt
        if report.problems or report.bytes_truncated or report.segments_removed or rebuilt:
            out[name] = dataclasses.asdict(report)
    return out


def _recovery_lines(report: dict[str, Any]) -> list[str]:
    lines = list(report["problems"])
    if report["bytes_truncated"]:
        lines.append(f"truncated {report['bytes_truncated']} bytes")
    if report["segments_removed"]:
        lines.append(f"removed {report['segments_removed']} segments")
    if report["clean_shutdown"] and report["indexes_rebuilt"]:
        lines.append(
            f"rebuilt the indexes of {report['indexes_rebuilt']} segments (they failed their checks)"
        )
    return lines


def repair(args: argparse.Namespace) -> int:
    out = Output(args)
    path = log_dir(args)
    check_log_dir(path)
    # needs the directory to itself (LockError while a process has it open); a lost or damaged manifest is
    # rebuilt from the partition directories (NotALogDirectoryError when there are none)
    result = pylog.repair(path)
    if out.json:
        out.document(result)
    else:
        for name, what in sorted(result.items()):
            out.line(f"{name}: {'; '.join(what)}")
        if not result:
            out.line("Nothing to repair.")
    return 0


# -- bench ------------------------------------------------------------------------------------------------


def bench(args: argparse.Namespace) -> int:
    n, size = args.records, args.record_size
    if n < 1 or size < 0 or args.partitions < 1:
        raise UsageError("--records and --partitions must be >= 1 and --record-size >= 0")
    out = Output(args)
    acks: int | str = "all" if args.acks == "all" else int(args.acks)
    value = os.urandom(size)
    results = []
    with tempfile.TemporaryDirectory(prefix="pylog-bench-") as tmp, pylog.open(tmp) as log:
        log.create_topic("bench", args.partitions)
        producer = log.producer(acks=acks, value_serializer=None)
        try:
            results.append(_timed("produce send()", n, size, lambda: _send_each(producer, value, n)))
            results.append(_timed("produce send_batch()", n, size, lambda: _send_batches(producer, value, n)))
        finally:
            producer.close()
        consumer = log.consumer("bench", auto_offset_reset="earliest", value_deserializer=None)
        try:
            results.append(_timed("consume", 2 * n, size, lambda: _consume_all(consumer, 2 * n)))
        finally:
            consumer.close()
    machine = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    if out.json:
        out.document(
            {"records": n, "record_size": size, "acks": args.acks, "machine": machine, "results": results}
        )
        return 0
    out.table(
        ["PHASE", "RECORDS", "SECONDS", "REC/S", "MB/S"],
        [
            [
                r["phase"],
                r["records"],
                f"{r['seconds']:.3f}",
                f"{r['records_per_s']:,.0f}",
                f"{r['mb_per_s']:.1f}",
            ]
            for r in results
        ],
        title=(
            f"{size}-byte values, acks={args.acks}, {args.partitions} partition(s); Python {machine['python']}, "
            f"{machine['cpus']} CPUs, {sys.platform}"
        ),
    )
    return 0


def _timed(phase: str, records: int, size: int, work: Any) -> dict[str, Any]:
    start = time.perf_counter()
    work()
    seconds = max(time.perf_counter() - start, 1e-9)
    return {
        "phase": phase,
        "records": records,
        "seconds": seconds,
        "records_per_s": records / seconds,
        "mb_per_s": records * size / seconds / 1e6,
    }


def _send_each(producer: Any, value: bytes, n: int) -> None:
    send = producer.send
    for _ in range(n):
        send("bench", value)
    producer.flush()


def _send_batches(producer: Any, value: bytes, n: int, chunk: int = 10_000) -> None:
    block = np.frombuffer(value * chunk, dtype=np.uint8).reshape(chunk, len(value))
    done = 0
    while done < n:
        take = min(chunk, n - done)
        producer.send_batch("bench", values=block[:take] if len(value) else [b""] * take)
        done += take


def _consume_all(consumer: Any, expected: int) -> None:
    seen = 0
    while seen < expected:
        got = consumer.poll(timeout_ms=1000, max_records=100_000)
        if not got:
            raise RuntimeError(f"bench: consumed {seen} of {expected} records")
        seen += sum(len(records) for records in got.values())
