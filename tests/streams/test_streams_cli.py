"""``pylog streams describe`` and ``pylog streams reset`` on a stream application's group and topics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streams_helpers import committed_records, wait_for

import pylog
from pylog.cli import main
from pylog.streams import MSGPACK, App
from pylog.streams.admin import internal_topics


def _app(log: pylog.Log) -> App:
    app = App(log, "counter", commit_interval_ms=20)
    counts = app.stream("clicks").group_by(lambda k, v: v % 3).count(name="mod3")
    counts.to_stream().to("counts", key_serde=MSGPACK)
    return app


def test_describe_and_reset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "log")
    with pylog.open(path) as log:
        log.create_topic("clicks", partitions=2)
        log.create_topic("counts", partitions=2)
        log.create_topic("counter-not-mine")  # a user topic with the prefix: never an internal topic
        producer = log.producer()
        for i in range(30):
            producer.send("clicks", i, key=f"k{i}")
        producer.close()
        app = _app(log)
        app.start()
        wait_for(lambda: len(committed_records(log, "counts")) == 30, "the counts")

        assert main(["--dir", path, "streams", "reset", "counter", "--execute"]) == 1  # still running
        assert "live group members" in capsys.readouterr().err

        app.close()
    assert main(["--dir", path, "--json", "streams", "describe", "counter"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["state"] == "Empty" and info["members"] == []
    assert {(r["topic"], r["lag"]) for r in info["partitions"]} == {
        ("clicks", 0),
        ("counter-mod3-repartition", 0),
    }
    assert [(t["topic"], t["partitions"], t["cleanup_policy"]) for t in info["internal_topics"]] == [
        ("counter-mod3-changelog", 2, "compact"),
        ("counter-mod3-repartition", 2, "delete"),
    ]
    assert main(["--dir", path, "streams", "describe", "counter"]) == 0
    assert "counter-mod3-changelog" in capsys.readouterr().out

    assert main(["--dir", path, "streams", "reset", "counter"]) == 0  # a dry run
    assert capsys.readouterr().out.startswith("Would delete (dry run; --execute to delete): consumer group")
    with pylog.open(path) as log:
        assert internal_topics(log, "counter") == ["counter-mod3-changelog", "counter-mod3-repartition"]
    assert main(["--dir", path, "streams", "reset", "counter", "--execute"]) == 0
    assert capsys.readouterr().out == (
        "Deleted: consumer group counter, topic counter-mod3-changelog, topic counter-mod3-repartition\n"
    )
    with pylog.open(path) as log:
        assert log.list_groups() == []
        assert sorted(log.topics()) == ["clicks", "counter-not-mine", "counts"]
        again = _app(log)  # from scratch: the inputs again from the beginning, the counts from zero
        again.start()
        wait_for(lambda: len(committed_records(log, "counts")) == 60, "the counts again")
        again.close()
        assert log.topic("counter-mod3-changelog").table(isolation_level="read_committed") == {
            b"\x00": 10,
            b"\x01": 10,
            b"\x02": 10,
        }
    assert main(["--dir", path, "streams", "describe", "nothing"]) == 1
