"""The Produce and Fetch responses written without kio (pylog.broker.protocol's fast paths) are kio's bytes.

kio is the model: for every version the broker answers (Produce 3-9, Fetch 4-12) and any data a handler may
give, the fast path's frame must equal the frame kio writes, and kio must read it back.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pylog.broker import protocol
from pylog.broker.protocol import ErrorCode, Request, encode_response

_VERSIONS = range(3, 10)
_I32 = st.integers(-(2**31), 2**31 - 1)
_I64 = st.integers(-(2**63), 2**63 - 1)
_TEXT = st.text(max_size=40)  # any unicode: lengths are in bytes of UTF-8
_MS = st.one_of(st.just(-1), st.integers(0, 4_102_444_800_000))  # up to 2100 (kio goes through datetime)

_record_error = st.fixed_dictionaries(
    {"batch_index": _I32}, optional={"batch_index_error_message": st.none() | _TEXT}
)
_partition = st.fixed_dictionaries(
    {
        "index": _I32,
        "error_code": st.sampled_from(list(ErrorCode)),
        "base_offset": _I64,
        "record_errors": st.lists(_record_error, max_size=3),
    },
    optional={"log_append_time": _MS, "log_start_offset": _I64, "error_message": st.none() | _TEXT},
)
_topic = st.fixed_dictionaries({"name": _TEXT, "partition_responses": st.lists(_partition, max_size=4)})
_response = st.fixed_dictionaries(
    {"responses": st.lists(_topic, max_size=3)}, optional={"throttle_time": st.integers(0, 2**31 - 1)}
)


def _both(version: int, correlation_id: int, data: dict[str, Any]) -> tuple[bytes, bytes]:
    """The fast path's frame (it must take ``data``: no fallback to kio) and kio's."""
    request = Request(0, version, correlation_id, None, None)
    return protocol._produce_response(version, correlation_id, data), protocol._encode_with_kio(request, data)


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(_VERSIONS), correlation_id=_I32, data=_response)
def test_produce_response_is_kios_bytes(version: int, correlation_id: int, data: dict[str, Any]) -> None:
    fast, kio = _both(version, correlation_id, data)
    assert fast == kio
    # and kio reads it back: the header, then the body to its last byte
    schema = protocol._response_schema(0, version)
    frame = fast[4:]
    header, at = protocol._reader(schema.__header_schema__)(frame, 0)
    body, size = protocol._reader(schema)(frame, at)
    assert header.correlation_id == correlation_id
    assert at + size == len(frame)
    assert [t.name for t in body.responses] == [t["name"] for t in data["responses"]]


def test_what_a_broker_answers_is_kios_bytes() -> None:
    """The produce handler's answer (one partition, no error) in every version."""
    data = {
        "responses": [
            {
                "name": "orders",
                "partition_responses": [
                    {
                        "index": 0,
                        "error_code": ErrorCode.none,
                        "base_offset": 1234,
                        "log_append_time": -1,
                        "log_start_offset": 0,
                        "record_errors": [],
                        "error_message": None,
                    }
                ],
            }
        ],
        "throttle_time": 0,
    }
    for version in _VERSIONS:
        fast, kio = _both(version, 7, data)
        assert fast == kio, version


def test_values_the_fast_path_does_not_take_are_written_by_kio() -> None:
    """A throttle time as a timedelta, an append time as a datetime, an error code as a plain int: kio's
    conversions apply, as before the fast path."""
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=datetime.UTC)
    data = {
        "responses": [
            {
                "name": "t",
                "partition_responses": [
                    {
                        "index": 1,
                        "error_code": 6,
                        "base_offset": 5,
                        "log_append_time": when,
                        "log_start_offset": 2,
                        "record_errors": [{"batch_index": 0}],
                    }
                ],
            }
        ],
        "throttle_time": datetime.timedelta(milliseconds=250),
    }
    for version in _VERSIONS:
        request = Request(0, version, 9, None, None)
        assert encode_response(request, data) == protocol._encode_with_kio(request, data), version


# -- Fetch ------------------------------------------------------------------------------------------------

_FETCH_VERSIONS = range(4, 13)
_aborted = st.fixed_dictionaries({"producer_id": _I64, "first_offset": _I64})
_fetch_partition = st.fixed_dictionaries(
    {
        "partition_index": _I32,
        "error_code": st.sampled_from(list(ErrorCode)),
        "high_watermark": _I64,
        "aborted_transactions": st.none() | st.lists(_aborted, max_size=3),
        "records": st.none() | st.binary(max_size=300),
    },
    optional={"last_stable_offset": _I64, "log_start_offset": _I64, "preferred_read_replica": _I32},
)
_fetch_topic = st.fixed_dictionaries({"topic": _TEXT, "partitions": st.lists(_fetch_partition, max_size=4)})
_fetch = st.fixed_dictionaries(
    {
        "throttle_time": st.integers(0, 2**31 - 1),
        "error_code": st.sampled_from(list(ErrorCode)),
        "responses": st.lists(_fetch_topic, max_size=3),
    },
    optional={"session_id": _I32},
)


def _kio_reads(api_key: int, version: int, frame: bytes) -> Any:
    schema = protocol._response_schema(api_key, version)
    body_frame = frame[4:]
    header, at = protocol._reader(schema.__header_schema__)(body_frame, 0)
    body, size = protocol._reader(schema)(body_frame, at)
    assert at + size == len(body_frame)
    return header, body


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(_FETCH_VERSIONS), correlation_id=_I32, data=_fetch)
def test_fetch_response_is_kios_bytes(version: int, correlation_id: int, data: dict[str, Any]) -> None:
    request = Request(1, version, correlation_id, None, None)
    fast = protocol._fetch_response(version, correlation_id, data)
    assert fast == protocol._encode_with_kio(request, data)
    header, body = _kio_reads(1, version, fast)
    assert header.correlation_id == correlation_id
    got = [p.records for t in body.responses for p in t.partitions]
    assert got == [p["records"] for t in data["responses"] for p in t["partitions"]]


def test_a_large_fetch_is_kios_bytes() -> None:
    """A fetch of several partitions with a MiB of records each (the records are joined, not copied twice)."""
    records = bytes(range(256)) * 4096
    data = {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "session_id": 0,
        "responses": [
            {
                "topic": "t",
                "partitions": [
                    {
                        "partition_index": i,
                        "error_code": ErrorCode.none,
                        "high_watermark": 10_000,
                        "last_stable_offset": 10_000,
                        "log_start_offset": 0,
                        "aborted_transactions": [] if i else None,
                        "preferred_read_replica": -1,
                        "records": records[i:],
                    }
                    for i in range(3)
                ],
            }
        ],
    }
    for version in _FETCH_VERSIONS:
        request = Request(1, version, 5, None, None)
        assert encode_response(request, data) == protocol._encode_with_kio(request, data), version


@pytest.mark.parametrize(
    "extra",
    [
        {"diverging_epoch": {"epoch": 3, "end_offset": 9}},  # a tagged field of v12: kio writes it
        {"records": bytearray(b"abc")},  # not bytes
    ],
)
def test_fetch_data_the_fast_path_does_not_take_is_written_by_kio(extra: dict[str, Any]) -> None:
    partition = {
        "partition_index": 0,
        "error_code": ErrorCode.none,
        "high_watermark": 3,
        "aborted_transactions": None,
        "records": b"",
        **extra,
    }
    data = {"throttle_time": 0, "error_code": 0, "responses": [{"topic": "t", "partitions": [partition]}]}
    request = Request(1, 12, 1, None, None)
    with pytest.raises(TypeError):
        protocol._fetch_response(12, 1, data)
    assert encode_response(request, data) == protocol._encode_with_kio(request, data)
