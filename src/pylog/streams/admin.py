"""Operations on a stream application from outside it: what ``pylog streams describe`` and ``pylog streams
reset`` run (Kafka's ``kafka-streams-application-reset``).

An application's internal topics are found by their names, as Kafka's reset tool finds them:
``<application_id>-<name>-changelog`` and ``<application_id>-<name>-repartition``, and a foreign-key join's
``<application_id>-<name>-subscription-registration-topic`` and ``<application_id>-<name>-subscription-response-topic``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pylog.errors import GroupNotEmptyError, UnknownGroupError
from pylog.streams.stores import STREAM_TIME_KEY, decode_key

if TYPE_CHECKING:
    from pylog.log import Log

__all__ = ["describe_application", "internal_topics", "read_store", "reset_application"]

_SUFFIXES = ("-changelog", "-repartition", "-subscription-registration-topic", "-subscription-response-topic")


def internal_topics(log: Log, application_id: str) -> list[str]:
    """The internal topics of ``application_id`` in ``log``, sorted."""
    prefix = application_id + "-"
    return sorted(
        t
        for t in log.topics()
        if t.startswith(prefix) and t.endswith(_SUFFIXES) and len(t) > len(prefix) + 10
    )


def describe_application(log: Log, application_id: str) -> dict[str, Any]:
    """The application's group (state, members and what they own), the committed offset, log end and lag of
    every source partition, and its internal topics with their sizes. :class:`~pylog.errors.UnknownGroupError`
    when there is neither a group nor an internal topic of that name."""
    topics = internal_topics(log, application_id)
    try:
        group = log.describe_group(application_id)
        committed = log.group_offsets(application_id)
    except UnknownGroupError:
        if not topics:
            raise
        group, committed = None, {}
    owners = {}
    members = []
    if group is not None:
        for m in group.members:
            members.append(
                {"member_id": m.member_id, "host": m.host, "pid": m.pid, "partitions": len(m.assignment)}
            )
            for tp in m.assignment:
                owners[tp] = m.member_id
    rows = []
    for tp in sorted(set(committed) | set(owners)):
        end = log.topic(tp.topic).end_offsets()[tp.partition] if log.has_topic(tp.topic) else None
        at = committed[tp].offset if tp in committed else None
        rows.append(
            {
                "topic": tp.topic,
                "partition": tp.partition,
                "committed_offset": at,
                "log_end_offset": end,
                "lag": None if at is None or end is None else max(end - at, 0),
                "owner": owners.get(tp),
            }
        )
    internal = []
    for name in topics:
        topic = log.topic(name)
        starts, ends = topic.beginning_offsets(), topic.end_offsets()
        internal.append(
            {
                "topic": name,
                "partitions": topic.num_partitions,
                "records": sum(ends[p] - starts[p] for p in ends),
                "cleanup_policy": topic.config.cleanup_policy,
            }
        )
    return {
        "application_id": application_id,
        "state": group.state if group is not None else None,
        "generation": group.generation if group is not None else None,
        "members": members,
        "partitions": rows,
        "internal_topics": internal,
    }


def reset_application(log: Log, application_id: str, *, execute: bool = False) -> dict[str, Any]:
    """What a reset does (and, with ``execute``, does it): delete the application's consumer group (its
    committed offsets: a restarted application reads its inputs from the beginning) and its internal topics
    (changelogs and repartition topics: its state). Refused while the group has live members
    (:class:`~pylog.errors.GroupNotEmptyError`). Input and output topics are not touched."""
    topics = internal_topics(log, application_id)
    try:
        group = log.describe_group(application_id)
    except UnknownGroupError:
        group = None
    if group is not None and group.members:
        raise GroupNotEmptyError(
            f"application {application_id!r} has {len(group.members)} live group members; stop every instance "
            "before resetting it"
        )
    if execute:
        if group is not None:
            log.delete_group(application_id)
        for name in topics:
            log.delete_topic(name)
    return {
        "application_id": application_id,
        "group": group is not None,
        "internal_topics": topics,
        "executed": execute,
    }


def read_store(log: Log, application_id: str, store: str) -> dict[Any, Any]:
    """The committed state of store ``store`` of ``application_id``, from any process: its changelog topic read
    ``read_committed`` as a table (:meth:`pylog.Topic.table`: committed transactions whole). Keys as the
    application sees them; a window store's are ``(key, window_start)`` with values ``[aggregate,
    latest_timestamp]``, a session store's ``(key, start)`` with ``[aggregate, end]``. The stream-time entry of
    window and session stores is left out. :class:`~pylog.errors.UnknownTopicError` when there is no such
    changelog."""
    table = log.topic(f"{application_id}-{store}-changelog").table(
        isolation_level="read_committed", key_deserializer=decode_key
    )
    return {k: v for k, v in table.items() if k != STREAM_TIME_KEY}
