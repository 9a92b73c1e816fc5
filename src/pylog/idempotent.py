"""The idempotent and the transactional producer.

``log.producer(enable_idempotence=True)`` gives every batch this producer's id, epoch and a sequence number
per partition, and retries an append that failed with a storage error (``retries``, ``retry_backoff_ms``, as
in Kafka). Before a retry it looks at the partition's tail for a batch with its own ``(producer_id, epoch,
sequence)``: found (the failed attempt reached the log after all), the batch is acknowledged with the
offsets it already has; not found, it is written. A batch of this producer id with a later sequence than the
one being retried means that someone else writes with its id:
:class:`~pylog.errors.OutOfOrderSequenceError`. A failed fsync is not retried (its data may be gone from the
page cache): the error reaches the caller.

``log.producer(transactional_id="...")`` adds transactions (Kafka's API)::

    producer.init_transactions()          # fences older instances with this id, aborts their open transaction
    producer.begin_transaction()
    producer.send("out", value, key=key)  # written at once, invisible to read_committed readers until commit
    producer.send_offsets_to_transaction({tp: OffsetAndMetadata(next_offset)}, "group-id")
    producer.commit_transaction()         # or abort_transaction()

Records, and the group offsets sent with them, become visible atomically when the commit decision is
fsynced (:mod:`pylog.transactions`). Transactional producers always wait for fsync (``acks="all"``).

Thread-safety: as :class:`~pylog.producer.Producer`; transaction calls belong to one thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pylog.errors import (
    ConfigError,
    IllegalStateError,
    OutOfOrderSequenceError,
    PylogError,
    StorageError,
)
from pylog.groups.admin import check_transaction_member, stage_transactional_offsets
from pylog.partition.log import AppendInfo
from pylog.producer import Producer
from pylog.record import decode_header
from pylog.structs import OffsetAndMetadata, TopicPartition

if TYPE_CHECKING:
    from pylog.directory import LogDirectory
    from pylog.partition.log import PartitionLog

__all__ = ["IdempotentProducer"]


class IdempotentProducer(Producer):
    """See the module docstring. Extra config: ``enable_idempotence``, ``transactional_id``,
    ``transaction_timeout_ms`` (Kafka's default, 60 s)."""

    def __init__(
        self,
        log: LogDirectory,
        *,
        enable_idempotence: bool = True,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
        retries: int = 5,
        retry_backoff_ms: int = 100,
        **config: Any,
    ) -> None:
        if transactional_id is not None and (not isinstance(transactional_id, str) or not transactional_id):
            raise ConfigError(f"transactional_id must be a non-empty str, got {transactional_id!r}")
        if not enable_idempotence and transactional_id is not None:
            raise ConfigError("a transactional producer is idempotent: enable_idempotence cannot be False")
        if (
            isinstance(transaction_timeout_ms, bool)
            or not isinstance(transaction_timeout_ms, int)
            or transaction_timeout_ms < 1
        ):
            raise ConfigError(f"transaction_timeout_ms must be an int >= 1, got {transaction_timeout_ms!r}")
        if transactional_id is not None:
            if config.get("acks", "all") not in ("all", -1):
                raise ConfigError('a transactional producer needs acks="all"')
            config["acks"] = "all"
        for name, value in (("retries", retries), ("retry_backoff_ms", retry_backoff_ms)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be an int >= 0, got {value!r}")
        super().__init__(log, **config)
        self.retries = retries
        self.retry_backoff_ms = retry_backoff_ms
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self._txns = log.transactions()
        self.producer_id = -1
        self.producer_epoch = -1
        if transactional_id is None:
            self.producer_id, self.producer_epoch = self._txns.allocate_pid(), 0
        self._sequences: dict[TopicPartition, int] = {}
        self._txn = -1
        self._txn_offsets: dict[str, dict[TopicPartition, OffsetAndMetadata]] = {}
        self._txn_members: dict[str, tuple[str, int]] = {}  # group -> (member id, generation) to fence with

    # -- batches ------------------------------------------------------------------------------------------

    def _batch_fields(self, tp: TopicPartition) -> dict[str, Any]:
        if self.transactional_id is not None:
            if self._txn < 0:
                raise IllegalStateError("send() of a transactional producer needs begin_transaction() first")
            return {
                "producer_id": self.producer_id,
                "producer_epoch": self.producer_epoch,
                "base_sequence": self._txn,
                "transactional": True,
            }
        return {
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "base_sequence": self._sequences.get(tp, 0),
        }

    def _append_batch(
        self, plog: PartitionLog, tp: TopicPartition, batch: bytes | bytearray, fields: Mapping[str, Any]
    ) -> AppendInfo:
        """Append with up to ``retries`` retries after a storage error; a retry first checks whether the failed
        attempt landed after all (same producer id, epoch and sequence), and then acknowledges it instead of
        writing it again."""
        sequence = fields["base_sequence"]
        before = plog.log_end_offset
        attempt = 0
        while True:
            try:
                info = plog.append(batch)
                break
            except StorageError:
                attempt += 1
                if attempt > self.retries:
                    raise
                self.log.clock.sleep(self.retry_backoff_ms / 1000)
                landed = self._find(plog, before, sequence)
                if landed is not None:
                    info = landed
                    break
        if self.transactional_id is None:
            self._sequences[tp] = sequence + 1
        return info

    def _find(self, plog: PartitionLog, start: int, sequence: int) -> AppendInfo | None:
        """The batch of this producer with ``sequence`` at or after offset ``start``, if it was written."""
        position = max(start, plog.log_start_offset)
        while position < plog.log_end_offset:
            chunk = plog.read_raw(position, 1 << 20)
            if not chunk:
                break
            for buf, at in chunk:
                h = decode_header(buf, at)
                position = h.next_offset
                if h.producer_id != self.producer_id or h.producer_epoch != self.producer_epoch:
                    continue
                if h.base_sequence == sequence:
                    return AppendInfo(h.base_offset, h.last_offset, -1)
                if h.base_sequence > sequence:
                    raise OutOfOrderSequenceError(
                        f"{plog.topic}-{plog.partition} holds sequence {h.base_sequence} of producer "
                        f"{self.producer_id} before its sequence {sequence}: another writer uses this producer id"
                    )
        return None

    # -- transactions -------------------------------------------------------------------------------------

    def _require_transactional(self) -> str:
        if self.transactional_id is None:
            raise IllegalStateError("transactions need a producer created with transactional_id=...")
        return self.transactional_id

    def init_transactions(self) -> None:
        """Register the transactional id: fence older producers with it and abort their open transaction."""
        tid = self._require_transactional()
        self.producer_id, self.producer_epoch = self._txns.init(tid)
        self._txn = -1

    @property
    def open_transaction(self) -> tuple[int, int, int] | None:
        """``(producer_id, producer_epoch, txn)`` of the open transaction (what its batches are tagged with, and
        what :meth:`pylog.transactions.TxnLog.commit_many` takes), or None outside a transaction."""
        if self.transactional_id is None or self._txn < 0:
            return None
        return (self.producer_id, self.producer_epoch, self._txn)

    def begin_transaction(self) -> None:
        tid = self._require_transactional()
        if self.producer_id < 0:
            raise IllegalStateError("call init_transactions() before begin_transaction()")
        if self._txn >= 0:
            raise IllegalStateError("a transaction is already open; commit or abort it first")
        self.flush()
        self._txn = self._txns.begin(
            tid, self.producer_id, self.producer_epoch, self.log.clock.time_ms(), self.transaction_timeout_ms
        )
        self._txn_offsets = {}
        self._txn_members = {}

    def send_offsets_to_transaction(self, offsets: Mapping[Any, Any], group_metadata: Any) -> None:
        """Commit ``offsets`` (``{TopicPartition: OffsetAndMetadata or int}``) for a consumer group together
        with this transaction. ``group_metadata`` is a consumer's ``group_metadata()`` (preferred, as in
        kafka-python 3) or a group id. With the metadata of a group member, the offsets are committed only if
        that member is still in the same generation of the group, here and at ``commit_transaction()``
        (Kafka's fencing of zombie consumers, KIP-447): else :class:`~pylog.errors.CommitFailedError`, and the
        transaction is to be aborted."""
        self._require_transactional()
        if self._txn < 0:
            raise IllegalStateError("send_offsets_to_transaction() needs an open transaction")
        group = getattr(group_metadata, "group_id", group_metadata)
        if not isinstance(group, str):
            raise ConfigError(
                "send_offsets_to_transaction() needs a consumer's group_metadata() (of a consumer with a "
                f"group_id) or a group id str, got {group_metadata!r}"
            )
        member_id = getattr(group_metadata, "member_id", "")
        generation = getattr(group_metadata, "generation_id", -1)
        member = (member_id, generation) if isinstance(member_id, str) and member_id else None
        if member is not None:
            check_transaction_member(self.log, group, member)
        staged = self._txn_offsets.setdefault(group, {})
        for tp, value in offsets.items():
            om = value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(value)
            staged[TopicPartition(*tp)] = om
        if member is not None:
            self._txn_members[group] = member

    def commit_transaction(self) -> None:
        """Make every record and offset of the transaction visible, atomically (after their fsync)."""
        tid = self._require_transactional()
        if self._txn < 0:
            raise IllegalStateError("commit_transaction() needs an open transaction")
        self.flush()  # appends and fsyncs every pending record of the transaction (acks="all")
        for group, offsets in self._txn_offsets.items():
            stage_transactional_offsets(
                self.log,
                group,
                offsets,
                (self.producer_id, self.producer_epoch, self._txn),
                self._txn_members.get(group),
            )
        try:
            self._txns.end(tid, self.producer_id, self.producer_epoch, self._txn, commit=True)
        finally:
            self._txn = -1
            self._txn_offsets = {}
            self._txn_members = {}

    def abort_transaction(self) -> None:
        """Hide every record of the transaction; its offsets are not committed."""
        tid = self._require_transactional()
        if self._txn < 0:
            raise IllegalStateError("abort_transaction() needs an open transaction")
        try:
            self.flush()
        except PylogError:
            pass  # what could not be written needs no hiding
        try:
            self._txns.end(tid, self.producer_id, self.producer_epoch, self._txn, commit=False)
        finally:
            self._txn = -1
            self._txn_offsets = {}
            self._txn_members = {}
