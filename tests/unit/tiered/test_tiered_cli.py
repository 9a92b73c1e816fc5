"""``pylog tier`` and ``pylog restore``: the commands report what the library did, and fail with one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import pylog
from pylog.cli import main
from pylog.clock import ManualClock


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> object:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_topics_create_tier_and_restore_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, url, target = str(tmp_path / "log"), (tmp_path / "remote").as_uri(), str(tmp_path / "restored")
    cfg = ["--config", "remote.storage.enable=true", "--config", "segment_bytes=1024"]
    assert main(["--dir", root, "topics", "create", "t", "--partitions", "2", *cfg]) == 0
    with pylog.open(root, clock=ManualClock()) as log:
        p = log.producer(batch_size=200)
        for i in range(400):
            p.send("t", i)
        p.flush()
        p.close()
        for n in range(2):
            log.topic("t").partition(n).roll()
        ends = log.topic("t").end_offsets()
    capsys.readouterr()

    tiered = _json(capsys, ["--json", "--dir", root, "tier", url])
    assert isinstance(tiered, dict)
    assert {(r["partition"], r["remote_end_offset"]) for r in tiered["partitions"]} == set(ends.items())
    assert all(r["uploaded"] > 0 and r["manifest_version"] == 1 for r in tiered["partitions"])
    again = _json(capsys, ["--json", "--dir", root, "tier", url])
    assert isinstance(again, dict) and {r["uploaded"] for r in again["partitions"]} == {0}

    restored = _json(capsys, ["--json", "restore", url, target])
    assert isinstance(restored, dict)
    assert {(r["partition"], r["last_offset"]) for r in restored["partitions"]} == {
        (p, end - 1) for p, end in ends.items()
    }
    with pylog.open(target) as log:
        assert log.topic("t").end_offsets() == ends

    assert main(["restore", url, target]) == 1  # the target is not empty now
    assert "not an empty directory" in capsys.readouterr().err
    assert main(["restore", url, str(tmp_path / "x"), "--option", "novalue"]) == 2


def test_topics_delete_of_a_tiered_topic_deletes_its_remote_data_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pylog.tiered.manifest import remote_topics
    from pylog.tiered.store import ObjectStore

    root, url = str(tmp_path / "log"), (tmp_path / "remote").as_uri()
    cfg = ["--config", "remote.storage.enable=true", "--config", "segment_bytes=1024"]
    for name in ("t", "u"):
        assert main(["--dir", root, "topics", "create", name, *cfg]) == 0
    with pylog.open(root, clock=ManualClock()) as log:
        p = log.producer(batch_size=200)
        for i in range(200):
            p.send("t", i)
            p.send("u", i)
        p.flush()
        p.close()
        log.topic("t").partition(0).roll()
        log.topic("u").partition(0).roll()
    assert main(["--dir", root, "tier", url]) == 0  # records the URL in the directory
    store = ObjectStore(url)
    assert sorted(remote_topics(store)["topics"]) == ["t", "u"]
    capsys.readouterr()

    assert _json(capsys, ["--json", "--dir", root, "topics", "delete", "t"]) == {
        "topic": "t",
        "deleted": True,
        "remote": "deleted",
    }
    assert sorted(remote_topics(store)["topics"]) == ["u"]
    assert not [o for o in store.list("t/") if "/segments/" in o.key]
    assert main(["--dir", root, "topics", "delete", "u"]) == 0
    assert capsys.readouterr().out == f"Deleted topic u.\nIts data in the object store was deleted ({url}).\n"
    assert remote_topics(store)["topics"] == {}


# -- the store of a tiered log from every command ----------------------------------------------------------


def _cli_options(options: dict[str, Any]) -> list[str]:
    """``--option`` arguments for the moto store's options (its retry settings are left at pylog's)."""
    out = []
    for key, value in options.items():
        if key == "client_options":
            out += [f"--option={k}={str(v).lower()}" for k, v in value.items()]
        elif key != "retry_config":
            out.append(f"--option={key}={value}")
    return out


def test_commands_reach_the_store_of_a_tiered_log_and_read_a_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], s3_remote: tuple[str, dict[str, Any]]
) -> None:
    """A tiered log whose oldest records live only in S3 (no AWS_* variables: the options are needed), read by
    consume, topics describe and groups, through --option; and the store itself as --dir URL."""
    url, s3 = s3_remote
    root = str(tmp_path / "log")
    clock = ManualClock(1_700_000_000_000, auto_advance=False)
    with pylog.open(
        root,
        clock=clock,
        remote_storage=url,
        remote_storage_options=s3,
        remote_log_manager_task_interval_ms=-1,
    ) as log:
        log.create_topic("t", 1, segment_bytes=1024, remote_storage_enable=True, local_retention_ms=1000)
        p = log.producer()
        for i in range(300):
            p.send("t", i, timestamp_ms=clock.time_ms())
        p.close()
        log.topic("t").partition(0).roll()
        log.tier()
        clock.advance(10_000)
        log.apply_retention()
        assert log.topic("t").partition(0).local_log_start_offset > 0  # the oldest records: only in S3
    options = _cli_options(s3)
    capsys.readouterr()

    def consumed(argv: list[str]) -> list[int]:
        assert main([*argv, "--value-format", "msgpack"]) == 0, capsys.readouterr().err
        return [int(line) for line in capsys.readouterr().out.split()]

    assert consumed(["--dir", root, *options, "consume", "t", "--from-beginning"]) == list(range(300))
    assert consumed(["--dir", url, *options, "consume", "t", "--from-beginning"]) == list(range(300))
    groups = str(tmp_path / "groups")
    argv = [
        "--dir",
        url,
        *options,
        "--groups-dir",
        groups,
        "consume",
        "t",
        "--group",
        "g",
        "--from-beginning",
    ]
    assert consumed([*argv, "--max-messages", "100"]) == list(range(100))
    assert consumed(argv) == list(range(100, 300))  # the group committed where the first run stopped
    info = _json(capsys, ["--json", "--dir", root, *options, "topics", "describe", "t"])
    assert isinstance(info, list) and info[0]["partitions"][0]["log_start_offset"] == 0
    assert main(["--dir", url, *options, "topics", "create", "u"]) == 1  # read-only
    assert "read-only" in capsys.readouterr().err


def test_option_and_groups_dir_are_refused_where_nothing_uses_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(tmp_path / "log")
    assert main(["--dir", root, "topics", "create", "t"]) == 0
    assert main(["--dir", root, "--option", "region=x", "topics", "list"]) == 2  # the log has no store
    assert main(["--dir", root, "--groups-dir", str(tmp_path / "g"), "topics", "list"]) == 2
    assert main(["--dir", root, "--option", "region=x", "repair"]) == 2
    assert main(["--dir", root, "tier"]) == 2  # no URL given, none recorded
    err = capsys.readouterr().err
    assert "records no object store" in err and "--groups-dir" in err


def test_tier_roll_uploads_the_active_segments_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An edge device shutting down: ``pylog tier --roll`` (URL recorded) leaves nothing out of the bucket."""
    root, url = str(tmp_path / "log"), (tmp_path / "remote").as_uri()
    assert (
        main(
            [
                "--dir",
                root,
                "topics",
                "create",
                "t",
                "--partitions",
                "2",
                "--config",
                "remote.storage.enable=true",
            ]
        )
        == 0
    )
    assert main(["--dir", root, "tier", url]) == 0  # records the URL; nothing sealed yet
    with pylog.open(root, remote_log_manager_task_interval_ms=-1) as log:
        p = log.producer()
        for i in range(50):
            p.send("t", i, partition=i % 2)
        p.close()
        ends = log.topic("t").end_offsets()
    capsys.readouterr()
    plain = _json(capsys, ["--json", "--dir", root, "tier"])  # the active segments are not uploaded
    assert isinstance(plain, dict) and {r["remote_end_offset"] for r in plain["partitions"]} == {None}
    rolled = _json(capsys, ["--json", "--dir", root, "tier", "--roll"])
    assert isinstance(rolled, dict) and rolled["url"] == url
    assert {r["partition"]: r["remote_end_offset"] for r in rolled["partitions"]} == ends
    again = _json(capsys, ["--json", "--dir", root, "tier", "--roll"])  # empty active segments: no roll
    assert isinstance(again, dict) and {r["uploaded"] for r in again["partitions"]} == {0}
    restore_report = _json(capsys, ["--json", "restore", url, str(tmp_path / "restored")])
    assert isinstance(restore_report, dict)
    assert {r["partition"]: r["log_end_offset"] for r in restore_report["partitions"]} == ends
