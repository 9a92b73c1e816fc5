"""Admin APIs: CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs, ListGroups, DescribeGroups,
DescribeCluster, and the APIs that mean nothing on one node, answered with Kafka's error codes.

Topic configs use Kafka's names (``retention.ms``, ``cleanup.policy``, ...): each maps to the
:class:`~pylog.config.TopicConfig` field of the same name with dots as underscores; a name pylog does not
have is refused with INVALID_CONFIG (nothing is created), as Kafka refuses an unknown config. The
replication factor must be 1 (or -1, the default): there is one node (INVALID_REPLICATION_FACTOR).

One node never elects leaders, reassigns partitions or moves replicas between log directories:
ElectLeaders answers ELECTION_NOT_NEEDED, AlterPartitionReassignments INVALID_REPLICA_ASSIGNMENT (there is no
other broker to move to), ListPartitionReassignments an empty list (nothing is moving).

Thread-safety: handlers run in the event loop; log changes run in the context's thread pool.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pylog.broker.context import NODE_ID, Context
from pylog.broker.protocol import ErrorCode, Request
from pylog.config import TopicConfig
from pylog.errors import (
    ConfigError,
    InvalidTopicError,
    PylogError,
    TopicExistsError,
    UnknownGroupError,
    UnknownTopicError,
)

if TYPE_CHECKING:
    from pylog.broker.groups import Coordinator

__all__ = ["Admin", "kafka_configs", "topic_config"]

_TOPIC = 2  # DescribeConfigs resource types
_BROKER = 4
_DEFAULTS = TopicConfig()


def topic_config(configs: list[tuple[str, str | None]]) -> dict[str, Any]:
    """Kafka-named topic configs as :class:`~pylog.config.TopicConfig` keyword arguments. Raises
    :class:`~pylog.errors.ConfigError` for a name pylog does not have or a value of the wrong type."""
    out: dict[str, Any] = {}
    known = {f.name for f in dataclasses.fields(TopicConfig)}
    for name, value in configs:
        key = name.replace(".", "_")
        if key not in known:
            raise ConfigError(f"unknown topic config {name!r}")
        if value is None:
            continue
        default = getattr(_DEFAULTS, key)
        try:
            if isinstance(default, bool):
                if value.lower() not in ("true", "false"):
                    raise ValueError(value)
                out[key] = value.lower() == "true"
            else:
                out[key] = type(default)(value)
        except ValueError as exc:
            raise ConfigError(f"topic config {name}={value!r} is not a {type(default).__name__}") from exc
    return out


def kafka_configs(config: TopicConfig) -> list[tuple[str, str, bool]]:
    """A topic's configs with Kafka's names: (name, value as Kafka writes it, is the default)."""
    out = []
    for f in dataclasses.fields(TopicConfig):
        value = getattr(config, f.name)
        text = str(value).lower() if isinstance(value, bool) else str(value)
        out.append((f.name.replace("_", "."), text, value == getattr(_DEFAULTS, f.name)))
    return out


class Admin:
    """The admin handlers (they need the group coordinator for ListGroups and DescribeGroups)."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    def handlers(self) -> dict[int, Callable[[Context, Request], Any]]:
        return {
            19: self.create_topics,
            20: self.delete_topics,
            32: self.describe_configs,
            37: self.create_partitions,
            15: self.describe_groups,
            16: self.list_groups,
            43: self.elect_leaders,
            45: self.alter_partition_reassignments,
            46: self.list_partition_reassignments,
            60: self.describe_cluster,
        }

    # -- topics ------------------------------------------------------------------------------------------

    async def create_topics(self, ctx: Context, request: Request) -> dict[str, Any]:
        body = request.body
        results = await ctx.run(
            lambda: [_create(ctx, t, bool(getattr(body, "validate_only", False))) for t in body.topics]
        )
        return {"throttle_time": 0, "topics": results}

    async def delete_topics(self, ctx: Context, request: Request) -> dict[str, Any]:
        body = request.body
        names = [str(n) for n in getattr(body, "topic_names", ())] or [
            str(t.name) for t in getattr(body, "topics", ())
        ]
        return {"throttle_time": 0, "responses": await ctx.run(lambda: [_delete(ctx, n) for n in names])}

    async def create_partitions(self, ctx: Context, request: Request) -> dict[str, Any]:
        body = request.body
        results = await ctx.run(
            lambda: [_grow(ctx, str(t.name), int(t.count), bool(body.validate_only)) for t in body.topics]
        )
        return {"throttle_time": 0, "results": results}

    async def describe_configs(self, ctx: Context, request: Request) -> dict[str, Any]:
        body = request.body
        return {
            "throttle_time": 0,
            "results": await ctx.run(lambda: [_describe(ctx, r) for r in body.resources]),
        }

    # -- groups ------------------------------------------------------------------------------------------

    async def list_groups(self, ctx: Context, request: Request) -> dict[str, Any]:
        embedded = await ctx.run(ctx.log.list_groups)
        states = {gid: g.state for gid, g in self.coordinator.groups.items() if g.members}
        groups = [
            {"group_id": gid, "protocol_type": "consumer", "group_state": states.get(gid, "Empty")}
            for gid in sorted(set(embedded) | set(states))
        ]
        wanted = {str(s) for s in getattr(request.body, "states_filter", ())}
        if wanted:
            groups = [g for g in groups if g["group_state"] in wanted]
        return {"throttle_time": 0, "error_code": ErrorCode.none, "groups": groups}

    async def describe_groups(self, ctx: Context, request: Request) -> dict[str, Any]:
        out = []
        for gid in (str(g) for g in request.body.groups):
            group = self.coordinator.groups.get(gid)
            if group is not None and group.members:
                members = [
                    {
                        "member_id": m.member_id,
                        "group_instance_id": m.instance_id,
                        "client_id": m.client_id,
                        "client_host": m.host,
                        "member_metadata": dict(m.protocols).get(group.protocol or "", b""),
                        "member_assignment": m.assignment,
                    }
                    for m in group.members.values()
                ]
                out.append(_group(gid, group.state, group.protocol or "", members))
            else:
                out.append(await ctx.run(_embedded_group, ctx, gid))
        return {"throttle_time": 0, "groups": out}

    # -- one node ----------------------------------------------------------------------------------------

    async def describe_cluster(self, ctx: Context, request: Request) -> dict[str, Any]:
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "error_message": None,
            "endpoint_type": 1,
            "cluster_id": ctx.options.cluster_id,
            "controller_id": NODE_ID,
            "brokers": [
                {"broker_id": NODE_ID, "host": ctx.options.host, "port": ctx.options.port, "rack": None}
            ],
            "cluster_authorized_operations": -2147483648,
        }

    async def elect_leaders(self, ctx: Context, request: Request) -> dict[str, Any]:
        topics = request.body.topic_partitions or ()
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "replica_election_results": [
                {
                    "topic": t.topic,
                    "partition_result": [
                        {
                            "partition_id": p,
                            "error_code": ErrorCode.election_not_needed,
                            "error_message": "one node",
                        }
                        for p in t.partitions
                    ],
                }
                for t in topics
            ],
        }

    async def alter_partition_reassignments(self, ctx: Context, request: Request) -> dict[str, Any]:
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "error_message": None,
            "responses": [
                {
                    "name": t.name,
                    "partitions": [
                        {
                            "partition_index": p.partition_index,
                            "error_code": ErrorCode.invalid_replica_assignment,
                            "error_message": "pylog's broker is a single node: there is no other broker",
                        }
                        for p in t.partitions
                    ],
                }
                for t in request.body.topics
            ],
        }

    async def list_partition_reassignments(self, ctx: Context, request: Request) -> dict[str, Any]:
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "topics": []}


def _create(ctx: Context, t: Any, validate_only: bool) -> dict[str, Any]:
    name = str(t.name)
    partitions = int(t.num_partitions)
    answer: dict[str, Any] = {
        "name": name,
        "error_code": ErrorCode.none,
        "error_message": None,
        "topic_config_error_code": 0,
        "num_partitions": -1,
        "replication_factor": -1,
        "configs": [],
    }
    if partitions == -1:
        partitions = ctx.options.num_partitions
    if int(t.replication_factor) not in (-1, 1):
        return answer | {"error_code": ErrorCode.invalid_replication_factor, "error_message": "one node: 1"}
    if t.assignments:
        return answer | {
            "error_code": ErrorCode.invalid_request,
            "error_message": "replica assignments: one node",
        }
    try:
        config = topic_config([(str(c.name), c.value) for c in t.configs])
        if validate_only:
            ctx.log.defaults.replace(**config)
            if ctx.log.has_topic(name):
                raise TopicExistsError(f"topic {name!r} exists")
            topic_cfg = ctx.log.defaults.replace(**config)
        else:
            topic_cfg = ctx.log.create_topic(name, partitions=partitions, **config).config
    except TopicExistsError as exc:
        return answer | {"error_code": ErrorCode.topic_already_exists, "error_message": str(exc)}
    except InvalidTopicError as exc:
        return answer | {"error_code": ErrorCode.invalid_topic_exception, "error_message": str(exc)}
    except ConfigError as exc:
        code = ErrorCode.invalid_partitions if "partitions" in str(exc) else ErrorCode.invalid_config
        return answer | {"error_code": code, "error_message": str(exc)}
    configs = [
        {
            "name": n,
            "value": v,
            "read_only": False,
            "config_source": 5 if default else 1,
            "is_sensitive": False,
        }
        for n, v, default in kafka_configs(topic_cfg)
    ]
    return answer | {"num_partitions": partitions, "replication_factor": 1, "configs": configs}


def _delete(ctx: Context, name: str) -> dict[str, Any]:
    answer: dict[str, Any] = {"name": name, "error_code": ErrorCode.none, "error_message": None}
    try:
        ctx.log.delete_topic(name)
    except (UnknownTopicError, InvalidTopicError):
        answer["error_code"] = ErrorCode.unknown_topic_or_partition
    except PylogError as exc:
        answer.update(error_code=ErrorCode.unknown_server_error, error_message=str(exc))
    return answer


def _grow(ctx: Context, name: str, count: int, validate_only: bool) -> dict[str, Any]:
    answer: dict[str, Any] = {"name": name, "error_code": ErrorCode.none, "error_message": None}
    try:
        current = ctx.log.topic(name).num_partitions
        if count <= current:
            return answer | {
                "error_code": ErrorCode.invalid_partitions,
                "error_message": f"topic {name!r} has {current} partitions; it can only grow",
            }
        if not validate_only:
            ctx.log.create_partitions(name, count)
    except (UnknownTopicError, InvalidTopicError):
        answer["error_code"] = ErrorCode.unknown_topic_or_partition
    except ConfigError as exc:
        answer.update(error_code=ErrorCode.invalid_partitions, error_message=str(exc))
    return answer


def _describe(ctx: Context, resource: Any) -> dict[str, Any]:
    kind, name = int(resource.resource_type), str(resource.resource_name)
    answer: dict[str, Any] = {
        "error_code": ErrorCode.none,
        "error_message": None,
        "resource_type": kind,
        "resource_name": name,
        "configs": [],
    }
    if kind == _BROKER:
        return answer
    if kind != _TOPIC:
        return answer | {"error_code": ErrorCode.invalid_request, "error_message": f"resource type {kind}"}
    try:
        config = ctx.log.topic(name).config
    except (UnknownTopicError, InvalidTopicError):
        return answer | {"error_code": ErrorCode.unknown_topic_or_partition}
    keys = None if resource.configuration_keys is None else set(resource.configuration_keys)
    answer["configs"] = [
        {
            "name": n,
            "value": v,
            "read_only": False,
            "is_default": default,
            "config_source": 5 if default else 1,
            "is_sensitive": False,
            "synonyms": [],
            "config_type": 0,
            "documentation": None,
        }
        for n, v, default in kafka_configs(config)
        if keys is None or n in keys
    ]
    return answer


def _embedded_group(ctx: Context, group_id: str) -> dict[str, Any]:
    try:
        d = ctx.log.describe_group(group_id)
    except (UnknownGroupError, ConfigError):
        return _group(group_id, "Dead", "", [])
    members = [
        {
            "member_id": m.member_id,
            "group_instance_id": m.group_instance_id,
            "client_id": m.client_id,
            "client_host": m.host,
            "member_metadata": b"",
            "member_assignment": b"",
        }
        for m in d.members
    ]
    return _group(group_id, d.state, d.assignor or "", members)


def _group(group_id: str, state: str, protocol: str, members: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.none,
        "group_id": group_id,
        "group_state": state,
        "protocol_type": "consumer" if members or state != "Dead" else "",
        "protocol_data": protocol,
        "members": members,
        "authorized_operations": -2147483648,
    }
