"""The probe suite as a pytest module: every probe on the seed matrix runs
through the same watched runner as `kvprobe run`. On a TPU VM, `pytest -m tpu`
runs the hardware cases below, which then fail rather than skip for anything
but a generation an IUT does not support; elsewhere they skip with one reason
(and conftest.py fails a TPU run in which no hardware case ran)."""

import dataclasses

import pytest

from probes.iut.hardware import NO_TPU, local_generation, tpu_visible
from probes.iut.registry import IUTS
from probes.run.runner import run_case
from probes.suite.matrix import build_cases, load_matrix
from probes.suite.predict import describe
from probes.suite.registry import PROBES
from probes.suite.verdicts import agrees

SEED = load_matrix("seed")
SEED_CASES = build_cases(["tpu7x"], SEED, probes=tuple(PROBES))


@pytest.mark.parametrize("case", SEED_CASES, ids=lambda c: c.case_id)
def test_reference_earns_its_prediction(case):
    result = run_case(case)
    if case.probe == "pending_views":  # the simulated device has no views: nothing to exercise
        assert result.outcome.verdict == "SKIP" and "no views" in result.outcome.detail
        return
    assert agrees(result.outcome.verdict, describe(case)["predicted"]), result.outcome.detail


HARDWARE_CASES = [c for name, declared in IUTS.items() if declared.owns_device
                  for c in build_cases(["tpu7x"], SEED, probes=tuple(PROBES), iut=name)]


@pytest.fixture(scope="module")
def tpu_generation():
    """This TPU's generation; a TPU that is here but does not start fails."""
    if not tpu_visible():
        pytest.skip(NO_TPU)
    return local_generation()


@pytest.mark.tpu
@pytest.mark.parametrize("case", HARDWARE_CASES, ids=lambda c: f"{c.iut}[{c.options_text}]/{c.case_id}")
def test_hardware_probes(case, tpu_generation):
    """A production library on this TPU's own arrays or tensors, held to the
    reference's prediction for the same layout."""
    if tpu_generation not in IUTS[case.iut].targets:
        pytest.skip(f"{case.iut} does not run on {tpu_generation}")
    hardware = dataclasses.replace(case, generation=tpu_generation)
    result = run_case(hardware)
    # A TPU is here: a case that cannot run on it is a failure, not a skip.
    assert result.outcome.verdict != "SKIP", f"{tpu_generation} TPU here, but: {result.outcome.detail}"
    assert agrees(result.outcome.verdict, describe(hardware)["predicted"]), result.outcome.detail
