"""The offset map against a dict model: the latest record of every key, for fixed and mixed key widths,
null keys and records that do not participate; and hash collisions never cost a latest record."""

from __future__ import annotations

from unittest import mock

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

from pylog.partition import keymap
from pylog.record import DecodedBatch, decode_batch, encode_batch

Key = bytes | None


def _batches(keys: list[Key], size: int) -> list[DecodedBatch]:
    out = []
    for start in range(0, len(keys), size):
        chunk = keys[start : start + size]
        raw = encode_batch(start, chunk, [b"v"] * len(chunk), np.zeros(len(chunk), dtype=np.int64))
        out.append(decode_batch(raw, 0))
    return out


def _model(keys: list[Key], participates: list[bool]) -> npt.NDArray[np.bool_]:
    last: dict[bytes, int] = {}
    for i, (k, p) in enumerate(zip(keys, participates, strict=True)):
        if k is not None and p:
            last[k] = i
    out = np.zeros(len(keys), dtype=np.bool_)
    out[list(last.values())] = True
    return out


fixed = st.sampled_from([1, 4, 8, 9, 16]).flatmap(
    lambda w: st.lists(st.binary(min_size=w, max_size=w) | st.none(), max_size=300)
)
mixed = st.lists(
    st.none() | st.binary(max_size=20) | st.sampled_from([b"", b"\0", b"\0\0", b"a", b"a\0"]), max_size=300
)


@settings(max_examples=150, deadline=None)
@given(keys=fixed | mixed, size=st.integers(1, 70), data=st.data())
def test_latest_mask_equals_a_model(keys: list[Key], size: int, data: st.DataObject) -> None:
    # few distinct keys, so that most records have an older or newer twin
    pool = list(dict.fromkeys(keys))[:12] or [None]
    keys = [pool[i % len(pool)] for i in data.draw(st.lists(st.integers(0, 50), max_size=300))] or keys
    participates = data.draw(st.lists(st.booleans(), min_size=len(keys), max_size=len(keys)))
    got = keymap.latest_mask(_batches(keys, size), np.array(participates, dtype=np.bool_))
    assert got.tolist() == _model(keys, participates).tolist()


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.binary(min_size=9, max_size=9) | st.binary(max_size=12), min_size=1, max_size=200))
def test_colliding_hashes_never_cost_a_latest_record(keys: list[Key]) -> None:
    """With every hash equal, keys are told apart by comparing them: the latest record of every key is still
    marked; at worst an older one is marked too."""
    keys = [keys[i % 7 % len(keys)] for i in range(len(keys) * 3)]
    want = _model(keys, [True] * len(keys))
    with mock.patch.object(keymap, "_fmix", lambda h: h & np.uint64(0)):
        got = keymap.latest_mask(_batches(keys, 13))
    assert (got | ~want).all()
    for k in set(keys):
        mine = [i for i, x in enumerate(keys) if x == k]
        assert got[mine[-1]]


def test_no_records_or_no_keys() -> None:
    assert keymap.latest_mask([]).tolist() == []
    assert keymap.latest_mask(_batches([None, None], 5)).tolist() == [False, False]
