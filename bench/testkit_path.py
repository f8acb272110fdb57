"""Puts tests/ on the import path: the benchmarks share the tests' helpers (tests/testkit),
which are not part of the installed package."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
