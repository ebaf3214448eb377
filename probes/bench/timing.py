"""Timing for the benchmarks: the best of several runs after a warm-up."""

from __future__ import annotations

import time


def best_seconds(fn, repeats: int) -> float:
    fn()  # warm up: page faults and caches
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
