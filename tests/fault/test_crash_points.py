"""Exhaustive crash points: crash after every file-system mutation of a scripted workload, damage the
directory as a power cut would, recover, and check the invariants (I1, I3-I6, I8; I2 for a process kill).

Each workload is first run through a recording :class:`FaultyFileSystem` to count its N mutating operations
(the count is part of the test id); then, for every k in 0..N, it runs again with a crash before operation k
(k = N: after the last one), the directory is damaged in one mode and the log is opened with the normal
recovery path. Modes: ``drop_unsynced`` (everything not fsynced is lost, unsynced directory changes
undone), ``random_blocks`` (seeded: each unsynced block survives or not, each directory keeps a random
prefix of its unsynced changes), ``torn`` (each file's last unsynced write persists torn: zeros for even k,
junk for odd k) and ``process_kill`` (the operating system survives: every acknowledged record must be
there, I2). Workloads: append + roll with acks=1 and with flushes, retention deletes, topic create and
delete, truncate_to; each also opens the log and closes it, so both are crashed too.

A second crash during recovery: for every first crash point, recovery is crashed at one of its own
mutations (seeded), and for k = 0, N/2 and N at every one of them; then the log is recovered again and
checked against the same expectations.

Then: generated configs and workloads crashed at a drawn point (Hypothesis), a state machine driving power
cuts through ``crash_and_reopen``, a check that the checker reports a flipped bit, and regressions.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import pylog
from pylog import fs
from pylog.config import TopicConfig
from pylog.errors import UnsupportedFormatError
from pylog.record import crc32c
from pylog.testing import (
    POWER_LOSS_MODES,
    Append,
    ApplyRetention,
    FaultyFileSystem,
    Flush,
    InvariantViolation,
    ManualClock,
    PowerLossMode,
    Record,
    Roll,
    SimulatedCrash,
    Step,
    TopicModel,
    apply_step,
    batch_records,
    check_invariants,
    check_open_log,
    corrupt_segment,
    crash_and_reopen,
    encode_records,
    merge_expectations,
    records,
    topic_configs,
    workloads,
)

T0 = 1_700_000_000_000
MODES = ("drop_unsynced", "random_blocks", "torn", "process_kill")


def recs(tag: str, i: int, n: int = 2, ts: int | None = None) -> tuple[Record, ...]:
    """``n`` distinct records; every other one has a header."""
    return tuple(
        (
            f"{tag}{i}".encode(),
            f"{tag}-{i}-{j}-".encode() + b"x" * 40,
            (("h", str(j).encode()),) if j % 2 else (),
            T0 + i if ts is None else ts,
        )
        for j in range(n)
    )


@dataclass
class Ctx:
    """What one run of a workload promised: topic models, how far it got, and its clock."""

    clock: ManualClock
    models: dict[str, TopicModel] = field(default_factory=dict)
    progress: set[str] = field(default_factory=set)

    def copy(self) -> Ctx:
        return Ctx(
            ManualClock(self.clock.time_ms()),
            {k: m.copy() for k, m in self.models.items()},
            set(self.progress),
        )


@dataclass
class Scenario:
    name: str
    setup: Callable[[str, Ctx], None]
    run: Callable[[str, Ctx], None]
    expect: Callable[[Ctx], tuple[list[TopicModel], tuple[str, ...]]] = lambda ctx: (
        list(ctx.models.values()),
        (),
    )


# -- (a) append + roll, acks=1 and with flushes -----------------------------------------------------------


def _setup_single(**config: Any) -> Callable[[str, Ctx], None]:
    def setup(root: str, ctx: Ctx) -> None:
        with pylog.open(root, clock=ctx.clock) as log:
            log.create_topic("t", segment_bytes=600, index_interval_bytes=128, **config)
        ctx.models["t"] = TopicModel("t", 1)

    return setup


def _append_roll(flush_every: int) -> Callable[[str, Ctx], None]:
    def run(root: str, ctx: Ctx) -> None:
        log = pylog.open(root, clock=ctx.clock)
        model = ctx.models["t"]
        for i in range(10):
            apply_step(log, "t", Append(0, recs("a", i)), model)
            if flush_every and i % flush_every == flush_every - 1:
                apply_step(log, "t", Flush(0), model)
        log.close()
        model.mark_all_durable()

    return run


# -- (b) retention ----------------------------------------------------------------------------------------


def _setup_retention(root: str, ctx: Ctx) -> None:
    model = TopicModel("t", 1)
    with pylog.open(root, clock=ctx.clock) as log:
        log.create_topic("t", segment_bytes=600, index_interval_bytes=128, retention_ms=10_000)
        for i in range(9):
            apply_step(log, "t", Append(0, recs("r", i, ts=T0 + i * 1000)), model)
        apply_step(log, "t", Flush(0), model)
    model.mark_all_durable()
    ctx.models["t"] = model


def _run_retention(root: str, ctx: Ctx) -> None:
    log = pylog.open(root, clock=ctx.clock)
    model = ctx.models["t"]
    ctx.clock.set(T0 + 16_500)  # the first two segments (largest timestamps T0+2s, T0+5s) expire
    apply_step(log, "t", ApplyRetention(), model)
    for i in range(2):
        apply_step(log, "t", Append(0, recs("s", i, ts=ctx.clock.time_ms())), model)
    apply_step(log, "t", Flush(0), model)
    ctx.clock.advance(60_000)  # now everything expires, the active segment too (rolled, then deleted)
    apply_step(log, "t", ApplyRetention(), model)
    apply_step(log, "t", Append(0, recs("u", 0, ts=ctx.clock.time_ms())), model)
    log.close()
    model.mark_all_durable()


# -- (c) topic create and delete ----------------------------------------------------------------------------


def _setup_topics(root: str, ctx: Ctx) -> None:
    keep, old = TopicModel("keep", 1), TopicModel("old", 2)
    with pylog.open(root, clock=ctx.clock) as log:
        log.create_topic("keep", segment_bytes=600)
        log.create_topic("old", partitions=2, segment_bytes=600)
        for i in range(2):
            apply_step(log, "keep", Append(0, recs("k", i)), keep)
            for p in range(2):
                apply_step(log, "old", Append(p, recs(f"o{p}", i)), old)
    keep.mark_all_durable()
    old.mark_all_durable()
    ctx.models.update(keep=keep, old=old)


def _run_topics(root: str, ctx: Ctx) -> None:
    log = pylog.open(root, clock=ctx.clock)
    new = TopicModel("new", 2)
    ctx.models["new"] = new
    ctx.progress.add("create_started")
    log.create_topic("new", partitions=2, segment_bytes=600)
    ctx.progress.add("create_done")
    for p in range(2):
        apply_step(log, "new", Append(p, recs(f"n{p}", 0)), new)
    apply_step(log, "new", Flush(0), new)
    ctx.progress.add("delete_started")
    log.delete_topic("old")
    ctx.progress.add("delete_done")
    apply_step(log, "keep", Append(0, recs("k", 9)), ctx.models["keep"])
    log.close()
    for m in ctx.models.values():
        m.mark_all_durable()


def _expect_topics(ctx: Ctx) -> tuple[list[TopicModel], tuple[str, ...]]:
    models = [ctx.models["keep"]]
    optional: list[str] = []
    if "create_started" in ctx.progress:
        models.append(ctx.models["new"])
        if "create_done" not in ctx.progress:
            optional.append("new")
    if "delete_done" not in ctx.progress:
        models.append(ctx.models["old"])
        if "delete_started" in ctx.progress:
            optional.append("old")
    return models, tuple(optional)


# -- (d) truncate_to --------------------------------------------------------------------------------------


def _setup_truncate(root: str, ctx: Ctx) -> None:
    model = TopicModel("t", 1)
    with pylog.open(root, clock=ctx.clock) as log:
        log.create_topic("t", segment_bytes=600, index_interval_bytes=128)
        for i in range(10):  # 20 records in segments based at 0, 6, 12, 18
            apply_step(log, "t", Append(0, recs("p", i)), model)
        apply_step(log, "t", Flush(0), model)
    model.mark_all_durable()
    ctx.models["t"] = model


def _truncate(log: pylog.Log, model: TopicModel, offset: int) -> None:
    model.begin_truncate(0, offset)
    model.end_truncate(0, log.topic("t").partition(0).truncate_to(offset))


def _run_truncate(root: str, ctx: Ctx) -> None:
    log = pylog.open(root, clock=ctx.clock)
    model = ctx.models["t"]
    _truncate(log, model, 9)  # inside batch [8, 9] of the second segment: end 8, later segments deleted
    for i in range(2):
        apply_step(log, "t", Append(0, recs("q", i)), model)  # offsets 8..11 reused by new records
    apply_step(log, "t", Flush(0), model)
    _truncate(log, model, 6)  # a segment boundary: the second segment goes, nothing is rewritten
    apply_step(log, "t", Append(0, recs("z", 0)), model)
    apply_step(log, "t", Flush(0), model)
    log.close()
    model.mark_all_durable()


SCENARIOS = [
    Scenario("append_roll_acks1", _setup_single(), _append_roll(0)),
    Scenario("append_roll_flush", _setup_single(), _append_roll(3)),
    Scenario("retention_delete", _setup_retention, _run_retention),
    Scenario("topic_create_delete", _setup_topics, _run_topics, _expect_topics),
    Scenario("truncate_to", _setup_truncate, _run_truncate),
]

# -- harness ------------------------------------------------------------------------------------------------


def _scratch_base() -> str | None:
    """tmpfs when there is one: the directory is rebuilt hundreds of times per test."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@pytest.fixture
def scratch(tmp_path: Any) -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="pylog-crash-", dir=_scratch_base() or str(tmp_path))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _prepare(scenario: Scenario, base: str) -> tuple[str, Ctx]:
    template = os.path.join(base, "template")
    ctx = Ctx(ManualClock(T0))
    scenario.setup(template, ctx)
    return template, ctx


def _count(scenario: Scenario, base: str, template: str, ctx0: Ctx) -> int:
    """N: the mutating operations of one complete, uninterrupted run."""
    layer = FaultyFileSystem(os.path.join(base, "count"), copy_from=template, real_sync=False)
    with fs.install(layer):
        scenario.run(layer.root, ctx0.copy())
    assert not layer.bypassed(), f"changes made around the file-system layer: {layer.bypassed()}"
    shutil.rmtree(layer.root)
    return layer.mutations


_COUNTS: dict[str, int] = {}


def crash_point_count(scenario: Scenario) -> int:
    if scenario.name not in _COUNTS:
        base = tempfile.mkdtemp(prefix="pylog-count-", dir=_scratch_base())
        try:
            template, ctx = _prepare(scenario, base)
            _COUNTS[scenario.name] = _count(scenario, base, template, ctx)
        finally:
            shutil.rmtree(base, ignore_errors=True)
    return _COUNTS[scenario.name]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "scenario" in metafunc.fixturenames:
        metafunc.parametrize(
            "scenario",
            SCENARIOS,
            ids=[f"{s.name}-{crash_point_count(s) + 1}_crash_points" for s in SCENARIOS],
        )


def _mode_for(mode: str, k: int) -> PowerLossMode:
    modes: dict[str, PowerLossMode] = {
        "drop_unsynced": "drop_unsynced",
        "random_blocks": "random_blocks",
        "torn": "torn_zeros" if k % 2 == 0 else "torn_junk",
        "process_kill": "process_kill",
    }
    return modes[mode]


def _crash_run(
    scenario: Scenario, root: str, template: str, ctx0: Ctx, k: int
) -> tuple[Ctx, FaultyFileSystem, str]:
    """Run the workload with a crash before mutation ``k``; returns its context, the layer (which knows what
    was synced) and where it crashed ("completed" when it did not)."""
    ctx = ctx0.copy()
    layer = FaultyFileSystem(root, copy_from=template, crash_after=k, real_sync=False)
    with fs.install(layer):
        try:
            scenario.run(layer.root, ctx)
        except SimulatedCrash:
            assert layer.crash_point is not None
            return ctx, layer, layer.crash_point.replace(layer.root + os.sep, "")
    return ctx, layer, "completed"


def _check(scenario: Scenario, root: str, ctx: Ctx, mode: PowerLossMode) -> None:
    models, optional = scenario.expect(ctx)
    check_invariants(
        root,
        **merge_expectations(models, durable_is_acked=mode == "process_kill"),
        optional_topics=optional,
        clock=ManualClock(ctx.clock.time_ms()),
    )


@pytest.mark.parametrize("mode", MODES)
def test_crash_at_every_mutation(scenario: Scenario, mode: str, scratch: str) -> None:
    template, ctx0 = _prepare(scenario, scratch)
    n = _count(scenario, scratch, template, ctx0)
    assert n == crash_point_count(scenario), "the workload is not deterministic"
    root = os.path.join(scratch, "work")
    failures: list[str] = []
    checked = 0
    for k in range(n + 1):
        ctx, layer, where = _crash_run(scenario, root, template, ctx0, k)
        assert (where == "completed") == (k == n), f"k={k}: {where}"
        damage = _mode_for(mode, k)
        layer.power_loss(damage, random.Random(f"{scenario.name}/{mode}/{k}"))
        try:
            _check(scenario, root, ctx, damage)
        except InvariantViolation as exc:
            failures.append(f"k={k} ({where}) {damage}: {exc}")
        checked += 1
    print(f"\n{scenario.name} [{mode}]: {checked} crash points checked (N={n} mutations)")
    assert checked == n + 1
    assert not failures, f"{len(failures)} of {checked} crash points failed:\n" + "\n".join(failures[:10])


def _first_damage(k: int) -> PowerLossMode:
    return ("torn_junk", "torn_zeros", "random_blocks")[k % 3]


def test_crash_during_recovery(scenario: Scenario, scratch: str) -> None:
    """For every first crash point k: damage the directory, then crash the recovery itself at one of its
    mutations (seeded; at every one of them for k = 0, N/2 and N), lose power again, recover again, and
    check the same expectations as after a single crash."""
    template, ctx0 = _prepare(scenario, scratch)
    n = _count(scenario, scratch, template, ctx0)
    root = os.path.join(scratch, "work")
    damaged = os.path.join(scratch, "damaged")
    sweep = max(1, n // 2)
    failures: list[str] = []
    pairs = 0
    for k in range(n + 1):
        rng = random.Random(f"{scenario.name}/recovery/{k}")
        ctx, layer, where = _crash_run(scenario, root, template, ctx0, k)
        first = _first_damage(k)
        layer.power_loss(first, rng)
        shutil.rmtree(damaged, ignore_errors=True)
        shutil.copytree(root, damaged)
        counter = FaultyFileSystem(root, copy_from=damaged, real_sync=False)
        try:
            with fs.install(counter):
                pylog.open(root, clock=ManualClock(ctx.clock.time_ms()))
        except (pylog.errors.PylogError, OSError) as exc:
            failures.append(f"k={k} ({where}) {first}: recovery failed: {exc}")
            continue
        finally:
            counter.kill()
        m = counter.mutations
        assert m > 0, "recovery after an unclean shutdown always writes something"
        for j in range(m) if k % sweep == 0 else [rng.randrange(m)]:
            second: PowerLossMode = "drop_unsynced" if j % 2 == 0 else "random_blocks"
            again = FaultyFileSystem(root, copy_from=damaged, crash_after=j, real_sync=False)
            with fs.install(again), pytest.raises(SimulatedCrash):
                pylog.open(root, clock=ManualClock(ctx.clock.time_ms()))
            again.power_loss(second, rng)
            try:
                _check(scenario, root, ctx, second)
            except InvariantViolation as exc:
                failures.append(f"k={k} ({where}) {first}, recovery crash j={j}/{m} {second}: {exc}")
            pairs += 1
    print(f"\n{scenario.name} [crash during recovery]: {pairs} (first crash, recovery crash) pairs checked")
    assert pairs >= n + 1 - len(failures)
    assert not failures, f"{len(failures)} failed:\n" + "\n".join(failures[:10])


# -- random workloads ---------------------------------------------------------------------------------------


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(config=topic_configs(), steps=workloads(partitions=2, max_steps=12), data=st.data())
def test_random_workload_crash_anywhere(config: TopicConfig, steps: list[Step], data: st.DataObject) -> None:
    """Generated configs (small segments, retention, flush policies, LogAppendTime, compression) and
    workloads (appends, flushes, rolls, clock moves, retention, truncation) on two partitions, crashed at a
    drawn mutation and damaged in a drawn mode."""
    base = tempfile.mkdtemp(prefix="pylog-random-", dir=_scratch_base())
    try:

        def setup(root: str, ctx: Ctx) -> None:
            with pylog.open(root, clock=ctx.clock) as log:
                log.create_topic("t", partitions=2, **config.to_dict())
            ctx.models["t"] = TopicModel("t", 2)

        def run(root: str, ctx: Ctx) -> None:
            log = pylog.open(root, clock=ctx.clock)
            for step in steps:
                apply_step(log, "t", step, ctx.models["t"])
            log.close()
            ctx.models["t"].mark_all_durable()

        scenario = Scenario("random", setup, run)
        template, ctx0 = _prepare(scenario, base)
        n = _count(scenario, base, template, ctx0)
        event(f"mutations: {10 * (n // 10)}+")
        k = data.draw(st.integers(0, n), label="crash point")
        mode = data.draw(st.sampled_from(POWER_LOSS_MODES), label="damage")
        root = os.path.join(base, "work")
        ctx, layer, where = _crash_run(scenario, root, template, ctx0, k)
        layer.power_loss(mode, random.Random(k))
        note(f"crash {where}, damage {mode}")
        _check(scenario, root, ctx, mode)
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- regressions found at crash points ----------------------------------------------------------------------


def _log_with_tail(root: str, tail: bytes) -> str:
    """A log whose only partition holds one flushed batch and then ``tail`` (never fsynced, unclean)."""
    with pylog.open(root) as log:
        log.create_topic("t")
        plog = log.topic("t").partition(0)
        plog.append(encode_records([(b"k", b"durable", (), T0)]))
        plog.flush()
    segment = os.path.join(root, "t-0", "00000000000000000000.log")
    with open(segment, "ab") as f:
        f.write(tail)
    os.unlink(os.path.join(root, ".clean-shutdown"))
    return segment


def test_torn_append_with_a_junk_version_byte_is_truncated(scratch: str) -> None:
    """A torn append whose garbage lands on the format-version byte is junk past the recovery point, not a
    batch from a newer pylog: recovery truncates it instead of refusing to open the log."""
    real = bytearray(encode_records([(b"k", b"lost", (), T0 + 1)]))
    torn = bytes(real[:16]) + bytes([0xB2]) + random.Random(7).randbytes(len(real) - 17)
    root = os.path.join(scratch, "log")
    _log_with_tail(root, torn)
    with pylog.open(root) as log:
        plog = log.topic("t").partition(0)
        assert plog.log_end_offset == 1
        assert log.recovery["t-0"].bytes_truncated == len(torn)
        assert [r for b in plog.batches() for _, r in batch_records(b)] == [(b"k", b"durable", (), T0)]


def test_intact_batch_of_a_newer_format_still_refuses_to_open(scratch: str) -> None:
    """The other side of the rule above: a whole batch with a valid CRC and a newer version is real data."""
    newer = bytearray(encode_records([(b"k", b"future", (), T0 + 1)]))
    newer[16] = 2
    struct.pack_into("<I", newer, 12, crc32c(bytes(newer[16:])))
    root = os.path.join(scratch, "log")
    _log_with_tail(root, bytes(newer))
    with pytest.raises(UnsupportedFormatError):
        pylog.open(root)


# -- the helpers from a state machine -----------------------------------------------------------------------


class PowerCutMachine(RuleBasedStateMachine):
    """Appends, flushes and rolls interleaved with power cuts of every mode (``crash_and_reopen``); after each
    recovery the open log is checked against the model, which then adopts what survived."""

    def __init__(self) -> None:
        super().__init__()
        self.base = tempfile.mkdtemp(prefix="pylog-machine-", dir=_scratch_base())
        self.root = os.path.join(self.base, "log")
        self.clock = ManualClock(T0)
        with pylog.open(self.root, clock=self.clock) as log:
            log.create_topic("t", segment_bytes=400, index_interval_bytes=64)
        self.layer = FaultyFileSystem(self.root, real_sync=False)
        self.installed = fs.install(self.layer)
        self.installed.__enter__()
        self.log = pylog.open(self.root, clock=self.clock)
        self.model = TopicModel("t", 1)
        self.cuts = 0

    @rule(batch=st.lists(records(max_value=48, min_ts=T0, max_ts=T0 + 60_000), min_size=1, max_size=3))
    def append(self, batch: list[Record]) -> None:
        apply_step(self.log, "t", Append(0, tuple(batch)), self.model)

    @rule()
    def flush(self) -> None:
        apply_step(self.log, "t", Flush(0), self.model)

    @rule()
    def ack_flush(self) -> None:
        """The flush of an acks="all" acknowledgement: the index files are fsynced at most once a second of
        the (here frozen) clock, so the records must survive a power cut through the log's fsync alone."""
        apply_step(self.log, "t", Flush(0, ack=True), self.model)

    @rule()
    def roll(self) -> None:
        apply_step(self.log, "t", Roll(0), self.model)

    @rule(mode=st.sampled_from(POWER_LOSS_MODES), seed=st.integers(0, 2**32 - 1))
    def power_cut(self, mode: PowerLossMode, seed: int) -> None:
        self.log = crash_and_reopen(self.log, mode, rng=random.Random(seed))
        self.cuts += 1
        problems = check_open_log(
            self.log, **merge_expectations([self.model], durable_is_acked=mode == "process_kill")
        )
        assert not problems, "\n".join(problems)
        self.model.rebase(self.log)

    @invariant()
    def end_matches_model(self) -> None:
        m = self.model.partitions[0]
        assert self.log.topic("t").partition(0).log_end_offset == m.acked_end

    def teardown(self) -> None:
        event(f"power cuts: {min(self.cuts, 3)}{'+' if self.cuts >= 3 else ''}")
        try:
            self.log.close()
            self.model.mark_all_durable()
        finally:
            self.installed.__exit__(None, None, None)
        try:
            check_invariants(self.root, **merge_expectations([self.model]), clock=self.clock)
        finally:
            shutil.rmtree(self.base, ignore_errors=True)


TestPowerCutMachine = PowerCutMachine.TestCase
TestPowerCutMachine.settings = settings(max_examples=30, stateful_step_count=25, deadline=None)


def test_check_invariants_reports_a_flipped_bit_below_the_durable_point(scratch: str) -> None:
    """The checker itself can fail: one flipped bit in a flushed batch is reported (as corruption), not
    passed over."""
    root = os.path.join(scratch, "log")
    model = TopicModel("t", 1)
    with pylog.open(root, clock=ManualClock(T0)) as log:
        log.create_topic("t", segment_bytes=600)
        for i in range(6):
            apply_step(log, "t", Append(0, recs("c", i)), model)
        apply_step(log, "t", Flush(0), model)
    model.mark_all_durable()
    check_invariants(root, **merge_expectations([model]))
    segment = os.path.join(root, "t-0", "00000000000000000000.log")
    position, bit = corrupt_segment(segment, random.Random(3), start=64)
    with pytest.raises(InvariantViolation, match=r"I3|CRC|corrupt") as caught:
        check_invariants(root, **merge_expectations([model]))
    assert caught.value.problems, (position, bit)
