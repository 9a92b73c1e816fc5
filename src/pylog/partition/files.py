"""Every file-naming rule of a partition directory, in one place.

::

    <topic>-<partition>/
        00000000000000000000.log         record batches (see pylog.record)
        00000000000000000000.index       sparse offset index (see pylog.partition.index)
        00000000000000000000.timeindex   sparse time index
        partition.state                  shared, memory-mapped publication state + the writer lock
        recovery.checkpoint              durable recovery point (two CRC'd slots)
        cleaner.checkpoint               compacted topics: what compaction cleaned, and when
        cleaner.lock                     compacted topics: flock held by the one cleaning pass running

Temporary suffixes: ``.tmp`` (an atomic write in progress), ``.cleaned`` and ``.swap`` (compaction and
truncation rewrite a segment under a new name, then rename it over the old one), ``.deleted`` (removed by
recovery). Recovery deletes ``.tmp``/``.cleaned``/``.deleted`` files and finishes ``.swap`` renames.
"""

from __future__ import annotations

import os
import re

__all__ = [
    "CHECKPOINT",
    "CLEANER_CHECKPOINT",
    "CLEANER_LOCK",
    "INDEX",
    "LOG",
    "STATE",
    "TIMEINDEX",
    "parse_segment_name",
    "partition_dir",
    "segment_path",
]

LOG = ".log"
INDEX = ".index"
TIMEINDEX = ".timeindex"
STATE = "partition.state"
CHECKPOINT = "recovery.checkpoint"
CLEANER_CHECKPOINT = "cleaner.checkpoint"
CLEANER_LOCK = "cleaner.lock"
TEMP_SUFFIXES = (".tmp", ".cleaned", ".deleted")
SWAP = ".swap"
_SEGMENT = re.compile(r"^(\d{20})\.(log|index|timeindex)(\.swap|\.cleaned|\.deleted|\.tmp)?$")


def partition_dir(root: str, topic: str, partition: int) -> str:
    return os.path.join(root, f"{topic}-{partition}")


def segment_path(directory: str, base_offset: int, suffix: str) -> str:
    return os.path.join(directory, f"{base_offset:020d}{suffix}")


def parse_segment_name(name: str) -> tuple[int, str, str] | None:
    """``(base_offset, ".log"|".index"|".timeindex", temp_suffix_or_"")`` for a segment file name, else None."""
    m = _SEGMENT.match(name)
    if m is None:
        return None
    return int(m.group(1)), "." + m.group(2), m.group(3) or ""
