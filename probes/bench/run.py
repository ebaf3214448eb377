"""Benchmark: the main job as a user runs it (`kvprobe run --generation all
--out DIR`, reports included) against the 15 s target, with the share of
the runner, of the probes inside it and of the reports; the first run after
install (the project's bytecode not yet compiled, no layout cache, reports
written into a copy of the committed ones, as on a fresh clone) against a
warm one, and a run into a new folder; and
what a case costs beyond its probe (fork, watch, exit) against the 25 ms
target, beside the start-up of a fresh worker interpreter and a fresh
interpreter's import of kvref against the 0.3 s target."""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

import kvref
from probes.report import drawn
from probes.report.results import latest_run, read_run
from probes.run import options
from probes.run.probe_case import run_case_here
from probes.run.runner import run_case
from probes.suite.matrix import DEFAULT_MATRIX, build_cases, load_matrix

TARGET_SECONDS = 15.0
FIRST_RUN_TARGET = 1.2  # the first run after install, against a warm one
OVERHEAD_TARGET_MS = 25.0
REPORTS_TARGET = 2.0  # seconds, also into a new folder
SAMPLES = 15
REPO = Path(__file__).resolve().parents[2]
TIMES = re.compile(r"(\d+) cases in ([\d.]+) s \(runner ([\d.]+) s, reports ([\d.]+) s\)")


def user_run(out: Path, jobs: int, env: dict | None = None) -> dict:
    """`kvprobe run --generation all` into `out`, timed from outside: its wall
    time, the runner's and the reports' as it prints them, and the probes'
    own seconds summed over its cases (the work spread over `jobs` workers)."""
    kvprobe = Path(sys.executable).with_name("kvprobe")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([str(kvprobe), "run", "--generation", "all", "--jobs", str(jobs), "--out", str(out)],
                          capture_output=True, text=True, timeout=1800, env=env)
    wall = time.perf_counter() - start
    used = resource.getrusage(resource.RUSAGE_CHILDREN)  # the run and every process it waited for
    found = TIMES.search(done.stdout)
    if done.returncode or not found:
        raise SystemExit(f"kvprobe run failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    frame = pd.concat([read_run(latest_run(out / gen)) for gen in kvref.GENERATIONS])
    return {"wall": wall, "cases": int(found[1]), "runner": float(found[3]), "reports": float(found[4]),
            "probes": float(frame["seconds"].sum()), "user": used.ru_utime - before.ru_utime,
            "sys": used.ru_stime - before.ru_stime, "faults": used.ru_minflt - before.ru_minflt}


def forget_bytecode() -> None:
    """The project's own compiled modules, which an install does not make."""
    for folder in ("kvref", "probes"):
        for cache in (REPO / folder).rglob("__pycache__"):
            shutil.rmtree(cache, ignore_errors=True)


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


IMPORT_TARGET_MS = 300.0  # a fresh interpreter importing kvref


def fresh_interpreter_ms(code: str) -> float:
    """The median of a fresh interpreter running `code` and exiting."""
    times = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add(parser, "jobs", jobs=os.cpu_count())
    args = parser.parse_args(argv)
    print(f"before: {load()}")
    with tempfile.TemporaryDirectory(prefix="kvprobe-bench-") as tmp:
        out = Path(tmp) / "reports"
        shutil.copytree(REPO / "reports", out, ignore=shutil.ignore_patterns("runs"))
        forget_bytecode()
        # As on a new machine: no layout compiled live before (kvref.oracle.cache), and no
        # picture drawn before (probes.report.drawn) but the clone's committed ones, either.
        fresh = {**os.environ, "KVREF_CACHE_DIR": str(Path(tmp) / "layout-cache"),
                 drawn.PICTURES_VARIABLE: str(Path(tmp) / "pictures")}
        first = user_run(out, args.jobs, fresh)
        warm = user_run(out, args.jobs, fresh)
        elsewhere = user_run(Path(tmp) / "new-folder", args.jobs, fresh)  # every picture written anew
    print(f"main job, as a user runs it: {warm['cases']} cases on {len(kvref.GENERATIONS)} generations with "
          f"{args.jobs} jobs in {warm['wall']:.1f} s ({warm['wall'] / TARGET_SECONDS:.2f}x the "
          f"{TARGET_SECONDS:.0f} s target); {warm['cases'] / warm['wall']:.1f} cases/s")
    print(f"  runner {warm['runner']:.1f} s ({warm['runner'] / warm['wall']:.0%}), of which the probes "
          f"themselves {warm['probes']:.1f} s of worker time over {args.jobs} jobs "
          f"({warm['probes'] / args.jobs / warm['wall']:.0%}); reports {warm['reports']:.1f} s "
          f"({warm['reports'] / warm['wall']:.0%}); interpreter start and case preparation the rest")
    print(f"  CPU over all its processes: user {warm['user']:.1f} s, sys {warm['sys']:.1f} s, "
          f"{warm['faults'] / warm['cases']:,.0f} page faults a case")
    print(f"first run after install: {first['wall']:.1f} s, {first['wall'] / warm['wall']:.2f}x the warm run "
          f"(target {FIRST_RUN_TARGET:.1f}x); its reports {first['reports']:.1f} s")
    print(f"into a new folder: {elsewhere['wall']:.1f} s, its reports {elsewhere['reports']:.1f} s "
          f"(target {REPORTS_TARGET:.0f} s)")
    cases = build_cases(kvref.GENERATIONS, load_matrix(DEFAULT_MATRIX))
    overhead = per_case_overhead_ms(cases)
    print(f"per-case overhead: {overhead:.0f} ms ({overhead / OVERHEAD_TARGET_MS:.2f}x the "
          f"{OVERHEAD_TARGET_MS:.0f} ms target); a fresh worker interpreter starts in "
          f"{fresh_interpreter_ms('import probes.run.probe_case'):.0f} ms")
    bare, kvref_ms = fresh_interpreter_ms("pass"), fresh_interpreter_ms("import kvref")
    print(f"a fresh interpreter imports kvref in {kvref_ms:.0f} ms ({kvref_ms / IMPORT_TARGET_MS:.2f}x the "
          f"{IMPORT_TARGET_MS:.0f} ms target; a bare one starts in {bare:.0f} ms)")
    print(f"after: {load()}")


if __name__ == "__main__":
    main()
