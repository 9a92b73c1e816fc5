"""Spark integration: the ``pylog`` data source (see ``docs/spark.md``).

Installing pylog installs the top-level module ``pyspark_pylog``, which Spark finds by itself, so
``spark.read.format("pylog").load(path)`` works without registration. :func:`register` registers it
explicitly in one session (needed only where that lookup is unavailable). Needs pyspark >= 4.0 and pyarrow.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PylogDataSource", "register"]


def register(spark: Any) -> None:
    """Register the ``pylog`` data source in ``spark`` (a SparkSession)."""
    from pylog.spark.source import PylogDataSource

    spark.dataSource.register(PylogDataSource)


def __getattr__(name: str) -> Any:
    if name == "PylogDataSource":
        from pylog.spark.source import PylogDataSource

        return PylogDataSource
    raise AttributeError(name)
