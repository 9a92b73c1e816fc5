"""The Kafka protocol codec adapter: frames, request headers, and kio's messages.

A Kafka request on the wire is a 4-byte big-endian size, then the request header (``api_key`` i16,
``api_version`` i16, ``correlation_id`` i32, ``client_id``, and from flexible versions on tagged fields), then
the request body. A response is a 4-byte size, the response header (``correlation_id``, plus tagged fields for
flexible versions, except ApiVersions which always answers with header v0), then the body.

The messages themselves are kio's (``kio.schema``, generated from Kafka's JSON message definitions): this module
reads a request into kio's dataclass of its version, and builds the response dataclass of the same version
from plain Python values (:func:`build`): handlers answer with dicts whose keys are kio's field names, and the
fields a version does not have are dropped, so one handler serves every version of its API.

kio loads the module of each message version the first time it is asked for it; loading all the served versions
takes 0.3 s to seconds of CPU on a busy machine. :func:`warm_up` loads them on a background thread when a broker
starts, so that a client's first request of an API does not stall the event loop (every connection) while
Python imports its schema.

Thread-safety: every function is thread-safe (the caches are filled idempotently; imports take Python's
per-module locks).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import logging
import struct
import threading
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

__all__ = [
    "API_VERSIONS",
    "ApiError",
    "ErrorCode",
    "Request",
    "UnsupportedRequest",
    "build",
    "encode_response",
    "read_request",
    "warm_up",
]

_log = logging.getLogger("pylog.broker")
_warming = threading.Lock()
_warmed = False

# api key -> (lowest, highest) version served. The lowest versions are kio's (Kafka 4's); Produce is
# advertised from 0 (librdkafka turns compression off when a broker's Produce minimum is 3: KAFKA-18659) and
# versions 0-2 are answered with UNSUPPORTED_VERSION, as Kafka 4 does.
API_VERSIONS: Final[dict[int, tuple[int, int]]] = {
    0: (0, 9),  # Produce
    1: (4, 12),  # Fetch (13+ name topics by id)
    2: (1, 7),  # ListOffsets
    3: (0, 12),  # Metadata
    8: (2, 7),  # OffsetCommit
    9: (1, 7),  # OffsetFetch (8+ batch groups)
    10: (0, 3),  # FindCoordinator (4+ batch keys)
    11: (0, 7),  # JoinGroup
    12: (0, 4),  # Heartbeat
    13: (0, 4),  # LeaveGroup
    14: (0, 5),  # SyncGroup
    15: (0, 5),  # DescribeGroups
    16: (0, 4),  # ListGroups
    17: (0, 1),  # SaslHandshake
    18: (0, 3),  # ApiVersions
    19: (2, 5),  # CreateTopics
    20: (1, 5),  # DeleteTopics (6+ name topics by id)
    21: (0, 2),  # DeleteRecords
    22: (0, 4),  # InitProducerId
    24: (0, 3),  # AddPartitionsToTxn (4+ batch transactions)
    25: (0, 3),  # AddOffsetsToTxn
    26: (0, 3),  # EndTxn
    28: (0, 3),  # TxnOffsetCommit
    29: (1, 3),  # DescribeAcls
    30: (1, 3),  # CreateAcls
    31: (1, 3),  # DeleteAcls
    32: (1, 4),  # DescribeConfigs
    33: (0, 2),  # AlterConfigs
    34: (1, 2),  # AlterReplicaLogDirs (one log directory: LOG_DIR_NOT_FOUND for another)
    35: (1, 4),  # DescribeLogDirs
    36: (0, 2),  # SaslAuthenticate
    37: (0, 3),  # CreatePartitions
    42: (0, 2),  # DeleteGroups
    43: (0, 2),  # ElectLeaders (one node: ELECTION_NOT_NEEDED)
    44: (0, 1),  # IncrementalAlterConfigs
    45: (0, 0),  # AlterPartitionReassignments (one node: INVALID_REPLICA_ASSIGNMENT)
    46: (0, 0),  # ListPartitionReassignments (one node: none)
    47: (0, 0),  # OffsetDelete
    48: (0, 1),  # DescribeClientQuotas
    49: (0, 1),  # AlterClientQuotas
    50: (0, 0),  # DescribeUserScramCredentials
    51: (0, 0),  # AlterUserScramCredentials
    60: (0, 1),  # DescribeCluster
}
_SERVED_FROM: Final = {0: 3}  # versions below these are advertised but refused
_HEAD: Final = struct.Struct(">hhi")
_SIZE: Final = struct.Struct(">i")
_HALF: Final = struct.Struct(">h")


class ApiError(Exception):
    """A request answered with a Kafka error code for the whole request (raised by handlers)."""

    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(message or code.name)
        self.code = code


class UnsupportedRequest(Exception):
    """An api key or version this broker does not serve (``correlation_id`` is known: it can be answered)."""

    def __init__(self, api_key: int, version: int, correlation_id: int) -> None:
        super().__init__(f"api key {api_key} version {version} is not supported")
        self.api_key = api_key
        self.version = version
        self.correlation_id = correlation_id


@dataclass(frozen=True, slots=True)
class Request:
    """A decoded request: its header fields and kio's body (typed ``Any``: handlers serve many versions)."""

    api_key: int
    version: int
    correlation_id: int
    client_id: str | None
    body: Any


def read_request(frame: bytes) -> Request:
    """Decode one request frame (the bytes after the size). Raises :class:`UnsupportedRequest` for an api key
    or version not served, ``ValueError`` (or kio's errors) for a malformed frame."""
    if len(frame) < _HEAD.size:
        raise ValueError(f"a request of {len(frame)} bytes is shorter than its header")
    api_key, version, correlation_id = _HEAD.unpack_from(frame)
    span = API_VERSIONS.get(api_key)
    if span is None or not _SERVED_FROM.get(api_key, span[0]) <= version <= span[1]:
        raise UnsupportedRequest(api_key, version, correlation_id)
    schema = _request_schema(api_key, version)
    header, at = _reader(schema.__header_schema__)(frame, 0)
    body, _ = _reader(schema)(frame, at)
    return Request(api_key, version, correlation_id, getattr(header, "client_id", None), body)


def encode_response(request: Request, data: Mapping[str, Any]) -> bytes:
    """The response frame (size prefix included) answering ``request`` with ``data`` (see :func:`build`)."""
    fast = _FAST.get(request.api_key)
    if fast is not None and fast[0] <= request.version <= fast[1]:
        try:
            return fast[2](request.version, request.correlation_id, data)
        except (KeyError, TypeError, ValueError, OverflowError, struct.error):
            pass  # a value the fast path does not take: kio says what is wrong with it
    return _encode_with_kio(request, data)


def _encode_with_kio(request: Request, data: Mapping[str, Any]) -> bytes:
    schema = _response_schema(request.api_key, request.version)
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    header_schema = schema.__header_schema__
    _writer(header_schema)(out, header_schema(correlation_id=request.correlation_id))
    _writer(schema)(out, build(schema, data))
    frame = out.getbuffer()
    _SIZE.pack_into(frame, 0, len(frame) - 4)
    return bytes(frame)


# -- the Produce and Fetch responses without kio ------------------------------------------------------------
# A Produce request is answered once per client batch, a Fetch once per poll of a consumer: kio's writer
# (which checks every value's type and range) costs 60-100 us for a one-partition answer, ten times the
# bytes' own packing, and copies a Fetch's records three times (2-3 ms per MiB on a virtual machine, whose
# fresh pages are slow to touch). Produce versions 3-9 and Fetch versions 4-12 are written here byte for
# byte as kio writes them (tests/broker/test_protocol_fast_paths.py compares the two), the records copied
# once; data they do not take (a field they do not write, a value that is not an int) goes to kio.

_PARTITION: Final = struct.Struct(">ihqq")  # index, error_code, base_offset, log_append_time
_FETCH_PARTITION: Final = struct.Struct(">ihqq")  # partition_index, error_code, high_watermark, last_stable
_ABORTED: Final = struct.Struct(">qq")  # producer_id, first_offset
_I32: Final = struct.Struct(">i")
_I64: Final = struct.Struct(">q")
_FETCH_KEYS: Final = frozenset({"throttle_time", "error_code", "session_id", "responses"})
_FETCH_TOPIC_KEYS: Final = frozenset({"topic", "partitions"})
_FETCH_PARTITION_KEYS: Final = frozenset(
    {
        "partition_index",
        "error_code",
        "high_watermark",
        "last_stable_offset",
        "log_start_offset",
        "aborted_transactions",
        "preferred_read_replica",
        "records",
    }
)


def _produce_response(version: int, correlation_id: int, data: Mapping[str, Any]) -> bytes:
    """The Produce response frame of ``version`` (3-9), from the same ``data`` as :func:`build` takes (missing
    keys get kio's defaults). Raises ``KeyError``, ``TypeError`` or ``struct.error`` for data it does not
    take (the caller then uses kio)."""
    flexible = version >= 9  # compact strings and arrays, tagged fields (none written: all are v10+)
    out = bytearray(8)
    _I32.pack_into(out, 4, correlation_id)
    if flexible:
        out.append(0)  # response header v1: no tagged fields
    topics = data["responses"]
    _array_length(out, len(topics), flexible)
    for topic in topics:
        _string(out, topic["name"] or "", flexible)
        parts = topic["partition_responses"]
        _array_length(out, len(parts), flexible)
        for p in parts:
            append_time = p.get("log_append_time")
            out += _PARTITION.pack(
                p["index"],
                ErrorCode(p["error_code"]).value,
                p["base_offset"],
                -1 if append_time is None or append_time < 0 else _int(append_time),
            )
            if version >= 5:
                out += _I64.pack(p.get("log_start_offset", -1))
            if version >= 8:
                errors = p["record_errors"]
                _array_length(out, len(errors), flexible)
                for e in errors:
                    out += _I32.pack(e["batch_index"])
                    _nullable_string(out, e.get("batch_index_error_message"), flexible)
                    if flexible:
                        out.append(0)
                _nullable_string(out, p.get("error_message"), flexible)
            if flexible:
                out.append(0)
        if flexible:
            out.append(0)
    out += _I32.pack(_int(data.get("throttle_time", 0)))
    if flexible:
        out.append(0)
    _SIZE.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def _fetch_response(version: int, correlation_id: int, data: Mapping[str, Any]) -> bytes:
    """The Fetch response frame of ``version`` (4-12) from the data :func:`build` takes, the records of each
    partition copied once. Raises ``KeyError`` or ``TypeError`` for data it does not take, among them the
    tagged fields of version 12 (diverging epoch, current leader, snapshot id: never set by this broker)."""
    flexible = version >= 12
    if not data.keys() <= _FETCH_KEYS:
        raise TypeError(f"fields the fast path does not write: {sorted(data.keys() - _FETCH_KEYS)}")
    chunks: list[bytes | bytearray] = []
    out = head = bytearray(8)
    _I32.pack_into(out, 4, correlation_id)
    if flexible:
        out.append(0)  # response header v1: no tagged fields
    out += _I32.pack(_int(data["throttle_time"]))
    if version >= 7:
        out += _HALF.pack(ErrorCode(data["error_code"]).value)
        out += _I32.pack(data.get("session_id", 0))
    topics = data["responses"]
    _array_length(out, len(topics), flexible)
    for topic in topics:
        if not topic.keys() <= _FETCH_TOPIC_KEYS:
            raise TypeError("a topic field the fast path does not write")
        _string(out, topic["topic"] or "", flexible)
        parts = topic["partitions"]
        _array_length(out, len(parts), flexible)
        for p in parts:
            if not p.keys() <= _FETCH_PARTITION_KEYS:
                raise TypeError("a partition field the fast path does not write")
            out += _FETCH_PARTITION.pack(
                p["partition_index"],
                ErrorCode(p["error_code"]).value,
                p["high_watermark"],
                p.get("last_stable_offset", -1),
            )
            if version >= 5:
                out += _I64.pack(p.get("log_start_offset", -1))
            aborted = p["aborted_transactions"]
            if aborted is None:
                out += b"\0" if flexible else _I32.pack(-1)
            else:
                _array_length(out, len(aborted), flexible)
                for a in aborted:
                    if a.keys() != {"producer_id", "first_offset"}:
                        raise TypeError("an aborted transaction the fast path does not write")
                    out += _ABORTED.pack(a["producer_id"], a["first_offset"])
                    if flexible:
                        out.append(0)
            if version >= 11:
                out += _I32.pack(p.get("preferred_read_replica", -1))
            records = p["records"]
            if records is None:
                out += b"\0" if flexible else _I32.pack(-1)
            elif type(records) is not bytes:
                raise TypeError(f"records as {type(records).__name__}")
            else:
                if flexible:
                    _uvarint(out, len(records) + 1)
                else:
                    out += _I32.pack(len(records))
                chunks += (out, records)
                out = bytearray()
            if flexible:
                out.append(0)  # no tagged fields (diverging epoch, leader, snapshot: defaults)
        if flexible:
            out.append(0)
    if flexible:
        out.append(0)
    chunks.append(out)
    _SIZE.pack_into(head, 0, sum(map(len, chunks)) - 4)
    return b"".join(chunks)


_FAST: Final[dict[int, tuple[int, int, Callable[[int, int, Mapping[str, Any]], bytes]]]] = {
    0: (3, 9, _produce_response),
    1: (4, 12, _fetch_response),
}


def _int(v: Any) -> int:
    """An int field given as an int (what handlers give); anything else goes to kio."""
    if type(v) is not int:
        raise TypeError(f"not an int: {v!r}")
    return v


def _uvarint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _array_length(out: bytearray, n: int, flexible: bool) -> None:
    if flexible:
        _uvarint(out, n + 1)
    else:
        out += _I32.pack(n)


def _string(out: bytearray, s: str, flexible: bool) -> None:
    raw = s.encode()
    if flexible:
        _uvarint(out, len(raw) + 1)
    else:
        out += _HALF.pack(len(raw))
    out += raw


def _nullable_string(out: bytearray, s: str | None, flexible: bool) -> None:
    if s is None:
        if flexible:
            out.append(0)
        else:
            out += _HALF.pack(-1)
        return
    _string(out, s, flexible)


def encode_unsupported(api_key: int, version: int, correlation_id: int) -> bytes | None:
    """The answer to a request of an unsupported version: for ApiVersions (KIP-511) UNSUPPORTED_VERSION with our
    supported range, in version 0's layout; for other apis None (Kafka closes the connection: a client must not
    send a version the broker did not advertise)."""
    if api_key != 18:
        return None
    request = Request(18, 0, correlation_id, None, None)
    return encode_response(
        request,
        {"error_code": ErrorCode.unsupported_version, "api_keys": api_keys(), "throttle_time": 0},
    )


def api_keys() -> list[dict[str, int]]:
    return [
        {"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in sorted(API_VERSIONS.items())
    ]


# -- building kio entities from plain values ---------------------------------------------------------------


def build(cls: Any, data: Mapping[str, Any]) -> Any:
    """An instance of the kio dataclass ``cls`` from ``data``: keys are kio's field names; nested entities are
    dicts, lists of dicts; durations are milliseconds (int); error codes ints or :class:`ErrorCode`;
    ``datetime`` fields milliseconds since the epoch (-1 or None: null). Keys the version does not have are
    dropped; a field with a default may be left out."""
    kwargs = {}
    for name, convert in _fields(cls):
        if name in data:
            kwargs[name] = convert(data[name])
    return cls(**kwargs)


@functools.cache
def _fields(cls: Any) -> list[tuple[str, Any]]:
    hints = typing.get_type_hints(cls)
    return [(f.name, _converter(hints[f.name])) for f in dataclasses.fields(cls)]


def _converter(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if origin is tuple:
        inner = _converter(args[0])
        return lambda v: None if v is None else tuple(inner(x) for x in v)
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        inner = _converter(args[0])
        return lambda v: None if v is None else inner(v)
    if isinstance(tp, type):
        if issubclass(tp, str):  # a non-nullable string: null is written as ""
            return lambda v: "" if v is None else v
        if dataclasses.is_dataclass(tp):
            return lambda v: build(tp, v) if isinstance(v, Mapping) else v
        if issubclass(tp, ErrorCode):
            return ErrorCode
        if issubclass(tp, datetime.timedelta):
            return lambda v: v if isinstance(v, datetime.timedelta) else datetime.timedelta(milliseconds=v)
        if issubclass(tp, datetime.datetime):
            return _datetime
        if issubclass(tp, uuid.UUID):
            return lambda v: v if isinstance(v, uuid.UUID) else uuid.UUID(int=v or 0)
    return lambda v: v


def _datetime(v: Any) -> datetime.datetime | None:
    if v is None or isinstance(v, datetime.datetime):
        return v
    if v < 0:
        return None
    return datetime.datetime.fromtimestamp(v / 1000, tz=datetime.UTC)


def warm_up() -> None:
    """Load the request and response schemas (and their readers and writers) of every served api key and version
    on a daemon thread, once per process; returns at once."""
    global _warmed  # a once-per-process flag
    with _warming:
        if _warmed:
            return
        _warmed = True
    threading.Thread(target=_load_all, name="pylog-broker-schemas", daemon=True).start()


def _load_all() -> None:
    for api_key, (low, high) in API_VERSIONS.items():
        for version in range(_SERVED_FROM.get(api_key, low), high + 1):
            try:
                request = _request_schema(api_key, version)
                _reader(request.__header_schema__)
                _reader(request)
                response = _response_schema(api_key, version)
                _writer(response.__header_schema__)
                _writer(response)
            except Exception:  # the request that needs it loads it again and reports what fails
                _log.debug("loading the schema of api key %d v%d failed", api_key, version, exc_info=True)


@functools.cache
def _request_schema(api_key: int, version: int) -> Any:
    return load_request_schema(api_key, version)


@functools.cache
def _response_schema(api_key: int, version: int) -> Any:
    return load_response_schema(api_key, version)


@functools.cache
def _reader(schema: Any) -> Any:
    return entity_reader(schema)


@functools.cache
def _writer(schema: Any) -> Any:
    return entity_writer(schema)
