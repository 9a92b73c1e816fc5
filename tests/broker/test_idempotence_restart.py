"""Idempotent producers across a restart of the broker: the sequence state is rebuilt from the log, so a
batch retried after a restart (graceful, or of a SIGKILLed broker process) is answered as the duplicate it
is, with its first offset, a sequence gap is refused, and older epochs stay fenced. Raw requests for the
exact cases, and confluent-kafka (librdkafka) retrying a batch whose answer was lost when its broker went
down."""

from __future__ import annotations

import signal
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from kafka_support import WAIT_S, BrokerProcess, stored
from kio.schema.errors import ErrorCode
from kio_client import RawClient
from kio_client import idempotent_batch as _batch
from kio_client import init_producer_id as _init
from kio_client import produce as _produce

import pylog
from pylog.broker.broker import Broker
from pylog.broker.idempotence import DUPLICATE, WRITE, KafkaWriter, Sequences
from pylog.broker.records import decode_batches
from pylog.errors import StorageError
from pylog.record import encode_batch, encode_one

_REFUSED = ("127.0.0.1", 1)  # nothing listens on port 1


def _partition(directory: Path, topic: str, partition: int) -> list[bytes]:
    """The values of one partition, read with an embedded consumer."""
    with pylog.open(directory) as log:
        c = log.consumer(value_deserializer=None, consumer_timeout_ms=0)
        try:
            c.assign([pylog.TopicPartition(topic, partition)])
            c.seek_to_beginning()
            return [r.value for r in c]
        finally:
            c.close()


def _client(b: Broker) -> RawClient:
    return RawClient(b.host, b.port)


def test_a_retry_after_a_restart_is_a_duplicate(log_dir: Path) -> None:
    big = [b"%06d" % i * 200 for i in range(3000)]  # 3.6 MB: stored as several pylog batches
    with pylog.serve(log_dir) as b:
        b.log.create_topic("idem", partitions=2)
        client = _client(b)
        try:
            code, pid, epoch = _init(client)
            _, fenced, _ = _init(client)
            assert (code, epoch) == (ErrorCode.none, 0)
            assert _produce(client, "idem", _batch(pid, 0, 0, [b"a", b"b"])) == (ErrorCode.none, 0)
            assert _produce(client, "idem", _batch(pid, 0, 2, [b"c"], headers=True)) == (ErrorCode.none, 2)
            assert _produce(client, "idem", _batch(pid, 0, 3, big, compression=4)) == (ErrorCode.none, 3)
            assert _produce(client, "idem", _batch(pid, 0, 3003, [b"d", b"e"], headers=True)) == (
                ErrorCode.none,
                3003,
            )
            # another producer bumps its epoch (KIP-360) and writes with it to partition 1
            assert _produce(client, "idem", _batch(fenced, 0, 0, [b"old"]), 1) == (ErrorCode.none, 0)
            assert _init(client, fenced, 0) == (ErrorCode.none, fenced, 1)
            assert _produce(client, "idem", _batch(fenced, 1, 0, [b"new"]), 1) == (ErrorCode.none, 1)
        finally:
            client.close()

    with pylog.serve(log_dir) as b:
        client = _client(b)
        try:
            # retries of the last batches written before the restart: acknowledged with their offsets
            assert _produce(client, "idem", _batch(pid, 0, 3003, [b"d", b"e"], headers=True)) == (
                ErrorCode.none,
                3003,
            )
            assert _produce(client, "idem", _batch(pid, 0, 3, big, compression=4)) == (ErrorCode.none, 3)
            assert _produce(client, "idem", _batch(pid, 0, 2, [b"c"], headers=True)) == (ErrorCode.none, 2)
            assert _produce(client, "idem", _batch(pid, 0, 0, [b"a", b"b"])) == (ErrorCode.none, 0)
            # a gap after the last sequence written before the restart is refused; the next one is written
            assert _produce(client, "idem", _batch(pid, 0, 3009, [b"gap"]))[0] == (
                ErrorCode.out_of_order_sequence_number
            )
            assert _produce(client, "idem", _batch(pid, 0, 3005, [b"f"])) == (ErrorCode.none, 3005)
            # the older epoch stays fenced, and the producer may bump its epoch again
            assert _produce(client, "idem", _batch(fenced, 0, 1, [b"zombie"]), 1)[0] == (
                ErrorCode.invalid_producer_epoch
            )
            assert _init(client, fenced, 1) == (ErrorCode.none, fenced, 2)
            # an id the broker has no state of gets a new id (Kafka's rule without a transactional id)
            code, other, epoch = _init(client, 10_000, 3)
            assert code == ErrorCode.none and other not in (pid, fenced, 10_000) and epoch == 0
        finally:
            client.close()
    assert _partition(log_dir, "idem", 0) == [b"a", b"b", b"c", *big, b"d", b"e", b"f"]
    assert _partition(log_dir, "idem", 1) == [b"old", b"new"]


def test_a_retry_after_a_write_that_failed_part_way_writes_only_the_rest(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Kafka batch stored as several pylog batches whose write fails after the first: the retry writes the
    records left out, once, and is answered with the batch's first offset."""
    broker.log.create_topic("partial", partitions=1)
    big = [b"%06d" % i * 200 for i in range(3000)]  # stored as 4 pylog batches
    appends = 0
    append = KafkaWriter._append_batch

    def failing_second(self: KafkaWriter, *args: Any) -> Any:
        nonlocal appends
        appends += 1
        if appends == 2:
            raise StorageError("injected: the disk refused the write")
        return append(self, *args)

    client = _client(broker)
    try:
        _, pid, _ = _init(client)
        assert _produce(client, "partial", _batch(pid, 0, 0, [b"a"])) == (ErrorCode.none, 0)
        monkeypatch.setattr(KafkaWriter, "_append_batch", failing_second)
        appends = 0
        assert _produce(client, "partial", _batch(pid, 0, 1, big, compression=4))[0] == (
            ErrorCode.kafka_storage_error
        )
        assert appends == 2
        assert _produce(client, "partial", _batch(pid, 0, 1, big, compression=4)) == (ErrorCode.none, 1)
        assert _produce(client, "partial", _batch(pid, 0, 1, big, compression=4)) == (ErrorCode.none, 1)
        assert _produce(client, "partial", _batch(pid, 0, 3001, [b"b"])) == (ErrorCode.none, 3001)
    finally:
        client.close()
    got = [(r.offset, r.value) for r in stored(broker.log, "partial")]
    assert got == list(enumerate([b"a", *big, b"b"]))


def test_the_rebuild_reads_a_bounded_tail(tmp_path: Path) -> None:
    """The state is rebuilt from the last ``window`` offsets, and from fewer when they hold more than about
    ``batches`` batches: a producer whose last batch is older is unknown (any sequence accepted), one within
    the bound is known (its retry is a duplicate, a gap is refused)."""
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("t", partitions=1)
        plog = log.topic("t").partition(0)
        now = log.clock.time_ms()
        plog.append(
            encode_one(None, b"old", now, producer_id=1, producer_epoch=0, base_sequence=0)
        )  # offset 0
        for i in range(100):  # offsets 1-100, one record a batch
            plog.append(encode_one(None, b"new", now, producer_id=2, producer_epoch=0, base_sequence=i))

        def verdicts(sequences: Sequences) -> tuple[object, object, object]:
            sequences.prepare("t", 0, plog)
            sequences.load("t", 0, plog)
            (old,) = decode_batches(_batch(1, 0, 5, [b"x"]))  # producer 1's next would be sequence 1
            (retry,) = decode_batches(_batch(2, 0, 99, [b"new"]))
            (gap,) = decode_batches(_batch(2, 0, 101, [b"x"]))
            return (
                sequences.check("t", 0, old)[0],
                sequences.check("t", 0, retry)[:2],
                sequences.check("t", 0, gap)[0],
            )

        oos = ErrorCode.out_of_order_sequence_number
        assert verdicts(Sequences()) == (oos, (DUPLICATE, 100), oos)
        assert verdicts(Sequences(window=100)) == (WRITE, (DUPLICATE, 100), oos)  # offsets 1-100
        assert verdicts(Sequences(batches=50)) == (WRITE, (DUPLICATE, 100), oos)  # about the last 50 batches


def test_a_producer_last_seen_in_a_compacted_segment_is_not_refused(tmp_path: Path) -> None:
    """Compaction keeps a batch's first sequence but may drop its first records, so the sequences of a batch
    in a cleaned segment no longer follow from its offsets: a producer whose last batch is there is treated
    as unknown after a restart (its next batch accepted), never refused for a gap it did not make."""
    with pylog.open(tmp_path / "log") as log:
        log.create_topic("c", partitions=1, cleanup_policy="compact")
        topic = log.topic("c")
        plog = topic.partition(0)
        now = log.clock.time_ms()
        keys: list[bytes | None] = [b"a", b"b", b"c", b"d", b"e"]
        plog.append(
            encode_batch(0, keys, [b"1"] * 5, [now] * 5, producer_id=1, producer_epoch=0, base_sequence=0)
        )
        plog.append(encode_batch(0, keys[:2], [b"2"] * 2, [now] * 2))  # supersedes a and b of producer 1
        plog.roll()
        topic.compact()
        assert [int(o) for b in plog.read(0) for o in b.offsets][:3] == [
            2,
            3,
            4,
        ]  # a and b of producer 1 gone
        sequences = Sequences()
        sequences.prepare("c", 0, plog)
        sequences.load("c", 0, plog, compacted=True)
        (following,) = decode_batches(_batch(1, 0, 5, [b"x"]))  # producer 1's next batch: sequence 5
        assert sequences.check("c", 0, following)[0] == WRITE


def test_a_retry_to_a_restarted_killed_broker_process_is_a_duplicate(log_dir: Path) -> None:
    with pylog.open(log_dir) as log:
        log.create_topic("killed", partitions=1)
    first = BrokerProcess(log_dir)
    host, port = first.address.rsplit(":", 1)
    client = RawClient(host, int(port))
    try:
        _, pid, _ = _init(client)
        assert _produce(client, "killed", _batch(pid, 0, 0, [b"a", b"b"])) == (ErrorCode.none, 0)
        assert _produce(client, "killed", _batch(pid, 0, 2, [b"c"], headers=True)) == (ErrorCode.none, 2)
    finally:
        client.close()
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    first.close()
    second = BrokerProcess(log_dir)
    host, port = second.address.rsplit(":", 1)
    client = RawClient(host, int(port))
    try:
        assert _produce(client, "killed", _batch(pid, 0, 2, [b"c"], headers=True)) == (ErrorCode.none, 2)
        assert _produce(client, "killed", _batch(pid, 0, 4, [b"gap"]))[0] == (
            ErrorCode.out_of_order_sequence_number
        )
        assert _produce(client, "killed", _batch(pid, 0, 3, [b"d"])) == (ErrorCode.none, 3)
    finally:
        client.close()
        assert second.stop() == 0
        second.close()
    assert _partition(log_dir, "killed", 0) == [b"a", b"b", b"c", b"d"]


class _Proxy:
    """A TCP proxy in front of the broker that loses the answer to one Produce request (the ``drop_at``-th,
    counting from 1), closing the client's connection instead, as when a broker goes down after writing and
    before answering; ``backend`` is where it connects, and may change (a restarted broker)."""

    def __init__(self, backend: tuple[str, int], drop_at: int) -> None:
        self.backend = backend
        self.drop_at = drop_at
        self.produces = 0
        self.dropped = threading.Event()
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self._server.close()
        with self._lock:
            for s in self._sockets:
                s.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.backend, timeout=WAIT_S)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            produce_ids: set[int] = set()
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._requests, args=(client, upstream, produce_ids), daemon=True).start()
            threading.Thread(
                target=self._responses, args=(upstream, client, produce_ids), daemon=True
            ).start()

    def _requests(self, src: socket.socket, dst: socket.socket, produce_ids: set[int]) -> None:
        try:
            for frame in _frames(src):
                api_key, _, correlation = struct.unpack_from(">hhi", frame, 4)
                if api_key == 0:
                    with self._lock:
                        self.produces += 1
                        if self.produces == self.drop_at:
                            produce_ids.add(correlation)
                dst.sendall(frame)
        except OSError:
            pass
        finally:
            _close(src, dst)

    def _responses(self, src: socket.socket, dst: socket.socket, produce_ids: set[int]) -> None:
        try:
            for frame in _frames(src):
                (correlation,) = struct.unpack_from(">i", frame, 4)
                if correlation in produce_ids:  # written by the broker; its answer is lost
                    self.dropped.set()
                    break
                dst.sendall(frame)
        except OSError:
            pass
        finally:
            _close(src, dst)


def _frames(sock: socket.socket) -> Iterator[bytes]:
    while True:
        size = _exactly(sock, 4)
        if size is None:
            return
        body = _exactly(sock, struct.unpack(">i", size)[0])
        if body is None:
            return
        yield size + body


def _exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _close(*sockets: socket.socket) -> None:
    for s in sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


@pytest.fixture
def proxy() -> Iterator[_Proxy]:
    p = _Proxy(_REFUSED, drop_at=3)
    try:
        yield p
    finally:
        p.close()


def _send_idempotently(bootstrap: str, topic: str) -> tuple[list[bytes], list[object]]:
    """Send 300 values to partition 0 of ``topic`` with confluent-kafka's idempotent producer, flushing every
    50 (so that several batches are in flight when the broker goes away): the values sent, in order, and the
    delivery errors."""
    errors: list[object] = []
    producer = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 0,
            "reconnect.backoff.ms": 10,
            "message.timeout.ms": int(WAIT_S * 1000),
        }
    )
    sent = []
    for chunk in range(6):
        for i in range(50):
            value = b"%d-%d" % (chunk, i)
            sent.append(value)
            producer.produce(topic, value=value, partition=0, on_delivery=lambda e, m: e and errors.append(e))
        assert producer.flush(WAIT_S) == 0
    return sent, errors


def test_confluent_idempotent_producer_across_a_restart(log_dir: Path, proxy: _Proxy) -> None:
    """librdkafka retries the batch whose answer was lost on the restarted broker: written once."""
    advertise = f"127.0.0.1:{proxy.port}"
    first = pylog.serve(log_dir, advertise=advertise)
    first.log.create_topic("ck-restart", partitions=1)
    proxy.backend = (first.host, first.port)
    restarted: list[Broker] = []

    def restart() -> None:
        proxy.dropped.wait(WAIT_S)
        proxy.backend = _REFUSED  # the broker is down: connections are refused until it is back
        first.close()
        second = pylog.serve(log_dir, advertise=advertise)
        restarted.append(second)
        proxy.backend = (second.host, second.port)

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        sent, errors = _send_idempotently(advertise, "ck-restart")
        thread.join(WAIT_S)
        assert proxy.dropped.is_set() and restarted
        assert errors == []
        with restarted[0] as second:
            c = second.log.consumer(value_deserializer=None, consumer_timeout_ms=0)
            c.assign([pylog.TopicPartition("ck-restart", 0)])
            c.seek_to_beginning()
            got = [r.value for r in c]
            c.close()
        assert got == sent
    finally:
        thread.join(WAIT_S)
        first.close()
        for b in restarted:
            b.close()


def test_confluent_idempotent_producer_across_a_killed_broker_process(log_dir: Path, proxy: _Proxy) -> None:
    """The same with the broker's process SIGKILLed after writing the batch (acks=all: fsynced) and before
    its answer reached the client: the retry to the new process is written once."""
    with pylog.open(log_dir) as log:
        log.create_topic("ck-killed", partitions=1)
    advertise = f"127.0.0.1:{proxy.port}"
    processes = [BrokerProcess(log_dir, "--advertise", advertise)]

    def backend(p: BrokerProcess) -> tuple[str, int]:
        host, port = p.address.rsplit(":", 1)
        return host, int(port)

    proxy.backend = backend(processes[0])

    def restart() -> None:
        proxy.dropped.wait(WAIT_S)
        proxy.backend = _REFUSED
        processes[0].stop(signal.SIGKILL)
        processes.append(BrokerProcess(log_dir, "--advertise", advertise))
        proxy.backend = backend(processes[1])

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        sent, errors = _send_idempotently(advertise, "ck-killed")
        thread.join(WAIT_S)
        assert proxy.dropped.is_set() and len(processes) == 2
        assert errors == []
        assert processes[1].stop() == 0
    finally:
        thread.join(WAIT_S)
        for p in processes:
            p.close()
    assert _partition(log_dir, "ck-killed", 0) == sent
