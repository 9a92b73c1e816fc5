"""Which implementation of the per-record hot loops is in use: compiled, or pure Python.

pylog ships a C extension, ``pylog._speedups``, built by ``pip install`` with the machine's C compiler. It
implements the loops over the batch format of :mod:`pylog.record` (whose docstring is the one definition of
the format): decoding a batch into the lists a consumer's records are built from, and building the records.
Every decision (locks, recovery, policies, which batches to read) stays in Python, and each compiled function
has a pure-Python twin that gives the same bytes, the same records and the same errors.

The compiled path is used when the extension imports. The pure-Python path is used when it does not (pylog was
installed where no C compiler was found: the build of the extension is optional), or when the environment
variable ``PYLOG_PURE_PYTHON`` is set to anything but ``""`` or ``"0"`` when pylog is imported.
``pylog --version`` and :data:`PATH` say which one is in use.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Final

__all__ = ["ABI_VERSION", "COMPILED", "ENV", "PATH", "core"]

#: The environment variable that forces the pure-Python path.
ENV: Final = "PYLOG_PURE_PYTHON"
#: The interface version of ``pylog._speedups`` this pylog calls (an extension built from another checkout of
#: the source, left in place by an older build, is not used).
ABI_VERSION: Final = 7


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get(ENV, "") not in ("", "0"):
        return None, f"pure Python ({ENV} is set)"
    try:
        module = importlib.import_module("pylog._speedups")
    except ImportError as exc:
        return None, f"pure Python (the compiled extension does not import: {exc})"
    if getattr(module, "ABI_VERSION", None) != ABI_VERSION:
        return (
            None,
            "pure Python (the compiled extension is out of date: rebuild it with pip install or make ext)",
        )
    return module, f"compiled ({module.__name__})"


_core, _path = _load()
#: The compiled module (``pylog._speedups``), or None on the pure-Python path.
core: Final[ModuleType | None] = _core
#: Whether the compiled path is in use.
COMPILED: Final = core is not None
#: What ``pylog --version`` prints about the path in use.
PATH: Final = _path
