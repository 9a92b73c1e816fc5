"""The ``pylog`` command: the argument parser, dispatch, and turning failures into one line on stderr.

Exit status: 0 success; 1 an error (a pylog error, a problem found by ``verify``/``dump``, an I/O error);
2 a usage error or a feature this pylog does not have; 130 interrupted by Ctrl-C (SIGINT), 143 by SIGTERM
where a command handles it. Every failure is one line on stderr naming its cause, or its type when it has no
message.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from pylog import __version__, speedups
from pylog.cli import (
    _consume,
    _dump,
    _groups,
    _maintenance,
    _produce,
    _quotas,
    _security,
    _serve,
    _streams,
    _tiered,
    _topics,
)
from pylog.cli._common import DEFAULT_DIR, CliError, Parents, UsageError, describe_error
from pylog.errors import PylogError

__all__ = ["build_parser", "main"]

_EPILOG = f"""\
The log directory is --dir, else $PYLOG_DIR, else {DEFAULT_DIR}. A command that opens it recovers it first
if it was not shut down cleanly (a torn tail past the durable point is truncated, damaged indexes are
rebuilt); 'pylog verify' reports what recovery did.

--dir and --json may be given before or after the command (for 'produce', --json after the command means
"values are JSON"; put it before the command for a JSON summary).

Exit status: 0 success; 1 an error, printed as one line on stderr ('pylog: error: ...'); 2 a usage error
or a feature this pylog does not have; 130 interrupted by Ctrl-C (SIGINT), 143 by SIGTERM where a command
handles it.

Run 'pylog COMMAND --help' for what a command does, what it changes on disk and its exit status."""


class _Parser(argparse.ArgumentParser):
    """Reports usage mistakes as one line through :class:`UsageError` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pylog",
        description="Manage and inspect a pylog log directory (topics, records, groups, files).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_dir(parser)
    _add_json(parser)
    parser.add_argument(
        "--version",
        action="version",
        version=f"pylog {__version__}, per-record paths: {speedups.PATH}",
        help="print pylog's version and whether its compiled per-record paths are in use, and exit",
    )
    dir_only = _Parser(add_help=False)
    _add_dir(dir_only)
    json_only = _Parser(add_help=False)
    _add_json(json_only)
    parents = Parents(base=[dir_only, json_only], dir_only=[dir_only], json_only=[json_only])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _topics.register(sub, parents)
    _produce.register(sub, parents)
    _consume.register(sub, parents)
    _groups.register(sub, parents)
    _dump.register(sub, parents)
    _maintenance.register(sub, parents)
    _tiered.register(sub, parents)
    _serve.register(sub, parents)
    _streams.register(sub, parents)
    _security.register(sub, parents)
    _quotas.register(sub, parents)
    return parser


def _add_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir",
        metavar="PATH",
        default=argparse.SUPPRESS,
        help=f"log directory (default: $PYLOG_DIR or {DEFAULT_DIR}), or the URL of a log in an object store "
        "(s3://bucket/prefix, file:///path), opened read-only",
    )
    parser.add_argument(
        "--option",
        action="append",
        metavar="KEY=VALUE",
        default=argparse.SUPPRESS,
        help="object-store option of a tiered log or of a --dir URL (repeatable), e.g. region=eu-west-1 "
        "endpoint=http://127.0.0.1:9000 allow_http=true",
    )
    parser.add_argument(
        "--groups-dir",
        metavar="PATH",
        default=argparse.SUPPRESS,
        help="with a --dir URL: the local directory of its consumer groups (shared by the group's processes)",
    )


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON for scripts"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``pylog`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
        status: int = args.func(args)
        sys.stdout.flush()
        return status
    except CliError as exc:
        return _fail(describe_error(exc), exc.exit_code)
    except PylogError as exc:
        return _fail(describe_error(exc), 1)
    except KeyboardInterrupt:
        return _fail("interrupted by Ctrl-C (KeyboardInterrupt)", 130)
    except BrokenPipeError:
        # the reader of our stdout went away (`pylog consume ... | head`): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"{where}{exc.strerror or describe_error(exc)}", 1)
    except Exception as exc:
        if os.environ.get("PYLOG_DEBUG"):
            raise
        message = f"unexpected {type(exc).__name__}: {describe_error(exc)}"
        return _fail(f"{message} (set PYLOG_DEBUG=1 for a traceback)", 1)


def _fail(message: str, code: int) -> int:
    with contextlib.suppress(OSError):  # stdout may be a closed pipe; the error line matters more
        sys.stdout.flush()
    sys.stderr.write("pylog: error: " + " ".join(message.split()) + "\n")
    return code
