from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import pylog


@pytest.fixture
def log_dir(tmp_path: os.PathLike[str]) -> str:
    return os.path.join(os.fspath(tmp_path), "log")


@pytest.fixture
def clock() -> pylog.ManualClock:
    return pylog.ManualClock(1_700_000_000_000)


@pytest.fixture
def log(log_dir: str, clock: pylog.ManualClock) -> Iterator[pylog.Log]:
    with pylog.open(log_dir, clock=clock) as opened:
        yield opened
