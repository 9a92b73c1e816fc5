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
    <topic>/<partition>/fences/<version:020d>               the fence of each deleted version (this module)
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

**Version numbers are never used twice.** A publish deletes the versions at or below ``version -
KEEP_VERSIONS`` (so a reader's listing stays short), and a topic deletion the versions below its tombstone.
Create-if-absent alone would then let a writer that lags behind (it read the versions before others published
``KEEP_VERSIONS`` more, or it is a restored copy of the log tiering to the same prefix as the original) create
a version number that was published and deleted, and believe it published, though no reader ever takes that
version again: it could then delete local copies no manifest keeps. So a version's object is deleted only
after its **fence** ``<topic>/<partition>/fences/<version:020d>`` is written (create-if-absent, never
deleted, also not by a topic deletion), naming the entity tag (ETag, :mod:`pylog.tiered.store`) the deleting
writer listed for the object. A publish of ``v`` (:func:`create_version`):

1. creates ``manifest/<v>.json`` create-if-absent; if it exists, another writer has the version;
2. lists the manifest versions; when none is above ``v``, the number was never used before (a version is
   deleted only while a higher one exists, and the highest version ever published is never deleted), and
   the publish is done;
3. else reads the fence of ``v``: none, or one naming the entity tag this writer's put returned (the others
   went on and deleted this very object), and the publish is done; a fence naming another tag (or a damaged
   one, or a store that reports no tags) means the number was used before: this writer deletes the object it
   just made and reports the version taken, so it reads the newest version and merges again;
4. deletes the versions at or below ``v - KEEP_VERSIONS``, each after writing its fence (a failure is logged
   and left to the next publish).

This needs a store whose listing sees every completed put and delete (S3, GCS and Azure since 2020,
``file://``, ``memory://``). Two writers whose versions have identical bytes may both be told they published
one (S3's tag is the MD5 of the bytes): each did, in effect, as those bytes are what later versions were
built on. A fence is about 80 bytes; one is left per version ever deleted. The decisions manifest
(:mod:`pylog.tiered.decisions`) uses the same protocol under ``__transactions/decisions/``.

Fence object:

| part | bytes | content |
|---|---|---|
| header | 1 line | ``b"pylog-remote-fence 1 <crc32c of the body, 8 lowercase hex digits>\\n"`` |
| body | rest | UTF-8 JSON object ``{"etag": "<entity tag listed, quotes removed>", "version": <version>}`` |

Thread-safety: the functions are thread-safe; several processes may publish concurrently (create-if-absent
decides, and the fence tells a number used before). Crash contract: publishing is one atomic put; pruning
writes a fence before each deletion, so a crash leaves every deleted version fenced (a fence without a
deletion is harmless: the publish above it fences again, create-if-absent, and deletes).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pylog.errors import RemoteStorageError
from pylog.framing import frame, unframe
from pylog.tiered.store import ObjectInfo, ObjectStore, Written

__all__ = [
    "PartitionManifest",
    "RemoteFile",
    "RemoteSegment",
    "create_version",
    "decode_fence",
    "decode_manifest",
    "delete_versions",
    "encode_fence",
    "encode_manifest",
    "fence_key",
    "holds_log",
    "manifest_key",
    "partition_prefix",
    "publish_manifest",
    "read_manifest",
    "remote_partitions",
    "remote_topics",
    "segment_key",
    "version_key",
]

_MAGIC = b"pylog-remote-manifest"
_FORMAT = 1
_FENCE_MAGIC = b"pylog-remote-fence"
_FENCE_FORMAT = 1
_MANIFEST_NAME = re.compile(r"^(\d{20})\.json$")
KEEP_VERSIONS = 8
"""Manifest versions kept below a newly published one: a reader falls back to them when newer ones are torn,
and a reader that listed the versions a moment before still finds the one it picked. A publish deletes the
versions older than that (:func:`create_version`), so a partition's manifest listing stays short."""
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


def version_key(prefix: str, version: int) -> str:
    """Key of manifest version ``version`` under the manifest folder ``prefix`` (``<base>manifest/``)."""
    return f"{prefix}{version:020d}.json"


def fence_key(prefix: str, version: int) -> str:
    """Key of the fence of manifest version ``version`` of the manifest folder ``prefix`` (``<base>manifest/``):
    ``<base>fences/<version:020d>`` (see the module docstring)."""
    if not prefix.endswith("manifest/"):
        raise ValueError(f"a manifest folder ends with manifest/, got {prefix!r}")
    return f"{prefix[: -len('manifest/')]}fences/{version:020d}"


def encode_fence(version: int, etag: str) -> bytes:
    body = json.dumps({"etag": etag, "version": version}, sort_keys=True, separators=(",", ":")).encode()
    return frame(_FENCE_MAGIC, _FENCE_FORMAT, body)


def decode_fence(raw: bytes) -> tuple[int, str]:
    """``(version, etag)`` of a fence object; :class:`ValueError` if it does not check."""
    body = unframe(raw, _FENCE_MAGIC, _FENCE_FORMAT, "remote manifest fence")
    try:
        data = json.loads(body)
        return int(data["version"]), str(data["etag"])
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"remote manifest fence fields do not check: {exc!r}") from exc


def _listed(store: ObjectStore, prefix: str) -> list[tuple[int, ObjectInfo]]:
    found = []
    for info in store.list(prefix):
        m = _MANIFEST_NAME.match(info.key[len(prefix) :])
        if m:
            found.append((int(m.group(1)), info))
    found.sort(key=lambda item: item[0])
    return found


def create_version(store: ObjectStore, prefix: str, version: int, data: bytes) -> bool:
    """Publish ``data`` as manifest version ``version`` under the manifest folder ``prefix`` if that version
    number was never used: True when published, False when another writer took it (now, or before and the
    version was deleted since). Then delete the versions at or below ``version - KEEP_VERSIONS`` (fenced
    first; a failure is logged and left to the next publish). The protocol is in the module docstring.
    :class:`RemoteStorageError` when the store fails before this can be told (the version's object may then
    exist: a version nobody reads if it reused a number, else a manifest like any other)."""
    key = version_key(prefix, version)
    written = store.put(key, data, if_absent=True)
    if not written:
        return False
    etag = written.etag if isinstance(written, Written) else ""
    try:
        listed: list[tuple[int, ObjectInfo]] | None = _listed(store, prefix)
    except RemoteStorageError:
        listed = None  # the fence tells
    if listed is None or any(v > version for v, _ in listed):
        # a higher version exists: this number may have been published and deleted before (a writer that
        # lagged behind), or the other writers simply went on meanwhile; the fence tells which
        raw = store.get_if_exists(fence_key(prefix, version))
        if raw is not None:
            try:
                fenced_etag = decode_fence(raw)[1]
            except ValueError:
                fenced_etag = ""  # a damaged fence still fences: the number was used
            if not etag or fenced_etag != etag:
                _withdraw(store, key, version)
                return False
    if listed is not None:
        try:
            delete_versions(store, prefix, [(v, info) for v, info in listed if v <= version - KEEP_VERSIONS])
        except RemoteStorageError as exc:
            _log.warning(
                "could not delete old manifest versions under %s (the next publish retries): %s", prefix, exc
            )
    return True


def _withdraw(store: ObjectStore, key: str, version: int) -> None:
    """Delete the object this writer just created under a version number that was used before (readers never
    take it: a higher version exists); a failure leaves it to the next publish's pruning."""
    _log.warning(
        "manifest version %d (%s) was published and deleted before: this writer's copy is withdrawn and it "
        "reads the newest version again",
        version,
        key,
    )
    try:
        store.delete(key)
    except RemoteStorageError as exc:
        _log.warning("could not delete %s (a later publish deletes it): %s", key, exc)


def delete_versions(store: ObjectStore, prefix: str, versions: Sequence[tuple[int, ObjectInfo]]) -> list[int]:
    """Delete the listed manifest versions ``(version, listing entry)`` under ``prefix``, each after its fence
    (create-if-absent, naming the entity tag listed) is written; the versions deleted. A failure raises
    :class:`RemoteStorageError` after deleting the versions fenced before it."""
    fenced: list[int] = []
    try:
        for version, info in versions:
            store.put(fence_key(prefix, version), encode_fence(version, info.etag), if_absent=True)
            fenced.append(version)
    finally:
        store.delete_many([version_key(prefix, v) for v in fenced])
    return fenced


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
    """Publish ``manifest`` as ``version`` if that version number was never used (:func:`create_version`);
    the published manifest, or None if another writer took the version (read again and retry with a higher
    one)."""
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
    prefix = f"{partition_prefix(manifest.topic, manifest.partition)}manifest/"
    if not create_version(store, prefix, version, encode_manifest(published)):
        return None
    return published


_LOG_KEY = re.compile(
    r"^(?:[^/]+/(?:0|[1-9]\d*)|__transactions/decisions)/(?:manifest/\d{20}\.json|fences/\d{20})$"
)


def holds_log(store: ObjectStore) -> bool:
    """True when the store holds anything pylog's tiering wrote that names a log: a partition's or the
    transaction decisions' manifest version (a tombstone too) or fence. A URL that points anywhere else (a
    mistyped bucket or prefix) holds none."""
    return any(_LOG_KEY.match(info.key) for info in store.list())


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
