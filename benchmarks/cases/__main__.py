"""Run one case in this process: ``python -m benchmarks.cases NAME --records N --seed S --dir D --out F``.

Writes the case's result as JSON to ``--out`` (or stdout), adding ``status`` when the case did not. An
exception becomes ``{"status": "error", "reason": ...}`` with exit status 0, so the runner records it and
goes on; ``--list`` prints the registry instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path
from typing import Any

from benchmarks.cases import CASES


def warm_memory(megabytes: int) -> None:
    """Touch ``megabytes`` of fresh memory and free it again.

    On a virtual machine whose host takes back the guest's free memory, the first touch of a page is slow
    (microseconds per page); a case that allocates or writes 100 MB in its timed part would measure that
    instead of its own work, and only in some runs. Touching the memory first makes the kernel's free pages
    resident again, so the timed part finds them as on a physical machine."""
    if megabytes > 0:
        import numpy as np

        buf = np.ones(megabytes << 20, dtype=np.uint8)
        del buf


def run_case(name: str, records: int, seed: int, workdir: Path) -> dict[str, Any]:
    try:
        out = CASES[name].fn(records, seed, workdir)
    except Exception as exc:
        lines = traceback.format_exception(exc)
        return {"status": "error", "reason": f"{type(exc).__name__}: {exc}", "traceback": "".join(lines)}
    out.setdefault("status", "ok")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cases", description=__doc__)
    parser.add_argument("case", nargs="?", choices=sorted(CASES), metavar="CASE")
    parser.add_argument("--list", action="store_true", help="print the registered cases as JSON")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dir", type=Path, help="an empty work directory for the case's files")
    parser.add_argument("--out", type=Path, help="write the result JSON here (default: stdout)")
    parser.add_argument("--warm-mb", type=int, default=0, help="touch this much memory before the case")
    args = parser.parse_args(argv)
    if args.list:
        json.dump([c.meta() for c in CASES.values()], sys.stdout, indent=1)
        return 0
    if args.case is None or args.dir is None:
        parser.error("give a CASE and --dir (or --list)")
    args.dir.mkdir(parents=True, exist_ok=True)
    warm_memory(args.warm_mb)
    out = run_case(args.case, args.records, args.seed, args.dir)
    text = json.dumps(out, indent=1)
    if args.out is None:
        print(text)
    else:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
