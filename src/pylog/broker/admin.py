"""Admin APIs: CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs, IncrementalAlterConfigs,
AlterConfigs, DeleteRecords, DescribeLogDirs, ListGroups, DescribeGroups, DescribeCluster (and the routing of
DeleteGroups and OffsetDelete to :mod:`pylog.broker.groups`), and the APIs that mean nothing on one node,
answered with Kafka's error codes.

Topic configs use Kafka's names (``retention.ms``, ``cleanup.policy``, ...): each maps to the
:class:`~pylog.config.TopicConfig` field of the same name with dots as underscores (:func:`config_key`,
:func:`config_value`); a name pylog does not have is refused with INVALID_CONFIG (nothing is created or
changed), as Kafka refuses an unknown config. The replication factor must be 1 (or -1, the default): there is
one node (INVALID_REPLICATION_FACTOR).

IncrementalAlterConfigs SETs a topic config, DELETEs it (back to the log's default), APPENDs to or SUBTRACTs
from a list config (``cleanup.policy``); AlterConfigs replaces a topic's whole config (what it does not name
goes back to the default). The changes of one resource are checked together and written together, in the
log's manifest (they outlive the broker, and every process opening the topic sees them); they take effect
at once in the broker. INVALID_CONFIG: an unknown config, a value of the wrong type or out of range, APPEND
or SUBTRACT on a config that is not a list, ``remote.storage.enable`` (changed with ``pylog topics
alter``). A BROKER resource with configs is answered INVALID_REQUEST: the broker's settings are options of
``pylog serve``.

DeleteRecords moves a partition's log start offset to the offset given (-1: the high watermark), the low
watermark answered, and deletes the segments wholly below it
(:meth:`~pylog.partition.log.PartitionLog.delete_records`); nothing at or after the offset is deleted. An
offset past the high watermark is OFFSET_OUT_OF_RANGE; a topic whose cleanup policy does not delete, or a
tiered one, POLICY_VIOLATION (as Kafka refuses compacted topics).

One node never elects leaders, reassigns partitions or moves replicas between log directories:
ElectLeaders answers ELECTION_NOT_NEEDED, AlterPartitionReassignments INVALID_REPLICA_ASSIGNMENT (there is no
other broker to move to), ListPartitionReassignments an empty list (nothing is moving), AlterReplicaLogDirs
LOG_DIR_NOT_FOUND for a directory other than the log's (NONE for the log's own: the replica is there).
DescribeLogDirs describes the one log directory: its partitions' sizes on disk (offset lag 0: no replica
follows), and the file system's total and usable bytes.

Thread-safety: handlers run in the event loop; log changes run in the context's thread pool.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pylog.broker.context import NODE_ID, Context
from pylog.broker.protocol import ApiError, ErrorCode, Request
from pylog.config import TopicConfig
from pylog.errors import (
    ConfigError,
    InvalidTopicError,
    OffsetOutOfRangeError,
    PylogError,
    TopicExistsError,
    UnknownGroupError,
    UnknownTopicError,
)

if TYPE_CHECKING:
    from pylog.broker.groups import Coordinator
    from pylog.partition.log import PartitionLog

__all__ = ["Admin", "kafka_configs", "topic_config"]

_log = logging.getLogger("pylog.broker")
_TOPIC = 2  # DescribeConfigs resource types
_BROKER = 4
_DEFAULTS = TopicConfig()
_KNOWN = frozenset(f.name for f in dataclasses.fields(TopicConfig))
_LISTS = frozenset({"cleanup_policy"})  # Kafka's LIST-type topic configs pylog has (APPEND, SUBTRACT)
# changed only with `pylog topics alter`: turning tiered storage off lets local retention delete segments
# that were never uploaded (Kafka refuses it too), and on needs the log's object store
_READ_ONLY = frozenset({"remote_storage_enable"})
_SET, _DELETE, _APPEND, _SUBTRACT = 0, 1, 2, 3  # IncrementalAlterConfigs operations


def topic_config(configs: list[tuple[str, str | None]]) -> dict[str, Any]:
    """Kafka-named topic configs as :class:`~pylog.config.TopicConfig` keyword arguments. Raises
    :class:`~pylog.errors.ConfigError` for a name pylog does not have or a value of the wrong type."""
    out: dict[str, Any] = {}
    for name, value in configs:
        key = config_key(name)
        if value is not None:
            out[key] = config_value(name, value)
    return out


def config_key(name: str) -> str:
    """The :class:`~pylog.config.TopicConfig` field of the Kafka config ``name`` (``retention.ms`` ->
    ``retention_ms``). Raises :class:`~pylog.errors.ConfigError` for a name pylog does not have."""
    key = name.replace(".", "_")
    if key not in _KNOWN:
        raise ConfigError(f"unknown topic config {name!r}")
    return key


def config_value(name: str, value: str) -> Any:
    """The Kafka config ``name``'s ``value`` (a string, as Kafka sends it) in the type of its
    :class:`~pylog.config.TopicConfig` field; a list (``cleanup.policy``) in pylog's order ("delete,compact"
    is "compact,delete"). Raises :class:`~pylog.errors.ConfigError` for a value of the wrong type."""
    key = config_key(name)
    default = getattr(_DEFAULTS, key)
    try:
        if isinstance(default, bool):
            if value.lower() not in ("true", "false"):
                raise ValueError(value)
            return value.lower() == "true"
        if key in _LISTS:
            return ",".join(sorted({v.strip() for v in value.split(",") if v.strip()}))
        return type(default)(value)
    except ValueError as exc:
        raise ConfigError(f"topic config {name}={value!r} is not a {type(default).__name__}") from exc


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
            33: self.alter_configs,
            44: self.incremental_alter_configs,
            37: self.create_partitions,
            21: self.delete_records,
            15: self.describe_groups,
            16: self.list_groups,
            42: self.coordinator.delete_groups,
            47: self.coordinator.offset_delete,
            43: self.elect_leaders,
            45: self.alter_partition_reassignments,
            34: self.alter_replica_log_dirs,
            35: self.describe_log_dirs,
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

    async def delete_records(self, ctx: Context, request: Request) -> dict[str, Any]:
        topics = request.body.topics
        results = await ctx.run(
            lambda: [
                {
                    "name": t.name,
                    "partitions": [
                        _delete_records(ctx, str(t.name), int(p.partition_index), int(p.offset))
                        for p in t.partitions
                    ],
                }
                for t in topics
            ]
        )
        return {"throttle_time": 0, "topics": results}

    async def describe_configs(self, ctx: Context, request: Request) -> dict[str, Any]:
        body = request.body
        return {
            "throttle_time": 0,
            "results": await ctx.run(lambda: [_describe(ctx, r) for r in body.resources]),
        }

    async def incremental_alter_configs(self, ctx: Context, request: Request) -> dict[str, Any]:
        return await self._alter_configs(ctx, request, incremental=True)

    async def alter_configs(self, ctx: Context, request: Request) -> dict[str, Any]:
        return await self._alter_configs(ctx, request, incremental=False)

    async def _alter_configs(self, ctx: Context, request: Request, *, incremental: bool) -> dict[str, Any]:
        body = request.body
        validate_only = bool(body.validate_only)
        results = await ctx.run(lambda: [_alter(ctx, r, validate_only, incremental) for r in body.resources])
        return {"throttle_time": 0, "responses": results}

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

    async def describe_log_dirs(self, ctx: Context, request: Request) -> dict[str, Any]:
        wanted = request.body.topics
        wanted_map = None if wanted is None else {str(t.topic): list(t.partitions) for t in wanted}
        result = await ctx.run(_log_dir, ctx, wanted_map)
        return {"throttle_time": 0, "error_code": ErrorCode.none, "results": [result]}

    async def alter_replica_log_dirs(self, ctx: Context, request: Request) -> dict[str, Any]:
        results = await ctx.run(
            lambda: [
                {
                    "topic_name": t.name,
                    "partitions": [
                        {
                            "partition_index": p,
                            "error_code": _move_code(ctx, str(d.path), str(t.name), int(p)),
                        }
                        for p in t.partitions
                    ],
                }
                for d in request.body.dirs
                for t in d.topics
            ]
        )
        return {"throttle_time": 0, "results": results}

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


def _delete_records(ctx: Context, topic: str, partition: int, offset: int) -> dict[str, Any]:
    """DeleteRecords of one partition (see :meth:`~pylog.partition.log.PartitionLog.delete_records`): -1 is
    the high watermark (the log end offset); an offset below the log start changes nothing."""
    answer: dict[str, Any] = {"partition_index": partition, "low_watermark": -1, "error_code": ErrorCode.none}
    try:
        plog = _partition(ctx, topic, partition)
        if offset == -1:
            offset = plog.log_end_offset
        if offset < 0:
            raise OffsetOutOfRangeError(f"offset {offset}")
        answer["low_watermark"] = plog.delete_records(offset)
    except (UnknownTopicError, InvalidTopicError):
        answer["error_code"] = ErrorCode.unknown_topic_or_partition
    except OffsetOutOfRangeError:
        answer["error_code"] = ErrorCode.offset_out_of_range
    except ConfigError as exc:  # compact only, or tiered
        _log.warning("DeleteRecords on %s-%d refused: %s", topic, partition, exc)
        answer["error_code"] = ErrorCode.policy_violation
    except PylogError as exc:  # a failed fsync or write: nothing was deleted
        _log.warning("DeleteRecords on %s-%d failed: %s", topic, partition, exc)
        answer["error_code"] = ErrorCode.kafka_storage_error
    return answer


def _partition(ctx: Context, topic: str, partition: int) -> PartitionLog:
    t = ctx.log.topic(topic)
    if not 0 <= partition < t.num_partitions:
        raise UnknownTopicError(f"topic {topic!r} has no partition {partition}")
    return t.partition(partition)


def _log_dir(ctx: Context, wanted: dict[str, list[int]] | None) -> dict[str, Any]:
    """DescribeLogDirs' one log directory: the partitions asked for (all: None) that exist, with their sizes
    on disk, and the file system's total and usable bytes."""
    topics = []
    for name in sorted(ctx.log.topics()) if wanted is None else wanted:
        try:
            topic = ctx.log.topic(name)
        except (UnknownTopicError, InvalidTopicError):
            continue  # Kafka leaves out what it does not host
        numbers = range(topic.num_partitions) if wanted is None else wanted[name]
        partitions = [
            {
                "partition_index": p,
                "partition_size": topic.partition(p).size_bytes(),
                "offset_lag": 0,
                "is_future_key": False,
            }
            for p in numbers
            if 0 <= p < topic.num_partitions
        ]
        if partitions:
            topics.append({"name": name, "partitions": partitions})
    disk = os.statvfs(ctx.log.path)
    return {
        "error_code": ErrorCode.none,
        "log_dir": os.path.abspath(ctx.log.path),
        "topics": topics,
        "total_bytes": disk.f_blocks * disk.f_frsize,
        "usable_bytes": disk.f_bavail * disk.f_frsize,
    }


def _move_code(ctx: Context, path: str, topic: str, partition: int) -> ErrorCode:
    """AlterReplicaLogDirs of one partition: one node has one log directory, where the partition already is
    (NONE); any other directory is LOG_DIR_NOT_FOUND."""
    try:
        _partition(ctx, topic, partition)
    except (UnknownTopicError, InvalidTopicError):
        return ErrorCode.unknown_topic_or_partition
    if os.path.realpath(path) != os.path.realpath(ctx.log.path):
        return ErrorCode.log_dir_not_found
    return ErrorCode.none


def _resource_answer(resource: Any) -> tuple[int, str, dict[str, Any]]:
    """``(resource type, name, answer)``: the start of the answer about one resource of DescribeConfigs,
    AlterConfigs or IncrementalAlterConfigs (no error yet)."""
    kind, name = int(resource.resource_type), str(resource.resource_name)
    return (
        kind,
        name,
        {"error_code": ErrorCode.none, "error_message": None, "resource_type": kind, "resource_name": name},
    )


def _describe(ctx: Context, resource: Any) -> dict[str, Any]:
    kind, name, answer = _resource_answer(resource)
    answer["configs"] = []
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


def _alter(ctx: Context, resource: Any, validate_only: bool, incremental: bool) -> dict[str, Any]:
    """One resource of IncrementalAlterConfigs (``incremental``) or AlterConfigs: every change of the
    resource is checked before any is made, and all are written at once (the topic's config in the log's
    manifest, in effect at once in this process)."""
    kind, name, answer = _resource_answer(resource)
    names = [str(c.name) for c in resource.configs]
    try:
        if len(set(names)) != len(names):
            raise ApiError(ErrorCode.invalid_request, f"a config is named twice in {names}")
        if kind == _BROKER:
            if names:
                raise ApiError(
                    ErrorCode.invalid_request,
                    "pylog's broker configs cannot be changed while it runs (they are options of `pylog "
                    f"serve`): {', '.join(names)}",
                )
            return answer
        if kind != _TOPIC:
            raise ApiError(ErrorCode.invalid_request, f"resource type {kind} has no configs on this broker")
        current = ctx.log.topic(name).config
        changes = _changes(ctx.log.defaults, current, resource.configs, incremental)
        current.replace(**changes)  # checks the new config as a whole
        if changes and not validate_only:
            ctx.log.alter_topic(name, **changes)
    except (UnknownTopicError, InvalidTopicError) as exc:
        return answer | {"error_code": ErrorCode.unknown_topic_or_partition, "error_message": str(exc)}
    except ConfigError as exc:
        return answer | {"error_code": ErrorCode.invalid_config, "error_message": str(exc)}
    except ApiError as exc:
        return answer | {"error_code": exc.code, "error_message": str(exc)}
    except PylogError as exc:  # the manifest could not be written: nothing changed
        _log.warning("changing the configs of topic %r failed: %s", name, exc)
        return answer | {"error_code": ErrorCode.kafka_storage_error, "error_message": str(exc)}
    return answer


def _changes(defaults: TopicConfig, current: TopicConfig, configs: Any, incremental: bool) -> dict[str, Any]:
    """The :class:`~pylog.config.TopicConfig` fields the request changes, with their new values.

    IncrementalAlterConfigs: SET a value, DELETE (back to the log's default), APPEND to or SUBTRACT from a
    list config (``cleanup.policy``). AlterConfigs replaces the topic's whole config: a config the request
    does not name goes back to its default, as in Kafka."""
    out: dict[str, Any] = {}
    if not incremental:
        out = {k: getattr(defaults, k) for k in _KNOWN - _READ_ONLY}
    for c in configs:
        name = str(c.name)
        key = config_key(name)
        op = int(c.config_operation) if incremental else _SET
        if op == _SET:
            if c.value is None and incremental:
                raise ApiError(ErrorCode.invalid_request, f"SET of {name} without a value")
            out[key] = getattr(defaults, key) if c.value is None else config_value(name, c.value)
        elif op == _DELETE:
            out[key] = getattr(defaults, key)
        elif op in (_APPEND, _SUBTRACT):
            if key not in _LISTS:
                raise ConfigError(f"{name} is not a list config: APPEND and SUBTRACT apply to cleanup.policy")
            have = set(filter(None, str(out.get(key, getattr(current, key))).split(",")))
            given = set(filter(None, str(config_value(name, c.value or "")).split(",")))
            out[key] = ",".join(sorted(have | given if op == _APPEND else have - given))
        else:
            raise ApiError(ErrorCode.invalid_request, f"unknown config operation {op} for {name}")
    for key in _READ_ONLY & out.keys():
        if out[key] != getattr(current, key):
            raise ConfigError(
                f"{key.replace('_', '.')} cannot be changed through the Kafka API (use `pylog topics alter`)"
            )
    return {k: v for k, v in out.items() if v != getattr(current, k)}


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
