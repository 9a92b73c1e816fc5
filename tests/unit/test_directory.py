"""The log directory: what pylog initialises, creates and deletes (only what it can prove it created), and
what opening and closing cost (a clean open touches no partition; a close costs what was written)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import warnings
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import pylog
from pylog import errors, fs
from pylog.record import crc32c


def _tree(path: str) -> dict[str, bytes | None]:
    """Every entry under ``path``: file contents, or None for a directory."""
    out: dict[str, bytes | None] = {}
    for root, dirs, files in os.walk(path):
        for d in dirs:
            out[os.path.relpath(os.path.join(root, d), path)] = None
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                out[os.path.relpath(os.path.join(root, f), path)] = fh.read()
    return out


def _user_files(root: str) -> dict[str, bytes | None]:
    os.makedirs(os.path.join(root, "photos-2024"))
    os.makedirs(os.path.join(root, "orders-0"))
    mine = {"photos-2024/img.txt": b"x\n", "notes.tmp": b"mine", "orders-0/keep": b"k"}
    for rel, data in mine.items():
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    return {"photos-2024": None, "orders-0": None, **mine}


# -- what pylog initialises ---------------------------------------------------------------------------------


def test_a_non_empty_directory_that_is_not_a_log_is_refused_and_left_alone(tmp_path: Any) -> None:
    root = os.path.join(str(tmp_path), "d")
    before = _user_files(root)
    with pytest.raises(errors.NotALogDirectoryError) as info:
        pylog.open(root)
    assert "photos-2024" in str(info.value) and info.value.path == root
    assert isinstance(info.value, ValueError)
    assert _tree(root) == before


def test_the_root_directory_is_refused() -> None:
    before = sorted(os.listdir("/"))
    with pytest.raises(errors.NotALogDirectoryError) as info:
        pylog.open("/")
    assert info.value.path == "/"
    assert sorted(os.listdir("/")) == before  # no lock file, no manifest: nothing was written there


def test_a_file_is_refused(tmp_path: Any) -> None:
    path = os.path.join(str(tmp_path), "a-file")
    with open(path, "wb") as f:
        f.write(b"data")
    with pytest.raises(errors.NotALogDirectoryError):
        pylog.open(path)
    with open(path, "rb") as f:
        assert f.read() == b"data"


def test_new_and_empty_directories_become_logs(tmp_path: Any) -> None:
    empty = os.path.join(str(tmp_path), "empty")
    os.makedirs(empty)
    for root in (empty, os.path.join(str(tmp_path), "new", "nested")):
        with pylog.open(root) as log:
            log.create_topic("t")
        with pylog.open(root) as log:  # and reopen as logs, even with no topic
            assert log.topics() == ["t"]
    with pylog.open(os.path.join(str(tmp_path), "no-topics")):
        pass
    with pylog.open(os.path.join(str(tmp_path), "no-topics")) as log:
        assert log.topics() == []


# -- unknown entries are kept ---------------------------------------------------------------------------


def test_unknown_entries_of_a_log_are_kept_with_a_warning(tmp_path: Any) -> None:
    root = os.path.join(str(tmp_path), "log")
    with pylog.open(root) as log:
        log.create_topic("t", partitions=2)
        log.create_topic("gone")
        log.delete_topic("gone")
    user = _user_files(root)
    for _ in range(2):  # opening, creating and deleting topics, closing: nothing of the user's is touched
        with pytest.warns(errors.UnknownEntryWarning, match="photos-2024"):
            log = pylog.open(root)
        with log:
            log.create_topic("more", partitions=3)
            log.delete_topic("more")
            assert log.topics() == ["t"]
    tree = _tree(root)
    assert {k: v for k, v in tree.items() if k in user} == user


def test_create_topic_refuses_a_directory_it_did_not_create(tmp_path: Any) -> None:
    root = os.path.join(str(tmp_path), "log")
    with pylog.open(root) as log:
        log.create_topic("t")
    user = _user_files(root)
    os.makedirs(os.path.join(root, "t-2"))  # a folder named like the partition the topic grows into
    user["t-2"] = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", errors.UnknownEntryWarning)
        with pylog.open(root) as log:
            with pytest.raises(errors.NotALogDirectoryError, match="orders-0"):
                log.create_topic("orders", partitions=2)
            assert log.topics() == ["t"]
            with pytest.raises(errors.NotALogDirectoryError, match="t-2"):
                log.create_partitions("t", 3)
            assert log.topic("t").num_partitions == 1
            assert not os.path.exists(os.path.join(root, "t-1"))
    assert {k: v for k, v in _tree(root).items() if k in user} == user
    assert not os.path.exists(os.path.join(root, "orders-1"))


# -- interrupted topic changes ------------------------------------------------------------------------


_CRASHER = textwrap.dedent(
    """
    import os, sys
    import pylog
    from pylog import fs

    root, what, after = sys.argv[1], sys.argv[2], int(sys.argv[3])

    class Crash(fs.FileSystem):
        calls = 0

    def wrap(name):
        base = getattr(fs.FileSystem, name)

        def method(self, *args, **kwargs):
            if name == ("mkdir" if what == "create" else "rmdir"):
                Crash.calls += 1
                if Crash.calls > after:
                    os._exit(9)  # a crash: nothing after this call happens
            return base(self, *args, **kwargs)

        return method

    for name in ("mkdir", "rmdir"):
        setattr(Crash, name, wrap(name))

    log = pylog.open(root)
    with fs.install(Crash()):
        if what == "create":
            log.create_topic("new", partitions=6)
        else:
            log.delete_topic("old")
    os._exit(0)
    """
)


@contextlib.contextmanager
def _crashed_then_reopened(root: str, what: str, after: int) -> Iterator[pylog.Log]:
    """Put the user's files in ``root``, crash a topic ``what`` ("create"/"delete") in a child after ``after``
    directory operations, reopen the log; on leaving, every user file must be untouched."""
    user = _user_files(root)
    done = subprocess.run([sys.executable, "-c", _CRASHER, root, what, str(after)], check=False)
    assert done.returncode == 9
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", errors.UnknownEntryWarning)
        with pylog.open(root) as log:
            yield log
    assert {k: v for k, v in _tree(root).items() if k in user} == user


@pytest.mark.parametrize("after", [0, 3, 5])
def test_an_interrupted_creation_is_rolled_back_and_nothing_else_is_touched(
    tmp_path: Any, after: int
) -> None:
    root = os.path.join(str(tmp_path), "log")
    with pylog.open(root) as log:
        log.create_topic("t")
        log.producer().send("t", b"v").get()
    with _crashed_then_reopened(root, "create", after) as log:
        assert log.topics() == ["t"]
        assert not any(e.startswith("new-") for e in os.listdir(root))
        log.create_topic("new", partitions=6)  # the name is free again
        assert log.topic("t").end_offsets() == {0: 1}


@pytest.mark.parametrize("after", [0, 2])
def test_an_interrupted_deletion_is_finished(tmp_path: Any, after: int) -> None:
    root = os.path.join(str(tmp_path), "log")
    with pylog.open(root) as log:
        log.create_topic("old", partitions=4)
        p = log.producer()
        for i in range(4):
            p.send("old", b"v", partition=i)
        p.close()
        log.create_topic("t")
    with _crashed_then_reopened(root, "delete", after) as log:
        assert log.topics() == ["t"]
        assert not any(e.startswith("old-") for e in os.listdir(root))


def test_a_manifest_from_before_topic_journals_is_read(tmp_path: Any) -> None:
    root = os.path.join(str(tmp_path), "log")
    with pylog.open(root) as log:
        log.create_topic("t", partitions=2)
    path = os.path.join(root, "manifest")
    with open(path, "rb") as f:
        _head, _, body = f.read().partition(b"\n")
    manifest = json.loads(body)
    assert manifest["creating"] == {} and manifest["deleting"] == {}
    old = json.dumps({"topics": manifest["topics"]}, sort_keys=True, indent=1).encode()
    with open(path, "wb") as f:
        f.write(b"pylog-manifest 1 " + f"{crc32c(old):08x}\n".encode() + old)
    with pylog.open(root) as log:
        assert log.topics() == ["t"]
        log.create_topic("u")


# -- what opening and closing cost --------------------------------------------------------------------


class Counting(fs.FileSystem):
    """Counts file-system calls by (operation, top-level entry of the log root)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.calls: Counter[tuple[str, str]] = Counter()

    def _note(self, op: str, path: Any) -> None:
        if isinstance(path, str) and path.startswith(self.root + os.sep):
            self.calls[(op, os.path.relpath(path, self.root).split(os.sep)[0])] += 1

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        self._note("open", path)
        return super().open(path, flags, mode)

    def fsync_dir(self, path: str) -> None:
        self._note("fsync_dir", path)
        super().fsync_dir(path)

    def listdir(self, path: str) -> list[str]:
        self._note("listdir", path)
        return super().listdir(path)

    def partitions_touched(self) -> set[str]:
        return {entry for (_, entry) in self.calls if "-" in entry and not entry.startswith(".")}


def test_a_clean_open_touches_no_partition_and_a_close_only_what_was_written(tmp_path: Any) -> None:
    root = os.path.join(str(tmp_path), "log")
    with pylog.open(root) as log:
        log.create_topic("t", partitions=40)
        p = log.producer()
        for i in range(40):
            p.send("t", b"v%d" % i, partition=i)
        p.close()
    layer = Counting(root)
    with fs.install(layer):
        log = pylog.open(root)
        assert log.topics() == ["t"]
        assert layer.partitions_touched() == set()  # not one partition file opened or listed
        p = log.producer()
        p.send("t", b"more", partition=7).get()
        p.send("t", b"more", partition=9).get()
        log.close()
    assert layer.partitions_touched() == {"t-7", "t-9"}
    with pylog.open(root) as log:  # and the data is all there
        assert log.topic("t").end_offsets() == {i: 2 if i in (7, 9) else 1 for i in range(40)}


def test_a_partition_is_validated_once_per_session_by_its_first_user(tmp_path: Any) -> None:
    root = os.path.join(str(tmp_path), "log")
    with pylog.open(root) as log:
        log.create_topic("t")
        log.producer().send("t", b"v").get()
    first, second = pylog.open(root), pylog.open(root)
    try:
        first.topic("t").partition(0)
        assert "t-0" in first.recovery  # the first user validated it ...
        second.topic("t").partition(0)
        assert "t-0" not in second.recovery  # ... and nobody again in this session
    finally:
        first.close()
        second.close()
    with pylog.open(root) as log:  # a new session validates again
        log.topic("t").partition(0)
        assert "t-0" in log.recovery


_DIES_OPEN = textwrap.dedent(
    """
    import os, sys
    import pylog
    log = pylog.open(sys.argv[1])
    p = log.producer()
    p.send("t", b"acked").get()
    os._exit(3)  # dies with the log open
    """
)


def test_a_process_that_died_with_the_log_open_makes_the_next_shutdown_settle_its_partitions(
    tmp_path: Any,
) -> None:
    root = os.path.join(str(tmp_path), "log")
    with pylog.open(root) as log:
        log.create_topic("t")
    survivor = pylog.open(root)
    assert subprocess.run([sys.executable, "-c", _DIES_OPEN, root], check=False).returncode == 3
    # junk past the published end, as a writer killed between its write and its publish leaves it
    with open(os.path.join(root, "t-0", "00000000000000000000.log"), "ab") as f:
        f.write(b"\xff" * 100)
    survivor.close()  # the last closer: one process did not close, so it settles every used partition
    assert os.path.exists(os.path.join(root, ".clean-shutdown"))
    with pylog.open(root) as log:
        c = log.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0)
        assert [r.value for r in c] == [b"acked"]
        assert log.verify() == {}


# -- read-only directories ------------------------------------------------------------------------------


class ReadOnlyFileSystem(fs.FileSystem):
    """A read-only mount, as pylog sees it: every call that would change a file fails with EROFS."""

    @staticmethod
    def _refuse(what: str, path: Any) -> None:
        raise errors.StorageError(30, f"{what} failed on {path}: Read-only file system")

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC):
            self._refuse("open", path)
        return super().open(path, flags, mode)

    def pwrite(self, fd: int, data: Any, offset: int) -> None:
        self._refuse("pwrite", fd)

    def rename(self, src: str, dst: str) -> None:
        self._refuse("rename", src)

    def unlink(self, path: str) -> None:
        self._refuse("unlink", path)

    def mkdir(self, path: str) -> None:
        self._refuse("mkdir", path)

    def ftruncate(self, fd: int, size: int) -> None:
        self._refuse("ftruncate", fd)


def _restored_copy(tmp_path: Any, *, clean: bool) -> tuple[str, list[Any]]:
    """A log with records in several segments, one partition never used, and (unclean) a torn tail."""
    root = os.path.join(str(tmp_path), "log")
    with pylog.open(root) as log:
        log.create_topic("t", partitions=3, segment_bytes=2048)
        p = log.producer()
        for i in range(300):
            p.send("t", {"i": i}, partition=i % 2)
        p.close()
    if not clean:
        os.unlink(os.path.join(root, ".clean-shutdown"))
        active = sorted(n for n in os.listdir(os.path.join(root, "t-0")) if n.endswith(".log"))[-1]
        with open(os.path.join(root, "t-0", active), "ab") as f:
            f.write(b"\x00\x00\x01torn")  # a write that never completed
    return root, [{"i": i} for i in range(300)]


@pytest.mark.parametrize("clean", [True, False])
def test_a_log_on_a_read_only_file_system_can_be_read_and_verified(tmp_path: Any, clean: bool) -> None:
    root, sent = _restored_copy(tmp_path, clean=clean)
    before = _tree(root)
    with fs.install(ReadOnlyFileSystem()):
        log = pylog.open(root)
        assert log.read_only
        c = log.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0)
        got = sorted((r.value["i"] for r in c), key=int)
        assert got == [v["i"] for v in sent]
        assert log.topic("t").end_offsets() == {0: 150, 1: 150, 2: 0}
        assert log.verify() == {}  # a torn tail past the last valid batch is not data: it is ignored
        for write in (
            lambda: log.producer(),
            lambda: log.create_topic("u"),
            lambda: log.delete_topic("t"),
            lambda: log.consumer("t", group_id="g"),
            lambda: log.apply_retention(),
        ):
            with pytest.raises(errors.ReadOnlyLogError, match="read-only"):
                write()
        log.close()
    assert _tree(root) == before


def test_read_only_true_writes_nothing_in_a_writable_directory(tmp_path: Any) -> None:
    root, sent = _restored_copy(tmp_path, clean=False)
    before = _tree(root)
    with pylog.open(root, read_only=True) as log:
        c = log.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0)
        assert sorted(r.value["i"] for r in c) == [v["i"] for v in sent]
        with pytest.raises(errors.ReadOnlyLogError):
            log.create_topic("u")
    assert _tree(root) == before
    with pytest.raises(errors.NotALogDirectoryError):
        pylog.open(os.path.join(str(tmp_path), "missing"), read_only=True)


def test_the_cli_consumes_and_verifies_a_read_only_log(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from pylog.cli import main

    root, _sent = _restored_copy(tmp_path, clean=True)
    with fs.install(ReadOnlyFileSystem()):
        assert main(["--dir", root, "verify"]) == 0
        assert (
            main(["--dir", root, "consume", "t", "--from-beginning", "--partition", "1", "--timeout-ms", "0"])
            == 0
        )
    out = capsys.readouterr().out
    assert [int(line.split(":")[1].strip(" }")) for line in out.splitlines() if '"i"' in line] == list(
        range(1, 300, 2)
    )


_READER = textwrap.dedent(
    """
    import os, sys
    if os.getuid() == 0:
        os.setgid(65534)
        os.setuid(65534)  # nobody: the copy's files belong to another user and are not writable
    root = sys.argv[1]
    if not os.access(os.path.join(root, "manifest"), os.R_OK):
        sys.exit(77)  # this user cannot reach the copy (a private temp directory): nothing to test
    try:
        import pylog
    except ImportError:
        sys.exit(77)  # this user cannot read the interpreter's or pylog's files
    with pylog.open(root) as log:
        assert log.read_only
        c = log.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0)
        print(len(list(c)), log.verify() == {})
    """
)


def test_a_directory_of_another_user_is_read_without_writing(tmp_path: Any) -> None:
    import shutil
    import tempfile

    root, sent = _restored_copy(tmp_path, clean=True)
    shared = tempfile.mkdtemp(prefix="pylog-ro-")
    try:
        copy = os.path.join(shared, "log")
        shutil.copytree(root, copy)
        for d, _, names in os.walk(shared):
            os.chmod(d, 0o555)
            for n in names:
                os.chmod(os.path.join(d, n), 0o444)
        before = _tree(copy)
        done = subprocess.run(
            [sys.executable, "-c", _READER, copy], capture_output=True, text=True, check=False
        )
        if done.returncode == 77:
            pytest.skip("another user cannot reach the temp directory or the interpreter here")
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [str(len(sent)), "True"]
        assert _tree(copy) == before
    finally:
        for d, _, _ in os.walk(shared):
            os.chmod(d, 0o755)
        shutil.rmtree(shared)


# -- a damaged manifest ---------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["garbage", "missing", "flipped"])
def test_repair_rebuilds_a_damaged_manifest_from_the_partition_directories(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    from pylog.cli import main

    root = os.path.join(str(tmp_path), "log")
    with pylog.open(root) as log:
        log.create_topic("orders", partitions=3)
        log.create_topic("clicks", partitions=2)
        p = log.producer()
        for i in range(30):
            p.send("orders", {"i": i}, partition=i % 3)
        p.send("clicks", {"i": -1}, partition=1)
        p.close()
    path = os.path.join(root, "manifest")
    if damage == "missing":
        os.unlink(path)
    else:
        with open(path, "r+b") as f:
            raw = f.read()
            f.seek(0)
            f.write(os.urandom(len(raw)) if damage == "garbage" else raw[:-3] + b"X" + raw[-2:])
    if damage != "missing":
        with pytest.raises(errors.CorruptRecordError):
            pylog.open(root)
    assert main(["--dir", root, "repair"]) == 0
    out = capsys.readouterr().out
    assert "topic 'orders': 3 partitions" in out and "topic 'clicks': 2 partitions" in out
    assert "default configs assumed" in out
    with pylog.open(root) as log:
        assert log.topics() == ["clicks", "orders"]
        c = log.consumer("orders", "clicks", auto_offset_reset="earliest", consumer_timeout_ms=0)
        assert sorted(r.value["i"] for r in c) == [-1, *range(30)]
    assert pylog.repair(root) == {}  # nothing left to repair


def test_repair_keeps_the_topics_and_partitions_nothing_was_written_to(tmp_path: Any) -> None:
    """Partition files are created on first use, so a topic never written to (or the unused partitions of a
    topic) leaves only empty directories; a rebuilt manifest keeps them, with their partition counts, and
    adopts no other empty directory."""
    root = os.path.join(str(tmp_path), "log")
    with pylog.open(root) as log:
        log.create_topic("orders", partitions=3)
        log.create_topic("idle", partitions=2)  # never written
        log.create_topic("keyed", partitions=4)
        p = log.producer(key_serializer=None)
        p.send("orders", {"i": 0}, partition=1)
        key = next(b"k%d" % i for i in range(100) if pylog.partitioner.partition_for_key(b"k%d" % i, 4) == 0)
        p.send("keyed", {"i": 1}, key=key).get()  # only keyed-0 gets files
        p.close()
    os.makedirs(os.path.join(root, "photos-2024"))  # not a topic: empty, but not photos-0 onwards
    with open(os.path.join(root, "manifest"), "wb") as f:
        f.write(b"garbage")
    report = pylog.repair(root)
    notes = "\n".join(report["manifest"])
    assert "photos-2024" in notes and "not taken as a topic" in notes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", errors.UnknownEntryWarning)
        with pylog.open(root) as log:
            assert log.topics() == ["idle", "keyed", "orders"]
            counts = {t: log.topic(t).num_partitions for t in log.topics()}
            assert counts == {"idle": 2, "keyed": 4, "orders": 3}
            p = log.producer(key_serializer=None)
            assert p.send("keyed", {"i": 2}, key=key).get().partition == 0  # keys hash as before
            p.send("idle", {"i": 3}, partition=1).get()
            p.close()
    assert os.path.isdir(os.path.join(root, "photos-2024"))
