"""Transaction decisions in the object store: what ``read_committed`` readers of a tiered log need beside the
segments.

The outcome of a transaction is not in its partitions: it is a record of the log directory's append-only
journal ``__transactions/decisions.log`` (:mod:`pylog.transactions`). A remote reader (a log opened read-only
from its URL, Spark reading a URL) and a restored log need that journal too, so every tiering pass copies it
to the store, with the guarantees of segments: immutable objects written create-if-absent, data before
metadata, every object named with its CRC-32C, readers trust only what a manifest names, nothing renamed.

Remote layout (keys relative to the ``remote_storage`` URL; ``__transactions/decisions`` can never be a
partition's prefix, whose second part is a partition number)::

    __transactions/decisions/manifest/<version:020d>.json          decisions manifest versions, immutable
    __transactions/decisions/fences/<version:020d>                 fences of deleted versions (never reused)
    __transactions/decisions/chunks/<start:020d>-<end:020d>-<id>.log bytes [start, end) of decisions.log

``decisions.log`` only grows, so a pass (:func:`upload_decisions`) uploads the bytes the newest manifest does
not cover yet as one chunk object (bytes ``[end, new end)``, whole journal records only: a torn last record
is never uploaded) and publishes a new manifest version naming the chunks so far. Once a manifest would name
:data:`MAX_CHUNKS` chunks, the pass uploads one chunk of the whole file instead (``[0, new end)``), so a
reader never fetches more than :data:`MAX_CHUNKS` objects; the chunks it replaces are deleted after the
manifest that no longer names them is published (:func:`sweep_orphans`).

``<id>`` is 16 random hex digits per upload. The chunk's name carries its byte range, so that an unnamed
chunk can be proven unnameable: an upload only publishes a manifest built on the newest one it read, whose
version is then taken if anyone else published meanwhile, and it only adds bytes past that manifest's end.
A chunk no manifest names whose end is at or below the newest manifest's end can therefore never be named:
it is garbage pylog made (a crashed or lost upload, or a chunk replaced by a whole-file one), and it is
deleted. Anything else under the prefix is left alone. So an upload racing another one may find its own
chunk swept before it verified it: it then reads the newest manifest and, that one having moved past the end it
built on, decides again (its chunk could never have been named).

Decisions manifest object:

| part | bytes | content |
|---|---|---|
| header | 1 line | ``b"pylog-remote-decisions 1 <crc32c of the body, 8 lowercase hex digits>\\n"`` |
| body | rest | UTF-8 JSON object, fields below |

| field | type | meaning |
|---|---|---|
| ``version`` | int | this version; equals the number in the object's name |
| ``end`` | int | bytes of ``decisions.log`` the chunks hold: ``[0, end)`` |
| ``crc32c`` | int | CRC-32C of ``decisions.log`` bytes ``[0, end)`` (a diverged local file is refused) |
| ``chunks`` | array | ``{"start", "end", "key", "crc32c"}``: ascending, contiguous, from 0 to ``end``; ``crc32c`` of the chunk object (its ``end - start`` bytes) |
| ``producers`` | object | the ``producers`` file's state (``next_pid``, ``ids``) read with those bytes, under the transaction lock: restore starts from it |

A chunk object holds the bytes of ``decisions.log`` as they are (:mod:`pylog.journal` records, each payload
twice with its CRC-32C). A reader (:class:`RemoteDecisions`) applies them with
:meth:`pylog.transactions.TxnDecisions.apply`, the parser of the local file: there is one implementation of
the format. A manifest whose header, CRC, JSON or chunk ranges do not check is skipped (the version before it
is read: fewer decisions, never other ones); a chunk whose size or CRC differs from its manifest is a
:class:`~pylog.errors.CorruptRecordError` naming its key, and nothing of it is applied.

Why a prefix of the journal is always safe to read: the decisions of a prefix are the decisions the writing
log had at some earlier moment. A transaction whose decision is not uploaded yet is "open" to a remote reader,
which stops before it (the last stable offset) until a later pass uploads it: the reader lags, it never
returns an aborted record nor skips a committed one. An epoch record ("E", fencing older epochs) comes after
every decision of the epochs it fences, so it never arrives without them.

Retention: decisions are never dropped. Every remaining remote segment may need any of them, and they are
small (about 40 bytes a transaction).

Thread-safety: the functions are thread-safe; several processes may upload concurrently (create-if-absent
decides each version). :class:`RemoteDecisions` is thread-safe (as :class:`~pylog.transactions.TxnDecisions`).
Crash contract: an upload is chunk put, read back, then one manifest put; a crash at any point leaves the
previous manifest authoritative and at most an unnamed chunk, which a later pass deletes.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import asdict, dataclass, field
from typing import Any

import crc32c

from pylog.clock import Clock
from pylog.errors import CorruptRecordError, IllegalStateError, RemoteStorageError
from pylog.framing import frame, unframe
from pylog.tiered.manifest import create_version, listed_versions
from pylog.tiered.store import ObjectStore
from pylog.transactions import TxnDecisions, TxnLog

__all__ = [
    "MAX_CHUNKS",
    "PREFIX",
    "DecisionsChunk",
    "DecisionsManifest",
    "DecisionsResult",
    "RemoteDecisions",
    "decode_manifest",
    "encode_manifest",
    "publish_manifest",
    "read_decisions",
    "read_manifest",
    "sweep_orphans",
    "upload_decisions",
]

PREFIX = "__transactions/decisions/"
MAX_CHUNKS = 32  # a manifest names at most this many chunks: the next upload is one chunk of the whole file
REFRESH_MS = 1000  # a remote reader reads the newest manifest at most this often (the segment manifests' TTL)
_MAGIC = b"pylog-remote-decisions"
_FORMAT = 1
_PUBLISH_ATTEMPTS = 16
_CHUNK_NAME = re.compile(r"^(\d{20})-(\d{20})-[0-9a-f]{16}\.log$")
_NO_PRODUCERS: dict[str, Any] = {"next_pid": 0, "ids": {}}


@dataclass(frozen=True)
class DecisionsChunk:
    """One chunk object: bytes ``[start, end)`` of ``decisions.log``, ``crc32c`` of them."""

    start: int
    end: int
    key: str
    crc32c: int


@dataclass(frozen=True)
class DecisionsManifest:
    """One decisions manifest version (fields as in the module docstring). ``version`` 0: not published."""

    end: int
    crc32c: int
    chunks: tuple[DecisionsChunk, ...] = ()
    producers: dict[str, Any] = field(default_factory=lambda: dict(_NO_PRODUCERS))
    version: int = 0


@dataclass(frozen=True)
class DecisionsResult:
    """What :func:`upload_decisions` did: bytes uploaded, the newest manifest (None: nothing to upload and
    none published yet), chunk objects deleted."""

    uploaded: int
    manifest: DecisionsManifest | None
    deleted: tuple[str, ...] = ()


def manifest_key(version: int) -> str:
    return f"{PREFIX}manifest/{version:020d}.json"


def chunk_key(start: int, end: int, upload_id: str) -> str:
    return f"{PREFIX}chunks/{start:020d}-{end:020d}-{upload_id}.log"


def encode_manifest(manifest: DecisionsManifest) -> bytes:
    body = json.dumps(asdict(manifest), sort_keys=True, separators=(",", ":")).encode()
    return frame(_MAGIC, _FORMAT, body)


def decode_manifest(raw: bytes) -> DecisionsManifest:
    """Parse a decisions manifest. :class:`ValueError` if it does not check; :class:`UnsupportedFormatError`
    for a format version this pylog does not know."""
    body = unframe(raw, _MAGIC, _FORMAT, "decisions manifest")
    try:
        data = json.loads(body)
        chunks = tuple(
            DecisionsChunk(int(c["start"]), int(c["end"]), str(c["key"]), int(c["crc32c"]))
            for c in data["chunks"]
        )
        producers = dict(data["producers"])
        manifest = DecisionsManifest(
            int(data["end"]), int(data["crc32c"]), chunks, producers, int(data["version"])
        )
        int(producers["next_pid"])
        dict(producers["ids"])
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"decisions manifest fields do not check: {exc!r}") from exc
    _check_chunks(manifest)
    return manifest


def _check_chunks(manifest: DecisionsManifest) -> None:
    at = 0
    for c in manifest.chunks:
        if c.start != at or c.end <= c.start:
            raise ValueError(f"decisions chunks are not contiguous from 0 at byte {c.start}")
        at = c.end
    if at != manifest.end:
        raise ValueError(f"decisions chunks end at byte {at}, the manifest at {manifest.end}")


def read_manifest(store: ObjectStore) -> tuple[DecisionsManifest | None, int]:
    """``(manifest, highest_version_present)``: the highest version that parses (None if none does) and the
    highest version number any object has (0 if none): the next publish must use a higher one."""
    versions = listed_versions(store, f"{PREFIX}manifest/")
    for version in reversed(versions):
        try:
            manifest = decode_manifest(store.get(manifest_key(version)))
        except ValueError:
            continue  # torn, corrupt or foreign: fall back to the version before it
        if manifest.version == version:
            return manifest, versions[-1]
    return None, versions[-1] if versions else 0


def publish_manifest(
    store: ObjectStore, manifest: DecisionsManifest, version: int
) -> DecisionsManifest | None:
    """Publish ``manifest`` as ``version`` if that version number was never used
    (:func:`pylog.tiered.manifest.create_version`); the published manifest, or None if another writer took
    the version."""
    if version <= 0:
        raise ValueError(f"decisions manifest versions start at 1, got {version}")
    _check_chunks(manifest)
    published = DecisionsManifest(manifest.end, manifest.crc32c, manifest.chunks, manifest.producers, version)
    if not create_version(store, f"{PREFIX}manifest/", version, encode_manifest(published)):
        return None
    return published


def upload_decisions(store: ObjectStore, txns: TxnLog) -> DecisionsResult:
    """Upload the bytes of ``decisions.log`` the newest decisions manifest does not hold, then publish a
    manifest naming them with the producers state read with them (see the module docstring). Nothing is
    published when nothing changed. :class:`~pylog.errors.IllegalStateError` when the local file is not a
    continuation of what the store holds (another log's decisions, or a file rewritten by hand)."""
    mine: DecisionsChunk | None = None  # the chunk of the last attempt
    for _ in range(_PUBLISH_ATTEMPTS):
        current, highest = read_manifest(store)
        # after the manifest: it covers at least what that manifest does; its bytes are checked by CRC below
        state, data = txns.snapshot(current.end if current is not None else 0)
        producers = {"next_pid": int(state["next_pid"]), "ids": state["ids"]}
        end, crc = (current.end, current.crc32c) if current is not None else (0, 0)
        if len(data) < end or crc32c.crc32c(data[:end]) != crc:
            raise IllegalStateError(
                f"{txns.directory}/decisions.log ({len(data)} bytes) is not a continuation of the transaction "
                f"decisions in the object store ({end} bytes, crc32c {crc:08x}): the store holds another log's "
                "decisions, or the file was rewritten; nothing was uploaded"
            )
        if len(data) == end and producers == (current.producers if current is not None else _NO_PRODUCERS):
            swept = sweep_orphans(store, current) if current is not None else []
            # after a lost race, the winner may be this call's own publish whose answer was lost
            named = current is not None and mine is not None and mine in current.chunks
            done = mine.end - mine.start if named and mine is not None else 0
            return DecisionsResult(done, current, tuple(swept))  # a crashed upload's chunk goes even so
        chunks: tuple[DecisionsChunk, ...] = current.chunks if current is not None else ()
        uploaded = 0
        if len(data) > end:
            start = 0 if len(chunks) + 1 > MAX_CHUNKS else end
            try:
                chunk = mine = _upload_chunk(store, data, start)
            except RemoteStorageError:
                newer, _ = read_manifest(store)
                if newer is not None and newer.end > end:
                    continue  # another uploader published past ``end`` and swept this unnameable chunk
                raise
            chunks = (chunk,) if start == 0 else (*chunks, chunk)
            uploaded = chunk.end - chunk.start
        draft = DecisionsManifest(len(data), crc32c.crc32c(data), chunks, producers)
        published = publish_manifest(store, draft, highest + 1)
        if published is not None:
            return DecisionsResult(uploaded, published, tuple(sweep_orphans(store, published)))
        # lost the race: another writer published; read it and decide again
    raise RemoteStorageError(
        f"{_PUBLISH_ATTEMPTS} decisions manifest versions were taken by other writers while publishing; retry",
        key=f"{PREFIX}manifest/",
    )


def _upload_chunk(store: ObjectStore, data: bytes, start: int) -> DecisionsChunk:
    """Put bytes ``[start, len(data))`` to a fresh key create-if-absent and read them back."""
    body = data[start:]
    key = chunk_key(start, len(data), secrets.token_hex(8))
    crc = crc32c.crc32c(body)
    written = store.put(key, body, if_absent=True)
    got = store.checksum(key)
    if not written and got != (len(body), crc):  # taken by what this put sent: a retry after a lost answer
        raise RemoteStorageError(f"decisions chunk {key} exists already (a fresh key was drawn)", key=key)
    if got != (len(body), crc):
        raise CorruptRecordError(
            f"uploaded object {key} reads back as {got[0]} bytes crc32c {got[1]:08x}, sent {len(body)} bytes "
            f"crc32c {crc:08x}",
            path=key,
        )
    return DecisionsChunk(start, len(data), key, crc)


def sweep_orphans(store: ObjectStore, manifest: DecisionsManifest) -> list[str]:
    """Delete the chunk objects ``manifest`` (the newest) does not name that no upload can name any more:
    pylog's key pattern and an end at or below the manifest's end (see the module docstring)."""
    named = {c.key for c in manifest.chunks}
    prefix = f"{PREFIX}chunks/"
    deleted = []
    for info in store.list(prefix):
        m = _CHUNK_NAME.match(info.key[len(prefix) :])
        if m is None or info.key in named or int(m.group(2)) > manifest.end:
            continue
        store.delete(info.key)
        deleted.append(info.key)
    return deleted


def read_decisions(store: ObjectStore, manifest: DecisionsManifest, start: int = 0) -> bytes:
    """Bytes ``[start, manifest.end)`` of ``decisions.log`` from the chunks ``manifest`` names, each chunk
    checked whole (size and CRC-32C) before any of it is returned."""
    out = []
    for c in manifest.chunks:
        if c.end <= start:
            continue
        raw = store.get(c.key)
        if len(raw) != c.end - c.start or crc32c.crc32c(raw) != c.crc32c:
            raise CorruptRecordError(
                f"remote decisions chunk {c.key} holds {len(raw)} bytes with crc32c {crc32c.crc32c(raw):08x}; "
                f"its manifest names {c.end - c.start} bytes with crc32c {c.crc32c:08x}",
                path=c.key,
            )
        out.append(raw[max(start - c.start, 0) :])
    return b"".join(out)


class RemoteDecisions(TxnDecisions):
    """The decisions of a log in an object store, read only: :meth:`status` as
    :class:`~pylog.transactions.TxnDecisions` answers it for a log directory, from the newest decisions
    manifest, re-read when a status is not known at most once every ``refresh_ms`` of ``clock``'s monotonic
    time (with ``clock`` None: read once, at the first unknown status, then never again: one snapshot, as a
    Spark query plans with). A new manifest's bytes past those applied are fetched and applied; a manifest
    covering fewer bytes than applied (another log's) makes the reader start over.

    Thread-safety: thread-safe. Crash contract: reads only."""

    def __init__(self, store: ObjectStore, clock: Clock | None, *, refresh_ms: int = REFRESH_MS) -> None:
        super().__init__(store.url)
        self.store = store
        self._clock = clock
        self._refresh_ms = refresh_ms
        self._next_ms: float | None = None  # None: never read yet
        self._end = 0  # bytes of decisions.log applied
        #: the manifest the applied decisions come from (None: none read, or none in the store)
        self.manifest: DecisionsManifest | None = None

    def _refresh(self) -> None:
        if self._clock is None:
            if self._next_ms is None:
                self._next_ms = 0.0
                self.refresh_now()
            return
        now = self._clock.monotonic_ms()
        if self._next_ms is not None and now < self._next_ms:
            return
        self.refresh_now()
        self._next_ms = now + self._refresh_ms

    def refresh_now(self) -> None:
        """Read the newest decisions manifest and apply the bytes it holds past those applied."""
        with self._thread_lock:
            for attempt in range(2):
                manifest, _ = read_manifest(self.store)
                if manifest is None or manifest.end == self._end:
                    return
                start = self._end if manifest.end > self._end else 0
                try:
                    raw = read_decisions(self.store, manifest, start)
                except RemoteStorageError:
                    if attempt:
                        raise
                    continue  # a chunk replaced by a whole-file one and deleted meanwhile: read the newest
                if start == 0:
                    self.reset()
                self._apply_whole(raw, start, manifest)
                self._end, self.manifest = manifest.end, manifest
                return

    def _apply_whole(self, raw: bytes, start: int, manifest: DecisionsManifest) -> None:
        source = f"{self.store.url.rstrip('/')}/{PREFIX}manifest/{manifest.version:020d}.json"
        self.apply(raw, start, source, whole=True)
