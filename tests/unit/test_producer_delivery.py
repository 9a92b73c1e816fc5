"""A record accepted by ``send()`` is written, or its failure reaches the user: through its future, or as a
DeliveryError from the next flush()/close(); never only as a log line. Records that fit max_message_bytes on
their own never fail for being batched together."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest

import pylog
from pylog import errors, fs
from pylog.record import HEADER_SIZE, decode_header

# -- records are written at exit and at Log.close --------------------------------------------------------

_SCRIPT = textwrap.dedent(
    """
    import sys
    import pylog
    log = pylog.open(sys.argv[1])
    log.create_topic("t", partitions=3)
    p = log.producer()
    for i in range(int(sys.argv[2])):
        p.send("t", {"i": i})
    # the script ends: no flush, no close
    """
)


def _values(root: str, topic: str = "t") -> list[Any]:
    with pylog.open(root) as log:
        c = log.consumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=0)
        return sorted(r.value["i"] for r in c)


def test_records_sent_by_a_script_that_ends_without_flush_are_written(tmp_path: Any) -> None:
    root = os.path.join(str(tmp_path), "log")
    done = subprocess.run([sys.executable, "-c", _SCRIPT, root, "30000"], capture_output=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    assert _values(root) == list(range(30000))
    assert os.path.exists(os.path.join(root, ".clean-shutdown"))  # the exit closed the log cleanly


def test_leaving_the_log_with_a_producer_open_writes_its_records(tmp_path: Any) -> None:
    root = os.path.join(str(tmp_path), "log")
    with pylog.open(root) as log:
        log.create_topic("t")
        p = log.producer(linger_ms=60_000)  # nothing is drained by the sender thread before close
        for i in range(1000):
            p.send("t", {"i": i})
    assert _values(root) == list(range(1000))
    with pytest.raises(errors.LogClosedError):
        p.send("t", {"i": -1})


def test_closing_a_producer_with_a_long_linger_stops_its_sender_thread(log: pylog.Log) -> None:
    log.create_topic("t")
    p = log.producer(linger_ms=600_000)  # the sender thread waits this long before each drain
    futures = [p.send("t", {"i": i}) for i in range(10)]
    sender = p._sender._thread
    p.close()  # writes the records itself; the sender's wait must not hold close() or outlive it
    sender.join(timeout=30)
    assert not sender.is_alive()
    assert [f.get(timeout=0).offset for f in futures] == list(range(10))


def _hold_the_queue(p: Any) -> tuple[threading.Event, threading.Thread]:
    """A thread that holds ``p``'s drain lock (as a write stuck on a hung disk would) until released."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with p._acc.drain_lock:
            held.set()
            release.wait()

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert held.wait(30)
    return release, t


def test_log_close_with_a_timeout_is_bounded_by_a_write_stuck_in_another_thread(tmp_path: Any) -> None:
    log = pylog.open(str(tmp_path / "log"))
    log.create_topic("t")
    p = log.producer(linger_ms=600_000)
    p.send("t", {"i": 0})
    release, holder = _hold_the_queue(p)
    try:
        with pytest.raises(errors.KafkaTimeoutError):
            log.close(timeout=0.2)  # without the bound this waits for the holder, which waits for us
        assert log.closed
    finally:
        release.set()
        holder.join(30)


_STUCK_AT_EXIT = textwrap.dedent(
    """
    import sys, threading
    import pylog, pylog.directory
    pylog.directory.EXIT_FLUSH_TIMEOUT_S = 0.5
    log = pylog.open(sys.argv[1])
    log.create_topic("t")
    p = log.producer(linger_ms=600_000)
    p.send("t", {"i": 0})
    held = threading.Event()
    def hold():
        with p._acc.drain_lock:
            held.set()
            threading.Event().wait()  # a write that never ends
    threading.Thread(target=hold, daemon=True).start()
    held.wait()
    # the script ends with the producer's queue held
    """
)


def test_interpreter_exit_waits_a_bounded_time_and_says_what_was_not_written(tmp_path: Any) -> None:
    root = os.path.join(str(tmp_path), "log")
    done = subprocess.run(
        [sys.executable, "-c", _STUCK_AT_EXIT, root], capture_output=True, check=False, timeout=120
    )
    assert b"at exit failed: KafkaTimeoutError" in done.stderr, done.stderr


# -- failures reach the user ------------------------------------------------------------------------------


class FailingWrites(fs.FileSystem):
    """Fails every write to segment files with EIO."""

    def pwrite(self, fd: int, data: Any, offset: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".log") and len(data) > 8:
            raise errors.StorageError(5, "injected EIO")
        super().pwrite(fd, data, offset)


def _failing_producer(log: pylog.Log, n: int) -> tuple[Any, list[Any]]:
    log.create_topic("t")
    p = log.producer(linger_ms=60_000)
    futures = [p.send("t", {"i": i}) for i in range(n)]
    return p, futures


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_unseen_failures_are_raised_by_flush_with_their_count(log: pylog.Log) -> None:
    p, futures = _failing_producer(log, 50)
    with fs.install(FailingWrites()), pytest.raises(errors.DeliveryError) as info:
        p.flush()
    assert info.value.count == 50 and "50 records" in str(info.value)
    assert isinstance(info.value.__cause__, errors.StorageError)
    assert all(f.failed() for f in futures)
    p.flush()  # reported once
    p.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_failures_seen_through_futures_or_errbacks_are_not_raised_again(log: pylog.Log) -> None:
    p, futures = _failing_producer(log, 10)
    seen: list[BaseException] = []
    futures[0].add_errback(seen.append)
    with fs.install(FailingWrites()):
        with pytest.raises(errors.StorageError):
            futures[1].get()
        assert futures[2].exception is not None
        with pytest.raises(errors.DeliveryError) as info:
            p.flush()
    assert info.value.count == 7  # 10 records, 3 of which were seen
    assert len(seen) == 1 and isinstance(seen[0], errors.StorageError)
    p.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_log_close_raises_the_failures_of_its_producers_after_closing(tmp_path: Any) -> None:
    log = pylog.open(os.path.join(str(tmp_path), "log"))
    _failing_producer(log, 5)
    with fs.install(FailingWrites()), pytest.raises(errors.DeliveryError) as info:
        log.close()
    assert info.value.count == 5
    assert log.closed


def test_a_producer_closed_after_its_log_fails_its_queued_records_loudly(tmp_path: Any) -> None:
    log = pylog.open(os.path.join(str(tmp_path), "log"))
    log.create_topic("t")
    p = pylog.Producer(log, linger_ms=60_000)  # not created by log.producer(): the log cannot close it
    futures = [p.send("t", {"i": i}) for i in range(7)]
    log.close()
    with pytest.raises(errors.DeliveryError) as info:
        p.close()
    assert info.value.count == 7 and isinstance(info.value.__cause__, errors.LogClosedError)
    assert all(isinstance(f.exception, errors.LogClosedError) for f in futures)


def test_callbacks_take_extra_arguments_like_kafka_python(log: pylog.Log) -> None:
    log.create_topic("t")
    p = log.producer()
    got: list[Any] = []
    p.send("t", b"v").add_callback(
        lambda tag, md, extra=None: got.append((tag, md.offset, extra)), "a", extra=1
    )
    p.flush()
    assert got == [("a", 0, 1)]
    md = p.send("t", b"v2", b"k", [("h", b"1")], 0, 1234).get()  # kafka-python's positional order
    assert (md.partition, md.timestamp, md.serialized_key_size) == (0, 1234, 1)
    p.close()


@pytest.mark.parametrize(
    "config",
    [
        {"value_serializer": "json"},
        {"key_serializer": 3},
        {"max_queued_bytes": 0},
        {"max_queued_bytes": "big"},
    ],
)
def test_bad_serializers_and_sizes_are_refused_when_the_producer_is_created(
    log: pylog.Log, config: dict[str, Any]
) -> None:
    with pytest.raises(errors.ConfigError, match=next(iter(config))):
        log.producer(**config)


# -- batches stay within max_message_bytes ----------------------------------------------------------------


def _batch_sizes(log: pylog.Log, topic: str) -> list[int]:
    sizes = []
    t = log.topic(topic)
    for p in range(t.num_partitions):
        for seg in t.partition(p).segments:
            with open(seg.path, "rb") as f:
                data = f.read()
            pos = 0
            while pos + HEADER_SIZE <= len(data):
                h = decode_header(data, pos)
                sizes.append(h.batch_length)
                pos += h.batch_length
    return sizes


def test_records_that_fit_one_by_one_are_written_together(log: pylog.Log) -> None:
    log.create_topic("one", max_message_bytes=100_000)
    p = log.producer(value_serializer=None)
    futures = [p.send("one", b"x" * 20_000) for _ in range(6)]
    p.flush()
    assert [f.get().offset for f in futures] == list(range(6))
    assert max(_batch_sizes(log, "one")) <= 100_000


@pytest.mark.parametrize("compression", ["none", "gzip", "lz4", "zstd"])
@pytest.mark.parametrize("seed", range(3))
def test_random_records_that_fit_alone_always_fit_in_their_batches(
    log: pylog.Log, compression: str, seed: int
) -> None:
    rng = random.Random(seed)
    limit = rng.choice([2_000, 10_000, 70_000])
    log.create_topic("t", partitions=rng.choice([1, 3]), max_message_bytes=limit)
    p = log.producer(
        compression_type=compression, batch_size=rng.choice([1_000, 262_144]), value_serializer=None
    )
    sent = []
    for _i in range(rng.randint(20, 300)):
        size = rng.choice([0, 1, 10, limit // 7, limit // 2, limit - 200])
        value = os.urandom(size)  # incompressible: compression can only grow it
        key = None if rng.random() < 0.5 else b"k%d" % rng.randint(0, 20)
        headers = [("h", b"x" * rng.randint(0, 30))] if rng.random() < 0.2 else None
        try:
            sent.append((p.send("t", value, key, headers), value))
        except errors.RecordTooLargeError:
            continue  # refused at send(), alone: fine
    p.flush()
    for future, value in sent:
        md = future.get()
        assert md.serialized_value_size == len(value)
    assert max(_batch_sizes(log, "t")) <= limit
    c = log.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None)
    assert sorted(r.value for r in c) == sorted(v for _, v in sent)


def test_send_batch_splits_within_max_message_bytes(log: pylog.Log) -> None:
    log.create_topic("t", max_message_bytes=50_000)
    p = log.producer(compression_type="zstd")
    values = [os.urandom(12_000) for _ in range(20)]
    result = p.send_batch("t", values=values)
    assert sorted(result.offsets.tolist()) == list(range(20))
    assert max(_batch_sizes(log, "t")) <= 50_000


class FailingAfter(fs.FileSystem):
    """Lets ``allowed`` writes to segment files through, then fails every one with EIO."""

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed

    def pwrite(self, fd: int, data: Any, offset: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".log") and len(data) > 8:
            if self.allowed <= 0:
                raise errors.StorageError(5, "injected EIO")
            self.allowed -= 1
        super().pwrite(fd, data, offset)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_a_drain_that_fails_part_way_fails_only_the_records_it_did_not_write(log: pylog.Log) -> None:
    log.create_topic("t", partitions=4)
    p = log.producer(linger_ms=60_000, value_serializer=None, batch_size=1_000)
    futures = [p.send("t", b"%d" % i + b"x" * 200, partition=i % 4) for i in range(200)]
    with fs.install(FailingAfter(5)), pytest.raises(errors.DeliveryError) as info:
        p.flush()
    written = [f for f in futures if f.succeeded()]
    assert 0 < len(written) < len(futures)
    assert info.value.count == len(futures) - len(written)
    stored = {
        (r.partition, r.offset): r.value
        for r in log.consumer(
            "t", auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None
        )
    }
    # exactly the records reported written are in the log, where their metadata says
    assert {(f.get().partition, f.get().offset) for f in written} == set(stored)
    p.close()


def test_records_sent_to_a_topic_deleted_and_created_again_elsewhere_are_never_acknowledged_into_the_old_files(
    tmp_path: Any,
) -> None:
    root = os.path.join(str(tmp_path), "log")
    clock = pylog.ManualClock(1_700_000_000_000)
    writer, admin = pylog.open(root, clock=clock), pylog.open(root, clock=clock)
    try:
        writer.create_topic("t")
        p = writer.producer(value_serializer=None)
        assert p.send("t", b"before").get().offset == 0
        admin.delete_topic("t")
        admin.create_topic("t")
        # the writer has not looked at the manifest again yet (its clock has not moved): its append must not
        # land in the deleted files and be acknowledged
        with pytest.raises(errors.UnknownTopicError, match="deleted"):
            p.send("t", b"lost?").get()
        clock.advance(2_000)  # the writer's next metadata check sees the new topic
        assert p.send("t", b"after").get().offset == 0
        c = admin.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None)
        assert [r.value for r in c] == [b"after"]
        p.close()
    finally:
        writer.close()
        admin.close()


class BlockingFsync(fs.FileSystem):
    """Holds every fsync of a segment file until ``release`` is set."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.segment_fsyncs = 0

    def fsync(self, fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
            self.segment_fsyncs += 1
            self.entered.set()
            assert self.release.wait(30)
        super().fsync(fd)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_acks_all_futures_wait_for_their_fsync_and_callers_share_the_next_one(log: pylog.Log) -> None:
    log.create_topic("t")
    p = log.producer(acks="all", value_serializer=None)
    layer = BlockingFsync()
    with fs.install(layer):
        first = p.send("t", b"first")
        waiter = threading.Thread(target=first.get)
        waiter.start()
        assert layer.entered.wait(30)
        later = [p.send("t", b"later-%d" % i) for i in range(7)]
        getters = [threading.Thread(target=f.get) for f in later]
        for g in getters:
            g.start()
        assert not first.is_done and not any(f.is_done for f in later)  # appended, not yet durable
        layer.release.set()
        waiter.join(30)
        for g in getters:
            g.join(30)
    assert first.succeeded() and all(f.succeeded() for f in later)
    assert layer.segment_fsyncs <= 3  # one for the first record, the seven queued meanwhile share the next
    assert [f.get().offset for f in [first, *later]] == list(range(8))
    p.close()


class AppendDuringDeletion(fs.FileSystem):
    """Runs ``during`` right after the first unlink of a file of the deleted topic (the deleting process is
    removing the partition's files)."""

    def __init__(self, topic_dir: str, during: Any) -> None:
        self.topic_dir = topic_dir
        self.during = during
        self.done = False

    def unlink(self, path: str) -> None:
        super().unlink(path)
        if not self.done and path.startswith(self.topic_dir):
            self.done = True
            self.during()


@pytest.mark.parametrize("state_first", [False, True])
def test_an_append_while_another_log_removes_the_deleted_topic_files_is_refused(
    tmp_path: Any, state_first: bool
) -> None:
    # Whatever the order in which the deleting process unlinks the partition's files, an append by another
    # process (here another Log) in between is refused with UnknownTopicError, never acknowledged into them;
    # the other Log then closes without error.
    root = os.path.join(str(tmp_path), "log")
    clock = pylog.ManualClock(1_700_000_000_000)
    writer, admin = pylog.open(root, clock=clock), pylog.open(root, clock=clock)
    outcome: list[object] = []
    try:
        writer.create_topic("t")
        p = writer.producer(value_serializer=None)
        assert p.send("t", b"before").get().offset == 0
        directory = os.path.join(root, "t-0")
        if state_first:  # the unlink order of a directory listing is the file system's: try both extremes
            names = sorted(os.listdir(directory), key=lambda n: n != "partition.state")
        else:
            names = sorted(os.listdir(directory), key=lambda n: n == "partition.state")

        class Ordered(AppendDuringDeletion):
            def listdir(self, path: str) -> list[str]:
                return names if path == directory else super().listdir(path)

        def append() -> None:
            try:
                outcome.append(p.send("t", b"lost?").get().offset)
            except errors.UnknownTopicError as exc:
                outcome.append(exc)

        with fs.install(Ordered(directory, append)):
            admin.delete_topic("t")
        assert len(outcome) == 1 and isinstance(outcome[0], errors.UnknownTopicError), outcome
        p.close()
        writer.close()  # nothing of the deleted partition is flushed (its files are gone)
    finally:
        writer.close()
        admin.close()


def test_a_suspended_partition_of_a_topic_being_deleted_is_not_written_nor_created_again(
    tmp_path: Any,
) -> None:
    # The writer keeps one partition open: t-0 is suspended (its descriptors closed) when u-0 is used. Another
    # Log deletes t; right after it unlinked t-0's state file the writer appends to t again: the reopen must
    # not create the state file again (an unmarked one, in the directory being removed) and write into the
    # segment files still there: the append is refused, and the directory is removed whole.
    root = os.path.join(str(tmp_path), "log")
    clock = pylog.ManualClock(1_700_000_000_000)
    writer = pylog.open(root, clock=clock, max_open_partitions=1)
    admin = pylog.open(root, clock=clock)
    outcome: list[object] = []
    try:
        writer.create_topic("t")
        writer.create_topic("u")
        p = writer.producer(value_serializer=None)
        assert p.send("t", b"before").get().offset == 0
        assert p.send("u", b"other").get().offset == 0  # suspends t-0
        directory = os.path.join(root, "t-0")
        state_path = os.path.join(directory, "partition.state")

        class AfterState(fs.FileSystem):
            def listdir(self, path: str) -> list[str]:  # the state file first, as a listing may give it
                names = super().listdir(path)
                return sorted(names, key=lambda n: n != "partition.state") if path == directory else names

            def unlink(self, path: str) -> None:
                super().unlink(path)
                if path == state_path:
                    try:
                        outcome.append(p.send("t", b"lost?").get().offset)
                    except errors.UnknownTopicError as exc:
                        outcome.append(exc)

        with fs.install(AfterState()):
            admin.delete_topic("t")
        assert len(outcome) == 1 and isinstance(outcome[0], errors.UnknownTopicError), outcome
        assert not os.path.exists(directory)
        p.close()
        writer.close()
    finally:
        writer.close()
        admin.close()
