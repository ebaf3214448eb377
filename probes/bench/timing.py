"""Timing for the benchmarks: the best of several runs after a warm-up."""

from __future__ import annotations

import time


def best_seconds(fn, repeats: int) -> float:
    return best_interleaved([fn], repeats)[0]


def best_interleaved(fns, repeats: int) -> list[float]:
    """The best of several runs of each of `fns`, taken in turn (a, b, a, b,
    ...), so that the machine's drift falls on all of them alike."""
    for fn in fns:
        fn()  # warm up
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best
