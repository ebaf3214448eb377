"""One probe case in its own process: `python -m probes.run.worker` reads its
verdict channel's token (a line) and the case (JSON) on stdin, and says its
result over the channel (probes.run.channel), never on stdout. A child
forked from a warm zygote (probes.run.zygote) runs the same `run`.

faulthandler's watchdog is armed first and never cancelled: it is a C thread,
so it fires even while C++ holds the GIL, dumps every thread's stack to stderr
and exits. It has two limits: the IUT's start-up (imports, the device
runtime coming up, the adapter's own checks) gets `case.startup_timeout`;
then the channel says the probe started (and PHASE_PROBE goes to stderr, for
whoever reads the stacks), and the probe, and everything up to the
process's exit, gets `case.timeout`. Before the probe runs, the channel says
what it runs on (the IUT's version, backend and device kind), which a crash
or a hang then keeps. The parent reads the exit status too: a result counts
only if the process then exits cleanly (probes.run.runner.classify)."""

from __future__ import annotations

import faulthandler
import functools
import json
import sys

from probes.run.channel import DESCRIBED, PHASE, RESULT, Channel

PHASE_PROBE = "KVPROBE-PHASE probe"


def main() -> int:
    token, _, text = sys.stdin.read().partition("\n")
    return run(text, Channel.inherited(token))


def run(text: str, channel: Channel) -> int:
    """The case `text` (JSON), watched from here to the process's exit."""
    faulthandler.enable()  # a crash prints where it happened
    faulthandler.dump_traceback_later(json.loads(text)["startup_timeout"], exit=True)  # Case.to_json has it
    from probes.run.probe_case import run_case_here  # imported under the start-up watchdog

    outcome = run_case_here(text, on_probe_start=functools.partial(_probe_phase, channel))
    channel.say(RESULT, outcome.to_dict())
    channel.close()
    return 0


def _probe_phase(channel: Channel, timeout: float, described: dict | None = None) -> None:
    """Start-up is over: the probe's own limit runs from here to the exit.
    What it runs on (`described`: the IUT's version, backend and device kind)
    goes out first, for the runner to keep if the probe crashes or hangs."""
    if described:
        channel.say(DESCRIBED, described)
    channel.say(PHASE)
    print(PHASE_PROBE, file=sys.stderr, flush=True)
    faulthandler.dump_traceback_later(timeout, exit=True)


if __name__ == "__main__":
    sys.exit(main())
