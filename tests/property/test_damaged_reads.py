"""A damaged batch never makes a consumer skip the records before it or move a position or commit past a
record it did not return.

Hypothesis builds a topic of one to three partitions (batches of random sizes over several segments), flips
one byte at a random point of one stored batch while the log is closed (a disk error at rest), and reads it
back in every read mode: ``poll()``, ``poll(max_records=k)``, ``for record in consumer``, ``iterate()``,
``poll_arrow()``, ``assign()`` and a group member (``subscribe()``, auto-commit after every poll, commit on
``close()``), and ``pylog consume --group``. A reader goes on after each error (as a service that logs the
error and polls again would), until it gets nothing or the same error three times in a row.

The model is the list of records produced. Invariants, for each partition:

- what was delivered is a prefix of the records produced, in order and unchanged; of the damaged partition,
  exactly the records before the damaged batch (every byte flip is detected), then a CorruptRecordError
  (or UnsupportedFormatError, for a flipped format version) is raised, and raised again by the next call;
- after every call, ``position()`` is the end of what was delivered (the consumer neither holds back nor
  skips), and every committed offset (auto-commit, ``close()``, the CLI's ``--group``) is at most that end;
  after ``close()`` it is exactly that end.
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pylog
from pylog.cli import main
from pylog.errors import CorruptRecordError, UnsupportedFormatError
from pylog.record import decode_header
from pylog.structs import TopicPartition

MODES = ("poll", "max_records", "iteration", "iterate", "arrow", "group", "cli")
DAMAGE = (CorruptRecordError, UnsupportedFormatError)
TOPIC = "ev"
GROUP = "readers"


@dataclass
class Stored:
    """Where one stored batch is: its file, its position in it, its offsets."""

    path: str
    position: int
    length: int
    base_offset: int


@dataclass
class Reading:
    """What a reader got: per partition the (offset, value) pairs delivered, and the errors raised."""

    delivered: dict[TopicPartition, list[tuple[int, Any]]] = field(default_factory=dict)
    errors: list[Exception] = field(default_factory=list)

    def end(self, tp: TopicPartition) -> int:
        got = self.delivered.get(tp)
        return got[-1][0] + 1 if got else 0

    def add(self, tp: TopicPartition, offset: int, value: Any) -> None:
        self.delivered.setdefault(tp, []).append((offset, value))


def _value(p: int, i: int) -> dict[str, int]:
    return {"p": p, "i": i}


def _build(root: str, layout: list[list[int]]) -> None:
    """One batch per flush: partition ``p`` gets batches of ``layout[p]`` records."""
    with pylog.open(root) as log:
        log.create_topic(TOPIC, partitions=len(layout), segment_bytes=700)
        producer = log.producer(acks=1)  # no fsync: the test damages files, it does not crash
        for p, sizes in enumerate(layout):
            i = 0
            for n in sizes:
                for _ in range(n):
                    producer.send(TOPIC, _value(p, i), partition=p)
                    i += 1
                producer.flush()
        producer.close()


def _batches(root: str, p: int) -> list[Stored]:
    """The stored batches of partition ``p``, by scanning its segment files."""
    out = []
    for path in sorted(glob.glob(os.path.join(root, f"{TOPIC}-{p}", "*.log"))):
        with open(path, "rb") as f:
            data = f.read()
        pos = 0
        while pos < len(data):
            h = decode_header(data, pos)
            out.append(Stored(path, pos, h.batch_length, h.base_offset))
            pos += h.batch_length
    return out


def _flip(path: str, position: int, mask: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ mask]))


class Checker:
    """Checks positions and commits after every call of a reader."""

    def __init__(self, log: Any, consumer: Any, reading: Reading, tps: list[TopicPartition]) -> None:
        self.log, self.consumer, self.reading, self.tps = log, consumer, reading, tps

    def __call__(self) -> None:
        for tp in self.tps:
            if tp in self.consumer.assignment():
                assert self.consumer.position(tp) == self.reading.end(tp), (tp, "position")
        if self.consumer.group_id is not None:
            for tp, om in self.log.group_offsets(GROUP).items():
                assert om.offset <= self.reading.end(tp), (tp, "commit", om.offset)


def _drain(
    step: Callable[[], list[tuple[TopicPartition, int, Any]]], reading: Reading, check: Callable[[], None]
) -> None:
    """Call ``step`` until it returns nothing or raises the damage error three times in a row."""
    errors_in_a_row = 0
    while errors_in_a_row < 3:
        try:
            got = step()
        except DAMAGE as exc:
            reading.errors.append(exc)
            errors_in_a_row += 1
            check()
            continue
        errors_in_a_row = 0
        for tp, offset, value in got:
            reading.add(tp, offset, value)
        check()
        if not got:
            return


def _records(polled: dict[TopicPartition, list[Any]]) -> list[tuple[TopicPartition, int, Any]]:
    return [(tp, r.offset, r.value) for tp, recs in polled.items() for r in recs]


def _one(it: Iterator[Any]) -> list[tuple[TopicPartition, int, Any]]:
    r = next(it, None)
    return [] if r is None else [(TopicPartition(r.topic, r.partition), r.offset, r.value)]


def _read_api(
    root: str, mode: str, tps: list[TopicPartition], max_records: int, damage: Callable[[], None]
) -> Reading:
    reading = Reading()
    with pylog.open(root) as log:
        for tp in tps:  # each partition is opened (and its last segments checked) on first use
            log.topic(TOPIC).partition(tp.partition)
        damage()  # under the open log (a damaged batch at rest may already stop the open: see _read_cli)
        settings: dict[str, Any] = {"auto_offset_reset": "earliest", "consumer_timeout_ms": 0}
        if mode == "group":
            settings.update(group_id=GROUP, enable_auto_commit=True, auto_commit_interval_ms=0)
        consumer = log.consumer(**settings)
        if mode == "group":
            consumer.subscribe([TOPIC])
        else:
            consumer.assign(tps)
        check = Checker(log, consumer, reading, tps)
        if mode in ("poll", "group"):  # a member waits for its assignment (it comes with the first poll)
            _drain(
                lambda: _records(consumer.poll(timeout_ms=0 if consumer.assignment() else 10_000)),
                reading,
                check,
            )
        elif mode == "max_records":
            _drain(lambda: _records(consumer.poll(max_records=max_records)), reading, check)
        elif mode == "arrow":
            _drain(lambda: _arrow_records(consumer.poll_arrow(max_bytes=max_records * 40)), reading, check)
        else:
            iterators: list[Iterator[Any]] = []

            def step() -> list[tuple[TopicPartition, int, Any]]:
                if not iterators:  # a new one after an error, as a `for` loop run again would
                    iterators.append(
                        iter(consumer) if mode == "iteration" else consumer.iterate(timeout_ms=0)
                    )
                try:
                    return _one(iterators[0])
                except BaseException:
                    iterators.clear()
                    raise

            _drain(step, reading, check)
        consumer.close()
        if mode == "group":
            committed = {tp: om.offset for tp, om in log.group_offsets(GROUP).items()}
            for tp in tps:
                assert committed.get(tp, 0) == reading.end(tp), (tp, committed)
    return reading


def _arrow_records(polled: dict[TopicPartition, Any]) -> list[tuple[TopicPartition, int, Any]]:
    out = []
    for tp, rb in polled.items():
        for offset, value in zip(
            rb.column("offset").to_pylist(), rb.column("value").to_pylist(), strict=True
        ):
            out.append((tp, offset, msgpack.unpackb(value)))
    return out


def _read_cli(root: str, tps: list[TopicPartition], damage: Callable[[], None]) -> Reading:
    reading = Reading()
    damage()
    out = io.StringIO()
    err = io.StringIO()
    argv = ["consume", TOPIC, "--from-beginning", "--group", GROUP, "--json", "--dir", root]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    for line in out.getvalue().splitlines():
        row = json.loads(line)
        reading.add(TopicPartition(row["topic"], row["partition"]), row["offset"], row["value"])
    if status != 0:  # the read, or already the open (its recovery checks the last segments), met the damage
        assert status == 1 and ("damaged" in err.getvalue() or "corrupt" in err.getvalue()), err.getvalue()
        reading.errors.append(CorruptRecordError(err.getvalue()))
    with pylog.open(root) as log:
        committed = {tp: om.offset for tp, om in log.group_offsets(GROUP).items()}
    for tp in tps:
        assert committed.get(tp, 0) == reading.end(tp), (tp, committed, reading.end(tp))
    return reading


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[list[int]], int, int, float, int, str, int]:
    layout = draw(st.lists(st.lists(st.integers(1, 20), min_size=1, max_size=8), min_size=1, max_size=3))
    p = draw(st.integers(0, len(layout) - 1))
    batch = draw(st.integers(0, len(layout[p]) - 1))
    where = draw(st.floats(0, 1, exclude_max=True))
    mask = draw(st.integers(1, 255))
    mode = draw(st.sampled_from(MODES))
    max_records = draw(st.integers(1, 30))
    return layout, p, batch, where, mask, mode, max_records


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_reads_stop_exactly_at_the_damage_and_never_pass_it(
    scenario: tuple[list[list[int]], int, int, float, int, str, int],
) -> None:
    layout, p, batch, where, mask, mode, max_records = scenario
    root = tempfile.mkdtemp(prefix="pylog-damage-")
    try:
        _build(root, layout)
        damaged = _batches(root, p)[batch]

        def damage() -> None:
            _flip(damaged.path, damaged.position + int(where * damaged.length), mask)

        tps = [TopicPartition(TOPIC, q) for q in range(len(layout))]
        if mode == "cli":
            reading = _read_cli(root, tps, damage)
        else:
            reading = _read_api(root, mode, tps, max_records, damage)
        _check(reading, layout, tps, tps[p], damaged.base_offset, mode)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _check(
    reading: Reading,
    layout: list[list[int]],
    tps: list[TopicPartition],
    damaged_tp: TopicPartition,
    damaged_at: int,
    mode: str,
) -> None:
    assert reading.errors, "the damage was not reported"
    for tp in tps:
        good = [(i, _value(tp.partition, i)) for i in range(sum(layout[tp.partition]))]
        got = reading.delivered.get(tp, [])
        assert got == good[: len(got)], (tp, "not a prefix of the records produced")
        if tp == damaged_tp:
            if mode == "cli":  # the command stops at the first error it meets
                assert len(got) <= damaged_at
            else:
                assert len(got) == damaged_at, (tp, len(got), damaged_at)
        elif mode != "cli":
            assert got == good, (tp, "an intact partition was not read to its end")
    if mode != "cli":
        assert len(reading.errors) >= 2, "the error is raised again by the next call"
    if mode == "cli" and len(tps) == 1 and "is damaged" in str(reading.errors[0]):
        assert reading.end(damaged_tp) == damaged_at  # the read met it (not the open's recovery)
