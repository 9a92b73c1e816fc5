"""The runtime in one process: stream threads in a group, exactly-once commits, restore from changelogs."""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from pathlib import Path

import pytest
from streams_helpers import committed_records, wait_for

import pylog
import pylog.streams
from pylog.streams import App
from pylog.streams.admin import read_store
from pylog.streams.serde import MSGPACK
from pylog.streams.stores import decode_key

N = 600


def _define(app: App) -> None:
    clicks = app.stream("clicks")
    clicks.map_values(lambda v: v["i"]).to("echo")
    clicks.group_by(lambda k, v: v["page"]).count(name="per-page").to_stream().to("page-counts")


def _fill(log: pylog.Log, start: int, stop: int) -> None:
    producer = log.producer()
    for i in range(start, stop):
        producer.send("clicks", {"i": i, "page": f"/p{i % 7}"}, key=f"u{i % 11}")
    producer.close()


def _pages(stop: int) -> Counter[str]:
    return Counter(f"/p{i % 7}" for i in range(stop))


def _check(log: pylog.Log, stop: int) -> None:
    echo = Counter(r.value for r in committed_records(log, "echo"))
    assert echo == Counter(range(stop)), "each input exactly once in echo"
    per_page: dict[str, list[int]] = {}
    for r in committed_records(log, "page-counts"):
        per_page.setdefault(r.key.decode(), []).append(r.value)
    assert {p: counts for p, counts in per_page.items()} == {
        p: list(range(1, n + 1)) for p, n in _pages(stop).items()
    }, "every count once, in order"
    table = log.topic("streams-per-page-changelog").table(
        isolation_level="read_committed", key_deserializer=decode_key
    )
    assert table == dict(_pages(stop))


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_two_threads_then_a_restart_restores_state(tmp_path: Path, guarantee: str) -> None:
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("clicks", partitions=4)
        log.create_topic("echo", partitions=2)
        log.create_topic("page-counts", partitions=2)
        _fill(log, 0, N)
        app = App(log, "streams", processing_guarantee=guarantee, commit_interval_ms=20)
        _define(app)
        assert app.topology().internal_topics() == {
            "streams-per-page-repartition": (4, {}),
            "streams-per-page-changelog": (4, {"cleanup_policy": "compact"}),
        }
        app.start(threads=2)
        wait_for(lambda: len(committed_records(log, "page-counts")) == N, "the first run's counts")
        app.close()
        assert app.state == "NOT_RUNNING"
        assert log.topic("streams-per-page-changelog").config.cleanup_policy == "compact"
        _check(log, N)
        assert sum(len(s) for s in app.store("per-page")) == 0  # closed: no task runs here any more

        _fill(log, N, 2 * N)  # a new instance continues from the committed offsets and the changelog
        again = App(log, "streams", processing_guarantee=guarantee, commit_interval_ms=20)
        _define(again)
        again.start(threads=1)
        wait_for(lambda: len(committed_records(log, "page-counts")) == 2 * N, "the second run's counts")
        stores = {k: v for s in again.store("per-page") for k, v in s.items()}
        metrics = again.metrics()
        again.close()
        _check(log, 2 * N)
        assert stores == dict(_pages(2 * N))
        assert metrics["tasks-restored"] >= 4 and metrics["restored-records"] >= 7
        assert metrics["processed-records"] == 2 * N  # N new inputs and N repartitioned records


def test_at_least_once_fsyncs_what_it_wrote_before_it_commits_offsets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At-least-once writes with acks=1 and fsyncs at each commit: when the group's offsets are committed,
    every partition the thread wrote (outputs, repartition, changelog) is durable to its end, so a power loss
    cannot take back an output whose input the committed offset has passed."""
    written = ["echo", "page-counts", "alos-per-page-repartition", "alos-per-page-changelog"]
    behind: list[str] = []
    commits = 0
    original = pylog.Consumer.commit

    def checked_commit(self: pylog.Consumer, *args: object, **kwargs: object) -> None:
        nonlocal commits
        if self.config.group_id == "alos":
            commits += 1
            for name in written:
                topic = log.topic(name)
                for p in range(topic.num_partitions):
                    plog = topic.partition(p)
                    if plog.recovery_point < plog.log_end_offset:
                        behind.append(f"{name}-{p}: {plog.recovery_point} < {plog.log_end_offset}")
        original(self, *args, **kwargs)

    monkeypatch.setattr(pylog.Consumer, "commit", checked_commit)
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("clicks", partitions=4)
        log.create_topic("echo", partitions=2)
        log.create_topic("page-counts", partitions=2)
        _fill(log, 0, N)
        app = App(log, "alos", processing_guarantee="at_least_once", commit_interval_ms=20)
        _define(app)
        app.start(threads=1)  # one thread: no other writer between its flush and its commit
        wait_for(lambda: len(committed_records(log, "page-counts")) == N, "the counts")
        app.close()
    assert commits > 0 and behind == []


def test_a_failing_operation_stops_the_app_and_commits_nothing_of_it(tmp_path: Path) -> None:
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("clicks", partitions=1)
        log.create_topic("echo", partitions=1)
        _fill(log, 0, 50)

        def boom(v: dict[str, int]) -> int:
            if v["i"] == 30:
                raise ValueError("poison")
            return v["i"]

        app = App(log, "failing", commit_interval_ms=10_000)  # one transaction would hold all 50
        app.stream("clicks").map_values(boom).to("echo")
        with pytest.raises(ValueError, match="poison"):
            app.run()
        assert app.state == "ERROR"
        assert committed_records(log, "echo") == []  # aborted: nothing of the transaction is visible
        assert log.group_offsets("failing") == {}


def test_internal_topic_with_another_partition_count_is_refused(tmp_path: Path) -> None:
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("clicks", partitions=2)
        log.create_topic("echo")
        log.create_topic("page-counts")
        log.create_topic("streams-per-page-repartition", partitions=3)
        app = App(log, "streams")
        _define(app)
        with pytest.raises(pylog.errors.ConfigError, match="has 3 partitions"):
            app.start()
        assert app.state == "CREATED"


def test_stream_table_join_in_the_runtime(tmp_path: Path) -> None:
    with pylog.open(tmp_path / "log") as log:
        for name in ("users", "orders", "enriched"):
            log.create_topic(name, partitions=3)
        producer = log.producer()
        for u in range(20):
            producer.send("users", {"name": f"user-{u}"}, key=f"u{u}")
        producer.flush()
        app = App(log, "join", commit_interval_ms=20)
        users = app.table("users", name="users")
        app.stream("orders").left_join(users, lambda o, u: [o["i"], u and u["name"]]).to("enriched")
        app.start(threads=2)
        wait_for(lambda: sum(app.lag().values()) == 0 and bool(log.group_offsets("join")), "the table")
        for i in range(100):
            producer.send("orders", {"i": i}, key=f"u{i % 25}")
        producer.close()
        wait_for(lambda: len(committed_records(log, "enriched")) == 100, "the joined orders")
        app.close()
        got = sorted(r.value for r in committed_records(log, "enriched"))
        assert got == [[i, f"user-{i % 25}" if i % 25 < 20 else None] for i in range(100)]


def test_join_inputs_must_be_co_partitioned(tmp_path: Path) -> None:
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("users", partitions=2)
        log.create_topic("orders", partitions=3)
        app = App(log, "join")
        app.stream("orders").join(app.table("users"), lambda o, u: o)
        with pytest.raises(pylog.errors.ConfigError, match="co-partitioned"):
            app.topology()


def test_sqlite_state_dir_restarts_from_its_checkpoint(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("clicks", partitions=4)
        log.create_topic("echo", partitions=2)
        log.create_topic("page-counts", partitions=2)
        _fill(log, 0, N)
        app = App(log, "streams", commit_interval_ms=20, state_dir=state)
        _define(app)
        app.start(threads=2)
        wait_for(lambda: len(committed_records(log, "page-counts")) == N, "the first run's counts")
        app.close()
        _check(log, N)
        files = sorted(p.relative_to(state).as_posix() for p in state.rglob("*.sqlite"))
        assert files == [f"streams/1_{p}/per-page.sqlite" for p in range(4)]

        _fill(log, N, 2 * N)
        again = App(log, "streams", commit_interval_ms=20, state_dir=state)
        _define(again)
        again.start(threads=1)
        wait_for(lambda: len(committed_records(log, "page-counts")) == 2 * N, "the second run's counts")
        stores = {k: v for s in again.store("per-page") for k, v in s.items()}
        metrics = again.metrics()
        again.close()
        _check(log, 2 * N)
        assert stores == dict(_pages(2 * N))
        assert metrics["restored-records"] == 0  # the files were at the changelog's end: nothing to read


BASE_MS = int(time.time()) * 1000  # event times near now (not past any retention), windows aligned to it


def _fill_timed(log: pylog.Log, start: int, stop: int) -> None:
    producer = log.producer()
    for i in range(start, stop):
        producer.send(
            "clicks", {"i": i, "page": f"/p{i % 7}"}, key=f"u{i % 11}", timestamp_ms=BASE_MS + i * 10
        )
    producer.close()


def _define_windowed(app: App) -> None:
    clicks = app.stream("clicks")
    clicks.group_by(lambda k, v: v["page"]).windowed_by(pylog.streams.TumblingWindows(500, 100)).count(
        name="per-window"
    ).to_stream().to("window-counts")
    clicks.group_by(lambda k, v: v["page"]).windowed_by(
        pylog.streams.SessionWindows(100)  # a page's records are 70 ms apart: one session per page
    ).count(name="per-session")


def _windows(stop: int) -> dict[tuple[str, int], int]:
    """Every window of 500 ms of the records ``0 .. stop - 1`` (page, start), with its count."""
    return dict(Counter((f"/p{i % 7}", BASE_MS + i * 10 // 500 * 500) for i in range(stop)))


def _file_windows(state: Path) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for file in sorted(state.rglob("per-window.sqlite")):
        with sqlite3.connect(file) as db:
            rows = db.execute("SELECT k, start, v FROM win").fetchall()
        db.close()
        for k, start, v in rows:
            out[(decode_key(k), start)] = MSGPACK.decode(v)[0]
    return out


def test_window_store_in_sqlite_survives_a_restart_and_a_restore(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("clicks", partitions=1)  # event times in order: no record is late
        log.create_topic("window-counts", partitions=2)
        _fill_timed(log, 0, N)
        app = App(log, "streams", commit_interval_ms=20, state_dir=state)
        _define_windowed(app)
        app.start(threads=2)
        wait_for(lambda: len(committed_records(log, "window-counts")) == N, "the first run's counts")
        wait_for(lambda: sum(app.lag().values()) == 0, "the first run's commits")
        app.close()
        files = sorted(p.relative_to(state).as_posix() for p in state.rglob("*.sqlite"))
        assert files == ["streams/1_0/per-window.sqlite", "streams/2_0/per-session.sqlite"]
        every = _windows(N)
        in_files = _file_windows(state)
        committed = read_store(log, "streams", "per-window")
        assert {k: v[0] for k, v in committed.items()} == in_files  # the files hold the committed state
        assert in_files and all(every[w] == n for w, n in in_files.items())
        # retention: the windows closed by the stream time (end + grace passed) left the files
        assert {w for w in every if w[1] + 600 > BASE_MS + (N - 1) * 10} == set(in_files)
        assert len(in_files) < len(every)

        _fill_timed(log, N, 2 * N)
        again = App(log, "streams", commit_interval_ms=20, state_dir=state)
        _define_windowed(again)
        again.start(threads=1)
        wait_for(lambda: len(committed_records(log, "window-counts")) == 2 * N, "the second run's counts")
        wait_for(lambda: sum(again.lag().values()) == 0, "the second run's commits")
        metrics = again.metrics()
        queried = {
            w: again.query("per-window", w) for w in _file_windows(state)
        }  # interactive queries read the files
        again.close()
        assert metrics["restored-records"] == 0  # the files were at the changelogs' end: nothing to read
        every = _windows(2 * N)
        latest: dict[tuple[str, int], int] = {}
        for r in committed_records(log, "window-counts"):
            window = decode_key(r.key)
            latest[(window[0], window[1])] = r.value
        assert latest == every, "each window's last update is its count over both runs"
        in_files = _file_windows(state)
        assert set(in_files) == {w for w in every if w[1] + 600 > BASE_MS + (2 * N - 1) * 10}
        assert queried == in_files and all(every[w] == n for w, n in in_files.items())

        fresh = tmp_path / "fresh"  # another instance with no files: restored from the changelogs
        third = App(log, "streams", commit_interval_ms=20, state_dir=fresh)
        _define_windowed(third)
        third.start(threads=1)
        wait_for(lambda: len(third.tasks()) == 3, "the tasks")
        wait_for(lambda: third.metrics().get("restored-records", 0) > 0, "the restore")
        third.close()
        assert _file_windows(fresh) == in_files
        for where in (state, fresh):  # the sessions' files hold the committed sessions
            [file] = where.rglob("per-session.sqlite")
            with sqlite3.connect(file) as db:
                rows = db.execute("SELECT k, start, send, v FROM sess").fetchall()
            db.close()
            sessions = {(decode_key(k), s): [MSGPACK.decode(v)[0], e] for k, s, e, v in rows}
            assert sessions == read_store(log, "streams", "per-session")
            assert sessions == {
                (f"/p{p}", BASE_MS + p * 10): [
                    len(range(p, 2 * N, 7)),
                    BASE_MS + max(range(p, 2 * N, 7)) * 10,
                ]
                for p in range(7)
            }


def test_interactive_queries(tmp_path: Path) -> None:
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("clicks", partitions=4)
        log.create_topic("echo", partitions=2)
        log.create_topic("page-counts", partitions=2)
        _fill(log, 0, N)
        app = App(log, "streams", commit_interval_ms=20)
        _define(app)
        app.stream("echo", key_serde=pylog.streams.BYTES).group_by_key().windowed_by(
            pylog.streams.TumblingWindows(3_600_000)
        ).count(name="windowed")
        app.start(threads=2)
        wait_for(lambda: len(committed_records(log, "page-counts")) == N, "the counts")
        wait_for(lambda: sum(app.lag().values()) == 0, "the windowed counts")
        pages = _pages(N)
        assert {p: app.query("per-page", p) for p in pages} == dict(pages)
        per_task = app.task_metrics()
        assert (
            sorted(per_task)
            == sorted(app.tasks())
            == [*(f"{s}_{p}" for s in (0, 1) for p in range(4)), "2_0", "2_1"]
        )
        assert sum(m.get("store:per-page", 0) for m in per_task.values()) == len(pages)
        assert app.query("per-page", "/nowhere", -1) == -1
        committed = read_store(log, "streams", "per-page")  # what any process reads from the log directory
        app.close()
        assert committed == dict(pages)
        windowed = read_store(log, "streams", "windowed")
        assert sum(v[0] for v in windowed.values()) == N and all(len(k) == 2 for k in windowed)


def test_undecodable_records_go_to_the_dead_letter_topic_exactly_once(tmp_path: Path) -> None:
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("clicks", partitions=2)
        log.create_topic("echo", partitions=2)
        producer = log.producer(value_serializer=None)
        for i in range(40):
            producer.send("clicks", b"\xc1" if i % 10 == 3 else pylog.streams.MSGPACK.encode(i), key=f"u{i}")
        producer.close()
        app = App(log, "dlq-app", on_deserialization_error="dead_letter", dead_letter_topic="clicks-dlq")
        app.stream("clicks").to("echo")
        app.start()
        wait_for(lambda: sum(app.lag().values()) == 0 and bool(log.group_offsets("dlq-app")), "the input")
        metrics = app.metrics()
        app.close()
        assert sorted(r.value for r in committed_records(log, "echo")) == [
            i for i in range(40) if i % 10 != 3
        ]
        letters = committed_records(log, "clicks-dlq", value_deserializer=None)
        assert sorted(r.key for r in letters) == [b"u13", b"u23", b"u3", b"u33"]
        assert {r.value for r in letters} == {b"\xc1"}
        headers = dict(letters[0].headers)
        assert headers["pylog.dlq.topic"] == b"clicks" and headers["pylog.dlq.stage"] == b"deserialization"
        assert metrics["dead-lettered-records"] == 4


@pytest.mark.parametrize("stores", ["memory", "sqlite"])
def test_stream_stream_join_in_the_runtime(tmp_path: Path, stores: str) -> None:
    state_dir = tmp_path / "state" if stores == "sqlite" else None
    with pylog.open(tmp_path / "log") as log:
        for name in ("views", "clicks", "joined"):
            log.create_topic(name, partitions=2)
        producer = log.producer()
        t0 = 1_700_000_000_000
        for i in range(60):  # a view at t, its click 5 s later; view 7 has no click
            producer.send("views", i, key=f"ad{i % 6}", timestamp_ms=t0 + i * 60_000)
            if i != 7:
                producer.send("clicks", i, key=f"ad{i % 6}", timestamp_ms=t0 + i * 60_000 + 5_000)
        producer.close()

        def define() -> App:
            app = App(log, "ctr", commit_interval_ms=20, state_dir=state_dir)
            app.stream("views").join(
                app.stream("clicks"),
                lambda view, click: [view, click],
                pylog.streams.JoinWindows(10_000, 3_600_000),
            ).to("joined")
            return app

        app = define()
        app.start(threads=2)
        wait_for(lambda: len(committed_records(log, "joined")) >= 59, "the joined records")
        wait_for(lambda: sum(app.lag().values()) == 0, "the first run's commits")
        app.close()
        assert sorted(r.value for r in committed_records(log, "joined")) == [
            [i, i] for i in range(60) if i != 7
        ]
        again = define()  # view 7's click comes late: the buffer of the first run joins it
        again.start(threads=1)
        with log.producer() as producer:
            producer.send("clicks", 7, key="ad1", timestamp_ms=t0 + 7 * 60_000 + 5_000)
        wait_for(lambda: len(committed_records(log, "joined")) >= 60, "the late click's join")
        restored = again.metrics().get("restored-records", 0)
        again.close()
        assert sorted(r.value for r in committed_records(log, "joined")) == [[i, i] for i in range(60)]
        if state_dir is None:
            assert restored > 0  # the buffers read back from their changelogs
        else:  # the buffers' files were at their changelogs' end
            assert restored == 0
            assert sorted(p.name for p in state_dir.rglob("*.sqlite")) == [
                "join-0003-left.sqlite",
                "join-0003-left.sqlite",
                "join-0003-right.sqlite",
                "join-0003-right.sqlite",
            ]
        assert sorted(t for t in log.topics() if t.startswith("ctr-")) == [
            "ctr-join-0003-left-changelog",
            "ctr-join-0003-right-changelog",
        ]


def test_global_table_in_the_runtime(tmp_path: Path) -> None:
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("products", partitions=3)  # not co-partitioned with the orders: no need
        log.create_topic("orders", partitions=2)
        log.create_topic("named", partitions=2)
        producer = log.producer()
        for p in range(30):
            producer.send("products", {"name": f"product-{p}"}, key=f"p{p}")
        producer.flush()
        app = App(log, "global", commit_interval_ms=20)
        products = app.global_table("products")
        app.stream("orders").join_global(
            products, lambda c, o: o["product"], lambda o, p: [o["i"], p["name"]]
        ).to("named")
        app.start(threads=2)  # the global table is read to its end before the threads start
        for i in range(50):
            producer.send("orders", {"i": i, "product": f"p{i % 30}"}, key=f"c{i % 7}")
        producer.close()
        wait_for(lambda: len(committed_records(log, "named")) == 50, "the joined orders")
        assert app.query("products-global", "p3") == {"name": "product-3"}
        app.close()
        assert sorted(r.value for r in committed_records(log, "named")) == [
            [i, f"product-{i % 30}"] for i in range(50)
        ]


@pytest.mark.parametrize("stores", ["memory", "sqlite"])
def test_sliding_windows_in_the_runtime_across_a_restart_equal_the_test_driver(
    tmp_path: Path, stores: str
) -> None:
    """A sliding-window count (1 s, grace 2 s) run in two halves with a restart between them writes what the
    test driver writes for all the records in one go (one partition: the same order); with SQLite stores the
    second run opens the store's file at its changelog's end and restores nothing."""
    state_dir = tmp_path / "state" if stores == "sqlite" else None
    records = [(f"u{i % 5}", i, 1_700_000_000_000 + i * 97 + (i * 7919) % 400) for i in range(400)]

    def define(app: App) -> None:
        sliding = app.stream("clicks").group_by_key().windowed_by(pylog.streams.SlidingWindows(1_000, 2_000))
        sliding.count(name="recent").to_stream().to("recent-counts")

    model = App(None, "sliding")
    define(model)
    driver = pylog.streams.TestDriver(model)
    for key, value, ts in records:
        driver.pipe("clicks", value, key=key, timestamp_ms=ts)
    expected = [(tuple(r.key), r.value) for r in driver.read_output("recent-counts")]
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("clicks", partitions=1)
        log.create_topic("recent-counts", partitions=1)
        restored = []
        for half in (records[:250], records[250:]):
            app = App(log, "sliding", commit_interval_ms=20, state_dir=state_dir)
            define(app)
            app.start(threads=1)
            with log.producer() as producer:
                for key, value, ts in half:
                    producer.send("clicks", value, key=key, timestamp_ms=ts)
            wait_for(
                lambda a=app: sum(a.lag().values()) == 0 and bool(log.group_offsets("sliding")), "the app"
            )
            restored.append(app.metrics().get("restored-records", 0))
            app.close()
        got = [(tuple(decode_key(r.key)), r.value) for r in committed_records(log, "recent-counts")]
    assert got == expected and len(expected) > 400
    assert restored[1] == 0 if state_dir is not None else restored[1] > 0
