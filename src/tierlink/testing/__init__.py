"""Fakes and builders that ship with the package (used by tests, benchmarks, the simulator)."""
