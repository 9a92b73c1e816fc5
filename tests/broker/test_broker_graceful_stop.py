"""A broker that stops answers every request it is handling before it closes any connection.

librdkafka closes its coordinator connection as soon as another of its connections to the broker closes,
dropping an OffsetCommit in flight there; its retry to the restarted broker is then refused with
UNKNOWN_MEMBER_ID although the commit was written. So a connection waiting for its next request stays open
until the requests being handled on the other connections are answered.
"""

from __future__ import annotations

import select
import threading
from pathlib import Path

import pytest
from kafka_support import WAIT_S
from kio_client import RawClient, produce, record_batch

import pylog
from pylog import fs


def test_no_connection_closes_before_every_request_being_handled_is_answered(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = threading.Event(), threading.Event()
    real = fs.FS.fsync

    def fsync(fd: int) -> None:  # the acks=all Produce's fsync waits until the test lets it go
        if threading.current_thread().name != "MainThread" and not release.is_set():
            entered.set()
            release.wait(WAIT_S)
        real(fd)

    events: list[str] = []
    closed = threading.Event()  # the Produce's answer is read only once the idle connection closed
    with pylog.serve(log_dir) as broker:
        broker.log.create_topic("held", partitions=1)
        idle = RawClient(broker.host, broker.port)
        busy = RawClient(broker.host, broker.port)
        read = busy._read
        monkeypatch.setattr(busy, "_read", lambda n: closed.wait(WAIT_S) and read(n))
        monkeypatch.setattr(fs.FS, "fsync", fsync)

        def write() -> None:
            code, _ = produce(busy, "held", record_batch([b"v"]))
            events.append(f"produce answered: {code}")

        def wait_for_close() -> None:
            idle.sock.settimeout(WAIT_S)
            eof = idle.sock.recv(1) == b""
            # on loopback an answer sent before the close is in the socket's buffer when the close is seen
            answered = bool(select.select([busy.sock], [], [], 0)[0])
            events.append(f"idle connection closed: {eof}, the Produce answered by then: {answered}")
            closed.set()

        writer = threading.Thread(target=write)
        writer.start()
        assert entered.wait(WAIT_S), "the Produce never reached its fsync"
        watcher = threading.Thread(target=wait_for_close)
        watcher.start()
        closer = threading.Thread(target=broker.close)
        closer.start()
        watcher.join(2.0)  # the idle connection is not closed while the Produce is held
        release.set()
        for t in (writer, watcher, closer):
            t.join(WAIT_S)
        idle.close()
        busy.close()
    assert events == [
        "idle connection closed: True, the Produce answered by then: True",
        "produce answered: 0",
    ]
