"""ApiVersions and Metadata: what a Kafka client asks first.

Metadata describes one node (id 0, the advertised host and port) leading every partition; a topic a client
asks for that does not exist is created with ``num_partitions`` partitions when auto-creation is on (Kafka's
``auto.create.topics.enable``, on by default, and the request's ``allow_auto_topic_creation``), else answered
with UNKNOWN_TOPIC_OR_PARTITION.

Thread-safety: handlers run in the event loop and hand blocking work to the context's thread pool.
"""

from __future__ import annotations

import uuid
from typing import Any

from pylog.broker.context import NODE_ID, Context
from pylog.broker.protocol import ErrorCode, Request, api_keys
from pylog.errors import InvalidTopicError, TopicExistsError, UnknownTopicError

__all__ = ["api_versions", "metadata"]


async def api_versions(ctx: Context, request: Request) -> dict[str, Any]:
    return {"error_code": ErrorCode.none, "api_keys": api_keys(), "throttle_time": 0}


async def metadata(ctx: Context, request: Request) -> dict[str, Any]:
    body = request.body
    names = None if body.topics is None else [t.name for t in body.topics]
    if request.version == 0 and not names:
        names = None  # v0: an empty list means every topic
    allow = ctx.options.auto_create_topics and getattr(body, "allow_auto_topic_creation", True)
    topics = await ctx.run(_describe_topics, ctx, names, allow)
    return {
        "throttle_time": 0,
        "brokers": [{"node_id": NODE_ID, "host": ctx.options.host, "port": ctx.options.port, "rack": None}],
        "cluster_id": ctx.options.cluster_id,
        "controller_id": NODE_ID,
        "topics": topics,
        "cluster_authorized_operations": -2147483648,
    }


def _describe_topics(ctx: Context, names: list[str] | None, create: bool) -> list[dict[str, Any]]:
    log = ctx.log
    if names is None:
        names = [n for n in log.topics() if not n.startswith("__")]
    return [_describe_topic(ctx, name, create) for name in names]


def _describe_topic(ctx: Context, name: str, create: bool) -> dict[str, Any]:
    log = ctx.log
    error = ErrorCode.none
    partitions = 0
    topic_id = None
    try:
        topic = log.topic(name)
    except UnknownTopicError:
        topic = None
    except InvalidTopicError:
        return _topic_error(name, ErrorCode.invalid_topic_exception)
    if topic is None and create:
        try:
            topic = log.create_topic(name, partitions=ctx.options.num_partitions)
        except TopicExistsError:
            topic = log.topic(name)
        except InvalidTopicError:
            return _topic_error(name, ErrorCode.invalid_topic_exception)
    if topic is None:
        return _topic_error(name, ErrorCode.unknown_topic_or_partition)
    partitions = topic.num_partitions
    topic_id = _uuid(topic.topic_id)
    return {
        "error_code": error,
        "name": name,
        "topic_id": topic_id,
        "is_internal": False,
        "partitions": [
            {
                "error_code": ErrorCode.none,
                "partition_index": p,
                "leader_id": NODE_ID,
                "leader_epoch": 0,
                "replica_nodes": [NODE_ID],
                "isr_nodes": [NODE_ID],
                "offline_replicas": [],
            }
            for p in range(partitions)
        ],
        "topic_authorized_operations": -2147483648,
    }


def _topic_error(name: str, code: ErrorCode) -> dict[str, Any]:
    return {
        "error_code": code,
        "name": name,
        "topic_id": uuid.UUID(int=0),
        "is_internal": False,
        "partitions": [],
        "topic_authorized_operations": -2147483648,
    }


def _uuid(topic_id: str | None) -> uuid.UUID:
    if topic_id:
        try:
            return uuid.UUID(hex=topic_id[:32].ljust(32, "0"))
        except ValueError:
            pass
    return uuid.UUID(int=0)
