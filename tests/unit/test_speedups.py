"""Which per-record path pylog uses, and how a user sees and chooses it (pylog.speedups)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from pylog import record, speedups
from pylog.cli import main

BUILT = importlib.util.find_spec("pylog._speedups") is not None


def _in_subprocess(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != speedups.ENV} | env
    return subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_version_says_which_path_is_in_use(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("pylog ") and f"per-record paths: {speedups.PATH}" in out
    assert ("compiled" in out) == speedups.COMPILED


def test_the_environment_variable_forces_the_pure_path() -> None:
    code = "import pylog.speedups as s, pylog.record as r; print(s.COMPILED, r._core is None, s.PATH)"
    assert _in_subprocess(code, PYLOG_PURE_PYTHON="1") == "False True pure Python (PYLOG_PURE_PYTHON is set)"
    if BUILT:  # "0" and "" mean: not forced
        assert _in_subprocess(code, PYLOG_PURE_PYTHON="0").startswith("True False compiled")


@pytest.mark.skipif(not BUILT, reason="pylog._speedups is not built")
def test_the_compiled_path_is_used_when_built_and_not_forced() -> None:
    assert (os.environ.get(speedups.ENV, "") in ("", "0")) == speedups.COMPILED
    assert (record._core is not None) == speedups.COMPILED
