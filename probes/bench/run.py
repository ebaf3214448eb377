"""Benchmark: the default probe run of every generation on the simulated
device, as the main job runs it (shipped layout table, one worker per core).
Prints wall time, cases per second, the core time per case beside the time of
an empty forked worker (the per-case overhead), and the ratio to the 30 s
target."""

from __future__ import annotations

import argparse
import os
import time

import kvref
from probes.bench.timing import best_seconds
from probes.run import forked
from probes.run.runner import run_cases
from probes.suite.matrix import build_cases, load_matrix

TARGET_SECONDS = 30.0


def empty_worker_seconds() -> float:
    """A forked process that does nothing: the floor under each case."""
    def once():
        process = forked.context().Process(target=os.getpid)
        process.start()
        process.join()

    return best_seconds(once, 10)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    args = parser.parse_args(argv)
    cases = build_cases(kvref.GENERATIONS, load_matrix("default"))
    start = time.perf_counter()
    found = run_cases(cases, args.jobs)
    seconds = time.perf_counter() - start
    per_case = seconds * args.jobs / len(found)
    worst = max(found, key=lambda r: r.wall_seconds)
    print(f"{len(cases)} cases on {len(kvref.GENERATIONS)} generations with {args.jobs} jobs: "
          f"{seconds:.1f} s, {len(cases) / seconds:.1f} cases/s "
          f"({seconds / TARGET_SECONDS:.2f}x the {TARGET_SECONDS:.0f} s target)")
    print(f"{per_case * 1000:.0f} ms of a core per case, probe work included; the process around "
          f"it (an empty forked worker) takes {empty_worker_seconds() * 1000:.1f} ms")
    print(f"slowest case: {worst.case.case_id} {worst.wall_seconds:.2f} s")


if __name__ == "__main__":
    main()
