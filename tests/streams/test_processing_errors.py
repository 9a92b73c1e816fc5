"""The processing exception handler (Kafka Streams' KIP-1033): an input record whose processing raises stops the
application by default with nothing of its transaction visible; ``log_and_continue`` skips it and counts it;
``DeadLetterHandler`` writes it to a dead-letter topic in the transaction that commits its offset, exactly once
even when the process dies at the commit point."""

from __future__ import annotations

import os
import signal
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
from streams_helpers import committed_records, wait_for

import pylog
from pylog.errors import ConfigError, DeserializationError, ProducerFencedError
from pylog.idempotent import IdempotentProducer
from pylog.streams import (
    App,
    DeadLetterHandler,
    ErrorContext,
    ProcessingResponse,
    TestDriver,
    log_and_continue,
)

INPUT = 1000


def _poison(i: int) -> bool:
    return i % 97 == 13


def _double(v: dict[str, int]) -> int:
    if _poison(v["i"]):
        raise ValueError(f"record {v['i']} is poison")
    return 2 * v["i"]


def _topology(app: App, delay: float = 0.0) -> None:
    """Doubles each input's ``i`` (poison ones raise) and counts the outputs per key (``k0``..``k6``),
    ``delay`` seconds per record."""
    source = app.stream("in")
    if delay:
        source = source.peek(lambda k, v: time.sleep(delay))
    doubled = source.map_values(_double)
    doubled.to("out")
    doubled.group_by_key().count(name="counts")


def _model(n: int) -> tuple[set[int], dict[str, int]]:
    good = [i for i in range(n) if not _poison(i)]
    counts: dict[str, int] = {}
    for i in good:
        counts[f"k{i % 7}"] = counts.get(f"k{i % 7}", 0) + 1
    return {2 * i for i in good}, counts


# -- the test driver ----------------------------------------------------------------------------------


def _drive(app: App, n: int = 200) -> TestDriver:
    _topology(app)
    driver = TestDriver(app)
    for i in range(n):
        driver.pipe("in", {"i": i}, key=f"k{i % 7}")
    return driver


def test_the_default_stops_at_the_first_failing_record() -> None:
    app = App(None, "errors")
    _topology(app)
    driver = TestDriver(app)
    for i in range(13):
        driver.pipe("in", {"i": i}, key=f"k{i % 7}")
    with pytest.raises(ValueError, match="record 13 is poison") as raised:
        driver.pipe("in", {"i": 13}, key="k6")
    assert any("while processing in-" in note for note in raised.value.__notes__)
    assert driver.metrics().get("skipped-records", 0) == 0


def test_log_and_continue_skips_and_counts() -> None:
    driver = _drive(App(None, "errors", processing_exception_handler=log_and_continue))
    doubled, counts = _model(200)
    assert set(driver.read_values("out")) == doubled
    assert driver.store("counts").to_dict() == counts
    assert driver.metrics()["skipped-records"] == 200 - len(doubled) == 2


def test_dead_letter_handler_writes_the_input_bytes() -> None:
    driver = _drive(App(None, "errors", processing_exception_handler=DeadLetterHandler("errors-dlq")))
    doubled, _ = _model(200)
    assert set(driver.read_values("out")) == doubled
    dead = driver.read_output("errors-dlq")
    assert [(r.key, pylog.streams.MSGPACK.deserialize(r.value)) for r in dead] == [
        (b"k6", {"i": 13}),
        (b"k5", {"i": 110}),
    ]
    assert driver.metrics()["dead-lettered-records"] == 2
    assert "skipped-records" not in driver.metrics()


def test_a_handler_sees_the_record_and_chooses() -> None:
    seen: list[tuple[str, int, bytes | None, str, str]] = []

    def handler(context: ErrorContext, exc: Exception) -> ProcessingResponse:
        seen.append((context.topic, context.timestamp_ms, context.key, context.task_id, str(exc)))
        return ProcessingResponse.CONTINUE if len(seen) == 1 else ProcessingResponse.FAIL

    app = App(None, "errors", processing_exception_handler=handler)
    _topology(app)
    driver = TestDriver(app)
    driver.pipe("in", {"i": 13}, key="a", timestamp_ms=5)
    with pytest.raises(ValueError, match="record 110"):
        driver.pipe("in", {"i": 110}, key="b", timestamp_ms=6)
    assert seen == [
        ("in", 5, b"a", "0_0", "record 13 is poison"),
        ("in", 6, b"b", "0_0", "record 110 is poison"),
    ]


def test_a_handler_answer_that_is_not_a_response_is_a_config_error() -> None:
    app = App(None, "errors", processing_exception_handler=lambda context, exc: True)  # type: ignore[arg-type,return-value]
    _topology(app)
    driver = TestDriver(app)
    with pytest.raises(ConfigError, match="not a ProcessingResponse") as raised:
        driver.pipe("in", {"i": 13}, key="a")
    assert isinstance(raised.value.__cause__, ValueError)
    with pytest.raises(ConfigError, match="processing_exception_handler"):
        App(None, "errors", processing_exception_handler="continue")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="DeadLetterHandler"):
        DeadLetterHandler("")


def test_errors_that_are_not_the_records_fault_are_never_handled() -> None:
    """An undecodable record under on_deserialization_error="raise", and a failure to write, stop the
    application even with a handler that continues."""
    app = App(None, "errors", processing_exception_handler=log_and_continue)
    _topology(app)
    driver = TestDriver(app)
    with pytest.raises(DeserializationError):
        driver.pipe_raw("in", b"\xc1", key=b"a")  # 0xc1: never valid msgpack

    def fenced(*args: Any, **kwargs: Any) -> None:
        raise ProducerFencedError("fenced")

    driver.send = fenced  # type: ignore[method-assign]
    with pytest.raises(ProducerFencedError):
        driver.pipe("in", {"i": 1}, key="a")
    assert "skipped-records" not in driver.metrics()


# -- a running application ----------------------------------------------------------------------------


def _log(tmp_path: Path) -> str:
    path = str(tmp_path / "log")
    with pylog.open(path) as log:
        log.create_topic("in", partitions=2)
        log.create_topic("out", partitions=2)
        producer = log.producer()
        for i in range(INPUT):
            producer.send("in", {"i": i}, key=f"k{i % 7}")
        producer.close()
    return path


def test_a_running_application_stops_with_nothing_of_the_failing_transaction_visible(tmp_path: Path) -> None:
    path = _log(tmp_path)
    with pylog.open(path) as log:
        app = App(log, "errors", commit_interval_ms=10, max_poll_records=5)
        _topology(app)
        app.start()
        wait_for(lambda: app.state == "ERROR", "the application to fail")
        app.close()
        assert isinstance(app.error, ValueError) and "poison" in str(app.error)
        out = [r.value // 2 for r in committed_records(log, "out")]
        committed = {tp.partition: om.offset for tp, om in log.group_offsets("errors").items()}
        inputs = {}
        for r in committed_records(log, "in"):
            inputs[r.value["i"]] = (r.partition, r.offset)
    # exactly the records below the committed offsets are out, and no poison pill is below them
    below = {i for i, (p, offset) in inputs.items() if offset < committed.get(p, 0)}
    assert sorted(out) == sorted(below)
    assert not any(_poison(i) for i in below)


def test_a_running_application_continues_past_the_failing_records(tmp_path: Path) -> None:
    path = _log(tmp_path)
    with pylog.open(path) as log:
        app = App(log, "errors", commit_interval_ms=10, processing_exception_handler=log_and_continue)
        _topology(app)
        with app:
            app.start()
            wait_for(
                lambda: sum(app.lag().values()) == 0 or app.state == "ERROR", "the input to be processed"
            )
            metrics = app.metrics()
        assert app.error is None
        doubled, _ = _model(INPUT)
        out = [r.value for r in committed_records(log, "out")]
    assert sorted(out) == sorted(doubled)
    assert metrics["skipped-records"] == INPUT - len(doubled)


def _dead_letter_process(path: str, crash_at: int) -> None:
    """Runs in a forked child until SIGTERM; with ``crash_at=n``, dies (exit 17) in the n-th commit of a
    transaction holding a dead letter, after the transaction's records and offsets were written and before
    it commits."""
    if crash_at:
        holding = False
        crashes = iter(range(1, 1 << 30))
        real_call = DeadLetterHandler.__call__
        real_commit = IdempotentProducer.commit_transaction

        def call(self: DeadLetterHandler, context: ErrorContext, exc: Exception) -> ProcessingResponse:
            nonlocal holding
            holding = True
            return real_call(self, context, exc)

        def commit(self: IdempotentProducer) -> None:
            nonlocal holding
            if holding and next(crashes) == crash_at:
                self.flush()
                os._exit(17)
            holding = False
            real_commit(self)

        DeadLetterHandler.__call__ = call  # type: ignore[method-assign]
        IdempotentProducer.commit_transaction = commit  # type: ignore[method-assign]
    with pylog.open(path) as log:
        app = App(
            log,
            "errors",
            instance_id="worker",
            commit_interval_ms=20,
            max_poll_records=10,
            processing_exception_handler=DeadLetterHandler("errors-dlq"),
        )
        _topology(app, 0.0005 if crash_at else 0.0)  # slow: a crashing run commits many times
        app.run()


def _fork(path: str, crash_at: int = 0) -> int:
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        code = 1
        try:
            _dead_letter_process(path, crash_at)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def _exit_status(pid: int) -> int:
    """The child's exit status; it is killed if it has not exited by the deadline (a hang)."""
    end = time.monotonic() + 60.0
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("the run never reached its crash (hung, or finished without enough commits)")


def test_dead_letters_are_written_once_across_crashes_at_the_commit_point(tmp_path: Path) -> None:
    path = _log(tmp_path)
    pid = 0
    try:
        for n in (1, 2, 1):  # each run dies in the n-th commit of a transaction holding a dead letter
            pid = _fork(path, crash_at=n)
            status = _exit_status(pid)
            pid = 0
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 17, f"run exited with {status}"
        with pylog.open(path) as log:
            written = sum(
                1 for _ in log.consumer("errors-dlq", auto_offset_reset="earliest", consumer_timeout_ms=0)
            )
            committed = len(committed_records(log, "errors-dlq"))
            assert sum(log.group_lag("errors").values()) > 0, "the crashes left work for the last run"
        assert written - committed >= 3, "each crash aborted a transaction holding a dead letter"
        pid = _fork(path)
        with pylog.open(path) as log:
            wait_for(lambda: sum(log.group_lag("errors").values()) == 0, "the last run to finish")
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the application exited with {status}"
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    doubled, _ = _model(INPUT)
    with pylog.open(path) as log:
        out = [r.value for r in committed_records(log, "out")]
        dead = committed_records(log, "errors-dlq", value_deserializer=None)
        offsets = {(r.partition, r.offset): r.value["i"] for r in committed_records(log, "in")}
    assert sorted(out) == sorted(doubled)
    got = []
    for r in dead:
        headers = {k: v.decode() for k, v in r.headers}
        assert headers["pylog.dlq.stage"] == "processing" and headers["pylog.dlq.topic"] == "in"
        assert headers["pylog.dlq.error.class"] == "ValueError"
        i = offsets[(int(headers["pylog.dlq.partition"]), int(headers["pylog.dlq.offset"]))]
        assert pylog.streams.MSGPACK.deserialize(r.value) == {"i": i} and r.key == f"k{i % 7}".encode()
        got.append(i)
    assert sorted(got) == [i for i in range(INPUT) if _poison(i)], "each poison pill dead-lettered once"
    print(
        f"dead letters: {len(got)} committed at the end; before the last run {written} written, {committed} "
        "of them committed"
    )
