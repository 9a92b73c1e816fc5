"""The processor API: custom processors with stores, and punctuators on stream time and on the injected clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from streams_helpers import committed_records, wait_for

import pylog
from pylog.errors import ConfigError
from pylog.streams import App, TestDriver
from pylog.streams.processor import Processor, ProcessorContext


class Batcher(Processor):
    """Counts per key; every second of stream time forwards the counts and clears them; every 5 s of wall
    clock forwards a heartbeat."""

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.counts = context.store("pending")
        self.ticks: list[int] = []
        context.schedule(1000, self.flush, kind="stream_time")
        context.schedule(5000, self.heartbeat, kind="wall_clock")

    def process(self, key: Any, value: Any, timestamp: int) -> None:
        self.counts.put(key, self.counts.get(key, 0) + 1)

    def flush(self, stream_time: int) -> None:
        for key, n in sorted(self.counts.items()):
            self.context.forward(key, ["count", n, stream_time])
            self.counts.delete(key)

    def heartbeat(self, now: int) -> None:
        self.context.forward("heartbeat", ["tick", now, self.context.stream_time])


def _app(log: pylog.Log | None) -> App:
    app = App(log, "batcher")
    app.stream("events").process(Batcher, stores=["pending"]).to("batches")
    return app


def test_punctuators_in_the_driver() -> None:
    driver = TestDriver(_app(None))
    for key, ts in [("a", 0), ("b", 500), ("a", 999), ("a", 1000), ("b", 2500), ("a", 1200)]:
        driver.pipe("events", None if key == "x" else 1, key=key, timestamp_ms=ts)
    # stream time: the first record sets the first due time (0 + 1000); reached at 1000, next due 2000;
    # 2500 jumps past it: one call, next due 3500; 1200 does not move the stream time
    assert driver.read_key_values("batches") == [
        ("a", ["count", 3, 1000]),
        ("b", ["count", 1, 1000]),
        ("b", ["count", 1, 2500]),
    ]
    assert driver.store("pending").to_dict() == {"a": 1}
    driver.advance_wall_clock(4999)
    assert driver.read_output("batches") == []
    driver.advance_wall_clock(1)
    driver.advance_wall_clock(20_000)  # several intervals at once: one call
    assert driver.read_output("batches") == [
        ("heartbeat", ["tick", 5000, 2500], 5000),
        ("heartbeat", ["tick", 25_000, 2500], 25_000),
    ]
    changelog = driver.read_key_values("batcher-pending-changelog")
    assert changelog[-1] == ("a", 1)


def test_schedule_arguments_are_checked() -> None:
    class Bad(Processor):
        def init(self, context: ProcessorContext) -> None:
            context.schedule(0, print)

    app = App(None, "bad")
    app.stream("in").process(Bad)
    with pytest.raises(ConfigError, match="interval_ms"):
        TestDriver(app)


def test_punctuators_in_the_runtime(tmp_path: Path) -> None:
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("events", partitions=2)
        log.create_topic("batches", partitions=2)
        producer = log.producer()
        for i in range(40):
            producer.send("events", i, key=f"k{i % 4}", timestamp_ms=1_700_000_000_000 + i * 100)
        producer.close()
        app = _app(log)
        app.start()
        wait_for(lambda: sum(app.lag().values()) == 0 and bool(log.group_offsets("batcher")), "the input")
        app.close()
        counts = [r.value for r in committed_records(log, "batches") if r.value[0] == "count"]
        # every record counted once, in some flush, or still pending in the store's changelog
        pending = log.topic("batcher-pending-changelog").table(isolation_level="read_committed")
        assert sum(n for _, n, _ in counts) + sum(pending.values()) == 40
