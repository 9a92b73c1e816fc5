"""``pylog quotas``: client quotas of the broker (like ``kafka-configs --entity-type users|clients
--alter --add-config producer_byte_rate=N``), kept in ``<dir>/__security/quotas``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from pylog.broker.quota_store import QuotaStore
from pylog.broker.quotas import CONSUMER, DEFAULT, PRODUCER, QuotaEntity
from pylog.cli._common import CliError, Output, Parents, UsageError, described, log_dir
from pylog.errors import ConfigError

if TYPE_CHECKING:
    from pylog.cli._common import Subparsers

__all__ = ["register"]

_QUOTAS_HELP = """\
Manage the client quotas of the broker, like kafka-configs: how many record bytes per second a user, a
client id, or a client id of a user may produce (producer_byte_rate) and fetch (consumer_byte_rate). A
client over its quota gets its answers with throttle_time_ms and the broker reads nothing more from that
connection for that long; nothing it sent is lost.

Which quota applies to a client (user U, client id C), per key, is the first one set of: --user U
--client-id C; --user U --client-id-default; --user U; --user-default --client-id C; --user-default
--client-id-default; --user-default; --client-id C; --client-id-default (Kafka's order). The user is the
principal's name (alice for User:alice; ANONYMOUS when the broker authenticates nobody).

They are kept in DIR/__security/quotas (mode 0600); a running broker sees changes at the next request.
Kafka admin clients manage the same quotas (AlterClientQuotas, DescribeClientQuotas).

Run 'pylog quotas ACTION --help' for each action."""

_SET_HELP = """\
Set quotas of one entity: a user (--user or --user-default), a client id (--client-id or
--client-id-default), or both. The other quotas of the entity are kept.

On disk: DIR/__security/quotas is replaced atomically (created with its directory if needed).

Exit status: 0 set; 1 the file does not check or cannot be written; 2 a usage error (no entity, no quota, a
rate that is not a whole number >= 1)."""

_LIST_HELP = """\
Print each entity and its quotas: ENTITY KEY=VALUE... (ENTITY as Kafka writes it: user=alice,
client-id=<default>); with --user/--client-id (or the defaults) only the entities naming them. With --json: a
list of {"user", "client-id", "values"} ("<default>": the default entity; a missing part: not named).
Changes nothing.

Exit status: 0 success; 1 the file does not check."""

_REMOVE_HELP = """\
Remove quotas of one entity: those named (--producer-byte-rate, --consumer-byte-rate), else all of them.

Exit status: 0 removed; 1 the entity had none of them; 2 a usage error."""


def _entity_options(p: argparse.ArgumentParser) -> None:
    user = p.add_mutually_exclusive_group()
    user.add_argument("--user", metavar="U", help="the user (the principal's name: alice for User:alice)")
    user.add_argument("--user-default", action="store_true", help="the default user (<default>)")
    client = p.add_mutually_exclusive_group()
    client.add_argument("--client-id", metavar="C", help="the client id (a client's client.id)")
    client.add_argument("--client-id-default", action="store_true", help="the default client id (<default>)")


def register(sub: Subparsers, parents: Parents) -> None:
    quotas = sub.add_parser(
        "quotas", parents=parents.base, help="client quotas of the broker", **described(_QUOTAS_HELP)
    )
    actions = quotas.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = actions.add_parser("set", parents=parents.base, help="set quotas", **described(_SET_HELP))
    _entity_options(p)
    p.add_argument(
        "--produce-byte-rate",
        "--producer-byte-rate",
        dest="producer_byte_rate",
        type=int,
        metavar="N",
        help="record bytes per second the entity may produce (producer_byte_rate)",
    )
    p.add_argument(
        "--consumer-byte-rate",
        "--fetch-byte-rate",
        dest="consumer_byte_rate",
        type=int,
        metavar="N",
        help="record bytes per second the entity may fetch (consumer_byte_rate)",
    )
    p.set_defaults(func=set_quotas)
    p = actions.add_parser("list", parents=parents.base, help="list quotas", **described(_LIST_HELP))
    _entity_options(p)
    p.set_defaults(func=list_quotas)
    p = actions.add_parser("remove", parents=parents.base, help="remove quotas", **described(_REMOVE_HELP))
    _entity_options(p)
    p.add_argument(
        "--produce-byte-rate",
        "--producer-byte-rate",
        dest="producer_byte_rate",
        action="store_true",
        help="remove producer_byte_rate only",
    )
    p.add_argument(
        "--consumer-byte-rate",
        "--fetch-byte-rate",
        dest="consumer_byte_rate",
        action="store_true",
        help="remove consumer_byte_rate only",
    )
    p.set_defaults(func=remove_quotas)


def _parts(args: argparse.Namespace) -> tuple[str | None, str | None]:
    user = DEFAULT if args.user_default else args.user
    client_id = DEFAULT if args.client_id_default else args.client_id
    if (user == DEFAULT and args.user is not None) or (client_id == DEFAULT and args.client_id is not None):
        raise UsageError(f"{DEFAULT} names the default entity: use --user-default or --client-id-default")
    return user, client_id


def _entity(args: argparse.Namespace) -> QuotaEntity:
    user, client_id = _parts(args)
    if user is None and client_id is None:
        raise UsageError("give the entity: --user U, --user-default, --client-id C or --client-id-default")
    try:
        return QuotaEntity(user, client_id).checked()
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc


def set_quotas(args: argparse.Namespace) -> int:
    entity = _entity(args)
    values = {
        key: value
        for key, value in ((PRODUCER, args.producer_byte_rate), (CONSUMER, args.consumer_byte_rate))
        if value is not None
    }
    if not values:
        raise UsageError("give --produce-byte-rate N and/or --consumer-byte-rate N")
    for key, value in values.items():
        if value < 1:
            raise UsageError(f"{key} must be a whole number of bytes per second >= 1, got {value}")
    after = QuotaStore(log_dir(args)).alter([(entity, dict(values))])
    _print(args, {entity: after[entity]})
    return 0


def list_quotas(args: argparse.Namespace) -> int:
    user, client_id = _parts(args)
    quotas = QuotaStore(log_dir(args)).quotas()
    shown = {
        e: v
        for e, v in quotas.items()
        if (user is None or e.user == user) and (client_id is None or e.client_id == client_id)
    }
    _print(args, shown)
    return 0


def remove_quotas(args: argparse.Namespace) -> int:
    entity = _entity(args)
    keys = [k for k, on in ((PRODUCER, args.producer_byte_rate), (CONSUMER, args.consumer_byte_rate)) if on]
    gone = QuotaStore(log_dir(args)).remove(entity, keys or None)
    if not gone:
        named = f" {', '.join(keys)}" if keys else ""
        raise CliError(f"no quota{named} set for {entity.describe()}")
    _print(args, {entity: gone})
    return 0


def _print(args: argparse.Namespace, quotas: Any) -> None:
    out = Output(args)
    rows = sorted(quotas.items(), key=lambda item: item[0].sort_key())
    if out.json:
        document = []
        for entity, values in rows:
            row: dict[str, Any] = {}
            if entity.user is not None:
                row["user"] = entity.user
            if entity.client_id is not None:
                row["client-id"] = entity.client_id
            row["values"] = dict(sorted(values.items()))
            document.append(row)
        out.document(document)
    else:
        for entity, values in rows:
            out.line(f"{entity.describe()} " + " ".join(f"{k}={v}" for k, v in sorted(values.items())))
