"""Floors: the least work Python (a loop) or numpy (no loop) can do for the same records.

They set the scale for pylog's figures: a per-record API cannot beat the Python loop floor by much, and a
vectorized one cannot beat the numpy floor. None of them is durable or indexed: they only move bytes.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from benchmarks.cases import case
from benchmarks.cases.workload import KEY_SIZE, PAYLOAD_SIZE, VALUE_SIZE, arrays, byte_lists, result, settle

_FIXED = np.dtype([("length", "<u4"), ("key", "u1", KEY_SIZE), ("value", "u1", VALUE_SIZE)])
_PREFIX = struct.Struct("<I")
_FRAME = struct.Struct("<II")
_BUFFER = 1 << 20
_PAGE_CACHE = "none: the bytes reach the page cache only"


def _fixed_records(n: int, seed: int) -> np.ndarray:
    keys, values = arrays(n, seed)
    recs = np.empty(n, dtype=_FIXED)
    recs["length"] = PAYLOAD_SIZE
    recs["key"] = keys
    recs["value"] = values
    return recs


_PASSES = 3


@case(
    "floor_msgpack_write",
    group="write",
    kind="floor",
    fsync=_PAGE_CACHE,
    description="Python loop: `msgpack.Packer.pack((k, v))` + 4-byte length prefix to a buffered file",
)
def floor_msgpack_write(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    keys, values = byte_lists(records, seed)
    pack = msgpack.Packer().pack
    prefix = _PREFIX.pack
    path = workdir / "stream.bin"
    with open(path, "wb", buffering=_BUFFER) as f:
        write = f.write
        t0 = time.perf_counter()
        for k, v in zip(keys, values, strict=True):
            b = pack((k, v))
            write(prefix(len(b)) + b)
        f.flush()
        seconds = time.perf_counter() - t0
    return result(records, seconds, file_bytes=path.stat().st_size)


@case(
    "floor_kafkalike_write",
    group="write",
    kind="floor",
    fsync=_PAGE_CACHE,
    description="Python loop: msgpack `[offset, ts, k, v]` + (length, crc32) frame, a Kafka-like record",
)
def floor_kafkalike_write(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    keys, values = byte_lists(records, seed)
    pack = msgpack.Packer().pack
    frame = _FRAME.pack
    crc32 = zlib.crc32
    ts = int(time.time() * 1000)
    path = workdir / "frames.bin"
    with open(path, "wb", buffering=_BUFFER) as f:
        write = f.write
        t0 = time.perf_counter()
        for offset, (k, v) in enumerate(zip(keys, values, strict=True)):
            b = pack([offset, ts, k, v])
            write(frame(len(b), crc32(b)) + b)
        f.flush()
        seconds = time.perf_counter() - t0
    return result(records, seconds, file_bytes=path.stat().st_size)


@case(
    "floor_numpy_write",
    group="write",
    kind="floor",
    fsync=_PAGE_CACHE,
    description="numpy builds N fixed 120-byte records (length + key + value), one `write()`",
)
def floor_numpy_write(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _numpy_write(records, seed, workdir, sync=False)


@case(
    "floor_numpy_write_fsync",
    group="write",
    kind="floor",
    fsync="one fsync after the write",
    description="`floor_numpy_write` + `os.fsync` of the file",
)
def floor_numpy_write_fsync(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    return _numpy_write(records, seed, workdir, sync=True)


def _numpy_write(records: int, seed: int, workdir: Path, *, sync: bool) -> dict[str, Any]:
    keys, values = arrays(records, seed)
    path = workdir / "fixed.bin"
    with open(path, "wb", buffering=0) as f:
        t0 = time.perf_counter()
        recs = np.empty(records, dtype=_FIXED)
        recs["length"] = PAYLOAD_SIZE
        recs["key"] = keys
        recs["value"] = values
        f.write(recs.data)
        if sync:
            os.fsync(f.fileno())
        seconds = time.perf_counter() - t0
    return result(records, seconds, file_bytes=path.stat().st_size)


@case(
    "floor_msgpack_read",
    group="read",
    kind="floor",
    fsync="n/a (read)",
    description="`msgpack.Unpacker` over a plain msgpack stream of `(k, v)` (file written untimed)",
)
def floor_msgpack_read(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    keys, values = byte_lists(records, seed)
    path = workdir / "plain.msgpack"
    pack = msgpack.Packer().pack
    with open(path, "wb", buffering=_BUFFER) as f:
        for k, v in zip(keys, values, strict=True):
            f.write(pack((k, v)))
    del keys, values
    settle([path])
    n = 0
    with open(path, "rb") as f:
        t0 = time.perf_counter()
        for _k, _v in msgpack.Unpacker(f, read_size=_BUFFER, use_list=False):
            n += 1
        seconds = time.perf_counter() - t0
    return _read_result(records, n, seconds)


@case(
    "floor_mmap_unpackb_read",
    group="read",
    kind="floor",
    fsync="n/a (read)",
    description="Python loop on an mmap: 4-byte length prefix, then `msgpack.unpackb` of `(k, v)`",
)
def floor_mmap_unpackb_read(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    path = workdir / "stream.bin"
    floor_msgpack_write(records, seed, workdir)
    settle([path])
    unpackb = msgpack.unpackb
    prefix = _PREFIX.unpack_from
    n = 0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        t0 = time.perf_counter()
        pos, end = 0, len(mm)
        while pos < end:
            (size,) = prefix(mm, pos)
            pos += 4
            _k, _v = unpackb(view[pos : pos + size], use_list=False)
            pos += size
            n += 1
        seconds = time.perf_counter() - t0
        view.release()
    return _read_result(records, n, seconds)


@case(
    "floor_frombuffer_read",
    group="read",
    kind="floor",
    fsync="n/a (read)",
    description=(
        "`np.frombuffer` over an mmap of fixed 120-byte records + a copy of the value column (fastest of 3 "
        "passes in the process: the first touch of fresh memory by a virtual machine varies tenfold)"
    ),
)
def floor_frombuffer_read(records: int, seed: int, workdir: Path) -> dict[str, Any]:
    path = workdir / "fixed.bin"
    path.write_bytes(_fixed_records(records, seed).data)
    settle([path])
    passes = []
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        for _ in range(_PASSES):  # the fastest pass counts: memory first touched in a pass is noise here
            t0 = time.perf_counter()
            recs = np.frombuffer(mm, dtype=_FIXED)
            values = recs["value"].copy()
            n = len(recs)
            passes.append(time.perf_counter() - t0)
            del recs
    return _read_result(
        records, n, min(passes), checksum=int(values[:, 0].sum()), passes_s=[round(x, 4) for x in passes]
    )


def _read_result(expected: int, n: int, seconds: float, **extra: Any) -> dict[str, Any]:
    if n != expected:
        raise RuntimeError(f"read {n} records, expected {expected}")
    return result(n, seconds, **extra)
