"""kafka-python 3 idioms run against pylog: a program ported by changing its imports keeps its behaviour.

Each test runs an idiom of a kafka-python program (futures, structs, errors, consumer and producer calls) and
checks what kafka-python does. Where kafka-python itself can be imported (it is in the dev extra), the
comparison is made against the real package: its futures, namedtuples and error classes."""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest

import pylog
import pylog.record
from pylog import errors, fs
from pylog.future import Future

try:
    with warnings.catch_warnings():  # kafka-python's import warns of its own deprecated calls
        warnings.simplefilter("ignore", DeprecationWarning)
        import kafka
        import kafka.errors
        import kafka.future
        import kafka.structs
except ImportError:  # the comparisons with the real package are skipped
    kafka = None

needs_kafka_python = pytest.mark.skipif(kafka is None, reason="kafka-python is not installed")


class _FailingWrites(fs.FileSystem):
    """Fails every write to segment files with EIO (a retriable StorageError)."""

    def pwrite(self, fd: int, data: Any, offset: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".log") and len(data) > 8:
            raise errors.StorageError(5, "injected EIO")
        super().pwrite(fd, data, offset)


# -- futures: is_done, value and exception are attributes --------------------------------------------------


def test_a_record_future_has_kafka_pythons_attributes(log: pylog.Log) -> None:
    log.create_topic("t")
    producer = log.producer(linger_ms=60_000, value_serializer=None)
    fut = producer.send("t", b"v", key=b"k")
    # `if fut.is_done:` and `fut.exception is None` are the idioms that silently broke with methods
    assert fut.is_done is False
    assert fut.value is None and fut.exception is None
    assert not fut.succeeded() and not fut.failed() and not fut.retriable()
    producer.flush()
    assert fut.is_done is True
    assert fut.exception is None
    assert fut.value == fut.get() and fut.value.offset == 0
    assert fut.succeeded() and not fut.failed() and not fut.retriable()
    producer.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_a_failed_record_future_is_retriable_and_reaches_errbacks(log: pylog.Log) -> None:
    log.create_topic("t")
    producer = log.producer(linger_ms=60_000)
    futures = [producer.send("t", {"i": i}) for i in range(3)]
    both: list[Any] = []
    futures[0].add_both(both.append)
    chained = Future()
    futures[1].chain(chained)
    with fs.install(_FailingWrites()):
        assert futures[2].exception is None  # still queued: nothing to see yet
        with pytest.raises(errors.DeliveryError) as info:
            producer.flush()
    assert info.value.count == 1  # the failures reached add_both and chain: seen; the third was not
    assert all(f.is_done and f.failed() and f.retriable() for f in futures)
    assert isinstance(futures[2].exception, errors.StorageError) and futures[2].value is None
    assert len(both) == 1 and isinstance(both[0], errors.StorageError)
    assert chained.is_done and chained.failed() and chained.retriable()
    assert isinstance(chained.exception, errors.StorageError)
    producer.close()


def test_callbacks_chain_and_add_both_receive_the_metadata(log: pylog.Log) -> None:
    log.create_topic("t")
    producer = log.producer(value_serializer=None)
    got: list[Any] = []
    chained = Future()
    fut = producer.send("t", b"v").add_callback(got.append).add_both(got.append).chain(chained)
    meta = fut.get(timeout=10)
    producer.flush()  # callbacks have run when flush returns
    assert got == [meta, meta]
    assert chained.is_done and chained.value == meta and chained.exception is None
    producer.close()


def test_a_callback_added_to_a_finished_future_runs_at_once(log: pylog.Log) -> None:
    log.create_topic("t")
    producer = log.producer()
    fut = producer.send("t", {"a": 1})
    meta = fut.get(timeout=10)
    got: list[Any] = []
    fut.add_callback(got.append).add_errback(got.append)
    assert got == [meta]  # at once, in this thread, as kafka-python runs it
    producer.close()


def test_a_batch_future_has_the_same_attributes(log: pylog.Log) -> None:
    log.create_topic("t")
    producer = log.producer(linger_ms=60_000)
    fut = producer.send_batch("t", values=[b"a", b"b"], wait=False)
    assert fut.is_done is False and fut.value is None and fut.exception is None
    result = fut.get(timeout=10)
    assert fut.is_done is True and fut.exception is None and fut.succeeded()
    assert fut.value is not None and fut.value.offsets.tolist() == result.offsets.tolist() == [0, 1]
    producer.close()


def _future_script(f: Any, fail: bool, error: BaseException) -> list[Any]:
    """What a program observes of a future through kafka-python's API, before and after it resolves."""
    seen: list[Any] = []
    seen.append((f.is_done, f.value, f.exception, f.succeeded(), f.failed(), f.retriable()))
    early: list[Any] = []
    assert f.add_callback(early.append, "cb") is f
    assert f.add_errback(early.append, "eb") is f
    assert f.add_both(early.append) is f
    if fail:
        f.failure(error)
    else:
        f.success(42)
    late: list[Any] = []
    f.add_callback(late.append).add_errback(late.append)
    exc = f.exception
    seen.append((f.is_done, f.value, type(exc).__name__, f.succeeded(), f.failed(), f.retriable()))
    norm = [type(x).__name__ if isinstance(x, BaseException) else x for x in early + late]
    seen.append(norm)
    return seen


@needs_kafka_python
@pytest.mark.parametrize("fail", [False, True])
@pytest.mark.parametrize("retriable", [False, True])
def test_pylog_future_behaves_as_kafka_pythons(fail: bool, retriable: bool) -> None:
    theirs = kafka.errors.KafkaTimeoutError if retriable else kafka.errors.IllegalStateError
    ours = errors.KafkaTimeoutError if retriable else errors.IllegalStateError
    want = _future_script(kafka.future.Future(), fail, theirs("x"))
    got = _future_script(Future(), fail, ours("x"))
    assert got == want


@needs_kafka_python
def test_a_pylog_future_chains_into_a_kafka_python_future(log: pylog.Log) -> None:
    log.create_topic("t")
    producer = log.producer()
    theirs = kafka.future.Future()
    producer.send("t", {"a": 1}).chain(theirs)
    producer.flush()
    assert theirs.is_done and theirs.succeeded() and theirs.value.topic == "t"
    producer.close()


def test_future_get_waits_and_raises() -> None:
    f = Future()
    with pytest.raises(errors.KafkaTimeoutError):
        f.get(timeout=0)
    f.failure(errors.CommitFailedError)  # a class is instantiated, as in kafka-python
    with pytest.raises(errors.CommitFailedError):
        f.get()
    with pytest.raises(errors.IllegalStateError):
        f.success(1)  # resolved once


# -- structs: kafka-python 3's fields, in its order ---------------------------------------------------------


def test_consumer_records_unpack_by_position_as_in_kafka_python(log: pylog.Log) -> None:
    log.create_topic("t")
    producer = log.producer(value_serializer=None)
    producer.send("t", b"plain", key=b"k", timestamp_ms=1000)
    producer.send("t", b"with", key=None, headers=[("h", b"12"), ("é", b"")], timestamp_ms=2000)
    producer.close()
    consumer = log.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None)
    first, second = list(consumer)
    consumer.close()
    topic, partition, leader_epoch, offset, timestamp, timestamp_type, key, value, headers, *rest = first
    checksum, key_size, value_size, header_size = rest
    assert (topic, partition, leader_epoch, offset, timestamp, timestamp_type) == ("t", 0, -1, 0, 1000, 0)
    assert (key, value, checksum, key_size, value_size) == (b"k", b"plain", None, 1, 5)
    assert headers == [] and isinstance(headers, list) and header_size == -1
    assert second.headers == [("h", b"12"), ("é", b"")]
    assert second.serialized_header_size == 1 + 2 + 2  # UTF-8 key bytes plus value bytes, as kafka-python
    assert (second.offset, second.key, second.serialized_key_size) == (1, None, -1)


def test_empty_headers_are_a_read_only_shared_list(log: pylog.Log) -> None:
    import pickle

    log.create_topic("t")
    producer = log.producer()
    producer.send("t", 1)
    producer.send("t", 2)
    producer.close()
    consumer = log.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0)
    a, b = list(consumer)
    consumer.close()
    with pytest.raises(TypeError, match=r"list\(record.headers\)"):
        a.headers.append(("k", b"v"))
    assert b.headers == [] and a.headers + [("k", b"v")] == [("k", b"v")]  # noqa: RUF005  # building a new list works
    copied = list(a.headers)
    copied.append(("k", b"v"))
    assert type(pickle.loads(pickle.dumps(a)).headers) is list


def test_record_metadata_unpacks_by_position_as_in_kafka_python(log: pylog.Log) -> None:
    log.create_topic("t", partitions=2)
    producer = log.producer(value_serializer=None)
    meta = producer.send("t", b"abc", key=b"k", partition=1, headers=[("h", b"xy")], timestamp_ms=7).get()
    producer.close()
    topic, partition, tp, offset, timestamp, checksum, key_size, value_size, header_size = meta
    assert (topic, partition, tp, offset, timestamp) == ("t", 1, pylog.TopicPartition("t", 1), 0, 7)
    assert (checksum, key_size, value_size, header_size) == (None, 1, 3, 3)
    assert meta.topic_partition == tp


def test_offset_structs_take_a_leader_epoch(log: pylog.Log) -> None:
    om = pylog.OffsetAndMetadata(1, "", -1)  # kafka-python 3's three fields
    assert om == (1, "", -1) and pylog.OffsetAndMetadata(1) == om
    log.create_topic("t")
    producer = log.producer()
    producer.send("t", 1, timestamp_ms=50).get()
    producer.close()
    consumer = log.consumer()
    tp = pylog.TopicPartition("t", 0)
    offset, timestamp, leader_epoch = consumer.offsets_for_times({tp: 10})[tp]
    assert (offset, timestamp, leader_epoch) == (0, 50, -1)
    consumer.close()


_THEIR_STRUCTS = {
    "TopicPartition": "kafka.structs.TopicPartition",
    "OffsetAndMetadata": "kafka.structs.OffsetAndMetadata",
    "OffsetAndTimestamp": "kafka.structs.OffsetAndTimestamp",
    "ConsumerGroupMetadata": "kafka.structs.ConsumerGroupMetadata",
    "ConsumerRecord": "kafka.consumer.fetcher.ConsumerRecord",
    "RecordMetadata": "kafka.producer.future.RecordMetadata",
}


@needs_kafka_python
def test_named_tuples_have_kafka_pythons_fields_in_its_order() -> None:
    import importlib

    import pylog.structs

    for ours, theirs in _THEIR_STRUCTS.items():
        module, _, name = theirs.rpartition(".")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            their_class = getattr(importlib.import_module(module), name)
        our_class = getattr(pylog.structs, ours, None)
        assert our_class is not None and our_class._fields == their_class._fields, ours
        if ours in ("ConsumerGroupMetadata", "OffsetAndMetadata"):  # defaults a program relies on
            common = {k: v for k, v in their_class._field_defaults.items() if k != "offset"}
            assert {k: our_class._field_defaults.get(k) for k in common} == common, ours


# -- errors: kafka-python's names and built-in classes -------------------------------------------------------

_KAFKA_NAMES = {
    "KafkaError": "PylogError",
    "KafkaConfigurationError": "ConfigError",
    "MessageSizeTooLargeError": "RecordTooLargeError",
    "TopicAlreadyExistsError": "TopicExistsError",
    "CorruptRecordException": "CorruptRecordError",
    "OutOfOrderSequenceNumberError": "OutOfOrderSequenceError",
    "GroupIdNotFoundError": "UnknownGroupError",
    "NonEmptyGroupError": "GroupNotEmptyError",
}


def test_kafka_pythons_error_names_catch_pylogs_errors(log: pylog.Log) -> None:
    from pylog.errors import KafkaError, MessageSizeTooLargeError, TopicAlreadyExistsError

    for theirs, ours in _KAFKA_NAMES.items():
        assert getattr(errors, theirs) is getattr(errors, ours)
    log.create_topic("t", max_message_bytes=1024)
    with pytest.raises(TopicAlreadyExistsError):
        log.create_topic("t")
    producer = log.producer(value_serializer=None)
    with pytest.raises(MessageSizeTooLargeError):
        producer.send("t", b"x" * 2048)
    with pytest.raises(KafkaError):
        producer.send("missing", b"x")
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        producer.send("missing", b"x")
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        producer.send("t", b"x", partition=3)
    producer.close()


def test_retriable_errors_derive_from_retriable_error() -> None:
    classes = {getattr(errors, name) for name in errors.__all__}
    for cls in classes:
        if issubclass(cls, errors.PylogError):
            assert issubclass(cls, errors.RetriableError) == cls.retriable, cls
    assert issubclass(errors.StorageError, errors.RetriableError)
    assert issubclass(errors.KafkaTimeoutError, errors.RetriableError)


@needs_kafka_python
def test_the_names_pylog_shares_with_kafka_python_are_the_same_kind_of_error() -> None:
    """A name in both packages: pylog's class says the same of retrying (kafka-python's RetriableError),
    except where pylog documents why not."""
    differs = {"UnknownTopicOrPartitionError", "RebalanceInProgressError"}  # see docs/errors.md
    shared = [n for n in errors.__all__ if hasattr(kafka.errors, n) and n not in differs]
    assert "KafkaTimeoutError" in shared and "CommitFailedError" in shared and len(shared) >= 15
    for name in shared:
        theirs, ours = getattr(kafka.errors, name), getattr(errors, name)
        assert isinstance(theirs, type) and issubclass(theirs, kafka.errors.KafkaError), name
        assert issubclass(ours, errors.RetriableError) == issubclass(theirs, kafka.errors.RetriableError), (
            name
        )


def test_wrong_argument_types_are_type_errors_as_in_kafka_python(log: pylog.Log) -> None:
    log.create_topic("t")
    tp = pylog.TopicPartition("t", 0)
    consumer = log.consumer()
    consumer.assign([tp])
    for call in (
        lambda: consumer.pause("t"),
        lambda: consumer.resume("t"),
        lambda: consumer.position("t"),
        lambda: consumer.seek("t", 0),
        lambda: consumer.pause(tp, "t"),
    ):
        with pytest.raises(TypeError):
            call()
    assert consumer.paused() == set()  # every argument is checked before any partition is paused
    with pytest.raises(errors.IllegalArgumentError):
        consumer.pause(("t",))
    consumer.close()
    producer = log.producer()
    with pytest.raises(TypeError):
        producer.send("t", b"v", headers=[("k", "not bytes")])
    with pytest.raises(TypeError):
        producer.send("t", b"v", headers=[(1, b"v")])
    with pytest.raises(errors.SerializationError):  # what errors.md names; also a ValueError, as before
        producer.send("t", b"v", headers="k=v")
    producer.close()
    raw = log.producer(value_serializer=None)
    with pytest.raises(TypeError):
        raw.send("t", b"v", key=123)  # no key_serializer
    raw.close()


def test_a_negative_poll_timeout_is_a_value_error(log: pylog.Log) -> None:
    log.create_topic("t")
    consumer = log.consumer("t")
    for bad in (-1, -0.5, float("-inf")):
        with pytest.raises(ValueError, match="negative"):
            consumer.poll(timeout_ms=bad)
    with pytest.raises(errors.ConfigError):
        consumer.poll(timeout_ms=-1)
    assert consumer.poll(timeout_ms=0) == {}
    consumer.close()


def test_calls_after_close_are_illegal_state_errors(log: pylog.Log) -> None:
    log.create_topic("t")
    producer = log.producer()
    producer.close()
    with pytest.raises(errors.IllegalStateError):
        producer.send("t", 1)
    consumer = log.consumer("t")
    consumer.close()
    with pytest.raises(errors.IllegalStateError):
        consumer.poll()


# -- consumer calls -------------------------------------------------------------------------------------------


def _their_signature_params(cls: Any, name: str) -> list[str]:
    import inspect

    return [p for p in inspect.signature(getattr(cls, name)).parameters if p != "self"]


_CONSUMER_CALLS = [
    "poll",
    "position",
    "committed",
    "commit",
    "commit_async",
    "close",
    "beginning_offsets",
    "end_offsets",
    "offsets_for_times",
    "highwater",
    "pause",
    "resume",
    "paused",
    "seek",
    "seek_to_beginning",
    "seek_to_end",
    "subscribe",
    "subscription",
    "unsubscribe",
    "assign",
    "assignment",
    "metrics",
    "partitions_for_topic",
    "topics",
    "group_metadata",
    "bootstrap_connected",
]
_PRODUCER_CALLS = [
    "send",
    "flush",
    "close",
    "partitions_for",
    "metrics",
    "bootstrap_connected",
    "init_transactions",
    "begin_transaction",
    "send_offsets_to_transaction",
    "commit_transaction",
    "abort_transaction",
]


def _missing_arguments(ours: Any, theirs: Any, names: list[str], ignore: tuple[str, ...] = ()) -> list[str]:
    """Each call of ``theirs`` (kafka-python) whose keyword arguments ``ours`` (pylog) does not all take."""
    import inspect

    missing = []
    for name in names:
        if not hasattr(ours, name):
            missing.append(f"{name}()")
            continue
        have = inspect.signature(getattr(ours, name)).parameters
        missing += [
            f"{name}({p}=)" for p in _their_signature_params(theirs, name) if p not in (*have, *ignore)
        ]
    return missing


@needs_kafka_python
def test_consumer_calls_take_kafka_pythons_arguments() -> None:
    assert _missing_arguments(pylog.Consumer, kafka.KafkaConsumer, _CONSUMER_CALLS) == []


@needs_kafka_python
def test_producer_calls_take_kafka_pythons_arguments() -> None:
    from pylog.idempotent import IdempotentProducer

    # close(null_logger=) is kafka-python's switch for closing from its own finalizer
    missing = _missing_arguments(IdempotentProducer, kafka.KafkaProducer, _PRODUCER_CALLS, ("null_logger",))
    assert missing == []


def test_timeout_ms_is_accepted_where_kafka_python_takes_it(log: pylog.Log) -> None:
    log.create_topic("t")
    tp = pylog.TopicPartition("t", 0)
    producer = log.producer()
    producer.send("t", 1, timestamp_ms=5).get()
    producer.close()
    consumer = log.consumer(group_id="g", auto_offset_reset="earliest", enable_auto_commit=False)
    consumer.assign([tp])
    assert consumer.beginning_offsets([tp], timeout_ms=1000) == {tp: 0}
    assert consumer.end_offsets([tp], timeout_ms=1000) == {tp: 1}
    assert consumer.offsets_for_times({tp: 0}, timeout_ms=1000)[tp] == (0, 5, -1)
    assert consumer.position(tp, timeout_ms=1000) == 0
    assert len(consumer.poll(timeout_ms=1000)[tp]) == 1
    consumer.commit({tp: pylog.OffsetAndMetadata(1, "", -1)}, timeout_ms=1000)
    assert consumer.committed(tp, metadata=True, timeout_ms=1000) == (1, "", -1)
    with pytest.raises(errors.ConfigError):
        consumer.position(tp, timeout_ms=-1)
    consumer.close(autocommit=False, timeout_ms=1000)


def test_highwater_partitions_and_bootstrap_as_in_kafka_python(log: pylog.Log) -> None:
    log.create_topic("t", partitions=3)
    producer = log.producer(client_id="orders-writer")
    assert producer.partitions_for("t") == {0, 1, 2}
    assert "orders-writer" in repr(producer) and producer.client_id == "orders-writer"
    assert log.producer().client_id.startswith("pylog-producer-")
    producer.send("t", 1, partition=2).get()
    assert producer.bootstrap_connected()
    producer.close()
    assert not producer.bootstrap_connected()
    tp = pylog.TopicPartition("t", 2)
    consumer = log.consumer()
    assert consumer.partitions_for_topic("missing") == set()  # kafka-python: an empty set
    with pytest.raises(errors.IllegalStateError):
        consumer.highwater(tp)  # not assigned
    consumer.assign([tp])
    assert consumer.highwater(tp) == 1
    with pytest.raises(TypeError):
        consumer.highwater("t")
    consumer.close()
    with pytest.raises(errors.ConfigError):
        log.producer(client_id=5)


def test_commit_async_returns_a_future_and_reports_errors_to_the_callback(log: pylog.Log) -> None:
    log.create_topic("t")
    producer = log.producer()
    for i in range(3):
        producer.send("t", i)
    producer.close()
    tp = pylog.TopicPartition("t", 0)
    consumer = log.consumer("t", group_id="g", auto_offset_reset="earliest", enable_auto_commit=False)
    assert len(consumer.poll(timeout_ms=5000)[tp]) == 3
    calls: list[Any] = []
    ok = consumer.commit_async(callback=lambda offsets, response: calls.append((offsets, response)))
    assert ok.get(timeout=10) is None and ok.succeeded() and ok.is_done
    bad = consumer.commit_async(
        {tp: 99}, callback=lambda offsets, response: calls.append((offsets, response))
    )
    assert bad.is_done and bad.failed() and isinstance(bad.exception, errors.InvalidOffsetError)  # not raised
    seen: list[Any] = []
    consumer.commit_async({tp: 2}).add_both(seen.append).get(timeout=10)
    consumer.poll(timeout_ms=0)  # callbacks run in a later poll, as in kafka-python
    assert calls[0] == ({tp: pylog.OffsetAndMetadata(3, "")}, None)
    assert calls[1][0] == {tp: 99} and isinstance(calls[1][1], errors.InvalidOffsetError)
    assert seen == [None]
    assert consumer.committed(tp) == 2
    consumer.close()
    with pytest.raises(errors.IllegalStateError):
        log.consumer().commit_async()  # no group_id: raised, as kafka-python does


def test_group_metadata_fences_a_transaction_of_a_stale_member(log: pylog.Log, clock: Any) -> None:
    log.create_topic("in", partitions=2)
    log.create_topic("out")
    feed = log.producer()
    for i in range(4):
        feed.send("in", i, partition=i % 2)
    feed.close()
    assert log.consumer().group_metadata() == pylog.structs.ConsumerGroupMetadata(group_id=None)
    consumer = log.consumer("in", group_id="g", auto_offset_reset="earliest", enable_auto_commit=False)
    records = consumer.poll(timeout_ms=5000)
    meta = consumer.group_metadata()
    assert meta.group_id == "g" and meta.member_id and meta.generation_id >= 0
    assert meta.state == pylog.structs.MemberState.STABLE
    tx = log.producer(transactional_id="tx")
    tx.init_transactions()
    tx.begin_transaction()
    tx.send("out", 1)
    offsets = {tp: pylog.OffsetAndMetadata(recs[-1].offset + 1) for tp, recs in records.items()}
    tx.send_offsets_to_transaction(offsets, meta)
    tx.commit_transaction()
    assert consumer.committed(pylog.TopicPartition("in", 0)) == 2
    # another member joins: a new generation; the old metadata no longer commits
    other = log.consumer("in", group_id="g", auto_offset_reset="earliest", enable_auto_commit=False)
    stable = pylog.structs.MemberState.STABLE
    for _ in range(200):  # until the group settled with both members (each poll takes its turn)
        consumer.poll(timeout_ms=10)
        other.poll(timeout_ms=10)
        now = consumer.group_metadata()
        if now.state == stable and other.group_metadata().state == stable and other.assignment():
            break
    assert now.state == stable and now.generation_id != meta.generation_id
    tx.begin_transaction()
    with pytest.raises(errors.CommitFailedError):
        tx.send_offsets_to_transaction({pylog.TopicPartition("in", 0): 2}, meta)
    tx.abort_transaction()
    tx.begin_transaction()
    tx.send_offsets_to_transaction({pylog.TopicPartition("in", 0): 2}, consumer.group_metadata())
    tx.commit_transaction()
    tx.close()
    other.close()
    consumer.close()


def test_metrics_have_kafka_pythons_shape(log: pylog.Log, clock: Any) -> None:
    log.create_topic("t")
    producer = log.producer(value_serializer=None)
    for _ in range(10):
        producer.send("t", b"x" * 10)
    producer.flush()
    m = producer.metrics()
    assert set(m) == {"producer-metrics"}
    assert m["producer-metrics"]["record-send-total"] == 10
    assert m["producer-metrics"]["records-per-request-avg"] > 0 and m["producer-metrics"]["byte-total"] > 100
    assert ("producer-metrics", "record-send-total") in producer.metrics(raw=True)
    producer.close()
    consumer = log.consumer("t", auto_offset_reset="earliest", value_deserializer=None, max_poll_records=4)
    assert consumer.metrics()["consumer-fetch-manager-metrics"]["records-consumed-total"] == 0
    got = consumer.poll(timeout_ms=5000)
    assert sum(map(len, got.values())) == 4
    fm = consumer.metrics()["consumer-fetch-manager-metrics"]
    assert fm["records-consumed-total"] == 4 and fm["fetch-total"] >= 1 and fm["records-lag-max"] == 6
    assert consumer.metrics()["consumer-coordinator-metrics"]["assigned-partitions"] == 1
    assert all(isinstance(v, float) for g in consumer.metrics().values() for v in g.values())
    consumer.close()


# -- snappy ---------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not pylog.record.codec_available("snappy"), reason="cramjam is not installed")
def test_snappy_compression_round_trips(log: pylog.Log) -> None:
    log.create_topic("t", partitions=2)
    producer = log.producer(compression_type="snappy", value_serializer=None)
    values = [b"value %d " % i * 20 for i in range(300)]
    for i, v in enumerate(values):
        producer.send("t", v, key=b"k%d" % i, headers=[("h", b"%d" % i)] if i % 3 == 0 else None)
    producer.close()
    plog = log.topic("t").partition(0)
    (buf, at), *_ = plog.read_raw(0, 1 << 20)
    header = pylog.record.decode_header(buf, at)
    assert header.compression == "snappy" and header.batch_length < header.payload_length
    consumer = log.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None)
    got = {r.key: (r.value, r.headers) for r in consumer}
    consumer.close()
    assert got == {b"k%d" % i: (v, [("h", b"%d" % i)] if i % 3 == 0 else []) for i, v in enumerate(values)}
    log.create_topic("s", compression_type="snappy")  # a topic's own compression too
    plain = log.producer()
    plain.send("s", {"a": 1}).get()
    plain.close()
    assert log.topic("s").partition(0).read(0, 1 << 20)[0].header.compression == "snappy"


@pytest.mark.skipif(not pylog.record.codec_available("snappy"), reason="cramjam is not installed")
def test_without_cramjam_snappy_is_an_error_naming_the_extra(
    log: pylog.Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    log.create_topic("t")
    producer = log.producer(compression_type="snappy")
    producer.send("t", 1).get()
    producer.close()
    monkeypatch.setattr(pylog.record, "_cramjam", None)
    with pytest.raises(errors.UnsupportedCodecError, match=r"pylog\[snappy\]"):
        log.producer(compression_type="snappy")
    consumer = log.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0)
    with pytest.raises(errors.UnsupportedCodecError, match=r"pylog\[snappy\]"):
        list(consumer)  # the stored batch is intact: not a CorruptRecordError
    consumer.close()
    monkeypatch.undo()
    again = log.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=0)
    assert [r.value for r in again] == [1]
    again.close()


# -- the ported worker as a whole ---------------------------------------------------------------------------


def test_the_ported_worker_runs_with_its_kafka_python_idioms(log: pylog.Log) -> None:
    """The program of the port report (a group worker with a listener committing on revoke, pause/resume,
    seek_to_beginning, end_offsets, offsets_for_times, commit_async; a producer with callbacks, headers,
    compression and serializers), with only its imports and constructor lines changed."""
    import json

    from pylog import ConsumerRebalanceListener, OffsetAndMetadata, TopicPartition
    from pylog.errors import KafkaError, KafkaTimeoutError

    log.create_topic("orders", partitions=2)
    producer = log.producer(
        client_id="worker",
        compression_type="gzip",
        key_serializer=str.encode,
        value_serializer=lambda v: json.dumps(v).encode(),
    )
    acked: list[Any] = []
    futures = []
    for i in range(20):
        fut = producer.send(
            "orders", {"n": i}, key=str(i % 4), headers=[("src", b"web")], timestamp_ms=1000 + i
        )
        futures.append(fut.add_callback(acked.append).add_errback(lambda e: pytest.fail(str(e))))
    producer.flush(timeout=10)
    assert all(f.is_done and f.exception is None and f.succeeded() for f in futures)
    assert sorted(m.offset for m in acked) == sorted(f.value.offset for f in futures)
    topic, partition, tp0, offset, *_ = futures[0].get(timeout=10)
    assert (topic, tp0, offset) == ("orders", TopicPartition("orders", partition), futures[0].value.offset)
    producer.close()

    committed_on_revoke: list[Any] = []

    class CommitOnRevoke(ConsumerRebalanceListener):
        def __init__(self, consumer: Any) -> None:
            self.consumer = consumer

        def on_partitions_revoked(self, revoked: Any) -> None:
            if revoked:
                self.consumer.commit()
                committed_on_revoke.extend(revoked)

        def on_partitions_assigned(self, assigned: Any) -> None:
            pass

    consumer = log.consumer(
        group_id="workers",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        value_deserializer=lambda b: json.loads(b.decode()),
    )
    consumer.subscribe(["orders"], listener=CommitOnRevoke(consumer))
    seen: list[int] = []
    results: list[Any] = []
    try:
        while len(seen) < 20:
            batch = consumer.poll(timeout_ms=1000)
            for _tp, records in batch.items():
                for _topic, _part, leader_epoch, _offset, _ts, _ts_type, key, value, headers, *_ in records:
                    assert headers == [("src", b"web")] and leader_epoch == -1 and key is not None
                    seen.append(value["n"])
            if batch:
                paused = next(iter(batch))
                consumer.pause(paused)
                assert consumer.paused() == {paused}
                consumer.resume(paused)
                future = consumer.commit_async(callback=lambda offsets, response: results.append(response))
                assert future.get(timeout=10) is None
    except KafkaError as exc:  # kafka-python's base catches every pylog error
        pytest.fail(f"unexpected {exc!r}")
    assert sorted(seen) == list(range(20))
    tps = consumer.assignment()
    ends = consumer.end_offsets(list(tps))
    assert sum(ends.values()) == 20 and all(consumer.highwater(tp) == ends[tp] for tp in tps)
    consumer.poll(timeout_ms=0)  # the commit callbacks run here
    assert results and all(r is None for r in results)
    assert all(consumer.committed(tp) == ends[tp] for tp in tps)
    found = consumer.offsets_for_times({tp: 1005 for tp in tps})
    assert sorted(v.timestamp for v in found.values() if v is not None)[0] == 1005
    consumer.seek_to_beginning()
    assert all(consumer.position(tp) == 0 for tp in tps)
    with pytest.raises(KafkaTimeoutError):
        pylog.future.Future().get(timeout=0)
    consumer.commit({tp: OffsetAndMetadata(ends[tp], "done", -1) for tp in tps})
    assert all(log.group_offsets("workers")[tp] == (ends[tp], "done", -1) for tp in tps)
    consumer.close()
    assert committed_on_revoke == sorted(tps)  # close() revokes: the listener committed the positions
    assert all(log.group_offsets("workers")[tp].offset == 0 for tp in tps)
