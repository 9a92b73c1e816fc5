"""Transaction decisions in the object store (pylog.tiered.decisions): read_committed readers of a log opened
from its URL and of a restored log see what a read_committed reader of the source log sees, against a model of
the transactions written (committed, aborted, open, timed out, across segments and partitions); decisions not
uploaded yet hold remote readers at the last stable offset; damaged decisions objects are detected; restore
never hands out a producer id or a transaction of the source again; chunks stay bounded and orphans go."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import pylog
from pylog.clock import ManualClock
from pylog.errors import CorruptRecordError, IllegalStateError
from pylog.structs import TopicPartition
from pylog.tiered import decisions
from pylog.tiered.restore import restore
from pylog.tiered.store import ObjectStore
from pylog.transactions import ABORTED, COMMITTED, OPEN, TxnDecisions

TS0 = 1_700_000_000_000
TIMEOUT_MS = 60_000
Rows = list[tuple[int, int, bytes]]


@dataclass
class Model:
    """Every record written, per partition in offset order, with the transaction it belongs to (None:
    not transactional), and each transaction's outcome as the source log decided it."""

    records: dict[int, list[tuple[int, bytes, str | None]]] = field(default_factory=dict)
    outcome: dict[str, str] = field(default_factory=dict)

    def add(self, partition: int, offset: int, value: bytes, txn: str | None) -> None:
        self.records.setdefault(partition, []).append((offset, value, txn))

    def read_committed(self) -> Rows:
        """What a read_committed reader returns: plain and committed records, aborted ones left out, each
        partition up to its first record of a transaction still open."""
        out: Rows = []
        for p, recs in sorted(self.records.items()):
            for offset, value, txn in sorted(recs):
                state = COMMITTED if txn is None else self.outcome[txn]
                if state == OPEN:
                    break
                if state == COMMITTED:
                    out.append((p, offset, value))
        return out


def _open(root: Path, url: str, clock: ManualClock) -> pylog.Log:
    return pylog.open(root, clock=clock, remote_storage=url, remote_log_manager_task_interval_ms=-1)


def _send(log: pylog.Log, model: Model, txn: str | None, n: int, producer: Any) -> None:
    sent = []
    for i in range(n):
        for p in (0, 1):
            value = b"%s-%d-%d" % ((txn or "plain").encode(), p, i)
            sent.append((p, value, producer.send("t", value, partition=p)))
    producer.flush()
    for p, value, fut in sent:
        model.add(p, fut.get().offset, value, txn)


def _txn(log: pylog.Log, model: Model, name: str, n: int, end: str | None, timeout_ms: int) -> Any:
    producer = log.producer(transactional_id=name, transaction_timeout_ms=timeout_ms, value_serializer=None)
    producer.init_transactions()
    producer.begin_transaction()
    _send(log, model, name, n, producer)
    model.outcome[name] = OPEN
    if end == COMMITTED:
        producer.commit_transaction()
        model.outcome[name] = COMMITTED
    elif end == ABORTED:
        producer.abort_transaction()
        model.outcome[name] = ABORTED
    return producer


def _scenario(log: pylog.Log, clock: ManualClock) -> Model:
    """Plain records and transactions (committed, aborted, one that times out, one left open) interleaved
    over two partitions of small segments, so that transactions span segments; all sealed."""
    log.create_topic("t", 2, segment_bytes=700, remote_storage_enable=True)
    model = Model()
    plain = log.producer(value_serializer=None)
    _send(log, model, None, 8, plain)
    _txn(log, model, "committed", 25, COMMITTED, TIMEOUT_MS).close()
    _txn(log, model, "aborted", 25, ABORTED, TIMEOUT_MS).close()
    _send(log, model, None, 5, plain)
    _txn(log, model, "expiring", 10, None, TIMEOUT_MS).close()  # closing does not abort: its timeout will
    _send(log, model, None, 5, plain)
    _txn(log, model, "late", 10, COMMITTED, TIMEOUT_MS).close()
    _txn(log, model, "held", 10, None, 100 * TIMEOUT_MS).close()
    _send(log, model, None, 5, plain)
    plain.close()
    for p in (0, 1):
        log.topic("t").partition(p).roll()
    return model


def _rows(log: pylog.Log) -> Rows:
    c = log.consumer(
        value_deserializer=None,
        key_deserializer=None,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
    )
    c.assign([TopicPartition("t", 0), TopicPartition("t", 1)])
    rows = sorted((r.partition, r.offset, r.value) for r in c.iterate(timeout_ms=0))
    c.close()
    return rows


@pytest.fixture(params=["file", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """``(url, options)`` of an empty object store: a file:// directory, or a prefix of the moto bucket."""
    if request.param == "file":
        return (tmp_path / "remote").as_uri(), {}
    bucket, options = request.getfixturevalue("moto_s3")
    return f"s3://{bucket}/{request.node.name}", dict(options)


def test_url_and_restored_logs_read_committed_as_the_source_does(
    tmp_path: Path, store_url: tuple[str, dict[str, Any]]
) -> None:
    url, options = store_url
    clock = ManualClock(TS0)
    with pylog.open(
        tmp_path / "log",
        clock=clock,
        remote_storage=url,
        remote_storage_options=options,
        remote_log_manager_task_interval_ms=-1,
    ) as log:
        model = _scenario(log, clock)
        log.tier()
        source = _rows(log)
        assert source == model.read_committed()  # stops at "expiring", still open
        with pylog.open(url, read_only=True, remote_storage_options=options, clock=ManualClock(TS0)) as ro:
            assert _rows(ro) == source
        restore(url, tmp_path / "restored", clock=ManualClock(TS0), remote_storage_options=options)
        with pylog.open(tmp_path / "restored", clock=ManualClock(TS0)) as restored:
            assert _rows(restored) == source

        # "expiring" times out: the source's reader aborts it; the next pass uploads the abort
        clock.advance(TIMEOUT_MS + 1)
        source = _rows(log)
        model.outcome["expiring"] = ABORTED
        assert source == model.read_committed()  # now stops at "held"
        ro_clock = ManualClock(TS0)
        with pylog.open(url, read_only=True, remote_storage_options=options, clock=ro_clock) as ro:
            before = _rows(ro)
            assert before == [r for r in source if r in before] and len(before) < len(source)  # at the LSO
            log.tier()
            assert _rows(ro) == before  # decisions are re-read at most once a second of the log's clock
            ro_clock.advance(1000)
            assert _rows(ro) == source
        restore(
            url, tmp_path / "restored-2", clock=ManualClock(clock.time_ms()), remote_storage_options=options
        )
        with pylog.open(tmp_path / "restored-2", clock=ManualClock(clock.time_ms())) as restored:
            assert _rows(restored) == source
            # "held" is still open in the restored log, and times out there as it does in the source
            restored.clock.advance(100 * TIMEOUT_MS)  # type: ignore[attr-defined]
            clock.advance(100 * TIMEOUT_MS)
            model.outcome["held"] = ABORTED
            assert _rows(restored) == _rows(log) == model.read_committed()


def test_restore_never_reuses_a_producer_id_nor_a_transaction(tmp_path: Path) -> None:
    """A restored log's new producers get ids above every id of the source (a reused ``(producer_id, epoch,
    txn)`` would inherit an old decision: the source's aborted records would show up when it commits)."""
    url = (tmp_path / "remote").as_uri()
    clock = ManualClock(TS0)
    with _open(tmp_path / "log", url, clock) as log:
        model = _scenario(log, clock)
        idem = log.producer(enable_idempotence=True, value_serializer=None)
        model.add(0, idem.send("t", b"idempotent", partition=0).get().offset, b"idempotent", None)
        idem.close()
        for p in (0, 1):
            log.topic("t").partition(p).roll()
        log.tier()
        state, _ = log.transactions().snapshot()
        used = int(state["next_pid"])
    restore(url, tmp_path / "restored", clock=ManualClock(TS0))
    with pylog.open(tmp_path / "restored", clock=ManualClock(TS0)) as restored:
        before = _rows(restored)
        assert before == model.read_committed()
        txns = restored.transactions()
        assert txns.allocate_pid() >= used
        fresh = restored.producer(transactional_id="brand-new", value_serializer=None)
        fresh.init_transactions()
        assert fresh.producer_id >= used  # type: ignore[attr-defined]
        # a transactional id of the source continues above every transaction number its id has
        again = restored.producer(transactional_id="aborted", value_serializer=None)
        again.init_transactions()
        again.begin_transaction()
        again.send("t", b"after-restore", partition=1).get()
        again.commit_transaction()
        again.close()
        fresh.close()
        after = _rows(restored)
        values = [v for _, _, v in after]
        assert not any(v.startswith(b"aborted-") for v in values)
        assert after == before  # "after-restore" waits behind the open transactions of the source
        restored.clock.advance(100 * TIMEOUT_MS + 1)  # type: ignore[attr-defined]
        model.outcome["expiring"] = model.outcome["held"] = ABORTED
        values = [v for _, _, v in _rows(restored)]
        assert b"after-restore" in values and not any(v.startswith(b"aborted-") for v in values)
        assert sorted(v for v in values if v != b"after-restore") == sorted(
            v for _, _, v in model.read_committed()
        )


def test_a_decision_not_uploaded_holds_remote_readers_at_the_lso(tmp_path: Path) -> None:
    url = (tmp_path / "remote").as_uri()
    clock = ManualClock(TS0)
    with _open(tmp_path / "log", url, clock) as log:
        log.create_topic("t", 2, segment_bytes=700, remote_storage_enable=True)
        model = Model()
        plain = log.producer(value_serializer=None)
        _send(log, model, None, 5, plain)
        pending = _txn(log, model, "pending", 20, None, TIMEOUT_MS)
        _send(log, model, None, 5, plain)
        for p in (0, 1):
            log.topic("t").partition(p).roll()
        log.tier()
        ro_clock = ManualClock(TS0)
        with pylog.open(url, read_only=True, clock=ro_clock) as ro:
            at_lso = model.read_committed()
            assert _rows(ro) == at_lso == _rows(log)
            pending.commit_transaction()  # decided locally, not uploaded yet
            model.outcome["pending"] = COMMITTED
            ro_clock.advance(5000)
            assert _rows(log) == model.read_committed() != at_lso
            assert _rows(ro) == at_lso  # still held at the LSO: the decision is not in the store
            assert log.remote_log_manager is not None
            log.remote_log_manager.run_once()  # a background pass uploads the decision
            ro_clock.advance(1000)
            assert _rows(ro) == model.read_committed()
        pending.close()
        plain.close()
        assert log.remote_log_manager is not None
        status = log.remote_log_manager.decisions_status()
        assert status.failures == 0 and status.remote_end == len(log.transactions().snapshot()[1])


def _tiered_decisions(tmp_path: Path) -> tuple[str, Model]:
    url = (tmp_path / "remote").as_uri()
    clock = ManualClock(TS0)
    with _open(tmp_path / "log", url, clock) as log:
        model = _scenario(log, clock)
        log.tier()
    return url, model


def test_a_damaged_decisions_chunk_is_detected_and_never_turns_an_abort_into_a_commit(tmp_path: Path) -> None:
    url, model = _tiered_decisions(tmp_path)
    store = ObjectStore(url)
    manifest, _ = decisions.read_manifest(store)
    assert manifest is not None and len(manifest.chunks) == 1
    chunk = manifest.chunks[0]
    good = store.get(chunk.key)
    reference = TxnDecisions(str(tmp_path / "log"))
    reference.status(0, 0, 0)  # reads the source's decisions.log
    decided, _ = reference.decided()
    aborted = [t for t, s in decided.items() if s == ABORTED]
    assert aborted
    for pos in range(len(good)):
        for bit in (0x01, 0x80):
            damaged = bytearray(good)
            damaged[pos] ^= bit
            store.put(chunk.key, bytes(damaged))
            reader = decisions.RemoteDecisions(store, None)
            with pytest.raises(CorruptRecordError) as info:
                reader.status(*aborted[0])
            assert info.value.path == chunk.key
    for cut in (1, len(good) // 2, len(good) - 1):  # a torn object
        store.put(chunk.key, good[:cut])
        with pytest.raises(CorruptRecordError):
            decisions.RemoteDecisions(store, None).status(*aborted[0])
    store.put(chunk.key, good)
    reader = decisions.RemoteDecisions(store, None)
    assert {t: reader.status(*t) for t in decided} == decided
    with pylog.open(url, read_only=True, clock=ManualClock(TS0)) as ro:
        assert _rows(ro) == model.read_committed()


def test_a_corrupt_newest_decisions_manifest_falls_back_to_fewer_decisions(tmp_path: Path) -> None:
    url = (tmp_path / "remote").as_uri()
    clock = ManualClock(TS0)
    with _open(tmp_path / "log", url, clock) as log:
        model = _scenario(log, clock)
        log.tier()
        first = _rows(log)
        clock.advance(TIMEOUT_MS + 1)
        model.outcome["expiring"] = ABORTED
        assert _rows(log) == model.read_committed()  # the abort of "expiring" is recorded
        log.tier()
    store = ObjectStore(url)
    newest, highest = decisions.read_manifest(store)
    assert newest is not None and highest == newest.version == 2
    key = decisions.manifest_key(highest)
    raw = store.get(key)
    store.put(key, raw[: len(raw) // 2])  # torn: version 1 is read instead
    with pylog.open(url, read_only=True, clock=ManualClock(TS0)) as ro:
        assert _rows(ro) == first  # the earlier view: held at "expiring", never its records
    store.put(key, raw)
    with pylog.open(url, read_only=True, clock=ManualClock(TS0)) as ro:
        assert _rows(ro) == model.read_committed()


def test_chunks_stay_bounded_and_unnamed_chunks_are_swept(tmp_path: Path) -> None:
    url = (tmp_path / "remote").as_uri()
    clock = ManualClock(TS0)
    store = ObjectStore(url)
    with _open(tmp_path / "log", url, clock) as log:
        log.create_topic("t", 2, segment_bytes=700, remote_storage_enable=True)
        model = Model()
        foreign = f"{decisions.PREFIX}chunks/notes.txt"
        store.put(foreign, b"not pylog's")
        for i in range(decisions.MAX_CHUNKS + 5):
            _txn(log, model, f"tx{i}", 1, COMMITTED if i % 2 else ABORTED, TIMEOUT_MS).close()
            log.tier()
            manifest, _ = decisions.read_manifest(store)
            assert manifest is not None and len(manifest.chunks) <= decisions.MAX_CHUNKS
        assert manifest is not None
        named = {c.key for c in manifest.chunks}
        listed = {o.key for o in store.list(f"{decisions.PREFIX}chunks/")}
        assert listed == named | {foreign}  # replaced chunks were deleted, the foreign object kept
        # a crashed upload's chunk below the end is swept; one past the end (an upload in progress) is kept
        below = decisions.chunk_key(0, manifest.end, "0123456789abcdef")
        above = decisions.chunk_key(manifest.end, manifest.end + 40, "fedcba9876543210")
        store.put(below, b"x")
        store.put(above, b"y")
        assert decisions.upload_decisions(store, log.transactions()).deleted == (below,)  # nothing new
        assert {o.key for o in store.list(f"{decisions.PREFIX}chunks/")} == named | {foreign, above}
        for p in (0, 1):
            log.topic("t").partition(p).roll()
        log.tier()
        assert _rows(log) == model.read_committed()
    with pylog.open(url, read_only=True, clock=ManualClock(TS0)) as ro:
        assert _rows(ro) == model.read_committed()
    restore(url, tmp_path / "restored", clock=ManualClock(TS0))
    with pylog.open(tmp_path / "restored", clock=ManualClock(TS0)) as restored:
        assert _rows(restored) == model.read_committed()


def test_a_local_file_that_is_not_a_continuation_is_refused(tmp_path: Path) -> None:
    url = (tmp_path / "remote").as_uri()
    clock = ManualClock(TS0)
    with _open(tmp_path / "log", url, clock) as log:
        _scenario(log, clock)
        log.tier()
    with _open(tmp_path / "other", url, clock) as other:
        other.create_topic("u", 1, remote_storage_enable=True)
        p = other.producer(transactional_id="x", value_serializer=None)
        p.init_transactions()
        p.close()
        before = decisions.read_manifest(ObjectStore(url))
        with pytest.raises(IllegalStateError, match="not a continuation"):
            other.tier()
        assert decisions.read_manifest(ObjectStore(url)) == before
        assert other.remote_log_manager is not None
        assert other.remote_log_manager.decisions_status().failures == 1


def test_a_log_without_transactions_uploads_no_decisions(tmp_path: Path) -> None:
    url = (tmp_path / "remote").as_uri()
    with _open(tmp_path / "log", url, ManualClock(TS0)) as log:
        log.create_topic("t", 1, segment_bytes=700, remote_storage_enable=True)
        producer = log.producer(value_serializer=None)
        for i in range(50):
            producer.send("t", b"%d" % i)
        producer.close()
        log.topic("t").partition(0).roll()
        log.tier()
        assert not (tmp_path / "log" / "__transactions").exists()
    assert ObjectStore(url).list(decisions.PREFIX) == []
    with pylog.open(url, read_only=True, clock=ManualClock(TS0)) as ro:
        c = ro.consumer(
            value_deserializer=None, isolation_level="read_committed", auto_offset_reset="earliest"
        )
        c.assign([TopicPartition("t", 0)])
        assert [r.value for r in c.iterate(timeout_ms=0)] == [b"%d" % i for i in range(50)]
        c.close()


def test_restore_of_a_store_without_decisions_leaves_transactions_undecided(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A store tiered before decisions were uploaded: restore invents no outcome (read_committed stops at the
    first transaction, read_uncommitted reads everything) and still hands out only fresh producer ids."""
    url, model = _tiered_decisions(tmp_path)
    store = ObjectStore(url)
    for info in store.list(decisions.PREFIX):
        store.delete(info.key)
    restore(url, tmp_path / "restored", clock=ManualClock(TS0))
    assert "no transaction decisions" in caplog.text
    undecided = Model(model.records, dict.fromkeys(model.outcome, OPEN))
    with pylog.open(tmp_path / "restored", clock=ManualClock(TS0)) as restored:
        assert _rows(restored) == undecided.read_committed()
        c = restored.consumer(value_deserializer=None, auto_offset_reset="earliest")
        c.assign([TopicPartition("t", 0), TopicPartition("t", 1)])
        everything = sorted((r.partition, r.offset, r.value) for r in c.iterate(timeout_ms=0))
        c.close()
        assert everything == sorted((p, o, v) for p, recs in model.records.items() for o, v, _ in recs)
        source = TxnDecisions(str(tmp_path / "log"))
        source.status(0, 0, 0)  # reads the source's decisions.log
        _, epochs = source.decided()
        assert len(epochs) == 5 and restored.transactions().allocate_pid() > max(epochs)


class _LostAnswers(ObjectStore):
    """Every create-if-absent put is written, then answered as a retry would be after a lost answer: the key
    is taken (False)."""

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        first = super().put(key, data, if_absent=if_absent)
        return super().put(key, data, if_absent=if_absent) if if_absent and first else first


def test_a_lost_answer_of_a_decisions_put_is_not_a_failed_upload(tmp_path: Path) -> None:
    url, model = _tiered_decisions(tmp_path / "a")  # a log tiered through the ordinary store
    with _open(tmp_path / "a" / "log", url, ManualClock(TS0)) as log:
        _txn(log, model, "more", 3, COMMITTED, TIMEOUT_MS).close()
        result = decisions.upload_decisions(_LostAnswers(url), log.transactions())
        assert result.uploaded > 0 and result.manifest is not None
        newest, highest = decisions.read_manifest(ObjectStore(url))
        assert newest == result.manifest and highest == 2  # one version published, its chunk named
        for p in (0, 1):
            log.topic("t").partition(p).roll()
        log.tier()
        assert _rows(log) == model.read_committed()
    with pylog.open(url, read_only=True, clock=ManualClock(TS0)) as ro:
        assert _rows(ro) == model.read_committed()


def test_table_read_committed_of_the_url_log_equals_the_source_log(tmp_path: Path) -> None:
    """``Topic.table(isolation_level="read_committed")`` of a log opened read-only from its URL applies the
    tiered decisions: the latest committed value of each key, as the source log's table gives."""
    remote = (tmp_path / "remote").as_uri()
    model: dict[bytes, int] = {}
    with pylog.open(tmp_path / "log", remote_storage=remote, remote_log_manager_task_interval_ms=-1) as log:
        log.create_topic("kv", 1, segment_bytes=1024, remote_storage_enable=True)
        tx = log.producer(transactional_id="kv")
        tx.init_transactions()
        for i in range(40):
            key = f"k{i % 5}".encode()
            tx.begin_transaction()
            tx.send("kv", i, key=key)
            if i % 3:
                tx.commit_transaction()
                model[key] = i
            else:
                tx.abort_transaction()
        tx.close()
        log.topic("kv").partition(0).roll()
        log.tier()
        assert log.topic("kv").table(isolation_level="read_committed") == model
    replica = pylog.open(remote, read_only=True)
    try:
        assert replica.topic("kv").table(isolation_level="read_committed") == model
        assert replica.topic("kv").table() == {
            key: max(i for i in range(40) if f"k{i % 5}".encode() == key) for key in model
        }
    finally:
        replica.close()
