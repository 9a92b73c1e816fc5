"""The producer's lock-free queue (pylog.accumulator): records appended without a lock are drained exactly once,
in each thread's order, and every future finds its own record, whichever drain took it."""

from __future__ import annotations

import gc
import random
import threading

import pytest

import pylog
from pylog import errors
from pylog.producer import FutureRecordMetadata


def _read(log: pylog.Log, topic: str) -> dict[tuple[int, int], bytes]:
    c = log.consumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None)
    out = {(r.partition, r.offset): r.value for r in c}
    c.close()
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("partitions", [1, 3])
def test_concurrent_senders_and_drainers_lose_and_duplicate_nothing(
    log: pylog.Log, seed: int, partitions: int
) -> None:
    """8 threads send while other threads flush and wait on futures at random: every record is written once,
    each future names the offset its own record landed at, and each thread's records keep their order."""
    log.create_topic("t", partitions=partitions)
    p = log.producer(value_serializer=None, max_queued_bytes=4096)
    rng = random.Random(seed)
    futures: dict[bytes, FutureRecordMetadata] = {}
    stop = threading.Event()

    def sender(thread: int) -> None:
        for i in range(1500):
            value = b"%d-%d" % (thread, i)
            key = b"k%d" % rng.randrange(20)
            futures[value] = p.send("t", value, key)
            if rng.random() < 0.01:
                futures[value].get(timeout=30)

    def drainer() -> None:
        while not stop.is_set():
            p.flush()

    senders = [threading.Thread(target=sender, args=(i,)) for i in range(8)]
    drainers = [threading.Thread(target=drainer) for _ in range(2)]
    for t in [*drainers, *senders]:
        t.start()
    for t in senders:
        t.join()
    stop.set()
    for t in drainers:
        t.join()
    p.flush()
    written = _read(log, "t")
    assert sorted(written.values()) == sorted(futures)
    for value, future in futures.items():
        meta = future.get(timeout=0)
        assert written[(meta.partition, meta.offset)] == value
    for thread in range(8):  # per thread and partition, offsets grow with the send order
        last: dict[int, int] = {}
        for i in range(1500):
            meta = futures[b"%d-%d" % (thread, i)].get(timeout=0)
            assert meta.offset > last.get(meta.partition, -1)
            last[meta.partition] = meta.offset
    p.close()


def test_a_record_appended_after_its_queue_was_taken_is_queued_again(log: pylog.Log) -> None:
    """The race the seal protocol covers: a sender read the queue, a drain took it, then the sender appended."""
    log.create_topic("t")
    p = log.producer(value_serializer=None)
    p._sender.stop()  # nothing drains but this test
    first = p.send("t", b"first", b"k")
    acc = p._acc
    q = acc.queues["t"]
    g = q.gen
    acc.drain_topic(q)  # the drain installs a new queue and seals g
    assert g.sealed and q.gen is not g
    late = (b"k", b"late")
    g.records.append(late)  # the preempted sender's append, after the drain's copy
    holder = acc.settle(q, g, late)
    assert holder is q.gen and holder is not g
    future = FutureRecordMetadata((holder, late))
    assert first.get().offset == 0
    assert future.get().offset == 1
    assert _read(log, "t") == {(0, 0): b"first", (0, 1): b"late"}
    p.close()


def test_a_record_appended_before_the_copy_stays_with_its_queue(log: pylog.Log) -> None:
    log.create_topic("t")
    p = log.producer(value_serializer=None)
    p._sender.stop()  # nothing drains but this test
    acc = p._acc
    p.send("t", b"a", b"k")
    q = acc.queues["t"]
    g = q.gen
    record = (b"k", b"b")
    g.records.append(record)  # appended in time ...
    g.take()  # ... then sealed and copied (the sender reads ``sealed`` only now)
    assert acc.settle(q, g, record) is g
    p.close()


def test_identical_records_get_their_own_offsets(log: pylog.Log) -> None:
    log.create_topic("t")
    p = log.producer(value_serializer=None)
    key, value = b"same-key", b"same-value"
    futures = [p.send("t", value, key) for _ in range(100)]
    assert [f.get().offset for f in futures] == list(range(100))
    assert len(set(futures)) == 100  # futures hash and compare by identity
    p.close()


def test_queued_records_cost_the_garbage_collector_nothing(log: pylog.Log) -> None:
    """A queued record holds only bytes and ints: the collector stops tracking it at its first pass."""
    log.create_topic("t")
    p = log.producer(value_serializer=None)
    p._sender.stop()  # nothing drains but this test
    p.send("t", b"v", b"k")
    gc.collect()
    records = p._acc.queues["t"].gen.records
    assert records and not any(gc.is_tracked(r) for r in records)
    p.close()


def test_none_values_are_never_serialized_and_serializer_results_are_checked(log: pylog.Log) -> None:
    log.create_topic("t")
    p = log.producer()
    assert p.send("t", None, key=b"k").get().serialized_value_size == -1  # a tombstone, not msgpack nil
    bad = log.producer(value_serializer=lambda v: None)
    with pytest.raises(errors.SerializationError, match="must return bytes"):
        bad.send("t", {"a": 1}, key=b"k")
    with pytest.raises(errors.SerializationError, match="must return bytes"):
        bad.send("t", {"a": 1})
    for producer in (p, bad):
        producer.close()


def test_sends_after_close_are_refused(log: pylog.Log) -> None:
    log.create_topic("t")
    p = log.producer(value_serializer=None)
    p.send("t", b"v", b"k").get()
    p.close()
    with pytest.raises(errors.LogClosedError):
        p.send("t", b"v", b"k")


def test_a_sleeping_sender_thread_is_woken_by_the_next_append(log: pylog.Log) -> None:
    log.create_topic("t")
    p = log.producer(value_serializer=None)
    acc = p._acc
    p.send("t", b"first", b"k").get()
    acc.sender_sleeps(True)  # as the sender does before it waits
    woken = threading.Event()
    acc.wake_sender = woken.set
    p.send("t", b"second", b"k")
    assert woken.is_set()
    acc.sender_sleeps(False)
    p.close()
