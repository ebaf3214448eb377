"""The probe suite as a pytest module: each case of the seed matrix runs
through the same watched runner as `kvprobe run`. On a TPU VM,
`pytest -m tpu` runs the hardware cases below; elsewhere they skip."""

import dataclasses

import pytest

from probes.iut.hardware import local_generation
from probes.iut.registry import iut as declared_iut
from probes.run.runner import run_case
from probes.suite.matrix import build_cases, load_matrix
from probes.suite.predict import describe
from probes.suite.verdicts import agrees

SEED_CASES = build_cases(["tpu7x"], load_matrix("seed"))


@pytest.mark.parametrize("case", SEED_CASES, ids=lambda c: c.case_id)
def test_reference_earns_its_prediction(case):
    result = run_case(case)
    assert agrees(result.outcome.verdict, describe(case)["predicted"]), result.outcome.detail


HARDWARE_IUTS = ("tpu-sync-jax-tpu", "tpu-sync-torch-tpu")


@pytest.mark.tpu
@pytest.mark.parametrize("iut", HARDWARE_IUTS)
@pytest.mark.parametrize("case", SEED_CASES, ids=lambda c: c.case_id)
def test_hardware_probes(case, iut):
    """A production library on this TPU's own arrays or tensors, held to the
    reference's prediction for the same layout."""
    generation = local_generation()
    if generation is None:
        pytest.skip("no TPU here: jax.devices('tpu') found none")
    if generation not in declared_iut(iut).targets:
        pytest.skip(f"{iut} does not run on {generation}")
    hardware = dataclasses.replace(case, generation=generation, iut=iut)
    result = run_case(hardware)
    # A TPU is here: a case that cannot run on it is a failure, not a skip.
    assert result.outcome.verdict != "SKIP", f"{generation} TPU here, but: {result.outcome.detail}"
    assert agrees(result.outcome.verdict, describe(hardware)["predicted"]), result.outcome.detail
