"""Records built in bulk (``for r in consumer``, ``poll()``) against a reference model: every stored batch
decoded with :func:`pylog.record.decode_batch` and its records built one by one as ``ConsumerRecord(...)``,
with the deserializers applied per record and, under read_committed, the aborted transactions left out."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import msgpack
import pytest

import pylog
from pylog.partition.visibility import VISIBLE, Visibility
from pylog.record import decode_batch
from pylog.structs import ConsumerRecord, TopicPartition

TP = TopicPartition("t", 0)


def _model(
    log: pylog.Log,
    key_fn: Callable[[bytes], Any] | None = None,
    value_fn: Callable[[bytes], Any] | None = None,
    committed_only: bool = False,
) -> list[ConsumerRecord]:
    """Every record of partition t-0, decoded batch by batch and built one at a time."""
    plog = log.topic("t").partition(0)
    rule = Visibility(log.transactions().status)
    out = []
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        for buf, at in plog.read_raw(offset, 1 << 20):
            b = decode_batch(buf, at)
            h = b.header
            offset = h.next_offset
            if committed_only and rule.classify(h) != VISIBLE:  # no transaction is left open here
                continue
            keys, values, headers = b.keys(), b.values(), b.headers()
            for i in range(h.record_count):
                key, value = keys[i], values[i]
                out.append(
                    ConsumerRecord(
                        "t",
                        0,
                        -1,
                        int(b.offsets[i]),
                        int(b.timestamps[i]),
                        h.timestamp_type,
                        key if key is None or key_fn is None else key_fn(key),
                        value if value is None or value_fn is None else value_fn(value),
                        list(headers[i]),
                        None,
                        -1 if key is None else len(key),
                        -1 if value is None else len(value),
                        sum(len(k.encode()) + len(v or b"") for k, v in headers[i]) if headers[i] else -1,
                    )
                )
    return out


def _write_mixed(log: pylog.Log, seed: int, n: int) -> int:
    """Batches of 1 to 3,000 records: fixed and variable lengths, null keys and values, headers."""
    rng = random.Random(seed)
    log.create_topic("t", partitions=1)
    producer = log.producer(acks=1, value_serializer=None, linger_ms=60_000)
    i = 0
    while i < n:
        size = rng.choice([1, 5, 32, 33, 700, 3000])
        fixed = rng.random() < 0.5
        for _ in range(size):
            key = (
                None
                if not fixed and rng.random() < 0.2
                else bytes([i % 251]) * (8 if fixed else rng.randrange(0, 30))
            )
            value = (
                None
                if not fixed and rng.random() < 0.1
                else rng.randbytes(100 if fixed else rng.randrange(0, 300))
            )
            if key is None and value is None:
                value = b""
            headers = [("h", str(i).encode()), ("x", b"")] if not fixed and i % 3 == 0 else []
            producer.send("t", value=value, key=key, headers=headers)
            i += 1
        producer.flush()
    producer.close()
    return i


@pytest.mark.parametrize("seed", [1, 2])
def test_iteration_equals_records_built_one_by_one(log_dir: str, seed: int) -> None:
    with pylog.open(log_dir) as log:
        sent = _write_mixed(log, seed, 9000)
        consumer = log.consumer(
            "t", auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None
        )
        got = list(consumer)
        consumer.close()
        expected = _model(log)
    assert len(expected) == sent
    assert got == expected
    assert all(type(r) is ConsumerRecord for r in got)
    assert [r._fields for r in got[:1]] == [ConsumerRecord._fields]


def test_poll_pages_by_max_poll_records_and_equals_the_model(log_dir: str) -> None:
    with pylog.open(log_dir) as log:
        _write_mixed(log, 3, 5000)
        consumer = log.consumer(
            "t", auto_offset_reset="earliest", value_deserializer=None, max_poll_records=333
        )
        got: list[ConsumerRecord] = []
        while polled := consumer.poll(timeout_ms=0):
            (records,) = polled.values()
            assert 1 <= len(records) <= 333
            got += records
            assert consumer.position(TP) == got[-1].offset + 1
        consumer.close()
        assert got == _model(log)


def test_deserializers_are_applied_per_record(log_dir: str) -> None:
    with pylog.open(log_dir) as log:
        log.create_topic("t", partitions=1)
        producer = log.producer(acks=1, linger_ms=60_000)  # msgpack values
        rng = random.Random(4)
        for i in range(4000):
            key = None if i % 9 == 0 else f"k{i}".encode()
            value = None if i % 13 == 0 and i % 9 else {"i": i, "s": "x" * rng.randrange(0, 50)}
            producer.send("t", value=value, key=key)
            if i % 1500 == 0:
                producer.flush()
        producer.close()
        consumer = log.consumer(
            "t", auto_offset_reset="earliest", consumer_timeout_ms=0, key_deserializer=bytes.decode
        )
        got = list(consumer)
        consumer.close()
        expected = _model(
            log, key_fn=bytes.decode, value_fn=lambda b: msgpack.unpackb(b, raw=False, strict_map_key=False)
        )
    assert got == expected


def test_read_committed_leaves_out_aborted_transactions(log_dir: str) -> None:
    with pylog.open(log_dir) as log:
        log.create_topic("t", partitions=1)
        plain = log.producer(acks=1, value_serializer=None)
        tx = log.producer(transactional_id="tx", value_serializer=None)
        tx.init_transactions()
        visible = []
        for round_ in range(6):
            tx.begin_transaction()
            values = [f"{round_}-{i}".encode() for i in range(40 * (round_ + 1))]
            for v in values:
                tx.send("t", v, partition=0)
            if round_ % 2:
                tx.abort_transaction()
            else:
                tx.commit_transaction()
                visible += values
            plain.send("t", f"p{round_}".encode(), partition=0).get()
            visible.append(f"p{round_}".encode())
        plain.close()
        tx.close()
        committed = log.consumer(
            "t",
            auto_offset_reset="earliest",
            consumer_timeout_ms=0,
            value_deserializer=None,
            isolation_level="read_committed",
        )
        got = list(committed)
        committed.close()
        everything = log.consumer(
            "t", auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None
        )
        got_all = list(everything)
        everything.close()
        assert got == _model(log, committed_only=True)
        assert [r.value for r in got] == visible
        assert got_all == _model(log)
        assert len(got_all) > len(got)


def test_pause_and_seek_in_the_middle_of_an_iteration(log_dir: str) -> None:
    with pylog.open(log_dir) as log:
        _write_mixed(log, 5, 4000)
        expected = _model(log)
        consumer = log.consumer(
            "t", auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None
        )
        it = iter(consumer)
        first = [next(it) for _ in range(1234)]
        assert first == expected[:1234]
        assert consumer.position(TP) == expected[1234].offset
        consumer.pause(TP)
        assert consumer.poll(timeout_ms=0) == {}
        consumer.resume(TP)
        consumer.seek(TP, expected[100].offset)
        assert list(consumer) == expected[100:]
        consumer.seek(TP, expected[-5].offset)
        assert consumer.poll(timeout_ms=0) == {TP: expected[-5:]}
        consumer.close()


def test_records_kept_by_the_caller_stay_intact(log_dir: str) -> None:
    """The buffers are freed and reused between fetches: records the caller keeps must not change."""
    with pylog.open(log_dir) as log:
        _write_mixed(log, 6, 6000)
        consumer = log.consumer(
            "t", auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None
        )
        kept = [r for i, r in enumerate(consumer) if i % 97 == 0]
        consumer.close()
        assert kept == _model(log)[::97]
