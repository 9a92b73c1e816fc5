"""``pylog consume TOPIC``: print records (like ``kafka-console-consumer``).

Where to start: the log end (new records only) by default; ``--from-beginning`` for the log start;
``--partition P --offset O`` for an exact place (``O`` may also be ``earliest`` or ``latest``). With
``--group G`` the group's committed offsets are used (``--from-beginning`` then applies only where the group
has none), and positions are committed on exit.

When to stop: after ``--max-messages N`` records; otherwise, without ``--follow``, once every partition is
caught up (waiting ``--timeout-ms`` for more first, if given); with ``--follow``, on Ctrl-C or SIGTERM, or after
``--timeout-ms`` without a new record.

Text output is, per record, the selected fields separated by tabs: ``CreateTime:<ms>``, ``Partition:<p>``,
``Offset:<o>``, headers ``k:v,k2:v2`` (or ``NO_HEADERS``), the key (``null`` if none), then the value.
``--format json`` (or ``--json``) prints one JSON object per record with every field.

How keys and values are shown (``--key-format``, ``--value-format``): by default a value
is text when it is valid UTF-8 (so text lines come back exactly as ``pylog produce`` stored them), else
decoded from msgpack (pylog's default serializer) and shown as JSON when it is one msgpack object, else text
with the bytes that are not UTF-8 escaped (``\\xff``). A value of one control byte is shown as the msgpack
integer it also is. ``--value-format json`` always decodes msgpack (a Python API topic of small integers),
``--value-format text`` never does. In JSON output each key and value names its encoding (``key_encoding``,
``value_encoding``: ``text``, ``msgpack``, ``base64`` or ``hex``).

Value formats: auto (default), text, json (also msgpack), base64, hex. Key formats: text (default), base64,
hex.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from pylog.cli._common import (
    CliError,
    Interrupted,
    Parents,
    Unavailable,
    UsageError,
    described,
    json_line,
    note,
    open_log,
    want_json,
)
from pylog.cli._formats import KEY_FORMATS, SHOW_VALUE_FORMATS, show_json, show_text
from pylog.errors import CorruptRecordError
from pylog.structs import ConsumerRecord, TopicPartition

if TYPE_CHECKING:
    from pylog.cli._common import Subparsers
    from pylog.log import Log

__all__ = ["register"]

_GROUP_JOIN_WAIT_MS = 30_000


_CONSUME_HELP = """\
Print the records of TOPIC, like kafka-console-consumer.

Where to start: the log end (only records produced from now on) by default; --from-beginning for the log
start; --partition P --offset O for an exact place (O may also be earliest or latest). With --group G the
group's committed offsets are used (--from-beginning then applies only where the group has none).

When to stop: after --max-messages N records; otherwise, without --follow, once every partition is caught
up (waiting --timeout-ms for more first, if given); with --follow, on Ctrl-C or SIGTERM, or after
--timeout-ms without a new record.

Output: per record, the fields chosen with the --print-* options, separated by tabs: CreateTime:<ms>,
Partition:<p>, Offset:<o>, the headers k:v,k2:v2 (or NO_HEADERS), the key (null if none), then the value.
--format json (or --json) prints one JSON object per record with every field, and names the encoding of
its key and value (key_encoding, value_encoding: text, msgpack, base64 or hex).

Values (--value-format): auto, the default, shows a value as text when it is valid UTF-8 (so lines come
back exactly as 'pylog produce' stored them), else decoded from msgpack (the Python API's default
serializer) as JSON when it is one msgpack object, else as text with the bytes that are not UTF-8 escaped
(\\xff); a value of one control byte is shown as the msgpack integer it also is. json always decodes
msgpack (a topic written by the Python API), text never does; base64 and hex show the bytes. Keys
(--key-format): text (the default), base64 or hex.

On disk: without --group nothing is written. With --group this process joins the group while it runs (its
membership is recorded in the log directory, and the group's partitions are shared with the other
members), and commits, for each partition it read, the offset after the last record it printed.

Exit status: 0 caught up, or --max-messages or --timeout-ms reached; 1 an error (an unknown topic or
partition, a damaged batch: the error says where, and the records before it were printed); 2 a usage
error; 130 stopped by Ctrl-C (SIGINT), 143 by SIGTERM."""


def register(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "consume",
        parents=parents.base,
        help="print records of a topic",
        **described(_CONSUME_HELP),
    )
    p.add_argument("topic", metavar="TOPIC", help="the topic to read")
    p.add_argument("--from-beginning", action="store_true", help="start at the log start offset")
    p.add_argument("--partition", type=int, metavar="P", help="only partition P")
    p.add_argument(
        "--offset", metavar="O", help="start at offset O (an int, earliest or latest); needs --partition"
    )
    p.add_argument("--group", metavar="G", help="consume as a member of consumer group G")
    p.add_argument("--max-messages", type=int, metavar="N", help="stop after N records")
    p.add_argument("--follow", action="store_true", help="keep waiting for new records until Ctrl-C")
    p.add_argument("--timeout-ms", type=int, metavar="MS", help="stop after MS ms without a new record")
    for field in ("key", "offset", "partition", "timestamp", "headers"):
        p.add_argument(f"--print-{field}", action="store_true", help=f"print the record's {field}")
    p.add_argument("--format", choices=["text", "json"], help="text (default) or json: one object per record")
    p.add_argument(
        "--value-format",
        choices=SHOW_VALUE_FORMATS,
        default="auto",
        help="how values are shown: auto (default: UTF-8 text, else msgpack as JSON, else escaped text), "
        "text, json (msgpack decoded, as JSON), base64, hex",
    )
    p.add_argument(
        "--key-format", choices=KEY_FORMATS, default="text", help="how keys are shown (default: text)"
    )
    p.set_defaults(func=consume)


def _check_args(args: argparse.Namespace) -> None:
    if args.offset is not None and args.partition is None:
        raise UsageError("--offset needs --partition")
    if args.group is not None and (args.partition is not None or args.offset is not None):
        raise UsageError("--group cannot be combined with --partition or --offset")
    if args.max_messages is not None and args.max_messages < 1:
        raise UsageError("--max-messages must be >= 1")
    if args.timeout_ms is not None and args.timeout_ms < 0:
        raise UsageError("--timeout-ms must be >= 0")


def consume(args: argparse.Namespace) -> int:
    _check_args(args)
    printer = _Printer(args, sys.stdout)
    with open_log(args) as log, _Signals() as signals:
        log.topic(args.topic)
        consumer = _consumer(log, args)
        try:
            _loop(consumer, args, printer, signals)
        except KeyboardInterrupt:  # a second signal, while printing or closing
            signals.signum = signals.signum or signal.SIGINT
        except CorruptRecordError as exc:  # the records before it were printed, and are what --group commits
            hint = "" if "pylog verify" in str(exc) else " (run 'pylog verify' for a report)"
            raise CliError(f"reading {args.topic}: {exc}{hint}") from exc
        finally:
            try:  # records not printed are given back first: the flush may block (a reader that stopped)
                printer.give_back(consumer)
                with contextlib.suppress(BrokenPipeError):
                    sys.stdout.flush()
            finally:
                consumer.close()
    if signals.signum is not None:
        name = signal.Signals(signals.signum).name
        committed = " (the group's offsets are those of the records printed)" if args.group else ""
        raise Interrupted(f"interrupted by {name} after {printer.count} records{committed}", signals.signum)
    if sys.stderr.isatty():
        note(f"Processed a total of {printer.count} messages")
    return 0


class _Signals:
    """SIGINT (Ctrl-C) and SIGTERM during ``consume``: stop after the record being printed.

    The first signal is only noted: the loop stops before the next record (a poll waits at most 200 ms), so
    no read, write or commit is cut short; the consumer is closed cleanly (a group commits the records
    printed, see :meth:`_Printer.give_back`) and the command exits 130 (143 for SIGTERM). A second signal
    raises KeyboardInterrupt wherever it lands (stdout blocked by a reader that stopped reading). Installed
    only in the main thread (Python delivers signals there); a signal ignored (``nohup``) stays ignored."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) is not signal.SIG_IGN:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum


def _consumer(log: Log, args: argparse.Namespace) -> Any:
    reset = "earliest" if args.from_beginning else "latest"
    raw = {"key_deserializer": None, "value_deserializer": None}
    if args.group is not None:
        try:
            return log.consumer(args.topic, group_id=args.group, auto_offset_reset=reset, **raw)
        except ImportError as exc:
            raise Unavailable(f"consumer groups are not available in this version of pylog ({exc})") from exc
    consumer = log.consumer(auto_offset_reset=reset, **raw)
    topic = log.topic(args.topic)
    numbers = range(topic.num_partitions) if args.partition is None else [args.partition]
    consumer.assign([TopicPartition(args.topic, p) for p in numbers])
    if args.offset is not None:
        _seek(consumer, TopicPartition(args.topic, args.partition), args.offset)
    return consumer


def _seek(consumer: Any, tp: TopicPartition, where: str) -> None:
    if where == "earliest":
        consumer.seek_to_beginning(tp)
        return
    if where == "latest":
        consumer.seek_to_end(tp)
        return
    try:
        offset = int(where)
    except ValueError:
        raise UsageError(f"--offset must be an int, earliest or latest, got {where!r}") from None
    start = consumer.beginning_offsets([tp])[tp]
    end = consumer.end_offsets([tp])[tp]
    if not start <= offset <= end:
        raise CliError(f"offset {offset} is out of range [{start}, {end}] for {tp.topic}-{tp.partition}")
    consumer.seek(tp, offset)


def _loop(consumer: Any, args: argparse.Namespace, printer: _Printer, signals: _Signals) -> None:
    if args.timeout_ms is not None:
        idle_limit = float(args.timeout_ms)
    else:
        idle_limit = float("inf") if args.follow else 0.0
    remaining = args.max_messages
    last_record = time.monotonic()
    while (remaining is None or remaining > 0) and signals.signum is None:
        idle = (time.monotonic() - last_record) * 1000
        wait = max(0.0, min(200.0, idle_limit - idle))
        got = consumer.poll(timeout_ms=wait, max_records=min(500, remaining or 500))
        if got:
            printer.emit_all(got, signals)
            if remaining is not None:
                remaining -= sum(len(r) for r in got.values())
            last_record = time.monotonic()
            continue
        idle = (time.monotonic() - last_record) * 1000
        if args.follow or _caught_up(consumer):
            if idle >= idle_limit:
                return
        elif idle >= max(idle_limit, _GROUP_JOIN_WAIT_MS):
            raise CliError(f"no partitions were assigned to this member within {idle / 1000:.0f} s")


def _caught_up(consumer: Any) -> bool:
    tps = consumer.assignment()
    if not tps:
        return False
    ends = consumer.end_offsets(tps)
    return all(consumer.position(tp) >= ends[tp] for tp in tps)


class _Printer:
    """Writes records as text lines or JSON lines, and knows which records a poll returned that are not
    printed yet (:attr:`unprinted`), so that a consumer stopped in the middle gives them back."""

    def __init__(self, args: argparse.Namespace, stream: TextIO) -> None:
        self.args = args
        self.stream = stream
        self.json = (args.format or ("json" if want_json(args) else "text")) == "json"
        self.value_format: str = args.value_format
        self.key_format: str = args.key_format
        self.count = 0
        #: per partition, the offset of the first record returned by the last poll and not printed yet
        self.unprinted: dict[TopicPartition, int] = {}

    def emit_all(self, got: dict[TopicPartition, list[ConsumerRecord]], signals: _Signals) -> None:
        """Print the records of one poll and flush; a signal stops it before the next record. Until the
        flush returns, the whole poll counts as not printed (output buffered but not written when the
        writing fails), so an error or a second signal meanwhile gives back more, never less."""
        self.unprinted = {tp: recs[0].offset for tp, recs in got.items() if recs}
        rest: dict[TopicPartition, int] = {}
        for tp, records in got.items():
            for record in records:
                if signals.signum is not None:
                    rest[tp] = record.offset
                    break
                self.emit(record)
        self.stream.flush()
        self.unprinted = rest

    def give_back(self, consumer: Any) -> None:
        """Move the consumer back to the first record not printed, per partition, so that what it commits
        (``--group``, on close) is exactly what was printed."""
        assigned = consumer.assignment()
        for tp, offset in self.unprinted.items():
            if tp in assigned:
                consumer.seek(tp, offset)
        self.unprinted = {}

    def emit(self, r: ConsumerRecord) -> None:
        try:
            line = json_line(self.as_dict(r)) if self.json else self.as_text(r) + "\n"
        except CliError as exc:  # a value not in the --value-format asked for
            raise CliError(f"{r.topic}-{r.partition} offset {r.offset}: {exc}") from exc
        self.stream.write(line)
        self.count += 1

    def as_dict(self, r: ConsumerRecord) -> dict[str, Any]:
        key, key_encoding = show_json(r.key, self.key_format)
        value, value_encoding = show_json(r.value, self.value_format)
        return {
            "topic": r.topic,
            "partition": r.partition,
            "offset": r.offset,
            "timestamp": r.timestamp,
            "timestamp_type": _timestamp_type(r.timestamp_type),
            "key": key,
            "key_encoding": key_encoding,
            "value": value,
            "value_encoding": value_encoding,
            "headers": [_header(k, v) for k, v in r.headers],
            "serialized_key_size": r.serialized_key_size,
            "serialized_value_size": r.serialized_value_size,
        }

    def as_text(self, r: ConsumerRecord) -> str:
        a = self.args
        fields = []
        if a.print_timestamp:
            fields.append(f"{_timestamp_type(r.timestamp_type)}:{r.timestamp}")
        if a.print_partition:
            fields.append(f"Partition:{r.partition}")
        if a.print_offset:
            fields.append(f"Offset:{r.offset}")
        if a.print_headers:
            shown = [f"{k}:{show_text(v, 'text')}" for k, v in r.headers]
            fields.append(",".join(shown) or "NO_HEADERS")
        if a.print_key:
            fields.append(show_text(r.key, self.key_format))
        fields.append(show_text(r.value, self.value_format))
        return "\t".join(fields)


def _timestamp_type(code: int) -> str:
    return "LogAppendTime" if code == 1 else "CreateTime"


def _header(key: str, value: bytes | None) -> dict[str, Any]:
    shown, encoding = show_json(value, "text")
    return {"key": key, "value": shown, "encoding": encoding}
