"""``pylog dump PATH...``: print what segment files hold, read-only and without opening the log (like
``kafka-dump-log --files ... --print-data-log``).

``PATH`` is a ``.log`` segment, an ``.index`` or ``.timeindex`` file, or a partition directory (all of its
segments in offset order). A file is recognised by its name (``00000000000000000000.log``, also with a
``.swap``/``.cleaned``/``.deleted`` suffix), else by its first bytes (a record batch); any other file, such as
the log's ``manifest`` or a partition's ``partition.state``, is refused as not a segment file (exit status 1)
before anything is printed. For each batch: base and last offset, record count, byte position and size,
timestamps, compression, CRC and whether it is valid; with ``--print-data`` each record's offset, timestamp,
key, headers and value (shown as ``pylog consume`` shows them, ``--value-format`` as there). A batch whose header is unreadable ends the
walk of that file (batch lengths after it cannot be trusted) and is reported with its position.

``--verify-index-only`` checks each segment's ``.index`` and ``.timeindex`` against its ``.log`` instead: every
offset-index entry must name the byte position where the batch with that offset starts, and every time-index
entry must point at a batch and not understate the timestamps before it.

With ``--json``, one JSON object per line: ``{"type": "batch", ...}`` (with ``records`` under ``--print-data``),
``{"type": "error", ...}`` and a ``{"type": "summary", ...}`` per file; index files give ``index_entry`` or
``timeindex_entry`` objects and ``--verify-index-only`` one ``{"file", "ok", "problems"}`` object per segment.

Exit status 1 when a batch is corrupt or an index does not match its log.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import mmap
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pylog.cli._common import CliError, NotASegmentFileError, Output, Parents, described
from pylog.cli._formats import SHOW_VALUE_FORMATS, show_json, show_text
from pylog.errors import CorruptRecordError, UnsupportedFormatError
from pylog.partition import files
from pylog.partition.index import OFFSET_ENTRY, TIME_ENTRY
from pylog.partition.reader import list_segments, read_entries, walk_headers
from pylog.record import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    HEADER_SIZE,
    BatchHeader,
    DecodedBatch,
    check_crc,
    decode_batch,
    decode_header,
)

if TYPE_CHECKING:
    from pylog.cli._common import Subparsers

__all__ = ["register"]

Buffer = bytes | memoryview


_DUMP_HELP = """\
Print what segment files hold, batch by batch, like kafka-dump-log --files ... --print-data-log. Each PATH
is a .log segment, an .index or .timeindex file, or a partition directory (all of its segments, in offset
order). The files are read directly: the log is not opened, so this works on a copy, on a log another
process has open, and on a log too damaged to open.

For each batch: base and last offset, record count, byte position and size, timestamps, compression, CRC
and whether it is valid; with --print-data also each record's offset, timestamp, key, headers and value
(shown as 'pylog consume' shows them; --value-format as there). A batch whose header cannot be read ends
the walk of its file (the lengths after it cannot be trusted) and is reported with its position.

--verify-index-only checks each segment's .index and .timeindex against its .log instead: every offset
index entry must name the byte position where the batch with that offset starts, and every time index
entry must point at a batch and not understate the timestamps before it.

With --json, one JSON object per line: {"type": "batch", ...} (with "records" under --print-data),
{"type": "error", ...} and one {"type": "summary", ...} per file; index files give index_entry or
timeindex_entry objects, and --verify-index-only one {"file", "ok", "problems"} object per segment.

Changes nothing: the files are only read.

Exit status: 0 every batch is valid (and every index matches its log); 1 a corrupt batch or an index that
does not match, a file that does not exist, or a file that is not a segment or index (such as the
manifest or a partition's partition.state, refused before anything is printed); 2 a usage error."""


def register(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "dump",
        parents=parents.base,
        help="print the batches and records of segment files (read-only)",
        **described(_DUMP_HELP),
    )
    p.add_argument(
        "paths",
        nargs="+",
        metavar="SEGMENT_OR_PARTITION_DIR",
        help="a .log, .index or .timeindex file, or a partition directory",
    )
    p.add_argument(
        "--print-data", "--print-data-log", action="store_true", help="print every record of every batch"
    )
    p.add_argument(
        "--verify-index-only",
        action="store_true",
        help="check the .index and .timeindex files against the log",
    )
    p.add_argument(
        "--value-format",
        choices=SHOW_VALUE_FORMATS,
        default="auto",
        help="how values are shown, as in 'pylog consume' (default: auto)",
    )
    p.set_defaults(func=dump)


def dump(args: argparse.Namespace) -> int:
    out = Output(args)
    targets = [t for path in args.paths for t in _targets(path)]
    ok = True
    for path, kind in targets:
        if args.verify_index_only:
            ok &= _verify_indexes(_sibling(path, kind, files.LOG), out)
        elif kind == files.LOG:
            ok &= _dump_log(path, args, out)
        else:
            _dump_index(path, kind, out)
    return 0 if ok else 1


def _targets(path: str) -> list[tuple[str, str]]:
    """``(file, kind)`` to dump for ``path``: its segments for a partition directory, else the file itself."""
    if os.path.isdir(path):
        return _directory_targets(path)
    if not os.path.exists(path):
        raise CliError(f"{path}: no such file or directory")
    return [(path, _kind(path))]


def _directory_targets(path: str) -> list[tuple[str, str]]:
    bases = list_segments(path)
    if not bases:
        root = os.path.exists(os.path.join(path, _MANIFEST))
        hint = "a log directory" if root else "not a partition directory"
        raise NotASegmentFileError(
            f"{path}: no segment files here ({hint}; name a partition directory such as <log-dir>/topic-0)"
        )
    return [(files.segment_path(path, base, files.LOG), files.LOG) for base in bases]


_MANIFEST = "manifest"

# Files of a log directory that are not segments, by name and by their first bytes.
_NOT_SEGMENTS = {
    _MANIFEST: "the log's manifest (topics and their configs)",
    files.STATE: "a partition's shared publication state",
    files.CHECKPOINT: "a partition's recovery-point checkpoint",
    files.CLEANER_CHECKPOINT: "a partition's compaction checkpoint",
    files.CLEANER_LOCK: "a partition's compaction lock file",
    files.COMPACTED: "a partition's marker that compaction cleaned it (its offsets may skip)",
    ".lock": "the log directory's lock file",
    ".open.lock": "the log directory's open lock file",
    ".clean-shutdown": "the log directory's clean-shutdown marker",
}
_MAGICS = {
    b"pylog-manifest ": _NOT_SEGMENTS[_MANIFEST],
    b"PLPSTAT1": _NOT_SEGMENTS[files.STATE],
    b"PLRP": _NOT_SEGMENTS[files.CHECKPOINT],
    b"PLCC": _NOT_SEGMENTS[files.CLEANER_CHECKPOINT],
    b"pylog-group ": "a consumer group's state",
}


def _kind(path: str) -> str:
    """``.log``, ``.index`` or ``.timeindex`` for a segment file; NotASegmentFileError for anything else."""
    name = os.path.basename(path)
    parsed = files.parse_segment_name(name)
    if parsed is not None:
        return parsed[1]
    head = _head(path)
    what = _NOT_SEGMENTS.get(name) or next((w for m, w in _MAGICS.items() if head.startswith(m)), None)
    if what is not None:
        raise NotASegmentFileError(f"{path}: not a segment file: it is {what}")
    for suffix in (files.TIMEINDEX, files.INDEX):
        if name.endswith(suffix):
            return suffix
    if _starts_with_batch(path, head) or (name.endswith(files.LOG) and not head):
        return files.LOG
    raise NotASegmentFileError(
        f"{path}: not a segment file (its name is not <base offset>.log, .index or .timeindex and it does not "
        "start with a record batch)"
    )


def _head(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(HEADER_SIZE)


def _starts_with_batch(path: str, head: bytes) -> bool:
    if len(head) < HEADER_SIZE:
        return False
    try:
        decode_header(head, 0, os.path.getsize(path))
    except (CorruptRecordError, UnsupportedFormatError):
        return False
    return True


def _sibling(path: str, kind: str, suffix: str) -> str:
    """The file of the same segment with ``suffix`` (``.log``, ``.index``, ``.timeindex``)."""
    parsed = files.parse_segment_name(os.path.basename(path))
    if parsed is not None:
        return files.segment_path(os.path.dirname(path), parsed[0], suffix)
    return path[: -len(kind)] + suffix if path.endswith(kind) else path + suffix


def _base_offset(path: str) -> int:
    parsed = files.parse_segment_name(os.path.basename(path))
    return parsed[0] if parsed is not None else 0


@contextlib.contextmanager
def _read(path: str) -> Iterator[Buffer]:
    """The file's bytes, memory-mapped (read-only)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            yield b""
            return
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        view = memoryview(mm)
        try:
            yield view
        finally:
            view.release()
            with contextlib.suppress(BufferError):  # a slice still alive: the GC closes the map later
                mm.close()


def _walk(buf: Buffer) -> Iterator[tuple[int, BatchHeader | None, str | None]]:
    """``(position, header, problem)`` per batch; a None header (unreadable) ends the walk."""
    at = 0  # where the next header starts: the position of an unreadable one
    try:
        for pos, h in walk_headers(buf, 0, len(buf)):
            at = pos + h.batch_length
            try:
                check_crc(buf, pos, h)
                problem = None
            except CorruptRecordError as exc:
                problem = str(exc)
            yield pos, h, problem
    except (CorruptRecordError, UnsupportedFormatError) as exc:
        yield at, None, str(exc)


# -- .log -------------------------------------------------------------------------------------------------


def _dump_log(path: str, args: argparse.Namespace, out: Output) -> bool:
    if not out.json:
        out.line(f"Dumping {path}")
        out.line(f"Log starting offset: {_base_offset(path)}")
    batches = records = bad = 0
    with _read(path) as buf:
        for pos, h, problem in _walk(buf):
            if h is None:
                bad += 1
                _emit_error(out, path, pos, f"{problem}; the rest of the file cannot be read as batches")
                break
            batches += 1
            records += h.record_count
            bad += problem is not None
            data = _records(buf, pos, args.value_format, out.json) if args.print_data else None
            _emit_batch(out, path, pos, h, problem, data)
        size = len(buf)
    summary = {"file": path, "batches": batches, "records": records, "bytes": size, "corrupt": bad}
    if out.json:
        out.json_line({"type": "summary", **summary})
    else:
        out.line(f"Summary: {batches} batches, {records} records, {size} bytes, {bad} corrupt")
    return bad == 0


def _batch_dict(path: str, pos: int, h: BatchHeader, problem: str | None) -> dict[str, Any]:
    return {
        "type": "batch",
        "file": path,
        "base_offset": h.base_offset,
        "last_offset": h.last_offset,
        "count": h.record_count,
        "position": pos,
        "size": h.batch_length,
        "base_timestamp": h.base_timestamp,
        "max_timestamp": h.max_timestamp,
        "timestamp_type": "LogAppendTime" if h.timestamp_type else "CreateTime",
        "compression": h.compression,
        "crc": h.crc,
        "crc_valid": problem is None,
        "producer_id": h.producer_id,
        "producer_epoch": h.producer_epoch,
        "base_sequence": h.base_sequence,
        "transactional": bool(h.attributes & ATTR_TRANSACTIONAL),
        "control": bool(h.attributes & ATTR_CONTROL),
    }


def _emit_batch(
    out: Output,
    path: str,
    pos: int,
    h: BatchHeader,
    problem: str | None,
    data: list[dict[str, Any]] | str | None,
) -> None:
    d = _batch_dict(path, pos, h, problem)
    if out.json:
        if data is not None:
            d["records" if isinstance(data, list) else "records_error"] = data
        out.json_line(d)
        return
    out.line(
        f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.record_count} position: {pos} "
        f"size: {h.batch_length} {d['timestamp_type']}: {h.max_timestamp} baseTimestamp: {h.base_timestamp} "
        f"compression: {h.compression} crc: {h.crc} isValid: {str(problem is None).lower()} "
        f"producerId: {h.producer_id} producerEpoch: {h.producer_epoch} baseSequence: {h.base_sequence} "
        f"isTransactional: {str(d['transactional']).lower()} isControl: {str(d['control']).lower()}"
    )
    if problem is not None:
        out.line(f"| error: {problem}")
    if isinstance(data, str):
        out.line(f"| cannot decode the records: {data}")
    elif data is not None:
        for r in data:
            keys = ",".join(hd["key"] for hd in r["headers"])
            out.line(
                f"| offset: {r['offset']} {d['timestamp_type']}: {r['timestamp']} keySize: {r['key_size']} "
                f"valueSize: {r['value_size']} headerKeys: [{keys}] "
                f"key: {r['key']} payload: {r['value']}"
            )


def _emit_error(out: Output, path: str, pos: int, message: str) -> None:
    if out.json:
        out.json_line({"type": "error", "file": path, "position": pos, "error": message})
    else:
        out.line(f"Error at position {pos}: {message}")


def _records(buf: Buffer, pos: int, value_format: str, as_json: bool) -> list[dict[str, Any]] | str:
    try:
        b = decode_batch(buf, pos, verify_crc=False)
    except (CorruptRecordError, UnsupportedFormatError) as exc:
        return str(exc)
    try:
        return _record_dicts(b, value_format, as_json)
    finally:
        del b


def _record_dicts(b: DecodedBatch, value_format: str, as_json: bool) -> list[dict[str, Any]]:
    """Each record of the batch, its key, value and header values shown for JSON or for text output."""
    out = []
    keys, values, headers = b.keys(), b.values(), b.headers()
    for i, (offset, ts) in enumerate(zip(b.offsets.tolist(), b.timestamps.tolist(), strict=True)):
        key, value = keys[i], values[i]
        record = {
            "offset": offset,
            "timestamp": ts,
            "key_size": -1 if key is None else len(key),
            "value_size": -1 if value is None else len(value),
        }
        record.update(_shown("key", key, "text", as_json))
        try:
            record.update(_shown("value", value, value_format, as_json))
        except CliError as exc:  # a value not in the --value-format asked for
            raise CliError(f"offset {offset}: {exc}") from exc
        record["headers"] = [_header(k, v, as_json) for k, v in headers[i]]
        out.append(record)
    return out


def _shown(name: str, raw: bytes | None, fmt: str, as_json: bool) -> dict[str, Any]:
    if not as_json:
        return {name: show_text(raw, fmt)}
    shown, encoding = show_json(raw, fmt)
    return {name: shown, f"{name}_encoding": encoding}


def _header(key: str, raw: bytes | None, as_json: bool) -> dict[str, Any]:
    if not as_json:
        return {"key": key, "value": show_text(raw, "text")}
    shown, encoding = show_json(raw, "text")
    return {"key": key, "value": shown, "encoding": encoding}


# -- .index and .timeindex --------------------------------------------------------------------------------


def _dump_index(path: str, kind: str, out: Output) -> None:
    base = _base_offset(path)
    if not out.json:
        out.line(f"Dumping {path}")
    if kind == files.INDEX:
        entries, whole = read_entries(path, OFFSET_ENTRY)
        for rel, pos in entries.tolist():
            if out.json:
                out.json_line({"type": "index_entry", "file": path, "offset": base + rel, "position": pos})
            else:
                out.line(f"offset: {base + rel} position: {pos}")
    else:
        entries, whole = read_entries(path, TIME_ENTRY)
        for ts, rel in entries.tolist():
            if out.json:
                out.json_line(
                    {"type": "timeindex_entry", "file": path, "timestamp": ts, "offset": base + rel}
                )
            else:
                out.line(f"timestamp: {ts} offset: {base + rel}")
    if not whole:
        _emit_error(out, path, len(entries) * entries.dtype.itemsize, "partial entry at the end of the file")


def _verify_indexes(log_path: str, out: Output) -> bool:
    base = _base_offset(log_path)
    if not os.path.exists(log_path):
        raise CliError(f"{log_path}: no such file (the log segment of this index)")
    starts: dict[int, int] = {}  # position -> relative offset of the batch starting there
    rels: list[int] = []  # relative base offsets, in log order
    maxes: list[int] = []  # largest timestamp of all batches before each one
    problems = []
    running = -1
    with _read(log_path) as buf:
        for pos, h, problem in _walk(buf):
            if h is None or problem is not None:
                problems.append(f"{log_path}: position {pos}: {problem}")
            if h is None:
                break
            starts[pos] = h.base_offset - base
            rels.append(h.base_offset - base)
            maxes.append(running)
            running = max(running, h.max_timestamp)
    problems += _check_offset_index(_sibling(log_path, files.LOG, files.INDEX), base, starts)
    problems += _check_time_index(_sibling(log_path, files.LOG, files.TIMEINDEX), base, rels, maxes, running)
    if out.json:
        out.json_line({"file": log_path, "ok": not problems, "problems": problems})
    elif problems:
        for line in problems:
            out.line(line)
    else:
        out.line(f"{log_path}: indexes match the log ({len(rels)} batches)")
    return not problems


def _check_offset_index(path: str, base: int, starts: dict[int, int]) -> list[str]:
    if not os.path.exists(path):
        return [f"{path}: missing (rebuildable)"] if starts else []
    entries, whole = read_entries(path, OFFSET_ENTRY)
    problems = [] if whole else [f"{path}: size is not a multiple of {OFFSET_ENTRY.itemsize}"]
    previous = -1
    for i, (rel, pos) in enumerate(entries.tolist()):
        where = f"{path}: entry {i} (offset {base + rel}, position {pos})"
        if pos not in starts:
            problems.append(f"{where}: no batch starts at that position")
        elif starts[pos] != rel:
            problems.append(f"{where}: the batch there has base offset {base + starts[pos]}")
        if rel <= previous:
            problems.append(f"{where}: offsets are not increasing")
        previous = rel
    return problems


def _check_time_index(path: str, base: int, rels: list[int], maxes: list[int], seg_max: int) -> list[str]:
    if not os.path.exists(path):
        return [f"{path}: missing (rebuildable)"] if rels else []
    entries, whole = read_entries(path, TIME_ENTRY)
    problems = [] if whole else [f"{path}: size is not a multiple of {TIME_ENTRY.itemsize}"]
    previous = None
    for i, (ts, rel) in enumerate(entries.tolist()):
        where = f"{path}: entry {i} (timestamp {ts}, offset {base + rel})"
        k = bisect.bisect_left(rels, rel)
        if k == len(rels) or rels[k] != rel:
            problems.append(f"{where}: no batch starts at that offset")
        elif ts < maxes[k]:
            problems.append(f"{where}: earlier batches hold larger timestamps ({maxes[k]})")
        if ts > seg_max:
            problems.append(f"{where}: larger than any timestamp in the segment ({seg_max})")
        if previous is not None and ts <= previous:
            problems.append(f"{where}: timestamps are not increasing")
        previous = ts
    return problems
