"""pylog's JVM reader for Spark: build its jar and install it in a SparkSession.

Spark's Python data source API hands every row from Python to the JVM, where Spark copies each column of
each row into its own row format; it has no column pruning. For scans that is most of the time of a query.
pylog's JVM reader (Java sources in ``pylog/spark/java/``) removes that: with it installed, a batch
``format("pylog")`` read is still planned by the Python data source (options, offsets, splits, pushed
filters: one implementation), but each planned partition is read by the executor's JVM straight from the
mapped segment files into Spark's column vectors, building only the columns the query uses.

It applies to batch reads of Kafka columns (``headers`` included) and of ``valueFormat=msgpack`` value
columns of scalar types (long, int, short, byte, double, float, string, binary, boolean); value columns of
other types, streaming reads and writes stay on the Python path.

Batch reads of a log in an object store by its URL are read here too (:mod:`pylog.spark.remote`): a
``file://`` store's segment objects as files, an ``s3://`` store's through GET URLs the driver presigned at
planning (``remoteStorage.presignExpirySeconds``, default 1 hour), read with ranged requests of
``java.net.http.HttpClient``: no credentials and no S3 library on the executors. Transient failures (5xx, a
reset connection, a body cut short) are retried 5 times; a refused URL (403: expired) is a
``pylog.errors.RemoteStorageError:`` saying to raise the expiry or re-run; a missing object is data loss
when a manifest version after the pinned one exists (remote retention dropped it), else a
``RemoteStorageError``.
A log directory whose topics are tiered is read here too, remote segments included, as on the Python path
(:mod:`pylog.spark.reader`): each task reads the offsets below the partition's local log start as it finds
it from the remote segments pinned at planning (those deleted locally since planning too: from the pinned
segments, or for a ``file://`` store from the newest manifest, which the task reads), the offsets between
the pinned remote end and the planned local log start are read past as the consumer does, the rest come
from the local files one segment at a time (a local file deleted before it was mapped is read from the
store, never skipped as data loss). ``failOnDataLoss`` applies as on the Python path. One case fails
instead: on an ``s3://`` store, offsets uploaded and deleted locally after planning have no presigned URL,
so the task fails with ``RemoteStorageError`` saying to re-run the query.
Other schemes (``gs://``, ``az://``) and stores read with ``skip_signature`` stay on the Python path, and so
does a log directory that records such a store. The runtime setting
``spark.pylog.native.enabled=false`` turns it off for a session. ``kafka.isolation.level=read_committed``
gives the same rows on both paths: the planner ends each range at the last stable offset and hands the JVM
the offsets of aborted batches to skip (:mod:`pylog.spark.committed`).

A read that fails in the JVM names pylog's error class as the Python path does: the task's error text starts
with ``pylog.errors.OffsetOutOfRangeError:`` for data loss after planning, ``pylog.errors.CorruptRecordError:``
for a corrupt batch (of a remote object: naming its key), ``pylog.errors.DeserializationError:`` for a msgpack
value that does not fit the schema, ``pylog.errors.RemoteStorageError:`` for an object store that fails.
With ``failOnDataLoss=false`` each skip is logged as a warning naming the partition and the offsets.

Usage (the settings must be given before the session's JVM starts)::

    builder = SparkSession.builder.master("local[4]")
    spark = pylog.spark.jvm.configure(builder).getOrCreate()

The jar is compiled on first use with ``javac`` (JDK 17+) against the installed pyspark's jars (see
:func:`jar_path` for where it is kept) and rebuilt when the sources or pyspark change;
``python -m pylog.spark.jvm`` builds it ahead of time and prints its path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, TypeVar

from pylog.errors import ConfigError

__all__ = ["EXTENSIONS", "ENABLED", "build", "configure", "jar_path"]

EXTENSIONS = "pylog.spark.jvm.PylogExtensions"
"""The value for ``spark.sql.extensions``."""
ENABLED = "spark.pylog.native.enabled"
"""Runtime setting: ``false`` sends every read through the Python data source."""

_SOURCES = Path(__file__).parent / "java"
_B = TypeVar("_B")


def _spark_jars() -> Path:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    if not jars.is_dir():
        raise ConfigError(f"pyspark at {jars.parent} has no jars directory: cannot build pylog's JVM reader")
    return jars


def _fingerprint(sources: list[Path]) -> str:
    """Changes when a source file or the pyspark version changes."""
    import pyspark

    h = hashlib.sha256(pyspark.__version__.encode())
    for src in sources:
        h.update(src.name.encode())
        h.update(src.read_bytes())
    return h.hexdigest()[:16]


def jar_path() -> Path:
    """Where the jar is (or will be) built: next to its sources, or in ``$XDG_CACHE_HOME/pylog`` (default
    ``~/.cache/pylog``) when the installed package is read-only."""
    if os.access(_SOURCES, os.W_OK):
        return _SOURCES / "pylog-spark.jar"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pylog"
    cache.mkdir(parents=True, exist_ok=True)
    return cache / "pylog-spark.jar"


def build(force: bool = False) -> Path:
    """Compile the JVM reader (if its sources or pyspark changed since the last build) and return the jar.

    Raises :class:`~pylog.errors.ConfigError` when no ``javac`` is found or compilation fails."""
    sources = sorted(_SOURCES.rglob("*.java"))
    jar = jar_path()
    stamp = jar.with_suffix(".fingerprint")
    fingerprint = _fingerprint(sources)
    if not force and jar.exists() and stamp.exists() and stamp.read_text() == fingerprint:
        return jar
    javac = shutil.which("javac", path=_java_path())
    if javac is None:
        raise ConfigError("javac (JDK 17 or later) is needed to build pylog's JVM reader; none found on PATH")
    with tempfile.TemporaryDirectory(prefix="pylog-jvm-") as tmp:
        classes = Path(tmp) / "classes"
        cmd = [
            javac,
            "--release",
            "17",
            "-Xlint:all,-path,-serial,-processing,-classfile,-options",
            "-Werror",
            "-cp",
            str(_spark_jars() / "*"),
            "-d",
            str(classes),
            *map(str, sources),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ConfigError(f"building pylog's JVM reader failed:\n{done.stdout}{done.stderr}")
        partial = Path(tmp) / jar.name
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: pylog\n\n")
            for cls in sorted(classes.rglob("*.class")):
                z.write(cls, cls.relative_to(classes).as_posix())
        # two-phase: a reader of the old jar never sees a half-written one
        tmp_jar = jar.with_suffix(".jar.tmp")
        shutil.copyfile(partial, tmp_jar)
        os.replace(tmp_jar, jar)
        stamp.write_text(fingerprint)
    return jar


def _java_path() -> str:
    """PATH, with ``$JAVA_HOME/bin`` first when JAVA_HOME is set."""
    path = os.environ.get("PATH", "")
    home = os.environ.get("JAVA_HOME")
    return f"{home}/bin{os.pathsep}{path}" if home else path


def configure(builder: _B, *, enabled: bool = True) -> _B:
    """``builder`` (a ``SparkSession.Builder``) with pylog's JVM reader installed: builds the jar if needed,
    adds it to ``spark.jars`` and its extension to ``spark.sql.extensions``.

    Settings of the same names given to ``builder`` before are replaced: if the session needs other jars or
    extensions too, set both settings yourself, adding :func:`jar_path` and :data:`EXTENSIONS`."""
    b: Any = builder
    b = b.config("spark.jars", str(build())).config("spark.sql.extensions", EXTENSIONS)
    result: _B = b.config(ENABLED, "true" if enabled else "false")
    return result


if __name__ == "__main__":  # pragma: no cover - command line
    try:
        print(build(force="--force" in sys.argv))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
