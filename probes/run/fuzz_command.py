"""`kvprobe fuzz --iut NAME`: random call sequences against an implementation
under test, each in a watched worker. Every kind of failure (crash, hang,
corruption, a silent acceptance of bad input, a refusal of good input) is
shrunk to a short sequence and written as a standalone reproducer under
reports/<generation>/findings/."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

import kvref
from probes.fuzz.sequences import addressable_shapes, random_sequence
from probes.iut.peer_env import REPO, declared_env
from probes.iut.registry import iut
from probes.report.paths import file_safe
from probes.run.runner import CaseResult, run_case, run_cases
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


REPRODUCER = '''"""{title}

Found by `kvprobe fuzz --iut {iut}` (in {found_in}) and shrunk to {calls} call(s):
{detail}

Run: {python} {path}
It replays the sequence through the harness's own adapter, prints the verdict
and exits non-zero (or crashes, or hangs until its watchdog), as it did then."""

import faulthandler
import os
import sys
{namespace}
os.environ.setdefault("JAX_PLATFORMS", {platforms!r})
faulthandler.dump_traceback_later({timeout}, exit=True)

from probes.run.probe_case import run_case_here  # noqa: E402

CASE = {case!r}

outcome = run_case_here(CASE)
print(outcome.verdict, outcome.detail)
sys.exit(0 if outcome.verdict == "PASS" else 1)
'''

# Put first in the reproducer of a loopback_only IUT (probes.run.netns): with
# none, the reproducer is the same text as for every other IUT.
NAMESPACE = '''
# The library listens on every interface and connects to the host's own
# address: this runs in a network namespace of its own with only lo (it
# re-executes itself under `unshare -rn` and brings lo up) before importing it.
from probes.run import netns  # noqa: E402

NO_NAMESPACE = netns.enter()
if NO_NAMESPACE:
    print("SKIP", NO_NAMESPACE)
    sys.exit(netns.SKIP_EXIT)
'''


def _reproducer_python(interpreter) -> str:
    """The IUT's interpreter as the reproducer names it: relative to the repository where it lies in it."""
    if interpreter == "main":
        return ".venv/bin/python"
    env = declared_env(interpreter)
    python = Path(interpreter) if env is None else env.venv / "bin" / "python"
    return str(python.relative_to(REPO)) if python.is_relative_to(REPO) else str(python)


def write_reproducer(finding: Finding, directory: Path) -> Path:
    case, outcome = finding.result.case, finding.result.outcome
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"fuzz-{file_safe(case.iut)}-{outcome.verdict.lower()}"
    index = len(list(directory.glob(f"{stem}-*.py")))
    path = directory / f"{stem}-{index + 1}.py"
    declared = iut(case.iut)
    python = _reproducer_python(declared.interpreter)
    first = outcome.detail.strip().splitlines()[0] if outcome.detail.strip() else outcome.verdict
    title = f"{case.iut} {outcome.iut_version} ({case.options_text}): {outcome.verdict}: {first}"[:300]
    path.write_text(REPRODUCER.format(
        title=title.replace('"""', "'''"), iut=case.iut, found_in=finding.found_in,
        calls=len(case.calls["calls"]), detail=outcome.detail.strip()[:1500].replace('"""', "'''"),
        python=python, path=path, platforms=declared.jax_platforms or "",
        namespace=NAMESPACE if declared.loopback_only else "",
        timeout=case.startup_timeout + case.timeout, case=case.to_json()))
    return path


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

