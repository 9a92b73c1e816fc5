"""A join after a key change goes through a repartition topic whose keys are encoded as the other side's
topic was partitioned, so that each record reaches the task holding that key's rows (several partitions)."""

from __future__ import annotations

from pathlib import Path

from streams_helpers import committed_records, wait_for

import pylog
from pylog.streams import App, JoinWindows


def _run(log: pylog.Log, app: App, expected: int) -> list[object]:
    app.start(threads=2)
    try:
        wait_for(lambda: len(committed_records(log, "out")) >= expected, "the joined records")
        wait_for(lambda: sum(app.lag().values()) == 0, "the lag")
    finally:
        app.close()
    return sorted(r.value for r in committed_records(log, "out"))


def _rekeyed_join(log: pylog.Log) -> App:
    app = App(log, "rekey", commit_interval_ms=20)
    users = app.table("users", name="users")
    app.stream("orders").select_key(lambda k, v: v["user"]).join(users, lambda o, u: [o["i"], u]).to("out")
    return app


def test_a_rekeyed_stream_joins_a_table_on_every_partition(tmp_path: Path) -> None:
    with pylog.open(tmp_path / "log") as log:
        for topic in ("users", "orders", "out"):
            log.create_topic(topic, partitions=3)
        producer = log.producer()
        for u in range(20):
            producer.send("users", f"name{u}", key=f"u{u}")
        producer.flush()
        app = _rekeyed_join(log)  # first the table, whole
        app.start(threads=1)
        wait_for(lambda: sum(app.lag().values()) == 0 and bool(log.group_offsets("rekey")), "the table")
        app.close()
        for i in range(60):
            producer.send("orders", {"user": f"u{i % 20}", "i": i}, key=f"o{i}")
        producer.close()
        got = _run(log, _rekeyed_join(log), 60)
        assert got == [[i, f"name{i % 20}"] for i in range(60)]


def test_a_rekeyed_stream_joins_a_stream_on_every_partition(tmp_path: Path) -> None:
    with pylog.open(tmp_path / "log") as log:
        for topic in ("views", "clicks", "out"):
            log.create_topic(topic, partitions=3)
        producer = log.producer()
        for i in range(30):
            producer.send("views", f"view{i}", key=f"ad{i}", timestamp_ms=1000)
            producer.send("clicks", {"ad": f"ad{i}", "i": i}, key=f"click{i}", timestamp_ms=1000)
        producer.close()
        app = App(log, "rekey2", commit_interval_ms=20)
        clicks = app.stream("clicks").select_key(lambda k, v: v["ad"])
        app.stream("views").join(clicks, lambda view, click: [click["i"], view], JoinWindows(60_000)).to(
            "out"
        )
        got = _run(log, app, 30)
        assert got == [[i, f"view{i}"] for i in range(30)]
