"""A damaged time index (not checksummed) never makes a timestamp lookup answer a wrong offset.

One sealed segment of 5 batches of 10 records (offsets 0-49, record i at timestamp TS + i), every batch
indexed. Two entries of its time index are pointed at a later batch, still in order (so that the index passes
its load checks): they then claim that no batch before offset 30 holds a timestamp above TS + 19.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pylog

TS = 1_700_000_000_000


def _build(root: Path) -> None:
    with pylog.open(root) as log:
        log.create_topic("ti", index_interval_bytes=1)  # every batch indexed
        producer = log.producer(acks=1, value_serializer=None)
        for b in range(5):
            for i in range(b * 10, b * 10 + 10):
                producer.send("ti", f"v{i}".encode(), partition=0, timestamp_ms=TS + i)
            producer.flush()
        producer.close()
        log.topic("ti").partition(0).roll()  # sealed: its indexes are loaded at open, not rebuilt


def _damage(root: Path) -> None:
    path = Path(os.path.join(root, "ti-0", f"{0:020d}.timeindex"))
    raw = bytearray(path.read_bytes())
    entries = [struct.unpack_from("<qI", raw, at) for at in range(0, len(raw), 12)]
    assert entries[:5] == [(TS + 9 + 10 * k, 10 * k) for k in range(5)]
    for k in (1, 2):
        struct.pack_into("<qI", raw, k * 12, entries[k][0], 30)
    path.write_bytes(bytes(raw))


def test_offset_for_time_with_a_damaged_time_index_answers_the_right_offset(tmp_path: Path) -> None:
    root = tmp_path / "log"
    _build(root)
    _damage(root)
    with pylog.open(root) as log:
        plog = log.topic("ti").partition(0)
        found = [plog.offset_for_time(TS + i) for i in range(52)]
    assert found == [(i, TS + i) for i in range(50)] + [None, None]  # the model: record i at TS + i
