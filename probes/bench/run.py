"""Benchmark: the default probe run of every generation on the simulated
device, as the main job runs it (shipped layout table, one worker per core).
Prints wall time and cases per second against the 30 s target, and what a
case costs beyond its probe (fork, watch, exit) beside the start-up of a fresh
worker interpreter, which is what a case cost before workers were forked."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import kvref
from probes.run.probe_case import run_case_here
from probes.run.runner import run_case, run_cases
from probes.suite.matrix import DEFAULT_MATRIX, build_cases, load_matrix

TARGET_SECONDS = 30.0
OVERHEAD_TARGET_MS = 50.0
SAMPLES = 15


def per_case_overhead_ms(cases) -> float:
    """Median over light cases of (watched run) - (the same case run in this
    process, warm): what running a case in its own process adds."""
    light = [c for c in cases if c.probe == "plan_binding"]
    extra = []
    for case in (light * SAMPLES)[:SAMPLES]:
        run_case_here(case.to_json())  # warm this process's caches for the case
        start = time.perf_counter()
        run_case_here(case.to_json())
        here = time.perf_counter() - start
        extra.append(run_case(case).wall_seconds - here)
    return 1000 * statistics.median(extra)


def fresh_worker_start_ms() -> float:
    """A fresh interpreter importing what a worker imports, and exiting."""
    times = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import probes.run.probe_case"], check=True)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    args = parser.parse_args(argv)
    cases = build_cases(kvref.GENERATIONS, load_matrix(DEFAULT_MATRIX))
    start = time.perf_counter()
    found = run_cases(cases, args.jobs)
    seconds = time.perf_counter() - start
    worst = max(found, key=lambda r: r.wall_seconds)
    print(f"{len(cases)} cases on {len(kvref.GENERATIONS)} generations with {args.jobs} jobs: "
          f"{seconds:.1f} s, {len(cases) / seconds:.1f} cases/s "
          f"({seconds / TARGET_SECONDS:.2f}x the {TARGET_SECONDS:.0f} s target)")
    print(f"slowest case: {worst.case.case_id} {worst.wall_seconds:.2f} s")
    overhead = per_case_overhead_ms(cases)
    print(f"per-case overhead: {overhead:.0f} ms ({overhead / OVERHEAD_TARGET_MS:.2f}x the "
          f"{OVERHEAD_TARGET_MS:.0f} ms target); a fresh worker interpreter starts in "
          f"{fresh_worker_start_ms():.0f} ms")


if __name__ == "__main__":
    main()
