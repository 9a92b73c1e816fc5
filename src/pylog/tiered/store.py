"""ObjectStore: the object store of tiered storage, one small API over obstore.

A store is opened from a URL: ``file:///abs/path`` (a local or mounted directory), ``s3://bucket/prefix``
(with ``endpoint``, ``region``, ``access_key_id``, ... as options, or the usual ``AWS_*`` environment
variables), or any other scheme obstore knows (``gs://``, ``az://``, ``memory:///``). Keys are ``/``-separated
and relative to the URL's prefix.

Operations: :meth:`~ObjectStore.put` (whole object, optionally create-if-absent; returns the object's entity
tag), :meth:`~ObjectStore.put_file` (streams part of a local file, returning its size and CRC-32C),
:meth:`~ObjectStore.get`, :meth:`~ObjectStore.get_if_exists`, :meth:`~ObjectStore.get_range`,
:meth:`~ObjectStore.checksum` (streams an object back: size and CRC-32C), :meth:`~ObjectStore.list` (keys, sizes
and entity tags), :meth:`~ObjectStore.delete`, :meth:`~ObjectStore.delete_many`.

Entity tags (the store's ``ETag``: an MD5 or another opaque tag on S3, GCS and Azure; inode, modification time
and size on ``file://``; a counter on ``memory://``) are compared only with each other, as the store reports
them for one key: :meth:`~ObjectStore.put` and :meth:`~ObjectStore.list` report the same tag for the same
object (measured with obstore 0.12.1 on ``file://``, ``memory://`` and moto S3); two objects written one after
the other under one key get different tags unless their bytes are equal (S3's MD5). Quotes and a weak
validator's ``W/`` are removed; a store that reports none gives ``""``.

Why obstore: of the clients pylog could use (pyarrow's file systems, fsspec/s3fs, obstore) it is the one with
a create-if-absent put on every backend through one call (S3 ``If-None-Match: *``, an exclusive create on a
local directory), which the remote manifest needs since object stores have no atomic rename. It also has
ranged reads, listing and retries with backoff for transient errors: :data:`DEFAULT_RETRY` bounds them (at
most 5 retries and 60 s per request) unless ``retry_config`` is given.

A read whose answer is cut in the middle of its body (a connection dropped while the bytes stream) is resumed by
obstore itself: :meth:`~ObjectStore.get_range`, :meth:`~ObjectStore.get`, :meth:`~ObjectStore.checksum` and
:meth:`~ObjectStore.download` see one whole answer, after a ranged GET of only the bytes still missing (pinned
to the object's ETag, so a replaced object is an error, never a mix), within the same bound of retries and
backoff as a request that failed before its body (object_store's retry of streaming GETs, which obstore
builds on; measured with obstore 0.12.1 through a proxy that cuts answers after 0 to 1000 bytes, and
required by tests/fault/test_tiered_network.py, which fails on a client that does not resume: the second
request asks for ``bytes=<start + received>-<end>``, and an answer cut every time is a
:class:`~pylog.errors.RemoteStorageError` after ``1 + max_retries`` requests). pylog does not retry on top of
that, which would multiply the bound.

Errors: every failure of the store is a :class:`~pylog.errors.RemoteStorageError` naming the key; obstore is
imported when the first store is opened, so ``import pylog`` does not need it. A mistake in the URL or the
options (an unknown scheme, a relative ``file://`` path, no bucket, an option the store does not take or a
value of the wrong type, an endpoint that is not an ``http(s)://`` URL, a plain-HTTP endpoint without
``allow_http``) is a :class:`~pylog.errors.ConfigError` when the store is opened, one line naming the option;
nothing is contacted to find it.

Stopping uploads: :meth:`~ObjectStore.stop_uploads` (a closing log's uploader calls it) makes every
:meth:`~ObjectStore.put_file` in progress stop at its next chunk boundary (at most ``8 MiB`` further), and every
later one before its first chunk, with a :class:`~pylog.errors.RemoteStorageError`: obstore then abandons the
object (a multipart upload is aborted, a local temporary file removed; measured on file:// and moto S3: no
object and no pending multipart upload is left), so nothing partial is ever visible, and no manifest names it.

Thread-safety: thread-safe (obstore stores are). Crash contract: a put is atomic (the object is either absent
or whole: S3 PUT semantics; obstore's local store writes a temporary file and renames it). obstore's local
store does not fsync, so for ``file://`` this class does: after each put the object's file, then its directory
and every directory above it up to the store's root (and the root's parent) whose entry this store has not made
durable before, are fsynced before the put returns (a put that returned survives a power loss of the machine
holding the directory); a delete fsyncs the object's directory.
"""

from __future__ import annotations

import os
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import crc32c

from pylog.errors import ConfigError, RemoteStorageError

if TYPE_CHECKING:
    from obstore.store import ObjectStore as _ObstoreStore

__all__ = [
    "DEFAULT_RETRY",
    "ObjectInfo",
    "ObjectStore",
    "Written",
    "check_store",
    "check_url",
    "local_path",
    "open_store",
]

_CHUNK = 8 << 20  # bytes per chunk streamed to or from the store

# transient failures (connection errors, timeouts, 5xx) are retried with exponential backoff, at most 5 times
# and for at most 60 s per request, then surface as RemoteStorageError; pass retry_config to change it
DEFAULT_RETRY: dict[str, Any] = {
    "max_retries": 5,
    "retry_timeout": timedelta(seconds=60),
    "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=5), "base": 2},
}


@dataclass(frozen=True)
class ObjectInfo:
    """One object of a listing: its key (relative to the store's prefix), size in bytes and entity tag (see
    the module docstring; ``""`` when the store reports none)."""

    key: str
    size: int
    etag: str = ""


@dataclass(frozen=True)
class Written:
    """What :meth:`ObjectStore.put` returns when it wrote the object (always true): its key and entity tag
    (``""`` when the store reports none)."""

    key: str
    etag: str = ""


class ObjectStore:
    """An object store at ``url``. ``options`` go to obstore's ``from_url`` (``endpoint``, ``region``,
    ``access_key_id``, ``secret_access_key``, ``client_options={"allow_http": True}``, ``retry_config``...)."""

    def __init__(self, url: str, **options: Any) -> None:
        self.url = check_url(url)
        self._store = _open(url, options)
        # file://: the local directory of the store, whose writes this class fsyncs (obstore does not)
        self._root = _local_root(url)
        self._durable_dirs: set[str] = (
            set()
        )  # file://: directories whose own entry was fsynced into their parent
        self._uploads_stopped = threading.Event()  # see stop_uploads()

    def __repr__(self) -> str:
        return f"ObjectStore({self.url!r})"

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> Written | None:
        """Write ``data`` as ``key`` (atomically): a :class:`Written` (true) with the new object's entity tag.
        With ``if_absent``, only if no object ``key`` exists: returns None (and writes nothing) when one does."""
        import obstore

        try:
            result = obstore.put(self._store, key, data, mode="create" if if_absent else "overwrite")
        except Exception as exc:
            if if_absent and _already_exists(exc):
                return None
            raise _error("put", key, exc) from exc
        self._sync(key)
        return Written(key, _etag(result.get("e_tag")))

    def put_file(self, key: str, path: str, length: int, *, if_absent: bool = True) -> tuple[int, int]:
        """Stream the first ``length`` bytes of the local file ``path`` to ``key``; ``(size, crc32c)`` of the
        bytes read. With ``if_absent`` (the default: uploads go to fresh keys) an existing ``key`` is an
        error, unless it holds exactly these bytes (a retry of this put after its first attempt's answer was
        lost: the object was written whole, and is kept as written). A file shorter than ``length`` raises :class:`RemoteStorageError` before anything is written."""
        import obstore

        crc = [0, 0]  # [crc, size] of what was handed to the store

        def chunks(f: Any) -> Iterator[bytes]:
            left = length
            while left > 0:
                if self._uploads_stopped.is_set():
                    raise RemoteStorageError(
                        f"upload of {path} stopped after {crc[1]} of {length} bytes: the log is closing",
                        key=key,
                    )
                data = f.read(min(_CHUNK, left))
                if not data:
                    raise RemoteStorageError(f"{path} is shorter than {length} bytes", key=key)
                crc[0] = crc32c.crc32c(data, crc[0])
                crc[1] += len(data)
                left -= len(data)
                yield data

        with open(path, "rb") as f:
            try:
                obstore.put(self._store, key, chunks(f), mode="create" if if_absent else "overwrite")
            except RemoteStorageError:
                raise
            except Exception as exc:
                if not (if_absent and _already_exists(exc) and crc[1] == length):
                    raise _error("put", key, exc) from exc
                # a retried create whose first attempt was written but whose answer was lost (a dropped
                # connection) finds the key taken: the upload succeeded if the object is exactly these bytes
                if self.checksum(key) != (crc[1], crc[0]):
                    raise _error("put", key, exc) from exc
        self._sync(key)
        return crc[1], crc[0]

    def stop_uploads(self) -> None:
        """Stop every :meth:`put_file` in progress at its next chunk boundary, and refuse later ones (see the
        module docstring); for a log that closes. Other operations go on."""
        self._uploads_stopped.set()

    def get(self, key: str) -> bytes:
        """The whole object ``key``."""
        import obstore

        try:
            return bytes(obstore.get(self._store, key).bytes())
        except Exception as exc:
            raise _error("get", key, exc) from exc

    def get_if_exists(self, key: str) -> bytes | None:
        """The whole object ``key``, or None when there is no such object."""
        import obstore

        try:
            return bytes(obstore.get(self._store, key).bytes())
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise _error("get", key, exc) from exc

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes of ``key`` from byte ``start``; fewer only if the object ends first."""
        import obstore

        if start < 0 or length < 0:
            raise RemoteStorageError(f"bad range start={start} length={length}", key=key)
        if length == 0:
            return b""
        try:
            return bytes(obstore.get_range(self._store, key, start=start, length=length))
        except Exception as exc:
            raise _error("get_range", key, exc) from exc

    def checksum(self, key: str) -> tuple[int, int]:
        """``(size, crc32c)`` of the object ``key`` as the store returns it (streamed, not held in memory)."""
        import obstore

        size = crc = 0
        try:
            for chunk in obstore.get(self._store, key).stream(min_chunk_size=_CHUNK):
                crc = crc32c.crc32c(bytes(chunk), crc)
                size += len(chunk)
        except Exception as exc:
            raise _error("get", key, exc) from exc
        return size, crc

    def download(self, key: str, path: str) -> tuple[int, int]:
        """Stream ``key`` into the new local file ``path`` (fsynced); ``(size, crc32c)`` of what was written."""
        import obstore

        size = crc = 0
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for chunk in obstore.get(self._store, key).stream(min_chunk_size=_CHUNK):
                data = bytes(chunk)
                crc = crc32c.crc32c(data, crc)
                size += len(data)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError as exc:
            raise RemoteStorageError(f"cannot write {path}: {exc}", key=key) from exc
        except Exception as exc:
            raise _error("get", key, exc) from exc
        finally:
            os.close(fd)
        return size, crc

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (a ``/``-ended folder), sorted by key."""
        import obstore

        try:
            found = [
                ObjectInfo(str(meta["path"]), int(meta["size"]), _etag(meta.get("e_tag")))
                for batch in obstore.list(self._store, prefix=prefix or None)
                for meta in batch
            ]
        except Exception as exc:
            raise _error("list", prefix, exc) from exc
        return sorted(found, key=lambda info: info.key)

    def delete(self, key: str) -> None:
        """Remove ``key`` (no error if it is already gone)."""
        import obstore

        try:
            obstore.delete(self._store, key)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise _error("delete", key, exc) from exc
        if self._root is not None:
            self._fsync_dirs(os.path.dirname(os.path.join(self._root, key)), up_to_root=False)

    def delete_many(self, keys: Sequence[str]) -> None:
        """Remove every key of ``keys`` (no error for one already gone), in as few requests as the store allows
        (S3: one ``DeleteObjects`` request per 1000 keys, where :meth:`delete` makes one request per key)."""
        import obstore

        if not keys:
            return
        try:
            obstore.delete(self._store, list(keys))
        except FileNotFoundError:
            for key in keys:  # one was gone already (a local store says so): the rest one by one
                self.delete(key)
            return
        except Exception as exc:
            raise _error("delete", keys[0], exc) from exc
        if self._root is not None:
            for directory in sorted({os.path.dirname(os.path.join(self._root, key)) for key in keys}):
                self._fsync_dirs(directory, up_to_root=False)

    def _sync(self, key: str) -> None:
        """``file://``: make the object ``key`` just written durable (its file, and the directories from its
        parent up to the root, some of which the put may have created)."""
        if self._root is None:
            return
        path = os.path.join(self._root, key)
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except FileNotFoundError:
            pass  # deleted by another writer right after the put (an old manifest version pruned): nothing to keep
        except OSError as exc:
            raise RemoteStorageError(f"cannot fsync {path}: {exc}", key=key) from exc
        self._fsync_dirs(os.path.dirname(path), up_to_root=True)

    def _fsync_dirs(self, directory: str, *, up_to_root: bool) -> None:
        if self._root is None:
            return
        root = os.path.dirname(self._root.rstrip("/")) or "/"  # the root's own entry is in its parent
        synced: list[str] = []  # fsynced directories below the current one: their entries are in it
        while True:
            try:
                fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except FileNotFoundError:
                pass  # a delete's directory that is gone, or one removed meanwhile
            except OSError as exc:
                raise RemoteStorageError(f"cannot fsync {directory}: {exc}", key=directory) from exc
            parent = os.path.dirname(directory)
            if not up_to_root or directory == root or parent == directory or not parent.startswith(root):
                break
            if directory in self._durable_dirs:
                break  # its entry in its parent (and theirs, up to the root) were made durable before
            synced.append(directory)
            directory = parent
        self._durable_dirs.update(synced)  # each one's entry is now durable in its fsynced parent


def open_store(url: str, **options: Any) -> ObjectStore:
    """An :class:`ObjectStore` for ``url`` (see the module docstring for the schemes and options)."""
    return ObjectStore(url, **options)


_SCHEMES = ("s3", "s3a", "gs", "az", "adl", "azure", "abfs", "abfss", "http", "https", "file", "memory")
_FILE_OPTIONS = ("mkdir", "automatic_cleanup", "client_options", "retry_config")  # what a local store takes
_ENDPOINT_OPTIONS = ("endpoint", "aws_endpoint", "aws_endpoint_url", "endpoint_url")


def check_url(url: object) -> str:
    """``url`` if it is an object-store URL pylog can open (a scheme obstore knows, a bucket or an absolute
    path); else :class:`~pylog.errors.ConfigError` naming it. Nothing is contacted."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(
            f"remote_storage must be an object-store URL such as s3://bucket/prefix or file:///absolute/path, "
            f"got {url!r}"
        )
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in _SCHEMES:
        raise ConfigError(
            f"remote_storage {url!r}: unknown scheme {parsed.scheme!r} (one of {', '.join(_SCHEMES)})"
        )
    if parsed.scheme == "file" and (
        parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/")
    ):
        raise ConfigError(
            f"remote_storage {url!r}: a file:// URL names an absolute path, as file:///absolute/path "
            "(three slashes)"
        )
    if parsed.scheme not in ("file", "memory") and not parsed.netloc:
        raise ConfigError(f"remote_storage {url!r} names no bucket or container (as s3://bucket/prefix)")
    return url


def _check_options(url: str, options: dict[str, Any]) -> None:
    """Refuse option mistakes obstore accepts and would only report at the first request, or never."""
    scheme = urllib.parse.urlparse(url).scheme
    if scheme == "file":
        for key in options:
            if key not in _FILE_OPTIONS:
                raise ConfigError(
                    f"remote_storage_options: {key!r} is not an option of a file:// store "
                    f"(it takes {', '.join(_FILE_OPTIONS)})"
                )
    client = options.get("client_options")
    if client is not None and not isinstance(client, dict):
        raise ConfigError(f"remote_storage_options: client_options must be a dict, got {client!r}")
    for key in _ENDPOINT_OPTIONS:
        endpoint = options.get(key)
        if endpoint is None:
            continue
        parsed = urllib.parse.urlparse(str(endpoint))
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(
                f"remote_storage_options: {key}={endpoint!r} is not an http:// or https:// URL of a server"
            )
        allow = str((client or {}).get("allow_http", os.environ.get("AWS_ALLOW_HTTP", ""))).lower()
        if parsed.scheme == "http" and allow != "true":
            raise ConfigError(
                f"remote_storage_options: {key}={endpoint!r} is plain HTTP, which the client refuses unless "
                "client_options={'allow_http': True} (CLI: --option allow_http=true)"
            )


def check_store(url: object, options: dict[str, Any] | None = None) -> str:
    """``url`` if it and ``options`` open a store (see the module docstring); else
    :class:`~pylog.errors.ConfigError`, one line naming the option. Nothing is contacted or created (a
    ``file://`` store's directory is made when it is opened)."""
    checked = check_url(url)
    options = dict(options or {})
    _check_options(checked, options)
    if not checked.startswith("file://"):
        _open(checked, options)  # builds the client (no request): obstore checks the options
    return checked


def _open(url: str, options: dict[str, Any]) -> _ObstoreStore:
    try:
        from obstore.store import from_url
    except ImportError as exc:
        raise RemoteStorageError("tiered storage needs obstore: pip install 'pylog[tiered]'") from exc
    check_url(url)
    _check_options(url, options)
    if url.startswith("file://"):
        options = {"mkdir": True, **options}
    else:
        options = {"retry_config": DEFAULT_RETRY, **options}
    try:
        return from_url(url, **options)
    except Exception as exc:
        if url.startswith("file://"):  # the directory cannot be made or read: not an option's fault
            raise RemoteStorageError(f"cannot open the object store {url}: {_first_line(exc)}") from exc
        raise _option_error(url, options, exc) from exc


def _option_error(url: str, options: dict[str, Any], exc: Exception) -> ConfigError:
    """The :class:`ConfigError` of options obstore refused (its configuration is checked without any request):
    one line naming the option."""
    from obstore.store import from_url

    text = _first_line(exc)
    culprit = None
    for key, value in options.items():  # the option that fails alone (obstore names few of them)
        try:
            from_url(url, **{key: value})
        except Exception:
            culprit = repr(key)
            break
    if culprit == repr("client_options"):  # which one of them
        for name, value in dict(options["client_options"]).items():
            try:
                from_url(url, client_options={name: value})  # type: ignore[call-overload]
            except Exception:
                culprit = f"client_options[{name!r}]"
                break
    where = f"remote_storage_options {culprit}" if culprit else "remote_storage_options"
    return ConfigError(f"{where} refused for {url}: {text}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return " ".join(text.splitlines()[0].split()) if text else type(exc).__name__


def local_path(url: str) -> str | None:
    """The local directory of a ``file://`` URL (None for other schemes)."""
    return _local_root(url)


def _local_root(url: str) -> str | None:
    """The directory of a ``file://`` URL (None for other schemes)."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme != "file":
        return None
    return urllib.parse.unquote(parsed.path).rstrip("/") or "/"


def _etag(tag: object) -> str:
    """An entity tag as the store reported it, without quotes or a weak validator's ``W/`` ("" for none)."""
    if not isinstance(tag, str):
        return ""
    tag = tag.strip()
    if tag.startswith("W/"):
        tag = tag[2:]
    return tag.strip('"')


def _already_exists(exc: Exception) -> bool:
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    return isinstance(exc, AlreadyExistsError | PreconditionError)


def _error(op: str, key: str, exc: Exception) -> RemoteStorageError:
    if isinstance(exc, FileNotFoundError):
        return RemoteStorageError(f"{op} {key}: no such object in the store", key=key)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return RemoteStorageError(f"{op} {key} failed: {first}", key=key)
