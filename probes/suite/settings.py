"""Settings a serving engine passes to the manager unchecked (the offload
connector reads them from the environment): each given a value that means
nothing, at construction."""

from __future__ import annotations

import math

from probes.iut.adapter import Adapter
from probes.suite.cases import Case
from probes.suite.refusals import first_line
from probes.suite.roundtrip import permuted_round_trip
from probes.suite.thread_room import room_for_threads
from probes.suite.verdicts import ERROR, PASS, REJECTED, Outcome

# kind -> (setting, value, whether a manager may clamp it and go on)
SETTINGS = {
    "parallelism_zero": ("parallelism", 0, False),
    "parallelism_negative": ("parallelism", -4, False),
    "parallelism_huge": ("parallelism", 10**5, True),
    "timeout_zero": ("timeout_s", 0.0, False),
    "timeout_negative": ("timeout_s", -1.0, False),
    "timeout_nan": ("timeout_s", math.nan, False),
}
SETTING_KINDS = tuple(SETTINGS)


def settings(case: Case, iut: Adapter) -> Outcome:
    """One setting given a value that means nothing (case.kind): a clean
    refusal naming it is REJECTED. Where a clamp makes sense (a huge
    parallelism) the manager may take it instead, and then its blocks must
    still round-trip byte-exact (PASS); any other value taken is ERROR."""
    name, value, may_clamp = SETTINGS[case.kind]
    pairs = iut.make_caches(case.shape, [case.seed, case.seed + 1])
    caches = [c for c, _ in pairs]
    with room_for_threads():  # a thread per unit of a huge parallelism must not take the machine's ids
        try:
            manager = iut.manager(caches, case.shape.dims[0], **{name: value})
        except Exception as e:  # judged below
            if not iut.refuses(e):
                raise
            return Outcome(REJECTED, first_line(e))
        if not may_clamp:
            return Outcome(ERROR, f"{name}={value!r} was accepted silently")
        outcome = permuted_round_trip(iut, manager, caches, [h for _, h in pairs], case.seed)
    if outcome.verdict == PASS:
        outcome.detail = f"{name}={value!r} taken (clamped); {outcome.detail}"
    return outcome
