"""`kvprobe fuzz --iut NAME`: random call sequences against an implementation
under test, each in a watched worker. Every kind of failure (crash, hang,
corruption, a silent acceptance of bad input, a refusal of good input) is
shrunk to a short sequence and written as a standalone reproducer under
reports/<generation>/findings/."""

from __future__ import annotations

import argparse

import re
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

import kvref
from probes.fuzz.sequences import addressable_shapes, random_sequence
from probes.iut.registry import iut
from probes.run import options, reproducers
from probes.run.runner import CaseResult, run_case, run_cases
from probes.run.subcommand import Command
from probes.suite.cases import Case
from probes.suite.verdicts import PASS

MAX_SHRINK_RUNS = 40


@dataclass
class Finding:
    result: CaseResult  # the shrunk case and what it earned
    found_in: str  # the sequence it was first seen in
    script: Path | None = None


def fuzz_iut(name: str, generation: str, sequences: int, seed: int = 0,
             faults: kvref.Faults = kvref.Faults(), timeout: float = 60.0, jobs: int | None = None,
             out: Path = Path("reports")) -> tuple[list[CaseResult], list[Finding]]:
    declared = iut(name)
    declared.check_target(generation)
    declared.check_faults(faults)
    shapes = addressable_shapes(name, generation)
    if not shapes:
        raise ValueError(f"no sequence shape has contiguous rows on {name} {generation}")
    cases = []
    for options in declared.library.OPTION_SETS:
        for i in range(sequences):
            spec = random_sequence(np.random.default_rng([seed, i]), shapes)
            cases.append(Case("call_sequence", generation, name, f"fuzz-{seed}-{i}",
                              kvref.ShapeKey.parse(spec["shape"]), faults, timeout,
                              declared.startup_seconds, seed=i, iut_options=tuple(sorted(options.items())),
                              calls=spec))
    results = run_cases(cases, jobs)
    findings = {}
    for result in results:
        if result.outcome.verdict == PASS:
            continue
        key = failure_kind(result)
        if key not in findings:
            findings[key] = Finding(shrink(result), result.case.case_id)
    directory = Path(out) / generation / "findings"
    for finding in findings.values():
        finding.script = write_reproducer(finding, directory)
    return results, list(findings.values())


def failure_kind(result: CaseResult) -> tuple:
    """Failures of one kind share the verdict, the build and the reason, with
    the numbers and block lists taken out."""
    lines = result.outcome.detail.strip().splitlines()
    reason = lines[0].split("}: ", 1)[-1] if lines else ""
    reason = re.sub(r"\[[^\]]*\]|\(.*?\)|-?\d+|True|False|'[^']*'", "N", reason)[:48]
    return result.outcome.verdict, result.case.options_text, reason


def shrink(result: CaseResult) -> CaseResult:
    """A shorter sequence failing the same way: drop runs of calls (halves,
    then quarters, down to single calls), then one layer, while the kind of
    failure holds."""
    kind, best, runs = failure_kind(result), result, 0

    def attempt(calls_spec: dict) -> CaseResult | None:
        nonlocal runs
        if runs >= MAX_SHRINK_RUNS:
            return None
        runs += 1
        tried = run_case(replace(best.case, calls=calls_spec))
        return tried if failure_kind(tried) == kind else None

    chunk = max(1, len(best.case.calls["calls"]) // 2)
    while chunk >= 1 and runs < MAX_SHRINK_RUNS:
        calls, start, progressed = best.case.calls["calls"], 0, False
        while start < len(calls):
            trial = attempt({**best.case.calls, "calls": calls[:start] + calls[start + chunk:]})
            if trial is not None:
                best, calls, progressed = trial, trial.case.calls["calls"], True
            else:
                start += chunk
        if not progressed:
            chunk //= 2
    if best.case.calls["layers"] > 1:
        best = attempt({**best.case.calls, "layers": 1}) or best
    return best


def write_reproducer(finding: Finding, directory: Path) -> Path:
    """The finding's standalone reproducer, under `directory` (probes.run.reproducers)."""
    return reproducers.write_reproducer(finding.result.case, finding.result.outcome, finding.found_in, directory)


def reproduces(script: Path, python: str | None = None) -> tuple[int, str]:
    """Run a reproducer alone: (exit status, what it printed)."""
    done = subprocess.run([python or sys.executable, str(script)], capture_output=True, text=True,
                          timeout=600)
    return done.returncode, done.stdout + done.stderr


def summary(results: list[CaseResult], findings: list[Finding]) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.outcome.verdict] = counts.get(r.outcome.verdict, 0) + 1
    lines = [f"{len(results)} sequences: " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items()))]
    for f in findings:
        o = f.result.outcome
        lines.append(f"  {o.verdict} [{f.result.case.options_text}] in {len(f.result.case.calls['calls'])} "
                     f"call(s): {o.detail.strip().splitlines()[0][:200]}\n    -> {f.script}")
    return "\n".join(lines)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--iut", default="kvref-sim", help="an IUT, as for `kvprobe run`")
    parser.add_argument("--generation", "-g", default=None,
                        help="its target (default: the IUT's first, e.g. cpu for tpu-sync-jax)")
    parser.add_argument("--sequences", type=options.positive, default=40,
                        help="sequences per way the manager is built")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=options.positive_number(float), default=60.0, help="seconds per sequence")
    options.add(parser, "faults", "jobs", "out")


def run(args) -> int:
    """1 when any sequence found a failure (its reproducer is written), else 0."""
    generation = args.generation or iut(args.iut).targets[0]
    results, findings = fuzz_iut(args.iut, generation, args.sequences, args.seed,
                                 kvref.Faults.parse(args.faults, environ={}), args.timeout, args.jobs, args.out)
    print(summary(results, findings))
    return 1 if findings else 0


COMMAND = Command("fuzz", "random call sequences against an IUT; shrunk reproducers of every kind of failure "
                  "under <out>/<generation>/findings/", arguments, run)
