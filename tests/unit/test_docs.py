"""Every ```python and ```bash block in docs/*.md and README.md runs, so the examples cannot rot.

A block preceded by a ``<!-- skip -->`` line is not run (it needs a cluster, a shared directory, or loops
forever). Each block is self-contained: it runs in its own interpreter (``bash -e`` for shell blocks, with the
``pylog`` command on ``PATH``), in a fresh empty directory. A python block titled like a test module
(```` ```python title="test_app.py" ````) is written to that file and run with pytest. Spark pages are covered
by ``tests/spark``.
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
_BLOCK = re.compile(
    r"(?P<skip><!-- skip -->\s*\n)?```(?P<lang>python|bash)(?P<attrs>[^\n]*)\n(?P<code>.*?)\n```", re.S
)
_TEST_MODULE = re.compile(r'title="(test_\w+\.py)"')
_SKIP_PAGES = {"spark.md"}  # needs a SparkSession: covered by tests/spark


def _blocks(page: Path) -> list[tuple[str, str, str]]:
    found = _BLOCK.finditer(page.read_text())
    return [(m["lang"], m["attrs"], m["code"]) for m in found if not m["skip"]]


def _command(lang: str, attrs: str, code: str, cwd: Path) -> list[str]:
    if lang == "bash":
        return ["bash", "-e", "-o", "pipefail", "-c", code]
    module = _TEST_MODULE.search(attrs)
    if module is None:
        return [sys.executable, "-c", code]
    (cwd / module[1]).write_text(code + "\n")
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", module[1]]


@pytest.mark.parametrize(
    "page", [p for p in PAGES if _blocks(p) and p.name not in _SKIP_PAGES], ids=lambda p: p.name
)
def test_examples_run(page: Path, tmp_path: Path) -> None:
    bin_dir = os.path.dirname(sys.executable)  # the virtualenv's bin: python and the pylog command
    env = {k: v for k, v in os.environ.items() if k != "PYLOG_DIR"}
    env.update(PYTHONPATH=str(ROOT / "src"), PATH=bin_dir + os.pathsep + env.get("PATH", ""))
    for i, (lang, attrs, code) in enumerate(_blocks(page)):
        cwd = tmp_path / f"block{i + 1}"
        cwd.mkdir()
        command = _command(lang, attrs, code, cwd)
        r = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, (
            f"{page.name} block {i + 1} ({lang}) failed:\n{code}\n--- stdout ---\n{r.stdout}"
            f"\n--- stderr ---\n{r.stderr}"
        )


def test_every_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = [p.name for p in (ROOT / "docs").glob("*.md") if p.name not in nav]
    assert not missing, f"pages missing from mkdocs.yml nav: {missing}"


def test_pages_link_only_to_existing_pages_and_images() -> None:
    """mkdocs --strict checks this too; this catches it in a plain pytest run (README links included)."""
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.name}: {target}")
    assert not broken, f"broken links: {broken}"
