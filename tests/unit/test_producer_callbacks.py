"""Producer callbacks when two threads run them at once (a flush() in each thread, or a flush() beside the
producer's sender thread): each callback runs exactly once and neither flush() fails."""

from __future__ import annotations

import threading

import pylog


def test_two_threads_flushing_one_producer_run_each_callback_once(log_dir: str) -> None:
    log = pylog.open(log_dir)
    log.create_topic("t")
    # The sender thread waits linger_ms before it drains or runs callbacks: only the two flushes run them.
    p = log.producer(value_serializer=None, linger_ms=1_000)
    futures = [p.send("t", b"%d" % i) for i in range(2)]
    ran: list[tuple[int, str]] = []
    other: list[threading.Thread] = []
    errors: list[BaseException] = []

    def flush_in_another_thread() -> None:
        try:
            p.flush()
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    def first(md: pylog.RecordMetadata) -> None:
        ran.append((md.offset, threading.current_thread().name))
        # While this flush() is between callbacks, another thread flushes the same producer (as the sender
        # thread may): it must neither run this flush's callbacks twice nor break it.
        thread = threading.Thread(target=flush_in_another_thread, name="other")
        other.append(thread)
        thread.start()
        thread.join(timeout=5)

    def second(md: pylog.RecordMetadata) -> None:
        ran.append((md.offset, threading.current_thread().name))

    futures[0].add_callback(first)
    futures[1].add_callback(second)
    try:
        p.flush()
    finally:
        for thread in other:
            thread.join(timeout=5)
        log.close()
    assert not errors
    assert sorted(offset for offset, _ in ran) == [0, 1]  # each callback exactly once
