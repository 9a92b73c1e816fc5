"""``pylog streams``: describe and reset stream applications (:mod:`pylog.streams`), like Kafka's
``kafka-streams-application-reset`` tool."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from pylog.cli._common import Output, Parents, described, open_log
from pylog.streams.admin import describe_application, reset_application

if TYPE_CHECKING:
    from pylog.cli._common import Subparsers

__all__ = ["register"]

_HELP = """\
Inspect and reset the stream applications of the log directory (see docs/streams.md). An application is its
consumer group (named by its application id) and its internal topics (<app>-<store>-changelog,
<app>-<name>-repartition).

Run 'pylog streams ACTION --help' for each action."""

_DESCRIBE_HELP = """\
The application's group (state, generation, members), one row per source partition with a committed offset
or an owner:

  TOPIC PARTITION COMMITTED-OFFSET LOG-END-OFFSET LAG OWNER

and its internal topics with their partitions and records. Changes nothing.

Exit status: 0 success; 1 no group and no internal topic of that name, or the log cannot be opened."""

_RESET_HELP = """\
Reset an application, as kafka-streams-application-reset does: delete its consumer group (its committed
offsets: restarted, it reads its input topics from the beginning) and its internal topics (its state:
changelogs and repartition topics). Input and output topics are not touched. Every instance of the
application must be stopped.

Without --execute this is a dry run: it prints what would be deleted and changes nothing.

Exit status: 0 shown or done; 1 the application still has live members, or the log cannot be opened."""


def register(sub: Subparsers, parents: Parents) -> None:
    streams = sub.add_parser(
        "streams", parents=parents.base, help="describe and reset stream applications", **described(_HELP)
    )
    actions = streams.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = actions.add_parser(
        "describe", parents=parents.base, help="group, lag and internal topics", **described(_DESCRIBE_HELP)
    )
    p.add_argument("application_id", metavar="APP", help="the application id")
    p.set_defaults(func=describe)
    p = actions.add_parser(
        "reset", parents=parents.base, help="delete offsets and internal topics", **described(_RESET_HELP)
    )
    p.add_argument("application_id", metavar="APP", help="the application id")
    run = p.add_mutually_exclusive_group()
    run.add_argument("--dry-run", action="store_true", help="only show what would be deleted (the default)")
    run.add_argument("--execute", action="store_true", help="delete")
    p.set_defaults(func=reset)


def describe(args: argparse.Namespace) -> int:
    out = Output(args)
    with open_log(args) as log:
        info = describe_application(log, args.application_id)
    if out.json:
        out.document(info)
        return 0
    facts = [f"state {info['state']}", f"generation {info['generation']}", f"{len(info['members'])} members"]
    out.line(f"Application {info['application_id']} ({', '.join(facts) if info['state'] else 'no group'})")
    columns = ["TOPIC", "PARTITION", "COMMITTED-OFFSET", "LOG-END-OFFSET", "LAG", "OWNER"]
    keys = ["topic", "partition", "committed_offset", "log_end_offset", "lag", "owner"]
    if info["partitions"]:
        out.table(columns, ([row[k] for k in keys] for row in info["partitions"]))
    if info["internal_topics"]:
        rows = (
            [t["topic"], t["partitions"], t["records"], t["cleanup_policy"]] for t in info["internal_topics"]
        )
        out.table(["INTERNAL-TOPIC", "PARTITIONS", "RECORDS", "CLEANUP-POLICY"], rows)
    return 0


def reset(args: argparse.Namespace) -> int:
    out = Output(args)
    with open_log(args, create=False) as log:
        done = reset_application(log, args.application_id, execute=args.execute)
    if out.json:
        out.document(done)
        return 0
    verb = "Deleted" if done["executed"] else "Would delete (dry run; --execute to delete)"
    what = ([f"consumer group {done['application_id']}"] if done["group"] else []) + [
        f"topic {t}" for t in done["internal_topics"]
    ]
    out.line(f"{verb}: {', '.join(what) if what else 'nothing (no group, no internal topic)'}")
    return 0
