"""What docs/errors.md and docs/kafka-python.md say about when an error is raised is what pylog does: every
call the IllegalStateError row lists raises it, and no call it leaves out is listed (a poll with nothing
assigned returns nothing); a bad timestamp to offsets_for_times is the InvalidTimestampError the page names;
an unknown setting is the ConfigError (a ValueError, not a TypeError) kafka-python.md names."""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import pytest

import pylog
from pylog import TopicPartition, errors

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs")


def _row(page: str, error: str) -> str:
    """The text of ``error``'s row in the table of docs/``page``."""
    with open(os.path.join(DOCS, page)) as f:
        (row,) = [line for line in f if line.startswith(f"| `{error}` |")]
    return row


def _illegal_calls(log: pylog.Log) -> dict[str, Callable[[], object]]:
    """Each call the IllegalStateError row of errors.md names, made in the state it names."""
    tp = TopicPartition("t", 0)
    plain = log.consumer()
    subscribed = log.consumer(group_id="g")
    subscribed.subscribe(["t"])
    transactional = log.producer(transactional_id="tx")
    return {
        "seek()": lambda: plain.seek(tp, 0),
        "position()": lambda: plain.position(tp),
        "pause()": lambda: plain.pause(tp),
        "commit()": lambda: plain.commit(),
        "committed()": lambda: plain.committed(tp),
        "assign()": lambda: subscribed.assign([tp]),
        "subscribe()": lambda: subscribed.subscribe(["t"], pattern="t.*"),
        "transactional": lambda: transactional.commit_transaction(),  # before init_transactions()
    }


def test_every_call_the_illegal_state_row_lists_raises_it(log: pylog.Log) -> None:
    log.create_topic("t", partitions=2)
    row = _row("errors.md", "IllegalStateError")
    calls = _illegal_calls(log)
    named = set(re.findall(r"``(\w+\(\))``", row)) | ({"transactional"} if "transactional" in row else set())
    assert named == set(calls), named ^ set(calls)
    for name, call in calls.items():
        with pytest.raises(errors.IllegalStateError):
            call()
            pytest.fail(f"{name} did not raise")
    assert "poll" not in row
    assert log.consumer().poll(timeout_ms=0) == {}  # nothing assigned: nothing returned, no error


def test_a_bad_timestamp_to_offsets_for_times_is_the_documented_error(log: pylog.Log) -> None:
    log.create_topic("t")
    assert "offsets_for_times" in _row("errors.md", "InvalidTimestampError")
    assert "offsets_for_times" not in _row("errors.md", "InvalidOffsetError")
    for bad in (-1, 2**63, 1.5, "0"):
        with pytest.raises(errors.InvalidTimestampError):
            log.consumer().offsets_for_times({TopicPartition("t", 0): bad})  # type: ignore[dict-item]


def test_unknown_settings_are_the_config_error_kafka_python_md_names(log: pylog.Log) -> None:
    with open(os.path.join(DOCS, "kafka-python.md")) as f:
        units = re.split(r"\n(?=\* |\| )", f.read())  # table rows and bullets
    about_settings = [u for u in units if "misspelt" in u or "unknown config names" in u]
    assert about_settings and not any("TypeError" in p for p in about_settings)
    log.create_topic("t")
    for make in (lambda: log.consumer("t", bogus=1), lambda: log.producer(bogus=1)):
        with pytest.raises(errors.ConfigError) as info:
            make()
        assert isinstance(info.value, ValueError) and not isinstance(info.value, TypeError)


@pytest.mark.parametrize("page", ["concepts.md", "kafka-python.md"])
def test_the_pages_say_how_keyless_records_are_spread(page: str) -> None:
    """Both pages name the run length the partitioner uses and where each run goes."""
    from pylog.partitioner import KEYLESS_RUN_BYTES

    with open(os.path.join(DOCS, page)) as f:
        text = " ".join(f.read().split())
    assert "Keyless records" in text or "without a key" in text
    assert f"{KEYLESS_RUN_BYTES // 1024} KiB" in text and "least loaded partition" in text
