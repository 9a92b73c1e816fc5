"""Compaction survives a crash at every file-system mutation of a cleaning pass, with power-loss damage to
what was not synced, and a second crash during the recovery that follows.

The template has been cleaned once (so the pass rewrites a checkpoint and drops tombstones that expired since
that first pass) and holds batches of several records (so the pass rebuilds batches it keeps part of).

After each crash: the log opens, ``verify()`` finds nothing, the cleaner checkpoint is intact, the log start
offset has not moved, every record present is byte-identical to the one written at that offset, every record
compaction must keep is present (the latest record of every key, and tombstones younger than
``delete_retention_ms`` since their first cleaning), and the table view equals the model. For some crash
points the pass is then run again: it must leave the same records an uncrashed pass leaves.
"""

from __future__ import annotations

import os
import random
import shutil

import pytest

import pylog
from pylog import fs
from pylog.partition.cleaner import load_checkpoint
from pylog.testing import FaultyFileSystem, SimulatedCrash

T0 = 1_700_000_000_000
FIRST_PASS = T0 + 50_000
NOW = T0 + 100_000
RETENTION = 10_000  # tombstones cleaned by the first pass have expired by NOW; later ones have not
MODES = ["drop_unsynced", "random_blocks", "torn_zeros", "process_kill"]
Sent = dict[int, tuple[bytes, object]]


def _append(log: pylog.Log, clock: pylog.ManualClock, rng: random.Random, n: int, sent: Sent) -> None:
    producer = log.producer()
    futures = []
    for i in range(n):
        key = f"k{rng.randrange(9)}"
        value = None if rng.random() < 0.15 else {"i": len(sent) + i}
        futures.append((producer.send("kv", value, key=key, partition=0), key.encode(), value))
        clock.advance(5)
        if i % 3 == 2:
            producer.flush()
    producer.flush()
    sent.update({f.get().offset: (k, v) for f, k, v in futures})
    producer.close()


def _template(root: str) -> tuple[Sent, int, int]:
    """Returns offset -> record, the end of the first pass and the active segment's base."""
    clock = pylog.ManualClock(T0)
    sent: Sent = {}
    rng = random.Random(5)
    with pylog.open(root, clock=clock) as log:
        topic = log.create_topic(
            "kv",
            cleanup_policy="compact",
            segment_bytes=300,
            delete_retention_ms=RETENTION,
            min_cleanable_dirty_ratio=0.0,
        )
        _append(log, clock, rng, 60, sent)
        topic.partition(0).roll()
        clock.set(FIRST_PASS)
        topic.compact()
        first_end = topic.partition(0).log_end_offset
        _append(log, clock, rng, 90, sent)
        log.flush()
        active = topic.partition(0).segments[-1].base_offset
    return sent, first_end, active


def _clean(root: str) -> None:
    with pylog.open(root, clock=pylog.ManualClock(NOW)) as log:
        log.topic("kv").compact()


def _check(root: str, sent: Sent, first_end: int, active: int) -> set[int]:
    """Checks the invariants; returns the offsets present."""
    with pylog.open(root, clock=pylog.ManualClock(NOW)) as log:
        assert log.verify() == {}
        plog = log.topic("kv").partition(0)
        assert load_checkpoint(plog.directory)[1] is None, "the cleaner checkpoint is damaged"
        assert plog.log_start_offset == 0
        c = log.consumer("kv", auto_offset_reset="earliest", consumer_timeout_ms=0)
        present = {r.offset: (r.key, r.value) for r in c}
        c.close()
        for off, rec in present.items():
            assert sent[off] == rec, f"offset {off} holds {rec}, written {sent[off]}"
        latest: dict[bytes, int] = {}
        for off in sorted(o for o in sent if o < active):
            latest[sent[off][0]] = off
        # a tombstone may go only when it was first cleaned by the first pass (expired by NOW)
        must = {o for o in latest.values() if sent[o][1] is not None or o >= first_end}
        must |= {o for o in sent if o >= active}
        missing = sorted(must - set(present))
        assert not missing, f"records compaction must keep are gone: {missing}"
        model: dict[bytes, object] = {}
        for off in sorted(sent):
            key, value = sent[off]
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        assert log.topic("kv").table() == model
        return set(present)


@pytest.mark.parametrize("mode", MODES)
def test_a_crash_at_every_step_of_compaction(tmp_path: object, mode: str) -> None:
    base = str(tmp_path)
    template = os.path.join(base, "template")
    sent, first_end, active = _template(template)
    counter = FaultyFileSystem(os.path.join(base, "count"), copy_from=template, real_sync=False)
    with fs.install(counter):
        _clean(counter.root)
    n = counter.mutations
    assert n > 10
    uncrashed = _check(counter.root, sent, first_end, active)
    assert any(sent[o][1] is None and o < first_end for o in sent if o not in uncrashed), (
        "no tombstone expired"
    )
    failures = []
    for k in range(n + 1):
        root = os.path.join(base, "work")
        layer = FaultyFileSystem(root, copy_from=template, crash_after=k, real_sync=False)
        with fs.install(layer):
            try:
                _clean(layer.root)
            except SimulatedCrash:
                pass
        layer.power_loss(mode, random.Random(k))  # type: ignore[arg-type]
        if k % 3 == 0:
            # a second crash, in the middle of the recovery that follows
            again = FaultyFileSystem(root, crash_after=k % 7 + 1, real_sync=False)
            with fs.install(again):
                try:
                    pylog.open(root, clock=pylog.ManualClock(NOW)).close()
                except SimulatedCrash:
                    pass
            again.power_loss(mode, random.Random(-k))  # type: ignore[arg-type]
        try:
            _check(root, sent, first_end, active)
            if k % 5 == 1:
                _clean(root)  # the pass, run again, converges on what an uncrashed pass leaves
                assert _check(root, sent, first_end, active) == uncrashed
        except AssertionError as exc:
            failures.append(f"k={k}: {exc}")
        shutil.rmtree(root)
    print(f"\ncompaction [{mode}]: {n + 1} crash points checked")
    assert not failures, f"{len(failures)} of {n + 1} crash points failed:\n" + "\n".join(failures[:5])
