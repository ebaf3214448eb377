"""One probe case in its own process: `python -m probes.run.worker` reads the
case as JSON on stdin and prints one JSON result line.

faulthandler's watchdog is armed first and never cancelled: it is a C thread,
so it fires even while C++ holds the GIL, dumps every thread's stack to stderr
and exits. The parent reads the exit status too: a result line counts only if
the process then exits cleanly (probes.run.runner.classify)."""

from __future__ import annotations

import faulthandler
import json
import resource
import sys
import time
import traceback

from probes.iut.registry import adapter_for
from probes.suite.cases import Case
from probes.suite.registry import probe
from probes.suite.verdicts import ERROR, SKIP, Outcome

RESULT_PREFIX = "KVPROBE-RESULT "


def run(case: Case) -> Outcome:
    iut = adapter_for(case.iut, case.generation, case.faults, dict(case.iut_options))
    reason = iut.skip_reason()
    if reason:
        return Outcome(SKIP, reason)
    declared = probe(case.probe)
    if declared.address_space_limit:
        limit = declared.address_space_limit
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    start = time.perf_counter()
    try:
        outcome = declared.run(case, iut)
    except Exception as e:  # the IUT failed in a way no probe expected
        outcome = Outcome(ERROR, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}")
    if outcome.seconds is None:
        outcome.seconds = time.perf_counter() - start
    outcome.iut_version, outcome.backend, outcome.device_kind = iut.version, iut.backend, iut.device_kind
    return outcome


def main() -> int:
    case = Case.from_json(sys.stdin.read())
    faulthandler.enable()  # a crash prints where it happened
    # Armed until the process is gone: a hang while arrays and managers are
    # released at exit must still dump the stacks and end the process.
    faulthandler.dump_traceback_later(case.timeout, exit=True)
    outcome = run(case)
    print(RESULT_PREFIX + json.dumps(outcome.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
