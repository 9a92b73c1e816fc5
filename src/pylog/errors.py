"""The pylog exception tree.

Every error pylog raises on purpose is a :class:`PylogError`. Errors caused by a bad argument also subclass the
fitting built-in (``ValueError``, ``TypeError``, ``KeyError``) so code written against plain Python keeps working.
Each class says when it is raised and what to do about it; ``retriable`` tells whether the same call may succeed
if simply tried again (the retriable errors derive from :class:`RetriableError`, as in kafka-python).

A program written for kafka-python catches pylog's errors under kafka-python's names where the condition exists:
``KafkaError`` is :class:`PylogError`, and the names below the tree are aliases of pylog's classes.

::

    PylogError                                   (kafka-python: KafkaError)
    ├── ConfigError (ValueError)                 a config name or value is not valid
    ├── IllegalArgumentError (TypeError)         an argument of the wrong type (a str for a TopicPartition)
    ├── InvalidTopicError (ValueError)           topic name breaks Kafka's naming rule
    ├── TopicExistsError                         create_topic of a name that exists
    ├── UnknownTopicOrPartitionError (KeyError)  no such topic or partition
    │   ├── UnknownTopicError                    no such topic
    │   └── UnknownPartitionError                partition number outside 0..partitions-1
    ├── InvalidRecordError (ValueError)          a record that cannot be written as given
    │   ├── RecordTooLargeError                  batch over max_message_bytes
    │   ├── SerializationError (TypeError)       key/value/headers could not be encoded
    │   └── InvalidTimestampError                timestamp not an int in range, or outside the topic's window
    ├── DeserializationError                     a stored value could not be decoded by the deserializer
    ├── OffsetOutOfRangeError                    offset below log_start_offset or above log_end_offset
    ├── InvalidOffsetError (ValueError)          an offset argument that is not a valid offset at all
    ├── ForkedProcessError                       an object opened before fork() used in the child
    ├── NotALogDirectoryError (ValueError)       a path that is not (and cannot become) a pylog log directory
    ├── ReadOnlyLogError                         a write to a log opened read-only
    ├── PermissionDeniedError (PermissionError)  the OS denied a permission pylog needs on the log
    ├── CorruptRecordError                       a stored batch fails its CRC, bounds or offset checks
    │   └── CorruptIndexError                    an index file fails its sanity check (rebuildable)
    ├── UnsupportedFormatError                   a file written by a newer/unknown format version
    ├── UnsupportedCodecError                    a compression codec whose library is not installed (snappy)
    ├── RetriableError                           the same call may succeed if tried again
    │   ├── LockError                            a lock on the log directory could not be taken
    │   ├── StorageError (OSError)               the operating system refused an I/O operation
    │   │   ├── DiskFullError                    ENOSPC / EDQUOT
    │   │   └── RemoteStorageError               the object store (tiered storage) refused or failed a request
    │   ├── KafkaTimeoutError (TimeoutError)     a wait ran out (future.get, flush)
    │   └── RebalanceInProgressError             the group is rebalancing; retry after the next poll
    ├── DeliveryError                            records accepted by send() that could not be written
    ├── IllegalStateError                        a call that does not fit the object's state
    │   └── LogClosedError                       the Log, Producer or Consumer was closed
    ├── NoOffsetForPartitionError                auto_offset_reset="none" and no position is known
    ├── CommitFailedError                        the member was fenced by a newer group generation
    ├── GroupNotEmptyError                       an admin action that needs the group to have no members
    ├── ProducerFencedError                      a newer producer with the same transactional_id took over
    ├── OutOfOrderSequenceError                  a producer id's batches are not in sequence order
    ├── UnknownGroupError                        no consumer group of that id exists in this log
    └── CliError                                 a failure of a `pylog` command (exit status 1)
        ├── UsageError (ValueError)              the command line is wrong (exit status 2)
        ├── InputError (ValueError)              a line of input cannot be produced as asked
        ├── NotASegmentFileError (ValueError)    `pylog dump` was given a file that holds no segment data
        ├── Unavailable                          a feature this pylog does not have (exit status 2)
        └── Interrupted                          SIGINT or SIGTERM ended the command (exit 128 + signal)

kafka-python's names: ``KafkaError`` = :class:`PylogError`, ``KafkaConfigurationError`` = :class:`ConfigError`,
``MessageSizeTooLargeError`` = :class:`RecordTooLargeError`, ``TopicAlreadyExistsError`` =
:class:`TopicExistsError`, ``CorruptRecordException`` = :class:`CorruptRecordError`,
``OutOfOrderSequenceNumberError`` = :class:`OutOfOrderSequenceError`, ``GroupIdNotFoundError`` =
:class:`UnknownGroupError`, ``NonEmptyGroupError`` = :class:`GroupNotEmptyError`; ``RetriableError``,
``IllegalArgumentError``, ``UnknownTopicOrPartitionError``, ``UnsupportedCodecError`` and the other same-named
classes are pylog's own.

The same tree is mirrored in ``docs/errors.md``.
"""

from __future__ import annotations

import errno
import signal
from typing import Any

__all__ = [
    "CliError",
    "CommitFailedError",
    "ConfigError",
    "CorruptIndexError",
    "CorruptRecordError",
    "CorruptRecordException",
    "DeliveryError",
    "DeserializationError",
    "DiskFullError",
    "ForkedProcessError",
    "GroupIdNotFoundError",
    "GroupNotEmptyError",
    "IllegalArgumentError",
    "IllegalStateError",
    "InputError",
    "Interrupted",
    "InvalidOffsetError",
    "InvalidRecordError",
    "InvalidTimestampError",
    "InvalidTopicError",
    "KafkaConfigurationError",
    "KafkaError",
    "KafkaTimeoutError",
    "LockError",
    "LogClosedError",
    "MessageSizeTooLargeError",
    "NoOffsetForPartitionError",
    "NonEmptyGroupError",
    "NotALogDirectoryError",
    "NotASegmentFileError",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "OutOfOrderSequenceNumberError",
    "PermissionDeniedError",
    "ProducerFencedError",
    "PylogError",
    "ReadOnlyLogError",
    "RebalanceInProgressError",
    "RecordTooLargeError",
    "RemoteStorageError",
    "RetriableError",
    "SerializationError",
    "StorageError",
    "TopicAlreadyExistsError",
    "TopicExistsError",
    "Unavailable",
    "UnknownEntryWarning",
    "UnknownGroupError",
    "UnknownPartitionError",
    "UnknownTopicError",
    "UnknownTopicOrPartitionError",
    "UnsupportedCodecError",
    "UnsupportedFormatError",
    "UsageError",
]


class PylogError(Exception):
    """Base of every error pylog raises on purpose (kafka-python's name for it, ``KafkaError``, is an alias)."""

    retriable: bool = False
    #: kafka-python's flag for errors that call for a metadata refresh: never, without a broker
    invalid_metadata: bool = False


class RetriableError(PylogError):
    """Base of the errors after which the same call may succeed if simply tried again (``retriable`` is True),
    as kafka-python's ``RetriableError``."""

    retriable = True


class ConfigError(PylogError, ValueError):
    """A configuration name is unknown or its value is out of range. Fix the argument; nothing was changed."""


class IllegalArgumentError(PylogError, TypeError):
    """An argument is of the wrong type, where kafka-python raises ``TypeError``: a partition argument that is
    not a ``TopicPartition`` (``pause("t")``). Fix the call; nothing was changed."""


class InvalidTopicError(PylogError, ValueError):
    """A topic name is not 1-249 characters of ``[a-zA-Z0-9._-]`` or is ``.``/``..``. Nothing was created."""


class TopicExistsError(PylogError):
    """``create_topic`` was called for a topic that already exists. Use ``Log.topic(name)`` to open it."""


class UnknownTopicOrPartitionError(PylogError, KeyError):
    """The topic or the partition does not exist (kafka-python's name; pylog raises its two subclasses)."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else "unknown topic or partition"


class UnknownTopicError(UnknownTopicOrPartitionError):
    """The topic does not exist in this log directory. Create it first with ``Log.create_topic``."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown topic"


class UnknownPartitionError(UnknownTopicOrPartitionError):
    """The partition number is not in ``0 .. partitions-1`` for the topic."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown partition"


class InvalidRecordError(PylogError, ValueError):
    """A record cannot be written as given (for example key and value both None). Nothing was written."""


class RecordTooLargeError(InvalidRecordError):
    """A record or batch is larger than the topic's ``max_message_bytes``. Nothing was written."""


class SerializationError(InvalidRecordError, TypeError):
    """The key, value or headers could not be encoded (a key that is not bytes or str without a
    ``key_serializer``, headers that are not ``(str, bytes)`` pairs, a serializer that failed or did not return
    bytes). Also a ``TypeError``, as kafka-python raises there. Nothing was written."""


class InvalidTimestampError(InvalidRecordError):
    """A timestamp is not an integer number of milliseconds in ``0 .. 2**63-1`` (a record's, or one given to
    ``offsets_for_times``), or a record's lies outside its topic's window around the log's clock
    (``message_timestamp_after_max_ms``, ``message_timestamp_before_max_ms``: Kafka's INVALID_TIMESTAMP; the
    whole batch holding it is refused). Nothing was written."""


class DeserializationError(PylogError):
    """A stored key or value could not be decoded by the consumer's deserializer. The stored data is intact.
    ``topic_partition`` and ``offset`` name the record: records before it were returned, and the consumer
    raises again until it is skipped with ``consumer.seek(err.topic_partition, err.offset + 1)``, or set
    ``on_deserialization_error="skip"`` or ``"dead_letter"``."""

    topic_partition: Any = None
    offset: int | None = None


class OffsetOutOfRangeError(PylogError):
    """The offset is below ``log_start_offset`` or above ``log_end_offset``. Seek to a valid offset, or let
    ``auto_offset_reset`` choose one."""

    retriable = False


class InvalidOffsetError(PylogError, ValueError):
    """An offset argument is not an integer >= 0 (or one of the special values the call accepts)."""


class ForkedProcessError(PylogError):
    """An object opened before ``fork()`` was used in the child. Open the log again in the child process."""


class LockError(RetriableError):
    """A lock on the log directory could not be taken (another process holds it exclusively)."""


class NotALogDirectoryError(PylogError, ValueError):
    """``pylog.open(path)`` was given a path that is not a pylog log directory: a file, or a non-empty directory
    without a pylog manifest. pylog never initialises (or deletes anything in) such a directory: pass an empty
    or new directory, or the directory of an existing log. A log whose manifest was lost can be rebuilt with
    ``pylog repair``."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class ReadOnlyLogError(PylogError):
    """A write (a producer, a topic change, a commit, retention) to a log opened read-only: with
    ``pylog.open(path, read_only=True)``, or because its directory cannot be written (a restored copy, a
    snapshot, a read-only mount). Reads work; open the log from a writable directory to change it."""


class PermissionDeniedError(PylogError, PermissionError):
    """The operating system denied this process a permission pylog needs on the log directory ``path``:
    reading and searching it (``needed="read"``: to open the log at all), or writing it and its files
    (``needed="write"``: to repair it). The message names the process's user and the directory's owner and
    mode. Nothing was changed: run as a user with that permission, or grant it (a log that only needs
    reading opens read-only from a directory this user can read but not write)."""

    def __init__(self, message: str, *, path: str | None = None, needed: str = "") -> None:
        super().__init__(message)
        self.errno = errno.EACCES
        self.path = path
        self.needed = needed


class UnknownEntryWarning(UserWarning):
    """A log directory holds an entry pylog did not create (a stray file or folder, a partition directory of no
    topic). pylog keeps it untouched and warns once per open; move it out of the log directory."""


class CorruptRecordError(PylogError):
    """A stored batch failed its checks (CRC, length bounds, increasing offsets). ``path`` and ``position`` name
    the place. Run ``Log.verify()`` for a full report; ``pylog.repair(path)`` is the only call that drops such data."""

    def __init__(self, message: str, *, path: str | None = None, position: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.position = position


class CorruptIndexError(CorruptRecordError):
    """An index file failed its sanity check. Indexes are rebuilt from the log, so no data is lost."""


class UnsupportedFormatError(PylogError):
    """A file carries a format version this pylog does not know (written by a newer release)."""


class UnsupportedCodecError(PylogError):
    """A compression codec whose library is not installed: ``compression_type="snappy"`` (of a producer or a
    topic), or a snappy-compressed batch to read, without the ``cramjam`` package. Install it with
    ``pip install 'pylog[snappy]'``; nothing was written, and the stored batch is intact. (kafka-python's
    name for the same condition.)"""


class StorageError(RetriableError, OSError):
    """The operating system refused an I/O operation. The log stays consistent: the failed append is not
    acknowledged and the log end offset is unchanged. A failed fsync is never treated as success."""


class DiskFullError(StorageError):
    """No space left on the device (ENOSPC/EDQUOT). Free space, then retry; nothing acknowledged was lost."""


class RemoteStorageError(StorageError):
    """The object store of tiered storage (``remote_storage``) refused or failed a request: unreachable, denied,
    an object missing that a remote manifest names. Nothing local was changed and no remote manifest names a
    partial upload; retry (``Log.tier()`` resumes where it stopped). ``key`` names the object when known."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class KafkaTimeoutError(RetriableError, TimeoutError):
    """A wait ran out before the operation completed."""


class DeliveryError(PylogError):
    """Records accepted by ``send()`` could not be written and nobody looked at their futures (``get()``,
    ``exception``, an errback). Raised by the next ``flush()`` or ``close()`` of the producer (and by
    ``Log.close()`` for the producers it closes), so a failed record never goes unnoticed. ``count`` is how many
    records failed, ``errors`` the distinct errors (the first is chained as ``__cause__``). The records were not
    written: send them again if they are still wanted."""

    def __init__(self, message: str, *, count: int = 0, errors: list[BaseException] | None = None) -> None:
        super().__init__(message)
        self.count = count
        self.errors = list(errors or [])


class IllegalStateError(PylogError):
    """The call does not fit the object's current state: ``seek()``, ``position()`` or ``pause()`` of a partition
    not assigned to the consumer, ``commit()``/``committed()`` without a ``group_id``, ``assign()`` after
    ``subscribe()`` (or ``subscribe()`` with both topics and a pattern), a transactional producer's calls out
    of order. Fix the call; nothing was changed. :class:`LogClosedError` is one (kafka-python raises
    ``IllegalStateError`` for a closed producer or consumer)."""


class LogClosedError(IllegalStateError):
    """The object was closed. Open the log again to continue."""


class NoOffsetForPartitionError(PylogError):
    """No committed or explicit position exists and ``auto_offset_reset`` is ``"none"``. Seek first."""


class CommitFailedError(PylogError):
    """The commit was refused because this member was fenced by a newer generation of its group (it stalled
    past ``max_poll_interval_ms`` or its session expired, and its partitions were given to others).
    Call ``poll()`` to rejoin the group; records processed since the last successful commit may be
    delivered again to the new owner."""


class RebalanceInProgressError(RetriableError):
    """The group is rebalancing. Call ``poll()`` to complete the rebalance, then retry."""


class GroupNotEmptyError(PylogError):
    """The admin action needs a group with no live members (stop its consumers first)."""


class UnknownGroupError(PylogError, KeyError):
    """No consumer group with this id exists in the log directory (``list_groups()`` names the ones that do)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ProducerFencedError(PylogError):
    """Another producer with the same ``transactional_id`` called ``init_transactions()`` (or this producer's
    transaction outlived ``transaction_timeout_ms`` and was aborted). This producer can no longer commit: close
    it. Its open transaction is aborted and its records never become visible to ``read_committed`` readers."""


class OutOfOrderSequenceError(PylogError):
    """A partition holds a batch of this producer id with a sequence number the producer has not sent yet:
    another writer uses the same producer id. Nothing was written by the failing call."""


class CliError(PylogError):
    """A failure of a ``pylog`` command, reported as one line on stderr; ``exit_code`` is the process exit
    status."""

    exit_code = 1


class UsageError(CliError, ValueError):
    """The command line itself is wrong: fix the arguments (``pylog COMMAND --help`` lists them)."""

    exit_code = 2


class InputError(CliError, ValueError):
    """A line of input cannot be produced as asked (no key separator, not JSON, not base64): fix the line;
    the records before it were produced, the line and those after it were not."""


class NotASegmentFileError(CliError, ValueError):
    """``pylog dump`` was given a file that is not a segment file (``.log``, ``.index``, ``.timeindex``)."""


class Unavailable(CliError):
    """The command needs a feature this pylog does not have."""

    exit_code = 2


class Interrupted(CliError):
    """SIGINT (Ctrl-C) or SIGTERM ended the command; the exit status is 128 + the signal number."""

    def __init__(self, message: str, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


# kafka-python's names for the same conditions
KafkaError = PylogError
KafkaConfigurationError = ConfigError
MessageSizeTooLargeError = RecordTooLargeError
TopicAlreadyExistsError = TopicExistsError
CorruptRecordException = CorruptRecordError
OutOfOrderSequenceNumberError = OutOfOrderSequenceError
GroupIdNotFoundError = UnknownGroupError
NonEmptyGroupError = GroupNotEmptyError
