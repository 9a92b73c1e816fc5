"""The remote manifest of a partition: which segment objects in the object store hold its data.

Object stores have no atomic rename, so a manifest is never replaced: each change is a new, immutable object
``<topic>/<partition>/manifest/<version:020d>.json`` written with create-if-absent. Two writers that pick the
same version cannot both succeed; the loser reads the winner's manifest and tries the next version. Readers
take the highest version whose object parses and whose CRC checks (a torn or corrupt newest version falls
back to the one before it). A segment is uploaded (and verified) before any manifest names it, so a crash
mid-upload leaves at most unnamed objects, never a named partial segment. Readers trust only what a manifest
names.

Remote layout (keys relative to the ``remote_storage`` URL)::

    <topic>/<partition>/manifest/<version:020d>.json        manifest versions (this module)
    <topic>/<partition>/segments/<base:020d>-<id>.log        a segment's record batches, byte-identical
    <topic>/<partition>/segments/<base:020d>-<id>.index      its offset index (pylog.partition.index)
    <topic>/<partition>/segments/<base:020d>-<id>.timeindex  its time index

``<id>`` is 16 random hex digits chosen per upload (Kafka's ``RemoteLogSegmentId`` has a UUID for the same
reason): a retried or concurrent upload never overwrites an object a manifest already names.

Manifest object:

| part | bytes | content |
|---|---|---|
| header | 1 line | ``b"pylog-remote-manifest 1 <crc32c of the body, 8 lowercase hex digits>\\n"`` |
| body | rest | UTF-8 JSON object, fields below |

| field | type | meaning |
|---|---|---|
| ``version`` | int | this version; equals the number in the object's name |
| ``topic``, ``partition`` | str, int | the partition described |
| ``partitions`` | int | the topic's partition count when published |
| ``config`` | object | the topic's full config (``TopicConfig.to_dict()``) when published |
| ``segments`` | array | remote segments, ascending and contiguous (each ``next_offset`` is the next ``base_offset``) |
| ``deleted`` | bool, optional | present (``true``) only in a tombstone: the topic was deleted; ``segments`` is empty |

Each segment:

| field | type | meaning |
|---|---|---|
| ``base_offset`` | int | first offset of the segment (its local file name) |
| ``next_offset`` | int | one past its last offset |
| ``size`` | int | bytes of the ``.log`` object |
| ``max_timestamp`` | int | largest record timestamp in it (-1: unknown) |
| ``crc32c`` | int | CRC-32C (Castagnoli) of the whole ``.log`` object |
| ``key`` | str | the ``.log`` object's key |
| ``index``, ``timeindex`` | object or null | ``{"key", "size", "crc32c"}`` of the index objects (null: none uploaded) |

A tombstone is the manifest version a topic deletion publishes (:func:`~pylog.tiered.retention.delete_remote_topic`)
for each partition that has a manifest, before it deletes any object: ``"deleted": true``, no segments, the
config and partition count of the manifest it follows. :func:`read_manifest` reports a partition whose newest
version is a tombstone as having no manifest (``None``, with the tombstone's version as the highest present), so
every reader (a log opened read-only from the store, :func:`remote_topics`, restore, Spark's reader of a URL)
treats the partition as absent, and a topic created again with the same name publishes its first manifest
above the tombstone (version numbers never go back, so no reader holding an older version mistakes the new
topic's manifest for an older one). The tombstone itself is kept: it is one small object per partition.
Ordinary manifests have no ``deleted`` field (their bytes are as before tombstones existed).

A manifest whose header, CRC, JSON, version or segment order does not check does not parse, and is skipped;
one of a format version this pylog does not know raises :class:`~pylog.errors.UnsupportedFormatError` (it was
written by a newer pylog: skipping it would lose what it names).

Thread-safety: the functions are thread-safe; several processes may publish concurrently (create-if-absent
decides). Crash contract: publishing is one atomic put; nothing else is ever changed.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from pylog.errors import RemoteStorageError
from pylog.framing import frame, unframe
from pylog.tiered.store import ObjectStore

__all__ = [
    "PartitionManifest",
    "RemoteFile",
    "RemoteSegment",
    "decode_manifest",
    "encode_manifest",
    "manifest_key",
    "partition_prefix",
    "publish_manifest",
    "read_manifest",
    "remote_partitions",
    "remote_topics",
    "segment_key",
]

_MAGIC = b"pylog-remote-manifest"
_FORMAT = 1
_MANIFEST_NAME = re.compile(r"^(\d{20})\.json$")
KEEP_VERSIONS = 8
"""Manifest versions kept below a newly published one: a reader falls back to them when newer ones are torn,
and a reader that listed the versions a moment before still finds the one it picked. A publish deletes the
versions older than that (:func:`prune_versions`), so a partition's manifest listing stays short."""
_log = logging.getLogger("pylog.tiered")
_MANIFEST_KEY = re.compile(r"^([^/]+)/(0|[1-9]\d*)/manifest/(\d{20})\.json$")


@dataclass(frozen=True)
class RemoteFile:
    """An index object of a remote segment."""

    key: str
    size: int
    crc32c: int


@dataclass(frozen=True)
class RemoteSegment:
    """One segment a manifest names (fields as in the module docstring's table)."""

    base_offset: int
    next_offset: int
    size: int
    max_timestamp: int
    crc32c: int
    key: str
    index: RemoteFile | None = None
    timeindex: RemoteFile | None = None


@dataclass(frozen=True)
class PartitionManifest:
    """One manifest version of a partition. ``version`` is 0 for a manifest not yet published."""

    topic: str
    partition: int
    partitions: int
    config: dict[str, Any]
    segments: tuple[RemoteSegment, ...] = field(default=())
    version: int = 0
    deleted: bool = False  # a tombstone: the topic was deleted (see the module docstring)

    @property
    def log_start_offset(self) -> int | None:
        return self.segments[0].base_offset if self.segments else None

    @property
    def log_end_offset(self) -> int | None:
        return self.segments[-1].next_offset if self.segments else None


def partition_prefix(topic: str, partition: int) -> str:
    return f"{topic}/{partition}/"


def manifest_key(topic: str, partition: int, version: int) -> str:
    return f"{partition_prefix(topic, partition)}manifest/{version:020d}.json"


def segment_key(topic: str, partition: int, base_offset: int, upload_id: str, suffix: str) -> str:
    """Key of a segment object: ``suffix`` is ``.log``, ``.index`` or ``.timeindex``."""
    return f"{partition_prefix(topic, partition)}segments/{base_offset:020d}-{upload_id}{suffix}"


def encode_manifest(manifest: PartitionManifest) -> bytes:
    fields = asdict(manifest)
    if not manifest.deleted:
        del fields["deleted"]  # only a tombstone has the field
    body = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return frame(_MAGIC, _FORMAT, body)


def decode_manifest(raw: bytes) -> PartitionManifest:
    """Parse a manifest object. :class:`ValueError` if it does not check; :class:`UnsupportedFormatError`
    for a format version this pylog does not know."""
    body = unframe(raw, _MAGIC, _FORMAT, "remote manifest")
    try:
        data = json.loads(body)
        segments = tuple(_segment(s) for s in data["segments"])
        manifest = PartitionManifest(
            topic=str(data["topic"]),
            partition=int(data["partition"]),
            partitions=int(data["partitions"]),
            config=dict(data["config"]),
            segments=segments,
            version=int(data["version"]),
            deleted=data.get("deleted", False) is True,
        )
    except (KeyError, TypeError, AttributeError) as exc:  # a field missing or of the wrong type
        raise ValueError(f"remote manifest fields do not check: {exc!r}") from exc
    if manifest.deleted and segments:
        raise ValueError("a remote manifest tombstone names segments")
    _check_contiguous(segments)
    return manifest


def _segment(d: dict[str, Any]) -> RemoteSegment:
    index, timeindex = d.get("index"), d.get("timeindex")
    return RemoteSegment(
        base_offset=int(d["base_offset"]),
        next_offset=int(d["next_offset"]),
        size=int(d["size"]),
        max_timestamp=int(d["max_timestamp"]),
        crc32c=int(d["crc32c"]),
        key=str(d["key"]),
        index=RemoteFile(**index) if index else None,
        timeindex=RemoteFile(**timeindex) if timeindex else None,
    )


def _check_contiguous(segments: tuple[RemoteSegment, ...]) -> None:
    for i, seg in enumerate(segments):
        if seg.next_offset <= seg.base_offset or seg.size <= 0:
            raise ValueError(f"remote segment {seg.base_offset} has an empty or inverted range")
        if i and segments[i - 1].next_offset != seg.base_offset:
            raise ValueError(f"remote segments are not contiguous at {seg.base_offset}")


def _versions(store: ObjectStore, topic: str, partition: int) -> list[int]:
    """Every manifest version number present (parseable or not), ascending."""
    return listed_versions(store, f"{partition_prefix(topic, partition)}manifest/")


def listed_versions(store: ObjectStore, prefix: str) -> list[int]:
    """The version numbers of the manifest objects (``<version:020d>.json``) directly under ``prefix``, ascending."""
    found = []
    for info in store.list(prefix):
        m = _MANIFEST_NAME.match(info.key[len(prefix) :])
        if m:
            found.append(int(m.group(1)))
    return sorted(found)


def prune_versions(store: ObjectStore, prefix: str, published: int) -> list[int]:
    """Delete the manifest versions under ``prefix`` at or below ``published - KEEP_VERSIONS`` (pylog's version
    names only; ``published`` was just written): the versions a publish leaves behind. Returns the versions
    deleted. A failure is logged and left to the next publish, which lists the old versions again."""
    try:
        old = [v for v in listed_versions(store, prefix) if v <= published - KEEP_VERSIONS]
        store.delete_many([f"{prefix}{v:020d}.json" for v in old])
    except RemoteStorageError as exc:
        _log.warning(
            "could not delete old manifest versions under %s (the next publish retries): %s", prefix, exc
        )
        return []
    return old


def read_manifest(
    store: ObjectStore, topic: str, partition: int, *, tombstones: bool = False
) -> tuple[PartitionManifest | None, int]:
    """``(manifest, highest_version_present)``: the highest version that parses (None if none does, or if it is
    a tombstone and ``tombstones`` is false: the topic was deleted) and the highest version number any object
    has (0 if none): the next publish must use a higher one."""
    versions = _versions(store, topic, partition)
    for version in reversed(versions):
        try:
            manifest = decode_manifest(store.get(manifest_key(topic, partition, version)))
        except ValueError:
            continue  # torn, corrupt or foreign: fall back to the version before it
        if (manifest.version, manifest.topic, manifest.partition) == (version, topic, partition):
            return (None if manifest.deleted and not tombstones else manifest), versions[-1]
    return None, versions[-1] if versions else 0


def publish_manifest(
    store: ObjectStore, manifest: PartitionManifest, version: int
) -> PartitionManifest | None:
    """Write ``manifest`` as ``version`` if no object of that version exists; the published manifest, or
    None if another writer took the version first (read again and retry with a higher one)."""
    if version <= 0:
        raise ValueError(f"manifest versions start at 1, got {version}")
    _check_contiguous(manifest.segments)
    published = PartitionManifest(
        manifest.topic,
        manifest.partition,
        manifest.partitions,
        manifest.config,
        manifest.segments,
        version,
        manifest.deleted,
    )
    key = manifest_key(manifest.topic, manifest.partition, version)
    if not store.put(key, encode_manifest(published), if_absent=True):
        return None
    prune_versions(store, f"{partition_prefix(manifest.topic, manifest.partition)}manifest/", version)
    return published


def remote_partitions(store: ObjectStore) -> dict[str, list[int]]:
    """``{topic: [partition, ...]}`` for every partition with at least one manifest object in the store."""
    out: dict[str, set[int]] = {}
    for info in store.list():
        m = _MANIFEST_KEY.match(info.key)
        if m:
            out.setdefault(m.group(1), set()).add(int(m.group(2)))
    return {topic: sorted(parts) for topic, parts in sorted(out.items())}


def remote_topics(store: ObjectStore) -> dict[str, Any]:
    """The topics of a log in an object store, in the shape of a log directory's manifest
    (``{"topics": {name: {"partitions": n, "config": {...}}}}``): from each topic's remote manifests, the
    partition count and config of its first partition's newest manifest (the count is raised to cover every
    partition whose newest manifest is not a tombstone). A topic whose first partition's newest manifest is a tombstone is deleted
    and not listed (a deletion publishes the tombstones in partition order, so the first one goes first). A log
    opened read-only from the store and Spark's reader of a URL use it."""
    topics: dict[str, Any] = {}
    for name, parts in remote_partitions(store).items():
        manifest, _ = read_manifest(store, name, parts[0])
        if manifest is None:
            continue
        count = manifest.partitions
        for p in parts:  # a partition added after the first one's manifest was published
            if p >= count and read_manifest(store, name, p)[0] is not None:
                count = p + 1  # (not one left tombstoned by a deleted topic of the same name)
        topics[name] = {"partitions": count, "config": manifest.config}
    return {"topics": topics}
