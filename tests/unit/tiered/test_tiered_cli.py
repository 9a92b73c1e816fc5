"""``pylog tier`` and ``pylog restore``: the commands report what the library did, and fail with one line."""

from __future__ import annotations

import json
from pathlib import Path

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
