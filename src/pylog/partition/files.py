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
        log-start.offset                 the log start offset delete_records set (see pylog.partition.logstart)
        compacted                        marker (its text says why): compaction cleaned this partition, so its
                                         offsets may skip; kept when cleanup_policy no longer includes compact

Temporary suffixes: ``.tmp`` (an atomic write in progress), ``.cleaned`` and ``.swap`` (compaction and
truncation rewrite a segment under a new name, then rename it over the old one), ``.deleted`` (removed by
recovery). Recovery deletes ``.tmp``/``.cleaned``/``.deleted`` files and finishes ``.swap`` renames.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

__all__ = [
    "CHECKPOINT",
    "CLEANER_CHECKPOINT",
    "CLEANED",
    "CLEANER_LOCK",
    "COMPACTED",
    "DELETED",
    "INDEX",
    "LOG",
    "LOG_START",
    "STATE",
    "SWAP",
    "TEMP_SUFFIXES",
    "TIMEINDEX",
    "TMP",
    "live_segment_bases",
    "offsets_may_skip",
    "parse_partition_dir_name",
    "parse_segment_name",
    "partition_dir",
    "partition_dir_name",
    "segment_path",
]

LOG = ".log"
INDEX = ".index"
TIMEINDEX = ".timeindex"
STATE = "partition.state"
CHECKPOINT = "recovery.checkpoint"
CLEANER_CHECKPOINT = "cleaner.checkpoint"
CLEANER_LOCK = "cleaner.lock"
COMPACTED = "compacted"
LOG_START = "log-start.offset"
TMP = ".tmp"
CLEANED = ".cleaned"
DELETED = ".deleted"
SWAP = ".swap"
TEMP_SUFFIXES = (TMP, CLEANED, DELETED)
_KINDS = "|".join(map(re.escape, (LOG, INDEX, TIMEINDEX)))
_SUFFIXES = "|".join(map(re.escape, (SWAP, *TEMP_SUFFIXES)))
_SEGMENT = re.compile(rf"^(\d{{20}})({_KINDS})({_SUFFIXES})?$")
_PARTITION_DIR = re.compile(r"^(.+)-(0|[1-9]\d*)$")


def partition_dir_name(topic: str, partition: int) -> str:
    """The name of a partition's directory in the log root: ``<topic>-<partition>``."""
    return f"{topic}-{partition}"


def parse_partition_dir_name(name: str) -> tuple[str, int] | None:
    """``(topic, partition)`` for a partition directory name, else None. A topic name may hold ``-`` itself:
    the partition number is what follows the last one."""
    m = _PARTITION_DIR.match(name)
    if m is None:
        return None
    return m.group(1), int(m.group(2))


def partition_dir(root: str, topic: str, partition: int) -> str:
    return os.path.join(root, partition_dir_name(topic, partition))


def offsets_may_skip(directory: str, compacted: bool) -> bool:
    """Whether the offsets of the partition in ``directory`` may have gaps: its topic is compacted now
    (``compacted``), or compaction cleaned it before its ``cleanup_policy`` changed (the ``compacted`` marker,
    or a cleaner checkpoint left by a pass). Readers then check that base offsets increase instead of that
    they follow each other exactly."""
    return (
        compacted
        or os.path.exists(os.path.join(directory, COMPACTED))
        or os.path.exists(os.path.join(directory, CLEANER_CHECKPOINT))
    )


def segment_path(directory: str, base_offset: int, suffix: str) -> str:
    return os.path.join(directory, f"{base_offset:020d}{suffix}")


def live_segment_bases(names: Iterable[str], up_to: int | None = None) -> list[int]:
    """Base offsets of the live segments among the file ``names`` of a partition directory (``.log`` files
    without a temporary suffix), sorted; only those at or below ``up_to`` when given."""
    return sorted(
        p[0]
        for p in map(parse_segment_name, names)
        if p and p[1] == LOG and not p[2] and (up_to is None or p[0] <= up_to)
    )


def parse_segment_name(name: str) -> tuple[int, str, str] | None:
    """``(base_offset, ".log"|".index"|".timeindex", temp_suffix_or_"")`` for a segment file name, else None."""
    m = _SEGMENT.match(name)
    if m is None:
        return None
    return int(m.group(1)), m.group(2), m.group(3) or ""
