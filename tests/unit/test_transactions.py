"""Idempotent and transactional producers, read_committed visibility, fencing, timeouts, group offsets."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pylog
from pylog import fs
from pylog.errors import ConfigError, IllegalStateError, ProducerFencedError, StorageError
from pylog.structs import OffsetAndMetadata, TopicPartition
from pylog.testing import FaultyFileSystem
from pylog.transactions import ABORTED, COMMITTED, OPEN, TXN_DIR, TxnDecisions

TP0 = TopicPartition("out", 0)


def _values(log: pylog.Log, topic: str, isolation: str) -> list[int]:
    c = log.consumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=0, isolation_level=isolation)
    out = [r.value for r in c]
    c.close()
    return out


@settings(max_examples=30, deadline=None)
@given(
    plan=st.lists(
        st.tuples(st.sampled_from(["commit", "abort", "plain"]), st.integers(1, 30), st.booleans()),
        min_size=1,
        max_size=10,
    ),
    leave_open=st.booleans(),
)
def test_read_committed_sees_exactly_the_committed_and_plain_records(
    tmp_path_factory: pytest.TempPathFactory, plan: list[tuple[str, int, bool]], leave_open: bool
) -> None:
    """Model: committed transactions and plain records are visible, in log order, up to the first open
    transaction; aborted ones never are; read_uncommitted sees everything. A read-only open of the directory
    sees the same."""
    root = tmp_path_factory.mktemp("txn")
    with pylog.open(root) as log:
        log.create_topic("out")
        tx = log.producer(transactional_id="tx")
        tx.init_transactions()
        plain = log.producer()
        counter = 0
        visible: list[int] = []
        everything: list[int] = []
        for kind, n, flush_midway in plan:
            values = list(range(counter, counter + n))
            counter += n
            everything += values
            if kind == "plain":
                for v in values:
                    plain.send("out", v, partition=0)
                plain.flush()
                visible += values
                continue
            tx.begin_transaction()
            for i, v in enumerate(values):
                tx.send("out", v, partition=0)
                if flush_midway and i == n // 2:
                    tx.flush()
            if kind == "commit":
                tx.commit_transaction()
                visible += values
            else:
                tx.abort_transaction()
        if leave_open:
            tx.begin_transaction()
            tx.send("out", -1, partition=0)
            tx.flush()
            plain.send("out", -2, partition=0)  # after the open transaction: held back until it ends
            plain.flush()
            everything += [-1, -2]
        assert _values(log, "out", "read_committed") == visible
        assert _values(log, "out", "read_uncommitted") == everything
        with pylog.open(root, read_only=True) as reader:  # reads the decisions without writing
            assert _values(reader, "out", "read_committed") == visible
            assert _values(reader, "out", "read_uncommitted") == everything
        if leave_open:
            tx.abort_transaction()
            assert _values(log, "out", "read_committed") == [*visible, -2]
        plain.close()
        tx.close()


def _offsets(log: pylog.Log, group: str) -> dict[TopicPartition, OffsetAndMetadata]:
    return log.group_offsets(group) if group in log.list_groups() else {}


def test_offsets_commit_with_the_transaction_and_not_without(log: pylog.Log) -> None:
    log.create_topic("in", partitions=2)
    log.create_topic("out")
    tx = log.producer(transactional_id="tx")
    tx.init_transactions()
    tx.begin_transaction()
    tx.send("out", 1)
    tx.send_offsets_to_transaction({TopicPartition("in", 0): OffsetAndMetadata(0, "m")}, "g")
    tx.abort_transaction()
    assert _offsets(log, "g") == {}
    tx.begin_transaction()
    tx.send("out", 2)
    tx.send_offsets_to_transaction({TopicPartition("in", 1): 0}, "g")
    assert _offsets(log, "g") == {}  # not visible while the transaction is open
    tx.commit_transaction()
    assert log.group_offsets("g") == {TopicPartition("in", 1): OffsetAndMetadata(0, "")}


def test_a_new_instance_fences_the_old_and_aborts_its_open_transaction(log: pylog.Log) -> None:
    log.create_topic("out")
    old = log.producer(transactional_id="tx")
    old.init_transactions()
    old.begin_transaction()
    old.send("out", "zombie")
    old.flush()
    new = log.producer(transactional_id="tx")
    new.init_transactions()
    assert new.producer_id == old.producer_id and new.producer_epoch == old.producer_epoch + 1
    old.send("out", "zombie-late")  # a fenced producer can still write bytes ...
    old.flush()
    with pytest.raises(ProducerFencedError, match="fenced"):
        old.commit_transaction()
    new.begin_transaction()
    new.send("out", "fresh")
    new.commit_transaction()
    assert _values(log, "out", "read_committed") == ["fresh"]  # ... but never makes them visible
    assert _values(log, "out", "read_uncommitted") == ["zombie", "zombie-late", "fresh"]


def test_an_open_transaction_times_out_and_is_aborted(log: pylog.Log, clock: pylog.ManualClock) -> None:
    log.create_topic("out")
    tx = log.producer(transactional_id="tx", transaction_timeout_ms=5_000)
    tx.init_transactions()
    tx.begin_transaction()
    tx.send("out", "stuck")
    tx.flush()
    plain = log.producer()
    plain.send("out", "after").get()
    assert _values(log, "out", "read_committed") == []  # held back by the open transaction
    clock.advance(6_000)
    assert _values(log, "out", "read_committed") == ["after"]  # the reader aborted it
    with pytest.raises(ProducerFencedError):
        tx.commit_transaction()


def test_misuse_is_a_typed_error(log: pylog.Log) -> None:
    log.create_topic("out")
    with pytest.raises(ConfigError):
        log.producer(transactional_id="")
    with pytest.raises(ConfigError):
        log.producer(transactional_id="t", acks=1)
    with pytest.raises(ConfigError):
        log.consumer("out", isolation_level="serializable")
    tx = log.producer(transactional_id="t")
    with pytest.raises(IllegalStateError):
        tx.begin_transaction()  # before init_transactions
    tx.init_transactions()
    with pytest.raises(IllegalStateError):
        tx.commit_transaction()
    with pytest.raises(IllegalStateError):
        tx.send("out", 1).get()  # outside a transaction
    plain = log.producer(enable_idempotence=True)
    with pytest.raises(IllegalStateError):
        plain.begin_transaction()
    assert _values(log, "out", "read_uncommitted") == []


@pytest.mark.parametrize("seed", range(12))
def test_idempotent_retries_after_storage_errors_write_each_batch_once(tmp_path: object, seed: int) -> None:
    """EIO on a random write-path call: the producer retries, and every acknowledged record is in the log
    exactly once, in send order."""
    rng = random.Random(seed)
    root = str(tmp_path) + "/log"
    with pylog.open(root) as log:
        log.create_topic("t", partitions=2)
    layer = FaultyFileSystem(root)
    acked: list[int] = []
    with fs.install(layer), pylog.open(root) as log:
        producer = log.producer(enable_idempotence=True, retries=3, retry_backoff_ms=0)
        layer.inject_error(rng.randrange(0, 40), errno.EIO, ops={"pwrite", "ftruncate"})
        for i in range(200):
            try:
                producer.send("t", i, key=str(i % 7)).get()
                acked.append(i)
            except StorageError:
                pass
        producer.close()
    with pylog.open(root) as log:
        stored = _values(log, "t", "read_uncommitted")
    assert layer.errors_injected == 1
    assert sorted(stored) == sorted(set(stored)), "a record was written twice"
    assert set(acked) <= set(stored)
    assert len(acked) >= 199


def test_decisions_read_only_agree_with_the_txn_log_and_touch_no_file(log: pylog.Log, tmp_path: Path) -> None:
    """TxnDecisions (Spark's planner reads with it) gives TxnLog's statuses, sees decisions made after it was
    built, and creates no file: not even the lock file, nor the directory of a log without transactions."""
    log.create_topic("out")
    tx = log.producer(transactional_id="tx")
    tx.init_transactions()
    seen = []
    for number, kind in enumerate(("commit", "abort", "open"), start=1):  # transactions are numbered from 1
        tx.begin_transaction()
        tx.send("out", kind)
        tx.flush()
        seen.append((tx.producer_id, tx.producer_epoch, number))
        if kind == "commit":
            tx.commit_transaction()
        elif kind == "abort":
            tx.abort_transaction()
    directory = os.path.join(log.path, TXN_DIR)
    before = sorted(os.listdir(directory))
    reader = TxnDecisions(log.path)
    assert [reader.status(*t) for t in seen] == [COMMITTED, ABORTED, OPEN]
    assert [reader.status(*t) for t in seen] == [log.transactions().status(*t) for t in seen]
    tx.commit_transaction()
    assert reader.status(*seen[2]) == COMMITTED
    assert reader.status(seen[2][0], seen[2][1] - 1, 1) == ABORTED  # an older epoch: fenced, never commits
    assert sorted(os.listdir(directory)) == before
    empty = tmp_path / "no-transactions"
    empty.mkdir()
    assert TxnDecisions(str(empty)).status(0, 0, 1) == OPEN
    assert list(empty.iterdir()) == []
    tx.close()


def _open_txn(log: pylog.Log, tid: str, value: str) -> tuple[str, int, int, int]:
    """A transaction of ``tid`` holding ``value``, written, fsynced and left open (as a Spark sink task does)."""
    producer = log.producer(transactional_id=tid)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("out", value, partition=0)
    producer.flush()
    triple = producer.open_transaction
    assert triple is not None and triple[:2] == (producer.producer_id, producer.producer_epoch)
    producer.close()  # closing does not decide: the transaction stays open
    return (tid, *triple)


def test_commit_many_decides_all_or_nothing(log: pylog.Log) -> None:
    """Several transactions of several ids commit with one decision record, visible together; one that is no
    longer open (fenced by a newer instance) makes the whole call fail and decides nothing."""
    log.create_topic("out")
    txns = log.transactions()
    a, b = _open_txn(log, "task-a", "a"), _open_txn(log, "task-b", "b")
    assert _values(log, "out", "read_committed") == []
    txns.commit_many([a, b])
    assert _values(log, "out", "read_committed") == ["a", "b"]
    assert [txns.status(*t[1:]) for t in (a, b)] == [COMMITTED, COMMITTED]
    with pytest.raises(ProducerFencedError):
        txns.commit_many([a])  # already decided

    c, d = _open_txn(log, "task-c", "c"), _open_txn(log, "task-d", "d")
    newer = log.producer(transactional_id="task-d")
    newer.init_transactions()  # fences d and aborts its open transaction
    with pytest.raises(ProducerFencedError, match="task-d"):
        txns.commit_many([c, d])
    assert txns.status(*c[1:]) == OPEN and txns.status(*d[1:]) == ABORTED
    txns.commit_many([c])
    assert _values(log, "out", "read_committed") == ["a", "b", "c"]
    # a fresh reader of the file agrees
    assert [TxnDecisions(log.path).status(*t[1:]) for t in (a, b, c, d)] == [COMMITTED] * 3 + [ABORTED]


def test_the_first_decision_counts(log: pylog.Log) -> None:
    """A crash after a commit record but before the producers file was rewritten leaves the transaction "open"
    there; the next init() appends an abort for it, which must not undo the commit."""
    log.create_topic("out")
    tid, pid, epoch, txn = _open_txn(log, "tx", "kept")
    txns = log.transactions()
    txns._append("C", pid, epoch, txn)  # the commit point, as if the process died right after it
    log.producer(transactional_id=tid).init_transactions()  # sees the transaction open: appends "A" for it
    assert txns.status(pid, epoch, txn) == COMMITTED
    assert TxnDecisions(log.path).status(pid, epoch, txn) == COMMITTED
    assert _values(log, "out", "read_committed") == ["kept"]


def test_epoch_exhaustion_moves_to_a_new_producer_id(log: pylog.Log) -> None:
    """Past MAX_EPOCH (an i16 in the batch header) init() gives the transactional id a new producer id at
    epoch 0, and fences the old id: what an old instance still writes is never visible."""
    from pylog.transactions import MAX_EPOCH

    log.create_topic("out")
    txns = log.transactions()
    pid0, _ = txns.init("tx")
    state = txns._load()
    state["ids"]["tx"]["epoch"] = MAX_EPOCH - 1
    txns._store(state)
    assert txns.init("tx") == (pid0, MAX_EPOCH)
    old = log.producer(transactional_id="tx")
    old.producer_id, old.producer_epoch = pid0, MAX_EPOCH
    old.begin_transaction()
    old.send("out", "zombie", partition=0)
    old.flush()
    zombie = old.open_transaction
    assert zombie is not None and zombie[:2] == (pid0, MAX_EPOCH)
    pid1, epoch1 = txns.init("tx")
    assert pid1 != pid0 and epoch1 == 0
    assert txns.status(*zombie) == ABORTED
    new = log.producer(transactional_id="tx")
    new.init_transactions()
    new.begin_transaction()
    new.send("out", "new", partition=0)
    new.commit_transaction()
    assert (new.producer_id, new.producer_epoch) == (pid1, 1)
    assert _values(log, "out", "read_committed") == ["new"]


def test_table_read_committed_of_a_read_only_directory_equals_the_writers(tmp_path: Path) -> None:
    """Model: the latest committed or plain value of each key; aborted and still-open writes are not in it."""
    root = tmp_path / "log"
    model: dict[bytes, int] = {}
    with pylog.open(root) as log:
        log.create_topic("kv", 2)
        tx = log.producer(transactional_id="kv")
        tx.init_transactions()
        plain = log.producer()
        rng = random.Random(7)
        for step in range(30):
            key = f"k{rng.randrange(8)}".encode()
            kind = rng.choice(["commit", "abort", "plain"])
            if kind == "plain":
                plain.send("kv", step, key=key).get()
                model[key] = step
                continue
            tx.begin_transaction()
            tx.send("kv", step, key=key)
            if kind == "commit":
                tx.commit_transaction()
                model[key] = step
            else:
                tx.abort_transaction()
        assert log.topic("kv").table(isolation_level="read_committed") == model
        tx.begin_transaction()
        tx.send("kv", -1, key=b"open")
        tx.flush()  # open: not in the committed view
        with pylog.open(root, read_only=True) as reader:
            assert reader.topic("kv").table(isolation_level="read_committed") == model
        assert log.topic("kv").table(isolation_level="read_committed") == model
        tx.abort_transaction()
        plain.close()
        tx.close()
