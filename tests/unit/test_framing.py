"""The framing of pylog's small self-checking files: a round trip gives the body back, and no damage is ever
read as another body."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pylog.errors import UnsupportedFormatError
from pylog.framing import frame, unframe

MAGIC = b"pylog-test"


@given(body=st.binary(max_size=200), version=st.integers(1, 99))
def test_a_framed_body_reads_back(body: bytes, version: int) -> None:
    raw = frame(MAGIC, version, body)
    assert raw.split(b"\n", 1)[0].split(b" ")[:2] == [MAGIC, b"%d" % version]
    assert unframe(raw, MAGIC, version, "test record") == body


@settings(max_examples=25)
@given(body=st.binary(min_size=1, max_size=64))
def test_every_single_bit_flip_and_truncation_is_refused(body: bytes) -> None:
    raw = frame(MAGIC, 1, body)
    for bit in range(len(raw) * 8):
        damaged = bytearray(raw)
        damaged[bit // 8] ^= 1 << (bit % 8)
        try:
            got = unframe(bytes(damaged), MAGIC, 1, "test record")
        except (ValueError, UnsupportedFormatError):
            continue
        pytest.fail(f"bit {bit} flipped was read as {got!r}")
    for cut in range(len(raw)):
        with pytest.raises(ValueError):
            unframe(raw[:cut], MAGIC, 1, "test record")


def test_another_format_version_or_kind_is_named() -> None:
    raw = frame(MAGIC, 2, b"{}")
    with pytest.raises(UnsupportedFormatError, match=r"test record format b'2' is not known"):
        unframe(raw, MAGIC, 1, "test record")
    with pytest.raises(ValueError, match="not a test record"):
        unframe(frame(b"pylog-other", 1, b"{}"), MAGIC, 1, "test record")
