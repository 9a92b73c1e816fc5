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

What a block prints is checked too. A ```` ```text ```` block that directly follows a python or bash block
(nothing but blank lines between) is that block's output: everything it printed, stdout and stderr in the
order a terminal shows them (the blocks run unbuffered), so a stray warning is a mismatch. Lines are compared
without trailing spaces; ``...`` inside a line stands for any text (a time, a path, a byte count), and a line
of only ``...`` for any number of lines (output left out). A block that prints anything must be followed by
its output block, so that no example's output goes unchecked, and a page's Python session must print nothing
when it ends (a warning at exit is output no page shows).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import select
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
_BLOCK = re.compile(
    r"(?P<skip><!-- skip -->\s*\n)?```(?P<lang>python|bash)(?P<attrs>[^\n]*)\n(?P<code>.*?)\n```[ \t]*(?:\n|\Z)"
    r"(?:\s*\n)?(?:```text[ \t]*\n(?P<output>.*?)\n```)?",
    re.S,
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


class Block(NamedTuple):
    lang: str
    attrs: str
    code: str
    output: str | None  # what the page says it prints, when it says


def _blocks(page: Path) -> list[Block]:
    found = _BLOCK.finditer(page.read_text())
    return [Block(m["lang"], m["attrs"], m["code"], m["output"]) for m in found if not m["skip"]]


def _output_pattern(expected: str) -> re.Pattern[str]:
    """The documented output as a pattern: ``...`` in a line is any text, a line of ``...`` any lines."""
    parts = []
    for line in expected.rstrip().splitlines():
        line = line.rstrip()
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(r"[^\n]*?".join(re.escape(piece) for piece in line.split("...")) + r"\n")
    return re.compile("".join(parts))


def _normalized(printed: str) -> str:
    lines = [line.rstrip() for line in printed.rstrip().splitlines()]
    return "".join(line + "\n" for line in lines)


def output_mismatch(expected: str, printed: str) -> str | None:
    """None when ``printed`` is what ``expected`` documents, else a diff of the two."""
    if _output_pattern(expected).fullmatch(_normalized(printed)):
        return None
    diff = difflib.unified_diff(
        _normalized(expected).splitlines(),
        _normalized(printed).splitlines(),
        "documented",
        "printed",
        lineterm="",
    )
    return "\n".join(diff)


def _env() -> dict[str, str]:
    bin_dir = os.path.dirname(sys.executable)  # the virtualenv's bin: python and the pylog command
    env = {k: v for k, v in os.environ.items() if k != "PYLOG_DIR"}
    env.update(PYTHONPATH=str(ROOT / "src"), PATH=bin_dir + os.pathsep + env.get("PATH", ""))
    env["PYTHONUNBUFFERED"] = "1"  # stdout and stderr interleaved as a terminal shows them
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
        printed = self.printed_since(seen)
        return answer == "ok", printed if answer in ("ok", "failed") else f"{printed}\n{answer}"

    def printed_since(self, position: int) -> str:
        with open(self.output_path) as f:
            f.seek(position)
            return f.read()

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
            end_of_blocks = session.output_path.stat().st_size
            status = session.close()
    assert status == 0, (
        f"the Python session did not end cleanly ({status}):\n" + (tmp_path / "session.out").read_text()
    )
    at_exit = session.printed_since(end_of_blocks)
    if at_exit:
        raise AssertionError(
            f"the Python session printed this when it ended, after the last block:\n{at_exit}"
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
    r = subprocess.run(
        command,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        timeout=BLOCK_TIMEOUT_S,
    )
    return r.returncode == 0, r.stdout


def run_page(page: Path, tmp_path: Path) -> None:
    """Run the blocks of ``page`` in order, in one directory and one Python session; fail at the first block
    that fails or does not print what the page shows, naming it."""
    cwd = tmp_path / "reader"
    cwd.mkdir(parents=True)
    env = _env()
    with _session(tmp_path, cwd, env) as python:
        for i, block in enumerate(_blocks(page)):
            name = f"{page.name} block {i + 1}"
            if block.lang == "python" and _TEST_MODULE.search(block.attrs) is None:
                ok, printed = python.run(name, block.code)
            else:
                ok, printed = _run_process(block.lang, block.attrs, block.code, cwd, env)
            assert ok, (
                f"{name} ({block.lang}) failed, run after the blocks before it:\n{block.code}\n"
                f"--- output ---\n{printed}"
            )
            if block.output is None and printed.strip():
                raise AssertionError(
                    f"{name} ({block.lang}) prints this, and the page does not show it (add a ```text block "
                    f"after the block):\n{block.code}\n--- printed ---\n{printed}"
                )
            mismatch = None if block.output is None else output_mismatch(block.output, printed)
            if mismatch is not None:
                raise AssertionError(
                    f"{name} ({block.lang}) does not print what the page shows:\n{block.code}\n{mismatch}"
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


def test_a_block_prints_what_the_page_shows(tmp_path: Path) -> None:
    """The ```text block after a block is its whole output, stderr included; ``...`` elides."""
    shown = tmp_path / "shown.md"
    shown.write_text(
        "```python\nimport sys\nprint([1, 3])\nprint('took', 0.25, 's')\n```\n\n"
        "```text\n[1, 3]\ntook ... s\n```\n"
        "```bash\nfor i in 1 2 3 4; do echo line $i; done; echo done >&2\n```\n"
        "```text\nline 1\n...\ndone\n```\n"
    )
    run_page(shown, tmp_path / "a")
    wrong_cases = [
        ("print([3])", "[1, 3]", "-[1, 3]\n+[3]"),  # a value the page does not print
        ("import sys\nprint(1)\nprint('oops', file=sys.stderr)", "1", "+oops"),  # a stray stderr line
        ("print(1)", "1\n2", "-2"),  # a line the page shows and the block does not print
    ]
    for n, (code, output, diff) in enumerate(wrong_cases):
        wrong = tmp_path / "wrong.md"
        wrong.write_text(f"```python\n{code}\n```\n```text\n{output}\n```\n")
        with pytest.raises(
            AssertionError, match=r"wrong\.md block 1 .*does not print what the page shows"
        ) as e:
            run_page(wrong, tmp_path / f"b{n}")
        assert diff in str(e.value)
    unshown = tmp_path / "unshown.md"
    unshown.write_text("```python\nx = 1\n```\n```bash\necho 42\n```\n")
    with pytest.raises(
        AssertionError, match=r"unshown\.md block 2 \(bash\) prints this, and the page does not"
    ):
        run_page(unshown, tmp_path / "d")
    at_exit = tmp_path / "at_exit.md"
    at_exit.write_text("```python\nimport atexit\natexit.register(print, 'closing failed')\n```\n")
    with pytest.raises(
        AssertionError, match=r"printed this when it ended, after the last block:\n+closing failed"
    ):
        run_page(at_exit, tmp_path / "c")
    assert output_mismatch("a\n...\nz", "a\nz\n") is None
    assert output_mismatch("a ... z", "a b\nc z") is not None  # "..." in a line stays in that line


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
