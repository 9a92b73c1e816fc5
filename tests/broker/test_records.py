"""pylog.broker.records against an independent implementation of Kafka's record batch v2 (kafka-python's
DefaultRecordBatch and its builder): both directions, every codec, and the checks on produced batches."""

from __future__ import annotations

import random
import struct
import zlib

import cramjam
import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from pylog.broker.records import MAX_RECORDS_BYTES, InvalidBatchError, decode_batches, encode_batch
from pylog.record import decode_lists, encode_headers
from pylog.record import encode_batch as encode_pylog

CODECS = {"none": 0, "gzip": 1, "lz4": 3, "zstd": 4}


def _model(n: int, seed: int) -> list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]]]]:
    rng = random.Random(seed)
    return [
        (
            1_700_000_000_000 + rng.randrange(-5000, 5000),
            None if i % 5 == 1 else rng.randbytes(rng.randrange(0, 40)),
            None if i % 6 == 2 else rng.choice([b"ab", b"xyz\x00"]) * rng.randrange(0, 800),  # compressible
            [(f"k{j}", rng.randbytes(j)) for j in range(i % 3)],
        )
        for i in range(n)
    ]


def _kafka_batch(records: list, codec: int) -> bytes:
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for i, (ts, key, value, headers) in enumerate(records):
        b.append(i, timestamp=ts, key=key, value=value, headers=headers)
    return bytes(b.build())


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_decode_matches_kafka_python(codec: str) -> None:
    records = _model(120, seed=CODECS[codec])
    [batch] = decode_batches(_kafka_batch(records, CODECS[codec]))
    assert batch.compression == CODECS[codec]
    assert list(
        zip(batch.timestamps, batch.keys, batch.values, batch.headers or [[]] * len(batch), strict=True)
    ) == [(ts, k, v, h) for ts, k, v, h in records]


def test_decode_snappy_xerial_and_raw() -> None:
    records = _model(50, seed=3)
    plain = _kafka_batch(records, 0)
    body = plain[61:]
    raw = bytes(cramjam.snappy.compress_raw(body))
    xerial = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for i in range(0, len(body), 1000):
        block = bytes(cramjam.snappy.compress_raw(body[i : i + 1000]))
        xerial += struct.pack(">i", len(block)) + block
    for compressed in (raw, xerial):
        batch = _rebuild(plain, 2, compressed)
        [decoded] = decode_batches(batch)
        assert decoded.values == [v for _, _, v, _ in records]


def _rebuild(plain: bytes, codec: int, body: bytes) -> bytes:
    """``plain`` with its records replaced by ``body`` compressed with ``codec`` (length and CRC fixed)."""
    import crc32c

    head = bytearray(plain[:61])
    struct.pack_into(">i", head, 8, 49 + len(body))
    struct.pack_into(">h", head, 21, codec)
    struct.pack_into(">I", head, 17, crc32c.crc32c(bytes(head[21:]) + body))
    return bytes(head) + body


def test_encode_is_read_by_kafka_python() -> None:
    records = _model(80, seed=9)
    pylog_batch = encode_pylog(
        1000,
        [k for _, k, _, _ in records],
        [v for _, _, v, _ in records],
        [ts for ts, _, _, _ in records],
        [encode_headers(h) for _, _, _, h in records],
    )
    kafka = encode_batch(decode_lists(pylog_batch))
    batch = DefaultRecordBatch(kafka)
    assert batch.validate_crc()
    got = [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]) for r in batch]
    assert got == [(1000 + i, ts, k, v, h) for i, (ts, k, v, h) in enumerate(records)]


def test_a_flipped_bit_is_refused() -> None:
    batch = bytearray(_kafka_batch(_model(10, seed=1), 0))
    for at in (30, 70, len(batch) - 1):
        bad = bytearray(batch)
        bad[at] ^= 0x10
        with pytest.raises(InvalidBatchError, match="CRC"):
            decode_batches(bytes(bad))
    with pytest.raises(InvalidBatchError):
        decode_batches(bytes(batch[:-3]))  # truncated
    wrong_magic = bytearray(batch)
    wrong_magic[16] = 1
    with pytest.raises(InvalidBatchError, match="magic"):
        decode_batches(bytes(wrong_magic))


def test_a_compression_bomb_is_refused_without_inflating_it() -> None:
    plain = _kafka_batch(_model(1, seed=1), 0)
    d = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"\0" * (1 << 20)
    bomb = b"".join(d.compress(chunk) for _ in range(MAX_RECORDS_BYTES // len(chunk) + 2)) + d.flush()
    with pytest.raises(InvalidBatchError, match="inflate past"):
        decode_batches(_rebuild(plain, 1, bomb))
