"""Records as :mod:`pylog.testing` sees them, and their conversion to and from pylog batches.

A :data:`Record` is a plain ``(key, value, headers, timestamp_ms)`` tuple (hashable and compared by value,
so the model and the checks can match what was sent with what is read back byte for byte);
:data:`PartitionKey` names a partition as ``(topic, partition)``. :func:`encode_records` makes one batch of
records for :meth:`~pylog.partition.log.PartitionLog.append`; :func:`batch_records` turns a decoded batch
back into ``(offset, record)`` pairs. Stateless: safe to use from any thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from pylog.record import DecodedBatch, encode_batch, encode_headers

__all__ = ["Headers", "PartitionKey", "Record", "batch_records", "encode_records"]

Headers: TypeAlias = tuple[tuple[str, bytes | None], ...]
#: One record as the model sees it: ``(key, value, headers, timestamp_ms)``.
Record: TypeAlias = tuple[bytes | None, bytes | None, Headers, int]
#: ``(topic, partition)``.
PartitionKey: TypeAlias = tuple[str, int]


def encode_records(records_: Sequence[Record], *, compression: str = "none") -> bytes:
    """One batch (base offset 0, ready for :meth:`PartitionLog.append`) holding ``records_`` in order."""
    headers = [encode_headers(r[2]) for r in records_]
    return encode_batch(
        0,
        [r[0] for r in records_],
        [r[1] for r in records_],
        [r[3] for r in records_],
        headers if any(headers) else None,
        compression=compression,
    )


def batch_records(batch: DecodedBatch) -> list[tuple[int, Record]]:
    """``(offset, record)`` for every record of a decoded batch."""
    keys, values, headers = batch.keys(), batch.values(), batch.headers()
    return [
        (int(o), (keys[i], values[i], tuple((str(k), v) for k, v in headers[i]), int(batch.timestamps[i])))
        for i, o in enumerate(batch.offsets.tolist())
    ]
