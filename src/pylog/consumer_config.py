"""Consumer settings: kafka-python's names and defaults, every one checked when the consumer is created.

A bad setting is a :class:`~pylog.errors.ConfigError` naming the setting, the value given and what is
allowed, raised before the consumer creates anything (no group directory, no transaction log).

Setting, default, allowed values::

    group_id                          None                   None or a str of 1-200 characters
    auto_offset_reset                 "latest"               "earliest", "latest", "none" (old names:
                                                             "smallest", "largest")
    consumer_timeout_ms               float("inf")           an int or float >= 0 (inf: wait forever)
    max_poll_records                  500                    an int >= 1
    max_partition_fetch_bytes         1048576                an int >= 1 (a larger first batch is still returned)
    key_deserializer                  None                   None or a callable
    value_deserializer                msgpack                None or a callable
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
member of a group. ``on_deserialization_error`` and ``dead_letter_topic`` are checked by
:mod:`pylog.deadletter`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pylog.errors import ConfigError
from pylog.groups.assignors import ASSIGNORS, DEFAULT_ASSIGNOR, Assignor, get_assignor

__all__ = [
    "GROUP_SETTINGS",
    "GroupConfig",
    "check_consumer_settings",
    "check_timeout_ms",
    "group_config",
]

_RESETS = {
    "earliest": "earliest",
    "latest": "latest",
    "none": "none",
    "smallest": "earliest",
    "largest": "latest",
}
_ISOLATION_LEVELS = ("read_uncommitted", "read_committed")


def _bad(name: str, value: object, allowed: str) -> ConfigError:
    return ConfigError(f"{name} must be {allowed}, got {value!r}")


def int_at_least(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise _bad(name, value, f"an int >= {least}")
    return value


def choice(name: str, value: object, allowed: Iterable[str]) -> str:
    names = tuple(allowed)
    if not isinstance(value, str) or value not in names:
        raise _bad(name, value, "one of " + ", ".join(repr(n) for n in names))
    return value


def check_timeout_ms(name: str, value: object) -> float:
    """A wait in milliseconds: an int or float >= 0, ``inf`` allowed, NaN not."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or value < 0:
        raise _bad(name, value, "an int or float >= 0 (float('inf') waits forever)")
    return float(value)


def optional_callable(name: str, value: object) -> Callable[..., Any] | None:
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


def check_consumer_settings(settings: Mapping[str, object]) -> dict[str, Any]:
    """The consumer's own settings (not the group's), checked; ``auto_offset_reset`` in its current name."""
    out: dict[str, Any] = dict(settings)
    reset = settings["auto_offset_reset"]
    if not isinstance(reset, str) or reset not in _RESETS:
        raise _bad("auto_offset_reset", reset, "'earliest', 'latest' or 'none'")
    out["auto_offset_reset"] = _RESETS[reset]
    out["consumer_timeout_ms"] = check_timeout_ms("consumer_timeout_ms", settings["consumer_timeout_ms"])
    int_at_least("max_poll_records", settings["max_poll_records"], 1)
    int_at_least("max_partition_fetch_bytes", settings["max_partition_fetch_bytes"], 1)
    choice("isolation_level", settings["isolation_level"], _ISOLATION_LEVELS)
    for name in ("key_deserializer", "value_deserializer"):
        optional_callable(name, settings[name])
    return out


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


GROUP_SETTINGS: dict[str, Callable[[str, Any], Any]] = {
    "session_timeout_ms": lambda n, v: int_at_least(n, v, 1),
    "heartbeat_interval_ms": lambda n, v: int_at_least(n, v, 1),
    "max_poll_interval_ms": lambda n, v: int_at_least(n, v, 1),
    "enable_auto_commit": _flag,
    "auto_commit_interval_ms": lambda n, v: int_at_least(n, v, 0),
    "partition_assignment_strategy": _assignor,
    "group_instance_id": _optional_name,
    "client_id": _str,
    "group_initial_rebalance_delay_ms": lambda n, v: int_at_least(n, v, 0),
}


def group_config(group_id: str | None, settings: Mapping[str, Any]) -> GroupConfig:
    """The group settings among a consumer's keyword arguments, checked (also without a ``group_id``)."""
    unknown = sorted(set(settings) - set(GROUP_SETTINGS))
    if unknown:
        raise ConfigError(
            f"unknown consumer config {', '.join(unknown)}; pylog's consumer settings are listed in "
            "docs/kafka-python.md (network settings such as bootstrap_servers do not apply)"
        )
    values = {name: GROUP_SETTINGS[name](name, value) for name, value in settings.items()}
    config = GroupConfig(**values)
    if config.heartbeat_interval_ms >= config.session_timeout_ms:
        raise ConfigError(
            f"heartbeat_interval_ms ({config.heartbeat_interval_ms}) must be lower than session_timeout_ms "
            f"({config.session_timeout_ms})"
        )
    if group_id is None and config.group_instance_id is not None:
        raise ConfigError(
            f"group_instance_id={config.group_instance_id!r} needs a group_id (it names a member of a group)"
        )
    return config
