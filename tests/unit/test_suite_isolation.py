"""What ``tests/conftest.py`` promises the suite: each test in an empty working directory of its own, no
``PYLOG_*`` settings from outside, a failure for files left behind, and other test orders on request.
Checked by running pytest with that conftest over small probe tests in a scratch directory."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PROBES = """
import os


def _note(name):
    with open(os.environ["PROBE_LOG"], "a") as f:
        f.write(f"{name}\\t{os.getcwd()}\\t{sorted(os.listdir())}\\t{os.environ.get('PYLOG_DIR')}\\n")


def test_a():
    _note("a")


def test_b():
    _note("b")


def test_c():
    _note("c")
"""

_LEAVES = """
def test_leaves_a_file():
    open("pylog-data", "w").close()
"""


def _pytest(
    tmp_path: Path, module: str, source: str, *args: str, ignore_sigint: bool = False
) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    suite = tmp_path / "suite"
    suite.mkdir(exist_ok=True)
    shutil.copy(ROOT / "tests" / "conftest.py", suite / "conftest.py")
    (suite / module).write_text(source)
    log = tmp_path / "probe.log"
    log.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PROBE_LOG": str(log), "PYLOG_DIR": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", module, *args],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None,
    )
    lines = log.read_text().splitlines() if log.exists() else []
    return r, [line.split("\t") for line in lines]


def test_each_test_has_an_empty_working_directory_and_no_pylog_settings(tmp_path: Path) -> None:
    r, notes = _pytest(tmp_path, "test_probes.py", _PROBES)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [n[0] for n in notes] == ["a", "b", "c"]
    cwds = [n[1] for n in notes]
    assert len(set(cwds)) == 3 and str(tmp_path / "suite") not in cwds
    assert all(n[2] == "[]" and n[3] == "None" for n in notes), notes


def test_reverse_and_seeded_random_orders(tmp_path: Path) -> None:
    r, notes = _pytest(tmp_path, "test_probes.py", _PROBES, "--order=reverse")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [n[0] for n in notes] == ["c", "b", "a"]
    orders = []
    for _ in range(2):
        r, notes = _pytest(tmp_path, "test_probes.py", _PROBES, "--order=random:7")
        assert r.returncode == 0, r.stdout + r.stderr
        orders.append([n[0] for n in notes])
    assert orders[0] == orders[1] and sorted(orders[0]) == ["a", "b", "c"]
    r, _ = _pytest(tmp_path, "test_probes.py", _PROBES, "--order=sideways")
    assert r.returncode != 0 and "--order must be" in r.stderr


def test_a_test_that_leaves_files_in_its_working_directory_fails(tmp_path: Path) -> None:
    r, _ = _pytest(tmp_path, "test_leaves.py", _LEAVES)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "files left in the working directory: ['pylog-data']" in r.stdout
    assert not (tmp_path / "suite" / "pylog-data").exists()


_INTERRUPTS = """
import signal
import subprocess
import sys


def test_a_child_process_can_be_interrupted():
    child = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE)
    child.stdout.readline()
    child.send_signal(signal.SIGINT)
    child.stdout.close()
    assert child.wait(timeout=60) == -signal.SIGINT  # interrupted, not ignored
"""


def test_tests_can_interrupt_their_processes_when_pytest_was_started_ignoring_sigint(tmp_path: Path) -> None:
    r, _ = _pytest(tmp_path, "test_interrupts.py", _INTERRUPTS, ignore_sigint=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_test_modules_have_unique_basenames() -> None:
    """The test folders are not packages, so pytest imports each test module by its basename: two files of
    one name in different folders stop the whole run at collection ('import file mismatch')."""
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
