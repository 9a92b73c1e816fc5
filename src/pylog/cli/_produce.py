"""``pylog produce TOPIC``: one record per input line, from stdin or ``--file`` (like
``kafka-console-producer``).

Values (``--value-format``): ``text`` (the default) stores the line's bytes as they are, so ``pylog consume``
prints the line back; ``json`` parses each line as JSON and stores it with pylog's default serializer
(msgpack), as ``Producer.send(topic, obj)`` would (blank lines are skipped; ``--json`` after the command is
short for it); ``base64`` and ``hex`` decode the line, for bytes that are not text. ``--key-separator SEP``
splits each line at the first SEP into key and value (backslash escapes such as ``\\t`` are understood); keys
are read as ``--key-format`` text (the default), base64 or hex. ``--headers k=v,k2=v2`` adds the same headers
to every record. A line ends at ``\\n`` (a ``\\r`` before it is dropped too).

Prints how many records went to which partitions and offsets; ``pylog --json produce ...`` (``--json`` BEFORE
the command) prints that summary as JSON. Then, exit status:

- 0: every line was produced and acknowledged;
- 1: a line could not be sent (no key separator, invalid JSON, a record the topic refuses): reading stops there;
  or records failed to be written (the producer's error, such as ``RecordTooLargeError`` or a disk error):
  reading stops once a failure is seen. Every record sent before is waited for, and the error line says how
  many records were produced, how many failed, the first failing line and why;
- 130 (Ctrl-C, SIGINT) or 143 (SIGTERM): reading stops; every record already sent is written and acknowledged
  (a signal never cuts a write short), and the error line says how many records were produced. A second
  signal stops at once, without waiting for the records being written.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import IO, TYPE_CHECKING, Any

from pylog.cli._common import (
    CliError,
    InputError,
    Interrupted,
    Output,
    Parents,
    UsageError,
    describe_error,
    described,
    open_log,
    parse_headers,
)
from pylog.cli._formats import KEY_FORMATS, PRODUCE_VALUE_FORMATS, parse_field
from pylog.errors import PylogError

if TYPE_CHECKING:
    from pylog.cli._common import Subparsers
    from pylog.producer import FutureRecordMetadata

__all__ = ["register"]

_SETTLE_EVERY = 10_000


_PRODUCE_HELP = """\
Append one record to TOPIC per line read from stdin (or --file F), like kafka-console-producer. A line ends
at \\n (a \\r before it is dropped too).

Values (--value-format): text, the default, stores the line's bytes as they are, so 'pylog consume' prints
the line back; json parses each line as JSON and stores it msgpack-encoded, as the Python API's default
serializer does (blank lines are skipped; null is a tombstone; --json after the command is short for it);
base64 and hex decode the line, for bytes that are not text.

Keys: --key-separator SEP splits each line at its first SEP into key and value (escapes such as \\t are
understood); keys are read as --key-format text (the default), base64 or hex. Records without a key are
spread over the partitions, records with one go to the partition of their key; --partition P sends every
record to P. --headers k=v,k2=v2 adds the same headers to every record.

On disk: appends the records to the topic's partitions (the topic must exist: 'pylog topics create').
With --acks all each record is fsynced before it counts as produced; with 1 (the default) it is written
to the operating system, which survives a crash of this process but not a power cut.

Prints how many records went to which partitions and offsets; 'pylog --json produce ...' (--json BEFORE
the command) prints that summary as JSON.

Exit status:
  0    every line was produced and acknowledged;
  1    a line could not be sent (no key separator, invalid JSON, a record the topic refuses): reading stops
       there; or records could not be written (a record too large, a full disk): reading stops once a
       failure is seen. Every record sent before is waited for, and the error line says how many records
       were produced, how many failed, the first failing line and why;
  2    a usage error;
  130  Ctrl-C (SIGINT), 143 SIGTERM: reading stops; every record already sent is written and acknowledged
       (a signal never cuts a write short) and the error line says how many were produced. A second
       signal stops at once, without waiting for the records being written."""


def register(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "produce",
        parents=parents.dir_only,
        help="write records to a topic, one per line of stdin or --file",
        **described(_PRODUCE_HELP),
    )
    p.add_argument("topic", metavar="TOPIC", help="the topic to append to (it must exist)")
    p.add_argument("--file", "-f", metavar="F", help="read lines from F instead of stdin (shows progress)")
    p.add_argument("--key-separator", metavar="SEP", help="each line is KEY<SEP>VALUE")
    p.add_argument(
        "--value-format",
        choices=PRODUCE_VALUE_FORMATS,
        default="text",
        help="text (default: the line's bytes), json (stored msgpack-encoded), base64, hex",
    )
    p.add_argument("--key-format", choices=KEY_FORMATS, default="text", help="text (default), base64, hex")
    p.add_argument(
        "--json",
        dest="value_format",
        action="store_const",
        const="json",
        help="short for --value-format json",
    )
    p.add_argument("--headers", metavar="K=V,K2=V2", help="headers added to every record")
    p.add_argument("--partition", type=int, metavar="P", help="write every record to partition P")
    p.add_argument(
        "--acks", choices=["0", "1", "all", "-1"], default="1", help="0, 1 (default) or all (fsync)"
    )
    p.add_argument(
        "--compression",
        choices=["none", "gzip", "snappy", "zstd", "lz4"],
        help="batch compression (default: topic's; snappy needs pylog[snappy])",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar for --file")
    p.set_defaults(func=produce)


@dataclass(frozen=True)
class _Spec:
    """What to make of each line, from the command line."""

    topic: str
    partition: int | None
    separator: bytes | None
    key_format: str
    value_format: str
    headers: list[tuple[str, bytes]] | None

    @classmethod
    def of(cls, args: argparse.Namespace) -> _Spec:
        return cls(
            args.topic,
            args.partition,
            _separator(args.key_separator),
            args.key_format,
            args.value_format,
            parse_headers(args.headers) or None,
        )

    def record(self, line: bytes, lineno: int) -> tuple[Any, Any] | None:
        """``(key, value)`` to send for line ``lineno``; None for a line to skip."""
        if self.value_format == "json" and not line.strip():
            return None
        key, value = _split(line, self.separator, lineno)
        try:
            return (
                None if key is None else parse_field(key, self.key_format, "key"),
                parse_field(value, self.value_format, "value"),
            )
        except InputError as exc:
            raise InputError(f"line {lineno}: {exc}") from exc


class _Stats:
    """Records sent and not yet acknowledged; per partition: records produced, first and last offset; records
    that failed, with the line and error of the first."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, FutureRecordMetadata]] = []
        self.partitions: dict[int, list[int]] = {}
        self.records = 0
        self.failed = 0
        self.first_failure: tuple[int, BaseException] | None = None

    def settle(self) -> None:
        """Wait for every record sent; count each as produced or failed."""
        for lineno, future in self.pending:
            try:
                md = future.get()
            except Exception as exc:  # the error of the write of this record's batch
                self.failed += 1
                if self.first_failure is None:
                    self.first_failure = (lineno, exc)
                continue
            entry = self.partitions.get(md.partition)
            if entry is None:
                self.partitions[md.partition] = [1, md.offset, md.offset]
            else:
                entry[0] += 1
                entry[2] = md.offset
            self.records += 1
        self.pending.clear()

    def as_dict(self, topic: str) -> dict[str, Any]:
        parts = {
            str(p): {"records": n, "first_offset": first, "last_offset": last}
            for p, (n, first, last) in sorted(self.partitions.items())
        }
        return {"topic": topic, "records": self.records, "failed": self.failed, "partitions": parts}

    def summary(self, topic: str) -> str:
        parts = [
            f"partition {p}: offsets {first}-{last}"
            for p, (_, first, last) in sorted(self.partitions.items())
        ]
        shown = "; ".join(parts[:8]) + ("; ..." if len(parts) > 8 else "")
        return f"Produced {_records(self.records)} to {topic}" + (f" ({shown})." if parts else ".")

    def failures(self) -> str | None:
        """The failed records, in words, or None."""
        if self.first_failure is None:
            return None
        lineno, exc = self.first_failure
        why = f"{type(exc).__name__}: {describe_error(exc)}"
        return f"{_records(self.failed)} failed, the first at line {lineno} ({why})"


def _records(n: int) -> str:
    return f"{n} record" if n == 1 else f"{n} records"


def _lines_read(n: int) -> str:
    return "1 line was read" if n == 1 else f"{n} lines were read"


def produce(args: argparse.Namespace) -> int:
    out = Output(args)
    spec = _Spec.of(args)
    acks: int | str = "all" if args.acks in ("all", "-1") else int(args.acks)
    config: dict[str, Any] = {"acks": acks, "compression_type": args.compression}
    if spec.value_format != "json":
        config["value_serializer"] = None
    stats = _Stats()
    with open_log(args) as log:
        topic = log.topic(spec.topic)
        if spec.partition is not None:
            topic.partition(spec.partition)  # fail before reading any input
        with _input(args) as (lines, progress), _Signals() as signals, _producer_log_muted():
            producer = log.producer(**config)
            try:
                stopped = _send_lines(spec, producer, signals.lines(lines), stats, progress)
                stats.settle()
            finally:
                closed = _close(producer)
    if out.json:
        out.document(stats.as_dict(spec.topic))
    else:
        out.line(stats.summary(spec.topic))
    _raise_outcome(stats, [e for e in (stopped, closed) if e is not None], signals)
    return 0


def _raise_outcome(stats: _Stats, errors: list[Exception], signals: _Signals) -> None:
    """Raise the error that reports what went wrong, if anything did."""
    problems = [describe_error(e) for e in errors]
    failures = stats.failures()
    if failures is not None:  # reading stops once a failure is seen: say how far it got
        problems.append(f"{failures}; {_lines_read(signals.lineno)}")
    produced = f"{_records(stats.records)} {'was' if stats.records == 1 else 'were'} produced"
    if signals.signum is not None:
        name = signal.Signals(signals.signum).name
        details = "".join(f"; {p}" for p in problems)
        raise Interrupted(
            f"interrupted by {name} after line {signals.lineno}: {produced} (acknowledged){details}",
            signals.signum,
        )
    if problems:
        raise CliError(f"{'; '.join(problems)} ({produced})")


def _separator(raw: str | None) -> bytes | None:
    if raw is None:
        return None
    sep = codecs.decode(raw, "unicode_escape").encode()
    if not sep:
        raise UsageError("--key-separator must not be empty")
    return sep


def _send_lines(
    spec: _Spec, producer: Any, lines: Iterator[tuple[int, bytes]], stats: _Stats, progress: Any
) -> Exception | None:
    """Send each line until the input ends, a line cannot be sent, or a failed record is seen; returns the
    error that stopped it early, if any. Records sent are left in ``stats.pending``."""
    lineno = 0
    try:
        for lineno, line in lines:
            record = spec.record(line, lineno)
            if record is not None:
                stats.pending.append((lineno, _send(producer, spec, record, lineno)))
            if len(stats.pending) >= _SETTLE_EVERY:
                stats.settle()
                if stats.failed:
                    return None
            if not lineno & 1023:
                progress()
    except _StopReading:
        pass
    except PylogError as exc:
        return exc
    except OSError as exc:
        return CliError(f"reading the input after line {lineno}: {exc.strerror or describe_error(exc)}")
    finally:
        progress()
    return None


def _send(producer: Any, spec: _Spec, record: tuple[Any, Any], lineno: int) -> FutureRecordMetadata:
    key, value = record
    try:
        future: FutureRecordMetadata = producer.send(
            spec.topic, value, key, partition=spec.partition, headers=spec.headers
        )
    except PylogError as exc:  # refused before anything was written: the line's fault
        raise InputError(f"line {lineno}: {describe_error(exc)}") from exc
    return future


def _close(producer: Any) -> Exception | None:
    """Close the producer; what it raises is reported with the rest, not instead of it."""
    try:
        producer.close()
    except PylogError as exc:
        return CliError(f"closing the producer: {type(exc).__name__}: {describe_error(exc)}")
    return None


def _split(line: bytes, separator: bytes | None, lineno: int) -> tuple[bytes | None, bytes]:
    if separator is None:
        return None, line
    key, sep, value = line.partition(separator)
    if not sep:
        raise InputError(f"line {lineno}: no key separator {separator.decode()!r} found")
    return key, value


@contextlib.contextmanager
def _producer_log_muted() -> Iterator[None]:
    """The producer logs each write that fails; ``produce`` reports failures itself (counted, with the first
    error, in its one error line), so those log lines would only repeat it."""
    logger = logging.getLogger("pylog.producer")

    def drop(record: logging.LogRecord) -> bool:
        return False

    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


class _StopReading(Exception):
    """A signal arrived while waiting for the next line."""


class _Signals:
    """SIGINT and SIGTERM during ``produce``: stop reading, keep every record already sent.

    A signal that arrives while waiting for input stops at once (the line being read was not sent). One that
    arrives anywhere else (sending, writing a batch, waiting for acknowledgements) is only noted: reading stops
    before the next line, so no write is cut short by an exception and every record sent is acknowledged or
    counted as failed. A second signal raises KeyboardInterrupt wherever it lands. Installed only in the main
    thread (Python delivers signals there)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.lineno = 0  # lines read so far
        self._waiting = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in (signal.SIGINT, signal.SIGTERM):
            if (
                signal.getsignal(signum) is not signal.SIG_IGN
            ):  # ignored (nohup, a background job): keep it so
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        if self._waiting:
            self._waiting = False
            raise _StopReading

    def lines(self, source: Iterator[bytes]) -> Iterator[tuple[int, bytes]]:
        """``(line number, line)`` of ``source`` until it ends or a signal arrives."""
        while self.signum is None:
            line = self._next(source)
            if line is None:
                return
            self.lineno += 1
            yield self.lineno, line

    def _next(self, source: Iterator[bytes]) -> bytes | None:
        try:
            self._waiting = True
            return None if self.signum is not None else next(source, None)
        except _StopReading:
            return None
        finally:
            self._waiting = False


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
