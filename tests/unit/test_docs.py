"""Every ```python and ```bash block in docs/*.md and README.md runs, so the examples cannot rot.

A page runs as a reader follows it: its blocks in order, in one working directory that starts empty, the
python blocks in one interpreter (a reader's Python session: names and open objects carry over from block
to block), the shell blocks with ``bash -e`` and the ``pylog`` command on ``PATH``. So a page whose second
block repeats what its first already did (creating the same topic again) fails here as it fails for the
reader. Every page is treated this way: each one is read top to bottom, and a page of independent examples
runs in sequence as long as its examples do not collide, which is what a reader trying them one after the
other needs anyway.

A block preceded by a ``<!-- skip -->`` line is not run (it needs a cluster, a shared directory, or loops
forever). A python block titled like a test module (```` ```python title="test_app.py" ````) is written to
that file and run with pytest, in the same directory. Spark pages are covered by ``tests/spark``.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
_BLOCK = re.compile(
    r"(?P<skip><!-- skip -->\s*\n)?```(?P<lang>python|bash)(?P<attrs>[^\n]*)\n(?P<code>.*?)\n```", re.S
)
_TEST_MODULE = re.compile(r'title="(test_\w+\.py)"')
_SKIP_PAGES = {"spark.md"}  # needs a SparkSession: covered by tests/spark
BLOCK_TIMEOUT_S = 120  # a block that runs longer is stuck (the longest examples take a few seconds)

# The reader's Python session: runs each block it is sent (one JSON line: name, code) in one namespace and
# answers "ok" or "failed" on its own channel; what the blocks print goes to stderr's file.
_SESSION = r"""
import json, os, sys, traceback
answers = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
namespace = {"__name__": "__main__"}
for line in sys.stdin:
    block = json.loads(line)
    try:
        exec(compile(block["code"], block["name"], "exec"), namespace)
        answer = "ok"
    except BaseException:
        traceback.print_exc()
        answer = "failed"
    sys.stdout.flush()
    sys.stderr.flush()
    answers.write(answer + "\n")
"""


def _blocks(page: Path) -> list[tuple[str, str, str]]:
    found = _BLOCK.finditer(page.read_text())
    return [(m["lang"], m["attrs"], m["code"]) for m in found if not m["skip"]]


def _env() -> dict[str, str]:
    bin_dir = os.path.dirname(sys.executable)  # the virtualenv's bin: python and the pylog command
    env = {k: v for k, v in os.environ.items() if k != "PYLOG_DIR"}
    env.update(PYTHONPATH=str(ROOT / "src"), PATH=bin_dir + os.pathsep + env.get("PATH", ""))
    return env


class _PythonSession:
    """One interpreter that runs a page's python blocks in turn, as a reader's Python session would."""

    def __init__(self, cwd: Path, output: IO[str], env: dict[str, str]) -> None:
        self.output_path = Path(output.name)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SESSION],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=output,
            text=True,
        )

    def run(self, name: str, code: str) -> tuple[bool, str]:
        """Run one block; returns whether it succeeded and what it printed."""
        assert self.proc.stdin is not None
        seen = self.output_path.stat().st_size
        try:
            self.proc.stdin.write(json.dumps({"name": name, "code": code}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return False, f"the Python session had ended (exit status {self.proc.wait()})"
        answer = self._answer()
        with open(self.output_path) as f:
            f.seek(seen)
            printed = f.read()
        return answer == "ok", printed if answer in ("ok", "failed") else f"{printed}\n{answer}"

    def _answer(self) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], BLOCK_TIMEOUT_S)
        if not ready:
            return f"still running after {BLOCK_TIMEOUT_S} s"
        return self.proc.stdout.readline().strip() or f"the Python session ended ({self.proc.wait()})"

    def close(self) -> int:
        """End the session as a reader would (end of input); returns its exit status."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with suppress(BrokenPipeError):
            self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return -1
        finally:
            self.proc.stdout.close()


@contextmanager
def _session(tmp_path: Path, cwd: Path, env: dict[str, str]) -> Iterator[_PythonSession]:
    with open(tmp_path / "session.out", "w") as output:
        session = _PythonSession(cwd, output, env)
        try:
            yield session
        finally:
            status = session.close()
    assert status == 0, (
        f"the Python session did not end cleanly ({status}):\n" + (tmp_path / "session.out").read_text()
    )


def _run_process(lang: str, attrs: str, code: str, cwd: Path, env: dict[str, str]) -> tuple[bool, str]:
    """A shell block, or a test module run with pytest: each a process of its own, in the reader's directory."""
    if lang == "bash":
        command = ["bash", "-e", "-o", "pipefail", "-c", code]
    else:
        module = _TEST_MODULE.search(attrs)
        assert module is not None
        (cwd / module[1]).write_text(code + "\n")
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", module[1]]
    r = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env, timeout=BLOCK_TIMEOUT_S)
    return r.returncode == 0, f"--- stdout ---\n{r.stdout}\n--- stderr ---\n{r.stderr}"


def run_page(page: Path, tmp_path: Path) -> None:
    """Run the blocks of ``page`` in order, in one directory and one Python session; fail at the first block
    that fails, naming it."""
    cwd = tmp_path / "reader"
    cwd.mkdir(parents=True)
    env = _env()
    with _session(tmp_path, cwd, env) as python:
        for i, (lang, attrs, code) in enumerate(_blocks(page)):
            name = f"{page.name} block {i + 1}"
            if lang == "python" and _TEST_MODULE.search(attrs) is None:
                ok, printed = python.run(name, code)
            else:
                ok, printed = _run_process(lang, attrs, code, cwd, env)
            assert ok, (
                f"{name} ({lang}) failed, run after the blocks before it:\n{code}\n--- output ---\n{printed}"
            )


@pytest.mark.parametrize(
    "page", [p for p in PAGES if _blocks(p) and p.name not in _SKIP_PAGES], ids=lambda p: p.name
)
def test_examples_run(page: Path, tmp_path: Path) -> None:
    run_page(page, tmp_path)


def test_a_page_runs_as_one_reader_session(tmp_path: Path) -> None:
    """Names and files carry over from block to block, and a block that redoes what an earlier one did fails
    as it would for the reader."""
    follows = tmp_path / "follows.md"
    follows.write_text(
        "```python\nimport pylog\nlog = pylog.open('./data')\nlog.create_topic('t')\n```\n"
        "```bash\ntest -d data/t-0\n```\n"
        "```python\nlog.producer().send('t', 1).get()\nlog.close()\n```\n"
    )
    run_page(follows, tmp_path / "a")
    repeats = tmp_path / "repeats.md"
    repeats.write_text(
        "```python\nimport pylog\nwith pylog.open('./data') as log:\n    log.create_topic('t')\n```\n" * 2
    )
    with pytest.raises(AssertionError, match=r"(?s)repeats\.md block 2 .*TopicExistsError"):
        run_page(repeats, tmp_path / "b")


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
