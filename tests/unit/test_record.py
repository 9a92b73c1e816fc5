"""The record batch codec (pylog.record): the documented byte layout, round trips through both decoders, and
that corrupt input only ever raises CorruptRecordError/UnsupportedFormatError (fuzzed with random bytes and
with mutations of valid batches, with and without a re-forged CRC)."""

from __future__ import annotations

import itertools
import struct
import tracemalloc
from dataclasses import dataclass

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pylog import record
from pylog.errors import CorruptRecordError, InvalidRecordError, UnsupportedFormatError
from pylog.record import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    RecordLists,
    crc32c,
    decode_batch,
    decode_header,
    decode_lists,
    encode_batch,
    encode_columns,
    encode_headers,
)

TYPED = (CorruptRecordError, UnsupportedFormatError)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
I64_MAX = 2**63 - 1


def forge_crc(buf: bytes | bytearray, position: int = 0) -> bytes:
    """Recompute the CRC of the batch at ``position`` so a mutation reaches the checks behind the CRC."""
    out = bytearray(buf)
    length = struct.unpack_from("<i", out, position + 8)[0]
    end = min(len(out), position + max(length, 16))
    struct.pack_into("<I", out, position + 12, crc32c(bytes(out[position + 16 : end])))
    return bytes(out)


def set_field(buf: bytes, offset: int, fmt: str, value: int, *, forge: bool = True) -> bytes:
    out = bytearray(buf)
    struct.pack_into(fmt, out, offset, value)
    return forge_crc(out) if forge else bytes(out)


@dataclass
class Records:
    keys: list[bytes | None]
    values: list[bytes | None]
    timestamps: list[int]
    headers: list[list[tuple[str, bytes]]] | None


blobs = st.one_of(st.none(), st.binary(max_size=24), st.binary(min_size=120, max_size=400))
header_lists = st.lists(st.tuples(st.text(max_size=6), st.binary(max_size=12)), max_size=3)


@st.composite
def records(draw: st.DrawFn, max_size: int = 60) -> Records:
    n = draw(st.integers(1, max_size))
    keys = draw(st.lists(blobs, min_size=n, max_size=n))
    values = draw(st.lists(blobs, min_size=n, max_size=n))
    base = draw(st.integers(0, 2**62))
    spread = draw(st.sampled_from([0, 200, 60_000, 2**31, 2**40, I64_MAX - 2**62]))
    timestamps = draw(st.lists(st.integers(base, base + spread), min_size=n, max_size=n))
    headers = draw(st.none() | st.lists(header_lists, min_size=n, max_size=n))
    return Records(keys, values, timestamps, headers)


def encode(r: Records, base_offset: int = 0, **kw: object) -> bytes:
    blobs_ = None if r.headers is None else [encode_headers(h) for h in r.headers]
    return encode_batch(base_offset, r.keys, r.values, r.timestamps, blobs_, **kw)  # type: ignore[arg-type]


def assert_decodes_to(raw: bytes, r: Records, base_offset: int = 0, position: int = 0) -> None:
    b = decode_batch(raw, position)
    lists = decode_lists(raw, position)
    n = len(r.keys)
    want_headers = [list(h) for h in r.headers] if r.headers is not None else [[] for _ in range(n)]
    assert b.header == lists.header
    assert b.offsets.tolist() == lists.offsets == list(range(base_offset, base_offset + n))
    assert b.timestamps.tolist() == lists.timestamps == r.timestamps
    assert b.keys() == lists.keys == r.keys
    assert b.values() == lists.values == r.values
    assert [list(h) for h in b.headers()] == [list(h) for h in lists.headers] == want_headers
    assert b.header.record_count == n and b.header.last_offset == base_offset + n - 1
    assert b.header.base_timestamp == min(r.timestamps) and b.header.max_timestamp == max(r.timestamps)


# -- layout ------------------------------------------------------------------------------------------------


def test_header_fields_sit_where_the_table_says() -> None:
    raw = encode_batch(
        0,
        [b"ab", None, b""],
        [b"x", b"yz", None],
        [100, 100, 105],
        producer_id=77,
        producer_epoch=3,
        base_sequence=9,
        transactional=True,
    )
    assert HEADER_SIZE == 64 and HEADER.size == 64 and MAGIC == 1
    payload = (
        bytes(
            [
                *(
                    1,
                    0,
                    1,
                    1,
                    0,
                    0,
                    0,
                    0,
                ),  # ts_width 1, dense offsets, key/value widths 1, no headers, reserved
                *(0, 0, 5),  # timestamp deltas
                *(2, 0xFF, 0),  # key lengths 2, -1, 0
                *(1, 2, 0xFF),  # value lengths 1, 2, -1
            ]
        )
        + b"abxyz"
    )
    assert raw[HEADER_SIZE:] == payload
    u = struct.unpack_from
    assert u("<q", raw, 0)[0] == 0  # base_offset
    assert u("<i", raw, 8)[0] == len(raw)  # batch_length
    assert u("<I", raw, 12)[0] == crc32c(raw[16:])  # crc over [16, batch_length)
    assert (raw[16], raw[17]) == (MAGIC, 0)
    assert u("<h", raw, 18)[0] == record.ATTR_TRANSACTIONAL
    assert u("<i", raw, 20)[0] == 2  # last_offset_delta
    assert u("<qq", raw, 24) == (100, 105)  # base and max timestamp
    assert u("<qhHi", raw, 40) == (77, 3, 0, 9)  # producer id, epoch, reserved, base_sequence
    assert u("<ii", raw, 56) == (3, len(payload))  # record_count, payload_length
    assert decode_header(raw) == HEADER.unpack(raw[:64])


def test_base_offset_is_outside_the_crc() -> None:
    raw = encode_batch(0, [b"k"], [b"v"], [1])
    moved = set_field(raw, 0, "<q", 12345, forge=False)
    assert decode_batch(moved).offsets.tolist() == [12345]
    assert decode_lists(moved).offsets == [12345]


def test_attributes_and_header_properties() -> None:
    raw = encode_batch(0, [b"k"] * 40, [b"v"] * 40, [5] * 40, compression="zstd", log_append_time=True)
    h = decode_header(raw)
    assert h.compression == "zstd" and h.timestamp_type == 1
    assert h.attributes == record.COMPRESSION_CODES["zstd"] | record.ATTR_LOG_APPEND_TIME
    ctl = decode_header(encode_batch(0, [b"k"], [b"v"], [5], control=True))
    assert ctl.attributes == record.ATTR_CONTROL and ctl.compression == "none" and ctl.timestamp_type == 0
    assert h.next_offset == h.last_offset + 1 == 40


@pytest.mark.parametrize(
    ("timestamps", "ts_width"),
    [([7] * 3, 0), ([7, 8, 262], 1), ([7, 7 + 65535, 7], 2), ([0, 2**32 - 1, 1], 4), ([0, 2**32, 2], 8)],
)
def test_timestamp_column_width_is_the_smallest_that_fits(timestamps: list[int], ts_width: int) -> None:
    for n_extra in (0, 40):  # struct-only and numpy encoders
        ts = timestamps + [timestamps[0]] * n_extra
        raw = encode_batch(0, [None] * len(ts), [b"v"] * len(ts), ts)
        assert raw[HEADER_SIZE] == ts_width
        assert decode_batch(raw).timestamps.tolist() == ts == decode_lists(raw).timestamps


@pytest.mark.parametrize(("length", "width"), [(0, 1), (127, 1), (128, 2), (32767, 2), (32768, 4)])
def test_length_column_width_is_the_smallest_signed_that_fits(length: int, width: int) -> None:
    value = b"\x01" * length
    raw = encode_batch(0, [value], [value], [1])
    assert raw[HEADER_SIZE + 2] == raw[HEADER_SIZE + 3] == width
    assert decode_batch(raw).values() == [value] == decode_lists(raw).keys


# -- round trips -------------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(r=records(), base_offset=st.integers(0, 2**40))
def test_round_trip_both_decoders(r: Records, base_offset: int) -> None:
    raw = encode(r, base_offset)
    assert_decodes_to(raw, r, base_offset)


@settings(max_examples=100, deadline=None)
@given(r=records(max_size=40), codec=st.sampled_from(["none", "gzip", "snappy", "lz4", "zstd"]))
def test_struct_encoder_equals_numpy_encoder_and_codecs_round_trip(r: Records, codec: str) -> None:
    blobs_ = None if r.headers is None else [encode_headers(h) for h in r.headers]
    raw = encode_batch(0, r.keys, r.values, r.timestamps, blobs_, compression=codec)

    def lens(items: list[bytes | None]) -> np.ndarray:
        return np.array([-1 if x is None else len(x) for x in items], dtype=np.int64)

    header_lens = None if blobs_ is None or not any(blobs_) else lens(list(blobs_))
    columns = encode_columns(
        0,
        lens(r.keys),
        b"".join(k for k in r.keys if k),
        lens(r.values),
        b"".join(v for v in r.values if v),
        np.array(r.timestamps, dtype=np.int64),
        header_lens,
        b"".join(blobs_) if header_lens is not None and blobs_ else b"",
        compression=codec,
    )
    assert raw == columns
    assert decode_header(raw).compression == codec
    assert_decodes_to(raw, r)


@given(
    deltas=st.lists(st.integers(1, 70_000), min_size=1, max_size=50).map(
        lambda gaps: [0, *np.cumsum(gaps).tolist()]
    ),
    base_offset=st.integers(0, 2**40),
)
@settings(max_examples=100, deadline=None)
def test_sparse_offset_deltas_round_trip(deltas: list[int], base_offset: int) -> None:
    n = len(deltas)
    keys: list[bytes | None] = [str(d).encode() for d in deltas]
    raw = encode_batch(base_offset, keys, [b"v"] * n, [3] * n, offset_deltas=np.array(deltas, dtype=np.int64))
    h = decode_header(raw)
    assert h.last_offset_delta == deltas[-1] and h.record_count == n
    expected = [base_offset + d for d in deltas]
    assert decode_batch(raw).offsets.tolist() == expected == decode_lists(raw).offsets
    assert decode_batch(raw).keys() == keys == decode_lists(raw).keys


def test_decode_at_a_position_inside_a_buffer_of_batches() -> None:
    batches = [encode_batch(i * 10, [b"k%d" % i] * 3, [b"v" * i] * 3, [i] * 3) for i in range(5)]
    buf = b"".join(batches)
    pos = 0
    for i, b in enumerate(batches):
        assert decode_batch(buf, pos).keys() == [b"k%d" % i] * 3
        assert decode_lists(buf, pos).offsets == [i * 10, i * 10 + 1, i * 10 + 2]
        assert decode_header(buf, pos, pos + len(b)).batch_length == len(b)
        with pytest.raises(CorruptRecordError) as info:
            decode_header(buf, pos, pos + len(b) - 1)  # the batch does not fit before the limit
        assert info.value.position == pos
        pos += len(b)


def test_headers_encode_and_reject_bad_pairs() -> None:
    blob = encode_headers([("a", b"1"), ("b", None), ["c", bytearray(b"3")]])
    assert msgpack.unpackb(blob) == [["a", b"1"], ["b", None], ["c", b"3"]]
    assert encode_headers([]) == b""
    # not a list of pairs at all: a float (nan) or an int was a TypeError from the loop, not a pylog error
    for bad in (
        [("a",)],
        [(1, b"x")],
        [("a", "str")],
        ["ab"],
        [("a", 5)],
        float("nan"),
        5,
        "ab",
        {"a": b"1"},
    ):
        with pytest.raises(InvalidRecordError):
            encode_headers(bad)


def test_encode_columns_rejects_an_empty_batch() -> None:
    empty = np.zeros(0, dtype=np.int64)
    with pytest.raises(InvalidRecordError):
        encode_columns(0, empty, b"", empty, b"", empty)


# -- every documented check ---------------------------------------------------------------------------------


def _sample(n: int = 3, **kw: object) -> bytes:
    return encode_batch(0, [b"key"] * n, [b"value"] * n, list(range(100, 100 + n)), **kw)  # type: ignore[arg-type]


def _raises(raw: bytes, exc: type[Exception] = CorruptRecordError, match: str | None = None) -> None:
    for decode in (decode_batch, decode_lists):
        with pytest.raises(exc, match=match):
            decode(raw)


def test_magic() -> None:
    raw = _sample()
    _raises(set_field(raw, 16, "<B", 0), match="bad magic")
    _raises(set_field(raw, 16, "<B", 2), UnsupportedFormatError, match="format version 2")
    short = set_field(set_field(raw, 16, "<B", 2), 8, "<i", 10)
    _raises(short, CorruptRecordError, match="bad magic")  # a newer version that cannot be a batch


@pytest.mark.parametrize("length", [-1, 0, 63, 71, 10**6, 2**31 - 1])
def test_batch_length_out_of_bounds(length: int) -> None:
    _raises(set_field(_sample(), 8, "<i", length), match="out of bounds")


def test_truncated_header_and_batch() -> None:
    raw = _sample()
    for cut in (0, 1, 63):
        with pytest.raises(CorruptRecordError, match="truncated batch header"):
            decode_batch(raw[:cut])
    for cut in (64, len(raw) - 1):
        _raises(raw[:cut], match="out of bounds")


def test_crc_covers_every_byte_from_16_to_the_end() -> None:
    raw = _sample()
    for i in range(16, len(raw)):
        flipped = bytearray(raw)
        flipped[i] ^= 0x01
        with pytest.raises(TYPED):
            decode_batch(bytes(flipped))
        with pytest.raises(TYPED):
            decode_lists(bytes(flipped))
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        decode_batch(set_field(raw, 12, "<I", crc32c(raw[16:]) ^ 1, forge=False))
    # the CRC is the only thing that catches a changed value byte
    changed = bytearray(raw)
    changed[-1] ^= 0x20
    assert decode_batch(bytes(changed), verify_crc=False).values()[-1] == b"valuE"


@pytest.mark.parametrize("count", [0, -1, 2**24 + 1])
def test_record_count_out_of_range(count: int) -> None:
    _raises(set_field(_sample(), 56, "<i", count), match="record count")


def test_last_offset_delta_below_record_count() -> None:
    _raises(set_field(_sample(), 20, "<i", 1), match="offset delta")


def test_dense_batch_with_a_wrong_last_offset_delta() -> None:
    _raises(set_field(_sample(), 20, "<i", 5), match="dense batch")


def test_impossible_header_values() -> None:
    raw = _sample()
    _raises(set_field(raw, 0, "<q", -1, forge=False), match="impossible")
    _raises(set_field(raw, 60, "<i", 7), match="impossible")  # payload shorter than its layout
    _raises(set_field(raw, 32, "<q", 99), match="impossible")  # max_timestamp < base_timestamp


def test_last_offset_may_not_overflow() -> None:
    raw = set_field(_sample(), 0, "<q", I64_MAX - 1, forge=False)
    _raises(raw, match="impossible")
    ok = set_field(_sample(), 0, "<q", I64_MAX - 2, forge=False)
    assert decode_batch(ok).offsets.tolist() == [I64_MAX - 2, I64_MAX - 1, I64_MAX]


def test_payload_length_must_match() -> None:
    _raises(set_field(_sample(), 60, "<i", 200), match="payload length")


def test_timestamps_must_agree_with_the_header() -> None:
    raw = _sample()
    _raises(set_field(raw, 32, "<q", 101), match="timestamps disagree")
    _raises(set_field(raw, 24, "<q", 99), match="timestamps disagree")
    same = encode_batch(0, [b"k"] * 3, [b"v"] * 3, [5] * 3)
    _raises(set_field(same, 32, "<q", 6), match="timestamps disagree")


@pytest.mark.parametrize("n", [3, 40])
def test_timestamp_deltas_may_not_overflow(n: int) -> None:
    # deltas 0, 2**62, 2**62 + 5 with base = max = 2**62: base + delta overflows int64
    ts = [0, 2**62, 2**62 + 5] + [0] * (n - 3)
    raw = encode_batch(0, [b"k"] * n, [b"v"] * n, ts)
    forged = set_field(set_field(raw, 24, "<q", 2**62), 32, "<q", 2**62)
    _raises(forged, match="timestamp")


def test_eight_byte_timestamp_delta_above_int64() -> None:
    raw = encode_batch(0, [b"k"] * 40, [b"v"] * 40, [0, 2**40] + [0] * 38)
    assert raw[HEADER_SIZE] == 8
    out = bytearray(raw)
    struct.pack_into("<Q", out, HEADER_SIZE + 8 + 8, 2**63 + 5)
    _raises(forge_crc(out), match="timestamp")


@pytest.mark.parametrize(
    ("column", "width"), [(0, 3), (0, 9), (1, 3), (1, 8), (2, 0), (2, 8), (3, 5), (4, 3)]
)
def test_bad_column_widths(column: int, width: int) -> None:
    raw = bytearray(_sample())
    raw[HEADER_SIZE + column] = width
    _raises(forge_crc(raw))


def test_offset_deltas_must_increase_to_last_offset_delta() -> None:
    raw = encode_batch(0, [b"k"] * 3, [b"v"] * 3, [1] * 3, offset_deltas=np.array([0, 5, 9]))
    at = HEADER_SIZE + 8  # no timestamp column: the offset deltas come first
    for deltas in ([0, 9, 5], [1, 5, 9], [0, 5, 8], [0, 5, 5]):
        out = bytearray(raw)
        out[at : at + 3] = bytes(deltas)
        _raises(forge_crc(out), match="offset deltas")


def test_record_lengths_must_add_up() -> None:
    raw = _sample()
    key_lens = HEADER_SIZE + 8 + 3  # after the 1-byte timestamp deltas
    for value in (4, 2, -2, 127):
        out = bytearray(raw)
        struct.pack_into("<b", out, key_lens, value)
        _raises(forge_crc(out), match="length")


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd"])
def test_compressed_payload_checks(codec: str) -> None:
    raw = _sample(40, compression=codec)
    garbled = bytearray(raw)
    for i in range(HEADER_SIZE, len(raw), 3):
        garbled[i] ^= 0x5A
    _raises(forge_crc(garbled))
    _raises(set_field(raw, 60, "<i", decode_header(raw).payload_length + 1), match="decompress")
    _raises(set_field(raw, 60, "<i", decode_header(raw).payload_length - 1))


@pytest.mark.parametrize("code", [5, 6, 7])
def test_unknown_compression_code(code: int) -> None:
    raw = _sample(40, compression="gzip")
    attrs = struct.unpack_from("<h", raw, 18)[0]
    _raises(set_field(raw, 18, "<h", (attrs & ~7) | code), match="compression")


@pytest.mark.parametrize("code", [2, 3, 4])
def test_a_payload_of_another_codec_is_corrupt(code: int) -> None:
    raw = _sample(40, compression="gzip")
    attrs = struct.unpack_from("<h", raw, 18)[0]
    _raises(set_field(raw, 18, "<h", (attrs & ~7) | code))


def test_undecodable_headers_blob_is_a_corrupt_record() -> None:
    for n in (3, 40):
        raw = encode_batch(0, [b"k"] * n, [b"v"] * n, [1] * n, [b"\xc1"] * n)  # 0xc1 is never valid msgpack
        with pytest.raises(CorruptRecordError, match="headers"):
            decode_batch(raw).headers()
        with pytest.raises(CorruptRecordError, match="headers"):
            decode_lists(raw)


@pytest.mark.parametrize(
    ("offset", "fmt", "value"),
    [
        (56, "<i", 2**24),  # record_count: 16M records claimed by a 100-byte batch
        (60, "<i", 2**31 - 1),  # payload_length
        (8, "<i", 2**31 - 1),  # batch_length
    ],
)
@pytest.mark.parametrize("codec", ["none", "gzip", "lz4", "zstd"])
def test_no_allocation_from_an_unchecked_length(offset: int, fmt: str, value: int, codec: str) -> None:
    raw = bytearray(_sample(40, compression=codec))
    struct.pack_into(fmt, raw, offset, value)
    if offset == 56:
        struct.pack_into("<i", raw, 20, value - 1)
    forged = forge_crc(raw)
    tracemalloc.start()
    try:
        for decode in (decode_batch, decode_lists):
            with pytest.raises(TYPED):
                decode(forged)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


def test_zstd_frame_without_content_size() -> None:
    import zstandard

    plain = _sample(40)
    body = zstandard.ZstdCompressor(write_content_size=False).compress(plain[HEADER_SIZE:])
    head = bytearray(plain[:HEADER_SIZE])
    struct.pack_into("<i", head, 8, HEADER_SIZE + len(body))
    struct.pack_into("<h", head, 18, record.COMPRESSION_CODES["zstd"])
    raw = forge_crc(bytes(head) + body)
    assert decode_batch(raw).values() == [b"value"] * 40
    claimed = set_field(raw, 60, "<i", 2**31 - 1)
    tracemalloc.start()
    try:
        _raises(claimed, match="impossible")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


# -- fuzzing ----------------------------------------------------------------------------------------------


def _check_decode(raw: bytes, position: int = 0) -> RecordLists | None:
    """Decode with both decoders. Only typed errors may escape; a success must be self-consistent, and the two
    decoders must agree. Returns the decoded lists (or None when the input was rejected)."""
    try:
        b = decode_batch(raw, position)
    except TYPED:
        b = None
    try:
        lists = decode_lists(raw, position)
    except TYPED:
        lists = None
    if b is None:
        assert lists is None
        return None
    h = b.header
    n = h.record_count
    offsets = b.offsets.tolist()
    timestamps = b.timestamps.tolist()
    assert len(offsets) == len(timestamps) == n
    assert offsets[0] == h.base_offset and offsets[-1] == h.base_offset + h.last_offset_delta
    assert all(a < c for a, c in itertools.pairwise(offsets))
    assert all(h.base_timestamp <= t <= h.max_timestamp for t in timestamps)
    assert min(timestamps) == h.base_timestamp and max(timestamps) == h.max_timestamp
    keys, values = b.keys(), b.values()
    assert len(keys) == len(values) == n
    try:
        headers = [list(x) for x in b.headers()]
    except CorruptRecordError:
        assert lists is None  # the list decoder checks headers eagerly
        return None
    assert lists is not None
    assert (lists.offsets, lists.timestamps, lists.keys, lists.values) == (offsets, timestamps, keys, values)
    assert [list(x) for x in lists.headers] == headers
    return lists


@FUZZ
@given(raw=st.binary(max_size=400), position=st.integers(0, 80))
def test_fuzz_random_bytes(raw: bytes, position: int) -> None:
    _check_decode(raw, position)
    try:
        decode_header(raw, position)
    except TYPED:
        pass


@st.composite
def forged_batches(draw: st.DrawFn) -> bytes:
    """A plausible header (valid magic and bounds) over a random payload, with a correct CRC."""
    payload = bytearray(draw(st.binary(min_size=8, max_size=200)))
    widths = draw(st.tuples(*[st.sampled_from([0, 1, 2, 3, 4, 8])] * 5))
    payload[:5] = bytes(widths)
    n = draw(st.integers(1, 40))
    codec = draw(st.sampled_from([0, 0, 0, 1, 3, 4]))
    base_ts = draw(st.sampled_from([0, 1, 2**40, 2**62, I64_MAX - 1000]))
    head = bytearray(
        HEADER.pack(
            draw(st.sampled_from([0, 1, 2**40, I64_MAX - 50])),
            HEADER_SIZE + len(payload),
            0,
            MAGIC,
            0,
            codec | draw(st.sampled_from([0, 8])),
            draw(st.sampled_from([n - 1, n, n + 300])),
            base_ts,
            base_ts + draw(st.sampled_from([0, 1, 255, 70_000, 2**32])) if base_ts < 2**62 else base_ts,
            -1,
            -1,
            0,
            -1,
            n,
            draw(st.sampled_from([len(payload), len(payload) * 3, 8])),
        )
    )
    return forge_crc(bytes(head) + bytes(payload))


@FUZZ
@given(raw=forged_batches())
def test_fuzz_forged_headers(raw: bytes) -> None:
    _check_decode(raw)


_FIELDS = [(8, "<i"), (20, "<i"), (56, "<i"), (60, "<i"), (24, "<q"), (32, "<q"), (0, "<q")]


@st.composite
def mutated(draw: st.DrawFn) -> tuple[bytes, bytes, bool]:
    """(original, mutated, crc forged) for a valid batch and a random list of mutations."""
    r = draw(records(max_size=40))
    codec = draw(st.sampled_from(["none", "none", "gzip", "lz4", "zstd"]))
    original = encode(r, draw(st.integers(0, 2**40)), compression=codec)
    raw = bytearray(original)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "field", "byte", "width", "extend"]))
        if kind == "flip" and raw:
            i = draw(st.integers(0, len(raw) * 8 - 1))
            raw[i // 8] ^= 1 << (i % 8)
        elif kind == "truncate":
            del raw[draw(st.integers(0, len(raw))) :]
        elif kind == "field" and len(raw) >= HEADER_SIZE:
            offset, fmt = draw(st.sampled_from(_FIELDS))
            bound = 2 ** (8 * struct.calcsize(fmt) - 1)
            current = struct.unpack_from(fmt, raw, offset)[0]
            near = st.integers(max(-bound, current - 300), min(bound - 1, current + 300))
            struct.pack_into(fmt, raw, offset, draw(st.one_of(st.integers(-bound, bound - 1), near)))
        elif kind == "byte" and raw:
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        elif kind == "width" and len(raw) >= HEADER_SIZE + 5:
            raw[HEADER_SIZE + draw(st.integers(0, 4))] = draw(st.sampled_from([0, 1, 2, 3, 4, 8, 255]))
        elif kind == "extend":
            raw += draw(st.binary(min_size=1, max_size=40))
    forge = draw(st.booleans())
    if forge and len(raw) >= 16:
        raw = bytearray(forge_crc(raw))
    return original, bytes(raw), forge


@FUZZ
@given(case=mutated())
def test_fuzz_mutated_valid_batches(case: tuple[bytes, bytes, bool]) -> None:
    original, raw, forged = case
    got = _check_decode(raw)
    if got is None or forged:
        return
    # Without a forged CRC a mutation can only go unnoticed outside the CRC-covered bytes, or in bytes after
    # the batch: every record must then be exactly the original one (the base offset may differ).
    want = decode_lists(original)
    assert got.header.crc == want.header.crc
    assert (got.keys, got.values, got.timestamps) == (want.keys, want.values, want.timestamps)
    assert got.headers == want.headers
    shift = got.header.base_offset - want.header.base_offset
    assert got.offsets == [o + shift for o in want.offsets]


@settings(max_examples=50, deadline=None)
@given(r=records(max_size=10), data=st.data())
def test_fuzz_every_single_bit_flip_in_the_crc_range_is_detected(r: Records, data: st.DataObject) -> None:
    raw = encode(r)
    bit = data.draw(st.integers(16 * 8, len(raw) * 8 - 1))
    out = bytearray(raw)
    out[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(TYPED):
        decode_batch(bytes(out))
    with pytest.raises(TYPED):
        decode_lists(bytes(out))
