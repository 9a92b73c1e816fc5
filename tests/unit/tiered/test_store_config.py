"""A mistake in an object-store URL or its options is a ConfigError when the store or the log is opened: one
line naming the URL or the option, never a RemoteStorageError (which says "retry"), and nothing recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import pylog
from pylog.cli import main
from pylog.errors import ConfigError, RemoteStorageError
from pylog.tiered.location import FILE_NAME
from pylog.tiered.store import ObjectStore, check_store

# (url, options, what the message must name)
MISTAKES: list[tuple[str, dict[str, Any], str]] = [
    ("not-a-url", {}, "'not-a-url'"),
    ("nope://bucket/x", {}, "'nope'"),
    ("s3://", {}, "names no bucket"),
    ("file://relative/path", {}, "absolute path"),
    ("s3://bucket/p", {"foo": "bar"}, "'foo'"),
    ("s3://bucket/p", {"region": 5}, "'region'"),
    ("s3://bucket/p", {"client_options": {"allow_htp": True}}, "client_options['allow_htp']"),
    ("s3://bucket/p", {"retry_config": {"max_retries": "x"}}, "'retry_config'"),
    ("s3://bucket/p", {"endpoint": "not a url"}, "endpoint='not a url'"),
    ("s3://bucket/p", {"endpoint": "http://127.0.0.1:9000"}, "allow_http"),
    ("memory:///", {"foo": 1}, "'foo'"),
    ("file:///tmp/pylog-never-made", {"region": "us-east-1"}, "'region'"),
]


@pytest.mark.parametrize(("url", "options", "named"), MISTAKES)
def test_a_store_mistake_is_a_config_error_of_one_line_naming_it(
    url: str, options: dict[str, Any], named: str
) -> None:
    for opening in (lambda: ObjectStore(url, **options), lambda: check_store(url, options)):
        with pytest.raises(ConfigError) as caught:
            opening()
        assert not isinstance(caught.value, RemoteStorageError)
        message = str(caught.value)
        assert "\n" not in message and named in message, message


def test_good_options_pass(tmp_path: Path) -> None:
    check_store("s3://bucket/p", {"endpoint": "http://h:9000", "client_options": {"allow_http": True}})
    check_store("s3://bucket/p", {"region": "eu-west-1", "access_key_id": "a", "secret_access_key": "b"})
    check_store((tmp_path / "never").as_uri(), {})
    assert not (tmp_path / "never").exists()  # checking creates nothing


@pytest.mark.parametrize(
    ("url", "options"), [("not-a-url", {}), ("file:///x", {"foo": "bar"}), ("s3://b/p", {"foo": "bar"})]
)
def test_open_refuses_a_bad_store_before_recording_it(
    tmp_path: Path, url: str, options: dict[str, Any]
) -> None:
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("t", 1, remote_storage_enable=True)
    with pytest.raises(ConfigError):
        pylog.open(tmp_path / "log", remote_storage=url, remote_storage_options=options)
    assert not (tmp_path / "log" / FILE_NAME).exists()
    with pylog.open(tmp_path / "log") as log:  # the log itself is as it was
        assert log.remote_storage is None


def test_tier_refuses_a_bad_url_or_option_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(tmp_path / "log")
    assert main(["--dir", root, "topics", "create", "t"]) == 0  # no topic is tiered: nothing to upload
    capsys.readouterr()
    assert main(["--dir", root, "tier", "not-a-url"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'not-a-url'" in err
    url = (tmp_path / "remote").as_uri()
    assert main(["--dir", root, "tier", url, "--option", "foo=bar"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'foo'" in err
    assert main(["--dir", root, "tier", "s3://bucket/p", "--option", "foo=bar"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'foo'" in err
    assert not (tmp_path / "log" / FILE_NAME).exists()  # nothing recorded
    assert not (tmp_path / "remote").exists()
