"""Bad input, fuzzed: every mistake is a pylog.errors class (never a bare TypeError/ValueError/OverflowError
escaping from inside), and it changes nothing on disk."""

from __future__ import annotations

import hashlib
import math
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pylog
from pylog.errors import PylogError
from pylog.structs import TopicPartition

weird = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=300),
    st.binary(max_size=64),
    st.lists(st.integers(), max_size=3),
    st.just(math.nan),
    st.just(2**63),
    st.just(-1),
)


def _digest(root: str) -> str:
    h = hashlib.sha256()
    for d, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            if f.endswith(".lock") or f == "partition.state":
                continue
            with open(os.path.join(d, f), "rb") as fh:
                h.update(f.encode() + fh.read())
    return h.hexdigest()


@pytest.fixture(scope="module")
def fuzz_log(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with pylog.open(tmp_path_factory.mktemp("fuzz"), max_message_bytes=10_000) as log:
        log.create_topic("t", partitions=2)
        p = log.producer()
        for i in range(10):
            p.send("t", i, key=str(i))
        p.close()
        log.flush()
        yield log


def _typed_or_ok(fn: Any, *args: Any, **kwargs: Any) -> None:
    try:
        fn(*args, **kwargs)
    except PylogError:
        pass


SETTINGS = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SETTINGS
@given(name=weird, partitions=weird)
def test_create_topic(fuzz_log: pylog.Log, name: Any, partitions: Any) -> None:
    before = fuzz_log.topics()
    try:
        fuzz_log.create_topic(name, partitions=partitions)
    except PylogError:
        assert fuzz_log.topics() == before
    else:
        fuzz_log.delete_topic(name)


@SETTINGS
@given(
    topic=st.one_of(weird, st.just("t")),
    value=weird,
    key=weird,
    partition=weird,
    ts=weird,
    headers=st.one_of(weird, st.lists(st.tuples(weird, weird), max_size=2)),
)
def test_send(
    fuzz_log: pylog.Log, topic: Any, value: Any, key: Any, partition: Any, ts: Any, headers: Any
) -> None:
    before = _digest(fuzz_log.path)
    producer = fuzz_log.producer(value_serializer=None)
    try:
        producer.send(topic, value, key, partition=partition, timestamp_ms=ts, headers=headers).get()
    except PylogError:
        producer.close()
        assert _digest(fuzz_log.path) == before
        return
    producer.close()  # a valid record: fine (the inputs were acceptable after all)


@SETTINGS
@given(size=st.integers(10_001, 50_000))
def test_records_over_max_message_bytes(fuzz_log: pylog.Log, size: int) -> None:
    before = _digest(fuzz_log.path)
    producer = fuzz_log.producer(value_serializer=None)
    with pytest.raises(pylog.errors.RecordTooLargeError):
        producer.send("t", b"x" * size).get()
    producer.close()
    assert _digest(fuzz_log.path) == before


@SETTINGS
@given(partition=weird, offset=weird, ts=weird)
def test_consumer_positions(fuzz_log: pylog.Log, partition: Any, offset: Any, ts: Any) -> None:
    before = _digest(fuzz_log.path)
    c = fuzz_log.consumer(consumer_timeout_ms=0, auto_offset_reset="none")
    _typed_or_ok(c.assign, [TopicPartition("t", partition)])
    _typed_or_ok(c.seek, TopicPartition("t", partition), offset)
    _typed_or_ok(c.poll)
    try:
        query = {TopicPartition("t", partition): ts}
    except TypeError:  # an unhashable partition cannot even be a dict key
        query = {}
    _typed_or_ok(c.offsets_for_times, query)
    _typed_or_ok(c.position, TopicPartition("t", partition))
    c.close()
    assert _digest(fuzz_log.path) == before


@SETTINGS
@given(
    config=st.dictionaries(
        st.sampled_from(
            [
                "segment_bytes",
                "retention_ms",
                "retention_bytes",
                "cleanup_policy",
                "max_message_bytes",
                "compression_type",
                "flush_ms",
                "index_interval_bytes",
                "message_timestamp_type",
                "bogus",
            ]
        ),
        weird,
        max_size=3,
    )
)
def test_topic_configs(fuzz_log: pylog.Log, config: dict[str, Any]) -> None:
    before = fuzz_log.topics()
    try:
        fuzz_log.create_topic("cfg", **config)
    except PylogError:
        assert fuzz_log.topics() == before
    else:
        fuzz_log.delete_topic("cfg")
