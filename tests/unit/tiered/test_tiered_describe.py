"""``Topic.describe()`` and ``pylog topics describe`` of tiered partitions: the whole log's offsets (as
``beginning_offsets``/``end_offsets``), what is local and what the object store holds; a log opened from its
URL is described from its remote segments, not as empty."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import pylog
from pylog.cli import main
from pylog.clock import ManualClock
from pylog.tiered.manifest import read_manifest
from pylog.tiered.store import ObjectStore

HOUR = 3600 * 1000
T0 = 1_700_000_000_000


def _tiered_log(root: Path, url: str, options: dict[str, Any]) -> dict[str, Any]:
    """A tiered topic ``t`` (2 partitions) whose oldest segments were uploaded and deleted locally, and a plain
    topic ``plain``; what its manifests hold, per partition."""
    clock = ManualClock(T0, auto_advance=False)
    with pylog.open(
        root,
        clock=clock,
        remote_storage=url,
        remote_storage_options=options,
        remote_log_manager_task_interval_ms=-1,
    ) as log:
        log.create_topic("t", 2, segment_bytes=1024, remote_storage_enable=True, local_retention_ms=HOUR)
        log.create_topic("plain", 1)
        p = log.producer(batch_size=200, value_serializer=None)
        for i in range(600):
            p.send("t", b"v%d" % i + bytes(40), partition=i % 2, timestamp_ms=T0)
            p.send("plain", b"x", timestamp_ms=T0)
        p.flush()
        p.close()
        for n in range(2):
            log.topic("t").partition(n).roll()
        log.tier()
        clock.advance(2 * HOUR)  # past local_retention_ms: the uploaded local copies go
        log.apply_retention()
        for n in range(2):
            assert log.topic("t").partition(n).local_log_start_offset > 0
    store = ObjectStore(url, **options)
    return {n: read_manifest(store, "t", n)[0] for n in range(2)}


def test_describe_of_a_tiered_topic_shows_the_whole_log_and_its_remote_part(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    url, options = remote
    manifests = _tiered_log(tmp_path / "log", url, options)
    with pylog.open(
        tmp_path / "log", remote_storage_options=options, remote_log_manager_task_interval_ms=-1
    ) as log:
        topic = log.topic("t")
        described = topic.describe()["partitions"]
        begins, ends = topic.beginning_offsets(), topic.end_offsets()
        for info in described:
            n = info["partition"]
            plog, manifest = topic.partition(n), manifests[n]
            local = plog.segments
            below = [s for s in manifest.segments if s.next_offset <= local[0].base_offset]
            assert info["log_start_offset"] == begins[n] == 0  # as beginning_offsets says
            assert info["log_end_offset"] == ends[n]
            assert info["local_log_start_offset"] == plog.local_log_start_offset == local[0].base_offset > 0
            assert (info["local_segments"], info["local_bytes"]) == (len(local), sum(s.size for s in local))
            assert info["remote_log_start_offset"] == manifest.log_start_offset == 0
            assert info["remote_log_end_offset"] == manifest.log_end_offset
            assert info["remote_segments"] == len(manifest.segments)
            assert info["remote_bytes"] == sum(s.size for s in manifest.segments) > 0
            assert info["segments"] == len(local) + len(below)
            assert info["bytes"] == sum(s.size for s in local) + sum(s.size for s in below)
        (plain,) = log.topic("plain").describe()["partitions"]
        assert set(plain) == {"partition", "log_start_offset", "log_end_offset", "segments", "bytes"}
        assert plain["log_end_offset"] == 600


def test_describe_of_a_log_opened_from_its_url_is_not_empty(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    url, options = remote
    manifests = _tiered_log(tmp_path / "log", url, options)
    with pylog.open(url, read_only=True, remote_storage_options=options) as replica:
        topic = replica.topic("t")
        begins, ends = topic.beginning_offsets(), topic.end_offsets()
        for info in topic.describe()["partitions"]:
            n = info["partition"]
            manifest = manifests[n]
            size = sum(s.size for s in manifest.segments)
            assert ends[n] == manifest.log_end_offset > 0
            assert (info["log_start_offset"], info["log_end_offset"]) == (begins[n], ends[n])
            assert (info["segments"], info["bytes"]) == (len(manifest.segments), size)
            assert (info["remote_segments"], info["remote_bytes"]) == (len(manifest.segments), size)
            assert (info["local_log_start_offset"], info["local_segments"], info["local_bytes"]) == (
                None,
                0,
                0,
            )


def test_pylog_topics_describe_shows_the_remote_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = (tmp_path / "remote").as_uri()
    manifests = _tiered_log(tmp_path / "log", url, {})
    capsys.readouterr()
    assert main(["--json", "--dir", str(tmp_path / "log"), "topics", "describe", "t"]) == 0
    (doc,) = json.loads(capsys.readouterr().out)
    for info in doc["partitions"]:
        manifest = manifests[info["partition"]]
        assert info["log_start_offset"] == 0 < info["local_log_start_offset"]
        assert info["remote_bytes"] == sum(s.size for s in manifest.segments)
    assert main(["--dir", str(tmp_path / "log"), "topics", "describe", "t"]) == 0
    text = capsys.readouterr().out
    for column in ("LOCAL-START-OFFSET", "REMOTE-START-OFFSET", "REMOTE-END-OFFSET", "REMOTE-BYTES"):
        assert column in text
    assert main(["--dir", str(tmp_path / "log"), "topics", "describe", "plain"]) == 0
    assert "REMOTE" not in capsys.readouterr().out
