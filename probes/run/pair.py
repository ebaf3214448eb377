"""The two workers of one two-process case, started side by side from this
process (`python -m probes.run.pair`, the two role cases as a JSON list on
stdin), each a watched worker (probes.run.worker) in a process group of its
own. Run in a loopback-only network namespace (probes.run.netns), both
workers share it, so the managers reach each other on its lo and nothing
else. Prints one line: PAIR_PREFIX and, per worker, [returncode, stdout,
stderr, killed]."""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from probes.run.forked import run_watched

PAIR_PREFIX = "KVPROBE-PAIR "
WORKER = "probes.run.worker"


def run_pair(cases: list[str], limit: float) -> list[list]:
    """Both workers at once, each killed (with its group) if still running
    after `limit` seconds."""
    deadline = time.monotonic() + limit
    with ThreadPoolExecutor(len(cases)) as pool:
        return list(pool.map(lambda case: list(run_watched([sys.executable, "-m", WORKER], case,
                                                         max(0.0, deadline - time.monotonic()))), cases))


def main() -> int:
    request = json.loads(sys.stdin.read())
    print(PAIR_PREFIX + json.dumps(run_pair(request["cases"], request["limit"])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
