"""Spark's automatic lookup of Python data sources imports every ``pyspark_*`` module and registers its
``DefaultSource``: this one makes ``spark.read.format("pylog")`` work without a register call.

Importing it never fails: when Spark or pylog's Spark support cannot be loaded, ``DefaultSource`` is a plain
class that Spark ignores (a failing ``pyspark_*`` module would disable Spark's lookup of every data source).
"""

from __future__ import annotations

__all__ = ["DefaultSource"]

try:
    from pylog.spark.source import PylogDataSource as DefaultSource
except Exception as _exc:  # pragma: no cover - depends on what is installed
    _reason = f"{type(_exc).__name__}: {_exc}"

    class DefaultSource:  # type: ignore[no-redef]
        """Placeholder: pylog's Spark data source is unavailable here (see ``unavailable_reason``)."""

        unavailable_reason = _reason

        @classmethod
        def name(cls) -> str:
            return "pylog"
