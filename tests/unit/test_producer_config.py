"""ProducerConfig: one place for the producer's settings (names, types, ranges, defaults)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import pylog
from pylog import errors
from pylog.producer_config import ProducerConfig, msgpack_serializer


def test_defaults_are_kafka_python_names_with_the_embedded_batch_size() -> None:
    config = ProducerConfig()
    assert config.acks == 1
    assert config.linger_ms == 0.0
    assert config.batch_size == 262_144
    assert config.key_serializer is None
    assert config.value_serializer is msgpack_serializer
    assert config.compression_type is None
    assert config.queue_bytes == 1 << 20


def test_the_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ProducerConfig().acks = 0  # type: ignore[misc]


@pytest.mark.parametrize(("given", "stored"), [(0, 0), (1, 1), ("all", "all"), (-1, "all")])
def test_acks_are_stored_in_one_form(given: Any, stored: Any) -> None:
    assert ProducerConfig(acks=given).acks == stored


@pytest.mark.parametrize(
    "settings",
    [
        {"acks": 2},
        {"acks": True},
        {"linger_ms": -1},
        {"linger_ms": float("nan")},
        {"linger_ms": "5"},
        {"batch_size": 0},
        {"batch_size": True},
        {"max_queued_bytes": 1.5},
        {"compression_type": "brotli"},
        {"key_serializer": "str"},
        {"value_serializer": 3},
    ],
)
def test_bad_values_name_the_setting_and_the_value(settings: dict[str, Any]) -> None:
    (name, value), *_ = settings.items()
    with pytest.raises(errors.ConfigError, match=name) as info:
        ProducerConfig.from_settings(settings)
    assert repr(value) in str(info.value)


def test_queue_bytes_is_never_below_one_batch() -> None:
    assert ProducerConfig(batch_size=1 << 21, max_queued_bytes=1 << 10).queue_bytes == 1 << 21


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("lingr_ms", "did you mean linger_ms"),
        ("batchsize", "did you mean batch_size"),
        ("retries", "needs enable_idempotence=True"),
        ("bootstrap_servers", "known: acks"),
    ],
)
def test_unknown_names_are_refused_with_the_closest_known_one(name: str, hint: str) -> None:
    with pytest.raises(errors.ConfigError, match=name) as info:
        ProducerConfig.from_settings({name: 1})
    assert hint in str(info.value)


def test_the_producer_exposes_its_config(log: pylog.Log) -> None:
    p = log.producer(acks=-1, linger_ms=2, value_serializer=None)
    try:
        assert p.config == ProducerConfig(acks="all", linger_ms=2.0, value_serializer=None)
        assert p.acks == "all" and p.linger_ms == 2.0
    finally:
        p.close()
