"""docs/tiered-storage.md's Python examples each run on their own (a reader who ran the first one, which tiers
the data the others read, and then jumps to a section): every name a block uses, it defines or imports."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[3] / "docs" / "tiered-storage.md"
_PYTHON = re.compile(r"(<!-- skip -->\s*\n)?```python[^\n]*\n(.*?)\n```", re.S)


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_each_python_example_runs_alone_after_the_first(tmp_path: Path) -> None:
    blocks = [m.group(2) for m in _PYTHON.finditer(PAGE.read_text()) if not m.group(1)]
    assert len(blocks) >= 4
    first = _run(blocks[0], tmp_path)
    assert first.returncode == 0, first.stderr
    for n, code in enumerate(blocks[1:], start=2):
        done = _run(code, tmp_path)  # a fresh interpreter: nothing carried over from the blocks before
        assert done.returncode == 0, f"block {n}:\n{code}\n{done.stderr}"
