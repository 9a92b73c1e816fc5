"""A stream thread whose transaction outlived ``transaction_timeout_ms`` (a record slower than the timeout, a
stalled machine) is fenced: a reader aborted the transaction and its producer's epoch is old. The thread must
drop its state, take a new producer and redo the work from the committed offsets, exactly once, instead of
dying at its next transaction."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

from streams_helpers import committed_records, wait_for

import pylog
from pylog.streams import App
from pylog.streams.admin import read_store

INPUT = 60
SLOW = 22  # mid-batch (5 records a batch): the open transaction already holds outputs


def test_a_transaction_that_timed_out_is_redone_not_fatal(tmp_path: Path) -> None:
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("in", partitions=1)
        log.create_topic("out", partitions=1)
        producer = log.producer()
        for i in range(INPUT):
            producer.send("in", i, key=f"k{i % 3}")
        producer.close()
        slowed = threading.Event()

        def slow(v: int) -> int:
            if v == SLOW and not slowed.is_set():
                slowed.set()
                end = time.monotonic() + 1.0  # over three times the transaction's timeout
                while time.monotonic() < end:
                    committed_records(log, "out")  # a read_committed reader aborts an expired transaction
                    time.sleep(0.05)
            return v

        app = App(log, "ttl", transaction_timeout_ms=300, commit_interval_ms=50, max_poll_records=5)
        events = app.stream("in")
        events.map_values(slow).to("out")
        events.group_by_key().count(name="counts")
        with app:
            app.start()
            wait_for(
                lambda: app.state == "ERROR" or sum(app.lag().values()) == 0, "the input to be processed"
            )
        assert app.error is None, f"the application failed: {app.error!r}"
        out = Counter(r.value for r in committed_records(log, "out"))
        store = read_store(log, "ttl", "counts")
        written = log.topic("out").end_offsets()[0]
    assert slowed.is_set()
    assert out == Counter(range(INPUT)), "every input once in the output"
    assert store == dict(Counter(f"k{i % 3}" for i in range(INPUT)))
    assert written > INPUT, "the timed-out transaction's outputs were written, then aborted"
