"""Poison pills: a record the deserializer cannot decode never wedges a consumer (raise / skip / dead letter)."""

from __future__ import annotations

import json
import random

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pylog
from pylog.errors import ConfigError, DeserializationError
from pylog.structs import TopicPartition

TP = TopicPartition("t", 0)


def _fill(log: pylog.Log, bad: set[int], n: int = 40) -> None:
    """``n`` records on t-0; those in ``bad`` are not valid JSON."""
    log.create_topic("t")
    producer = log.producer(value_serializer=None)
    for i in range(n):
        value = b"{not json" if i in bad else json.dumps({"i": i}).encode()
        producer.send("t", value, key=f"k{i}", partition=0, headers=[("h", b"%d" % i)])
        if i % 7 == 0:
            producer.flush()  # several batches
    producer.close()


def _consumer(log: pylog.Log, **config: object) -> pylog.Consumer:
    c = log.consumer(
        value_deserializer=json.loads, consumer_timeout_ms=0, auto_offset_reset="earliest", **config
    )
    c.assign([TP])
    return c


def test_raise_returns_records_before_the_bad_one_then_raises_until_skipped(log: pylog.Log) -> None:
    _fill(log, {10})
    c = _consumer(log)
    got = []
    with pytest.raises(DeserializationError) as info:
        while True:
            batch = c.poll(max_records=3)
            if not batch:
                break
            got += [r.value["i"] for r in batch[TP]]
    assert got == list(range(10))
    assert info.value.topic_partition == TP and info.value.offset == 10
    assert c.position(TP) == 10
    with pytest.raises(DeserializationError):  # not wedged silently, not skipped silently
        c.poll()
    c.seek(info.value.topic_partition, info.value.offset + 1)
    rest = [r.value["i"] for r in c.iterate()]
    assert rest == list(range(11, 40))


@settings(max_examples=25, deadline=None)
@given(bad=st.sets(st.integers(0, 39), max_size=8), policy=st.sampled_from(["skip", "dead_letter"]))
def test_skip_and_dead_letter_deliver_exactly_the_good_records(
    tmp_path_factory: pytest.TempPathFactory, bad: set[int], policy: str
) -> None:
    with pylog.open(tmp_path_factory.mktemp("dlq")) as log:
        _fill(log, bad)
        extra = {"dead_letter_topic": "t.dlq"} if policy == "dead_letter" else {}
        c = _consumer(log, on_deserialization_error=policy, **extra)
        got = [r.value["i"] for r in c]
        assert got == [i for i in range(40) if i not in bad]
        metrics = c.metrics()["consumer-deserialization-metrics"]
        if policy == "skip":
            assert metrics == {"records-skipped-total": len(bad), "records-dead-lettered-total": 0}
            assert not log.has_topic("t.dlq")
        else:
            assert metrics == {"records-skipped-total": 0, "records-dead-lettered-total": len(bad)}
            if bad:
                _check_dead_letters(log, bad)
        c.close()


def _check_dead_letters(log: pylog.Log, bad: set[int]) -> None:
    dlq = log.consumer("t.dlq", value_deserializer=None, auto_offset_reset="earliest", consumer_timeout_ms=0)
    letters = list(dlq)
    assert [int(dict(r.headers)["pylog.dlq.offset"]) for r in letters] == sorted(bad)
    for r in letters:
        h = dict(r.headers)
        i = int(h["pylog.dlq.offset"])
        assert r.value == b"{not json" and r.key == f"k{i}".encode()  # stored bytes, byte for byte
        assert h["h"] == b"%d" % i  # original headers kept
        assert h["pylog.dlq.topic"] == b"t" and h["pylog.dlq.partition"] == b"0"
        assert h["pylog.dlq.stage"] == b"deserialization"
        assert h["pylog.dlq.error.class"] == b"JSONDecodeError"
    dlq.close()


def test_processing_errors_go_to_the_dead_letter_topic(log: pylog.Log) -> None:
    log.create_topic("orders")
    producer = log.producer()
    for i in range(20):
        producer.send("orders", {"qty": i % 5}, key=f"o{i}")
    producer.close()
    c = log.consumer(
        "orders", auto_offset_reset="earliest", consumer_timeout_ms=0, dead_letter_topic="orders.dlq"
    )
    total = 0
    for rec in c:
        try:
            total += 100 // rec.value["qty"]
        except ZeroDivisionError as exc:
            c.dead_letter(rec, exc)
    assert c.metrics()["consumer-deserialization-metrics"]["records-dead-lettered-total"] == 4
    dlq = log.consumer("orders.dlq", auto_offset_reset="earliest", consumer_timeout_ms=0)
    letters = list(dlq)
    assert [r.value for r in letters] == [{"qty": 0}] * 4  # the stored msgpack bytes, decoded again
    assert {dict(r.headers)["pylog.dlq.stage"] for r in letters} == {b"processing"}
    assert [dict(r.headers)["pylog.dlq.error.class"] for r in letters] == [b"ZeroDivisionError"] * 4
    assert [r.key for r in letters] == [b"o0", b"o5", b"o10", b"o15"]


def test_bad_policy_configs_are_typed_errors(log: pylog.Log) -> None:
    log.create_topic("t")
    with pytest.raises(ConfigError):
        log.consumer("t", on_deserialization_error="ignore")
    with pytest.raises(ConfigError):
        log.consumer("t", on_deserialization_error="dead_letter")
    with pytest.raises(pylog.errors.InvalidTopicError):
        log.consumer("t", on_deserialization_error="dead_letter", dead_letter_topic="bad/name")
    c = log.consumer("t")
    with pytest.raises(ConfigError):
        c.dead_letter("not a record", ValueError())  # type: ignore[arg-type]
    assert log.topics() == ["t"]


def test_key_deserializer_errors_follow_the_policy(log: pylog.Log) -> None:
    log.create_topic("t")
    producer = log.producer()
    keys = [b"1", b"2", b"x", b"4"]
    for k in keys:
        producer.send("t", msgpack.packb(random.random()), key=k, partition=0)
    producer.close()
    c = log.consumer(
        key_deserializer=lambda b: int(b),
        auto_offset_reset="earliest",
        consumer_timeout_ms=0,
        on_deserialization_error="skip",
    )
    c.assign([TP])
    assert [r.key for r in c] == [1, 2, 4]
    assert c.metrics()["consumer-deserialization-metrics"]["records-skipped-total"] == 1
