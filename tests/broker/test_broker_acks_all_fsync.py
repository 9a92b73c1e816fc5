"""acks=all through the broker: a Produce is answered only after an fsync that covers its records, also when
several connections write the same partition at once and share fsyncs (group commit, run after the broker's
write lock is released). ``FileSystem.fsync`` is wrapped to record, per file, the size each completed fsync
covered; every answered record must end within it at the moment the answer arrives."""

from __future__ import annotations

import os
import threading

import pytest
from kio_client import RawClient, produce, record_batch

from pylog import fs
from pylog.broker.broker import Broker
from pylog.record import decode_header

CLIENTS = 4
REQUESTS = 15


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="maps fds to files through /proc")
def test_acks_all_is_answered_after_an_fsync_covering_its_records(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker.log.create_topic("durable", partitions=1)
    plog = broker.log.topic("durable").partition(0)
    durable: dict[str, int] = {}  # real path -> bytes covered by a completed fsync
    lock = threading.Lock()
    real = fs.FS.fsync

    def fsync(fd: int) -> None:
        path = os.path.realpath(os.readlink(f"/proc/self/fd/{fd}"))
        size = os.fstat(fd).st_size  # what this fsync covers: the file as it is when it starts
        real(fd)
        with lock:
            durable[path] = max(durable.get(path, 0), size)

    monkeypatch.setattr(fs.FS, "fsync", fsync)
    failures: list[str] = []
    answered: list[int] = []

    def client(c: int) -> None:
        conn = RawClient(broker.host, broker.port)
        try:
            for r in range(REQUESTS):
                values = [f"{c}-{r}-{i}".encode() * 20 for i in range(1 + (c + r) % 3)]
                code, base = produce(conn, "durable", record_batch(values, timestamp=None))
                if code != 0:
                    failures.append(f"error {code}")
                    continue
                with lock:
                    covered = dict(durable)
                last = base + len(values) - 1
                seg = max((s for s in plog.segments if s.base_offset <= last), key=lambda s: s.base_offset)
                buf, at = plog.read_raw(last, 1)[0]
                end = at + decode_header(buf, at).batch_length  # the batch's end in the segment file
                if covered.get(os.path.realpath(seg.path), 0) < end:
                    failures.append(f"offset {last} (file bytes ..{end}) answered before an fsync covered it")
                answered.append(len(values))
        except Exception as exc:  # reported below
            failures.append(repr(exc))
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures[:5]
    assert sum(answered) == plog.log_end_offset and len(answered) == CLIENTS * REQUESTS
