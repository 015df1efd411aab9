"""Benchmark scripts whose figures go into closing notes (not tests): `python -m k25exp.benchmarks.NAME`."""
