"""One probe case in its own process: `python -m probes.worker` reads the case
as JSON on stdin and prints one JSON result line.

faulthandler's watchdog is armed first: it is a C thread, so it fires even
while C++ holds the GIL, dumps every thread's stack to stderr and exits."""

from __future__ import annotations

import faulthandler
import json
import resource
import sys
import time
import traceback

RESULT_PREFIX = "KVPROBE-RESULT "
HOST_MEMORY_LIMIT = 16 * 2**30  # address space for probes that may try a huge pool


def run(case) -> "Outcome":
    from probes import definitions, robustness
    from probes.iut import adapter_for
    from probes.verdicts import ERROR, SKIP, Outcome

    iut = adapter_for(case.iut, case.generation, case.faults)
    reason = iut.skip_reason()
    if reason:
        return Outcome(SKIP, reason)
    if case.probe == "host_budget":
        # A manager without a budget check must fail to allocate, not take the machine.
        resource.setrlimit(resource.RLIMIT_AS, (HOST_MEMORY_LIMIT, HOST_MEMORY_LIMIT))
    start = time.perf_counter()
    try:
        probe = {**definitions.PROBE_FUNCTIONS, **robustness.PROBE_FUNCTIONS}[case.probe]
        outcome = probe(case, iut)
    except Exception as e:  # the IUT failed in a way no probe expected
        outcome = Outcome(ERROR, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}")
    if outcome.seconds is None:
        outcome.seconds = time.perf_counter() - start
    outcome.iut_version, outcome.backend, outcome.device_kind = iut.version, iut.backend, iut.device_kind
    return outcome


def main() -> int:
    from probes.cases import Case

    case = Case.from_json(sys.stdin.read())
    faulthandler.enable()  # a crash prints where it happened
    faulthandler.dump_traceback_later(case.timeout, exit=True)
    outcome = run(case)
    faulthandler.cancel_dump_traceback_later()
    print(RESULT_PREFIX + json.dumps(outcome.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
