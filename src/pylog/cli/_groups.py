"""``pylog groups``: list, describe, reset the offsets of, and delete consumer groups (like
``kafka-consumer-groups``).

Built on the admin methods of :class:`~pylog.Log`: ``list_groups()``, ``describe_group(group_id)``,
``group_offsets(group_id)``, ``reset_group_offsets(group_id, offsets)`` and ``delete_group(group_id)``. When the
installed pylog lacks them the command says so and exits with status 2. Their results are read loosely:
mappings or objects with the Kafka field names (``group_id``, ``state``, ``generation``, ``members`` with
``member_id`` and ``assignment``; offsets keyed by ``TopicPartition`` with an int or ``OffsetAndMetadata``).

``describe`` shows Kafka's columns: GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID, where
CURRENT-OFFSET is the committed offset (the next to read) and LAG = LOG-END-OFFSET - CURRENT-OFFSET.

``list --json`` and ``describe`` report the same ``state`` (Kafka's names: ``Empty``, ``PreparingRebalance``,
``Stable``), computed by one function from ``describe_group``.

``delete`` attempts every group named, prints the outcome of each, and exits with status 1 if any could not be
deleted (an unknown group, a group with live members), as ``kafka-consumer-groups --delete`` does.

``reset-offsets`` computes new committed offsets per partition and only prints them (a dry run) unless
``--execute`` is given. Offsets outside a partition's range are moved into it, with kafka-consumer-groups'
warning ("New offset (N) is higher than latest offset ..."). ``--to-datetime`` takes ISO
8601 (``2024-05-01T12:00:00Z``; local time without an offset) and picks the earliest offset whose timestamp is
at or after it (the log end when there is none).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from pylog.cli._common import (
    CliError,
    Output,
    Parents,
    Unavailable,
    UsageError,
    describe_error,
    described,
    note,
    open_log,
    parse_datetime_ms,
)
from pylog.errors import PylogError, UnknownGroupError, UnknownPartitionError, UnknownTopicError
from pylog.structs import TopicPartition

if TYPE_CHECKING:
    from pylog.cli._common import Subparsers
    from pylog.log import Log

__all__ = ["register"]

_COLUMNS = ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID"]


_GROUPS_HELP = """\
Inspect and change the consumer groups of the log directory, like kafka-consumer-groups: their members,
committed offsets and lag. A group's members and committed offsets are files in the log directory; only
'reset-offsets --execute' and 'delete' change them.

Run 'pylog groups ACTION --help' for each action."""

_LIST_HELP = """\
Print the name of every consumer group of the log directory, one per line. With --json: a list of
{"group", "state"}, the state as 'describe' gives it (Empty, PreparingRebalance or Stable).

Changes no group, offset or record.

Exit status: 0 success; 1 the log directory cannot be opened."""

_DESCRIBE_HELP = """\
For each group named (or every group, with --all-groups): its state, generation and number of members,
then one row per partition it has a committed offset for or a member is assigned:

  GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID

CURRENT-OFFSET is the committed offset (the next record the group will read), LAG is LOG-END-OFFSET minus
CURRENT-OFFSET, CONSUMER-ID the member the partition is assigned to, and '-' stands for none.

Changes no group, offset or record (members whose process died are expelled, as any member would do).

Exit status: 0 success; 1 an unknown group, or the log directory cannot be opened; 2 no group named and
no --all-groups."""

_RESET_HELP = """\
Move the committed offsets of GROUP, for the partitions chosen, to a new place:

  --to-earliest       the partition's log start offset
  --to-latest         its log end offset (only new records are read)
  --to-offset N       offset N
  --shift-by N        the committed offset plus N (N may be negative)
  --to-datetime ISO   the first record at or after that time (2024-05-01T12:00:00Z; local time without a
                      UTC offset); the log end offset when there is none

The partitions are those of --topic T (every partition of T; repeatable), --topic T:0,2 (some of them), or
--all-topics (every partition the group has a committed offset for).

An offset outside a partition's range is set to its log start or log end offset, and a warning on stderr
says so, as kafka-consumer-groups does: "New offset (1000) is higher than latest offset for topic
partition t-0. Value will be set to 42". With --json, each partition also gives requested_offset and
clamped_to (log_start_offset, log_end_offset or null), and "warnings" lists the warnings.

Without --execute this is a dry run: it prints the new offsets and changes nothing. With --execute the new
offsets are committed for the group (its other partitions keep theirs); the group must have no live
member. No record is changed either way.

Exit status: 0 the offsets were shown (dry run) or committed; 1 an unknown topic, partition or group, a
group with live members, --shift-by for a partition without a committed offset, or --all-topics for a
group without committed offsets; 2 a usage error."""

_DELETE_HELP = """\
Delete each group named: its members' records and its committed offsets, as kafka-consumer-groups --delete
does. A group with live members is not deleted. Records are never touched.

Every group named is tried; each one deleted is printed. With --json: {"deleted": [...], "failed":
{group: reason}}.

Exit status: 0 every group was deleted; 1 at least one could not be (an unknown group, a group with live
members), named on stderr with the reason; 2 a usage error."""


def register(sub: Subparsers, parents: Parents) -> None:
    groups = sub.add_parser(
        "groups",
        parents=parents.base,
        help="list, describe, reset offsets of and delete consumer groups",
        **described(_GROUPS_HELP),
    )
    actions = groups.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = actions.add_parser("list", parents=parents.base, help="list consumer groups", **described(_LIST_HELP))
    p.set_defaults(func=list_groups)

    p = actions.add_parser(
        "describe",
        parents=parents.base,
        help="committed offsets, lag and members",
        **described(_DESCRIBE_HELP),
    )
    p.add_argument("groups", nargs="*", metavar="GROUP", help="the groups to describe")
    p.add_argument("--all-groups", action="store_true", help="describe every group")
    p.set_defaults(func=describe)

    p = actions.add_parser(
        "reset-offsets",
        parents=parents.base,
        help="move a group's committed offsets (a dry run unless --execute)",
        **described(_RESET_HELP),
    )
    p.add_argument("group", metavar="GROUP", help="the group whose committed offsets move")
    scope = p.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "--topic",
        action="append",
        metavar="TOPIC[:P,P]",
        help="a topic, or some of its partitions (repeatable)",
    )
    scope.add_argument("--all-topics", action="store_true", help="every topic the group has offsets for")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--to-earliest", action="store_true", help="the log start offset")
    mode.add_argument("--to-latest", action="store_true", help="the log end offset")
    mode.add_argument("--to-offset", type=int, metavar="N", help="offset N")
    mode.add_argument(
        "--shift-by", type=int, metavar="N", help="the committed offset plus N (may be negative)"
    )
    mode.add_argument("--to-datetime", metavar="ISO", help="the first offset at or after this time")
    run = p.add_mutually_exclusive_group()
    run.add_argument("--dry-run", action="store_true", help="only show the new offsets (the default)")
    run.add_argument("--execute", action="store_true", help="commit the new offsets")
    p.set_defaults(func=reset_offsets)

    p = actions.add_parser(
        "delete",
        parents=parents.base,
        help="delete consumer groups and their offsets",
        **described(_DELETE_HELP),
    )
    p.add_argument("groups", nargs="+", metavar="GROUP", help="the groups to delete")
    p.set_defaults(func=delete)


# -- reading the admin API's answers loosely --------------------------------------------------------------


def _require(log: Log, name: str) -> Any:
    method = getattr(log, name, None)
    if method is None:
        raise Unavailable(
            f"consumer group administration is not available in this version of pylog (Log.{name})"
        )
    return method


def _get(obj: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        if isinstance(obj, Mapping):
            if name in obj:
                return obj[name]
        elif hasattr(obj, name):
            return getattr(obj, name)
    return default


def _tp(obj: Any) -> TopicPartition:
    topic, partition = _get(obj, "topic"), _get(obj, "partition")
    if topic is None and isinstance(obj, tuple | list) and len(obj) == 2:
        topic, partition = obj
    if topic is None and isinstance(obj, str):
        topic, _, partition = obj.rpartition("-")
    return TopicPartition(str(topic), int(partition))


def _offset(value: Any) -> int | None:
    if value is None or isinstance(value, int):
        return value
    found = _get(value, "offset", "committed", "current_offset")
    return None if found is None else int(found)


def _committed(raw: Any) -> dict[TopicPartition, int | None]:
    if isinstance(raw, Mapping):
        return {_tp(k): _offset(v) for k, v in raw.items()}
    return {_tp(row): _offset(_get(row, "offset", "committed", "current_offset")) for row in raw or ()}


def _assignment(raw: Any) -> list[TopicPartition]:
    if isinstance(raw, Mapping):
        return [TopicPartition(t, int(p)) for t, ps in raw.items() for p in ps]
    return [_tp(x) for x in raw or ()]


def _members(description: Any) -> list[dict[str, Any]]:
    raw = _get(description, "members", default=[]) or []
    items: Iterable[Any] = raw.values() if isinstance(raw, Mapping) else raw
    return [
        {
            "member_id": _get(m, "member_id", "consumer_id", "id"),
            "group_instance_id": _get(m, "group_instance_id"),
            "client_id": _get(m, "client_id"),
            "assignment": _assignment(_get(m, "assignment", "partitions", default=[])),
        }
        for m in items
    ]


def _group_id(item: Any) -> str:
    return str(item if isinstance(item, str) else _get(item, "group_id", "group", "id"))


def _end_offset(log: Log, tp: TopicPartition) -> int | None:
    try:
        return log.topic(tp.topic).partition(tp.partition).log_end_offset
    except (UnknownTopicError, UnknownPartitionError):
        return None


# -- commands ---------------------------------------------------------------------------------------------


def list_groups(args: argparse.Namespace) -> int:
    out = Output(args)
    with open_log(args) as log:
        names = [_group_id(i) for i in _require(log, "list_groups")()]
        states = _states(log, names) if out.json else {}
    if out.json:
        out.document([{"group": name, "state": state} for name, state in states.items()])
    else:
        for name in names:
            out.line(name)
    return 0


def _states(log: Log, names: list[str]) -> dict[str, str | None]:
    states = {}
    for name in names:
        try:
            states[name] = _state(log, name)
        except UnknownGroupError:
            continue  # deleted since it was listed
    return states


def _state(log: Log, group: str) -> str | None:
    """The group's state as ``describe`` reports it: the one place both commands take it from."""
    return _state_of(_require(log, "describe_group")(group))


def _state_of(description: Any) -> str | None:
    state = _get(description, "state")
    return None if state is None else str(state)


def describe(args: argparse.Namespace) -> int:
    out = Output(args)
    if not args.groups and not args.all_groups:
        raise UsageError("name one or more groups, or use --all-groups")
    with open_log(args) as log:
        names = [_group_id(i) for i in _require(log, "list_groups")()] if args.all_groups else args.groups
        described = [_describe_one(log, name) for name in names]
    if out.json:
        out.document(described)
        return 0
    for group in described:
        title = f"Group {group['group']}"
        facts = [f"state {group['state']}"] if group["state"] is not None else []
        if group["generation"] is not None:
            facts.append(f"generation {group['generation']}")
        facts.append(f"{len(group['members'])} members")
        rows = [[group["group"], *(r[k] for k in _ROW_KEYS)] for r in group["partitions"]]
        if not rows:
            out.line(f"{title} ({', '.join(facts)}): no committed offsets and no assigned partitions.")
            continue
        out.table(_COLUMNS, rows, f"{title} ({', '.join(facts)})")
    return 0


_ROW_KEYS = ["topic", "partition", "current_offset", "log_end_offset", "lag", "consumer_id"]


def _describe_one(log: Log, group: str) -> dict[str, Any]:
    description = _require(log, "describe_group")(group)
    committed = _committed(_require(log, "group_offsets")(group))
    members = _members(description)
    owner = {tp: m["member_id"] for m in members for tp in m["assignment"]}
    rows = []
    for tp in sorted(set(committed) | set(owner)):
        current = committed.get(tp)
        end = _end_offset(log, tp)
        lag = None if current is None or end is None else max(end - current, 0)
        rows.append(
            {
                "topic": tp.topic,
                "partition": tp.partition,
                "current_offset": current,
                "log_end_offset": end,
                "lag": lag,
                "consumer_id": owner.get(tp),
            }
        )
    return {
        "group": group,
        "state": _state_of(description),
        "generation": _get(description, "generation", "generation_id"),
        "members": members,
        "partitions": rows,
    }


def reset_offsets(args: argparse.Namespace) -> int:
    out = Output(args)
    with open_log(args) as log:
        committed = _committed(_require(log, "group_offsets")(args.group))
        reset = _require(log, "reset_group_offsets") if args.execute else None
        tps = sorted(committed) if args.all_topics else _named_partitions(log, args.topic)
        if not tps:
            raise CliError(f"group {args.group!r} has no committed offsets; name topics with --topic")
        targets = {tp: _target(log, tp, args, committed.get(tp)) for tp in tps}
        planned = {tp: target.new_offset for tp, target in targets.items()}
        if reset is not None:
            reset(args.group, planned)
    rows = [
        {
            "topic": tp.topic,
            "partition": tp.partition,
            "current_offset": committed.get(tp),
            "new_offset": target.new_offset,
            "requested_offset": target.requested,
            "clamped_to": target.clamped_to,
        }
        for tp, target in targets.items()
    ]
    warnings = [w for w in (target.warning(tp) for tp, target in targets.items()) if w is not None]
    for warning in warnings:  # before the table, as kafka-consumer-groups logs them
        note(f"WARN {warning}")
    if out.json:
        document = {"group": args.group, "executed": bool(args.execute), "partitions": rows}
        out.document({**document, "warnings": warnings})
    else:
        out.table(
            ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"],
            [[args.group, r["topic"], r["partition"], r["current_offset"], r["new_offset"]] for r in rows],
        )
    if not args.execute:
        note("Dry run: nothing was changed. Add --execute to commit these offsets.")
    return 0


class _Target(NamedTuple):
    """Where ``reset-offsets`` puts one partition: the offset asked for, and the one it gets once moved
    into ``[log start, log end]``."""

    requested: int
    start: int
    end: int

    @property
    def new_offset(self) -> int:
        return min(max(self.requested, self.start), self.end)

    @property
    def clamped_to(self) -> str | None:
        if self.requested > self.end:
            return "log_end_offset"
        if self.requested < self.start:
            return "log_start_offset"
        return None

    def warning(self, tp: TopicPartition) -> str | None:
        """Kafka's words (kafka-consumer-groups) for an offset moved into the partition's range."""
        where = f"for topic partition {tp.topic}-{tp.partition}. Value will be set to {self.new_offset}"
        if self.requested > self.end:
            return f"New offset ({self.requested}) is higher than latest offset {where}"
        if self.requested < self.start:
            return f"New offset ({self.requested}) is lower than earliest offset {where}"
        return None


def _named_partitions(log: Log, specs: list[str]) -> list[TopicPartition]:
    tps = []
    for spec in specs:
        name, _, numbers = spec.partition(":")
        topic = log.topic(name)
        if not numbers:
            tps += topic.partitions()
            continue
        for part in numbers.split(","):
            try:
                p = int(part)
            except ValueError:
                raise UsageError(f"--topic expects TOPIC or TOPIC:P,P, got {spec!r}") from None
            topic.partition(p)  # raises for a partition that does not exist
            tps.append(TopicPartition(name, p))
    return sorted(set(tps))


def _target(log: Log, tp: TopicPartition, args: argparse.Namespace, current: int | None) -> _Target:
    plog = log.topic(tp.topic).partition(tp.partition)
    start, end = plog.log_start_offset, plog.log_end_offset
    target: int
    if args.to_earliest:
        target = start
    elif args.to_latest:
        target = end
    elif args.to_offset is not None:
        target = args.to_offset
    elif args.shift_by is not None:
        if current is None:
            raise CliError(f"{tp.topic}-{tp.partition} has no committed offset to shift from")
        target = current + args.shift_by
    else:
        hit = plog.offset_for_time(parse_datetime_ms(args.to_datetime))
        target = end if hit is None else hit[0]
    return _Target(target, start, end)


def delete(args: argparse.Namespace) -> int:
    out = Output(args)
    failed: dict[str, str] = {}
    deleted: list[str] = []
    with open_log(args) as log:
        remove = _require(log, "delete_group")
        for group in dict.fromkeys(args.groups):
            try:
                remove(group)
            except PylogError as exc:
                failed[group] = f"{type(exc).__name__}: {describe_error(exc)}"
            else:
                deleted.append(group)
    if out.json:
        out.document({"deleted": deleted, "failed": failed})
    else:
        for group in deleted:
            out.line(f"Deleted consumer group {group}.")
    if failed:
        reasons = "; ".join(f"{group} ({why})" for group, why in failed.items())
        raise CliError(f"could not delete {len(failed)} of {len(deleted) + len(failed)} groups: {reasons}")
    return 0
