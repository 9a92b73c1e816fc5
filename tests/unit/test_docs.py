"""Every ```python block in docs/*.md and README.md runs, so the examples cannot rot.

A block preceded by a ``<!-- skip -->`` line is not run (it needs a cluster, a shared directory, or loops
forever). Each block is self-contained: it runs in its own interpreter, in a fresh empty directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
_BLOCK = re.compile(r"(?P<skip><!-- skip -->\s*\n)?```python\n(?P<code>.*?)\n```", re.S)


def _blocks(page: Path) -> list[str]:
    return [m["code"] for m in _BLOCK.finditer(page.read_text()) if not m["skip"]]


def _spark_page(page: Path) -> bool:
    return page.name == "spark.md"  # needs a SparkSession: covered by tests/spark


@pytest.mark.parametrize(
    "page", [p for p in PAGES if _blocks(p) and not _spark_page(p)], ids=lambda p: p.name
)
def test_examples_run(page: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for i, code in enumerate(_blocks(page)):
        cwd = tmp_path / f"block{i + 1}"
        cwd.mkdir()
        r = subprocess.run(
            [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, env=env, timeout=120
        )
        assert r.returncode == 0, f"{page.name} block {i + 1} failed:\n{code}\n--- stderr ---\n{r.stderr}"


def test_every_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = [p.name for p in (ROOT / "docs").glob("*.md") if p.name not in nav]
    assert not missing, f"pages missing from mkdocs.yml nav: {missing}"
