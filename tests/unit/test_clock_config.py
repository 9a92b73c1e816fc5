"""Injected time (pylog.clock) and topic configuration (pylog.config)."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import fields

import pytest

import pylog
from pylog.clock import Clock, ManualClock, SystemClock
from pylog.config import TopicConfig
from pylog.errors import ConfigError

# -- clocks -----------------------------------------------------------------------------------------------


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(1_000)
    assert clock.time_ms() == 1_000 and clock.monotonic_ms() == 0.0
    clock.advance(250)
    assert clock.time_ms() == 1_250 and clock.monotonic_ms() == 250.0
    clock.advance(0.5)
    assert clock.time_ms() == 1_250 and clock.monotonic_ms() == 250.5
    clock.set(5_000)
    assert clock.time_ms() == 5_000 and clock.monotonic_ms() == 250.5 + 3_750
    clock.set(4_000)  # wall time may go back; the monotonic clock does not
    assert clock.time_ms() == 4_000 and clock.monotonic_ms() == 4_000.5
    assert repr(clock) == "ManualClock(4000)"


def test_manual_clock_sleep_advances_unless_disabled() -> None:
    clock = ManualClock(0)
    clock.sleep(1.5)
    assert clock.time_ms() == 1_500
    clock.sleep(0)
    clock.sleep(-3)
    assert clock.time_ms() == 1_500
    still = ManualClock(0, auto_advance=False)
    started = time.monotonic()
    still.sleep(10)
    assert still.time_ms() == 0 and time.monotonic() - started < 1


@pytest.mark.parametrize("start", [-1, 1.5, True, "0", None])
def test_manual_clock_rejects_a_bad_start(start: object) -> None:
    with pytest.raises(ConfigError):
        ManualClock(start)  # type: ignore[arg-type]


def test_manual_clock_never_goes_backwards_by_advance() -> None:
    clock = ManualClock(10)
    with pytest.raises(ConfigError):
        clock.advance(-1)
    assert clock.time_ms() == 10


def test_manual_clock_is_thread_safe() -> None:
    clock = ManualClock(0)

    def work() -> None:
        for _ in range(10_000):
            clock.advance(1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clock.time_ms() == 40_000 and clock.monotonic_ms() == 40_000.0


def test_system_clock_follows_real_time() -> None:
    clock = SystemClock()
    before = time.time_ns() // 1_000_000
    now = clock.time_ms()
    assert before <= now <= time.time_ns() // 1_000_000  # bracketed by real time, however slow the machine
    a = clock.monotonic_ms()
    clock.sleep(0.01)
    b = clock.monotonic_ms()
    assert b - a >= 9
    clock.sleep(-1)
    assert isinstance(clock, Clock) and isinstance(ManualClock(), Clock)
    assert not isinstance(object(), Clock)


def test_log_uses_the_injected_clock_for_timestamps_and_retention(log_dir: str) -> None:
    clock = ManualClock(5_000_000)
    with pylog.open(log_dir, clock=clock) as log:
        log.create_topic("t", retention_ms=1_000)
        meta = log.producer().send("t", b"x").get()
        assert meta.timestamp == 5_000_000
        clock.advance(1_000)
        assert log.apply_retention() == {"t": 0}
        clock.advance(1)
        assert log.apply_retention() == {"t": 1}
        assert log.topic("t").beginning_offsets() == {0: 1}


# -- topic config -----------------------------------------------------------------------------------------


def _documented_defaults() -> dict[str, str]:
    import pylog.config

    doc = pylog.config.__doc__ or ""
    rows = re.findall(r"^\| ``(\w+)`` \| ([^|]+) \|", doc, re.MULTILINE)
    return {name: default.strip() for name, default in rows}


def test_documented_table_lists_every_field_with_its_default() -> None:
    documented = _documented_defaults()
    config = TopicConfig()
    assert sorted(documented) == sorted(f.name for f in fields(TopicConfig))
    day = 24 * 60 * 60 * 1000
    spoken = {"1 GiB": 1 << 30, "7 days": 7 * day, "1 day": day, "1 MiB + 12": (1 << 20) + 12}
    for name, text in documented.items():
        value = getattr(config, name)
        text = re.sub(r"\s*\(.*\)$", "", text)
        if text.startswith("``"):
            assert value == text.strip("`").strip('"'), name
        elif text in spoken:
            assert value == spoken[text], name
        else:
            assert value == type(value)(text), name


def test_kafka_defaults() -> None:
    c = TopicConfig()
    assert (c.segment_bytes, c.retention_bytes, c.index_interval_bytes) == (1 << 30, -1, 4096)
    assert (c.cleanup_policy, c.message_timestamp_type, c.compression_type) == (
        "delete",
        "CreateTime",
        "none",
    )
    assert (c.deletes, c.compacted, c.log_append_time) == (True, False, False)


@pytest.mark.parametrize(
    ("name", "bad", "good"),
    [
        ("segment_bytes", 63, 64),
        ("segment_bytes", 2**31, 2**31 - 1),
        ("segment_ms", 0, 1),
        ("retention_ms", -2, -1),
        ("retention_bytes", -2, -1),
        ("max_message_bytes", 127, 128),
        ("flush_messages", 0, -1),
        ("flush_messages", -2, 1),
        ("flush_ms", -2, 0),
        ("index_interval_bytes", -1, 0),
        ("delete_retention_ms", -1, 0),
        ("min_compaction_lag_ms", -1, 0),
        ("min_cleanable_dirty_ratio", 1.5, 1.0),
        ("min_cleanable_dirty_ratio", True, 0),
        ("cleanup_policy", "compact,  delete", "compact,delete"),
        ("message_timestamp_type", "logappendtime", "LogAppendTime"),
        ("compression_type", "brotli", "lz4"),
        ("segment_bytes", True, 1000),
        ("segment_bytes", 1000.0, 1000),
        ("retention_ms", "1", 1),
    ],
)
def test_ranges_and_choices(name: str, bad: object, good: object) -> None:
    with pytest.raises(ConfigError, match=name):
        TopicConfig(**{name: bad})  # type: ignore[arg-type]
    assert getattr(TopicConfig(**{name: good}), name) == good  # type: ignore[arg-type]


def test_from_dict_replace_and_to_dict() -> None:
    c = TopicConfig.from_dict({"retention_ms": 5, "cleanup_policy": "compact,delete"})
    assert c.retention_ms == 5 and c.compacted and c.deletes
    assert TopicConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ConfigError, match="no_such, other"):
        TopicConfig.from_dict({"other": 1, "no_such": 2})
    d = c.replace(segment_bytes=4096, message_timestamp_type="LogAppendTime")
    assert d.segment_bytes == 4096 and d.log_append_time and c.segment_bytes == 1 << 30
    with pytest.raises(ConfigError):
        c.replace(segment_bytes=1)
    with pytest.raises(ConfigError):
        c.replace(nope=1)
    with pytest.raises(Exception, match=r"cannot assign|frozen"):
        c.retention_ms = 1  # type: ignore[misc]


def test_topic_config_is_stored_in_the_manifest_and_survives_reopen(log_dir: str) -> None:
    with pylog.open(log_dir, segment_bytes=4096) as log:  # log-wide defaults
        log.create_topic("a")
        log.create_topic("b", retention_ms=-1, compression_type="zstd")
    with pylog.open(log_dir) as log:
        assert log.topic("a").config.segment_bytes == 4096
        b = log.topic("b").config
        assert (b.segment_bytes, b.retention_ms, b.compression_type) == (4096, -1, "zstd")
        log.alter_topic("b", retention_ms=10)
    with pylog.open(log_dir) as log:
        assert log.topic("b").config.retention_ms == 10
