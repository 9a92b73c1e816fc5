"""``pylog topics``: create, list, describe, alter and delete topics (like ``kafka-topics``).

Configs are given as ``--config key=value`` (repeatable), with pylog's names (``retention_ms``) or Kafka's
(``retention.ms``); values are ints when numeric.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from pylog.cli._common import (
    CliError,
    Output,
    Parents,
    UsageError,
    config_name,
    described,
    open_log,
    parse_config,
)
from pylog.config import TopicConfig
from pylog.errors import TopicExistsError, UnknownTopicError
from pylog.tiered.retention import pending_deletions

if TYPE_CHECKING:
    from pylog.cli._common import Subparsers

__all__ = ["register"]


_TOPICS_HELP = """\
Create, list, describe, change and delete the topics of the log directory, like kafka-topics.

Run 'pylog topics ACTION --help' for each action."""

_CREATE_HELP = """\
Create topic NAME with --partitions N partitions (default 1) and the configs given with --config, in
pylog's spelling (retention_ms=86400000) or Kafka's (retention.ms=86400000); configs not given take the
defaults. Topic names are 1 to 249 characters of a-z, A-Z, 0-9, '.', '_' and '-'.

On disk: records the topic in the log directory's manifest and creates a directory per partition
(NAME-0, NAME-1, ...). Creates the log directory itself when it does not exist yet.

Exit status: 0 created (or, with --if-not-exists, it existed already); 1 the topic exists, or its name or
a config is invalid; 2 a usage error."""

_LIST_HELP = """\
Print the name of every topic of the log directory, one per line; with --json, each topic with its number
of partitions.

Changes no record or config.

Exit status: 0 success; 1 the log directory does not exist or cannot be opened."""

_DESCRIBE_HELP = """\
For each topic (NAME, or every topic): its partition count and the configs that differ from the
defaults, then per partition its log start offset, log end offset (the offset the next record gets),
number of segments and bytes on disk. With --json, every config and the figures of every partition.

Changes no record or config.

Exit status: 0 success; 1 an unknown topic, or the log directory cannot be opened."""

_ALTER_HELP = """\
Change topic NAME: grow it to --partitions N partitions in all (partitions can only be added; existing
records stay where they are, and keys may map to other partitions from then on, as in Kafka), set configs
with --config KEY=VALUE, or reset configs to their defaults with --delete-config KEY.

On disk: rewrites the log directory's manifest and creates the new partitions' directories. Records are
not rewritten; new configs apply from then on (a shorter retention deletes segments the next time
retention runs, not now).

Exit status: 0 changed; 1 an unknown topic, an invalid config, or --partitions not above the current
count; 2 a usage error (nothing to change, --delete-config of an unknown config)."""

_DELETE_HELP = """\
Delete topic NAME and every record of it: it leaves the log directory's manifest first, then its partition
directories are removed, and the committed offsets consumer groups had for it are forgotten (so a topic
created again under the name starts afresh). For a topic tiered to an object store, its objects there are
deleted too (or, when the store cannot be reached, at the next tiering pass of this log).

This cannot be undone.

Exit status: 0 deleted (or, with --if-exists, it did not exist); 1 an unknown topic, or the directory
cannot be changed; 2 a usage error."""


def register(sub: Subparsers, parents: Parents) -> None:
    topics = sub.add_parser(
        "topics",
        parents=parents.base,
        help="create, list, describe, alter and delete topics",
        **described(_TOPICS_HELP),
    )
    actions = topics.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = actions.add_parser("create", parents=parents.base, help="create a topic", **described(_CREATE_HELP))
    p.add_argument("name", metavar="NAME", help="the new topic's name")
    p.add_argument("--partitions", type=int, default=1, metavar="N", help="number of partitions (default 1)")
    _add_config(p)
    p.add_argument("--if-not-exists", action="store_true", help="succeed if the topic already exists")
    p.set_defaults(func=create)

    p = actions.add_parser("list", parents=parents.base, help="list topic names", **described(_LIST_HELP))
    p.set_defaults(func=list_topics)

    p = actions.add_parser(
        "describe",
        parents=parents.base,
        help="partitions (offsets, segments, bytes) and configs",
        **described(_DESCRIBE_HELP),
    )
    p.add_argument("name", metavar="NAME", nargs="?", help="one topic (default: all)")
    p.set_defaults(func=describe)

    p = actions.add_parser(
        "alter", parents=parents.base, help="add partitions or change configs", **described(_ALTER_HELP)
    )
    p.add_argument("name", metavar="NAME", help="the topic to change")
    p.add_argument("--partitions", type=int, metavar="N", help="grow to N partitions in total")
    _add_config(p)
    p.add_argument(
        "--delete-config", action="append", metavar="KEY", help="reset a config to its default (repeatable)"
    )
    p.set_defaults(func=alter)

    p = actions.add_parser(
        "delete",
        parents=parents.base,
        help="delete a topic and all its records",
        **described(_DELETE_HELP),
    )
    p.add_argument("name", metavar="NAME", help="the topic to delete")
    p.add_argument("--if-exists", action="store_true", help="succeed if the topic does not exist")
    p.set_defaults(func=delete)


def _add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        action="append",
        metavar="KEY=VALUE",
        help="topic config, e.g. retention_ms=86400000 or retention.ms=86400000 (repeatable)",
    )


def _overrides(config: dict[str, Any]) -> dict[str, Any]:
    defaults = TopicConfig().to_dict()
    return {k: v for k, v in config.items() if defaults.get(k) != v}


def _format_configs(config: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(config.items())) or "(defaults)"


def create(args: argparse.Namespace) -> int:
    out = Output(args)
    config = parse_config(args.config)
    with open_log(args, create=True) as log:
        try:
            topic = log.create_topic(args.name, args.partitions, **config)
        except TopicExistsError:
            if not args.if_not_exists:
                raise
            topic = log.topic(args.name)
            created = False
        else:
            created = True
        overrides = _overrides(topic.config.to_dict())
        if out.json:
            out.document(
                {
                    "topic": topic.name,
                    "created": created,
                    "partitions": topic.num_partitions,
                    "config": overrides,
                }
            )
        elif created:
            out.line(f"Created topic {topic.name}.")
        else:
            out.line(f"Topic {topic.name} already exists.")
    return 0


def list_topics(args: argparse.Namespace) -> int:
    out = Output(args)
    with open_log(args) as log:
        names = log.topics()
        if out.json:
            out.document([{"topic": n, "partitions": log.topic(n).num_partitions} for n in names])
        else:
            for name in names:
                out.line(name)
    return 0


def describe(args: argparse.Namespace) -> int:
    out = Output(args)
    with open_log(args) as log:
        names = [args.name] if args.name else log.topics()
        described = []
        for name in names:
            info = log.topic(name).describe()
            info["overrides"] = _overrides(info["config"])
            described.append(info)
    if out.json:
        out.document(described)
        return 0
    for info in described:
        title = (
            f"Topic: {info['topic']}  PartitionCount: {len(info['partitions'])}  "
            f"Configs: {_format_configs(info['overrides'])}"
        )
        columns = ["PARTITION", "LOG-START-OFFSET", "LOG-END-OFFSET", "SEGMENTS", "BYTES"]
        fields = ["partition", "log_start_offset", "log_end_offset", "segments", "bytes"]
        if any("remote_bytes" in p for p in info["partitions"]):  # tiered: what is local, what is remote
            columns += ["LOCAL-START-OFFSET", "REMOTE-START-OFFSET", "REMOTE-END-OFFSET", "REMOTE-BYTES"]
            fields += [
                "local_log_start_offset",
                "remote_log_start_offset",
                "remote_log_end_offset",
                "remote_bytes",
            ]
        rows = [[p.get(f) for f in fields] for p in info["partitions"]]
        out.table(columns, rows, title)
    return 0


def alter(args: argparse.Namespace) -> int:
    out = Output(args)
    config = parse_config(args.config)
    defaults = TopicConfig().to_dict()
    for name in args.delete_config or ():
        key = config_name(name)
        if key not in defaults:
            raise UsageError(f"unknown topic config {name!r}")
        config[key] = defaults[key]
    if args.partitions is None and not config:
        raise UsageError("topics alter needs --partitions, --config or --delete-config")
    changes = []
    with open_log(args) as log:
        topic = log.topic(args.name)
        before = topic.num_partitions
        topic.config.replace(**config)  # validate every change before making any
        if args.partitions is not None and args.partitions <= before:
            raise CliError(
                f"topic {args.name!r} has {before} partitions and partitions can only be added: "
                f"--partitions must be more than {before}"
            )
        if args.partitions is not None:
            topic = log.create_partitions(args.name, args.partitions)
            changes.append(f"partitions {before} -> {topic.num_partitions}")
        if config:
            topic = log.alter_topic(args.name, **config)
            changes.append(_format_configs(config))
        result = {
            "topic": topic.name,
            "partitions": topic.num_partitions,
            "config": _overrides(topic.config.to_dict()),
        }
    if out.json:
        out.document(result)
    else:
        out.line(f"Altered topic {args.name}: {'; '.join(changes)}.")
    return 0


def delete(args: argparse.Namespace) -> int:
    out = Output(args)
    remote: str | None = None  # a log with an object store: "deleted" or "pending" (its remote data)
    with open_log(args) as log:
        try:
            log.delete_topic(args.name)
            deleted = True
        except UnknownTopicError:
            if not args.if_exists:
                raise
            deleted = False
        if deleted and log.remote_log_manager is not None:
            remote = "pending" if args.name in pending_deletions(log.path) else "deleted"
    if out.json:
        document: dict[str, Any] = {"topic": args.name, "deleted": deleted}
        if remote is not None:
            document["remote"] = remote
        out.document(document)
    elif deleted:
        out.line(f"Deleted topic {args.name}.")
        if remote == "deleted":
            out.line(f"Its data in the object store was deleted ({log.remote_storage}).")
        elif remote == "pending":
            out.line(
                f"Its data in the object store ({log.remote_storage}) could not be deleted now (see the warning); "
                "the next tiering pass of this log retries."
            )
    else:
        out.line(f"Topic {args.name} does not exist.")
    return 0
