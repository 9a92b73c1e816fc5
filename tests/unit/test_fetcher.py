"""The fetcher's bulk decoding against a reference model: for batches of every shape (small and large, fixed
and variable lengths, None keys and values, headers, compression) and values that are and are not one msgpack
object each, a consumer returns exactly what decoding each stored record on its own gives, under each
deserialization error policy."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest

import pylog
from pylog.errors import DeserializationError
from pylog.structs import ConsumerRecord, TopicPartition

TP = TopicPartition("t", 0)
_BIG = 1024

#: values that are not exactly one msgpack object; the last three line up again in one stream (a value of
#: two objects, then an array header that takes the next value as its element)
_BAD = [b"", b"\xc1", b"\x01\x02", b"\x91", b"\x03"]


def _value(rng: random.Random, shape: str, i: int) -> bytes | None:
    if shape == "fixed":
        return msgpack.packb(f"{i:08d}")
    if shape == "nulls" and i % 7 == 3:
        return None
    if shape == "poison" and i % 11 == 5:
        return _BAD[(i // 11) % len(_BAD)]
    if shape == "aligned_poison" and 20 <= i < 23:
        return _BAD[2 + i - 20]
    return msgpack.packb({"i": i, "s": "x" * rng.randrange(0, 40)})


def _write(
    log: pylog.Log, rng: random.Random, shape: str, n: int, per_batch: int, compression: str | None
) -> list[Any]:
    log.create_topic("t", partitions=1)
    producer = log.producer(acks=1, value_serializer=None, linger_ms=60_000, compression_type=compression)
    sent = []
    for i in range(n):
        value = _value(rng, shape, i)
        key = None if i % 5 == 4 and value is not None else f"k{i % 3 if shape == 'fixed' else i}".encode()
        headers = [("h", str(i).encode())] if shape == "headers" and i % 2 else []
        producer.send("t", value=value, key=key, headers=headers)
        sent.append((key, value, headers))
        if (i + 1) % per_batch == 0:
            producer.flush()
    producer.close()
    return sent


def _expected(sent: list[Any], policy: str) -> tuple[list[tuple[Any, ...]], int | None]:
    """(offset, key, value, headers, key size, value size) per record returned; and the offset the "raise"
    policy stops at."""
    out = []
    for offset, (key, value, headers) in enumerate(sent):
        try:
            decoded = None if value is None else msgpack.unpackb(value, raw=False, strict_map_key=False)
        except Exception:
            if policy == "raise":
                return out, offset
            continue
        out.append(
            (
                offset,
                key,
                decoded,
                headers,
                -1 if key is None else len(key),
                -1 if value is None else len(value),
            )
        )
    return out, None


def _shape(r: ConsumerRecord) -> tuple[Any, ...]:
    return (r.offset, r.key, r.value, list(r.headers), r.serialized_key_size, r.serialized_value_size)


@pytest.mark.parametrize("shape", ["fixed", "varied", "nulls", "headers", "poison", "aligned_poison"])
@pytest.mark.parametrize("per_batch", [1, 20, 500])
@pytest.mark.parametrize("policy", ["skip", "raise"])
def test_records_match_decoding_each_record_alone(
    log_dir: str, shape: str, per_batch: int, policy: str
) -> None:
    rng = random.Random(f"{shape}-{per_batch}")
    with pylog.open(log_dir) as log:
        sent = _write(log, rng, shape, 300, per_batch, None)
        expected, stop = _expected(sent, policy)
        consumer = log.consumer(
            "t", auto_offset_reset="earliest", consumer_timeout_ms=0, on_deserialization_error=policy
        )
        got = []
        with pytest.raises(DeserializationError) if stop is not None else _nothing() as info:
            got.extend(_shape(r) for r in consumer)
        assert got == expected
        if stop is not None:  # raised again by every poll until the application seeks past it
            assert info.value.offset == stop
            with pytest.raises(DeserializationError):
                consumer.poll()
            consumer.seek(TP, stop + 1)
            assert consumer.position(TP) == stop + 1
        consumer.close()


@pytest.mark.parametrize("compression", ["gzip", "zstd", "lz4"])
def test_compressed_batches_match_too(log_dir: str, compression: str) -> None:
    rng = random.Random(compression)
    with pylog.open(log_dir) as log:
        try:
            sent = _write(log, rng, "varied", 200, 100, compression)
        except pylog.errors.ConfigError as exc:
            pytest.skip(str(exc))
        consumer = log.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0)
        assert [_shape(r) for r in consumer] == _expected(sent, "skip")[0]
        consumer.close()


def test_a_seek_into_a_batch_starts_at_that_record(log_dir: str) -> None:
    with pylog.open(log_dir) as log:
        sent = _write(log, random.Random(1), "fixed", 100, 100, None)
        consumer = log.consumer(auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None)
        consumer.assign([TP])
        consumer.seek(TP, 37)
        got = [(r.offset, r.value) for r in consumer]
        assert got == [(i, sent[i][1]) for i in range(37, 100)]


class _nothing:
    value: Any = None

    def __enter__(self) -> _nothing:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize("policy", ["skip", "raise"])
@pytest.mark.parametrize("shape", ["poison", "fixed"])
def test_a_large_batch_matches_too(log_dir: str, policy: str, shape: str) -> None:
    """One batch of 2,560 records (decoded as numpy columns), with poison pills spread over it."""
    n = _BIG * 5 // 2
    with pylog.open(log_dir) as log:
        sent = _write(log, random.Random(n), shape, n, n, None)
        expected, stop = _expected(sent, policy)
        consumer = log.consumer(
            "t", auto_offset_reset="earliest", consumer_timeout_ms=0, on_deserialization_error=policy
        )
        got = []
        with pytest.raises(DeserializationError) if stop is not None else _nothing():
            got.extend(_shape(r) for r in consumer)
        assert got == expected
        consumer.close()


def test_poll_returns_a_whole_read_up_to_max_records_and_positions_follow(log_dir: str) -> None:
    n = _BIG * 3
    with pylog.open(log_dir) as log:
        sent = _write(log, random.Random(3), "fixed", n, n, None)
        consumer = log.consumer("t", auto_offset_reset="earliest", value_deserializer=None)
        got = consumer.poll(timeout_ms=1000, max_records=10 * n)[TP]
        assert [r.offset for r in got] == list(range(n))
        consumer.seek(TP, 5)
        it = iter(consumer)
        taken = [next(it) for _ in range(_BIG + 10)]  # past the first 1,024
        assert [r.offset for r in taken] == list(range(5, _BIG + 15))
        assert consumer.position(TP) == _BIG + 15
        consumer.seek(TP, _BIG + 3)  # back, into the records already fetched
        assert [r.value for r in consumer.poll(max_records=2)[TP]] == [sent[_BIG + 3][1], sent[_BIG + 4][1]]
        rest = consumer.poll(max_records=10 * n)[TP]
        assert rest[0].offset == _BIG + 5 and rest[-1].offset == n - 1 and len(rest) == n - _BIG - 5
        consumer.close()
