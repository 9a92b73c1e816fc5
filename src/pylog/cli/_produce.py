"""``pylog produce TOPIC``: one record per input line, from stdin or ``--file`` (like
``kafka-console-producer``).

Values are stored as the line's raw bytes (no serializer) unless ``--json``: then each line is parsed as JSON
and stored with pylog's default serializer (msgpack), as ``Producer.send(topic, obj)`` would, and blank lines
are skipped. ``--key-separator SEP`` splits each line at the first SEP into key and value (backslash escapes
such as ``\\t`` are understood). ``--headers k=v,k2=v2`` adds the same headers to every record.

Prints how many records went to which partitions and offsets; ``pylog --json produce ...`` (``--json`` BEFORE
the command) prints that summary as JSON.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

from pylog.cli._common import CliError, Output, Parents, UsageError, open_log, parse_headers
from pylog.errors import PylogError

if TYPE_CHECKING:
    from pylog.cli._common import Subparsers
    from pylog.producer import FutureRecordMetadata

__all__ = ["register"]

_SETTLE_EVERY = 10_000


def register(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "produce",
        parents=parents.dir_only,
        help="write records to a topic, one per line of stdin or --file",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--file", "-f", metavar="F", help="read lines from F instead of stdin (shows progress)")
    p.add_argument("--key-separator", metavar="SEP", help="each line is KEY<SEP>VALUE")
    p.add_argument(
        "--json",
        dest="json_values",
        action="store_true",
        help="values are JSON, stored msgpack-encoded (default: raw UTF-8 bytes)",
    )
    p.add_argument("--headers", metavar="K=V,K2=V2", help="headers added to every record")
    p.add_argument("--partition", type=int, metavar="P", help="write every record to partition P")
    p.add_argument(
        "--acks", choices=["0", "1", "all", "-1"], default="1", help="0, 1 (default) or all (fsync)"
    )
    p.add_argument(
        "--compression", choices=["none", "gzip", "zstd", "lz4"], help="batch compression (default: topic's)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar for --file")
    p.set_defaults(func=produce)


class _Stats:
    """Per partition: records written, first and last offset."""

    def __init__(self) -> None:
        self.partitions: dict[int, list[int]] = {}
        self.records = 0

    def settle(self, futures: list[FutureRecordMetadata]) -> None:
        for future in futures:
            md = future.get()
            entry = self.partitions.get(md.partition)
            if entry is None:
                self.partitions[md.partition] = [1, md.offset, md.offset]
            else:
                entry[0] += 1
                entry[2] = md.offset
            self.records += 1
        futures.clear()

    def as_dict(self, topic: str) -> dict[str, Any]:
        parts = {
            str(p): {"records": n, "first_offset": first, "last_offset": last}
            for p, (n, first, last) in sorted(self.partitions.items())
        }
        return {"topic": topic, "records": self.records, "partitions": parts}

    def summary(self, topic: str) -> str:
        parts = [
            f"partition {p}: offsets {first}-{last}"
            for p, (_, first, last) in sorted(self.partitions.items())
        ]
        shown = "; ".join(parts[:8]) + ("; ..." if len(parts) > 8 else "")
        noun = "record" if self.records == 1 else "records"
        return f"Produced {self.records} {noun} to {topic}" + (f" ({shown})." if parts else ".")


def produce(args: argparse.Namespace) -> int:
    out = Output(args)
    headers = parse_headers(args.headers) or None
    separator = _separator(args.key_separator)
    acks: int | str = "all" if args.acks in ("all", "-1") else int(args.acks)
    config: dict[str, Any] = {"acks": acks, "compression_type": args.compression}
    if not args.json_values:
        config["value_serializer"] = None
    stats = _Stats()
    with open_log(args) as log:
        topic = log.topic(args.topic)
        if args.partition is not None:
            topic.partition(args.partition)  # fail before reading any input
        with _input(args) as (lines, progress):
            producer = log.producer(**config)
            try:
                _send_all(args, producer, lines, separator, headers, stats, progress)
            finally:
                producer.close()
    if out.json:
        out.document(stats.as_dict(args.topic))
    else:
        out.line(stats.summary(args.topic))
    return 0


def _separator(raw: str | None) -> bytes | None:
    if raw is None:
        return None
    sep = codecs.decode(raw, "unicode_escape").encode()
    if not sep:
        raise UsageError("--key-separator must not be empty")
    return sep


def _send_all(
    args: argparse.Namespace,
    producer: Any,
    lines: Iterator[bytes],
    separator: bytes | None,
    headers: list[tuple[str, bytes]] | None,
    stats: _Stats,
    progress: Any,
) -> None:
    pending: list[FutureRecordMetadata] = []
    lineno = 0
    try:
        for lineno, line in enumerate(lines, 1):
            if args.json_values and not line.strip():
                continue
            key, value = _split(line, separator, lineno)
            pending.append(
                producer.send(
                    args.topic,
                    _value(value, lineno) if args.json_values else value,
                    key,
                    partition=args.partition,
                    headers=headers,
                )
            )
            if len(pending) >= _SETTLE_EVERY:
                stats.settle(pending)
            if not lineno & 1023:
                progress()
        producer.flush()
        stats.settle(pending)
        progress()
    except (PylogError, CliError) as exc:
        message = str(exc) if isinstance(exc, CliError) else f"line {lineno}: {exc}"
        with contextlib.suppress(PylogError):
            producer.flush()
            stats.settle(pending)
        done = f" ({stats.records} earlier records were produced)" if stats.records else ""
        raise CliError(message + done) from exc


def _split(line: bytes, separator: bytes | None, lineno: int) -> tuple[bytes | None, bytes]:
    if separator is None:
        return None, line
    key, sep, value = line.partition(separator)
    if not sep:
        raise CliError(f"line {lineno}: no key separator {separator.decode()!r} found")
    return key, value


def _value(raw: bytes, lineno: int) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise CliError(f"line {lineno}: invalid JSON: {exc}") from exc


@contextlib.contextmanager
def _input(args: argparse.Namespace) -> Iterator[tuple[Iterator[bytes], Any]]:
    """Lines without their line ending, and a callback that refreshes the progress bar (for files)."""
    if args.file is None:
        yield _lines(sys.stdin.buffer, None), lambda: None
        return
    with open(args.file, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if args.no_progress or not sys.stderr.isatty() or size == 0:
            yield _lines(f, None), lambda: None
            return
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        counter = [0]
        with Progress(
            TextColumn("[bold]producing[/]"),
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        ) as bar:
            task = bar.add_task("produce", total=size)
            yield _lines(f, counter), lambda: bar.update(task, completed=counter[0])
            bar.update(task, completed=counter[0])


def _lines(stream: IO[bytes], counter: list[int] | None) -> Iterator[bytes]:
    for raw in stream:
        if counter is not None:
            counter[0] += len(raw)
        line = raw[:-1] if raw.endswith(b"\n") else raw
        yield line[:-1] if line.endswith(b"\r") else line
