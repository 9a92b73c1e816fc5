"""Consumer and group settings: one table of names, types, ranges, defaults and Kafka's names, checked before
the consumer creates anything, into two frozen dataclasses (:class:`ConsumerConfig`, :class:`GroupConfig`).

A bad setting is a :class:`~pylog.errors.ConfigError` naming the setting, the value given and what is
allowed, raised before the consumer creates anything (no group directory, no transaction log). An unknown
name is a ConfigError that names the closest known setting. Kafka's dotted names (``"auto.offset.reset"``)
are accepted too, through a dict: ``log.consumer("t", **{"auto.offset.reset": "earliest"})``.

Setting, default, allowed values::

    group_id                          None                   None or a str of 1-200 characters
    auto_offset_reset                 "latest"               "earliest", "latest", "none" (old names:
                                                             "smallest", "largest")
    consumer_timeout_ms               float("inf")           an int or float >= 0 (inf: wait forever)
    max_poll_records                  500                    an int >= 1
    max_partition_fetch_bytes         1048576                an int >= 1 (a larger first batch is still returned)
    key_deserializer                  None                   None or a callable
    value_deserializer                msgpack                None or a callable
    on_deserialization_error          "raise"                "raise", "skip", "dead_letter" (pylog.deadletter)
    dead_letter_topic                 None                   None or a topic name; needed by "dead_letter"
    isolation_level                   "read_uncommitted"     "read_uncommitted", "read_committed"
    session_timeout_ms                45000                  an int >= 1, above heartbeat_interval_ms
    heartbeat_interval_ms             3000                   an int >= 1
    max_poll_interval_ms              300000                 an int >= 1
    enable_auto_commit                True                   a bool
    auto_commit_interval_ms           5000                   an int >= 0
    partition_assignment_strategy     "cooperative-sticky"   a strategy name, an Assignor, or a non-empty
                                                             list of them (the first is used)
    group_instance_id                 None                   None or a non-empty str; needs a group_id
    client_id                         "pylog"                a str
    group_initial_rebalance_delay_ms  0                      an int >= 0

The group settings are accepted without a ``group_id`` too, as kafka-python does (they are checked, and have
no effect: without a group nothing is committed automatically), except ``group_instance_id``, which names a
member of a group.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import msgpack

from pylog.deadletter import POLICIES
from pylog.directory import validate_topic_name
from pylog.errors import ConfigError
from pylog.groups.assignors import ASSIGNORS, DEFAULT_ASSIGNOR, Assignor, get_assignor
from pylog.groups.store import validate_group_id

__all__ = [
    "CONSUMER_OPTIONS",
    "GROUP_OPTIONS",
    "ConsumerConfig",
    "GroupConfig",
    "Option",
    "check_timeout_ms",
    "consumer_configs",
    "msgpack_deserializer",
]

_RESETS = {
    "earliest": "earliest",
    "latest": "latest",
    "none": "none",
    "smallest": "earliest",
    "largest": "latest",
}
_ISOLATION_LEVELS = ("read_uncommitted", "read_committed")


def msgpack_deserializer(raw: bytes) -> Any:
    """The default value deserializer: one msgpack object (what the producer's default serializer wrote)."""
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


# -- checks: each returns the value in its stored form, or raises a ConfigError naming setting and value --


def _bad(name: str, value: object, allowed: str) -> ConfigError:
    return ConfigError(f"{name} must be {allowed}, got {value!r}")


def int_at_least(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise _bad(name, value, f"an int >= {least}")
    return value


def _int_at_least(least: int) -> Callable[[str, object], int]:
    return lambda name, value: int_at_least(name, value, least)


def _choice(allowed: Iterable[str]) -> Callable[[str, object], str]:
    names = tuple(allowed)

    def check(name: str, value: object) -> str:
        if not isinstance(value, str) or value not in names:
            raise _bad(name, value, "one of " + ", ".join(repr(n) for n in names))
        return value

    return check


def check_timeout_ms(name: str, value: object) -> float:
    """A wait in milliseconds: an int or float >= 0, ``inf`` allowed, NaN not."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or value < 0:
        raise _bad(name, value, "an int or float >= 0 (float('inf') waits forever)")
    return float(value)


def _reset(name: str, value: object) -> str:
    if not isinstance(value, str) or value not in _RESETS:
        raise _bad(name, value, "'earliest', 'latest' or 'none'")
    return _RESETS[value]


def _optional_callable(name: str, value: object) -> Callable[..., Any] | None:
    if value is not None and not callable(value):
        raise _bad(name, value, "None or a callable")
    return value


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _bad(name, value, "a bool")
    return value


def _optional_name(name: str, value: object) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise _bad(name, value, "None or a non-empty str")
    return value


def _optional_topic(name: str, value: object) -> str | None:
    if value is not None:
        validate_topic_name(value)
    return value  # type: ignore[return-value]


def _str(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise _bad(name, value, "a str")
    return value


def _assignor(name: str, value: object) -> Assignor:
    """A strategy name, an assignor, or a list of them (the first is used, as every member must run it)."""
    if isinstance(value, str | Assignor):
        first: object = value
    elif isinstance(value, list | tuple):
        if not value:
            raise _bad(name, value, "a non-empty list of strategy names")
        first = value[0]
    else:
        raise _bad(name, value, "a strategy name, an Assignor, or a list of them")
    if not isinstance(first, str | Assignor):
        raise _bad(name, value, "a strategy name, an Assignor, or a list of them")
    strategy = first if isinstance(first, str) else first.name
    if strategy not in ASSIGNORS:  # only named assignors: every member of a group must be able to run it
        raise _bad(name, value, "one of " + ", ".join(repr(n) for n in sorted(ASSIGNORS)))
    return get_assignor(first) if isinstance(first, str) else first


# -- the table --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One setting: its name (kafka-python's), Kafka's name (None where Kafka has none) and its check."""

    name: str
    kafka: str | None
    check: Callable[[str, Any], Any]


CONSUMER_OPTIONS: tuple[Option, ...] = (
    Option("auto_offset_reset", "auto.offset.reset", _reset),
    Option("consumer_timeout_ms", None, check_timeout_ms),
    Option("max_poll_records", "max.poll.records", _int_at_least(1)),
    Option("max_partition_fetch_bytes", "max.partition.fetch.bytes", _int_at_least(1)),
    Option("key_deserializer", "key.deserializer", _optional_callable),
    Option("value_deserializer", "value.deserializer", _optional_callable),
    Option("on_deserialization_error", None, _choice(POLICIES)),
    Option("dead_letter_topic", "errors.deadletterqueue.topic.name", _optional_topic),
    Option("isolation_level", "isolation.level", _choice(_ISOLATION_LEVELS)),
)

GROUP_OPTIONS: tuple[Option, ...] = (
    Option("session_timeout_ms", "session.timeout.ms", _int_at_least(1)),
    Option("heartbeat_interval_ms", "heartbeat.interval.ms", _int_at_least(1)),
    Option("max_poll_interval_ms", "max.poll.interval.ms", _int_at_least(1)),
    Option("enable_auto_commit", "enable.auto.commit", _flag),
    Option("auto_commit_interval_ms", "auto.commit.interval.ms", _int_at_least(0)),
    Option("partition_assignment_strategy", "partition.assignment.strategy", _assignor),
    Option("group_instance_id", "group.instance.id", _optional_name),
    Option("client_id", "client.id", _str),
    Option("group_initial_rebalance_delay_ms", "group.initial.rebalance.delay.ms", _int_at_least(0)),
)

_GROUP_ID = Option(
    "group_id", "group.id", lambda name, value: None if value is None else validate_group_id(value)
)
_ALL = {o.name: o for o in (_GROUP_ID, *CONSUMER_OPTIONS, *GROUP_OPTIONS)}
_KAFKA_NAMES = {o.kafka: o.name for o in _ALL.values() if o.kafka is not None}


@dataclass(frozen=True)
class ConsumerConfig:
    """A consumer's own settings, checked (see the module docstring)."""

    group_id: str | None = None
    auto_offset_reset: str = "latest"
    consumer_timeout_ms: float = float("inf")
    max_poll_records: int = 500
    max_partition_fetch_bytes: int = 1 << 20
    key_deserializer: Callable[[bytes], Any] | None = None
    value_deserializer: Callable[[bytes], Any] | None = msgpack_deserializer
    on_deserialization_error: str = "raise"
    dead_letter_topic: str | None = None
    isolation_level: str = "read_uncommitted"


@dataclass(frozen=True)
class GroupConfig:
    """A group member's settings (see the module docstring). ``group_initial_rebalance_delay_ms`` is a broker
    setting in Kafka (default 3000); here it is 0, as an embedded group has no broker start-up to wait for."""

    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 3_000
    max_poll_interval_ms: int = 300_000
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = 5_000
    partition_assignment_strategy: Assignor = field(default_factory=lambda: get_assignor(DEFAULT_ASSIGNOR))
    group_instance_id: str | None = None
    client_id: str = "pylog"
    group_initial_rebalance_delay_ms: int = 0


_CONSUMER_FIELDS = frozenset(f.name for f in fields(ConsumerConfig))


def consumer_configs(settings: Mapping[str, Any]) -> tuple[ConsumerConfig, GroupConfig]:
    """A consumer's keyword arguments (kafka-python's names or Kafka's), checked, as its two configs."""
    values: dict[str, Any] = {}
    for given, value in settings.items():
        name = _KAFKA_NAMES.get(given, given)
        option = _ALL.get(name)
        if option is None:
            raise ConfigError(_unknown(given))
        if name in values:
            raise ConfigError(f"{name} is given twice (as {name!r} and as Kafka's {option.kafka!r})")
        values[name] = option.check(name, value)
    consumer = ConsumerConfig(**{k: v for k, v in values.items() if k in _CONSUMER_FIELDS})
    group = GroupConfig(**{k: v for k, v in values.items() if k not in _CONSUMER_FIELDS})
    _check_together(consumer, group)
    return consumer, group


def _unknown(name: str) -> str:
    close = difflib.get_close_matches(name, [*_ALL, *_KAFKA_NAMES], n=1, cutoff=0.6)
    hint = f"; did you mean {_KAFKA_NAMES.get(close[0], close[0])!r}?" if close else ""
    return (
        f"unknown consumer config {name!r}{hint} pylog's consumer settings are listed in pylog.consumer_config "
        "and docs/kafka-python.md (network settings such as bootstrap_servers do not apply)"
    )


def _check_together(consumer: ConsumerConfig, group: GroupConfig) -> None:
    if group.heartbeat_interval_ms >= group.session_timeout_ms:
        raise ConfigError(
            f"heartbeat_interval_ms ({group.heartbeat_interval_ms}) must be lower than session_timeout_ms "
            f"({group.session_timeout_ms})"
        )
    if consumer.group_id is None and group.group_instance_id is not None:
        raise ConfigError(
            f"group_instance_id={group.group_instance_id!r} needs a group_id (it names a member of a group)"
        )
    if consumer.on_deserialization_error == "dead_letter" and not consumer.dead_letter_topic:
        raise ConfigError('on_deserialization_error="dead_letter" needs dead_letter_topic')
