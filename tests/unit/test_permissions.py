"""Permission problems are reported as what they are: a directory this user cannot read or write is a
:class:`~pylog.errors.PermissionDeniedError` (a ``PermissionError``) naming the path, the permission missing,
the user and the directory's owner and mode, from the library and from the CLI; a ``--dir`` that is a file
says so. Root is never denied by file modes, so as root the checks run in a subprocess switched to the
``nobody`` user (skipped where that is not possible); as another user, in a directory that user made
unreadable or unwritable."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import pylog
from pylog.cli import main as cli_main
from pylog.errors import NotALogDirectoryError, PermissionDeniedError
from pylog.partition import files

_PROBE = """
import json, sys
import pylog
from pylog.cli import main
what, path = sys.argv[1:3]
try:
    if what == "open":
        pylog.open(path).close()
    else:
        pylog.repair(path)
    print(json.dumps({"error": None}))
except Exception as exc:
    print(json.dumps({
        "error": type(exc).__name__,
        "permission_error": isinstance(exc, PermissionError),
        "path": getattr(exc, "path", None),
        "needed": getattr(exc, "needed", None),
        "message": str(exc),
    }))
print(json.dumps({"cli": main(["topics" if what == "open" else "repair", *(["list"] if what == "open" else []),
                               "--dir", path])}))
"""


def _other_user() -> list[str] | None:
    """The command prefix that runs a process as a user file modes apply to: ``nobody`` when this is root."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        return None
    if setpriv is None:
        return None
    return [setpriv, f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user may enter (a test's own temporary directory sits in one only root enters)."""
    path = Path(tempfile.mkdtemp(prefix="pylog-permissions-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for sub in path.rglob("*"):
            if sub.is_dir():
                sub.chmod(0o755)
        shutil.rmtree(path)


def _probe(what: str, path: Path) -> tuple[dict[str, object], int, str]:
    """Open (``what="open"``) or repair ``path`` as the other user, then run the matching CLI command: the
    library's error as a dict, the CLI's exit status and its stderr."""
    prefix = _other_user()
    if prefix is None:
        pytest.skip("no way to run a process as another user here (setpriv, user nobody)")
    src = str(Path(pylog.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src}
    done = subprocess.run(
        [*prefix, sys.executable, "-c", _PROBE, what, str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(path.parent),
        timeout=120,
    )
    if done.returncode != 0 and "No module named" in done.stderr:
        pytest.skip(f"the other user cannot import pylog here: {done.stderr.strip()[-200:]}")
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 2, done.stdout + done.stderr
    return lines[0], int(lines[1]["cli"]), done.stderr


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        h.update(str(path.relative_to(root)).encode())
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()


def _make_log(root: Path) -> None:
    with pylog.open(root) as log:
        log.create_topic("t")
        producer = log.producer()
        for i in range(20):
            producer.send("t", i)
        producer.close()


def test_an_unreadable_log_directory_is_a_permission_error(shared_dir: Path) -> None:
    root = shared_dir / "log"
    _make_log(root)
    root.chmod(0o300 if os.geteuid() != 0 else 0o700)  # the other user: no read, no search
    error, status, stderr = _probe("open", root)
    assert error["error"] == "PermissionDeniedError" and error["permission_error"]
    assert error["needed"] == "read" and error["path"] == str(root)
    message = str(error["message"])
    assert f"cannot read the log directory {root}" in message and "r-x" in message and "mode drwx" in message
    assert status == 1 and f"cannot read the log directory {root}" in stderr
    assert (
        "no manifest" not in stderr
    )  # what it said before: the directory is a log, this user may not read it


def test_repair_by_a_user_who_cannot_write_the_log_is_a_permission_error(shared_dir: Path) -> None:
    root = shared_dir / "log"
    _make_log(root)
    root.chmod(0o555 if os.geteuid() != 0 else 0o755)  # readable, not writable by the other user
    before = _digest(root)
    error, status, stderr = _probe("repair", root)
    assert error["error"] == "PermissionDeniedError" and error["needed"] == "write"
    assert f"cannot change the log directory {root}" in str(error["message"])
    assert status == 1 and "permission denied: cannot change the log directory" in stderr
    assert "Errno 13" not in stderr and ".open.lock" not in stderr
    root.chmod(0o755)
    assert _digest(root) == before  # nothing was changed


def test_repair_of_a_partition_whose_files_the_user_cannot_write_is_a_permission_error(
    shared_dir: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: a directory owned by another user")
    root = shared_dir / "log"
    _make_log(root)
    segment = files.segment_path(files.partition_dir(str(root), "t", 0), 0, files.LOG)
    with open(segment, "r+b") as f:  # damage for repair to cut
        f.seek(70)
        byte = f.read(1)
        f.seek(70)
        f.write(bytes([byte[0] ^ 1]))
    nobody = pwd.getpwnam("nobody")
    os.chown(root, nobody.pw_uid, nobody.pw_gid)  # the log directory is the user's, the partition is not
    for entry in root.iterdir():
        if entry.is_file():
            os.chown(entry, nobody.pw_uid, nobody.pw_gid)
    error, status, stderr = _probe("repair", root)
    assert error["error"] == "PermissionDeniedError" and error["needed"] == "write"
    assert "repair needs to write the files of the log directory" in str(error["message"])
    assert "Permission denied" in str(error["message"])
    assert status == 1 and "repair needs to write the files" in stderr


def test_a_dir_that_is_a_file_is_named_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a log\n")
    for argv in (["topics", "list"], ["repair"], ["consume", "t"]):
        assert cli_main([*argv, "--dir", str(afile)]) == 1
        err = capsys.readouterr().err
        assert f"{afile} is not a directory" in err and "does not exist" not in err
    with pytest.raises(NotALogDirectoryError, match="not a directory"):
        pylog.open(afile)
    with pytest.raises(NotALogDirectoryError, match="not a directory"):
        pylog.repair(afile)
    assert cli_main(["topics", "list", "--dir", str(tmp_path / "missing")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_the_error_is_a_pylog_error_and_a_permission_error() -> None:
    exc = PermissionDeniedError("denied", path="/x", needed="read")
    assert isinstance(exc, pylog.errors.PylogError) and isinstance(exc, PermissionError)
    assert str(exc) == "denied" and exc.errno == 13 and not exc.retriable
