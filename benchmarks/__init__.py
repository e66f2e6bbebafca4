"""Overtake benchmarks."""
