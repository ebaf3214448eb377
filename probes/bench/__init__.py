"""Benchmarks, each printing a ratio to a baseline measured in the same run."""
