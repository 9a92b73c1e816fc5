"""Kafka's authorization of each request (``KafkaApis``' checks), in front of the handlers.

When clients authenticate (``--sasl`` or a client CA) :class:`~pylog.broker.security.Session` passes every
request but ApiVersions and SASL through :func:`guard`, which asks the :class:`~pylog.broker.acls.Authorizer`
what Kafka's broker asks, and answers what Kafka answers:

| API | needs | refused with |
|---|---|---|
| Produce | WRITE on each topic; WRITE on the transactional id if any | TOPIC_AUTHORIZATION_FAILED (29) per topic; TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53) |
| Fetch (consumer) | READ on each topic | 29 per topic |
| ListOffsets | DESCRIBE on each topic | 29 per topic |
| Metadata | DESCRIBE on each topic (all topics: those allowed only); auto-creation CREATE on the cluster or topic | 29 per topic; a topic that may be described but not created: UNKNOWN_TOPIC_OR_PARTITION |
| OffsetCommit, TxnOffsetCommit | READ on the group, READ on each topic (TxnOffsetCommit: WRITE on the transactional id) | GROUP_AUTHORIZATION_FAILED (30); 29 per topic; 53 |
| OffsetFetch | DESCRIBE on the group, DESCRIBE on each topic (all topics: those allowed only) | 30; 29 per topic |
| FindCoordinator | DESCRIBE on the group or transactional id | 30 or 53 |
| JoinGroup, SyncGroup, Heartbeat, LeaveGroup | READ on the group | 30 |
| DescribeGroups | DESCRIBE on each group | 30 per group |
| ListGroups | DESCRIBE on the cluster, else the groups with DESCRIBE | - |
| CreateTopics | CREATE on the cluster or on each topic | 29 per topic |
| DeleteTopics | DELETE on each topic | 29 per topic |
| DeleteRecords | DELETE on each topic | 29 per partition |
| DeleteGroups | DELETE on each group | 30 per group |
| OffsetDelete | DELETE on the group, READ on each topic | 30; 29 per partition |
| CreatePartitions | ALTER on each topic | 29 per topic |
| DescribeConfigs | DESCRIBE_CONFIGS on each topic, or on the cluster for a broker | 29 / CLUSTER_AUTHORIZATION_FAILED (31) per resource |
| AlterConfigs, IncrementalAlterConfigs | ALTER_CONFIGS on each topic, or on the cluster for a broker | 29 / 31 per resource |
| InitProducerId | WRITE on the transactional id; without one IDEMPOTENT_WRITE on the cluster or WRITE on some topic | 53; 31 |
| AddPartitionsToTxn | WRITE on the transactional id and on each topic | 53; 29 per topic, the others OPERATION_NOT_ATTEMPTED (55) |
| AddOffsetsToTxn | WRITE on the transactional id, READ on the group | 53; 30 |
| EndTxn | WRITE on the transactional id | 53 |
| DescribeCluster, ListPartitionReassignments, DescribeLogDirs | DESCRIBE on the cluster | 31 |
| AlterReplicaLogDirs | ALTER on the cluster | 31 per partition |
| ElectLeaders, AlterPartitionReassignments, CreateAcls, DeleteAcls | ALTER on the cluster | 31 |
| DescribeAcls, DescribeUserScramCredentials | DESCRIBE on the cluster | 31 |
| AlterUserScramCredentials | ALTER on the cluster | 31 |
| DescribeClientQuotas | DESCRIBE_CONFIGS on the cluster | 31 |
| AlterClientQuotas | ALTER_CONFIGS on the cluster | 31 per entry |
| any other API | ALTER on the cluster | 31 |

Every refusal is logged (principal, client address, API, resource), never a record's content; the same
refusal repeated (a client retrying in a loop) is logged once a minute with the count of those not logged.

Thread-safety: runs in the event loop; the authorizer is thread-safe.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import logging
import types
import typing
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from kio.index import load_response_schema

from pylog.broker.acls import CLUSTER_NAME, Authorizer
from pylog.broker.metrics import API_NAMES
from pylog.broker.protocol import ErrorCode, Request

if TYPE_CHECKING:
    from pylog.broker.context import Context
    from pylog.broker.security import Handler, Session

__all__ = ["make_guard"]

_log = logging.getLogger("pylog.broker")
_TOPIC_DENIED: Final = ErrorCode.topic_authorization_failed
_GROUP_DENIED: Final = ErrorCode.group_authorization_failed
_CLUSTER_DENIED: Final = ErrorCode.cluster_authorization_failed
_TXN_DENIED: Final = ErrorCode.transactional_id_authorization_failed
LOG_EVERY_MS: Final = 60_000  # the same refusal is logged at most once a minute
Result = dict[str, Any] | None


class _Refusals:
    """Which refusals were logged when: a client retrying a refused request in a loop (librdkafka does, a
    few times a second) gets one line per :data:`LOG_EVERY_MS` for the same refusal, with the number of
    refusals not logged since, instead of flooding the log."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, ...], tuple[int, int]] = {}  # refusal -> (logged at, refused since)

    def log(self, now_ms: int, what: tuple[str, ...], api: str) -> None:
        entry = self._last.get(what)
        if entry is not None and now_ms - entry[0] < LOG_EVERY_MS:
            self._last[what] = (entry[0], entry[1] + 1)
            return
        since = entry[1] if entry is not None else 0
        if len(self._last) > 10_000:  # bounded: forget the oldest half
            for key in list(self._last)[:5_000]:
                del self._last[key]
        self._last[what] = (now_ms, 0)
        again = f"; refused {since} more times since the last line" if since else ""
        principal, host, operation, resource_type, name = what
        _log.warning(
            "%s from %s denied %s on %s %r (%s)%s",
            principal,
            host,
            operation,
            resource_type,
            name,
            api,
            again,
        )


class _Check:
    """One request's questions to the authorizer; refusals logged through :class:`_Refusals`."""

    def __init__(
        self, authorizer: Authorizer, session: Session, request: Request, refusals: _Refusals, now_ms: int
    ) -> None:
        self._authorizer = authorizer
        self._session = session
        self._request = request
        self._refusals = refusals
        self._now_ms = now_ms

    def __call__(self, operation: str, resource_type: str, name: str) -> bool:
        s = self._session
        if self._authorizer.allowed(s.principal, s.host, operation, resource_type, name):
            return True
        key = self._request.api_key
        what = (s.principal, s.host, operation, resource_type, name)
        self._refusals.log(self._now_ms, what, API_NAMES.get(key, f"api key {key}"))
        return False

    def quiet(self, operation: str, resource_type: str, name: str) -> bool:
        s = self._session
        return self._authorizer.allowed(s.principal, s.host, operation, resource_type, name)

    def any(self, operation: str, resource_type: str) -> bool:
        s = self._session
        return self._authorizer.allowed_any(s.principal, s.host, operation, resource_type)

    def cluster(self, operation: str) -> bool:
        return self(operation, "CLUSTER", CLUSTER_NAME)


Rule = Callable[[_Check, "Context", Request, "Handler"], Awaitable[Result]]


def make_guard(
    authorizer: Authorizer,
) -> Callable[[Session, Context, Request, Handler], Awaitable[Result]]:
    """The :attr:`~pylog.broker.security.Security.guard` deciding with ``authorizer``."""

    refusals = _Refusals()

    async def guard(session: Session, ctx: Context, request: Request, handler: Handler) -> Result:
        check = _Check(authorizer, session, request, refusals, int(ctx.log.clock.monotonic_ms()))
        rule = _RULES.get(request.api_key, _cluster_rule("ALTER"))
        return await rule(check, ctx, request, handler)

    return guard


# -- the rules -------------------------------------------------------------------------------------------


def _replace(request: Request, **fields: Any) -> Request:
    return dataclasses.replace(request, body=dataclasses.replace(request.body, **fields))


async def _produce(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    body = request.body
    txn = getattr(body, "transactional_id", None)
    if txn is not None and not check("WRITE", "TRANSACTIONAL_ID", txn):
        denied = {t.name: _TXN_DENIED for t in body.topic_data}
    else:
        denied = {t.name: _TOPIC_DENIED for t in body.topic_data if not check("WRITE", "TOPIC", t.name)}
    allowed = tuple(t for t in body.topic_data if t.name not in denied)
    answer: Result = {"responses": [], "throttle_time": 0}
    if allowed:
        answer = await handler(ctx, _replace(request, topic_data=allowed))
        if answer is None:  # acks=0
            return None
    elif int(body.acks) == 0:
        return None
    assert answer is not None
    for t in body.topic_data:
        if t.name in denied:
            answer["responses"].append(
                {
                    "name": t.name,
                    "partition_responses": [
                        {
                            "index": p.index,
                            "error_code": denied[t.name],
                            "base_offset": -1,
                            "log_append_time": -1,
                            "log_start_offset": -1,
                            "record_errors": [],
                            "error_message": None,
                        }
                        for p in t.partition_data
                    ],
                }
            )
    return answer


async def _fetch(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    body = request.body
    denied = {t.topic for t in body.topics if not check("READ", "TOPIC", t.topic)}
    allowed = tuple(t for t in body.topics if t.topic not in denied)
    answer: Result = {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0, "responses": []}
    if allowed or not denied:
        answer = await handler(ctx, _replace(request, topics=allowed))
    assert answer is not None
    for t in body.topics:
        if t.topic in denied:
            answer["responses"].append(
                {
                    "topic": t.topic,
                    "partitions": [
                        {
                            "partition_index": p.partition,
                            "error_code": _TOPIC_DENIED,
                            "high_watermark": -1,
                            "last_stable_offset": -1,
                            "log_start_offset": -1,
                            "aborted_transactions": None,
                            "preferred_read_replica": -1,
                            "records": b"",
                        }
                        for p in t.partitions
                    ],
                }
            )
    return answer


async def _list_offsets(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    body = request.body
    denied = {t.name for t in body.topics if not check("DESCRIBE", "TOPIC", t.name)}
    allowed = tuple(t for t in body.topics if t.name not in denied)
    answer: Result = {"throttle_time": 0, "topics": []}
    if allowed:
        answer = await handler(ctx, _replace(request, topics=allowed))
    assert answer is not None
    for t in body.topics:
        if t.name in denied:
            parts = [
                {
                    "partition_index": p.partition_index,
                    "error_code": _TOPIC_DENIED,
                    "timestamp": -1,
                    "offset": -1,
                }
                for p in t.partitions
            ]
            answer["topics"].append({"name": t.name, "partitions": parts})
    return answer


async def _metadata(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    body = request.body
    if body.topics is None or (request.version == 0 and not body.topics):  # every topic: those allowed
        answer = await handler(ctx, request)
        assert answer is not None
        answer["topics"] = [t for t in answer["topics"] if check.quiet("DESCRIBE", "TOPIC", t["name"])]
        return answer
    names = [str(t.name) for t in body.topics]
    denied = {n for n in names if not check("DESCRIBE", "TOPIC", n)}
    existing = set(await ctx.run(ctx.log.topics))
    may_create = check.quiet("CREATE", "CLUSTER", CLUSTER_NAME)
    unknown = {
        n
        for n in names
        if n not in denied and n not in existing and not (may_create or check("CREATE", "TOPIC", n))
    }
    allowed = tuple(t for t in body.topics if t.name not in denied and t.name not in unknown)
    answer = await handler(ctx, _replace(request, topics=allowed))
    assert answer is not None
    if not allowed:  # Metadata v0 reads an empty list as "every topic"
        answer["topics"] = []
    for name in names:
        if name in denied or name in unknown:
            code = _TOPIC_DENIED if name in denied else ErrorCode.unknown_topic_or_partition
            answer["topics"].append(
                {
                    "error_code": code,
                    "name": name,
                    "topic_id": None,
                    "is_internal": False,
                    "partitions": [],
                    "topic_authorized_operations": -2147483648,
                }
            )
    return answer


async def _offset_commit(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    body = request.body
    if request.api_key == 28 and not check("WRITE", "TRANSACTIONAL_ID", body.transactional_id):
        return _partition_errors(body.topics, _TXN_DENIED)
    if not check("READ", "GROUP", body.group_id):
        return _partition_errors(body.topics, _GROUP_DENIED)
    denied = {t.name for t in body.topics if not check("READ", "TOPIC", t.name)}
    allowed = tuple(t for t in body.topics if t.name not in denied)
    answer: Result = {"throttle_time": 0, "topics": []}
    if allowed:
        answer = await handler(ctx, _replace(request, topics=allowed))
    assert answer is not None
    answer["topics"] += _partition_errors([t for t in body.topics if t.name in denied], _TOPIC_DENIED)[
        "topics"
    ]
    return answer


def _partition_errors(topics: Any, code: ErrorCode) -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "topics": [
            {
                "name": t.name,
                "partitions": [
                    {"partition_index": p.partition_index, "error_code": code} for p in t.partitions
                ],
            }
            for t in topics
        ],
    }


async def _offset_fetch(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    body = request.body
    if not check("DESCRIBE", "GROUP", body.group_id):
        topics = [
            {"name": t.name, "partitions": [_no_offset(i, _GROUP_DENIED) for i in t.partition_indexes]}
            for t in body.topics or ()
        ]
        return {"throttle_time": 0, "topics": topics, "error_code": _GROUP_DENIED}
    if body.topics is None:  # every topic with a committed offset: those allowed
        answer = await handler(ctx, request)
        assert answer is not None
        answer["topics"] = [t for t in answer["topics"] if check.quiet("DESCRIBE", "TOPIC", t["name"])]
        return answer
    denied = {t.name for t in body.topics if not check("DESCRIBE", "TOPIC", t.name)}
    answer = await handler(
        ctx, _replace(request, topics=tuple(t for t in body.topics if t.name not in denied))
    )
    assert answer is not None
    for t in body.topics:
        if t.name in denied:
            answer["topics"].append(
                {"name": t.name, "partitions": [_no_offset(i, _TOPIC_DENIED) for i in t.partition_indexes]}
            )
    return answer


def _no_offset(partition: int, code: ErrorCode) -> dict[str, Any]:
    return {
        "partition_index": partition,
        "committed_offset": -1,
        "committed_leader_epoch": -1,
        "metadata": "",
        "error_code": code,
    }


async def _find_coordinator(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    body = request.body
    if int(getattr(body, "key_type", 0)) == 1:
        if not check("DESCRIBE", "TRANSACTIONAL_ID", body.key):
            return _error_response(request, _TXN_DENIED)
    elif not check("DESCRIBE", "GROUP", body.key):
        return _error_response(request, _GROUP_DENIED)
    return await handler(ctx, request)


async def _group_member(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    if not check("READ", "GROUP", request.body.group_id):
        return _error_response(request, _GROUP_DENIED)
    return await handler(ctx, request)


async def _describe_groups(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    groups = [str(g) for g in request.body.groups]
    denied = {g for g in groups if not check("DESCRIBE", "GROUP", g)}
    answer: Result = {"throttle_time": 0, "groups": []}
    allowed = tuple(g for g in groups if g not in denied)
    if allowed:
        answer = await handler(ctx, _replace(request, groups=allowed))
    assert answer is not None
    for g in groups:
        if g in denied:
            answer["groups"].append(
                {
                    "error_code": _GROUP_DENIED,
                    "group_id": g,
                    "group_state": "",
                    "protocol_type": "",
                    "protocol_data": "",
                    "members": [],
                    "authorized_operations": -2147483648,
                }
            )
    return answer


async def _list_groups(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    answer = await handler(ctx, request)
    assert answer is not None
    if not check.quiet("DESCRIBE", "CLUSTER", CLUSTER_NAME):
        answer["groups"] = [g for g in answer["groups"] if check.quiet("DESCRIBE", "GROUP", g["group_id"])]
    return answer


def _per_name(operation: str, names: Callable[[Any], list[str]], field: str, out: str) -> Rule:
    """A rule for the admin APIs that name topics in the request's ``field``: the denied ones are answered
    TOPIC_AUTHORIZATION_FAILED in the response's ``out``."""

    async def rule(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
        if operation == "CREATE" and check.quiet("CREATE", "CLUSTER", CLUSTER_NAME):
            return await handler(ctx, request)
        items = list(getattr(request.body, field))
        all_names = names(request.body)
        denied = {n for n in all_names if not check(operation, "TOPIC", n)}
        answer: Result = {"throttle_time": 0, out: []}
        allowed = tuple(item for item, n in zip(items, all_names, strict=True) if n not in denied)
        if allowed:
            answer = await handler(ctx, _replace(request, **{field: allowed}))
        assert answer is not None
        answer[out] += [
            _entry(
                request, out, name=n, error_code=_TOPIC_DENIED, error_message="Topic authorization failed."
            )
            for n in all_names
            if n in denied
        ]
        return answer

    return rule


def _configs_rule(operation: str, out: str) -> Rule:
    """DescribeConfigs (``DESCRIBE_CONFIGS``), AlterConfigs and IncrementalAlterConfigs (``ALTER_CONFIGS``):
    the operation on each topic, or on the cluster for a broker; denied resources answered in ``out``."""

    async def rule(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
        def ok(r: Any) -> bool:
            if int(r.resource_type) == 2:
                return check(operation, "TOPIC", r.resource_name)
            return check.cluster(operation)

        resources = list(request.body.resources)
        denied = [r for r in resources if not ok(r)]
        answer: Result = {"throttle_time": 0, out: []}
        if len(denied) < len(resources):
            answer = await handler(
                ctx, _replace(request, resources=tuple(r for r in resources if r not in denied))
            )
        assert answer is not None
        for r in denied:
            code = _TOPIC_DENIED if int(r.resource_type) == 2 else _CLUSTER_DENIED
            answer[out].append(
                {
                    "error_code": code,
                    "error_message": code.name,
                    "resource_type": r.resource_type,
                    "resource_name": r.resource_name,
                    "configs": [],
                }
            )
        return answer

    return rule


async def _delete_records(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    topics = request.body.topics
    denied = {t.name for t in topics if not check("DELETE", "TOPIC", t.name)}
    answer: Result = {"throttle_time": 0, "topics": []}
    allowed = tuple(t for t in topics if t.name not in denied)
    if allowed:
        answer = await handler(ctx, _replace(request, topics=allowed))
    assert answer is not None
    for t in topics:
        if t.name in denied:
            partitions = [
                {"partition_index": p.partition_index, "low_watermark": -1, "error_code": _TOPIC_DENIED}
                for p in t.partitions
            ]
            answer["topics"].append({"name": t.name, "partitions": partitions})
    return answer


async def _delete_groups(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    groups = [str(g) for g in request.body.groups_names]
    denied = {g for g in groups if not check("DELETE", "GROUP", g)}
    answer: Result = {"throttle_time": 0, "results": []}
    allowed = tuple(g for g in groups if g not in denied)
    if allowed:
        answer = await handler(ctx, _replace(request, groups_names=allowed))
    assert answer is not None
    answer["results"] += [{"group_id": g, "error_code": _GROUP_DENIED} for g in groups if g in denied]
    return answer


async def _offset_delete(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    body = request.body
    if not check("DELETE", "GROUP", body.group_id):
        return {"error_code": _GROUP_DENIED, "throttle_time": 0, "topics": []}
    denied = {t.name for t in body.topics if not check("READ", "TOPIC", t.name)}
    answer = await handler(
        ctx, _replace(request, topics=tuple(t for t in body.topics if t.name not in denied))
    )
    assert answer is not None
    if answer["error_code"] == ErrorCode.none:
        answer["topics"] += _partition_errors([t for t in body.topics if t.name in denied], _TOPIC_DENIED)[
            "topics"
        ]
    return answer


async def _alter_log_dirs(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    if check.cluster("ALTER"):
        return await handler(ctx, request)
    results = [
        {
            "topic_name": t.name,
            "partitions": [{"partition_index": p, "error_code": _CLUSTER_DENIED} for p in t.partitions],
        }
        for d in request.body.dirs
        for t in d.topics
    ]
    return {"throttle_time": 0, "results": results}


async def _init_producer_id(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    txn = request.body.transactional_id
    if txn is not None:
        if not check("WRITE", "TRANSACTIONAL_ID", txn):
            return _error_response(request, _TXN_DENIED, producer_id=-1, producer_epoch=-1)
    elif not (check.quiet("IDEMPOTENT_WRITE", "CLUSTER", CLUSTER_NAME) or check.any("WRITE", "TOPIC")):
        check.cluster("IDEMPOTENT_WRITE")  # logged
        return _error_response(request, _CLUSTER_DENIED, producer_id=-1, producer_epoch=-1)
    return await handler(ctx, request)


async def _add_partitions(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    body = request.body
    topics = body.v3_and_below_topics
    if not check("WRITE", "TRANSACTIONAL_ID", body.v3_and_below_transactional_id):
        denied = {t.name: _TXN_DENIED for t in topics}
    else:
        denied = {t.name: _TOPIC_DENIED for t in topics if not check("WRITE", "TOPIC", t.name)}
    if not denied:
        return await handler(ctx, request)
    results = [
        {
            "name": t.name,
            "results_by_partition": [
                {
                    "partition_index": p,
                    "partition_error_code": denied.get(t.name, ErrorCode.operation_not_attempted),
                }
                for p in t.partitions
            ],
        }
        for t in topics
    ]
    return {"throttle_time": 0, "results_by_topic_v3_and_below": results}


async def _add_offsets(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    body = request.body
    if not check("WRITE", "TRANSACTIONAL_ID", body.transactional_id):
        return {"throttle_time": 0, "error_code": _TXN_DENIED}
    if not check("READ", "GROUP", body.group_id):
        return {"throttle_time": 0, "error_code": _GROUP_DENIED}
    return await handler(ctx, request)


async def _end_txn(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    if not check("WRITE", "TRANSACTIONAL_ID", request.body.transactional_id):
        return {"throttle_time": 0, "error_code": _TXN_DENIED}
    return await handler(ctx, request)


def _cluster_rule(operation: str) -> Rule:
    async def rule(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
        if not check.cluster(operation):
            return _error_response(request, _CLUSTER_DENIED)
        return await handler(ctx, request)

    return rule


async def _describe_scram(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    if check.cluster("DESCRIBE"):
        return await handler(ctx, request)
    users = [str(u.name) for u in request.body.users or ()]
    results = [_entry(request, "results", user=u, error_code=_CLUSTER_DENIED) for u in users]
    return {"throttle_time": 0, "error_code": _CLUSTER_DENIED, "error_message": None, "results": results}


async def _alter_scram(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    if check.cluster("ALTER"):
        return await handler(ctx, request)
    body = request.body
    users = dict.fromkeys(str(item.name) for item in (*body.deletions, *body.upsertions))
    results = [{"user": u, "error_code": _CLUSTER_DENIED, "error_message": None} for u in users]
    return {"throttle_time": 0, "results": results}


async def _alter_quotas(check: _Check, ctx: Context, request: Request, handler: Handler) -> Result:
    if check.cluster("ALTER_CONFIGS"):
        return await handler(ctx, request)
    entries = [
        {
            "error_code": _CLUSTER_DENIED,
            "error_message": None,
            "entity": [{"entity_type": e.entity_type, "entity_name": e.entity_name} for e in entry.entity],
        }
        for entry in request.body.entries
    ]
    return {"throttle_time": 0, "entries": entries}


_RULES: Final[dict[int, Rule]] = {
    0: _produce,
    1: _fetch,
    2: _list_offsets,
    3: _metadata,
    8: _offset_commit,
    9: _offset_fetch,
    10: _find_coordinator,
    11: _group_member,
    12: _group_member,
    13: _group_member,
    14: _group_member,
    15: _describe_groups,
    16: _list_groups,
    19: _per_name("CREATE", lambda b: [t.name for t in b.topics], "topics", "topics"),
    20: _per_name("DELETE", lambda b: [str(n) for n in b.topic_names], "topic_names", "responses"),
    21: _delete_records,
    22: _init_producer_id,
    24: _add_partitions,
    25: _add_offsets,
    26: _end_txn,
    28: _offset_commit,
    32: _configs_rule("DESCRIBE_CONFIGS", "results"),
    33: _configs_rule("ALTER_CONFIGS", "responses"),
    44: _configs_rule("ALTER_CONFIGS", "responses"),
    37: _per_name("ALTER", lambda b: [t.name for t in b.topics], "topics", "results"),
    42: _delete_groups,
    47: _offset_delete,
    43: _cluster_rule("ALTER"),
    45: _cluster_rule("ALTER"),
    46: _cluster_rule("DESCRIBE"),
    34: _alter_log_dirs,  # AlterReplicaLogDirs
    35: _cluster_rule("DESCRIBE"),  # DescribeLogDirs
    60: _cluster_rule("DESCRIBE"),
    29: _cluster_rule("DESCRIBE"),  # DescribeAcls
    30: _cluster_rule("ALTER"),  # CreateAcls
    31: _cluster_rule("ALTER"),  # DeleteAcls
    50: _describe_scram,
    51: _alter_scram,
    48: _cluster_rule("DESCRIBE_CONFIGS"),  # DescribeClientQuotas
    49: _alter_quotas,  # AlterClientQuotas
}


# -- a whole-request error answer, for any API ------------------------------------------------------------


def _error_response(request: Request, code: ErrorCode, **values: Any) -> dict[str, Any]:
    """An answer of ``request``'s API and version with ``code`` in its top-level ``error_code`` and every
    other required field empty or zero (``values`` override)."""
    schema = load_response_schema(request.api_key, request.version)
    out = _empty(schema)
    if "error_code" in out:
        out["error_code"] = code
    out.update({k: v for k, v in values.items() if k in out})
    return out


def _entry(request: Request, field: str, **values: Any) -> dict[str, Any]:
    """An element of the response's list ``field``, empty but for ``values``."""
    schema = load_response_schema(request.api_key, request.version)
    out = _empty(typing.get_args(_hints(schema)[field])[0])
    out.update(values)
    return out


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _empty(cls: Any) -> dict[str, Any]:
    hints = _hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        out[f.name] = _zero(hints[f.name])
    return out


def _zero(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        return None
    if origin is tuple:
        return []
    if isinstance(tp, type):
        if issubclass(tp, ErrorCode):
            return ErrorCode.none
        if issubclass(tp, bool):
            return False
        if issubclass(tp, int):
            return 0
        if issubclass(tp, str):
            return ""
        if issubclass(tp, bytes):
            return b""
        if issubclass(tp, datetime.timedelta):
            return 0
        if dataclasses.is_dataclass(tp):
            return _empty(tp)
    return None
