"""Consumer settings are checked when the consumer is created: every setting, good and bad values, with and
without a group; a bad one is a ConfigError naming the setting and the value, and nothing is created on disk.
Also the consumer's other kafka-python shapes: subscribe()/subscription() with a pattern, offsets_for_times()
with a bad timestamp, poll() with a bad timeout."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest

import pylog
from pylog.errors import ConfigError, IllegalStateError, InvalidTimestampError, UnknownTopicError
from pylog.groups.assignors import RangeAssignor
from pylog.structs import TopicPartition

_NOT_CALLABLE = [1, "json", b"x", [len]]

#: setting -> (good values, bad values): the consumer's own settings
CONSUMER_SETTINGS: dict[str, tuple[list[Any], list[Any]]] = {
    "auto_offset_reset": (
        ["earliest", "latest", "none", "smallest", "largest"],
        ["first", "", None, 1, ["none"]],
    ),
    "consumer_timeout_ms": ([0, 10, 0.5, float("inf")], ["x", None, -1, -0.5, True, math.nan]),
    "max_poll_records": ([1, 500], [0, -1, 1.5, "10", True, None]),
    "max_partition_fetch_bytes": ([1, 1 << 20], [0, -1, 1.0, "1", False, None]),
    "key_deserializer": ([None, bytes, lambda b: b], _NOT_CALLABLE),
    "value_deserializer": ([None, bytes.decode], _NOT_CALLABLE),
    "isolation_level": (["read_uncommitted", "read_committed"], ["READ_COMMITTED", "", None, 0]),
    "on_deserialization_error": (["raise", "skip"], ["ignore", None, 1]),
}

#: setting -> (good values, bad values): the group's settings, accepted (and checked) without a group too
GROUP_SETTINGS: dict[str, tuple[list[Any], list[Any]]] = {
    "session_timeout_ms": ([10_000, 45_000], [0, -1, "10000", 1.5, True, None]),
    "heartbeat_interval_ms": ([1, 3_000], [0, -5, "3", 2.0, False]),
    "max_poll_interval_ms": ([1, 300_000], [0, -1, "x", 1.0]),
    "enable_auto_commit": ([True, False], ["yes", 1, 0, None]),
    "auto_commit_interval_ms": ([0, 5_000], [-1, "5", 1.5, True]),
    "partition_assignment_strategy": (
        [
            "range",
            "roundrobin",
            "sticky",
            "cooperative-sticky",
            ["range", "sticky"],
            ("roundrobin",),
            RangeAssignor(),
        ],
        ["fastest", [], 5, None, [5], ["fastest"], {"range"}],
    ),
    "client_id": (["app", ""], [5, None, b"app"]),
    "group_initial_rebalance_delay_ms": ([0, 3_000], [-1, "0", 0.5]),
}


def _cases(table: dict[str, tuple[list[Any], list[Any]]], which: int) -> list[tuple[str, Any]]:
    return [(name, value) for name, values in table.items() for value in values[which]]


def _entries(root: str) -> set[str]:
    """Every file and directory under ``root`` (what a failed constructor must not add to)."""
    out = set()
    for d, dirs, files in os.walk(root):
        out.update(os.path.relpath(os.path.join(d, n), root) for n in dirs + files)
    return out


@pytest.fixture
def log(log_dir: str) -> Iterator[pylog.Log]:
    with pylog.open(log_dir) as opened:
        opened.create_topic("t", partitions=2)
        producer = opened.producer()
        for i in range(50):
            producer.send("t", i, key=str(i))
        producer.close()
        yield opened


@pytest.mark.parametrize("group_id", [None, "g"])
@pytest.mark.parametrize(("name", "value"), _cases(CONSUMER_SETTINGS, 0) + _cases(GROUP_SETTINGS, 0))
def test_good_values_are_accepted(log: pylog.Log, group_id: str | None, name: str, value: Any) -> None:
    consumer = log.consumer("t", group_id=group_id, **{name: value})
    consumer.close(autocommit=False)


@pytest.mark.parametrize("group_id", [None, "g"])
@pytest.mark.parametrize(("name", "value"), _cases(CONSUMER_SETTINGS, 1) + _cases(GROUP_SETTINGS, 1))
def test_bad_values_are_config_errors_naming_setting_and_value(
    log: pylog.Log, group_id: str | None, name: str, value: Any
) -> None:
    before = _entries(log.path)
    with pytest.raises(ConfigError) as info:
        log.consumer("t", group_id=group_id, **{name: value})
    message = str(info.value)
    assert name in message and repr(value) in message, message
    assert _entries(log.path) == before


@pytest.mark.parametrize(
    "config",
    [
        {"group_id": "g", "heartbeat_interval_ms": 5_000, "session_timeout_ms": 5_000},
        {"heartbeat_interval_ms": 6_000, "session_timeout_ms": 5_000},
        {"group_instance_id": "worker-1"},  # names a member of a group: needs a group_id, as in kafka-python
        {"group_id": "g", "group_instance_id": ""},
        {"on_deserialization_error": "dead_letter"},  # without a dead_letter_topic
        {"group_id": ""},
        {"group_id": 7},
        {"bootstrap_servers": "localhost:9092"},
        {"group_id": "g", "no_such_setting": 1},
    ],
)
def test_bad_combinations_and_names_are_config_errors(log: pylog.Log, config: dict[str, Any]) -> None:
    before = _entries(log.path)
    with pytest.raises(ConfigError):
        log.consumer("t", **config)
    assert _entries(log.path) == before


def test_without_a_group_auto_commit_settings_are_accepted_and_nothing_is_committed(log: pylog.Log) -> None:
    consumer = log.consumer(
        "t", auto_offset_reset="earliest", enable_auto_commit=True, auto_commit_interval_ms=0
    )
    assert sum(len(recs) for recs in consumer.poll(timeout_ms=100, max_records=1000).values()) == 50
    consumer.poll(timeout_ms=0)
    consumer.close()
    assert log.list_groups() == []
    with pytest.raises(IllegalStateError):
        log.consumer(enable_auto_commit=False).commit()


def test_the_smallest_fetch_size_still_returns_every_record(log: pylog.Log) -> None:
    """max_partition_fetch_bytes=1: each fetch returns at least one batch (as Kafka's does), so nothing stalls."""
    consumer = log.consumer("t", auto_offset_reset="earliest", max_partition_fetch_bytes=1)
    got = [r.value for r in consumer.iterate(timeout_ms=0)]
    assert sorted(got) == list(range(50))


def test_a_failed_group_consumer_creates_nothing(log: pylog.Log) -> None:
    before = _entries(log.path)
    with pytest.raises(UnknownTopicError):
        log.consumer("nope", group_id="g")
    with pytest.raises(UnknownTopicError):
        log.consumer("t", "nope", group_id="g2", auto_offset_reset="earliest")
    assert _entries(log.path) == before
    assert log.list_groups() == []


@pytest.mark.parametrize("group_id", [None, "g"])
def test_subscription_of_a_pattern_is_the_matching_topics(log: pylog.Log, group_id: str | None) -> None:
    log.create_topic("clicks-a")
    log.create_topic("views")
    consumer = log.consumer(group_id=group_id)
    consumer.subscribe(pattern=r"clicks-.*|t")
    rx = re.compile(r"clicks-.*|t")
    assert consumer.subscription() == {n for n in log.topics() if rx.fullmatch(n)}
    log.create_topic("clicks-b")
    assert consumer.subscription() == {n for n in log.topics() if rx.fullmatch(n)}
    consumer.subscribe(["views"])
    assert consumer.subscription() == {"views"}
    consumer.close()


def test_subscribe_needs_topics_or_a_pattern_but_not_both(log: pylog.Log) -> None:
    consumer = log.consumer(group_id="g")
    with pytest.raises(ConfigError, match=r"topics.*pattern"):
        consumer.subscribe()
    with pytest.raises(ConfigError, match=r"topics.*pattern"):
        consumer.subscribe([])
    with pytest.raises(IllegalStateError):
        consumer.subscribe(["t"], pattern="t")
    assert consumer.subscription() == set()
    consumer.close()


def test_offsets_for_times_rejects_bad_timestamps_with_invalid_timestamp_error(log: pylog.Log) -> None:
    consumer = log.consumer()
    tp = TopicPartition("t", 0)
    for bad in (-1, 2**63, 1.5, "0", True, None):
        with pytest.raises(InvalidTimestampError):
            consumer.offsets_for_times({tp: bad})
    assert consumer.offsets_for_times({tp: 0})[tp] is not None


def test_poll_rejects_a_timeout_that_is_not_a_number(log: pylog.Log) -> None:
    consumer = log.consumer("t")
    for bad in ("x", None, math.nan, [1]):
        with pytest.raises(ConfigError, match="timeout_ms"):
            consumer.poll(timeout_ms=bad)
    with pytest.raises(ConfigError, match="negative"):  # a ValueError, as kafka-python raises
        consumer.poll(timeout_ms=-5)
    consumer.close()


def test_an_unknown_setting_names_the_closest_known_one(log: pylog.Log) -> None:
    with pytest.raises(ConfigError, match=r"'max_poll_record'.*did you mean 'max_poll_records'"):
        log.consumer("t", max_poll_record=10)
    with pytest.raises(ConfigError, match=r"did you mean 'auto.offset.reset'"):
        log.consumer("t", **{"auto.offset.rest": "earliest"})


def test_kafkas_dotted_names_are_accepted(log: pylog.Log) -> None:
    consumer = log.consumer("t", **{"auto.offset.reset": "earliest", "max.poll.records": 7})
    assert consumer.config.auto_offset_reset == "earliest" and consumer.config.max_poll_records == 7
    assert sum(len(recs) for recs in consumer.poll(timeout_ms=100).values()) == 7
    consumer.close()
    with pytest.raises(ConfigError, match="given twice"):
        log.consumer("t", max_poll_records=1, **{"max.poll.records": 2})


def test_configs_are_frozen_and_hold_the_checked_values(log: pylog.Log) -> None:
    from dataclasses import FrozenInstanceError

    from pylog.consumer_config import ConsumerConfig, consumer_configs

    consumer, group = consumer_configs(
        {"auto_offset_reset": "smallest", "group_id": "g", "session_timeout_ms": 10_000}
    )
    assert consumer == ConsumerConfig(group_id="g", auto_offset_reset="earliest")
    assert group.session_timeout_ms == 10_000 and group.heartbeat_interval_ms == 3_000
    with pytest.raises(FrozenInstanceError):
        consumer.max_poll_records = 1  # type: ignore[misc]
