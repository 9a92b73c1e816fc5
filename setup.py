"""Builds pylog's optional C extension, pylog._speedups (everything else is declared in pyproject.toml).

The extension is optional: when it cannot be compiled (no C compiler, no Python headers), ``pip install``
still installs pylog, which then runs its pure-Python path (see pylog/speedups.py and docs/performance.md).
Set ``PYLOG_BUILD_REQUIRE_EXTENSION=1`` to make a failed compile fail the install instead (for wheels).
"""

from __future__ import annotations

import os
import shutil
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

REQUIRED = os.environ.get("PYLOG_BUILD_REQUIRE_EXTENSION", "") not in ("", "0")


class OptionalBuildExt(build_ext):
    """build_ext that reports a failed compile and carries on without the extension."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            self._skip(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._skip(exc)

    def copy_file(self, infile: str, outfile: str, *args: object, **kwargs: object) -> tuple[str, bool]:
        """Put the built library in place by a rename, never by rewriting the file: a process that has the
        old one loaded (tests running from the source tree during an editable install) keeps its copy."""
        if not outfile.endswith((".so", ".pyd")) or os.path.isdir(outfile):
            return super().copy_file(infile, outfile, *args, **kwargs)  # type: ignore[arg-type]
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(outfile) or ".", suffix=".tmp")
        os.close(fd)
        try:
            shutil.copy2(infile, tmp)
            os.replace(tmp, outfile)
        except BaseException:
            os.unlink(tmp)
            raise
        return outfile, True

    def _skip(self, exc: Exception) -> None:
        if REQUIRED:
            raise exc
        print(f"WARNING: pylog's C extension was not built ({exc}); pylog will use its pure-Python path")


speedups = Extension(
    "pylog._speedups",
    sources=["src/pylog/_speedups.c"],
    extra_compile_args=["-O2", "-std=c11"] if os.name == "posix" else [],
)

setup(ext_modules=[speedups], cmdclass={"build_ext": OptionalBuildExt})
