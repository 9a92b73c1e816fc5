"""Which record is the latest of its key: the cleaner's offset map (Kafka's ``OffsetMap``), built with numpy.

Given decoded batches in offset order, :func:`latest_mask` marks, for every record, whether no later record
among them has the same key. No Python object is created per record:

1. each key gets a 64-bit number, computed per batch on whole columns. When every key has the same width
   the keys are rows of 64-bit words (zero-padded): up to 8 bytes the number *is* the key, so equal numbers
   mean equal keys; longer keys are hashed word by word with MurmurHash3's 64-bit mixer. Keys of mixed
   widths are hashed as ``fmix64(sum((byte_j + 1) * P**j) ^ length * G)`` modulo 2**64, a polynomial over
   their bytes;
2. the records are sorted by that number, so equal keys end up next to each other;
3. for hashes, neighbours with the same number are compared (as word rows, or byte for byte in chunks), so a
   collision never merges two keys. The sort is not stable, so two colliding keys may interleave
   (``a, b, a``): then each record is its own run and all of them are kept. A collision can only make
   compaction keep more than it must, never remove a record it must keep;
4. in each run of equal keys the record with the highest index (the highest offset) is the latest.

Memory: about 40 bytes per record plus one copy of the key bytes (when they are hashed).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pylog.record import DecodedBatch

__all__ = ["latest_mask"]

_U64 = np.uint64
_P = _U64(0x100000001B3)  # FNV-1a's 64-bit prime: odd, so every power is invertible mod 2**64
_G = _U64(0x9E3779B97F4A7C15)
_M1 = _U64(0xFF51AFD7ED558CCD)
_M2 = _U64(0xC4CEB9FE1A85EC53)
_S33 = _U64(33)
_COMPARE_CHUNK = 1 << 22  # key bytes compared per numpy pass when hashes collide or keys repeat


def latest_mask(
    batches: Sequence[DecodedBatch], participates: npt.NDArray[np.bool_] | None = None
) -> npt.NDArray[np.bool_]:
    """For every record of ``batches`` (in offset order): True when it is the latest record of its key.

    Records without a key, and records outside ``participates`` (one flag per record, e.g. False for
    aborted transactional records), are never latest and never hide an earlier record of their key."""
    total = sum(len(b.offsets) for b in batches)
    out = np.zeros(total, dtype=np.bool_)
    valid = np.concatenate([b.key_valid for b in batches]) if batches else out
    if participates is not None:
        valid = valid & participates
    idx = np.flatnonzero(valid)
    if not len(idx):
        return out
    width = _width(batches)
    words = None
    if width > 0:  # one key width: keys as rows of 64-bit words
        words = np.concatenate([_words(b, width) for b in batches])
        numbers = words[:, 0].copy() if words.shape[1] == 1 else _fold(words)
    else:
        numbers = np.concatenate([_polynomial(b) for b in batches])
    order = idx[np.argsort(numbers[idx])]
    same = numbers[order[1:]] == numbers[order[:-1]]
    if (words is None or words.shape[1] > 1) and same.any():  # hashes: check that the keys are equal
        pairs = np.flatnonzero(same)
        a, b = order[pairs], order[pairs + 1]
        same[pairs] = (words[a] == words[b]).all(axis=1) if words is not None else _equal_keys(batches, a, b)
    runs = np.flatnonzero(np.concatenate(([True], ~same)))
    out[np.maximum.reduceat(order, runs)] = True
    return out


def _width(batches: Sequence[DecodedBatch]) -> int:
    """The width shared by every non-null key, or -1 (widths differ, or all keys are null or empty)."""
    found = -1
    for b in batches:
        lens = np.diff(b.key_offsets)[b.key_valid]
        if not len(lens):
            continue
        lo, hi = int(lens.min()), int(lens.max())
        if lo != hi or (found >= 0 and lo != found):
            return -1
        found = lo
    return found if found > 0 else -1


def _words(b: DecodedBatch, width: int) -> npt.NDArray[np.uint64]:
    """The keys of ``b`` (all ``width`` bytes long) zero-padded to rows of 64-bit words; null keys are zero."""
    k = (width + 7) // 8
    rows = np.zeros((len(b.offsets), 8 * k), dtype=np.uint8)
    rows[b.key_valid, :width] = np.frombuffer(b.key_data, dtype=np.uint8).reshape(-1, width)
    return rows.view(_U64)


def _fold(words: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """A 64-bit hash of each row of words."""
    h = _fmix(words[:, 0] ^ _G)
    for j in range(1, words.shape[1]):
        h = _fmix(h ^ words[:, j])
    return h


def _polynomial(b: DecodedBatch) -> npt.NDArray[np.uint64]:
    """A 64-bit hash of each key of ``b``, of any lengths (0 for a null key)."""
    data = np.frombuffer(b.key_data, dtype=np.uint8)
    lens = np.diff(b.key_offsets)
    out = np.zeros(len(lens), dtype=_U64)
    if len(data):
        starts = b.key_offsets[:-1]
        within = np.arange(len(data)) - np.repeat(starts, lens)
        terms = (data.astype(_U64) + _U64(1)) * _powers(int(lens.max()))[within]
        filled = lens > 0
        out[filled] = np.add.reduceat(terms, starts[filled], dtype=_U64)
    return _fmix(out ^ (lens.astype(_U64) * _G))


_POWERS = np.ones(1, dtype=_U64)


def _powers(n: int) -> npt.NDArray[np.uint64]:
    """``P**j`` modulo 2**64 for j in [0, n) (a shared table, grown on demand)."""
    global _POWERS
    if len(_POWERS) < n:
        table = np.full(max(n, 2 * len(_POWERS), 64), _P, dtype=_U64)
        table[0] = 1
        _POWERS = np.cumprod(table, dtype=_U64)
    return _POWERS[:n]


def _fmix(h: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """MurmurHash3's 64-bit finalizer, in place."""
    h ^= h >> _S33
    h *= _M1
    h ^= h >> _S33
    h *= _M2
    h ^= h >> _S33
    return h


def _equal_keys(
    batches: Sequence[DecodedBatch], a: npt.NDArray[np.intp], b: npt.NDArray[np.intp]
) -> npt.NDArray[np.bool_]:
    """Whether the key of record ``a[i]`` equals the key of record ``b[i]``, byte for byte."""
    keys = np.concatenate([np.frombuffer(x.key_data, dtype=np.uint8) for x in batches])
    bases = np.cumsum([0] + [len(x.key_data) for x in batches[:-1]])
    starts = np.concatenate([x.key_offsets[:-1] + base for x, base in zip(batches, bases, strict=True)])
    lens = np.concatenate([np.diff(x.key_offsets) for x in batches])
    equal: npt.NDArray[np.bool_] = lens[a] == lens[b]
    todo = np.flatnonzero(equal & (lens[a] > 0))
    if not len(todo):
        return equal
    sizes = lens[a[todo]]
    ends = np.cumsum(sizes)
    cuts = np.searchsorted(ends, np.arange(_COMPARE_CHUNK, int(ends[-1]), _COMPARE_CHUNK), side="right")
    for part in np.split(np.arange(len(todo)), np.unique(cuts)):
        if not len(part):
            continue
        pick = todo[part]
        n = sizes[part]
        first = np.cumsum(n) - n
        within = np.arange(int(n.sum())) - np.repeat(first, n)
        differ = keys[np.repeat(starts[a[pick]], n) + within] != keys[np.repeat(starts[b[pick]], n) + within]
        equal[pick[np.logical_or.reduceat(differ, first)]] = False
    return equal
