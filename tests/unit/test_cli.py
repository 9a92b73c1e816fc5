"""The ``pylog`` command, run for real in a subprocess (``python -m pylog.cli``) against a temporary log
directory: output, exit codes, and one-line errors without tracebacks.

The ``groups`` commands depend on admin methods of ``Log``; where this pylog lacks them the tests check the
"not available" error, and the command logic itself is exercised in-process against a small in-memory
implementation of those methods (the last tests of this file).
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import io
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import pylog
from pylog.cli import _formats, _groups, _topics, main
from pylog.cli._app import build_parser
from pylog.errors import PylogError, StorageError, UnknownGroupError
from pylog.partition.log import PartitionLog
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
        "failed": 0,
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
        "\\x80\t\\xff\x00\\xfe",  # bytes that are not UTF-8 escaped, the rest as it is
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
    assert "line 3: no key separator ':' found (2 records were produced)" in line
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
        # the timeouts only bound a hang (as cli.run's 60 s do): a start-up on a loaded machine takes seconds
        assert lines.get(timeout=60) == "Offset:0\tfirst\n"
        cli.ok("produce", "live", stdin="second\n")
        assert lines.get(timeout=60) == "Offset:1\tsecond\n"
        assert follower.poll() is None  # still following
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=60) == 130  # interrupted, as operations.md says
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
        if group_id not in self.offsets:
            raise UnknownGroupError(f"unknown consumer group {group_id!r}")
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


def test_groups_reset_offsets_says_when_it_moves_an_offset_into_the_log(
    admin: AdminLog, capsys: pytest.CaptureFixture[str]
) -> None:
    """An offset outside [log start, log end] is moved into it, and the output says so in Kafka's words
    (kafka-consumer-groups' warning), on stderr before the table and in the JSON document."""
    higher = "WARN New offset (1000) is higher than latest offset for topic partition t-{}. Value will be set to {}"
    code, out, err = _main(capsys, "groups", "reset-offsets", "busy", "--topic", "t", "--to-offset", "1000")
    assert (
        code == 0
        and re.search(r"busy\s+t\s+0\s+7\s+10\s*\n", out)
        and re.search(r"busy\s+t\s+1\s+-\s+4\s*\n", out)
    )
    assert err.splitlines() == [
        higher.format(0, 10),
        higher.format(1, 4),
        "Dry run: nothing was changed. Add --execute to commit these offsets.",
    ]
    code, out, err = _main(
        capsys, "--json", "groups", "reset-offsets", "busy", "--topic", "t", "--to-offset", "1000"
    )
    got = json.loads(out)
    assert got["partitions"] == [
        {"topic": "t", "partition": 0, "current_offset": 7, "new_offset": 10, "requested_offset": 1000,
         "clamped_to": "log_end_offset"},
        {"topic": "t", "partition": 1, "current_offset": None, "new_offset": 4, "requested_offset": 1000,
         "clamped_to": "log_end_offset"},
    ]  # fmt: skip
    assert got["warnings"] == [higher.format(0, 10)[5:], higher.format(1, 4)[5:]]
    code, out, err = _main(
        capsys, "groups", "reset-offsets", "busy", "--topic", "t:0", "--shift-by", "-20", "--execute"
    )
    lower = (
        "WARN New offset (-13) is lower than earliest offset for topic partition t-0. Value will be set to 0"
    )
    assert code == 0 and err.splitlines() == [lower]
    assert admin.reset_calls == [("busy", {TopicPartition("t", 0): 0})]
    code, out, err = _main(
        capsys, "--json", "groups", "reset-offsets", "busy", "--topic", "t:0", "--to-offset", "3"
    )
    got = json.loads(out)
    assert got["warnings"] == [] and got["partitions"][0]["clamped_to"] is None and "WARN" not in err


def test_groups_reset_shift_by_and_its_errors(admin: AdminLog, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _main(capsys, "groups", "reset-offsets", "busy", "--all-topics", "--shift-by", "-2")
    assert code == 0 and re.search(r"busy\s+t\s+0\s+7\s+5", out)
    code, _, err = _main(capsys, "groups", "reset-offsets", "busy", "--topic", "t:1", "--shift-by", "1")
    assert code == 1 and err == "pylog: error: t-1 has no committed offset to shift from\n"
    code, _, err = _main(capsys, "groups", "reset-offsets", "busy", "--topic", "t")
    assert code == 2 and "one of the arguments --to-earliest" in err
    code, _, err = _main(capsys, "groups", "reset-offsets", "idle", "--all-topics", "--to-latest")
    assert code == 1 and "has no committed offsets" in err


def test_groups_delete_attempts_every_group_and_fails_if_any_failed(
    admin: AdminLog, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.offsets.update({"g3": {}, "g4": {}})
    code, out, err = _main(capsys, "groups", "delete", "g3", "missing", "g4")
    assert code == 1
    assert out == "Deleted consumer group g3.\nDeleted consumer group g4.\n"
    assert err.count("\n") == 1 and err.startswith("pylog: error: could not delete 1 of 3 groups: missing")
    assert "UnknownGroupError" in err
    assert admin.list_groups() == ["busy", "idle"]

    code, out, _ = _main(capsys, "--json", "groups", "delete", "idle", "g3")
    assert code == 1 and json.loads(out)["deleted"] == ["idle"] and list(json.loads(out)["failed"]) == ["g3"]
    assert admin.list_groups() == ["busy"]


def test_groups_list_and_describe_report_the_same_state(
    admin: AdminLog, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _main(capsys, "--json", "groups", "list")
    assert code == 0
    listed = {g["group"]: g["state"] for g in json.loads(out)}
    code, out, _ = _main(capsys, "--json", "groups", "describe", "--all-groups")
    assert code == 0
    described = {g["group"]: g["state"] for g in json.loads(out)}
    assert listed == described == {"busy": "Stable", "idle": "Empty"}


def test_groups_list_shows_the_state_of_a_live_group(
    log_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real group with a live member (this process): list and describe agree it is Stable."""
    with pylog.open(log_dir) as log:
        log.create_topic("t", 2)
        consumer = log.consumer("t", group_id="g", auto_offset_reset="earliest")
        try:
            for _ in range(100):
                consumer.poll(timeout_ms=100)
                if consumer.assignment():
                    break
            assert consumer.assignment()
            _, out, _ = _main(capsys, "--dir", log_dir, "--json", "groups", "list")
            (listed,) = json.loads(out)
            _, out, _ = _main(capsys, "--dir", log_dir, "--json", "groups", "describe", "g")
            (described,) = json.loads(out)
            assert listed == {"group": "g", "state": described["state"]}
            assert described["state"] == "Stable" and len(described["members"]) == 1
        finally:
            consumer.close()


# -- formats: text lines, JSON, base64 and hex round-trip -------------------------------------------------

# A text line: any characters but the line terminators (and surrogates, which UTF-8 cannot encode).
LINE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), max_size=40)
CONTROL = {chr(c) for c in [*range(0x09), *range(0x0A, 0x20), 0x7F]}


@contextlib.contextmanager
def _std(stdin: bytes) -> Iterator[tuple[io.BytesIO, io.StringIO]]:
    """Runs ``main`` in-process with bytes on stdin; yields the bytes written to stdout and stderr's text."""
    out, err = io.BytesIO(), io.StringIO()
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(out, encoding="utf-8", newline="", write_through=True)
    sys.stderr = err
    try:
        yield out, err
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved


def _run(argv: list[str], stdin: bytes = b"") -> tuple[int, bytes, str]:
    with _std(stdin) as (out, err):
        code = main(argv)
        sys.stdout.flush()
        return code, out.getvalue(), err.getvalue()


def _round_trip(stdin: bytes, produce: list[str], consume: list[str]) -> bytes:
    """What ``consume`` prints of the records ``produce`` made of ``stdin``, in a fresh log."""
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "log")
        assert _run(["--dir", d, "topics", "create", "t"])[0] == 0
        code, _, err = _run(["--dir", d, "produce", "t", *produce], stdin)
        assert code == 0, err
        code, out, err = _run(["--dir", d, "consume", "t", "--from-beginning", *consume])
        assert code == 0, err
        return out


@settings(max_examples=25, deadline=None)
@given(st.lists(LINE, max_size=8))
def test_text_lines_round_trip_with_the_default_formats(lines: list[str]) -> None:
    """Lines produced with the defaults print back as they were, like kafka-console-producer/-consumer.
    The one documented exception of ``auto``: a line of a single control character (a msgpack integer)."""
    stdin = "".join(line + "\n" for line in lines).encode()
    assert _round_trip(stdin, [], ["--value-format", "text"]) == stdin
    shown = [str(ord(line)) if line in CONTROL else line for line in lines]
    assert _round_trip(stdin, [], []) == "".join(line + "\n" for line in shown).encode()


@settings(max_examples=300, deadline=None)
@given(LINE)
def test_auto_shows_every_text_line_as_text(line: str) -> None:
    assume(line not in CONTROL)
    raw = line.encode()
    assert _formats.show_text(raw, "auto") == line == _formats.show_text(raw, "text")
    assert _formats.show_json(raw, "auto") == (line, "text")


JSONABLE = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | LINE,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(LINE, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(JSONABLE)
def test_values_of_the_python_api_are_shown_decoded(value: Any) -> None:
    """A value stored by the default serializer is shown as its JSON by ``json``, and by ``auto`` whenever
    it is not also valid UTF-8 (which ``auto`` shows as text, the documented ambiguity)."""
    raw = msgpack.packb(value, use_bin_type=True)
    assert json.loads(_formats.show_text(raw, "json")) == value
    assert _formats.show_json(raw, "json") == (value, "msgpack")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        assert _formats.show_json(raw, "auto") == (value, "msgpack")
    else:
        expected = value if len(raw) == 1 and raw.decode() in CONTROL else text
        assert _formats.show_text(raw, "auto") == str(expected)


@settings(max_examples=15, deadline=None)
@given(st.lists(JSONABLE.filter(lambda v: v is not None), min_size=1, max_size=5))
def test_json_values_round_trip(values: list[Any]) -> None:
    """``produce --value-format json`` stores what ``Producer.send(topic, obj)`` stores; ``consume
    --value-format json`` prints it back as JSON."""
    stdin = "".join(json.dumps(v) + "\n" for v in values).encode()
    out = _round_trip(stdin, ["--value-format", "json"], ["--value-format", "json"])
    assert [json.loads(line) for line in out.decode().split("\n")[:-1]] == values  # not splitlines: U+0085


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=20)), max_size=5))
def test_binary_keys_and_values_round_trip_as_base64_and_hex(records: list[tuple[bytes, bytes]]) -> None:
    stdin = "".join(f"{k.hex()} {base64.b64encode(v).decode()}\n" for k, v in records).encode()
    out = _round_trip(
        stdin,
        ["--key-separator", " ", "--key-format", "hex", "--value-format", "base64"],
        ["--print-key", "--key-format", "hex", "--value-format", "base64"],
    )
    assert out == stdin.replace(b" ", b"\t")


def test_bad_input_formats_name_the_line(cli: Pylog) -> None:
    cli.ok("topics", "create", "t")
    line = cli.fails("produce", "t", "--value-format", "hex", stdin="00\nzz\n")
    assert "line 2: invalid hex value" in line and "(1 record was produced)" in line
    line = cli.fails("produce", "t", "--key-separator", ":", "--key-format", "base64", stdin="%%:v\n")
    assert "line 1: invalid base64 key" in line
    cli.ok("produce", "t", stdin="plain text\n")
    line = cli.fails("consume", "t", "--from-beginning", "--value-format", "json")
    assert "t-0 offset 1: a value is not msgpack" in line
    line = cli.fails("dump", _segment(cli.dir, "t"), "--print-data", "--value-format", "json")
    assert "offset 1: a value is not msgpack" in line
    assert (
        cli.ok("consume", "t", "--from-beginning", "--value-format", "hex")
        == "00\n" + b"plain text".hex() + "\n"
    )


# -- dump recognises what it is given ---------------------------------------------------------------------


def test_dump_refuses_files_that_are_not_segment_files(cli: Pylog, tmp_path: Any) -> None:
    cli.ok("topics", "create", "t")
    cli.ok("produce", "t", stdin="a\nb\n")
    partition = os.path.dirname(_segment(cli.dir, "t"))
    notes = os.path.join(str(tmp_path), "app.log")
    with open(notes, "w") as f:
        f.write("2024-05-01 12:00:00 INFO an application's own log, long enough to fill a batch header\n")
    expected = {
        os.path.join(cli.dir, "manifest"): "manifest",
        os.path.join(partition, "partition.state"): "publication state",
        os.path.join(partition, "recovery.checkpoint"): "recovery-point checkpoint",
        notes: "does not start with a record batch",
        cli.dir: "a log directory",
    }
    for path, what in expected.items():
        for extra in ([], ["--verify-index-only"]):
            code, out, err = _run(["dump", path, *extra])
            assert code == 1 and out == b"" and err.count("\n") == 1, (path, err)
            assert "not a segment file" in err or "no segment files" in err, err
            assert err.startswith(f"pylog: error: {path}") and what in err, err
    # refused before anything is dumped, even after a good file
    code, out, _ = _run(["dump", _segment(cli.dir, "t"), os.path.join(cli.dir, "manifest")])
    assert code == 1 and out == b""

    copy = os.path.join(str(tmp_path), "backup.bin")  # a segment under another name: known by its batches
    shutil.copyfile(_segment(cli.dir, "t"), copy)
    assert "Summary: 1 batches, 2 records" in cli.ok("dump", copy)


# -- produce: failures, interrupts, errors ----------------------------------------------------------------


def test_produce_reports_records_that_failed_to_be_written(
    log_dir: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails makes produce exit 1 saying how many records failed, at which line and why; the
    count of produced records it prints is what the log holds."""
    with pylog.open(log_dir) as log:
        log.create_topic("t")
    lines = [f"line {i}" for i in range(3000)]
    lines[1700] = "POISON"
    path = os.path.join(str(tmp_path), "in.txt")
    with open(path, "w") as f:
        f.writelines(line + "\n" for line in lines)
    append = PartitionLog.append

    def failing_append(self: PartitionLog, batch: bytes | bytearray) -> Any:
        if b"POISON" in batch:
            raise StorageError("the disk refused the write")
        return append(self, batch)

    monkeypatch.setattr(PartitionLog, "append", failing_append)
    code, out, err = _run(["--dir", log_dir, "--json", "produce", "t", "--file", path])
    monkeypatch.undo()
    assert code == 1
    summary = json.loads(out)
    (message,) = err.splitlines()
    m = re.fullmatch(
        r"pylog: error: (\d+) records? failed, the first at line (\d+) \(StorageError: the disk refused the "
        r"write\); (\d+) lines were read \((\d+) records? were produced\)",
        message,
    )
    assert m is not None, message
    failed, first, read, produced = (int(g) for g in m.groups())
    assert first <= 1701 <= read and failed >= 1 and produced + failed == read
    assert produced == summary["records"] and failed == summary["failed"]
    with pylog.open(log_dir) as log:
        consumer = log.consumer(
            "t", auto_offset_reset="earliest", value_deserializer=None, consumer_timeout_ms=0
        )
        stored = [r.value.decode() for r in consumer]
        consumer.close()
    assert len(stored) == produced and "POISON" not in stored
    assert set(stored) <= set(lines) and stored == sorted(stored, key=lines.index)  # in input order


def test_large_lines_that_fit_one_by_one_are_all_produced(cli: Pylog) -> None:
    """Six 20 KB lines to a topic whose batches may hold at most 100000 bytes: each fits on its own, so all six
    are written (in batches cut to fit), as Kafka's console producer would; none fails for being batched."""
    cli.ok("topics", "create", "big", "--config", "max_message_bytes=100000")
    lines = [chr(ord("a") + i) * 20_000 for i in range(6)]
    r = cli.run("produce", "big", stdin="".join(line + "\n" for line in lines))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert re.match(r"Produced 6 records", r.stdout), r.stdout
    assert cli.ok("consume", "big", "--from-beginning").splitlines() == lines


def _wait_for_records(path: str, proc: subprocess.Popen[str], last: bytes | None = None) -> None:
    """Until the segment file holds data (with ``last``: until it holds that value, stored uncompressed), or
    the process ended. Data in the segment proves the command has installed its signal handlers (they come
    before the producer) and that at least one record was written; it says nothing about how many."""

    def written() -> bool:
        if not os.path.exists(path) or os.path.getsize(path) == 0:
            return False
        if last is None:
            return True
        with open(path, "rb") as f:
            return last in f.read()

    while proc.poll() is None and not written():
        time.sleep(0.02)


def _produced(n: int) -> str:
    """How ``pylog produce`` counts ``n`` acknowledged records in its error line."""
    return "1 record was produced" if n == 1 else f"{n} records were produced"


def test_ctrl_c_while_producing_a_big_file_keeps_every_acknowledged_record(cli: Pylog, tmp_path: Any) -> None:
    cli.ok("topics", "create", "big")
    path = os.path.join(str(tmp_path), "big.txt")
    with open(path, "w") as f:
        f.writelines(f"{i}\n" for i in range(1_000_000))
    proc = subprocess.Popen(
        cli.argv("produce", "big", "--file", path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=cli.env,
    )  # fmt: skip
    # Data in the segment: the handlers are installed and at least one record was written. How many is up to
    # the scheduler (the sender thread writes whatever is queued, as few as one record on a loaded machine):
    # any count from 1 up is right, as long as the error line, the summary and the log agree on it.
    _wait_for_records(_segment(cli.dir, "big"), proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    m = re.match(r"pylog: error: interrupted by SIGINT after line \d+: (\d+) record", err)
    assert m is not None, err
    produced = int(m.group(1))
    assert 0 < produced < 1_000_000, err
    line = f"after line {produced}: {_produced(produced)} (acknowledged)"  # every line read was produced
    assert err == f"pylog: error: interrupted by SIGINT {line}\n"
    noun = "record" if produced == 1 else "records"
    assert out == f"Produced {produced} {noun} to big (partition 0: offsets 0-{produced - 1}).\n", out
    with pylog.open(cli.dir) as log:
        assert log.topic("big").partition(0).log_end_offset == produced
        consumer = log.consumer(
            "big", auto_offset_reset="earliest", value_deserializer=None, consumer_timeout_ms=0
        )
        assert [int(r.value) for r in consumer] == list(range(produced))  # the first lines, in order
        consumer.close()


def test_ctrl_c_while_waiting_for_input_reports_what_was_produced(cli: Pylog) -> None:
    cli.ok("topics", "create", "t")
    proc = subprocess.Popen(
        cli.argv("produce", "t"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=cli.env,
    )  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write("one\ntwo\nthree\n")
    proc.stdin.flush()
    # Until "three" is written, not just any record: the sender thread may write "one" and "two" before
    # "three" is sent, and a SIGINT then would rightly stop before it. Once "three" is written, it was sent,
    # and reading stops before any further line: every later SIGINT finds the command at the same point.
    _wait_for_records(_segment(cli.dir, "t"), proc, last=b"three")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and out == "Produced 3 records to t (partition 0: offsets 0-2).\n"
    assert err == "pylog: error: interrupted by SIGINT after line 3: 3 records were produced (acknowledged)\n"
    assert cli.ok("consume", "t", "--from-beginning") == "one\ntwo\nthree\n"


# -- every error is one line naming its cause -------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (PylogError(), "pylog: error: PylogError (no message)"),
        (StorageError(), "pylog: error: StorageError (no message)"),
        (OSError(), "pylog: error: OSError (no message)"),
        (RuntimeError(), "pylog: error: unexpected RuntimeError: RuntimeError (no message)"),
        (KeyboardInterrupt(), "pylog: error: interrupted by Ctrl-C (KeyboardInterrupt)"),
        (UnknownGroupError(), "pylog: error: UnknownGroupError (no message)"),
    ],
)
def test_errors_without_a_message_name_their_type(
    exc: BaseException, expected: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def failing(args: Any) -> int:
        raise exc

    monkeypatch.setattr(_topics, "list_topics", failing)
    monkeypatch.delenv("PYLOG_DEBUG", raising=False)
    code, _, err = _main(capsys, "topics", "list")
    assert err.startswith(expected) and err.count("\n") == 1
    assert code == (130 if isinstance(exc, KeyboardInterrupt) else 1)


def _commands(parser: argparse.ArgumentParser, prefix: list[str]) -> Iterator[list[str]]:
    yield prefix
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, [*prefix, name])


def test_every_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    commands = list(_commands(build_parser(), []))
    assert ["groups", "delete"] in commands and ["produce"] in commands
    for command in commands:
        with pytest.raises(SystemExit) as exit_:
            main([*command, "--help"])
        out = capsys.readouterr().out
        assert exit_.value.code == 0 and out.startswith("usage: pylog"), command


_MARKUP = re.compile(r"``|:(?:class|func|meth|mod|attr|data|exc|ref|obj):`|`~|^\s*\.\. \w+::", re.M)
_INTERNALS = re.compile(r"\bpylog\.[a-z_]+|\bLog\.[a-z_]+|\b_[a-z]+\.py\b|\bthe installed pylog\b")


def _parsers(parser: argparse.ArgumentParser, prefix: list[str]) -> Iterator[tuple[list[str], Any]]:
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            listed = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                assert listed.get(name), (
                    f"'pylog {' '.join([*prefix, name])}' has no one-line help in its parent"
                )
                yield from _parsers(sub, [*prefix, name])


def test_help_texts_are_plain_text_and_complete(capsys: pytest.CaptureFixture[str]) -> None:
    """Every command's --help is plain text (no reStructuredText roles or literals, no names of pylog's
    modules and methods), every option and argument is explained, and every command a user runs describes
    what it does and its exit status."""
    problems: dict[str, None] = {}  # each problem once, in order
    for command, parser in _parsers(build_parser(), []):
        name = " ".join(["pylog", *command])
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        text = capsys.readouterr().out
        found = [f"{name}: markup {m.group()!r}" for m in _MARKUP.finditer(text)]
        found += [f"{name}: internals {m.group()!r}" for m in _INTERNALS.finditer(text)]
        found += [
            f"{name}: {'/'.join(a.option_strings) or a.dest} has no help"
            for a in parser._actions
            if not a.help and not isinstance(a, argparse._SubParsersAction)
        ]
        leaf = not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
        if not (parser.description or "").strip():
            found.append(f"{name}: no description")
        elif leaf and "Exit status" not in parser.description:
            found.append(f"{name}: the description does not give the exit status")
        problems.update(dict.fromkeys(found))
    assert not problems, "\n".join(problems)
