"""Test-only helpers shared by the tests and the benchmarks (not part of the package)."""
