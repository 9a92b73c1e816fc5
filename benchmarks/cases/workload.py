"""The shared workload and helpers: deterministic records, results, page-cache control.

Every case writes or reads the same records: a 16-byte key and a 100-byte value (116 bytes of payload), random
bytes drawn from ``numpy.random.default_rng(seed)``, so two runs with one seed see identical data. MB/s is
always payload bytes per second (10**6 bytes), whatever a store adds around them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "KEY_SIZE",
    "PAYLOAD_SIZE",
    "VALUE_SIZE",
    "Deadline",
    "arrays",
    "byte_lists",
    "cold_reads",
    "result",
    "settle",
    "skipped",
]

KEY_SIZE = 16
VALUE_SIZE = 100
PAYLOAD_SIZE = KEY_SIZE + VALUE_SIZE

Bytes2D = npt.NDArray[np.uint8]


def arrays(n: int, seed: int, value_size: int = VALUE_SIZE) -> tuple[Bytes2D, Bytes2D]:
    """``n`` keys and values as 2-D ``uint8`` arrays (one row per record)."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 256, size=(n, KEY_SIZE), dtype=np.uint8)
    values = rng.integers(0, 256, size=(n, value_size), dtype=np.uint8)
    return keys, values


def split_rows(a: Bytes2D) -> list[bytes]:
    """The rows of a 2-D ``uint8`` array as a list of ``bytes``."""
    flat = a.tobytes()
    width = a.shape[1]
    return [flat[i : i + width] for i in range(0, len(flat), width)]


def byte_lists(n: int, seed: int, value_size: int = VALUE_SIZE) -> tuple[list[bytes], list[bytes]]:
    """The records of :func:`arrays` as two lists of ``bytes``, what a Python caller holds."""
    keys, values = arrays(n, seed, value_size)
    return split_rows(keys), split_rows(values)


def result(records: int, seconds: float, nbytes: int | None = None, **extra: Any) -> dict[str, Any]:
    """A case's measurement; ``nbytes`` defaults to the payload of ``records`` workload records."""
    return {
        "status": "ok",
        "records": records,
        "seconds": seconds,
        "bytes": records * PAYLOAD_SIZE if nbytes is None else nbytes,
        **extra,
    }


def skipped(reason: str) -> dict[str, Any]:
    return {"status": "skipped", "reason": reason}


def cold_reads() -> bool:
    """True when the run asked for reads from a cold page cache (``run.py --cold``)."""
    return os.environ.get("PYLOG_BENCH_COLD") == "1"


def settle(paths: Iterable[Path]) -> None:
    """Call between a read case's untimed setup and its timed part.

    In cold mode, every file under ``paths`` is fsynced and its pages dropped from the page cache
    (``posix_fadvise(DONTNEED)``: only these files, no privileges needed), so the timed read comes from disk.
    Otherwise the files stay warm, as the setup just wrote them."""
    if not cold_reads():
        return
    for root in paths:
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for f in files:
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


class Deadline:
    """A wall-clock bound for loops that wait on something outside the process."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def passed(self) -> bool:
        return time.monotonic() >= self.end
