"""``pylog topics``: create, list, describe, alter and delete topics (like ``kafka-topics``).

Configs are given as ``--config key=value`` (repeatable), with pylog's names (``retention_ms``) or Kafka's
(``retention.ms``); values are ints when numeric.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from pylog.cli._common import CliError, Output, Parents, UsageError, config_name, open_log, parse_config
from pylog.config import TopicConfig
from pylog.errors import TopicExistsError, UnknownTopicError
from pylog.tiered.retention import pending_deletions

if TYPE_CHECKING:
    from pylog.cli._common import Subparsers

__all__ = ["register"]


def register(sub: Subparsers, parents: Parents) -> None:
    topics = sub.add_parser(
        "topics", parents=parents.base, help="create, list, describe, alter and delete topics"
    )
    actions = topics.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = actions.add_parser("create", parents=parents.base, help="create a topic")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--partitions", type=int, default=1, metavar="N", help="number of partitions (default 1)")
    _add_config(p)
    p.add_argument("--if-not-exists", action="store_true", help="succeed if the topic already exists")
    p.set_defaults(func=create)

    p = actions.add_parser("list", parents=parents.base, help="list topic names")
    p.set_defaults(func=list_topics)

    p = actions.add_parser(
        "describe", parents=parents.base, help="partitions (offsets, segments, bytes) and configs"
    )
    p.add_argument("name", metavar="NAME", nargs="?", help="one topic (default: all)")
    p.set_defaults(func=describe)

    p = actions.add_parser("alter", parents=parents.base, help="add partitions or change configs")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--partitions", type=int, metavar="N", help="grow to N partitions in total")
    _add_config(p)
    p.add_argument(
        "--delete-config", action="append", metavar="KEY", help="reset a config to its default (repeatable)"
    )
    p.set_defaults(func=alter)

    p = actions.add_parser("delete", parents=parents.base, help="delete a topic and all its records")
    p.add_argument("name", metavar="NAME")
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
        rows = [
            (
                p["partition"],
                p["log_start_offset"],
                p["log_end_offset"],
                p["segments"],
                p["bytes"],
            )
            for p in info["partitions"]
        ]
        out.table(["PARTITION", "LOG-START-OFFSET", "LOG-END-OFFSET", "SEGMENTS", "BYTES"], rows, title)
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
