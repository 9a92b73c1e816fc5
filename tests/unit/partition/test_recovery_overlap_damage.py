"""Recovery of a compacted partition whose segments overlap: a merge left by an interrupted compaction, or a
damaged base offset (outside the CRC) that makes a segment look as if it merged the ones after it.

Compaction merges consecutive segments into one and deletes the others once the merged one is durable, so
recovery deletes the segments a merged one covers. A base offset flipped upwards must not pass for such a
merge: the segments after it hold good records that nothing else has.
"""

from __future__ import annotations

import glob
import os
import struct
from pathlib import Path

import pytest

import pylog
from pylog.errors import CorruptRecordError


def _build(root: Path, batches: int = 5) -> None:
    """Topic ``c`` (compacted), one partition, ``batches`` segments of one batch of 10 keyed records."""
    with pylog.open(root) as log:
        log.create_topic("c", cleanup_policy="compact")
        producer = log.producer(acks=1, value_serializer=None, key_serializer=None)
        for b in range(batches):
            for i in range(b * 10, b * 10 + 10):
                producer.send("c", f"v{i}".encode(), key=f"k{i}".encode(), partition=0)
            producer.flush()
            log.topic("c").partition(0).roll()
        producer.close()


def _segments(root: Path) -> list[str]:
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(root, "c-0", "*.log")))


def _set_base_offset(root: Path, segment_base: int, base_offset: int) -> None:
    """Overwrite the base offset of the first batch of the segment of ``segment_base``."""
    with open(os.path.join(root, "c-0", f"{segment_base:020d}.log"), "r+b") as f:
        f.write(struct.pack("<q", base_offset))


def _offsets(root: Path) -> list[int]:
    with pylog.open(root) as log:
        consumer = log.consumer(
            "c", auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None
        )
        try:
            return [r.offset for r in consumer]
        finally:
            consumer.close()


@pytest.mark.parametrize("damaged_base", [84, 20 + (1 << 40)])
def test_a_damaged_base_offset_deletes_no_segment(tmp_path: Path, damaged_base: int) -> None:
    root = tmp_path / "log"
    _build(root)
    before = _segments(root)
    _set_base_offset(root, 20, damaged_base)  # the batch of offsets 20-29 now claims to reach past 30-49
    with pytest.raises(CorruptRecordError):
        _offsets(root)
    assert _segments(root) == before  # the segments of offsets 30-49 are kept
    _set_base_offset(root, 20, 20)  # the damage undone: every record is there
    assert _offsets(root) == list(range(50))


def test_a_merge_left_by_an_interrupted_compaction_still_drops_the_segments_it_covers(tmp_path: Path) -> None:
    """The state a compaction leaves when it stops after the merged segment is in place and before the
    segments it merged are deleted: the merged one (here a copy of the batches 20-39 in the file of 20),
    the segment of 30 beside it."""
    root = tmp_path / "log"
    _build(root)
    d = os.path.join(root, "c-0")
    merged = b"".join(Path(d, f"{b:020d}.log").read_bytes() for b in (20, 30))
    with open(os.path.join(d, f"{20:020d}.log"), "wb") as f:
        f.write(merged)
    for suffix in (".index", ".timeindex"):
        path = os.path.join(d, f"{20:020d}{suffix}")
        if os.path.exists(path):
            os.unlink(path)
    with open(os.path.join(d, "compacted"), "wb") as f:
        f.write(b"pylog: compaction cleaned this partition; its offsets may skip\n")
    assert _offsets(root) == list(range(50))
    assert f"{30:020d}.log" not in _segments(root)
