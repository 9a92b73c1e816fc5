"""How ``pylog`` turns input lines into stored keys and values, and stored bytes back into output: the
``--key-format`` and ``--value-format`` options.

Producing (``pylog produce``): each line, without its line ending, is the value (or, with ``--key-separator``,
the key and the value):

- ``text`` (the default): the line's bytes as they are (UTF-8 text stays UTF-8), as kafka-console-producer
  stores a line;
- ``json`` (values only): the line parsed as JSON and stored msgpack-encoded, as ``Producer.send(topic, obj)``
  stores ``obj`` with its default serializer (JSON ``null`` is a tombstone); blank lines are skipped;
- ``base64`` / ``hex``: the line decoded, for bytes that are not text (what ``consume`` prints in that format).

Showing (``pylog consume``, ``pylog dump --print-data``), values:

- ``auto`` (the default): text when the value is valid UTF-8, so a text line comes back exactly as it was
  produced. A value that is not UTF-8 but is exactly one msgpack object (what the Python API's default
  serializer writes: maps, lists, strings, floats, ...) is shown decoded, as JSON (a string as it is). Other
  bytes are shown as text with each byte that is not UTF-8 escaped (``\\xff``). One exception: a value of a
  single control byte (``0x00``-``0x1f`` except tab, and ``0x7f``) is shown as the msgpack integer it also is
  (``5``, not an invisible character). msgpack values that are also valid UTF-8 are shown as text: the
  integers 32-126 (one ASCII character: ``65`` shows as ``A``) and 128-191, and strings of 128-191 bytes
  (with one extra leading character); ``--value-format json`` decodes them;
- ``text``: always text (bytes that are not UTF-8 escaped), never msgpack: exact for every text line;
- ``json`` (or ``msgpack``): decoded from msgpack and printed as JSON (a string in quotes), so what
  ``produce --value-format json`` stored prints back as JSON; a value that is not msgpack is an error;
- ``base64`` / ``hex``: the bytes encoded.

Keys are shown as ``text`` (the default), ``base64`` or ``hex``, and header values as text.

JSON output (``--format json``, ``--json``) names the encoding of each key and value: ``text``, ``msgpack``
(the decoded object), ``base64`` (also for text-format bytes that are not UTF-8, which JSON text cannot hold
exactly) or ``hex``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

import msgpack

from pylog.cli._common import CliError, InputError

__all__ = [
    "KEY_FORMATS",
    "PRODUCE_VALUE_FORMATS",
    "SHOW_VALUE_FORMATS",
    "jsonable",
    "parse_field",
    "show_json",
    "show_text",
]

PRODUCE_VALUE_FORMATS = ("text", "json", "base64", "hex")
KEY_FORMATS = ("text", "base64", "hex")
SHOW_VALUE_FORMATS = ("auto", "text", "json", "msgpack", "base64", "hex")

_CONTROL = frozenset([*range(0x09), *range(0x0A, 0x20), 0x7F])


# -- producing --------------------------------------------------------------------------------------------


def parse_field(raw: bytes, fmt: str, what: str) -> Any:
    """What ``produce`` hands to ``Producer.send`` for ``raw`` (a key or value, ``what``) in format ``fmt``:
    bytes, or for ``json`` the parsed object. Raises :class:`InputError` for input that is not ``fmt``."""
    if fmt == "text":
        return raw
    try:
        if fmt == "json":
            return json.loads(raw)
        if fmt == "base64":
            return base64.b64decode(raw, validate=True)
        if fmt == "hex":
            return bytes.fromhex(raw.decode("ascii"))
    except (ValueError, binascii.Error) as exc:
        raise InputError(f"invalid {'JSON' if fmt == 'json' else fmt} {what}: {exc}") from exc
    raise CliError(f"unknown {what} format {fmt!r}")


# -- showing ----------------------------------------------------------------------------------------------


def show_text(raw: bytes | None, fmt: str) -> str:
    """How a stored key or value appears in text output (``null`` for None)."""
    if raw is None:
        return "null"
    if fmt in ("hex", "base64"):
        return _encoded(raw, fmt)
    if fmt in ("json", "msgpack"):
        return json.dumps(_unpack_strict(raw), ensure_ascii=False, separators=(",", ":"))
    if fmt == "auto":
        found, obj = _auto_msgpack(raw)
        if found:
            return obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return raw.decode("utf-8", errors="backslashreplace")


def show_json(raw: bytes | None, fmt: str) -> tuple[Any, str | None]:
    """``(shown, encoding)`` of a stored key or value for JSON output (``(None, None)`` for None)."""
    if raw is None:
        return None, None
    if fmt in ("hex", "base64"):
        return _encoded(raw, fmt), fmt
    if fmt in ("json", "msgpack"):
        return _unpack_strict(raw), "msgpack"
    if fmt == "auto":
        found, obj = _auto_msgpack(raw)
        if found:
            return obj, "msgpack"
    try:
        return raw.decode("utf-8"), "text"
    except UnicodeDecodeError:
        return _encoded(raw, "base64"), "base64"


def _encoded(raw: bytes, fmt: str) -> str:
    return raw.hex() if fmt == "hex" else base64.b64encode(raw).decode("ascii")


def _auto_msgpack(raw: bytes) -> tuple[bool, Any]:
    """Whether ``auto`` shows ``raw`` as msgpack, and the decoded (JSON-ready) object if so."""
    if len(raw) == 1 and raw[0] in _CONTROL:
        return True, raw[0]  # a positive fixint
    try:
        raw.decode("utf-8")
        return False, None  # text wins: a text line must come back as it was produced
    except UnicodeDecodeError:
        pass
    try:
        return True, jsonable(msgpack.unpackb(raw, raw=False, strict_map_key=False))
    except Exception:  # msgpack raises several unrelated types for bytes that are not one object
        return False, None


def _unpack_strict(raw: bytes) -> Any:
    try:
        return jsonable(msgpack.unpackb(raw, raw=False, strict_map_key=False))
    except Exception as exc:
        raise CliError(
            f"a value is not msgpack ({type(exc).__name__}); show it with --value-format auto or text"
        ) from exc


def jsonable(obj: Any) -> Any:
    """A decoded msgpack object made JSON-ready: bytes as UTF-8 text (escaped where not UTF-8), map keys as
    strings, timestamps as ISO 8601, extension types as ``{"ext": code, "data": base64}``."""
    if isinstance(obj, bytes):
        return obj.decode("utf-8", errors="backslashreplace")
    if isinstance(obj, Mapping):
        return {k if isinstance(k, str) else json.dumps(jsonable(k)): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, msgpack.Timestamp):
        return obj.to_datetime().isoformat()
    if isinstance(obj, msgpack.ExtType):
        return {"ext": obj.code, "data": base64.b64encode(obj.data).decode("ascii")}
    return obj
