"""Several processes on one partition: two writers append concurrently while a third process reads.

Every record carries its writer id and a per-writer sequence number, and its bytes are derived from them, so the
final log and everything the reader saw can be checked for lost, duplicated, reordered, torn or interleaved
records (Jepsen's list: lost write, duplicate, inconsistent offsets, poll skip, non-monotonic poll). One run
kills a writer with SIGKILL in the middle of its appends: everything it had acknowledged must still be there.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time

import pylog
from pylog.partition.log import PartitionLog
from pylog.record import encode_batch

COMMON = textwrap.dedent(
    """
    import hashlib, json, os, struct, sys, time
    import pylog
    from pylog.record import encode_batch

    def value(wid, seq):
        return struct.pack("<II", wid, seq) + hashlib.sha256(b"%d:%d" % (wid, seq)).digest()[: seq % 33]

    def wait_for(path):
        while not os.path.exists(path):
            time.sleep(0.001)

    def _ctl(root, name):
        os.makedirs(root + "-ctl", exist_ok=True)
        return os.path.join(root + "-ctl", name)
    """
)

WRITER = COMMON + textwrap.dedent(
    """
    root, wid, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    acks = os.open(_ctl(root, "acks-%d" % wid), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    with pylog.open(root) as log:
        plog = log.topic("t").partition(0)
        open(_ctl(root, "ready-%d" % wid), "w").close()
        wait_for(_ctl(root, "go"))
        seq = 0
        while seq < n:
            k = min(n - seq, 1 + (seq * 7 + wid) % 5)
            now = [int(time.time() * 1000)] * k
            info = plog.append(encode_batch(0, [b"w%d" % wid] * k, [value(wid, s) for s in range(seq, seq + k)], now))
            os.write(acks, b"%d %d %d\\n" % (seq, info.base_offset, k))  # acknowledged: the append returned
            seq += k
    """
)

READER = COMMON + textwrap.dedent(
    """
    root = sys.argv[1]
    seen = []
    with pylog.open(root) as log:
        plog = log.topic("t").partition(0)
        open(_ctl(root, "ready-reader"), "w").close()
        offset, polls = 0, 0
        while True:
            stop = os.path.exists(_ctl(root, "stop"))
            batches = plog.read(offset, 8192)  # decodes and CRC-checks every batch
            polls += 1
            for b in batches:
                for o, k, v in zip(b.offsets.tolist(), b.keys(), b.values()):
                    if o < offset:
                        continue  # the first batch may start before the requested offset
                    assert o == offset, ("poll skipped or went back", o, offset)
                    seen.append((o, k.decode(), v.hex()))
                    offset += 1
            if not batches:
                if stop and offset == plog.log_end_offset:
                    break
                time.sleep(0.0005)
    print(json.dumps({"seen": seen, "polls": polls}))
    """
)


def _ctl(root: str, name: str) -> str:
    """A coordination file of the test, beside the log directory (not in it: pylog warns about entries of a
    log directory that it did not create)."""
    directory = root + "-ctl"
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, name)


def value(wid: int, seq: int) -> bytes:
    return struct.pack("<II", wid, seq) + hashlib.sha256(b"%d:%d" % (wid, seq)).digest()[: seq % 33]


def spawn(code: str, *args: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def wait_for(path: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read().decode() if proc.stderr else "child exited")
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.005)


def finish(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> bytes:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err.decode()
    return out


def read_acks(root: str, wid: int) -> list[tuple[int, int, int]]:
    with open(_ctl(root, f"acks-{wid}"), "rb") as f:
        lines = f.read().splitlines()
    return [tuple(map(int, line.split())) for line in lines]  # type: ignore[misc]


def final_records(plog: PartitionLog) -> list[tuple[int, str, bytes]]:
    out: list[tuple[int, str, bytes]] = []
    for b in plog.batches():
        for o, k, v in zip(b.offsets.tolist(), b.keys(), b.values(), strict=True):
            assert k is not None and v is not None
            out.append((o, k.decode(), v))
    return out


def check_log(root: str, writers: dict[int, int | None]) -> list[tuple[int, str, bytes]]:
    """Check the final log; ``writers`` maps writer id to the records it must have written (None: killed,
    any prefix of its sequence that covers its acknowledgements)."""
    with pylog.open(root) as log:
        plog = log.topic("t").partition(0)  # validated at open, or at first use after a clean shutdown
        assert log.recovery["t-0"].bytes_truncated == 0 or writers_killed(writers)
        assert plog.verify() == []
        records = final_records(plog)
    assert [o for o, _, _ in records] == list(range(len(records)))  # dense from 0, each offset once
    per: dict[int, list[int]] = {wid: [] for wid in writers}
    where: dict[tuple[int, int], int] = {}
    for offset, key, v in records:
        wid = int(key[1:])
        seq = struct.unpack_from("<II", v)[1]
        assert struct.unpack_from("<I", v)[0] == wid, (offset, key)  # key and value of one record
        assert v == value(wid, seq), f"record at {offset} is not what writer {wid} sent as {seq}"
        per[wid].append(seq)
        where[(wid, seq)] = offset
    for wid, expected in writers.items():
        seqs = per[wid]
        assert seqs == list(range(len(seqs))), f"writer {wid}: lost, duplicated or reordered records"
        if expected is not None:
            assert len(seqs) == expected
        for seq, base, k in read_acks(root, wid):  # acknowledged offsets are where the records are
            for i in range(k):
                assert where.get((wid, seq + i)) == base + i, (wid, seq + i)
    return records


def writers_killed(writers: dict[int, int | None]) -> bool:
    return any(v is None for v in writers.values())


def make_log(root: str) -> None:
    with pylog.open(root) as log:
        log.create_topic("t", segment_bytes=16 << 10, index_interval_bytes=512)


def test_two_writers_and_a_reader_on_one_partition(tmp_path: os.PathLike[str]) -> None:
    root = os.path.join(os.fspath(tmp_path), "log")
    make_log(root)
    n = 3000
    started = time.monotonic()
    reader = spawn(READER, root)
    writers = {wid: spawn(WRITER, root, wid, n) for wid in (0, 1)}
    for wid, proc in writers.items():
        wait_for(_ctl(root, f"ready-{wid}"), proc)
    wait_for(_ctl(root, "ready-reader"), reader)
    open(_ctl(root, "go"), "w").close()
    for proc in writers.values():
        finish(proc)
    open(_ctl(root, "stop"), "w").close()
    seen = json.loads(finish(reader))
    records = check_log(root, {0: n, 1: n})
    assert len(records) == 2 * n
    switches = sum(1 for a, b in itertools.pairwise(records) if a[1] != b[1])
    assert switches >= 2, "the writers never interleaved"
    by_offset = {o: (k, v) for o, k, v in records}
    assert [o for o, _, _ in seen["seen"]] == list(range(2 * n))  # no skip, no going back
    for o, k, v in seen["seen"]:
        assert by_offset[o] == (k, bytes.fromhex(v)), f"reader saw another record at {o}"
    with pylog.open(root) as log:
        segments = log.topic("t").partition(0).segments
    print(
        f"multi-process: 2 writers x {n} records, {switches} writer switches, {len(segments)} segments, "
        f"reader {seen['polls']} polls, {time.monotonic() - started:.1f} s"
    )


def test_a_writer_killed_mid_append_loses_nothing_it_acknowledged(tmp_path: os.PathLike[str]) -> None:
    root = os.path.join(os.fspath(tmp_path), "log")
    make_log(root)
    reader = spawn(READER, root)
    victim = spawn(WRITER, root, 0, 10**7)
    survivor = spawn(WRITER, root, 1, 4000)
    for wid, proc in ((0, victim), (1, survivor)):
        wait_for(_ctl(root, f"ready-{wid}"), proc)
    wait_for(_ctl(root, "ready-reader"), reader)
    open(_ctl(root, "go"), "w").close()
    deadline = time.monotonic() + 20
    while len(read_acks(root, 0)) < 300:  # let it get going, then kill it between two arbitrary syscalls
        assert time.monotonic() < deadline and victim.poll() is None
        time.sleep(0.002)
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    assert victim.returncode == -signal.SIGKILL
    finish(survivor)
    open(_ctl(root, "stop"), "w").close()
    seen = json.loads(finish(reader))
    acked = sum(k for _, _, k in read_acks(root, 0))
    records = check_log(root, {0: None, 1: 4000})
    killed = sum(1 for _, k, _ in records if k == "w0")
    assert killed >= acked > 0
    by_offset = {o: (k, v) for o, k, v in records}
    for o, k, v in seen["seen"]:
        assert by_offset[o] == (k, bytes.fromhex(v)), f"reader saw another record at {o}"
    print(f"killed writer: {acked} records acknowledged, {killed} present after the kill")


ROLLER = textwrap.dedent(
    """
    import os, signal, sys, time
    import pylog
    from pylog import fs
    from pylog.record import encode_batch

    root, kill_at = sys.argv[1], int(sys.argv[2])

    class Killer(fs.FileSystem):
        armed = False
        calls = 0

    def wrap(name):
        base = getattr(fs.FileSystem, name)

        def method(self, *args, **kwargs):
            if self.armed:
                self.calls += 1
                if self.calls == kill_at:  # die before this file-system call
                    os.kill(os.getpid(), signal.SIGKILL)
            return base(self, *args, **kwargs)

        return method

    for name in ("open", "close", "pwrite", "pread", "fsync", "fdatasync", "ftruncate", "size", "rename",
                 "unlink", "mkdir", "rmdir", "fsync_dir", "listdir", "read_file"):
        setattr(Killer, name, wrap(name))

    layer = Killer()
    with fs.install(layer):
        log = pylog.open(root)
        plog = log.topic("t").partition(0)
        now = int(time.time() * 1000)
        big = encode_batch(0, [b"big"] * 10, [b"B" * 150] * 10, [now] * 10)
        i = 0
        while plog.segments[-1].size + len(big) <= plog.config.segment_bytes:
            plog.append(encode_batch(0, [b"c"], [b"c%d" % i], [now]))
            i += 1
        print(i, flush=True)  # small batches, all acknowledged
        layer.armed = True
        plog.append(big)  # rolls
        layer.armed = False
        print(layer.calls, flush=True)
        log.close()
    """
)


def _records(plog: PartitionLog) -> list[tuple[int, bytes, bytes]]:
    out = []
    for b in plog.batches():
        for o, k, v in zip(b.offsets.tolist(), b.keys(), b.values(), strict=True):
            assert k is not None and v is not None
            out.append((o, k, v))
    return out


def test_a_writer_killed_at_every_step_of_a_roll(tmp_path: os.PathLike[str]) -> None:
    """Another process keeps the partition open, appends, rolls and reads after the death."""

    def fresh(name: str) -> str:
        root = os.path.join(os.fspath(tmp_path), name)
        with pylog.open(root) as log:
            log.create_topic("t", segment_bytes=4096, index_interval_bytes=512)
        return root

    dry = spawn(ROLLER, fresh("dry"), 0)
    small, calls = map(int, finish(dry).split())
    assert small > 5 and calls > 5
    outcomes: dict[str, int] = {}
    for kill_at in range(1, calls + 1):
        root = fresh(f"k{kill_at}")
        with pylog.open(root) as survivor, pylog.open(root) as reader:
            child = spawn(ROLLER, root, kill_at)
            out, err = child.communicate(timeout=60)
            assert child.returncode == -signal.SIGKILL, err.decode()
            assert int(out.split()[0]) == small
            plog = survivor.topic("t").partition(0)
            for i in range(3):  # these fit beside the small batches in the segment the child filled
                plog.append(encode_batch(0, [b"p"], [b"p%d" % i], [int(time.time() * 1000)]))
            plog.roll()
            for i in range(3, 5):
                plog.append(encode_batch(0, [b"p"], [b"p%d" % i], [int(time.time() * 1000)]))
            seen = _records(reader.topic("t").partition(0))
            assert seen == _records(plog)
        with pylog.open(root) as log:
            plog = log.topic("t").partition(0)
            final = _records(plog)
            assert plog.verify() == []
        assert final == seen
        assert [o for o, _, _ in final] == list(range(len(final)))
        keys = [k for _, k, _ in final]
        assert [v for _, k, v in final if k == b"c"] == [b"c%d" % i for i in range(small)]
        assert [v for _, k, v in final if k == b"p"] == [b"p%d" % i for i in range(5)]
        landed = keys.count(b"big")
        assert landed in (0, 10)
        assert keys == [b"c"] * small + [b"big"] * landed + [b"p"] * 5
        outcome = "batch kept" if landed else "batch lost"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    print(f"writer killed before each of the {calls} file-system calls of a rolling append: {outcomes}")
