"""One probe case in its own process: `python -m probes.run.worker` reads the
case as JSON on stdin and prints one JSON result line. A child forked from a
warm zygote (probes.run.zygote) runs the same `run`.

faulthandler's watchdog is armed first and never cancelled: it is a C thread,
so it fires even while C++ holds the GIL, dumps every thread's stack to stderr
and exits. It has two limits: the IUT's start-up (imports, the device
runtime coming up, the adapter's own checks) gets `case.startup_timeout`;
then the line PHASE_PROBE goes to stderr and the probe, and everything up to
the process's exit, gets `case.timeout`. Before the probe runs, a line says
what it runs on (the IUT's version, backend and device kind), which a crash or
a hang then keeps. The parent reads the exit status too: a result line counts
only if the process then exits cleanly (probes.run.runner.classify)."""

from __future__ import annotations

import faulthandler
import json
import sys

RESULT_PREFIX = "KVPROBE-RESULT "
PHASE_PROBE = "KVPROBE-PHASE probe"
DESCRIBED_PREFIX = "KVPROBE-IUT "  # what the probe runs on, printed before it runs


def main() -> int:
    return run(sys.stdin.read())


def run(text: str) -> int:
    """The case `text` (JSON), watched from here to the process's exit."""
    faulthandler.enable()  # a crash prints where it happened
    faulthandler.dump_traceback_later(json.loads(text)["startup_timeout"], exit=True)  # Case.to_json has it
    from probes.run.probe_case import run_case_here  # imported under the start-up watchdog

    outcome = run_case_here(text, on_probe_start=_probe_phase)
    print(RESULT_PREFIX + json.dumps(outcome.to_dict()), flush=True)
    return 0


def _probe_phase(timeout: float, described: dict | None = None) -> None:
    """Start-up is over: the probe's own limit runs from here to the exit.
    What it runs on (`described`: the IUT's version, backend and device kind)
    goes out first, for the runner to keep if the probe crashes or hangs."""
    if described:
        print(DESCRIBED_PREFIX + json.dumps(described), flush=True)
    print(PHASE_PROBE, file=sys.stderr, flush=True)
    faulthandler.dump_traceback_later(timeout, exit=True)


if __name__ == "__main__":
    sys.exit(main())
