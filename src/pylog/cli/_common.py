"""What every ``pylog`` subcommand shares: errors, the log directory and output (rich tables or JSON).

Output rules: human output goes to stdout as plain lines or rich tables; ``--json`` replaces it with one JSON
document (commands that stream records or batches print one JSON object per line instead). Notes and
progress go to stderr. Errors are one line on stderr, ``pylog: error: ...``, naming the cause (or, when an
error carries no message, its type). How stored keys and values are shown is :mod:`pylog.cli._formats`.

The command's own errors are :class:`pylog.errors.CliError` and its subclasses (``exit_code`` is the
process exit status).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import sys
import textwrap
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

import pylog
from pylog.errors import (
    CliError,
    InputError,
    Interrupted,
    NotASegmentFileError,
    Unavailable,
    UsageError,
)

if TYPE_CHECKING:
    from typing import TypeAlias

    from rich.console import Console

    from pylog.log import Log

    Subparsers: TypeAlias = argparse._SubParsersAction[Any]

__all__ = [
    "DEFAULT_DIR",
    "CliError",
    "InputError",
    "Interrupted",
    "NotASegmentFileError",
    "Output",
    "Parents",
    "Unavailable",
    "UsageError",
    "check_log_dir",
    "config_name",
    "describe_error",
    "described",
    "json_default",
    "json_line",
    "log_dir",
    "note",
    "open_log",
    "parse_config",
    "parse_datetime_ms",
    "parse_headers",
    "parse_value",
    "store_options",
    "want_json",
]

DEFAULT_DIR = "./pylog-data"


def described(text: str) -> dict[str, Any]:
    """Keyword arguments of ``add_parser`` that make ``text`` the ``--help`` description of a command, its
    paragraphs and line breaks kept as written. Help texts are plain text (what the command does, what it
    changes on disk, its exit status): they are read in a terminal, not rendered."""
    return {
        "description": textwrap.dedent(text).strip(),
        "formatter_class": argparse.RawDescriptionHelpFormatter,
    }


def describe_error(exc: BaseException) -> str:
    """One line naming the cause of ``exc``: its message, or its type when it has no message."""
    text = " ".join(str(exc).split())
    if isinstance(exc, KeyError) and len(exc.args) == 1 and text == repr(exc.args[0]):
        text = str(exc.args[0])  # KeyError quotes its message
    return text or f"{type(exc).__name__} (no message)"


class Parents(NamedTuple):
    """Parent parsers giving every subcommand the global options (``--dir``, ``--json``)."""

    base: list[argparse.ArgumentParser]
    dir_only: list[argparse.ArgumentParser]
    json_only: list[argparse.ArgumentParser]


# -- the log directory ------------------------------------------------------------------------------------


def log_dir(args: argparse.Namespace, *, store: bool = False) -> str:
    """``--dir``, else ``$PYLOG_DIR``, else ``./pylog-data``. Unless ``store`` (the command opens the log and
    hands it the object-store options), ``--option`` and ``--groups-dir`` are refused: nothing would use them."""
    if not store:
        for flag, name in (("--option", "option"), ("--groups-dir", "groups_dir")):
            if getattr(args, name, None):
                raise UsageError(f"{flag} is for the commands that open a log (this one does not use it)")
    path: str | None = getattr(args, "dir", None)
    return path or os.environ.get("PYLOG_DIR") or DEFAULT_DIR


_CLIENT_OPTIONS = ("allow_http", "timeout", "connect_timeout")


def store_options(items: Iterable[str] | None) -> dict[str, Any]:
    """``--option`` values (``["endpoint=http://h:9000", "allow_http=true"]``) as ``remote_storage_options``
    (obstore ``from_url`` keyword arguments; ``allow_http``, ``timeout`` and ``connect_timeout`` go to its
    client options)."""
    options: dict[str, Any] = {}
    client: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--option needs KEY=VALUE, got {item!r}")
        parsed: Any = {"true": True, "false": False}.get(value.strip().lower(), value)
        (client if key in _CLIENT_OPTIONS else options)[key] = parsed
    if client:
        options["client_options"] = client
    return options


def check_log_dir(path: str) -> None:
    """Refuse a ``--dir`` that does not exist or is not a directory, saying which."""
    if os.path.isdir(path):
        return
    if os.path.lexists(path):
        raise CliError(f"{path} is not a directory: --dir (or PYLOG_DIR) names a log directory")
    raise CliError(f"{path} is not a pylog log directory: it does not exist (use --dir or PYLOG_DIR)")


@contextlib.contextmanager
def open_log(args: argparse.Namespace, *, create: bool = False) -> Iterator[Log]:
    """Open the log directory; unless ``create``, it must already be a pylog directory (so a mistyped
    ``--dir`` is an error instead of a new empty log). ``--option KEY=VALUE`` are the options of its object
    store (a tiered log's, or the store itself); a ``--dir`` that is an object-store URL opens the log there
    read-only, its consumer groups in ``--groups-dir``."""
    path = log_dir(args, store=True)
    options = store_options(getattr(args, "option", None))
    groups_dir = getattr(args, "groups_dir", None)
    if "://" in path:
        if create:
            raise CliError(
                f"{path} is an object store: a log there is read-only (pylog restore makes a directory)"
            )
        with pylog.open(path, read_only=True, remote_storage_options=options, groups_dir=groups_dir) as log:
            yield log
        return
    if groups_dir:
        raise UsageError(
            "--groups-dir is for a --dir that is an object-store URL (a log directory keeps its groups)"
        )
    if not create:
        check_log_dir(path)
        readable = os.access(path, os.R_OK | os.X_OK)  # if not, pylog.open says so (PermissionDeniedError)
        if readable and not any(os.path.exists(os.path.join(path, name)) for name in ("manifest", ".lock")):
            raise CliError(f"{path} is not a pylog log directory (no manifest)")
    with pylog.open(path, remote_storage_options=options) as log:
        if options and log.remote_storage is None:
            raise UsageError(f"--option is for a log with an object store; {path} has none (pylog tier URL)")
        yield log


# -- parsing helpers --------------------------------------------------------------------------------------

_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")


def parse_value(text: str) -> bool | int | float | str:
    """A config value: a bool for true/false, an int when numeric, a float when it is a decimal number, else
    the string."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
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


def json_line(obj: Any) -> str:
    """``obj`` as one line of compact JSON, newline included."""
    return json.dumps(obj, default=json_default, ensure_ascii=False, separators=(",", ":")) + "\n"


def json_default(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return obj.decode("utf-8", errors="backslashreplace")
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
