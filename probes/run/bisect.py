"""`kvprobe bisect`: the first published build of a library whose verdict on
one case differs from an older build's, by binary search over the builds
between the two. Each step is an ordinary watched run of the case on that
build, so a crash or a hang is a verdict like any other. It looks for the
first build with the newer build's verdict, assuming that verdict, once
reached, stays; it answers with the two adjacent builds where it found it
(the older of the two may hold a third verdict: that is shown too)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from probes.iut import builds
from probes.run.runner import run_case
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
    series = between(builds.published(library), old, new)

    def verdict_of(version: str) -> Outcome:
        builds.ensure(library, version)
        outcome = run_case(dataclasses.replace(case, iut=f"{case.iut}=={version}")).outcome
        if progress:
            progress(version, outcome)
        return outcome

    return bisect(series, verdict_of)
