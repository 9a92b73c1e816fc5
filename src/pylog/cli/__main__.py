"""``python -m pylog.cli``."""

from __future__ import annotations

import sys

from pylog.cli import main

if __name__ == "__main__":
    sys.exit(main())
