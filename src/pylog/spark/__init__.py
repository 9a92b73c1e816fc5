"""Spark integration: the ``pylog`` data source (see ``docs/spark.md``).

:func:`session` is the one way to start Spark for pylog that cannot go wrong: a SparkSession whose Python
workers run this interpreter (which has pylog and pyarrow), with pylog's JVM reader installed when it can be
built, and the source registered. Installing pylog also installs the top-level module ``pyspark_pylog``,
which Spark finds by itself on the first use of a Python data source, so ``spark.read.format("pylog").load(path)`` works in a
session built any other way too, as long as its workers' Python has pylog. :func:`register` registers the
source explicitly in one session. Needs pyspark >= 4.0 and pyarrow.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from pylog.errors import ConfigError
from pylog.spark import jvm

__all__ = ["PylogDataSource", "builder", "register", "session"]

_log = logging.getLogger("pylog.spark")


def register(spark: Any) -> None:
    """Register the ``pylog`` data source in ``spark`` (a SparkSession)."""
    from pylog.spark.source import PylogDataSource

    spark.dataSource.register(PylogDataSource)


def builder(
    master: str | None = None,
    app_name: str = "pylog",
    *,
    jvm_reader: bool | None = None,
    config: Mapping[str, str] | None = None,
    base: Any = None,
) -> Any:
    """A ``SparkSession.Builder`` set up for pylog (see :func:`session`); ``base`` is the builder to start
    from (default ``SparkSession.builder``)."""
    if base is None:
        from pyspark.sql import SparkSession

        base = SparkSession.builder
    b = base.appName(app_name)
    if master is not None:
        b = b.master(master)
    for key, value in (config or {}).items():
        b = b.config(key, value)
    # the workers' interpreter: the environment variable is what the JVM reads when it starts workers (it
    # must be set before the JVM starts); the setting carries it to executors of a cluster
    os.environ["PYSPARK_PYTHON"] = sys.executable
    b = b.config("spark.pyspark.python", sys.executable)
    if jvm_reader is not False:
        try:
            b = jvm.configure(b)
        except ConfigError as exc:
            if jvm_reader:
                raise
            _log.warning("pylog's JVM reader is not installed (%s); reads take the Python path", exc)
    return b


def session(
    master: str | None = None,
    app_name: str = "pylog",
    *,
    jvm_reader: bool | None = None,
    config: Mapping[str, str] | None = None,
    base: Any = None,
) -> Any:
    """A SparkSession ready for ``format("pylog")``: created, or the running one (``getOrCreate``).

    - Spark's Python workers run ``sys.executable``, the interpreter calling this (Spark's default is
      ``python3`` from ``PATH``, which without the virtualenv activated has no pylog: every read then fails
      with ``DATA_SOURCE_NOT_FOUND``);
    - pylog's JVM reader (:mod:`pylog.spark.jvm`) is installed: ``jvm_reader=None`` (default) when it can be
      built (a JDK is found), ``True`` requires it (ConfigError otherwise), ``False`` leaves it out;
    - the ``pylog`` source is registered in the session explicitly, so it is found even where Spark's
      automatic lookup of ``pyspark_pylog`` is skipped (it is when any ``pyspark_*`` module fails to import).

    ``master`` (e.g. ``"local[4]"``), ``app_name`` and ``config`` (other Spark settings) go to the builder.
    Settings that need a new JVM (the Python of the workers, ``spark.jars``) cannot change in a process whose
    JVM is already running: if the running JVM's workers would start another Python, this raises ConfigError.
    """
    b = builder(master, app_name, jvm_reader=jvm_reader, config=config, base=base)
    spark = b.getOrCreate()
    _check_worker_python(spark)
    register(spark)
    return spark


def _check_worker_python(spark: Any) -> None:
    """The JVM starts Python workers with its own ``PYSPARK_PYTHON`` (read when it started)."""
    try:
        jvm_python = spark.sparkContext._jvm.System.getenv("PYSPARK_PYTHON")
    except AttributeError:  # not a classic session (Spark Connect): the server decides
        return
    if jvm_python and os.path.realpath(jvm_python) != os.path.realpath(sys.executable):
        raise ConfigError(
            f"the running Spark JVM starts Python workers with {jvm_python}, not this interpreter "
            f"({sys.executable}); a JVM keeps the setting for its whole life: start a new Python process "
            "and call pylog.spark.session() before anything else starts Spark"
        )
    if not jvm_python:
        raise ConfigError(
            "the running Spark JVM was started without PYSPARK_PYTHON, so its Python workers run python3 from "
            f"PATH, not this interpreter ({sys.executable}); start a new Python process and call "
            "pylog.spark.session() before anything else starts Spark"
        )


def __getattr__(name: str) -> Any:
    if name == "PylogDataSource":
        from pylog.spark.source import PylogDataSource

        return PylogDataSource
    raise AttributeError(name)
