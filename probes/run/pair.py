"""The two workers of one two-process case, started side by side from this
process (`python -m probes.run.pair`, the two role cases as a JSON list on
stdin), each a watched worker (probes.run.worker) in a process group of its
own. Run in a loopback-only network namespace (probes.run.netns), both
workers share it, so the managers reach each other on its lo and nothing
else. Prints one line: PAIR_PREFIX and, per worker, its Ran (returncode,
stdout, stderr, killed, and what its verdict channel carried) as JSON."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from probes.run.channel import Heard
from probes.run.forked import Ran, run_watched
from probes.suite.rendezvous import DONE, Rendezvous

PAIR_PREFIX = "KVPROBE-PAIR "
WORKER = "probes.run.worker"


def run_pair(cases: list[str], limit: float, envs: list[dict] | None = None) -> list[dict]:
    """Both workers at once, each with its environment (`envs`, one per
    case; None: this process's), each killed (with its group) if still
    running after `limit` seconds; each one's Ran as a dict."""
    deadline = time.monotonic() + limit

    def side(case: str, env: dict | None) -> dict:
        with side_ending(case):
            return dataclasses.asdict(run_watched([sys.executable, "-m", WORKER], case,
                                                  max(0.0, deadline - time.monotonic()), env))
    with ThreadPoolExecutor(len(cases)) as pool:
        return list(pool.map(side, cases, envs or [None] * len(cases)))


@contextlib.contextmanager
def side_ending(case: str):
    """Around one side's worker: once it has exited, however it ended (a
    crash, a runtime that would not start, a kill), the side is posted done,
    so the other stops waiting for it at once rather than at its limit."""
    try:
        yield
    finally:
        side = json.loads(case)
        Rendezvous(side["rendezvous"], side["role"]).post(DONE)


def ran_of(fields: dict) -> Ran:
    """A worker's Ran, from what run_pair printed."""
    return Ran(**{**fields, "heard": Heard(**fields["heard"])})


def main() -> int:
    _, _, text = sys.stdin.read().partition("\n")  # after its own channel's token: it says nothing there
    request = json.loads(text)
    print(PAIR_PREFIX + json.dumps(run_pair(request["cases"], request["limit"], request.get("envs"))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
