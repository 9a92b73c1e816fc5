"""The ``pylog`` command-line tool: topics, produce, consume, groups, dump, verify, repair, bench.

Run ``pylog --help`` (or ``python -m pylog.cli --help``). The entry point is :func:`main`.
"""

from __future__ import annotations

from pylog.cli._app import main

__all__ = ["main"]
