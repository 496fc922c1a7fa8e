"""Benchmarks: figures printed, never asserted in CI."""
