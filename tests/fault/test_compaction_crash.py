"""Compaction survives a crash at every file-system mutation of a cleaning pass, with power-loss damage to
what was not synced, and a second crash during the recovery that follows.

After each: the log opens, ``verify()`` finds nothing, every record present is byte-identical to the one
written at that offset, every record compaction must keep is present, and the table view equals the model.
"""

from __future__ import annotations

import os
import random
import shutil

import pytest

import pylog
from pylog import fs
from pylog.testing import FaultyFileSystem, SimulatedCrash

T0 = 1_700_000_000_000
MODES = ["drop_unsynced", "random_blocks", "torn_zeros", "process_kill"]


def _template(root: str) -> tuple[dict[int, tuple[bytes, object]], int]:
    """A compacted topic with rolled segments and a fsynced log; returns offset -> record and the active base."""
    clock = pylog.ManualClock(T0)
    sent: dict[int, tuple[bytes, object]] = {}
    rng = random.Random(5)
    with pylog.open(root, clock=clock) as log:
        log.create_topic(
            "kv",
            cleanup_policy="compact",
            segment_bytes=500,
            delete_retention_ms=1_000,
            min_cleanable_dirty_ratio=0.0,
        )
        producer = log.producer()
        for i in range(120):
            key = f"k{rng.randrange(9)}"
            value = None if rng.random() < 0.15 else {"i": i}
            meta = producer.send("kv", value, key=key, partition=0).get()
            sent[meta.offset] = (key.encode(), value)
            clock.advance(5)
            if i % 4 == 0:
                producer.flush()
        producer.close()
        log.flush()
        active = log.topic("kv").partition(0).segments[-1].base_offset
    return sent, active


def _clean(root: str) -> None:
    with pylog.open(root, clock=pylog.ManualClock(T0 + 100_000)) as log:
        log.topic("kv").compact()


def _check(root: str, sent: dict[int, tuple[bytes, object]], active: int) -> None:
    with pylog.open(root, clock=pylog.ManualClock(T0 + 100_000)) as log:
        assert log.verify() == {}
        c = log.consumer("kv", auto_offset_reset="earliest", consumer_timeout_ms=0)
        present = {r.offset: (r.key, r.value) for r in c}
        for off, rec in present.items():
            assert sent[off] == rec, f"offset {off} holds {rec}, written {sent[off]}"
        latest: dict[bytes, int] = {}
        for off in sorted(o for o in sent if o < active):
            latest[sent[off][0]] = off
        must = {o for o in latest.values() if sent[o][1] is not None} | {o for o in sent if o >= active}
        missing = sorted(must - set(present))
        assert not missing, f"records compaction must keep are gone: {missing}"
        model = {}
        for off in sorted(sent):
            key, value = sent[off]
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        assert log.topic("kv").table() == model


@pytest.mark.parametrize("mode", MODES)
def test_a_crash_at_every_step_of_compaction(tmp_path: object, mode: str) -> None:
    base = str(tmp_path)
    template = os.path.join(base, "template")
    sent, active = _template(template)
    counter = FaultyFileSystem(os.path.join(base, "count"), copy_from=template, real_sync=False)
    with fs.install(counter):
        _clean(counter.root)
    n = counter.mutations
    assert n > 10
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
                    pylog.open(root, clock=pylog.ManualClock(T0 + 100_000)).close()
                except SimulatedCrash:
                    pass
            again.power_loss(mode, random.Random(-k))  # type: ignore[arg-type]
        try:
            _check(root, sent, active)
        except AssertionError as exc:
            failures.append(f"k={k}: {exc}")
        shutil.rmtree(root)
    print(f"\ncompaction [{mode}]: {n + 1} crash points checked")
    assert not failures, f"{len(failures)} of {n + 1} crash points failed:\n" + "\n".join(failures[:5])
