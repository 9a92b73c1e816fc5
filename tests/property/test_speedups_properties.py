"""The compiled per-record loops (``pylog._speedups``) and their pure-Python twins agree, on every input.

Hypothesis builds record batches with every feature of the format (null and empty keys and values, lengths
that need 1-, 2- and 4-byte length columns, headers, timestamps from the whole int64 range, gaps in the offsets
as compaction leaves them, the four codecs, transactional, control and LogAppendTime batches, producer fields),
in bytes, bytearray and memoryview buffers at any position, and checks that both paths give the same records.
The batch decoder is then fuzzed: random bytes, and valid batches with bytes changed, truncated or extended,
with the CRC fixed up afterwards so that the damage reaches the column checks behind it. Both paths must give
the same result, or raise the same pylog error (CorruptRecordError, UnsupportedFormatError): never another
exception, and never a crash of the process (``make sanitize`` runs this file under AddressSanitizer).

The compiled module is imported directly, so these tests compare both paths even when ``PYLOG_PURE_PYTHON``
forces the pure one for the rest of pylog; they are skipped when the extension is not built.
"""

from __future__ import annotations

import importlib
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pylog import fetcher, record
from pylog.errors import CorruptRecordError, UnsupportedFormatError
from pylog.record import crc32c, encode_batch, encode_headers
from pylog.structs import NO_HEADERS, ConsumerRecord, TopicPartition

try:
    speedups: Any = importlib.import_module("pylog._speedups")
except ImportError:  # pragma: no cover - a build without a C compiler
    pytest.skip("pylog._speedups is not built", allow_module_level=True)
record._configure_compiled(speedups)

FUZZ_EXAMPLES = int(os.environ.get("PYLOG_FUZZ_EXAMPLES", "300"))
_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
TYPED = (CorruptRecordError, UnsupportedFormatError)
INTERESTING = [0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF]  # edges of signed and unsigned column values

blobs = st.one_of(
    st.none(),
    st.binary(max_size=40),
    st.binary(min_size=120, max_size=300),  # a 2-byte length column
)
header_lists = st.lists(
    st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))), max_size=3
)
int64s = st.integers(-(1 << 63), (1 << 63) - 1)


@st.composite
def batches(draw: st.DrawFn) -> tuple[bytes, dict[str, Any]]:
    """A batch built by the pure-Python encoder, and the arguments it was built from."""
    n = draw(st.integers(1, 50))  # both sides of record._SMALL (32)
    keys = draw(st.lists(blobs, min_size=n, max_size=n))
    values = draw(st.lists(blobs, min_size=n, max_size=n))
    if draw(st.booleans()) and values[0] is not None:
        values[0] = bytes(draw(st.integers(32768, 40000)))  # a 4-byte length column
    headers = None
    if draw(st.booleans()):
        headers = [encode_headers(h) for h in draw(st.lists(header_lists, min_size=n, max_size=n))]
    base_ts = draw(int64s)
    spans = draw(
        st.sampled_from([0, 200, 60_000, 1 << 31, (1 << 63) - 1 - max(base_ts, 0)])
    )  # 0, 1, 2, 4 and 8-byte timestamp columns
    spans = max(0, min(spans, (1 << 63) - 1 - base_ts))
    timestamps = [base_ts + draw(st.integers(0, spans)) for _ in range(n)]
    offset_deltas = None
    if draw(st.booleans()):
        gaps = draw(st.lists(st.integers(1, 70000), min_size=n - 1, max_size=n - 1))
        deltas = [0]
        for g in gaps:
            deltas.append(deltas[-1] + g)
        offset_deltas = np.asarray(deltas, dtype=np.int64)
    fields = {
        "compression": draw(st.sampled_from(["none", "none", "gzip", "lz4", "zstd"])),
        "log_append_time": draw(st.booleans()),
        "transactional": draw(st.booleans()),
        "control": draw(st.booleans()),
        "producer_id": draw(st.integers(-1, 1 << 40)),
        "producer_epoch": draw(st.integers(-1, 32767)),
        "base_sequence": draw(st.integers(-1, 1 << 30)),
    }
    base_offset = draw(st.integers(0, 1 << 62))
    buf = encode_batch(base_offset, keys, values, timestamps, headers, offset_deltas=offset_deltas, **fields)
    args = (base_offset, keys, values, timestamps, headers)
    return buf, {"args": args, "offset_deltas": offset_deltas, **fields}


def _decode(fn: Any, buf: Any, position: int) -> tuple[str, Any]:
    """``("ok", result)`` or ``("error", its class)``; any exception but pylog's typed ones fails the test."""
    try:
        return "ok", fn(buf, position)
    except TYPED as exc:
        return "error", type(exc)


def _pure(buf: Any, position: int) -> Any:
    return tuple(record._decode_lists_pure(buf, position))


def _compiled(buf: Any, position: int) -> Any:
    return tuple(speedups.decode_lists(buf, position)[:6])


def _direct(buf: Any, position: int) -> Any:
    return speedups.decode_records(buf, position, 0, ConsumerRecord, "t", 3)


def _check_same(buf: Any, position: int) -> tuple[str, Any]:
    pure, compiled = _decode(_pure, buf, position), _decode(_compiled, buf, position)
    assert pure == compiled
    direct = _decode(_direct, buf, position)  # the consumer's one-call path: the same verdict
    assert direct[0] == pure[0]
    if pure[0] == "error":
        assert direct[1] == pure[1]
    else:
        assert [r.offset for r in direct[1]] == pure[1][1] and [r.value for r in direct[1]] == pure[1][4]
    if pure[0] == "ok":  # records without headers share the read-only empty list on both paths
        for a, b in zip(pure[1][5], compiled[1][5], strict=True):
            assert (a is NO_HEADERS) == (b is NO_HEADERS)
    return pure


@_SETTINGS
@given(
    batches(), st.sampled_from([bytes, bytearray, memoryview]), st.binary(max_size=9), st.binary(max_size=9)
)
def test_both_paths_decode_the_same_records(
    batch: tuple[bytes, dict[str, Any]], kind: Any, before: bytes, after: bytes
) -> None:
    buf, sent = batch
    outcome, lists = _check_same(kind(before + buf + after), len(before))
    assert outcome == "ok"
    header, offsets, timestamps, keys, values, headers = lists
    _, keys_sent, values_sent, timestamps_sent, headers_sent = sent["args"]
    assert keys == keys_sent and values == values_sent and timestamps == timestamps_sent
    assert all(type(k) is bytes for k in keys + values if k is not None)
    assert offsets[0] == header.base_offset and offsets[-1] == header.last_offset
    blobs_sent = headers_sent or [b""] * len(keys)
    assert headers == [record.decode_headers(b) if b else [] for b in blobs_sent]
    # the extra columns a consumer's records are built from
    full = speedups.decode_lists(kind(before + buf + after), len(before))
    assert full[6] == fetcher._sizes(keys) and full[7] == fetcher._sizes(values)
    if any(v is None for v in values):
        assert full[8] is None
    else:
        assert bytes(full[8]) == b"".join(values)  # type: ignore[arg-type]
    assert header == record.decode_header(buf)


@_SETTINGS
@given(batches(), st.sampled_from([list, tuple, "array"]))
def test_both_paths_encode_the_same_bytes(batch: tuple[bytes, dict[str, Any]], ts_kind: Any) -> None:
    """The compiled encoder (dense batches of bytes keys and values) builds byte for byte what the pure one
    does, whatever container the timestamps come in."""
    _, sent = batch
    base_offset, keys, values, timestamps, headers = sent.pop("args")
    ts = np.asarray(timestamps, dtype=np.int64) if ts_kind == "array" else ts_kind(timestamps)
    pure = record._encode_batch_pure(base_offset, keys, values, ts, headers, **sent)
    assert record.encode_batch(base_offset, keys, values, ts, headers, **sent) == pure
    if sent["offset_deltas"] is None:  # the compiled encoder's own answer (not a fallback to the pure one)
        assert _compiled_encode(base_offset, keys, values, timestamps, headers, sent) == pure


def _compiled_encode(
    base_offset: int, keys: Any, values: Any, timestamps: list[int], headers: Any, fields: dict[str, Any]
) -> Any:
    attributes = (
        record.COMPRESSION_CODES[fields["compression"]]
        | (record.ATTR_LOG_APPEND_TIME if fields["log_append_time"] else 0)
        | (record.ATTR_TRANSACTIONAL if fields["transactional"] else 0)
        | (record.ATTR_CONTROL if fields["control"] else 0)
    )
    out = speedups.encode_batch(
        base_offset,
        keys,
        values,
        list(timestamps),
        headers,
        attributes,
        fields["producer_id"],
        fields["producer_epoch"],
        fields["base_sequence"],
        False,
    )
    assert out is not NotImplemented
    return out


@_SETTINGS
@given(
    blobs,
    blobs,
    int64s,
    st.integers(-1, 1 << 40),
    st.integers(-1, 32767),
    st.integers(-1, 1 << 30),
    st.booleans(),
)
def test_both_paths_encode_one_record_the_same(
    key: bytes | None, value: bytes | None, ts: int, pid: int, epoch: int, seq: int, txn: bool
) -> None:
    pure = record._encode_one_pure(key, value, ts, pid, epoch, seq, txn)
    compiled = record.encode_one(key, value, ts, pid, epoch, seq, txn)
    assert type(compiled) is bytearray and compiled == pure
    assert bytes(compiled) == record._encode_batch_pure(
        0, [key], [value], [ts], producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=txn
    )


def test_the_compiled_encoder_leaves_other_inputs_to_the_pure_one() -> None:
    """Keys or values that are not bytes, timestamps beyond int64, no records: NotImplemented, and
    record.encode_batch gives what the pure encoder gives."""
    cases: list[tuple[list[Any], list[Any], list[Any]]] = [
        ([bytearray(b"k")], [b"v"], [1]),
        ([b"k"], [memoryview(b"v")], [1]),
        ([b"k"], [b"v"], [1 << 64]),
        ([b"k"], [b"v"], ["1"]),
        ([], [], []),
        ([b"k", b"k"], [b"v"], [1, 2]),
    ]
    for keys, values, ts in cases:
        got = speedups.encode_batch(0, keys, values, ts, None, 0, -1, -1, -1, False)
        assert got is NotImplemented, (keys, values, ts)
    assert record.encode_batch(0, [bytearray(b"k")], [b"v"], [1]) == record._encode_batch_pure(
        0, [bytearray(b"k")], [b"v"], [1]
    )


@contextmanager
def _pure_fetcher() -> Iterator[None]:
    with mock.patch.object(fetcher, "_core", None):
        yield


@_SETTINGS
@given(batches(), st.integers(0, 60))
def test_both_paths_build_the_same_consumer_records(batch: tuple[bytes, dict[str, Any]], skip: int) -> None:
    """What a consumer returns for a batch (from any offset in it), built by each path."""
    buf, _ = batch
    header = record.decode_header(buf)
    tp = TopicPartition("t", 3)
    start = header.base_offset + skip

    def records() -> list[ConsumerRecord]:
        c = fetcher._Columns(header, buf, 0)
        if c.offsets[0] < start:
            c.drop_before(start)
        return fetcher._build(tp, c, c.keys, c.values)

    compiled = records()
    with _pure_fetcher():
        pure = records()
    assert compiled == pure
    direct = speedups.decode_records(buf, 0, start, ConsumerRecord, tp.topic, tp.partition)
    assert direct == pure and all(type(r) is ConsumerRecord for r in direct)
    assert all(type(r) is ConsumerRecord for r in compiled)
    assert [r.offset for r in compiled] == sorted(r.offset for r in compiled)


def _fix_crc(buf: bytearray, position: int) -> None:
    """Recompute the CRC of a (damaged) batch, so that the checks behind the CRC are what is tested."""
    if len(buf) < position + 16:
        return
    (length,) = struct.unpack_from("<i", buf, position + 8)
    end = position + length
    if length >= 16 and end <= len(buf):
        struct.pack_into("<I", buf, position + 12, crc32c(memoryview(buf)[position + 16 : end]))


@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batches(), st.sampled_from(["bytes", "columns", "truncate", "extend", "length"]), st.data())
def test_fuzz_damaged_batches_give_the_same_typed_error_or_records(
    batch: tuple[bytes, dict[str, Any]], how: str, data: st.DataObject
) -> None:
    buf = bytearray(batch[0])
    values = st.one_of(st.sampled_from(INTERESTING), st.integers(0, 255))
    fix_crc = data.draw(st.booleans())
    if how == "bytes":
        for _ in range(data.draw(st.integers(1, 4))):
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(values)
    elif how == "columns":  # the fixed-width columns of an uncompressed payload (lengths, deltas, timestamps)
        h = record.decode_header(buf)
        assume(not h.attributes & record.ATTR_COMPRESSION_MASK)
        end = 72 + h.record_count * sum(record.LAYOUT.unpack_from(buf, 64))
        for _ in range(data.draw(st.integers(1, 3))):
            buf[data.draw(st.integers(72, end - 1))] = data.draw(values)
        fix_crc = True
    elif how == "truncate":
        del buf[data.draw(st.integers(0, len(buf) - 1)) :]
    elif how == "extend":
        buf += data.draw(st.binary(min_size=1, max_size=8))
    else:  # a header field that sizes something: batch, payload length, record count, a layout width
        buf[data.draw(st.sampled_from([8, 9, 56, 57, 60, 61, 64, 65, 66, 67, 68, 20]))] = data.draw(values)
    if fix_crc:
        _fix_crc(buf, 0)
    _check_same(bytes(buf), 0)


@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(st.binary(min_size=0, max_size=200), st.integers(-3, 210))
def test_fuzz_random_bytes_give_a_typed_error(data: bytes, position: int) -> None:
    if position < 0:  # the compiled decoder refuses a negative position as a truncated header
        with pytest.raises(CorruptRecordError):
            speedups.decode_lists(data, position)
        return
    _check_same(data, position)


widths = st.sampled_from([0, 1, 2, 4, 8, 3, 255])


@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(
    st.tuples(widths, widths, widths, widths, widths),
    st.binary(max_size=160),
    st.integers(1, 40),
    st.integers(0, 255),
)
def test_fuzz_forged_payloads_behind_a_valid_header_and_crc(
    layout: tuple[int, int, int, int, int], rest: bytes, n: int, attributes: int
) -> None:
    """A header that passes every check and a valid CRC over a forged payload (its column widths drawn, the
    rest random): only the column checks stand between the payload and the decoder's reads (a malicious
    frame, a forged CRC)."""
    payload = record.LAYOUT.pack(*layout) + rest
    head = record.HEADER.pack(
        5, 64 + len(payload), 0, 1, 0, attributes & 0x38, n - 1, 0, 0, -1, -1, 0, -1, n, len(payload)
    )
    buf = bytearray(head + payload)
    _fix_crc(buf, 0)
    _check_same(bytes(buf), 0)


def _patched(keys: list[bytes | None], at: int, raw: bytes, timestamps: list[int] | None = None) -> bytes:
    """A batch of ``keys`` (values b"v") with ``raw`` written at payload position ``at``, CRC fixed."""
    n = len(keys)
    buf = bytearray(encode_batch(7, keys, [b"v"] * n, timestamps or [10] * n))
    buf[64 + at : 64 + at + len(raw)] = raw
    _fix_crc(buf, 0)
    return bytes(buf)


@pytest.mark.parametrize(
    ("name", "buf"),
    [
        pytest.param("a key length of -2", _patched([None, b"ab"], 8, b"\xfe"), id="a key length of -2"),
        pytest.param("a key length of -128", _patched([None, b"ab"], 8, b"\x80"), id="a key length of -128"),
        pytest.param(
            "a key length one too long", _patched([b"a", b"ab"], 8, b"\x02"), id="a key length one too long"
        ),
        pytest.param(
            "a timestamp column width of 3",
            _patched([b"a", b"b"], 0, b"\x03"),
            id="a timestamp column width of 3",
        ),
        pytest.param(
            "a key column width of 0", _patched([b"a", b"b"], 2, b"\x00"), id="a key column width of 0"
        ),
        pytest.param(
            "a header column width of 8", _patched([b"a", b"b"], 4, b"\x08"), id="a header column width of 8"
        ),
        pytest.param(
            "an offset delta column on a dense batch",
            _patched([b"a", b"b"], 1, b"\x01"),
            id="an offset delta column on a dense batch",
        ),
        pytest.param(
            "a timestamp delta beyond max_timestamp",
            _patched([b"a", b"b"], 9, b"\x09", [10, 12]),
            id="a timestamp delta beyond max_timestamp",
        ),
        pytest.param("no delta of 0", _patched([b"a", b"b"], 8, b"\x01", [10, 12]), id="no delta of 0"),
    ],
)
def test_both_paths_refuse_each_damage_of_the_columns(name: str, buf: bytes) -> None:
    """Each check behind the CRC, on its own: both paths raise CorruptRecordError."""
    assert _check_same(buf, 0) == ("error", CorruptRecordError), name


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=5000))
def test_the_native_crc32c_is_the_crc32c_packages(data: bytes) -> None:
    """Short buffers are summed natively (SSE 4.2), long ones by the crc32c package: the same CRC-32C."""
    assert speedups.crc32c(data) == crc32c(data)
    for cut in (0, 1, 7, 8, 9, 4095, 4096, 4097):
        assert speedups.crc32c(data[:cut]) == crc32c(data[:cut])


# -- Kafka record batch v2 <-> pylog (the broker's translation, pylog.broker.records) --------------------------

kafka_headers = st.lists(
    st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=12))), max_size=3
)


@st.composite
def kafka_record_lists(draw: st.DrawFn) -> Any:
    """A pylog batch's records as lists (what the broker's fetch translates), with Kafka headers."""
    n = draw(st.integers(1, 40))
    base = draw(st.integers(0, 1 << 62))
    base_ts = draw(int64s)
    top = (1 << 63) - 1 - base_ts
    timestamps = [base_ts + draw(st.sampled_from([0, 1, 300, 1 << 20, 1 << 40, top])) for _ in range(n)]
    timestamps = [min(t, (1 << 63) - 1) for t in timestamps]
    offsets = [base + i * draw(st.sampled_from([1, 2, 1000])) for i in range(n)]
    keys = draw(st.lists(blobs, min_size=n, max_size=n))
    values = draw(st.lists(blobs, min_size=n, max_size=n))
    headers = draw(st.lists(st.one_of(st.just(NO_HEADERS), kafka_headers), min_size=n, max_size=n))
    header = record.BatchHeader(
        base, 0, 0, 1, 0, 0, offsets[-1] - base, base_ts, max(timestamps), -1, -1, 0, -1, n, 0
    )
    return record.RecordLists(header, offsets, timestamps, keys, values, headers)


@_SETTINGS
@given(kafka_record_lists())
def test_both_paths_write_the_same_kafka_records(lists: Any) -> None:
    from pylog.broker import records as kafka

    compiled = speedups.kafka_encode_records(
        lists.header.base_offset, lists.header.base_timestamp, *[list(c) for c in lists[1:]]
    )
    pure = kafka._encode_records_pure(lists)
    assert kafka.encode_batch(lists)[kafka.BATCH_OVERHEAD :] == pure
    if compiled is NotImplemented:  # a timestamp delta beyond int64: left to the pure-Python writer
        assert max(lists.timestamps) - lists.header.base_timestamp >= 1 << 63
    else:
        assert compiled == pure


def _kafka_decode(fn: Any, raw: bytes, count: int, base_ts: int) -> tuple[str, Any]:
    from pylog.broker import records as kafka

    try:
        return "ok", fn(raw, count, base_ts)
    except kafka.InvalidBatchError:
        return "error", None


def _kafka_compiled(raw: bytes, count: int, base_ts: int) -> Any:
    from pylog.broker import records as kafka

    try:
        got = speedups.kafka_decode_records(raw, count, base_ts)
    except ValueError as exc:
        raise kafka.InvalidBatchError(str(exc)) from exc
    return kafka._records_pure(raw, count, base_ts) if got is NotImplemented else got


@_SETTINGS
@given(kafka_record_lists(), st.data())
def test_both_paths_read_the_same_kafka_records_or_refuse_them(lists: Any, data: st.DataObject) -> None:
    """The records section a fetch writes, read back by both paths (offsets made dense, as produce requires),
    then damaged: bytes changed, cut, extended, or the record count off by one."""
    from pylog.broker import records as kafka

    n = len(lists.offsets)
    dense = lists._replace(offsets=list(range(lists.header.base_offset, lists.header.base_offset + n)))
    raw = bytearray(kafka._encode_records_pure(dense))
    base_ts = lists.header.base_timestamp
    pure = _kafka_decode(kafka._records_pure, bytes(raw), n, base_ts)
    assert pure == _kafka_decode(_kafka_compiled, bytes(raw), n, base_ts)
    assert pure[0] == "ok" and pure[1][1] == lists.keys and pure[1][2] == lists.values
    how = data.draw(st.sampled_from(["bytes", "cut", "extend", "count"]))
    count = n
    if how == "bytes":
        for _ in range(data.draw(st.integers(1, 3))):
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(
                st.one_of(st.sampled_from(INTERESTING), st.integers(0, 255))
            )
    elif how == "cut":
        del raw[data.draw(st.integers(0, len(raw) - 1)) :]
    elif how == "extend":
        raw += data.draw(st.binary(min_size=1, max_size=6))
    else:
        count = n + data.draw(st.sampled_from([-1, 1]))
    assert _kafka_decode(kafka._records_pure, bytes(raw), count, base_ts) == _kafka_decode(
        _kafka_compiled, bytes(raw), count, base_ts
    )


@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(st.binary(max_size=120), st.integers(0, 12), int64s)
def test_fuzz_kafka_records_from_random_bytes(raw: bytes, count: int, base_ts: int) -> None:
    """A malicious Produce request's records: both paths read the same or refuse with InvalidBatchError."""
    from pylog.broker import records as kafka

    assert _kafka_decode(kafka._records_pure, raw, count, base_ts) == _kafka_decode(
        _kafka_compiled, raw, count, base_ts
    )


msgpack_objects = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 40), 1 << 40)
    | st.text(max_size=40)
    | st.binary(max_size=300),
    lambda inner: st.lists(inner, max_size=20),
    max_leaves=25,
)


@_SETTINGS
@given(
    st.lists(
        st.one_of(
            header_lists.map(encode_headers),  # what encode_headers writes
            st.tuples(header_lists.map(encode_headers), st.binary(min_size=1, max_size=3)).map(
                lambda t: t[0] + t[1]  # with bytes after it
            ),
            header_lists.map(encode_headers).map(lambda b: b[:-1]),  # cut short
            msgpack_objects.map(lambda o: msgpack.packb(o, use_bin_type=True)),  # any msgpack
            st.lists(st.lists(msgpack_objects, min_size=2, max_size=2), max_size=3).map(
                lambda o: msgpack.packb(o, use_bin_type=False)  # pairs, but str for bytes
            ),
            st.binary(max_size=30),  # not msgpack at all
        ),
        min_size=1,
        max_size=12,
    )
)
def test_both_paths_decode_the_same_headers_or_refuse_them(blobs_: list[bytes]) -> None:
    """Header blobs as encode_headers writes them, as other msgpack encoders could, and damaged: the compiled
    reader takes what encode_headers writes and leaves the rest to record.decode_headers, so both paths give
    the same headers or the same CorruptRecordError."""
    n = len(blobs_)
    buf = encode_batch(0, [b"k"] * n, [b"v"] * n, [1] * n, blobs_)
    _check_same(buf, 0)


@_SETTINGS
@given(
    st.one_of(
        header_lists,
        header_lists.map(tuple),
        st.lists(
            st.lists(st.text(max_size=300), min_size=2, max_size=2).map(lambda kv: [kv[0], kv[1].encode()])
        ),
        st.lists(st.tuples(st.text(max_size=3), st.binary(min_size=250, max_size=70000)), max_size=2),
        st.lists(st.tuples(st.text(max_size=3), st.one_of(st.binary(), st.none())), min_size=15, max_size=17),
        st.lists(
            st.tuples(
                st.text(max_size=3), st.one_of(st.integers(), st.text(max_size=2), st.binary().map(bytearray))
            )
        ),
        st.lists(st.one_of(st.tuples(st.text()), st.text(max_size=2), st.none()), min_size=1, max_size=2),
        st.one_of(
            st.none(), st.text(max_size=3), st.dictionaries(st.text(max_size=2), st.binary(max_size=2))
        ),
    )
)
def test_both_paths_encode_the_same_headers_or_refuse_them(headers: Any) -> None:
    """Header lists of every size class of msgpack (fix, 8, 16, 32-bit lengths), and what encode_headers
    refuses or converts: the compiled packer gives the same bytes, or leaves it to the Python code."""
    from pylog.errors import SerializationError

    def run(fn: Any) -> tuple[str, Any]:
        try:
            return "ok", fn(headers)
        except SerializationError:
            return "error", SerializationError

    def pure(h: Any) -> Any:
        with mock.patch.object(record, "_core", None):
            return record.encode_headers(h)

    compiled = run(record.encode_headers)
    assert compiled == run(pure)
    if compiled[0] == "ok" and speedups.encode_headers(headers) is not NotImplemented:
        assert speedups.encode_headers(headers) == compiled[1]


@pytest.mark.parametrize("pure", [False, True], ids=["compiled", "pure"])
@pytest.mark.parametrize(
    "blob",
    [
        msgpack.packb([[0, 0]]),
        msgpack.packb([["k", 5]]),
        msgpack.packb([["k", "text"]]),
        msgpack.packb([[1, b"v"]]),
    ],
    ids=["int key and value", "int value", "str value", "int key"],
)
def test_a_forged_header_that_is_not_a_str_bytes_pair_is_a_corrupt_record(
    tmp_path: Any, blob: bytes, pure: bool
) -> None:
    """Headers decode to (str, bytes | None) pairs or the record is corrupt: a consumer raised TypeError
    (serialized_header_size took len() of an int) or returned a header value that is not bytes."""
    import pylog

    buf = encode_batch(0, [b"k", b"k"], [b"v", b"w"], [1, 1], [b"", blob])
    with pylog.open(str(tmp_path / "log")) as log:
        log.create_topic("t", 1)
        log.topic("t").partition(0).append(bytearray(buf))
        consumer = log.consumer(
            "t", auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None
        )
        with (
            mock.patch.object(fetcher, "_core", None if pure else speedups),
            mock.patch.object(consumer._fetcher, "_direct", not pure),
            mock.patch.object(record, "_core", None if pure else speedups),
            pytest.raises(CorruptRecordError, match="not a \\(str, bytes\\) pair"),
        ):
            list(consumer)
        consumer.close()


@_SETTINGS
@given(batches(), st.sampled_from(["none", "bytes", "columns", "cut"]), st.data())
def test_both_paths_translate_a_stored_batch_to_the_same_kafka_batch(
    batch: tuple[bytes, dict[str, Any]], how: str, data: st.DataObject
) -> None:
    """The broker's fetch: a stored pylog batch (any kind, or damaged behind a fixed-up CRC) becomes the same
    Kafka batch through the one-pass C writer as through decode_lists + encode_batch, or the same error."""
    from pylog.broker import records as kafka

    buf = bytearray(batch[0])
    if how == "bytes":
        buf[data.draw(st.integers(64, len(buf) - 1))] = data.draw(st.sampled_from(INTERESTING))
    elif how == "columns":
        h = record.decode_header(buf)
        end = 72 + h.record_count * sum(record.LAYOUT.unpack_from(buf, 64))
        if not h.attributes & record.ATTR_COMPRESSION_MASK and end > 72:
            buf[data.draw(st.integers(72, end - 1))] = data.draw(st.sampled_from(INTERESTING))
    elif how == "cut":
        del buf[data.draw(st.integers(64, len(buf) - 1)) :]
    _fix_crc(buf, 0)

    def pure(b: bytes, at: int) -> bytes:
        return kafka.encode_batch(record._decode_lists_pure(b, at))

    expected = _decode(pure, bytes(buf), 0)
    assert _decode(kafka.from_pylog, bytes(buf), 0) == expected
    got = speedups.kafka_from_pylog(bytes(buf), 0) if expected[0] == "ok" else NotImplemented
    if got is not NotImplemented:  # the C writer's own answer, not a fallback
        assert kafka._frame(got[0], got[1], got[0].record_count, 0) == expected[1]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_both_paths_hash_keys_the_same(data: bytes) -> None:
    from pylog.partitioner import murmur2_py

    assert speedups.murmur2(data) == murmur2_py(data)
    assert speedups.murmur2(bytearray(data)) == murmur2_py(data)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.lists(int64s, min_size=5, max_size=5), st.booleans()), min_size=1, max_size=6))
def test_both_paths_publish_the_same_state(publishes: list[tuple[list[int], bool]]) -> None:
    """The compiled seqlock publish writes the same 128 bytes as the pure one, returns the same seq, and
    clears the doorbell's ``waiting`` flag when a reader set it."""
    import tempfile

    from pylog.partition import state as state_mod
    from pylog.partition.doorbell import WAITING_AT

    with tempfile.TemporaryDirectory() as d:
        compiled = state_mod.PartitionState(os.path.join(d, "compiled"))
        pure = state_mod.PartitionState(os.path.join(d, "pure"))
        try:
            for values, waiting in publishes:
                for s in (compiled, pure):
                    s._map[WAITING_AT] = int(waiting)
                with mock.patch.object(state_mod, "_publish", speedups.state_publish):
                    seq_c = compiled.publish_values(*values)
                with mock.patch.object(state_mod, "_publish", None):
                    seq_p = pure.publish_values(*values)
                assert seq_c == seq_p == compiled.seq
                assert bytes(compiled._map) == bytes(pure._map)
                assert compiled._map[WAITING_AT] == 0
                assert compiled.read() == state_mod.Snapshot(*values)
        finally:
            compiled.close()
            pure.close()
