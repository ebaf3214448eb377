"""No verdict of a probe that needs a window (a copy still in flight, a
step still running, a producer killed part-way through a pull) changes with
the machine's load on the reference's simulated device, where the device
opens each window (a copy held until the next step, or for far longer than
issuing the next call takes; a throttled link): beside two CPU-bound loops,
every such case still earns its prediction. The module runs last
(tests/conftest.py): its loops load the machine for about half a minute."""

import subprocess
import sys

import pytest

from probes.run.runner import run_cases
from probes.suite.matrix import build_cases, load_matrix
from probes.suite.predict import prediction

WINDOWED = ("pull_failures", "unawaited_transfers", "release_order", "inflight_step", "deferred_construction",
            "host_transferred_construction", "concurrent_transfers", "pull_concurrent", "pull_across_donation",
            "pull_fan", "serving_step")
BUSY_SECONDS = 900  # a loop's life at most: the fixture ends it sooner
BUSY = f"import time\nend = time.monotonic() + {BUSY_SECONDS}\nwhile time.monotonic() < end:\n    pass\n"


@pytest.fixture
def busy_loops():
    loops = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
    try:
        yield loops
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def test_windowed_probes_earn_their_predictions_beside_two_busy_loops(busy_loops):
    cases = build_cases(["v5e"], load_matrix("default"), probes=list(WINDOWED), iut="kvref-sim")
    assert {c.probe for c in cases} == set(WINDOWED)
    results = run_cases(cases, jobs=2)
    assert all(loop.poll() is None for loop in busy_loops), "a busy loop ended before the cases did"
    wrong = [(r.case.case_id, str(r.outcome.verdict), r.outcome.detail[:400]) for r in results
             if not prediction(r.case).admits(r.outcome.verdict)]
    assert not wrong, wrong
