"""The probe suite as a pytest module: every probe on the seed matrix runs
through the same watched runner as `kvprobe run`. The hardware cases are the
kvprobe plugin's (probes.run.pytest_plugin): `pytest -m tpu` runs them for
every IUT on real hardware (conftest.py), failing rather than skipping on a
machine with a TPU; elsewhere they skip with one reason (and conftest.py
fails a TPU run in which no hardware case ran)."""

import pytest

from probes.run.runner import run_case
from probes.suite.matrix import build_cases, load_matrix
from probes.suite.predict import prediction
from probes.suite.registry import PROBES

SEED = load_matrix("seed")
SEED_CASES = build_cases(["tpu7x"], SEED, probes=tuple(PROBES))


@pytest.mark.parametrize("case", SEED_CASES, ids=lambda c: c.case_id)
def test_reference_earns_its_prediction(case):
    result = run_case(case)
    assert prediction(case).admits(result.outcome.verdict), result.outcome.detail
