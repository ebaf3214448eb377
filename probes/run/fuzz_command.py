"""`kvprobe fuzz --iut NAME`: random call sequences against an implementation
under test, each in a watched worker.

By default (`--model contract`) the sequences are the contract's
(probes.suite.contract_sequences): every offload call, model steps, stalls
and failing copies, held to one model. `--model blocks` runs the older
d2h/h2d sequences against the block model. Either way each kind of failure
is written as a finding (probes.run.findings:
`<out>/<generation>/findings/<model>-<iut>-<verdict>-<n>.json`, its case
shrunk, one per case across the ways the manager is built): a contract
sequence is shrunk in the worker, and a crash or a hang, which ends the
worker, here by replays in workers; `--replay FILE` runs a contract
finding's sequence on any IUT, and `--reproducer FILE` renders a blocks
or contract finding as a standalone script (probes.run.reproducers)."""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

import kvref
from probes.fuzz.sequences import addressable_shapes, random_sequence
from probes.iut import iut
from probes.run import options, reproducers
from probes.run.campaign import Campaign, known_in, run_lanes
from probes.run.finding_schema import check_sequence
from probes.run.findings import read_finding, read_json, write_finding
from probes.run.runner import CaseResult, run_case, run_cases
from probes.run.subcommand import Command
from probes.suite.cases import Case
from probes.suite.contract_known import Known
from probes.suite.registry import probe
from probes.suite.verdicts import CRASH, HANG, PASS

MAX_SHRINK_RUNS = 40
DEFAULT_IUT = "kvref-sim"  # what a campaign draws against unless --iut names another


@dataclass
class Finding:
    result: CaseResult  # the shrunk case and what it earned
    found_in: str  # the sequence it was first seen in
    path: Path | None = None  # where it is kept, as data


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
        outcome = finding.result.outcome
        finding.path = write_finding(finding.result.case, outcome.verdict, outcome.detail, outcome.iut_version,
                                     finding.found_in, directory)
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


def summary(results: list[CaseResult], findings: list[Finding]) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.outcome.verdict] = counts.get(r.outcome.verdict, 0) + 1
    lines = [f"{len(results)} sequences: " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items()))]
    for f in findings:
        o = f.result.outcome
        lines.append(f"  {o.verdict} [{f.result.case.options_text}] in {len(f.result.case.calls['calls'])} "
                     f"call(s): {o.detail.strip().splitlines()[0][:200]}\n    -> {f.path}")
    return "\n".join(lines)


CONTRACT = "contract_sequences"
MAX_SEQUENCES = 10**6  # a fuzz worker draws sequences until its time is up


def fuzz_contract(name: str, generation: str, cases: int, seed: int = 0, faults: kvref.Faults = kvref.Faults(),
                  seconds: float = 60.0, jobs: int | None = None, out: Path = Path("reports"),
                  long: int = 0, known: Known | None = None) -> Campaign:
    """`cases` lanes per way the manager is built, each drawing contract
    sequences for `seconds` (with `long`, one long run of that many steps) in
    workers, one after another where a crash or a hang ends one; every
    failure written once as a JSON finding, and steered away from after."""
    declared = iut(name)
    declared.check_target(generation)
    declared.check_faults(faults)
    known = known or Known()
    campaign = Campaign(Path(out) / generation / "findings", known, known_before=len(known.keys))
    lanes = [(options, i) for options in declared.library.OPTION_SETS for i in range(cases)]

    def make_case(lane, round_: int, left: float, known_now: dict) -> Case:
        options, i = lane
        calls = {"long": long} if long else {"sequences": MAX_SEQUENCES}
        return contract_case(name, generation, faults, left, seed * 1000 + round_ * 100 + i, options,
                             {**calls, "known": known_now})

    run_lanes(campaign, lanes, make_case, seconds, jobs or os.cpu_count() or 1,
              stop_early=lambda result: result.outcome.verdict in (CRASH, HANG))
    return campaign


def contract_case(name: str, generation: str, faults: kvref.Faults, seconds: float, seed: int,
                  options: dict | None = None, calls: dict | None = None) -> Case:
    """A contract_sequences case whose sequences run `seconds` (0.4 of its timeout)."""
    return Case(CONTRACT, generation, name, f"contract-{seed}", probe(CONTRACT).subject, faults, 2.5 * seconds,
                iut(name).startup_seconds, seed=seed, iut_options=tuple(sorted((options or {}).items())),
                calls=calls or {"sequences": MAX_SEQUENCES})


def replay(path: Path, name: str | None, generation: str | None, faults: kvref.Faults,
           seconds: float) -> CaseResult:
    """One finding's (or a bare sequence's) sequence, replayed on `name`
    (default: the IUT it was found on) in a worker."""
    data = read_json(Path(path), "sequence")
    found = data if isinstance(data, dict) and data.get("model") == "contract" else None
    if found is not None:
        found = read_finding(path, "contract")
    sequence = found["case"]["calls"] if found else data
    if not isinstance(sequence, dict) or not {"spec", "seed", "steps"} <= set(sequence):
        raise ValueError(f"--replay {path}: expected a finding or a sequence with spec, seed and steps")
    check_sequence(sequence, f"--replay {path}")
    name = name or (found["iut"] if found else DEFAULT_IUT)
    ran_on = found["case"]["generation"] if found and found["iut"] == name else None  # another IUT: its own first
    generation = generation or ran_on or iut(name).targets[0]
    iut(name).check_target(generation)
    return run_case(contract_case(name, generation, faults, seconds, 0, calls=sequence))


def arguments(parser: argparse.ArgumentParser) -> None:
    options.add_one(parser, "iut", None, "an IUT, as for `kvprobe run` (default: kvref-sim; with --replay, the "
                                         "finding's)")
    options.add_one(parser, "generation", None, "its target (default: the IUT's first, e.g. cpu for tpu-sync-jax)")
    parser.add_argument("--model", choices=("contract", "blocks"), default="contract",
                        help="contract: sequences of every offload call held to the contract's model (default); "
                             "blocks: d2h/h2d sequences held to the block model, findings kept as JSON (--reproducer renders one)")
    parser.add_argument("--sequences", type=options.positive, default=None,
                        help="workers (contract; default 2) or sequences (blocks; default 40) per way the manager "
                             "is built")
    parser.add_argument("--seconds", type=options.seconds, default=60.0,
                        help="contract: seconds each worker draws sequences for (--jobs workers at a time: a "
                             "campaign of W workers lasts about SECONDS x W / jobs, and its shrinking)")
    parser.add_argument("--long", type=options.positive, default=0, metavar="STEPS",
                        help="contract: one long run of STEPS save/load/unlock/store/rebuild steps per worker, then "
                             "every resource (free chunks, address space, descriptors, threads, shared memory) "
                             "back to its baseline")
    parser.add_argument("--replay", type=Path, default=None,
                        help="contract: replay the sequence of a finding (or a bare sequence) from this JSON file")
    parser.add_argument("--reproducer", type=Path, default=None, metavar="FINDING",
                        help="print the standalone reproducer script of this finding (JSON)")
    parser.add_argument("--option-set", type=int, default=0, metavar="N",
                        help="with --reproducer, the finding's Nth way of building the manager (from 0)")
    parser.add_argument("--known", type=Path, default=None, metavar="DIR",
                        help="contract: the findings in this folder are known: never shrunk or written again, and "
                             "their patterns not drawn, so the campaign explores past them")
    parser.add_argument("--seed", type=int, default=0)
    options.add_one(parser, "timeout", 60.0, "blocks: seconds per sequence")
    options.add(parser, "faults", "jobs", "out")


def run(args) -> int:
    """1 when any sequence found a failure (its finding is written), else 0."""
    faults = kvref.Faults.parse(args.faults, environ={})
    if args.reproducer is not None:
        print(reproducers.render(args.reproducer, args.option_set), end="")
        return 0
    if args.replay is not None:
        result = replay(args.replay, args.iut, args.generation, faults, args.seconds)
        print(f"{result.outcome.verdict} [{result.case.iut} {result.case.generation}] {result.outcome.detail.strip()}")
        return 0 if result.outcome.verdict == PASS else 1
    args.iut = args.iut or DEFAULT_IUT
    if args.model == "contract":
        generation = args.generation or iut(args.iut).targets[0]
        known = known_in(args.known) if args.known is not None else None
        campaign = fuzz_contract(args.iut, generation, args.sequences or 2, args.seed, faults,
                                 args.seconds, args.jobs, args.out, args.long, known)
        print(campaign.summary())
        return 1 if campaign.written else 0
    args.sequences = args.sequences or 40
    generation = args.generation or iut(args.iut).targets[0]
    results, findings = fuzz_iut(args.iut, generation, args.sequences, args.seed,
                                 kvref.Faults.parse(args.faults, environ={}), args.timeout, args.jobs, args.out)
    print(summary(results, findings))
    return 1 if findings else 0


COMMAND = Command("fuzz", "random call sequences against an IUT; shrunk reproducers of every kind of failure "
                  "under <out>/<generation>/findings/", arguments, run)
