"""The ``pylog`` command, run for real in a subprocess (``python -m pylog.cli``) against a temporary log
directory: output, exit codes, and one-line errors without tracebacks.

The ``groups`` commands depend on admin methods of ``Log``; where this pylog lacks them the tests check the
"not available" error, and the command logic itself is exercised in-process against a small in-memory
implementation of those methods (the last tests of this file).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import pylog
from pylog.cli import _groups, main
from pylog.structs import OffsetAndMetadata, TopicPartition


class Pylog:
    """Runs ``python -m pylog.cli`` with ``PYLOG_DIR`` set to a temporary log directory."""

    def __init__(self, log_dir: str) -> None:
        self.dir = log_dir
        self.env = {**os.environ, "PYLOG_DIR": log_dir, "COLUMNS": "200"}
        self.env.pop("PYLOG_DEBUG", None)

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "pylog.cli", *args]

    def run(self, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args), input=stdin, capture_output=True, text=True, env=self.env, timeout=60
        )

    def ok(self, *args: str, stdin: str = "") -> str:
        r = self.run(*args, stdin=stdin)
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr
        return r.stdout

    def json(self, *args: str, stdin: str = "") -> Any:
        return json.loads(self.ok("--json", *args, stdin=stdin))

    def fails(self, *args: str, code: int = 1, stdin: str = "") -> str:
        """The single ``pylog: error:`` line a failing command prints."""
        r = self.run(*args, stdin=stdin)
        assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("pylog: error: "), r.stderr
        return lines[0]


@pytest.fixture
def cli(log_dir: str) -> Pylog:
    return Pylog(log_dir)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Pylog:
    """One log with an empty one-partition topic ``t``, for commands that must fail without changing it."""
    cli = Pylog(os.path.join(str(tmp_path_factory.mktemp("shared")), "log"))
    cli.ok("topics", "create", "t")
    return cli


def _segment(log_dir: str, topic: str, partition: int = 0) -> str:
    return os.path.join(log_dir, f"{topic}-{partition}", f"{0:020d}.log")


RECORDS = "user1:hello world\nuser2:second line\nuser1:third one\n"


# -- topics -----------------------------------------------------------------------------------------------


def test_topics_create_list_describe_alter_delete(cli: Pylog) -> None:
    out = cli.ok("topics", "create", "clicks", "--partitions", "2", "--config", "retention.ms=3600000")
    assert out == "Created topic clicks.\n"
    cli.ok("--dir", cli.dir, "topics", "create", "views", "--config", "cleanup_policy=compact")
    assert "already exists" in cli.ok("topics", "create", "views", "--if-not-exists")
    assert cli.ok("topics", "list") == "clicks\nviews\n"
    assert cli.json("topics", "list") == [
        {"topic": "clicks", "partitions": 2},
        {"topic": "views", "partitions": 1},
    ]

    text = cli.ok("topics", "describe", "clicks")
    assert "Topic: clicks  PartitionCount: 2  Configs: retention_ms=3600000" in text
    assert re.search(r"PARTITION\s+LOG-START-OFFSET\s+LOG-END-OFFSET\s+SEGMENTS\s+BYTES", text)
    (info,) = cli.json("topics", "describe", "clicks")
    assert [p["partition"] for p in info["partitions"]] == [0, 1]
    assert info["overrides"] == {"retention_ms": 3600000}
    assert info["config"]["segment_bytes"] == 1 << 30

    out = cli.ok("topics", "alter", "clicks", "--partitions", "3", "--config", "segment_bytes=1048576")
    assert out == "Altered topic clicks: partitions 2 -> 3; segment_bytes=1048576.\n"
    cli.ok("topics", "alter", "clicks", "--delete-config", "retention.ms")
    (info,) = cli.json("topics", "describe", "clicks", "--json")
    assert len(info["partitions"]) == 3
    assert info["overrides"] == {"segment_bytes": 1048576}

    assert cli.ok("topics", "delete", "views") == "Deleted topic views.\n"
    assert "does not exist" in cli.ok("topics", "delete", "views", "--if-exists")
    assert [t["topic"] for t in cli.json("topics", "describe")] == ["clicks"]


MISTAKES = [
    (["topics", "describe", "nope"], 1, "unknown topic 'nope'"),
    (["topics", "create", "t"], 1, "topic 't' already exists"),
    (["topics", "create", "u", "--config", "colour=blue"], 1, "unknown topic config colour"),
    (["topics", "create", "u", "--config", "retention_ms=soon"], 1, "retention_ms must be an int"),
    (["topics", "create", "u", "--config", "retention_ms"], 2, "--config expects key=value"),
    (["topics", "create", "u", "--partitions", "0"], 1, "partitions must be an int in [1, 100000]"),
    (["topics", "create", "bad/name"], 1, "invalid topic name"),
    (["topics", "create", "u", "--partitions", "x"], 2, "argument --partitions: invalid int value"),
    (["topics", "alter", "t", "--partitions", "1"], 1, "partitions can only be added"),
    (["topics", "alter", "t"], 2, "needs --partitions, --config or --delete-config"),
    (["topics", "delete", "nope"], 1, "unknown topic 'nope'"),
    (["consume", "nope"], 1, "unknown topic 'nope'"),
    (["consume", "t", "--partition", "5"], 1, "partition 5 does not exist in topic 't'"),
    (["consume", "t", "--offset", "3"], 2, "--offset needs --partition"),
    (["consume", "t", "--partition", "0", "--offset", "7"], 1, "offset 7 is out of range [0, 0]"),
    (["produce", "nope"], 1, "unknown topic 'nope'"),
    (["produce", "t", "--partition", "2"], 1, "partition 2 does not exist"),
    (["produce", "t", "--file", "/no/such/file"], 1, "/no/such/file: No such file or directory"),
    (["dump", "/no/such/dir"], 1, "/no/such/dir: no such file or directory"),
    (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    ([], 2, "the following arguments are required: COMMAND"),
]


def test_mistakes_print_one_line_and_exit_non_zero(shared: Pylog) -> None:
    """Each mistake is reported as one ``pylog: error:`` line with a non-zero exit and no traceback, and
    changes nothing (they all run against the same log, concurrently to keep this test fast)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda case: shared.run(*case[0]), MISTAKES))
    for (args, code, message), r in zip(MISTAKES, results, strict=True):
        assert r.returncode == code, (args, r.returncode, r.stderr)
        assert "Traceback" not in r.stderr, args
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("pylog: error: "), (args, r.stderr)
        assert message in lines[0], (args, lines[0])
    assert shared.ok("topics", "list") == "t\n"


def test_a_missing_log_directory_is_an_error_not_a_new_log(cli: Pylog, tmp_path: Any) -> None:
    missing = os.path.join(str(tmp_path), "typo")
    assert "does not exist" in cli.fails("--dir", missing, "topics", "list")
    assert "not a pylog log directory" in cli.fails("--dir", str(tmp_path), "verify")
    assert not os.path.exists(missing)


def test_help(cli: Pylog) -> None:
    assert "consume" in cli.ok("--help")
    assert "--from-beginning" in cli.ok("consume", "--help")


# -- produce and consume ----------------------------------------------------------------------------------


def test_produce_keys_and_headers_then_consume_with_print_options(cli: Pylog) -> None:
    cli.ok("topics", "create", "t")
    out = cli.ok("produce", "t", "--key-separator", ":", "--headers", "src=cli,v=1", stdin=RECORDS)
    assert out == "Produced 3 records to t (partition 0: offsets 0-2).\n"

    text = cli.ok(
        "consume", "t", "--from-beginning", "--max-messages", "2",
        "--print-key", "--print-offset", "--print-timestamp", "--print-headers", "--print-partition",
    )  # fmt: skip
    lines = text.splitlines()
    assert len(lines) == 2
    assert re.fullmatch(
        r"CreateTime:\d{13}\tPartition:0\tOffset:0\tsrc:cli,v:1\tuser1\thello world", lines[0]
    )
    assert lines[1].endswith("Offset:1\tsrc:cli,v:1\tuser2\tsecond line")

    assert cli.ok("consume", "t", "--from-beginning") == "hello world\nsecond line\nthird one\n"
    records = [
        json.loads(line)
        for line in cli.ok("consume", "t", "--from-beginning", "--format", "json").splitlines()
    ]
    assert [r["offset"] for r in records] == [0, 1, 2]
    first = records[0]
    assert first["key"] == "user1" and first["key_encoding"] == "text"
    assert first["value"] == "hello world" and first["value_encoding"] == "text"
    assert first["headers"] == [
        {"key": "src", "value": "cli", "encoding": "text"},
        {"key": "v", "value": "1", "encoding": "text"},
    ]
    assert first["topic"] == "t" and first["partition"] == 0 and first["timestamp_type"] == "CreateTime"
    assert isinstance(first["timestamp"], int)
    assert len(cli.ok("--json", "consume", "t", "--from-beginning", "--max-messages", "1").splitlines()) == 1


def test_raw_and_json_values_are_stored_as_the_python_api_expects(cli: Pylog) -> None:
    cli.ok("topics", "create", "t")
    cli.ok("produce", "t", stdin="plain text\n\xe9t\xe9\n")
    summary = cli.json("produce", "t", "--json", stdin='{"page": "/", "n": 1}\n\n[1, 2]\n"str"\n')
    assert summary == {
        "topic": "t",
        "records": 3,
        "partitions": {"0": {"records": 3, "first_offset": 2, "last_offset": 4}},
    }
    with pylog.open(cli.dir) as log:
        raw = log.consumer("t", auto_offset_reset="earliest", value_deserializer=None, consumer_timeout_ms=0)
        assert [r.value for r in raw][:2] == [b"plain text", "\xe9t\xe9".encode()]
        decoded = log.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0)
        decoded.seek(TopicPartition("t", 0), 2)
        assert [r.value for r in decoded] == [{"page": "/", "n": 1}, [1, 2], "str"]
        producer = log.producer(value_serializer=None)
        producer.send("t", b"\xff\x00\xfe", key=b"\x80")
        producer.close()
    lines = cli.ok("consume", "t", "--from-beginning", "--print-key").splitlines()
    assert lines == [
        "null\tplain text",
        "null\t\xe9t\xe9",
        'null\t{"page":"/","n":1}',
        "null\t[1,2]",
        "null\tstr",
        "gA==\t/wD+",
    ]
    last = json.loads(cli.ok("consume", "t", "--partition", "0", "--offset", "5", "--json"))
    assert (last["key"], last["key_encoding"], last["value"], last["value_encoding"]) == (
        "gA==",
        "base64",
        "/wD+",
        "base64",
    )
    assert cli.ok("consume", "t", "--partition", "0", "--offset", "5", "--value-format", "hex") == "ff00fe\n"


def test_consume_partition_and_offset(cli: Pylog) -> None:
    cli.ok("topics", "create", "t", "--partitions", "2")
    cli.ok("produce", "t", "--partition", "1", stdin="".join(f"v{i}\n" for i in range(5)))
    cli.ok("produce", "t", "--partition", "0", stdin="other\n")
    out = cli.ok("consume", "t", "--partition", "1", "--offset", "3", "--print-offset", "--print-partition")
    assert out == "Partition:1\tOffset:3\tv3\nPartition:1\tOffset:4\tv4\n"
    assert cli.ok("consume", "t", "--partition", "1", "--offset", "earliest", "--max-messages", "1") == "v0\n"
    assert cli.ok("consume", "t", "--partition", "1", "--offset", "latest") == ""
    assert cli.ok("consume", "t", "--partition", "0", "--from-beginning") == "other\n"
    assert cli.ok("consume", "t") == ""  # starts at the end and exits once caught up
    assert len(cli.ok("consume", "t", "--from-beginning", "--timeout-ms", "200").splitlines()) == 6


def test_produce_from_a_file_and_its_errors(cli: Pylog, tmp_path: Any) -> None:
    cli.ok("topics", "create", "t", "--partitions", "3")
    path = os.path.join(str(tmp_path), "in.txt")
    with open(path, "w") as f:
        f.writelines(f"k{i % 7}\tvalue {i}\n" for i in range(2000))
    summary = cli.json("produce", "t", "--file", path, "--key-separator", "\\t", "--acks", "all")
    assert summary["records"] == 2000
    assert sum(p["records"] for p in summary["partitions"].values()) == 2000
    keys: dict[str, str] = {}
    for line in cli.ok("consume", "t", "--from-beginning", "--print-key", "--print-partition").splitlines():
        partition, key, _ = line.split("\t")
        assert keys.setdefault(key, partition) == partition  # one key, one partition
    assert len(keys) == 7

    line = cli.fails("produce", "t", "--key-separator", ":", stdin="a:1\nb:2\nno separator\n")
    assert "line 3: no key separator ':' found (2 earlier records were produced)" in line
    assert "line 1: invalid JSON" in cli.fails("produce", "t", "--json", stdin="{oops\n")
    assert "key and value cannot both be None" in cli.fails("produce", "t", "--json", stdin="null\n")


def test_consume_follow_prints_records_as_they_arrive_until_interrupted(cli: Pylog) -> None:
    cli.ok("topics", "create", "live")
    follower = subprocess.Popen(
        cli.argv("consume", "live", "--follow", "--from-beginning", "--print-offset"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli.env,
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in follower.stdout or ():
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    try:
        cli.ok("produce", "live", stdin="first\n")
        assert lines.get(timeout=20) == "Offset:0\tfirst\n"
        cli.ok("produce", "live", stdin="second\n")
        assert lines.get(timeout=20) == "Offset:1\tsecond\n"
        assert follower.poll() is None  # still following
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=20) == 0
        assert "Traceback" not in (follower.stderr.read() if follower.stderr else "")
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        for stream in (follower.stdout, follower.stderr):
            if stream is not None:
                stream.close()
    # the follower closed the log cleanly: the next opener finds the clean-shutdown marker
    assert os.path.exists(os.path.join(cli.dir, ".clean-shutdown"))


# -- dump and verify --------------------------------------------------------------------------------------


def test_dump_prints_batches_and_records(cli: Pylog) -> None:
    cli.ok("topics", "create", "t")
    cli.ok("produce", "t", "--key-separator", ":", "--headers", "src=cli", stdin=RECORDS)
    cli.ok("produce", "t", "--json", stdin='{"a": 1}\n')
    segment = _segment(cli.dir, "t")

    out = cli.ok("dump", segment)
    assert out.startswith(f"Dumping {segment}\nLog starting offset: 0\n")
    assert re.search(r"baseOffset: 0 lastOffset: 2 count: 3 position: 0 size: \d+ CreateTime: \d+", out)
    assert "compression: none" in out and "isValid: true" in out
    assert re.search(r"baseOffset: 3 lastOffset: 3 count: 1 position: [1-9]\d*", out)
    assert "Summary: 2 batches, 4 records" in out and "| offset" not in out

    data = cli.ok("dump", os.path.dirname(segment), "--print-data")
    assert "| offset: 0 CreateTime: " in data
    assert "keySize: 5 valueSize: 11 headerKeys: [src] key: user1 payload: hello world" in data
    assert 'key: null payload: {"a":1}' in data

    rows = [json.loads(line) for line in cli.ok("--json", "dump", segment, "--print-data").splitlines()]
    assert [r["type"] for r in rows] == ["batch", "batch", "summary"]
    assert rows[0]["crc_valid"] is True and rows[0]["count"] == 3
    assert [r["value"] for r in rows[0]["records"]] == ["hello world", "second line", "third one"]
    assert rows[1]["records"][0]["value"] == {"a": 1}

    index = cli.ok("dump", segment[: -len(".log")] + ".index")
    assert "offset: 0 position: 0" in index
    verified = cli.ok("dump", segment, "--verify-index-only")
    assert verified == f"{segment}: indexes match the log (2 batches)\n"


def test_verify_is_ok_then_names_the_file_after_a_bit_flip(cli: Pylog) -> None:
    cli.ok("topics", "create", "t", "--partitions", "2")
    cli.ok("produce", "t", "--partition", "0", stdin="aaaa\nbbbb\n")
    cli.ok("produce", "t", "--partition", "0", stdin="cccc\n")
    assert cli.ok("verify") == "OK: 2 partitions checked, no problems\n"
    assert cli.json("verify")["ok"] is True

    segment = _segment(cli.dir, "t")
    with open(segment, "r+b") as f:
        data = bytearray(f.read())
        data[70] ^= 0x10  # inside the payload of the first batch
        f.seek(0)
        f.write(data)

    r = cli.run("verify")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert segment in r.stdout and "CRC mismatch" in r.stdout
    assert r.stdout.splitlines()[-1] == "FAILED: 1 problems in 1 partitions"
    report = json.loads(cli.run("--json", "verify").stdout)
    assert report["ok"] is False and list(report["problems"]) == ["t-0"]

    r = cli.run("dump", segment)
    assert r.returncode == 1 and "isValid: false" in r.stdout and "1 corrupt" in r.stdout
    assert "CRC mismatch" in cli.fails("consume", "t", "--from-beginning")


def test_repair_drops_what_verify_found_and_says_what(cli: Pylog) -> None:
    cli.ok("topics", "create", "t")
    cli.ok("produce", "t", stdin="aaaa\nbbbb\n")
    cli.ok("produce", "t", stdin="cccc\n")
    assert cli.ok("repair") == "Nothing to repair.\n"
    segment = _segment(cli.dir, "t")
    with open(segment, "r+b") as f:
        data = bytearray(f.read())
        data[-3] ^= 0x10  # inside the payload of the last batch, below the durable point
        f.seek(0)
        f.write(data)
    assert cli.run("verify").returncode == 1
    report = cli.json("repair")
    assert list(report) == ["t-0"] and report["t-0"]
    assert cli.ok("verify") == "OK: 1 partitions checked, no problems\n"
    values = cli.ok("consume", "t", "--from-beginning", "--value-format", "text").split()
    assert values == ["aaaa", "bbbb"]  # the damaged batch, and only it, is gone
    assert "not a pylog log directory" in cli.fails("--dir", cli.dir + "-missing", "repair")


def test_bench_reports_throughput(cli: Pylog) -> None:
    report = cli.json("bench", "--records", "3000", "--record-size", "50")
    assert [r["phase"] for r in report["results"]] == ["produce send()", "produce send_batch()", "consume"]
    assert all(r["records_per_s"] > 0 and r["mb_per_s"] > 0 for r in report["results"])


# -- groups, in-process against an in-memory admin API ----------------------------------------------------


class AdminLog(pylog.Log):
    """A real log plus the group admin methods, answering from dicts."""

    offsets: dict[str, dict[TopicPartition, OffsetAndMetadata]]
    reset_calls: list[tuple[str, dict[TopicPartition, int]]]

    def list_groups(self) -> list[str]:
        return sorted(self.offsets)

    def describe_group(self, group_id: str) -> dict[str, Any]:
        members = [{"member_id": "m-1", "assignment": [TopicPartition("t", 0)]}] if group_id == "busy" else []
        return {
            "group_id": group_id,
            "state": "Stable" if members else "Empty",
            "generation": 4,
            "members": members,
        }

    def group_offsets(self, group_id: str) -> dict[TopicPartition, OffsetAndMetadata]:
        return self.offsets.get(group_id, {})

    def reset_group_offsets(self, group_id: str, offsets: dict[TopicPartition, int]) -> None:
        self.reset_calls.append((group_id, dict(offsets)))

    def delete_group(self, group_id: str) -> None:
        del self.offsets[group_id]


@pytest.fixture
def admin(log_dir: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[AdminLog]:
    log = AdminLog(log_dir)
    log.create_topic("t", partitions=2)
    producer = log.producer()
    for i in range(10):
        producer.send("t", i, partition=0, timestamp_ms=1_000 + i)
    for i in range(4):
        producer.send("t", i, partition=1, timestamp_ms=2_000 + i)
    producer.close()
    log.offsets = {"busy": {TopicPartition("t", 0): OffsetAndMetadata(7)}, "idle": {}}
    log.reset_calls = []

    @contextlib.contextmanager
    def fake_open(args: Any, *, create: bool = False) -> Iterator[AdminLog]:
        yield log

    monkeypatch.setattr(_groups, "open_log", fake_open)
    yield log
    log.close()


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_groups_list_describe_delete(admin: AdminLog, capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(capsys, "groups", "list") == (0, "busy\nidle\n", "")
    code, out, _ = _main(capsys, "groups", "describe", "busy")
    assert code == 0
    assert out.splitlines()[0] == "Group busy (state Stable, generation 4, 1 members)"
    assert re.search(r"GROUP\s+TOPIC\s+PARTITION\s+CURRENT-OFFSET\s+LOG-END-OFFSET\s+LAG\s+CONSUMER-ID", out)
    assert re.search(r"busy\s+t\s+0\s+7\s+10\s+3\s+m-1", out)
    code, out, _ = _main(capsys, "--json", "groups", "describe", "--all-groups")
    (busy, idle) = json.loads(out)
    assert busy["partitions"] == [
        {
            "topic": "t",
            "partition": 0,
            "current_offset": 7,
            "log_end_offset": 10,
            "lag": 3,
            "consumer_id": "m-1",
        }
    ]
    assert idle["partitions"] == [] and idle["state"] == "Empty"
    assert _main(capsys, "groups", "delete", "idle") == (0, "Deleted consumer group idle.\n", "")
    assert admin.list_groups() == ["busy"]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (["--to-earliest"], {0: 0, 1: 0}),
        (["--to-latest"], {0: 10, 1: 4}),
        (["--to-offset", "6"], {0: 6, 1: 4}),
        (["--to-datetime", "1970-01-01T00:00:01.005Z"], {0: 5, 1: 0}),
    ],
)
def test_groups_reset_offsets_modes(
    admin: AdminLog, capsys: pytest.CaptureFixture[str], mode: list[str], expected: dict[int, int]
) -> None:
    code, out, err = _main(capsys, "--json", "groups", "reset-offsets", "busy", "--topic", "t", *mode)
    assert code == 0 and "Dry run" in err and admin.reset_calls == []
    got = json.loads(out)
    assert {r["partition"]: r["new_offset"] for r in got["partitions"]} == expected
    assert got["executed"] is False
    code, _, _ = _main(capsys, "groups", "reset-offsets", "busy", "--topic", "t", *mode, "--execute")
    assert code == 0
    assert admin.reset_calls == [("busy", {TopicPartition("t", p): o for p, o in expected.items()})]


def test_groups_reset_shift_by_and_its_errors(admin: AdminLog, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _main(capsys, "groups", "reset-offsets", "busy", "--all-topics", "--shift-by", "-2")
    assert code == 0 and re.search(r"busy\s+t\s+0\s+7\s+5", out)
    code, _, err = _main(capsys, "groups", "reset-offsets", "busy", "--topic", "t:1", "--shift-by", "1")
    assert code == 1 and err == "pylog: error: t-1 has no committed offset to shift from\n"
    code, _, err = _main(capsys, "groups", "reset-offsets", "busy", "--topic", "t")
    assert code == 2 and "one of the arguments --to-earliest" in err
    code, _, err = _main(capsys, "groups", "reset-offsets", "idle", "--all-topics", "--to-latest")
    assert code == 1 and "has no committed offsets" in err
