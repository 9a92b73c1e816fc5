"""Both readers of ``format("pylog")`` (pylog's JVM reader and the Python path) check every batch's base offset,
which lies outside the batch's CRC: a damaged one fails the read with pylog's CorruptRecordError naming the
segment file, the position and both offsets, never a read that ends early (fewer rows) or rows with wrong
offsets. A dense topic's batches must follow each other exactly,
a compacted topic's may leave gaps (its cleaned records) but must increase and stay inside their segment."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import BASE_TS, expected, needs_javac, rows

import pylog
from pylog.partition import files
from pylog.spark import jvm
from pylog.spark.snapshot import open_partition, walk

pytestmark = [pytest.mark.spark, needs_javac]


def read(spark: Any, path: str, topic: str) -> Any:
    return spark.read.format("pylog").option("subscribe", topic).load(path)


def plan(df: Any) -> str:
    return str(df._jdf.queryExecution().executedPlan().toString())


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Topic ``dense`` (never compacted) and topic ``cmp`` (compacted: gaps in its offsets), one partition
    each, segments of several batches of several records."""
    path = str(tmp_path_factory.mktemp("base-offsets") / "log")
    with pylog.open(path, segment_bytes=1500) as log:
        log.create_topic("dense", partitions=1)
        log.create_topic("cmp", partitions=1, cleanup_policy="compact", segment_bytes=1500)
        producer = log.producer(value_serializer=None, key_serializer=None)
        for i in range(240):
            producer.send("dense", b"v%d" % i, key=b"k%d" % i, timestamp_ms=BASE_TS + i)
            # the third batch of every five repeats the same six keys: compaction drops all but the last
            key = b"r%d" % (i % 30 - 12) if 12 <= i % 30 < 18 else b"u%d" % i
            producer.send("cmp", b"v%d" % i, key=key, timestamp_ms=BASE_TS + i)
            if i % 6 == 5:
                producer.flush()  # a batch of 6 records
        producer.close()
        log.topic("cmp").compact()
    return path


def _batches(path: str, topic: str) -> list[tuple[str, int, int, int]]:
    """(segment file, position, base offset, next offset) of every batch of ``topic``-0, in order."""
    view = open_partition(path, topic, 0)
    out = []
    for seg in view.segments:
        buf = seg.view()
        out += [(seg.path, p, h.base_offset, h.next_offset) for p, h in walk(buf, 0, seg.size, seg.path)]
    return out


def test_compacted_log_with_gaps_reads_every_surviving_record(spark: Any, logs: str) -> None:
    batches = _batches(logs, "cmp")
    gaps = sum(b[2] > a[3] for a, b in itertools.pairwise(batches))
    assert gaps > 0  # compaction left gaps between batches (and inside them)
    want = expected(logs, ("cmp",))
    assert len(want) < 240
    df = read(spark, logs, "cmp")
    assert "JVM reader" in plan(df)
    got = rows(df)
    assert got == [(*r[:7], []) for r in want]
    try:
        spark.conf.set(jvm.ENABLED, "false")
        assert rows(read(spark, logs, "cmp")) == got
    finally:
        spark.conf.set(jvm.ENABLED, "true")
    assert rows(read(spark, logs, "dense")) == [(*r[:7], []) for r in expected(logs, ("dense",))]


def _corrupt(src: str, dst: Path, topic: str, to: str) -> tuple[str, int, int]:
    """A copy of ``src`` with the base offset of a batch in the middle of a middle segment of ``topic``-0 rewritten:
    ``"high"`` past the log's end (the planned end), ``"low"`` to its predecessor's base offset, ``"skip"``
    one higher (a gap, which only a compacted segment may have: its successor is then out of place). Returns the
    segment's name, the batch's position and the offset written."""
    path = str(dst / "log")
    shutil.copytree(src, path)
    batches = _batches(path, topic)
    segments = sorted({b[0] for b in batches})
    seg = segments[len(segments) // 2]
    own = [i for i, b in enumerate(batches) if b[0] == seg]
    # a batch with a predecessor and a successor in its segment; of the compacted topic, one after a gap
    picks = [i for i in own[1:-1] if topic == "dense" or batches[i][2] > batches[i - 1][3]]
    assert picks
    i = picks[len(picks) // 2]
    _, pos, _, _ = batches[i]
    end = batches[-1][3]
    new = {"high": end + 1000, "low": batches[i - 1][2], "skip": batches[i][2] + 1}[to]
    with open(files.partition_dir(path, topic, 0) + "/" + os.path.basename(seg), "r+b") as f:
        f.seek(pos)
        f.write(struct.pack("<q", new))
    return os.path.basename(seg), pos, new


@pytest.mark.parametrize("native", ["true", "false"])
@pytest.mark.parametrize(
    ("topic", "to"), [("dense", "high"), ("dense", "low"), ("dense", "skip"), ("cmp", "high"), ("cmp", "low")]
)
def test_damaged_base_offset_fails_the_read(
    spark: Any, logs: str, tmp_path: Path, topic: str, to: str, native: str
) -> None:
    name, pos, new = _corrupt(logs, tmp_path, topic, to)
    try:
        spark.conf.set(jvm.ENABLED, native)
        df = read(spark, str(tmp_path / "log"), topic)
        assert ("JVM reader" in plan(df)) == (native == "true")
        with pytest.raises(Exception) as info:
            df.select("offset").collect()
    finally:
        spark.conf.set(jvm.ENABLED, "true")
    message = str(info.value)
    pattern = (
        rf"pylog\.errors\.CorruptRecordError: corrupt batch in \S*{topic}-0/{name} at position {pos}: "
        rf"batch has base offset {new}(, expected | and last offset)"
    )
    assert re.search(pattern, message), message[:3000]
