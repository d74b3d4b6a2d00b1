"""Rayform benchmarks (``make bench``); see ``docs/benchmarks.md``."""
