"""Benchmark: the default probe run of every generation on the simulated
device, as the main job runs it (shipped layout table, one worker per core).
Prints wall time and cases per second against the 30 s target."""

from __future__ import annotations

import argparse
import os
import time

import kvref
from probes.suite.matrix import build_cases, load_matrix
from probes.run.runner import run_cases

TARGET_SECONDS = 30.0


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    args = parser.parse_args(argv)
    cases = build_cases(kvref.GENERATIONS, load_matrix("default"))
    start = time.perf_counter()
    found = run_cases(cases, args.jobs)
    seconds = time.perf_counter() - start
    worst = max(found, key=lambda r: r.wall_seconds)
    print(f"{len(cases)} cases on {len(kvref.GENERATIONS)} generations with {args.jobs} jobs: "
          f"{seconds:.1f} s, {len(cases) / seconds:.1f} cases/s "
          f"({seconds / TARGET_SECONDS:.2f}x the {TARGET_SECONDS:.0f} s target)")
    print(f"slowest case: {worst.case.case_id} {worst.wall_seconds:.2f} s")


if __name__ == "__main__":
    main()
