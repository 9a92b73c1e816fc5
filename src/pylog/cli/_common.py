"""What every ``pylog`` subcommand shares: errors, the log directory, output (rich tables or JSON), and how
stored bytes are shown.

Output rules: human output goes to stdout as plain lines or rich tables; ``--json`` replaces it with one JSON
document (commands that stream records or batches print one JSON object per line instead). Notes and
progress go to stderr. Errors are one line on stderr, ``pylog: error: ...``.

How bytes are shown (keys, values, header values), each with its encoding named in JSON output:

- ``text``: the bytes decoded as UTF-8;
- ``base64``: standard base64 of bytes that are not valid UTF-8;
- ``msgpack`` (values only): the value decoded from msgpack (pylog's default serializer) and shown as JSON.
  A value is taken as msgpack only when the whole of it is exactly one msgpack object. Raw values of ONE
  printable ASCII character are also a valid msgpack integer (``b"5"`` is 53); ``--value-format text`` shows
  them as text.
- ``hex``: when asked for with ``--value-format hex``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import json
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

import msgpack

if TYPE_CHECKING:
    from typing import TypeAlias

    from rich.console import Console

    from pylog.log import Log

    Subparsers: TypeAlias = argparse._SubParsersAction[Any]

__all__ = [
    "CliError",
    "DEFAULT_DIR",
    "Output",
    "Parents",
    "Unavailable",
    "UsageError",
    "VALUE_FORMATS",
    "config_name",
    "json_default",
    "json_line",
    "jsonable",
    "log_dir",
    "note",
    "open_log",
    "parse_config",
    "parse_datetime_ms",
    "parse_headers",
    "parse_value",
    "render_bytes",
    "render_value",
    "value_text",
    "want_json",
]

DEFAULT_DIR = "./pylog-data"
VALUE_FORMATS = ("auto", "msgpack", "text", "base64", "hex")


class CliError(Exception):
    """A failure to report as one line on stderr; ``exit_code`` is the process exit status."""

    exit_code = 1


class UsageError(CliError):
    """The command line itself is wrong."""

    exit_code = 2


class Unavailable(CliError):
    """The command needs a feature this pylog does not have."""

    exit_code = 2


class Parents(NamedTuple):
    """Parent parsers giving every subcommand the global options (``--dir``, ``--json``)."""

    base: list[argparse.ArgumentParser]
    dir_only: list[argparse.ArgumentParser]
    json_only: list[argparse.ArgumentParser]


# -- the log directory ------------------------------------------------------------------------------------


def log_dir(args: argparse.Namespace) -> str:
    """``--dir``, else ``$PYLOG_DIR``, else ``./pylog-data``."""
    path: str | None = getattr(args, "dir", None)
    return path or os.environ.get("PYLOG_DIR") or DEFAULT_DIR


@contextlib.contextmanager
def open_log(args: argparse.Namespace, *, create: bool = False) -> Iterator[Log]:
    """Open the log directory; unless ``create``, it must already be a pylog directory (so a mistyped
    ``--dir`` is an error instead of a new empty log)."""
    import pylog

    path = log_dir(args)
    if not create:
        if not os.path.isdir(path):
            raise CliError(f"log directory {path} does not exist (use --dir or PYLOG_DIR)")
        if not any(os.path.exists(os.path.join(path, name)) for name in ("manifest", ".lock")):
            raise CliError(f"{path} is not a pylog log directory (no manifest)")
    with pylog.open(path) as log:
        yield log


# -- parsing helpers --------------------------------------------------------------------------------------

_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")


def parse_value(text: str) -> int | float | str:
    """A config value: an int when numeric, a float when it is a decimal number, else the string."""
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    return text


def config_name(name: str) -> str:
    """Kafka spells configs ``retention.ms``; pylog ``retention_ms``. Accept both."""
    return name.strip().replace(".", "_").replace("-", "_")


def parse_config(items: Iterable[str] | None) -> dict[str, Any]:
    """``["retention.ms=1000", "cleanup_policy=compact"]`` -> ``{"retention_ms": 1000, ...}``."""
    out: dict[str, Any] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--config expects key=value, got {item!r}")
        out[config_name(name)] = parse_value(value.strip())
    return out


def parse_headers(spec: str | None) -> list[tuple[str, bytes]]:
    """``"k=v,k2=v2"`` -> ``[("k", b"v"), ("k2", b"v2")]``."""
    if not spec:
        return []
    out = []
    for part in spec.split(","):
        name, sep, value = part.partition("=")
        if not sep or not name:
            raise UsageError(f"--headers expects k=v,k2=v2, got {part!r}")
        out.append((name, value.encode()))
    return out


def parse_datetime_ms(text: str) -> int:
    """ISO 8601 (``2024-05-01T12:00:00``, ``...Z``, ``...+02:00``) to epoch milliseconds. Without a UTC
    offset the time is local time."""
    try:
        when = datetime.datetime.fromisoformat(text).astimezone()
    except ValueError:
        raise UsageError(f"not an ISO 8601 date-time: {text!r} (example: 2024-05-01T12:00:00Z)") from None
    return (when - _EPOCH) // datetime.timedelta(milliseconds=1)


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


# -- showing stored bytes ---------------------------------------------------------------------------------


def render_bytes(raw: bytes | None) -> tuple[str | None, str | None]:
    """``(shown, encoding)``: UTF-8 text when it decodes, else base64."""
    if raw is None:
        return None, None
    try:
        return raw.decode("utf-8"), "text"
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode("ascii"), "base64"


def render_value(raw: bytes | None, mode: str = "auto") -> tuple[Any, str | None]:
    """``(shown, encoding)`` of a stored value under ``--value-format`` ``mode`` (see the module docstring)."""
    if raw is None:
        return None, None
    if mode == "hex":
        return raw.hex(), "hex"
    if mode == "base64":
        return base64.b64encode(raw).decode("ascii"), "base64"
    if mode == "text":
        return raw.decode("utf-8", errors="backslashreplace"), "text"
    try:
        return jsonable(msgpack.unpackb(raw, raw=False, strict_map_key=False)), "msgpack"
    except Exception:
        if mode == "msgpack":
            raise CliError("a value is not msgpack; try --value-format auto or text") from None
    return render_bytes(raw)


def jsonable(obj: Any) -> Any:
    """A decoded msgpack object made JSON-ready: bytes as UTF-8 text (or base64), map keys as strings."""
    if isinstance(obj, bytes):
        return render_bytes(obj)[0]
    if isinstance(obj, Mapping):
        return {k if isinstance(k, str) else json.dumps(jsonable(k)): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, msgpack.Timestamp):
        return obj.to_datetime().isoformat()
    if isinstance(obj, msgpack.ExtType):
        return {"ext": obj.code, "data": base64.b64encode(obj.data).decode("ascii")}
    return obj


def value_text(shown: Any, encoding: str | None) -> str:
    """How a rendered value appears in text output: strings as they are, other msgpack values as JSON."""
    if encoding is None:
        return "null"
    if isinstance(shown, str):
        return shown
    return json.dumps(shown, ensure_ascii=False, separators=(",", ":"))


def json_line(obj: Any) -> str:
    """``obj`` as one line of compact JSON, newline included."""
    return json.dumps(obj, default=json_default, ensure_ascii=False, separators=(",", ":")) + "\n"


def json_default(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return render_bytes(obj)[0]
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    if hasattr(obj, "_asdict"):
        return obj._asdict()
    if hasattr(obj, "__dict__"):
        return {k: v for k, v in vars(obj).items() if not k.startswith("_")}
    return str(obj)


# -- output -----------------------------------------------------------------------------------------------


def want_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


class Output:
    """Writes a command's result: one JSON document with ``--json``, else lines and rich tables."""

    def __init__(self, args: argparse.Namespace, stream: TextIO | None = None) -> None:
        self.json = want_json(args)
        self.stream = stream if stream is not None else sys.stdout
        self._console: Console | None = None

    def document(self, obj: Any) -> None:
        self.stream.write(json.dumps(obj, indent=2, default=json_default, ensure_ascii=False) + "\n")

    def json_line(self, obj: Any) -> None:
        self.stream.write(json_line(obj))

    def line(self, text: str = "") -> None:
        self.stream.write(text + "\n")

    def table(
        self, columns: Sequence[str], rows: Iterable[Sequence[object]], title: str | None = None
    ) -> None:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        if title:
            self.line(title)
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for name in columns:
            table.add_column(name, no_wrap=True)
        for row in rows:
            table.add_row(*(Text("-" if cell is None else str(cell)) for cell in row))
        self.console.print(table)

    @property
    def console(self) -> Console:
        if self._console is None:
            from rich.console import Console

            tty = self.stream.isatty()
            self._console = Console(file=self.stream, highlight=False, width=None if tty else 200)
        return self._console


def note(text: str) -> None:
    """A remark for the human at the terminal (stderr), never part of the result."""
    sys.stderr.write(text + "\n")
