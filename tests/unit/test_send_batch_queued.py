"""``send_batch(wait=False)``: columns queued and written by a later drain, possibly several calls as one set of
columns. Checked against a model: every call's records land in call order (``send()`` records and synchronous
``send_batch`` calls included), at the offsets their future reports, with their bytes; bad input raises at once
and queues nothing; a failure reaches the caller through the future or the next flush()."""

from __future__ import annotations

import random

import numpy as np
import pytest

import pylog
from pylog import errors

Rec = tuple[bytes | None, bytes | None]


def _read(log: pylog.Log, topic: str) -> dict[int, list[tuple[int, Rec]]]:
    c = log.consumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=0, value_deserializer=None)
    out: dict[int, list[tuple[int, Rec]]] = {}
    for r in c:
        out.setdefault(r.partition, []).append((r.offset, (r.key, r.value)))
    c.close()
    return out


def _fixed(rng: random.Random, n: int, width: int) -> np.ndarray:
    return np.frombuffer(rng.randbytes(n * width), dtype=np.uint8).reshape(n, width)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("partitions", [1, 3])
def test_queued_calls_land_in_order_at_their_offsets(log: pylog.Log, seed: int, partitions: int) -> None:
    rng = random.Random(seed)
    log.create_topic("t", partitions=partitions)
    p = log.producer(value_serializer=None)
    expected: list[tuple[object, list[Rec]]] = []  # (future or result, its records) in call order
    for _ in range(40):
        kind = rng.choice(["fixed", "fixed", "keyless", "list", "send", "sync", "partition"])
        n = rng.randint(1, 30)
        if kind in ("fixed", "keyless", "partition"):
            width = rng.choice([8, 8, 16])
            keys = None if kind == "keyless" else _fixed(rng, n, width)
            values = _fixed(rng, n, 24)
            part = rng.randrange(partitions) if kind == "partition" else None
            fut = p.send_batch("t", keys=keys, values=values, partition=part, wait=False)
            recs = [(None if keys is None else keys[i].tobytes(), values[i].tobytes()) for i in range(n)]
            expected.append((fut, recs))
        elif kind == "list":
            lkeys: list[bytes | None] = [
                rng.choice([None, rng.randbytes(rng.randint(0, 9))]) for _ in range(n)
            ]
            lvalues = [rng.randbytes(rng.randint(0, 40)) for _ in range(n)]
            fut = p.send_batch("t", keys=lkeys, values=lvalues, wait=False)
            expected.append((fut, list(zip(lkeys, lvalues, strict=True))))
        elif kind == "sync":
            svalues = [rng.randbytes(5) for _ in range(n)]
            expected.append((p.send_batch("t", values=svalues), [(None, v) for v in svalues]))
        else:
            k, v = rng.randbytes(4), rng.randbytes(12)
            expected.append((p.send("t", value=v, key=k), [(k, v)]))
    p.flush()
    stored = {part: dict(recs) for part, recs in _read(log, "t").items()}
    seen = 0
    last: dict[int, int] = {}
    for handle, recs in expected:
        if isinstance(handle, pylog.FutureRecordMetadata):
            m = handle.get()
            where = [(m.partition, m.offset)]
        else:
            res = handle.get() if isinstance(handle, pylog.BatchFuture) else handle
            assert isinstance(res, pylog.BatchResult) and len(res) == len(recs)
            where = list(zip(res.partitions.tolist(), res.offsets.tolist(), strict=True))
        for (part, offset), rec in zip(where, recs, strict=True):
            assert stored[part][offset] == rec
            assert offset > last.get(part, -1)  # per partition, in call order
            last[part] = offset
            seen += 1
    assert seen == sum(len(v) for v in stored.values())  # nothing else, nothing twice


def test_bad_input_raises_at_once_and_queues_nothing(log: pylog.Log) -> None:
    log.create_topic("t", partitions=2, max_message_bytes=1000)
    p = log.producer(value_serializer=None)
    with pytest.raises(errors.InvalidRecordError):
        p.send_batch("t", keys=[b"a", None], values=[b"x", None], wait=False)  # a record with neither
    with pytest.raises(errors.RecordTooLargeError):
        p.send_batch("t", values=[b"x" * 2000], wait=False)
    with pytest.raises(errors.UnknownPartitionError):
        p.send_batch("t", values=[b"x"], partition=2, wait=False)
    with pytest.raises(errors.InvalidTimestampError):
        p.send_batch("t", values=[b"x"], timestamps=[-5], wait=False)
    with pytest.raises(errors.InvalidRecordError):
        p.send_batch("t", values=[], wait=False)
    p.flush()
    assert _read(log, "t") == {}


def test_a_failure_reaches_the_future_or_the_next_flush(log: pylog.Log) -> None:
    log.create_topic("t")
    p = log.producer(value_serializer=None)
    seen = p.send_batch("t", values=[b"a", b"b"], wait=False)
    unseen = p.send_batch("t", values=[b"c", b"d", b"e"], wait=False)
    log.delete_topic("t")
    with pytest.raises(errors.UnknownTopicError):
        seen.get()
    assert isinstance(unseen.exception, errors.UnknownTopicError)  # looked at: counts as seen
    log.create_topic("u")
    p.send_batch("u", values=[b"f"], wait=False)  # nobody looks at this one
    log.delete_topic("u")
    with pytest.raises(errors.DeliveryError) as info:
        p.flush()
    assert info.value.count == 1  # only the records nobody saw failing
    p.flush()  # reported once


def test_acks_all_future_resolves_after_the_fsync(log: pylog.Log) -> None:
    log.create_topic("t")
    p = log.producer(acks="all", value_serializer=None)
    fut = p.send_batch("t", values=_fixed(random.Random(1), 100, 16), wait=False)
    res = fut.get()
    assert res.offsets.tolist() == list(range(100))
    assert log.topic("t").partition(0).flushed_offset >= 100


def test_queued_columns_are_written_at_close(log_dir: str) -> None:
    with pylog.open(log_dir) as log:
        log.create_topic("t")
        p = log.producer(value_serializer=None)
        for i in range(10):
            p.send_batch("t", values=[bytes([i])] * 5, wait=False)
    with pylog.open(log_dir) as log:
        values = [rec[1] for _, rec in _read(log, "t")[0]]
    assert values == [bytes([i]) for i in range(10) for _ in range(5)]
