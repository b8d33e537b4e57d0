"""The old entry point, kept as an alias: ``python bench/run.py [ARGS]`` is ``python -m bench [ARGS]``."""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.__main__ import main

    sys.exit(main())
