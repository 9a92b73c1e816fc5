"""``pylog users``: the users Kafka clients authenticate as with SASL (like ``kafka-configs --alter
--add-config SCRAM-SHA-256=[...] --entity-type users``), kept in ``<dir>/__security/users``; ``pylog acls``:
what they may do (like ``kafka-acls``), kept in ``<dir>/__security/acls``.

Passwords are read from stdin (one line; a terminal is asked without echo) and never written anywhere: the file
keeps salted hashes only (see :mod:`pylog.broker.credentials`).
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import sys
from typing import TYPE_CHECKING

from pylog.broker.acls import CLUSTER_NAME, OPERATIONS, Acl, AclStore
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


_ACLS_HELP = """\
Manage the access control lists of the broker, like kafka-acls: which principal (User:NAME, User:* for
every one) may do which operation on which resource (a topic, a group, a transactional id, the cluster),
from which host. They apply when the broker authenticates clients (--sasl or --tls-client-ca): then a
request no ACL allows is refused (DENY ACLs win over ALLOW ones), except for --super-users. They are kept
in DIR/__security/acls (mode 0600); a running broker sees changes at the next request.

Run 'pylog acls ACTION --help' for each action."""

_ACL_ADD_HELP = f"""\
Add ACLs: one per principal and operation given, on the resource given (--topic, --group,
--transactional-id or --cluster; --prefixed: every name starting with it; '*' as a name: every name).
Operations: {", ".join(OPERATIONS)}. READ, WRITE, DELETE and ALTER allow DESCRIBE too; ALTER_CONFIGS allows
DESCRIBE_CONFIGS. A consumer in a group needs READ on its topics and READ on the group; a producer WRITE
on its topics (and, transactional, WRITE on its transactional id).

On disk: DIR/__security/acls is replaced atomically. Prints each ACL added.

Exit status: 0 success (ACLs already there are not added twice); 1 the file cannot be written; 2 a usage
error."""

_ACL_LIST_HELP = """\
Print the ACLs, one per line: RESOURCE_TYPE:PATTERN:NAME PRINCIPAL PERMISSION OPERATION from HOST; only
those of --principal and of the resource given, when given. With --json: a list of objects. Changes
nothing.

Exit status: 0 success; 1 the ACL file does not check."""

_ACL_REMOVE_HELP = """\
Remove the ACLs matching the options exactly (the same options as 'acls add'); prints each one removed.

Exit status: 0 success; 1 no ACL matched; 2 a usage error."""


def _acl_options(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument(
        "--principal", action="append", required=required, metavar="User:NAME", help="who (repeatable)"
    )
    p.add_argument(
        "--operation",
        action="append",
        type=str.upper,
        choices=list(OPERATIONS),
        required=required,
        metavar="OP",
        help="what (repeatable): " + ", ".join(OPERATIONS),
    )
    resource = p.add_mutually_exclusive_group(required=required)
    resource.add_argument("--topic", metavar="T", help="a topic ('*': every topic)")
    resource.add_argument("--group", metavar="G", help="a consumer group ('*': every group)")
    resource.add_argument("--transactional-id", metavar="X", help="a transactional id ('*': every one)")
    resource.add_argument("--cluster", action="store_true", help="the cluster (create topics, describe, ...)")
    p.add_argument("--prefixed", action="store_true", help="the name is a prefix (Kafka's PREFIXED pattern)")
    p.add_argument("--deny", action="store_true", help="a DENY ACL (default ALLOW); denials win")
    p.add_argument("--host", default="*", metavar="H", help="the client's IP address ('*', the default: any)")


def register(sub: Subparsers, parents: Parents) -> None:
    acls = sub.add_parser(
        "acls", parents=parents.base, help="access control lists of the broker", **described(_ACLS_HELP)
    )
    acl_actions = acls.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = acl_actions.add_parser("add", parents=parents.base, help="add ACLs", **described(_ACL_ADD_HELP))
    _acl_options(p, required=True)
    p.set_defaults(func=add_acls)
    p = acl_actions.add_parser("list", parents=parents.base, help="list ACLs", **described(_ACL_LIST_HELP))
    _acl_options(p, required=False)
    p.set_defaults(func=list_acls)
    p = acl_actions.add_parser(
        "remove", parents=parents.base, help="remove ACLs", **described(_ACL_REMOVE_HELP)
    )
    _acl_options(p, required=True)
    p.set_defaults(func=remove_acls)

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


def _resource(args: argparse.Namespace) -> tuple[str, str] | None:
    if args.topic is not None:
        return "TOPIC", args.topic
    if args.group is not None:
        return "GROUP", args.group
    if args.transactional_id is not None:
        return "TRANSACTIONAL_ID", args.transactional_id
    if args.cluster:
        return "CLUSTER", CLUSTER_NAME
    return None


def _acls_of(args: argparse.Namespace) -> list[Acl]:
    resource = _resource(args)
    if resource is None:  # pragma: no cover - argparse requires one
        raise UsageError("give --topic, --group, --transactional-id or --cluster")
    if args.prefixed and resource[0] == "CLUSTER":
        raise UsageError("--prefixed does not apply to --cluster")
    return [
        Acl(
            principal=principal,
            host=args.host,
            operation=operation,
            permission="DENY" if args.deny else "ALLOW",
            resource_type=resource[0],
            pattern_type="PREFIXED" if args.prefixed else "LITERAL",
            name=resource[1],
        )
        for principal in dict.fromkeys(args.principal)
        for operation in dict.fromkeys(args.operation)
    ]


def _print_acls(args: argparse.Namespace, acls: list[Acl]) -> None:
    out = Output(args)
    if out.json:
        out.document([dataclasses.asdict(a) for a in acls])
    else:
        for acl in acls:
            out.line(acl.describe())


def add_acls(args: argparse.Namespace) -> int:
    acls = _acls_of(args)
    AclStore(log_dir(args)).add(acls)
    _print_acls(args, acls)
    return 0


def list_acls(args: argparse.Namespace) -> int:
    resource = _resource(args)
    acls = sorted(AclStore(log_dir(args)).acls())
    if args.principal:
        acls = [a for a in acls if a.principal in args.principal]
    if args.operation:
        acls = [a for a in acls if a.operation in args.operation]
    if resource is not None:
        acls = [a for a in acls if (a.resource_type, a.name) == resource]
    _print_acls(args, acls)
    return 0


def remove_acls(args: argparse.Namespace) -> int:
    gone = AclStore(log_dir(args)).remove(_acls_of(args))
    if not gone:
        raise CliError("no ACL matched")
    _print_acls(args, gone)
    return 0
