"""The probe suite as a pytest module: each case of the seed matrix runs
through the same watched runner as `kvprobe run`. On a TPU VM,
`pytest -m tpu` runs the hardware cases below; elsewhere they skip."""

import dataclasses

import pytest

from probes.cases import build_cases, load_matrix
from probes.predict import describe
from probes.runner import run_case

SEED_CASES = build_cases(["tpu7x"], load_matrix("seed"))


@pytest.mark.parametrize("case", SEED_CASES, ids=lambda c: c.case_id)
def test_reference_earns_its_prediction(case):
    result = run_case(case)
    assert result.outcome.verdict == describe(case)["predicted"], result.outcome.detail


@pytest.mark.tpu
@pytest.mark.parametrize("case", SEED_CASES, ids=lambda c: c.case_id)
def test_hardware_probes(case):
    """The production library on this TPU's own arrays, held to the reference's
    prediction for the same layout."""
    from probes.iut_tpu_sync import local_tpu_generation

    generation = local_tpu_generation()
    if generation is None:
        pytest.skip("no TPU here: jax.devices('tpu') found none")
    hardware = dataclasses.replace(case, generation=generation, iut="tpu-sync-jax-tpu")
    result = run_case(hardware)
    if result.outcome.verdict == "SKIP":
        pytest.skip(result.outcome.detail)
    assert result.outcome.verdict == describe(hardware)["predicted"], result.outcome.detail
