"""Kafka's ``message.timestamp.after.max.ms`` / ``message.timestamp.before.max.ms``: a CreateTime record stamped
too far ahead of (or behind) the log's clock is refused, so one record from the year 3000 cannot stop time
retention of its partition. Checked against a model of what was accepted."""

from __future__ import annotations

import pytest

import pylog
from pylog.config import TopicConfig
from pylog.errors import ConfigError, InvalidTimestampError
from pylog.record import encode_batch

T0 = 1_700_000_000_000
HOUR = 3_600_000
DAY = 24 * HOUR
YEAR_3000 = 32_503_680_000_000


def _log_contents(log: pylog.Log, topic: str) -> dict[int, list[tuple[bytes, int]]]:
    out: dict[int, list[tuple[bytes, int]]] = {}
    t = log.topic(topic)
    for p in range(t.num_partitions):
        out[p] = [
            (v, int(ts))
            for b in t.partition(p).batches()
            for v, ts in zip(b.values(), b.timestamps.tolist(), strict=True)
            if v is not None
        ]
    return out


def test_defaults_are_kafka_4s() -> None:
    c = TopicConfig()
    assert c.message_timestamp_after_max_ms == HOUR  # Kafka 4.0 (KIP-1030); unlimited before
    assert c.message_timestamp_before_max_ms == 2**63 - 1
    for name in ("message_timestamp_after_max_ms", "message_timestamp_before_max_ms"):
        with pytest.raises(ConfigError, match=name):
            TopicConfig(**{name: -1})
        assert getattr(TopicConfig(**{name: 0}), name) == 0


def test_send_refuses_a_record_outside_the_window_and_keeps_every_other(log_dir: str) -> None:
    clock = pylog.ManualClock(T0)
    model: dict[int, list[tuple[bytes, int]]] = {0: [], 1: []}
    cases = [  # (timestamp, accepted)
        (T0, True),
        (T0 + HOUR, True),  # the bound itself is allowed, as in Kafka
        (T0 + HOUR + 1, False),
        (YEAR_3000, False),
        (T0 - 30 * DAY, True),  # no lower limit by default
        (0, True),
    ]
    with pylog.open(log_dir, clock=clock) as log:
        log.create_topic("t", partitions=2)
        producer = log.producer(value_serializer=None, linger_ms=60_000)  # one drain for everything
        futures = []
        for i, (ts, accepted) in enumerate(cases * 2):
            value, part = b"v%d" % i, i % 2
            if accepted:
                futures.append(producer.send("t", value, partition=part, timestamp_ms=ts))
                model[part].append((value, ts))
            else:
                with pytest.raises(InvalidTimestampError, match="message_timestamp_after_max_ms"):
                    producer.send("t", value, partition=part, timestamp_ms=ts)
        producer.flush()
        assert all(f.get().offset >= 0 for f in futures)  # the good records of the same drain: written
        producer.close()
        assert _log_contents(log, "t") == model


def test_before_max_ms_refuses_records_too_far_behind_the_clock(log_dir: str) -> None:
    clock = pylog.ManualClock(T0)
    with pylog.open(log_dir, clock=clock) as log:
        log.create_topic("t", message_timestamp_before_max_ms=DAY)
        producer = log.producer(value_serializer=None)
        assert producer.send("t", b"a", timestamp_ms=T0 - DAY).get().offset == 0
        with pytest.raises(InvalidTimestampError, match="message_timestamp_before_max_ms=86400000"):
            producer.send("t", b"b", timestamp_ms=T0 - DAY - 1)
        clock.advance(DAY)  # the window moves with the clock
        with pytest.raises(InvalidTimestampError):
            producer.send("t", b"c", timestamp_ms=T0 - 1)
        with pytest.raises(InvalidTimestampError):
            producer.send_batch("t", [None, None], [b"d", b"e"], timestamps=[T0 + DAY, T0 - 1])
        assert producer.send("t", b"f", timestamp_ms=T0).get().offset == 1
        producer.close()
        assert _log_contents(log, "t") == {0: [(b"a", T0 - DAY), (b"f", T0)]}


def test_an_append_refuses_the_whole_batch_holding_a_bad_timestamp(log_dir: str) -> None:
    """What the log itself checks (any writer: a producer, the Kafka protocol server, a direct append),
    against its clock at the moment of the append: Kafka refuses the batch whole."""
    clock = pylog.ManualClock(T0)
    with pylog.open(log_dir, clock=clock) as log:
        log.create_topic("t", message_timestamp_before_max_ms=DAY)
        plog = log.topic("t").partition(0)
        bad = [
            [T0, T0 + HOUR + 1],  # one record too far ahead
            [T0 - DAY - 1, T0],  # one too far behind
            [YEAR_3000],
        ]
        for stamps in bad:
            with pytest.raises(InvalidTimestampError):
                plog.append(encode_batch(0, [None] * len(stamps), [b"x"] * len(stamps), stamps))
        assert plog.log_end_offset == 0 and plog.segments[-1].size == 0  # nothing written, no roll
        info = plog.append(encode_batch(0, [None, None], [b"a", b"b"], [T0 - DAY, T0 + HOUR]))
        assert (info.base_offset, info.last_offset) == (0, 1)
        assert plog.verify() == []


def test_log_append_time_topics_take_any_timestamp(log_dir: str) -> None:
    clock = pylog.ManualClock(T0)
    with pylog.open(log_dir, clock=clock) as log:
        log.create_topic("t", message_timestamp_type="LogAppendTime", message_timestamp_after_max_ms=0)
        producer = log.producer(value_serializer=None)
        meta = producer.send("t", b"a", timestamp_ms=YEAR_3000).get()
        assert meta.timestamp == T0  # the log's time
        producer.close()


def test_a_record_from_the_year_3000_no_longer_stops_time_retention(log_dir: str) -> None:
    clock = pylog.ManualClock(T0)
    with pylog.open(log_dir, clock=clock) as log:
        log.create_topic("t", retention_ms=DAY, segment_bytes=1024)
        producer = log.producer(value_serializer=None)
        for i in range(50):
            producer.send("t", b"%04d" % i + b"." * 60).get()
        with pytest.raises(InvalidTimestampError):
            producer.send("t", b"from the future", timestamp_ms=YEAR_3000)
        clock.advance(2 * DAY)
        assert log.apply_retention()["t"] > 0
        assert log.topic("t").partition(0).log_start_offset == 50  # every segment expired
        # the old behaviour, asked for explicitly: the record is kept, and so is everything after it
        log.alter_topic("t", message_timestamp_after_max_ms=2**63 - 1)
        producer.send("t", b"from the future", timestamp_ms=YEAR_3000).get()
        producer.close()
        log.topic("t").partition(0).roll()
        clock.advance(2 * DAY)
        log.apply_retention()
        assert log.topic("t").partition(0).log_start_offset == 50


def test_transaction_markers_pass_a_narrow_window(log_dir: str) -> None:
    clock = pylog.ManualClock(T0)
    with pylog.open(log_dir, clock=clock) as log:
        log.create_topic("t", message_timestamp_after_max_ms=0, message_timestamp_before_max_ms=0)
        producer = log.producer(transactional_id="tx", value_serializer=None)
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", b"a")
        producer.commit_transaction()
        producer.close()
        c = log.consumer(
            "t",
            value_deserializer=None,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            consumer_timeout_ms=0,
        )
        assert [r.value for r in c] == [b"a"]
        c.close()


def test_the_cli_takes_kafkas_dotted_names(log_dir: str) -> None:
    from pylog.cli import main

    assert (
        main(
            [
                "topics",
                "create",
                "--dir",
                log_dir,
                "t",
                "--config",
                "message.timestamp.after.max.ms=60000",
                "--config",
                "message.timestamp.before.max.ms=3600000",
            ]
        )
        == 0
    )
    with pylog.open(log_dir) as log:
        config = log.topic("t").config
        assert (config.message_timestamp_after_max_ms, config.message_timestamp_before_max_ms) == (
            60_000,
            HOUR,
        )
