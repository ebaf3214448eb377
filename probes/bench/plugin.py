"""Benchmark: the pytest plugin against `kvprobe run` on the same cases
(kvref-sim, one TPU generation, a few probes), each from a folder of its
own as a team's CI starts them, paired run for run; the ratio of their
median wall times is the plugin's cost (the target: the plugin runs the
cases as the CLI does, so no more than 1.5 times the CLI's time)."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvref.generations import DEFAULT_GENERATION

TARGET_RATIO = 1.5
CASES = ["--generation", DEFAULT_GENERATION, "--probe", "roundtrip,serving_step,bad_input"]


def timed(command: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise SystemExit(f"{command[:4]} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args(argv)
    cli, plugin = [], []
    with tempfile.TemporaryDirectory(prefix="kvprobe-bench-plugin-") as work:
        work = Path(work)
        for n in range(args.samples):
            cli.append(timed([sys.executable, "-m", "probes.run.cli", "run", "--iut", "kvref-sim", *CASES,
                              "--out", str(work / f"cli-{n}")], work))
            plugin.append(timed([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--kvprobe-iut",
                                 "kvref-sim", *[f"--kvprobe-{a[2:]}" if a.startswith("--") else a for a in CASES]],
                                work))
    ratio = statistics.median(plugin) / statistics.median(cli)
    print(f"kvprobe run  median {statistics.median(cli):.2f} s  {[round(t, 2) for t in cli]}")
    print(f"pytest plugin median {statistics.median(plugin):.2f} s  {[round(t, 2) for t in plugin]}")
    print(f"plugin / CLI: {ratio:.2f} (target <= {TARGET_RATIO})")
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
