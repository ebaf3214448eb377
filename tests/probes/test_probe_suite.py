"""The probe suite as a pytest module: every probe on the seed matrix runs
through the same watched runner as `kvprobe run`. The hardware cases are the
kvprobe plugin's (probes.run.pytest_plugin): `pytest -m tpu` runs them for
every IUT on real hardware (conftest.py), failing rather than skipping on a
machine with a TPU; elsewhere they skip with one reason (and conftest.py
fails a TPU run in which no hardware case ran)."""

import pytest

from probes.suite.matrix import build_cases, load_matrix
from probes.suite.predict import prediction
from probes.suite.registry import PROBES
from tests.batch import BATCH_SECONDS, run_selected

pytestmark = pytest.mark.timeout(BATCH_SECONDS)  # the first test waits for the module's cases

SEED = load_matrix("seed")
SEED_CASES = build_cases(["tpu7x"], SEED, probes=tuple(PROBES))


@pytest.fixture(scope="module")
def ran(request):
    return run_selected(request, {"test_reference_earns_its_prediction": lambda case: [case]})


@pytest.mark.parametrize("case", SEED_CASES, ids=lambda c: c.case_id)
def test_reference_earns_its_prediction(ran, case):
    outcome = ran[case].outcome
    assert prediction(case).admits(outcome.verdict), outcome.detail


def test_one_kind_of_a_probe_is_chosen_as_probe_slash_kind():
    cases = build_cases(["v5e"], [], probes=("release_order/save_in_flight", "release_order/manager_first",
                                             "bad_input"))
    kinds = {(c.probe, c.kind) for c in cases}
    assert {k for p, k in kinds if p == "release_order"} == {"save_in_flight", "manager_first"}
    assert {k for p, k in kinds if p == "bad_input"} == set(PROBES["bad_input"].kinds)
    every = build_cases(["v5e"], [], probes=("release_order/save_in_flight", "release_order"))
    assert {c.kind for c in every} == set(PROBES["release_order"].kinds)
