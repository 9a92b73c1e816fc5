"""A URL that holds no pylog log (a mistyped bucket or prefix) is an error for restore and for a read-only open,
never an empty log made or shown without a word; ``allow_empty`` asks for the empty log. Restore takes its
store options as ``remote_storage_options``, as ``pylog.open`` does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import pylog
from pylog.cli import main
from pylog.errors import ConfigError, NotALogDirectoryError
from pylog.tiered.restore import restore
from pylog.tiered.store import ObjectStore


def _tiered(root: Path, url: str, options: dict[str, Any], topic: str = "t") -> None:
    with pylog.open(
        root, remote_storage=url, remote_storage_options=options, remote_log_manager_task_interval_ms=-1
    ) as log:
        log.create_topic(topic, 1, remote_storage_enable=True)
        p = log.producer()
        for i in range(10):
            p.send(topic, i)
        p.close()
        log.topic(topic).partition(0).roll()
        log.tier()


def _wrong(url: str) -> str:
    return url.rstrip("/") + "-typo"


def test_restore_from_a_url_holding_no_log_is_an_error_unless_allowed(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    url, options = remote
    _tiered(tmp_path / "log", url, options)
    wrong = _wrong(url)
    with pytest.raises(NotALogDirectoryError, match="holds no pylog log"):
        restore(wrong, tmp_path / "restored", remote_storage_options=options)
    assert not (tmp_path / "restored").exists()
    assert [p.name for p in tmp_path.iterdir() if "restore" in p.name] == []  # no staging left
    assert not wrong.startswith("file://") or not Path(wrong[len("file://") :]).exists()  # nothing made there

    assert restore(wrong, tmp_path / "empty", remote_storage_options=options, allow_empty=True) == {}
    with pylog.open(tmp_path / "empty") as log:
        assert log.topics() == []
    report = restore(url, tmp_path / "restored", remote_storage_options=options)  # the right URL
    assert report[pylog.TopicPartition("t", 0)].log_end_offset == 10


def test_a_read_only_open_of_a_url_holding_no_log_is_an_error(
    tmp_path: Path, remote: tuple[str, dict[str, Any]]
) -> None:
    url, options = remote
    _tiered(tmp_path / "log", url, options)
    with pytest.raises(NotALogDirectoryError, match="holds no pylog log"):
        pylog.open(_wrong(url), read_only=True, remote_storage_options=options)
    with pylog.open(url, read_only=True, remote_storage_options=options) as ro:
        assert ro.topics() == ["t"]
    with pylog.open(tmp_path / "log", remote_storage_options=options) as log:
        log.delete_topic("t")
    # every topic deleted: still the store of a log (its tombstones), which has no topics
    with pylog.open(url, read_only=True, remote_storage_options=options) as ro:
        assert ro.topics() == []
    restore(url, tmp_path / "after-delete", remote_storage_options=options)  # an empty log, no error


def test_restore_store_options_one_way(tmp_path: Path, remote: tuple[str, dict[str, Any]]) -> None:
    url, options = remote
    _tiered(tmp_path / "log", url, options)
    if options:  # the former way still works, with a warning
        with pytest.warns(DeprecationWarning, match="remote_storage_options"):
            report = restore(url, tmp_path / "old-way", **options)
        assert report[pylog.TopicPartition("t", 0)].log_end_offset == 10
        with pytest.raises(ConfigError), pytest.warns(DeprecationWarning):
            restore(url, tmp_path / "both", remote_storage_options=options, **options)
    with pytest.raises(ConfigError, match="for a URL"):
        restore(ObjectStore(url, **options), tmp_path / "x", remote_storage_options={"region": "x"})


def test_pylog_restore_from_a_wrong_prefix_exits_1_unless_allow_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = (tmp_path / "remote").as_uri()
    _tiered(tmp_path / "log", url, {})
    capsys.readouterr()
    wrong, target = _wrong(url), str(tmp_path / "restored")
    assert main(["restore", wrong, target]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no pylog log" in err
    assert not Path(target).exists()
    assert main(["restore", wrong, target, "--allow-empty"]) == 0
    assert "restored an empty log" in capsys.readouterr().out
    assert main(["restore", url, str(tmp_path / "good")]) == 0
