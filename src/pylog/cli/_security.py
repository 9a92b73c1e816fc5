"""``pylog users``: the users Kafka clients authenticate as with SASL (like ``kafka-configs --alter
--add-config SCRAM-SHA-256=[...] --entity-type users``), kept in ``<dir>/__security/users``.

Passwords are read from stdin (one line; a terminal is asked without echo) and never written anywhere: the file
keeps salted hashes only (see :mod:`pylog.broker.credentials`).
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import TYPE_CHECKING

from pylog.broker.credentials import DEFAULT_ITERATIONS, MECHANISMS, CredentialStore
from pylog.cli._common import CliError, Output, Parents, UsageError, described, log_dir

if TYPE_CHECKING:
    from pylog.cli._common import Subparsers

__all__ = ["register"]

_USERS_HELP = """\
Manage the users Kafka clients authenticate as (SASL PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) when the broker
runs with --sasl. They are kept in DIR/__security/users (mode 0600, only salted hashes: no password is
written anywhere). A running broker sees changes at the next authentication, without a restart.

Run 'pylog users ACTION --help' for each action."""

_ADD_HELP = f"""\
Create user NAME, or replace all its credentials. The password is read from stdin (its first line); at a
terminal it is asked for without echo. --mechanism (repeatable) chooses the SASL mechanisms the user may
authenticate with (default: all of {", ".join(MECHANISMS)}); SCRAM credentials use --iterations
(default {DEFAULT_ITERATIONS}, Kafka's minimum; at most 16384).

On disk: DIR/__security/users is replaced atomically (created with its directory if needed).

Exit status: 0 the user was written; 1 an empty password or a file that cannot be written; 2 a usage error."""

_LIST_HELP = """\
Print each user and the mechanisms it has credentials for (NAME MECHANISM,...). With --json: a list of
{"name", "mechanisms"}. Changes nothing.

Exit status: 0 success; 1 the users file does not check."""

_DELETE_HELP = """\
Delete user NAME and its credentials. Connections it already opened stay open until they close; new ones
are refused.

Exit status: 0 deleted; 1 no such user; 2 a usage error."""


def register(sub: Subparsers, parents: Parents) -> None:
    users = sub.add_parser(
        "users", parents=parents.base, help="SASL users of the broker", **described(_USERS_HELP)
    )
    actions = users.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = actions.add_parser(
        "add", parents=parents.base, help="create a user or replace its password", **described(_ADD_HELP)
    )
    p.add_argument("name", metavar="NAME", help="the user's name (its principal is User:NAME)")
    p.add_argument(
        "--mechanism",
        action="append",
        choices=MECHANISMS,
        metavar="MECHANISM",
        help=f"SASL mechanism ({', '.join(MECHANISMS)}); repeatable; default all",
    )
    p.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS, metavar="N", help="SCRAM iterations")
    p.set_defaults(func=add_user)
    p = actions.add_parser("list", parents=parents.base, help="list users", **described(_LIST_HELP))
    p.set_defaults(func=list_users)
    p = actions.add_parser("delete", parents=parents.base, help="delete a user", **described(_DELETE_HELP))
    p.add_argument("name", metavar="NAME", help="the user to delete")
    p.set_defaults(func=delete_user)


def _read_password() -> str:
    if sys.stdin.isatty():
        password = getpass.getpass("Password: ")
        if getpass.getpass("Password again: ") != password:
            raise CliError("the passwords differ")
        return password
    line = sys.stdin.readline()
    return line.removesuffix("\n").removesuffix("\r")


def add_user(args: argparse.Namespace) -> int:
    mechanisms = tuple(dict.fromkeys(args.mechanism or MECHANISMS))
    password = _read_password()
    if not password:
        raise CliError("no password given on stdin (the first line is the password)")
    if not 4096 <= args.iterations <= 16384:
        raise UsageError(f"--iterations must be 4096-16384, got {args.iterations}")
    CredentialStore(log_dir(args)).add(args.name, password, mechanisms, args.iterations)
    out = Output(args)
    if out.json:
        out.document({"name": args.name, "mechanisms": sorted(mechanisms)})
    else:
        out.line(f"{args.name} {','.join(sorted(mechanisms))}")
    return 0


def list_users(args: argparse.Namespace) -> int:
    users = CredentialStore(log_dir(args)).users()
    out = Output(args)
    if out.json:
        out.document([{"name": n, "mechanisms": m} for n, m in users.items()])
    else:
        for name, mechanisms in users.items():
            out.line(f"{name} {','.join(mechanisms)}")
    return 0


def delete_user(args: argparse.Namespace) -> int:
    if not CredentialStore(log_dir(args)).delete(args.name):
        raise CliError(f"no user {args.name!r}")
    return 0
