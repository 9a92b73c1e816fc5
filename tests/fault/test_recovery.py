"""Opening a log after faults (pylog.partition.recovery): torn, zero-filled and junk tails at every byte of the
last batch, junk appended to logs and indexes, missing and corrupt indexes, leftover temporary files, and bit
flips below the recovery point, which must never return a wrong record and never be truncated.

A crash is simulated by closing the log, putting back the recovery checkpoint as it was before the last
unflushed appends, and removing ``.clean-shutdown``: the files are then what a killed process leaves behind
(every acknowledged append reached the operating system; the checkpoint only covers what was fsynced).
"""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

import pylog
from pylog.errors import CorruptRecordError
from pylog.partition import files
from pylog.partition.log import PartitionLog, RecoveryReport
from pylog.record import HEADER_SIZE, decode_header, encode_batch

T0 = 1_700_000_000_000
Record = tuple[bytes | None, bytes | None, int]
MARKER = ".clean-shutdown"


# -- helpers ----------------------------------------------------------------------------------------------


def snapshot(root: str) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def restore(root: str, snap: dict[str, bytes]) -> None:
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            if os.path.relpath(path, root) not in snap:
                os.unlink(path)
    for rel, data in snap.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


@dataclass
class Built:
    root: str
    model: list[Record]
    bounds: list[tuple[int, int]]  # [first, end) offsets of every batch
    positions: dict[int, tuple[str, int, int]]  # batch first offset -> (segment .log path, position, length)
    clock: pylog.ManualClock

    def part(self, name: str) -> str:
        return os.path.join(self.root, "t-0", name)

    def batch_at(self, path: str, pos: int) -> int:
        """First offset of the batch whose bytes include ``pos`` in the file ``path``."""
        for first, (p, start, length) in self.positions.items():
            if p == path and start <= pos < start + length:
                return first
        raise AssertionError((path, pos))


def append(b: Built, plog: PartitionLog, n: int, *, size: int = 30) -> None:
    start = len(b.model)
    keys: list[bytes | None] = [None if (start + i) % 6 == 0 else b"key-%d" % (start + i) for i in range(n)]
    values: list[bytes | None] = [
        (b"v%d|" % (start + i)).ljust(size + (start * 7) % 23, b"#") for i in range(n)
    ]
    stamps = [T0 + (start * 37 + i * 11) % 3000 for i in range(n)]  # not monotonic
    info = plog.append(encode_batch(0, keys, values, stamps))
    assert info.base_offset == start
    b.model.extend(zip(keys, values, stamps, strict=True))
    b.bounds.append((start, start + n))
    seg = plog.segments[-1]
    length = seg.size - seg.position_for(start)
    b.positions[start] = (seg.path, seg.size - length, length)


def build(
    root: str, *, batches: int = 40, roll_before_last: bool = False, crashed: bool = True, **config: object
) -> Built:
    """A multi-segment log, flushed, then one more batch appended without a flush; closed as by a crash
    (``crashed``) or cleanly."""
    clock = pylog.ManualClock(T0)
    b = Built(root, [], [], {}, clock)
    cfg = {"segment_bytes": 2048, "index_interval_bytes": 256, **config}
    with pylog.open(root, clock=clock) as log:
        log.create_topic("t", **cfg)
        plog = log.topic("t").partition(0)
        for i in range(batches):
            append(b, plog, 1 + i % 4)
        if roll_before_last:
            plog.roll()
        plog.flush()
        with open(b.part(files.CHECKPOINT), "rb") as f:
            durable_checkpoint = f.read()
        append(b, plog, 3)
        assert len(plog.segments) >= 3
    if crashed:
        crash(b, durable_checkpoint)
    return b


def crash(b: Built, checkpoint: bytes | None = None) -> None:
    """Turn a cleanly closed directory into what a killed process leaves behind."""
    if checkpoint is not None:
        with open(b.part(files.CHECKPOINT), "wb") as f:
            f.write(checkpoint)
    os.unlink(os.path.join(b.root, MARKER))


@pytest.fixture
def opened() -> Iterator[list[pylog.Log]]:
    logs: list[pylog.Log] = []
    yield logs
    for log in logs:
        log.close()


def reopen(b: Built) -> tuple[pylog.Log, PartitionLog]:
    log = pylog.open(b.root, clock=b.clock)
    return log, log.topic("t").partition(0)


def records(plog: PartitionLog) -> list[tuple[int, Record]]:
    out = []
    for batch in plog.batches():
        out.extend(
            zip(
                batch.offsets.tolist(),
                zip(batch.keys(), batch.values(), batch.timestamps.tolist(), strict=True),
                strict=True,
            )
        )
    return out


def assert_prefix(b: Built, plog: PartitionLog, end: int) -> None:
    """The partition holds exactly the model's records [0, end), and every lookup equals a scan."""
    assert plog.log_start_offset == 0 and plog.log_end_offset == end
    assert records(plog) == list(enumerate(b.model[:end]))
    assert_lookups_equal_scan(b, plog, end)


def assert_lookups_equal_scan(b: Built, plog: PartitionLog, end: int) -> None:
    bounds = [x for x in b.bounds if x[1] <= end]
    for first, stop in bounds:
        for offset in range(first, stop):
            got = plog.read(offset, 1)
            assert got[0].offsets[0] == first, offset
    segs = plog.segments
    for seg in segs:
        with open(seg.path, "rb") as f:
            raw = f.read()[: seg.size]
        scanned, pos = [], 0
        while pos < len(raw):
            h = decode_header(raw, pos)
            scanned.append((pos, h))
            pos += h.batch_length
        for offset in range(seg.base_offset, seg.next_offset + 1):
            assert seg.position_for(offset) == next(
                (p for p, h in scanned if h.last_offset >= offset), seg.size
            )
        for _, h in scanned:
            for ts in (h.max_timestamp, h.max_timestamp + 1):
                want = next((p for p, x in scanned if x.max_timestamp >= ts), seg.size)
                assert seg.position_for_time(ts) == want
    stamps = sorted({r[2] for r in b.model[:end]})
    for ts in [stamps[0] - 1, *stamps[::7], stamps[-1], stamps[-1] + 1]:
        want = next(((o, r[2]) for o, r in enumerate(b.model[:end]) if r[2] >= ts), None)
        assert plog.offset_for_time(ts) == want, ts


# -- torn, zero-filled and junk tails -----------------------------------------------------------------------


@pytest.mark.parametrize("roll_before_last", [False, True], ids=["mid-segment", "fresh-segment"])
def test_damaged_last_batch_at_every_byte(tmp_path: os.PathLike[str], roll_before_last: bool) -> None:
    b = build(os.path.join(os.fspath(tmp_path), "log"), roll_before_last=roll_before_last)
    first, _ = b.bounds[-1]
    path, pos, length = b.positions[first]
    assert (pos == 0) == roll_before_last
    with open(path, "rb") as f:
        pristine = f.read()
    assert len(pristine) == pos + length
    crashed = snapshot(b.root)
    rng = random.Random(7)
    tried = 0
    for k in range(length):
        junk = bytes(rng.randrange(256) for _ in range(length - k))
        for kind, tail, dropped in (
            ("torn", b"", k),
            ("zeros", b"\0" * (length - k), length),
            ("junk", junk, length),
        ):
            restore(b.root, crashed)
            with open(path, "wb") as f:
                f.write(pristine[: pos + k] + tail)
            log, plog = reopen(b)
            try:
                report = log.recovery["t-0"]
                assert not report.clean_shutdown
                assert report.bytes_truncated == dropped, (kind, k)
                assert bool(report.problems) == (dropped > 0), (kind, k, report.problems)
                assert report.segments_removed == 0
                assert plog.log_end_offset == first
                assert os.path.getsize(path) == pos
                assert records(plog) == list(enumerate(b.model[:first]))
                if k % 16 == 0:
                    assert_prefix(b, plog, first)
                    assert plog.verify() == []
            finally:
                log.close()
            tried += 1
            if k % 32 == 0:  # recovery converged: the next unclean open finds nothing to do
                os.unlink(os.path.join(b.root, MARKER))
                log, plog = reopen(b)
                try:
                    again = log.recovery["t-0"]
                    assert again.bytes_truncated == 0 and not again.problems
                    assert plog.log_end_offset == first
                finally:
                    log.close()
    print(f"damaged last batch ({length} bytes): {tried} torn/zero/junk tails recovered")
    # the undamaged crash state keeps every acknowledged record
    restore(b.root, crashed)
    log, plog = reopen(b)
    try:
        assert log.recovery["t-0"].bytes_truncated == 0
        assert_prefix(b, plog, len(b.model))
    finally:
        log.close()


@pytest.mark.parametrize("round_", range(10))
def test_junk_appended_to_log_and_indexes(tmp_path: os.PathLike[str], round_: int) -> None:
    rng = random.Random(round_)
    clean = round_ % 2 == 0
    b = build(os.path.join(os.fspath(tmp_path), "log"), crashed=not clean)
    active = max(p for p, _, _ in b.positions.values())
    log_junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 400)))
    with open(active, "ab") as f:
        f.write(log_junk)
    damaged = 0
    for name in sorted(os.listdir(os.path.join(b.root, "t-0"))):
        if name.endswith((".index", ".timeindex")) and rng.random() < 0.7:
            with open(b.part(name), "ab") as f:
                f.write(bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))))
            damaged += name.endswith(".index") or not os.path.exists(b.part(name[:-9] + "index"))
    log, plog = reopen(b)
    try:
        report = log.recovery["t-0"]
        assert report.clean_shutdown == clean
        assert report.bytes_truncated == len(log_junk)
        assert report.indexes_rebuilt >= 1
        assert_prefix(b, plog, len(b.model))
        assert plog.verify() == []
    finally:
        log.close()


# -- missing and corrupt indexes ----------------------------------------------------------------------------


def _damage_index(path: str, how: str, log_size: int) -> None:
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    item = 12 if path.endswith(".timeindex") else 8
    if how == "missing":
        os.unlink(path)
        return
    if how == "empty":
        raw = bytearray()
    elif how == "wrong_size":
        raw = raw[:-3] if len(raw) > 3 else raw + b"\x01"
    elif how == "out_of_order":
        if len(raw) >= 2 * item:
            raw[:item], raw[item : 2 * item] = raw[item : 2 * item], raw[:item]
        else:
            raw += raw[:item]
    elif how == "past_end":
        if item == 8:
            rel, _ = struct.unpack_from("<II", raw, len(raw) - 8)
            raw += struct.pack("<II", rel + 1, log_size + 100)
        else:
            ts, rel = struct.unpack_from("<qI", raw, len(raw) - 12)
            raw += struct.pack("<qI", ts + 1, 0x7FFFFFFF)
    elif how == "zeros":
        raw = bytearray(len(raw) + item)
    with open(path, "wb") as f:
        f.write(raw)


@pytest.mark.parametrize("kind", ["index", "timeindex"])
@pytest.mark.parametrize("how", ["missing", "empty", "wrong_size", "out_of_order", "past_end", "zeros"])
@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
def test_damaged_indexes_are_rebuilt(tmp_path: os.PathLike[str], kind: str, how: str, clean: bool) -> None:
    b = build(os.path.join(os.fspath(tmp_path), "log"), batches=60, crashed=not clean)
    logs = sorted({p for p, _, _ in b.positions.values()})
    victims = logs[::2]  # every other segment, the active one included when the count is odd
    for log_path in victims:
        _damage_index(log_path[:-3] + kind, how, os.path.getsize(log_path))
    log, plog = reopen(b)
    try:
        report = log.recovery["t-0"]
        rebuilt = set(victims) if clean else set(victims) | {logs[-1]}
        if kind == "timeindex" and how == "out_of_order":  # a single-entry time index cannot be out of order
            assert report.indexes_rebuilt >= 1
        else:
            assert report.indexes_rebuilt == len(rebuilt), report
        assert report.bytes_truncated == 0
        assert_prefix(b, plog, len(b.model))
        assert plog.verify() == []
    finally:
        log.close()


# -- leftovers of interrupted operations --------------------------------------------------------------------


def test_temporary_orphan_and_swap_files_are_finished_on_open(tmp_path: os.PathLike[str]) -> None:
    b = build(os.path.join(os.fspath(tmp_path), "log"))
    logs = sorted({p for p, _, _ in b.positions.values()})
    base = int(os.path.basename(logs[1])[:20])
    junk = {
        "00000000000000099999.index": b"\0" * 8,  # orphan index: no .log beside it
        "00000000000000099999.timeindex": b"",
        f"{base:020d}.log.cleaned": b"partial copy",
        f"{base:020d}.log.deleted": b"old",
        f"{base:020d}.index.tmp": b"x",
        "manifest.tmp": b"half",
    }
    for name, data in junk.items():
        with open(b.part(name), "wb") as f:
            f.write(data)
    # a finished rewrite of segment 1 that crashed before its final rename
    with open(logs[1], "rb") as f:
        content = f.read()
    os.rename(logs[1], logs[1] + ".swap")
    log, plog = reopen(b)
    try:
        report = log.recovery["t-0"]
        assert report.temp_files_removed == len(junk)
        assert report.swaps_completed == 1
        left = sorted(os.listdir(b.part("")))
        assert not [n for n in left if n.endswith((".tmp", ".cleaned", ".deleted", ".swap")) or "99999" in n]
        with open(logs[1], "rb") as f:
            assert f.read() == content
        assert_prefix(b, plog, len(b.model))
    finally:
        log.close()


def test_missing_segment_in_the_middle_is_a_clear_error(tmp_path: os.PathLike[str]) -> None:
    b = build(os.path.join(os.fspath(tmp_path), "log"))
    logs = sorted({p for p, _, _ in b.positions.values()})
    os.unlink(logs[1])
    before = snapshot(b.root)
    with pytest.raises(CorruptRecordError, match="not contiguous") as info:
        pylog.open(b.root, clock=b.clock)
    assert info.value.path == logs[2]
    after = snapshot(b.root)
    assert {k: v for k, v in after.items() if k.endswith(".log")} == {
        k: v for k, v in before.items() if k.endswith(".log")
    }


# -- corruption below the recovery point ----------------------------------------------------------------------


def test_corrupt_batch_below_the_recovery_point_is_never_truncated(tmp_path: os.PathLike[str]) -> None:
    b = build(os.path.join(os.fspath(tmp_path), "log"))
    first, _ = b.bounds[-2]  # flushed, in the active segment: revalidated after an unclean shutdown
    path, pos, _ = b.positions[first]
    with open(path, "r+b") as f:
        f.seek(pos + HEADER_SIZE + 2)
        byte = f.read(1)
        f.seek(pos + HEADER_SIZE + 2)
        f.write(bytes([byte[0] ^ 0x40]))
    before = snapshot(b.root)
    for _ in range(2):  # the same error every time: nothing was dropped
        with pytest.raises(CorruptRecordError, match="below the recovery point") as info:
            pylog.open(b.root, clock=b.clock)
        assert info.value.path == path and info.value.position == pos
        assert path in str(info.value) and f"position {pos}" in str(info.value)
        after = snapshot(b.root)
        assert {k: v for k, v in after.items() if k.endswith(".log")} == {
            k: v for k, v in before.items() if k.endswith(".log")
        }
    actions = pylog.repair(b.root)
    assert f"offsets >= {first}" in actions["t-0"][0]
    log, plog = reopen(b)
    try:
        assert_prefix(b, plog, first)
    finally:
        log.close()


def test_random_bit_flips_below_the_recovery_point_are_always_detected(tmp_path: os.PathLike[str]) -> None:
    b = build(os.path.join(os.fspath(tmp_path), "log"), batches=50, crashed=False)
    with pylog.open(b.root, clock=b.clock) as log:  # closed cleanly: everything is durable
        plog = log.topic("t").partition(0)
        assert plog.recovery_point == plog.log_end_offset == len(b.model)
    pristine = snapshot(b.root)
    logs = sorted({p for p, _, _ in b.positions.values()})
    sizes = [os.path.getsize(p) for p in logs]
    rng = random.Random(2024)
    tried = at_open = on_read = 0
    for trial in range(100):
        restore(b.root, pristine)
        path = rng.choices(logs, weights=sizes)[0]
        pos = rng.randrange(os.path.getsize(path))
        bit = rng.randrange(8)
        with open(path, "r+b") as f:
            f.seek(pos)
            byte = f.read(1)
            f.seek(pos)
            f.write(bytes([byte[0] ^ (1 << bit)]))
        if trial % 2:
            os.unlink(os.path.join(b.root, MARKER))
        damaged = b.batch_at(path, pos)
        flipped = snapshot(b.root)
        tried += 1
        log = None
        try:
            log = pylog.open(b.root, clock=b.clock)
            plog = log.topic("t").partition(0)  # validated when first used (at open after an unclean stop)
        except CorruptRecordError as exc:
            if log is not None:
                log.close()
            at_open += 1
            assert exc.path is not None
            after = snapshot(b.root)
            assert {k: v for k, v in after.items() if k.endswith(".log")} == {
                k: v for k, v in flipped.items() if k.endswith(".log")
            }, "durable data was changed"
            continue
        try:
            assert plog.log_start_offset == 0 and plog.log_end_offset == len(b.model)
            assert log.recovery["t-0"].bytes_truncated == 0
            detected = False
            for first, stop in b.bounds:
                try:
                    got = plog.read(first, 1)
                except CorruptRecordError:
                    if first == damaged:
                        detected = True
                        continue
                    # batches after the damaged one in its segment may be unreachable (a damaged length)
                    assert b.positions[first][0] == path and first > damaged, (trial, first, damaged)
                    continue
                assert first != damaged, (
                    f"trial {trial}: flip at {path}:{pos} bit {bit} (batch at {b.positions[first][1]}) not detected"
                )
                batch = got[0]
                assert batch.offsets.tolist() == list(range(first, stop))
                assert (
                    list(zip(batch.keys(), batch.values(), batch.timestamps.tolist(), strict=True))
                    == (b.model[first:stop])
                )
            assert detected
            on_read += 1
        finally:
            log.close()
    print(
        f"bit flips below the recovery point: {tried} tried, {at_open} detected at open or first use, {on_read} on read"
    )
    assert at_open + on_read == tried == 100


# -- recovery time follows the unflushed tail ----------------------------------------------------------------


def reopen_from_the_point(b: Built, end: int, *, validated_below: int) -> RecoveryReport:
    """Reopen after the crash: recovery validated fewer than ``validated_below`` batches, the partition holds
    the model's records [0, end) and ``verify()`` is clean. Returns the recovery report."""
    log, plog = reopen(b)
    try:
        report = log.recovery["t-0"]
        assert report.batches_validated < validated_below
        assert_prefix(b, plog, end)
        assert plog.verify() == []
        return report
    finally:
        log.close()


@pytest.mark.parametrize("tail", [0, 1, 5])
def test_recovery_validates_only_from_the_recovery_point(tmp_path: os.PathLike[str], tail: int) -> None:
    """A large active segment whose head was fsynced: an unclean open validates only the batches from the
    last indexed batch at or below the recovery point, and ends with the same records and indexes as a
    validation of the whole segment."""
    root = os.path.join(os.fspath(tmp_path), "log")
    clock = pylog.ManualClock(T0)
    b = Built(root, [], [], {}, clock)
    with pylog.open(root, clock=clock) as log:
        log.create_topic("t", segment_bytes=1 << 20, index_interval_bytes=512)
        plog = log.topic("t").partition(0)
        for i in range(200):
            append(b, plog, 1 + i % 4)
        plog.flush()
        with open(b.part(files.CHECKPOINT), "rb") as f:
            durable_checkpoint = f.read()
        for _ in range(tail):
            append(b, plog, 3)
        written = (plog.segments[-1].offset_index.entries.copy(), plog.segments[-1].time_index.entries.copy())
        assert len(plog.segments) == 1
    crash(b, durable_checkpoint)
    log, plog = reopen(b)
    try:
        report = log.recovery["t-0"]
        assert not report.clean_shutdown and report.segments_validated == 1
        # batches of ~100 bytes and an index entry every 512: a handful before the tail, never all 200
        assert tail <= report.batches_validated <= tail + 8
        assert_prefix(b, plog, len(b.model))
        seg = plog.segments[-1]
        assert seg.offset_index.entries.tobytes() == written[0].tobytes()
        assert seg.time_index.entries.tobytes() == written[1].tobytes()
        assert plog.verify() == []
    finally:
        log.close()


def test_recovery_from_the_point_still_truncates_a_torn_tail(tmp_path: os.PathLike[str]) -> None:
    b = build(os.path.join(os.fspath(tmp_path), "log"), batches=200, segment_bytes=8192)
    path, pos, length = b.positions[b.bounds[-1][0]]
    with open(path, "r+b") as f:
        f.truncate(pos + length // 2)
    report = reopen_from_the_point(b, b.bounds[-1][0], validated_below=10)
    assert report.bytes_truncated == length // 2


def test_recovery_from_the_point_ignores_index_entries_that_never_reached_the_disk(
    tmp_path: os.PathLike[str],
) -> None:
    """Index entries past the recovery point may be zeros or junk after a power loss: recovery starts from
    the well-formed entries at or below the point and rebuilds the rest."""
    b = build(os.path.join(os.fspath(tmp_path), "log"), batches=200, segment_bytes=8192)
    active = max(p for p, _, _ in b.positions.values())[: -len(".log")]
    for name, junk in (("index", bytes(8 * 3)), ("timeindex", b"\xff" * 12 * 2)):
        path = f"{active}.{name}"
        with open(path, "ab") as f:
            f.write(junk)
    reopen_from_the_point(b, len(b.model), validated_below=10)


def test_recovery_from_the_point_ignores_the_final_time_entry_of_a_roll_killed_after_sealing(
    tmp_path: os.PathLike[str],
) -> None:
    """A roll writes the old segment's final time entry (its largest timestamp) before the new segment exists;
    a kill in between leaves that entry in the active segment's time index, where it does not belong."""
    root = os.path.join(os.fspath(tmp_path), "log")
    clock = pylog.ManualClock(T0)
    b = Built(root, [], [], {}, clock)
    with pylog.open(root, clock=clock) as log:
        log.create_topic("t", segment_bytes=1 << 20, index_interval_bytes=512)
        plog = log.topic("t").partition(0)
        for _ in range(60):
            append(b, plog, 2)
        start = len(b.model)
        late = [(b"late", b"x", T0 + 60_000)]  # the largest timestamp, after the last index entry
        plog.append(encode_batch(0, [late[0][0]], [late[0][1]], [late[0][2]]))
        b.model.extend(late)
        b.bounds.append((start, start + 1))
        plog.flush()
        seg = plog.segments[-1]
        seg.seal()  # what _roll does first; the process dies before creating the next segment
        assert seg.time_index.last() == (T0 + 60_000, int(seg.offset_index.last()[0]))
        with open(b.part(files.CHECKPOINT), "rb") as f:
            durable_checkpoint = f.read()
    crash(b, durable_checkpoint)
    reopen_from_the_point(b, len(b.model), validated_below=60)
