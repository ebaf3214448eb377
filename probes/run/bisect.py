"""`kvprobe bisect`: the first published build of a library whose verdict on
one case differs from an older build's, by binary search over the builds
between the two. Each step is an ordinary watched run of the case on that
build, so a crash or a hang is a verdict like any other. It looks for the
first build with the newer build's verdict, assuming that verdict, once
reached, stays; it answers with the two adjacent builds where it found it
(the older of the two may hold a third verdict: that is shown too)."""

from __future__ import annotations

import argparse

import dataclasses
from dataclasses import dataclass
from typing import Callable

from probes.iut import ensure_build, published_builds
from probes.run import options
from probes.run.runner import run_case
from probes.run.subcommand import Command
from probes.suite.cases import Case
from probes.suite.verdicts import Outcome


@dataclass
class Step:
    build: str
    outcome: Outcome


@dataclass
class Bisection:
    steps: list[Step]  # in the order they ran
    before: Step | None = None  # the last build without the new verdict...
    after: Step | None = None  # ...and the first with it; None: both ends agree


def bisect(series: list[str], verdict_of: Callable[[str], Outcome]) -> Bisection:
    """`series` oldest first, from the old build to the new one."""
    if len(series) < 2:
        raise ValueError(f"bisect needs two builds or more, got {series}")
    steps: dict[int, Step] = {}

    def at(i: int) -> Step:
        if i not in steps:
            steps[i] = Step(series[i], verdict_of(series[i]))
        return steps[i]

    lo, hi = 0, len(series) - 1
    new = at(hi).outcome.verdict
    if at(lo).outcome.verdict == new:
        return Bisection(list(steps.values()))
    while hi - lo > 1:  # lo never has the new verdict, hi always has it
        mid = (lo + hi) // 2
        if at(mid).outcome.verdict == new:
            hi = mid
        else:
            lo = mid
    return Bisection(list(steps.values()), at(lo), at(hi))


def between(published: list[str], old: str, new: str) -> list[str]:
    """The published builds from `old` to `new`, both included, in build order."""
    for version in (old, new):
        if version not in published:
            raise ValueError(f"{version} is not a published build; expected one of {', '.join(published)}")
    a, b = published.index(old), published.index(new)
    if a >= b:
        raise ValueError(f"{old} is not older than {new} in build order")
    return published[a:b + 1]


def bisect_case(case: Case, library: str, old: str, new: str, progress=None) -> Bisection:
    """`case` (its IUT a bare name with builds) on the builds from `old` to `new`."""
    series = between(published_builds(library), old, new)

    def verdict_of(version: str) -> Outcome:
        ensure_build(library, version)
        outcome = run_case(dataclasses.replace(case, iut=f"{case.iut}=={version}")).outcome
        if progress:
            progress(version, outcome)
        return outcome

    return bisect(series, verdict_of)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("case", metavar="CASE", help="a case id as in the CSVs: cpu/roundtrip/seed-rank3")
    options.add_one(parser, "iut", "tpu-sync-jax", "an IUT whose library has builds")
    parser.add_argument("--old", required=True, metavar="VERSION", help="the older build")
    parser.add_argument("--new", required=True, metavar="VERSION", help="the newer build")
    options.add_one(parser, "matrix", "cpu", "the matrix the case comes from")
    parser.add_argument("--options", default="defaults",
                        help="how the manager is built, as the iut_options column says it")
    options.add(parser, "timeout")


def run(args) -> int:
    from probes.iut import iut
    from probes.suite.matrix import build_cases, load_matrix
    from probes.suite.registry import PROBES

    declared = iut(args.iut)
    generation = args.case.split("/", 1)[0]
    cases = [c for c in build_cases([generation], load_matrix(args.matrix), tuple(PROBES), args.iut,
                                    timeout=args.timeout)
             if c.case_id == args.case and c.options_text == args.options]
    if not cases:
        raise ValueError(f"no case {args.case!r} built {args.options!r} for {args.iut} in matrix "
                         f"{args.matrix!r}; case ids look like cpu/roundtrip/seed-rank3")
    found = bisect_case(cases[0], declared.library.distribution, args.old, args.new,
                        progress=lambda v, o: print(f"  {v}: {o.verdict}", flush=True))
    if found.after is None:
        print(f"no build from {args.old} to {args.new} changed the verdict "
              f"({found.steps[0].outcome.verdict} at both ends)")
        return 0
    for label, step in (("last without the new verdict", found.before), ("first with it", found.after)):
        print(f"{label}: {step.build}: {step.outcome.verdict}: {step.outcome.detail.strip()[:1500]}")
    return 0


COMMAND = Command("bisect", "the first published build of a library whose verdict on one case differs from an "
                  "older build's", arguments, run)
