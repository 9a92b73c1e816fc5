"""Single-bit flips in every kind of file pylog keeps: segments, offset and time indexes, the recovery
checkpoint, the shared partition state, the manifest, a group's state and committed-offset log, the
transaction decisions. Each flip must be detected (a pylog.errors class) or be harmless (the file is
rebuilt or not needed); a wrong record or a wrong committed offset is never returned.
"""

from __future__ import annotations

import os
import random
import shutil
from collections import Counter
from typing import Any

import pylog
from pylog.errors import PylogError
from pylog.structs import TopicPartition

TRIALS_PER_KIND = 40


def _build(root: str) -> tuple[Any, dict[TopicPartition, int]]:
    with pylog.open(root) as log:
        log.create_topic("t", segment_bytes=4_096, index_interval_bytes=256)
        producer = log.producer()
        for i in range(600):
            producer.send("t", {"i": i}, key=b"k%d" % (i % 13), partition=0)
            if i % 10 == 0:
                producer.flush()
        producer.close()
        consumer = log.consumer(group_id="g", auto_offset_reset="earliest", enable_auto_commit=False)
        consumer.subscribe(["t"])
        while not consumer.assignment():
            consumer.poll(timeout_ms=50, max_records=1)
        for n in (100, 250, 400):
            consumer.commit({TopicPartition("t", 0): n})
        consumer.close(autocommit=False)
        tx = log.producer(transactional_id="tx")
        tx.init_transactions()
        tx.begin_transaction()
        tx.send("t", {"i": "tx"}, key=b"tx", partition=0)
        tx.commit_transaction()
        tx.close()
        offsets = {tp: om.offset for tp, om in log.group_offsets("g").items()}
    records, _, committed_view = _read_all(root)
    return (records, committed_view), offsets


_PARTITION_FILES = {".log": "segment", ".index": "offset index", ".timeindex": "time index"}
_NAMED_FILES = {
    ("manifest",): "manifest",
    ("t-0", "recovery.checkpoint"): "recovery.checkpoint",
    ("t-0", "partition.state"): "partition.state",
    ("__transactions", "decisions.log"): "decisions.log",
}
_GROUP_FILES = {"state": "state", "offsets.log": "committed offsets"}


def _kind(rel: str) -> str | None:
    """The kind of the file at ``rel``, a path relative to the log root (never the absolute path: the
    directory holding the log may itself be called ``t-0`` or contain it)."""
    parts = tuple(rel.split(os.sep))
    if parts in _NAMED_FILES:
        return _NAMED_FILES[parts]
    if len(parts) == 2 and parts[0] == "t-0":
        return _PARTITION_FILES.get(os.path.splitext(parts[1])[1])
    if len(parts) == 3 and parts[0] == "__groups":
        return _GROUP_FILES.get(parts[2])
    return None


def _files(root: str) -> dict[str, list[str]]:
    kinds: dict[str, list[str]] = {}
    for d, _, names in os.walk(root):
        for name in names:
            path = os.path.join(d, name)
            kind = _kind(os.path.relpath(path, root))
            if kind is not None and os.path.getsize(path):
                kinds.setdefault(kind, []).append(path)
    return kinds


def _read_all(root: str) -> tuple[Any, dict[TopicPartition, int], Any]:
    with pylog.open(root) as log:
        c = log.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0)
        records = [(r.offset, r.key, r.value) for r in c]
        c.close()
        committed = {tp: om.offset for tp, om in log.group_offsets("g").items()}
        rc = log.consumer(
            "t", auto_offset_reset="earliest", consumer_timeout_ms=0, isolation_level="read_committed"
        )
        committed_view = [r.offset for r in rc]
        rc.close()
    return records, committed, committed_view


def test_every_single_bit_flip_is_detected_or_harmless(tmp_path: object) -> None:
    # The log lives in a directory named like its own partition directory, so that a classification of
    # files by their absolute path (rather than their path inside the log) cannot go unnoticed.
    base = os.path.join(str(tmp_path), "t-0")
    pristine = os.path.join(base, "pristine")
    model, offsets = _build(pristine)
    rng = random.Random(11)
    outcomes: Counter[tuple[str, str]] = Counter()
    wrong: list[str] = []
    for kind, paths in sorted(_files(pristine).items()):
        for _ in range(TRIALS_PER_KIND):
            work = os.path.join(base, "work")
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(pristine, work)
            path = os.path.join(work, os.path.relpath(rng.choice(paths), pristine))
            pos = rng.randrange(os.path.getsize(path))
            with open(path, "r+b") as f:
                f.seek(pos)
                byte = f.read(1)
                f.seek(pos)
                f.write(bytes([byte[0] ^ (1 << rng.randrange(8))]))
            try:
                records, committed, committed_view = _read_all(work)
            except PylogError:
                outcomes[(kind, "detected")] += 1
                continue
            if (records, committed_view) == model and committed == offsets:
                outcomes[(kind, "harmless")] += 1
            else:
                wrong.append(f"{kind} {os.path.relpath(path, work)}@{pos}")
    tried = sum(outcomes.values()) + len(wrong)
    print(f"\nbit flips: {tried} tried, {len(wrong)} returned wrong data")
    for (kind, outcome), n in sorted(outcomes.items()):
        print(f"  {kind:18} {outcome:9} {n}")
    assert not wrong, wrong[:5]
    assert {k for k, _ in outcomes} >= {
        "segment",
        "offset index",
        "time index",
        "recovery.checkpoint",
        "partition.state",
        "manifest",
        "state",
        "committed offsets",
        "decisions.log",
    }
