"""The probe suite as a pytest module: each case of the seed matrix runs
through the same watched runner as `kvprobe run`. On a TPU VM,
`pytest -m tpu` runs the hardware cases below; elsewhere they skip."""

import pytest

from probes.cases import build_cases, load_matrix
from probes.predict import describe
from probes.runner import run_case

SEED_CASES = build_cases(["tpu7x"], load_matrix("seed"))


@pytest.mark.parametrize("case", SEED_CASES, ids=lambda c: c.case_id)
def test_reference_earns_its_prediction(case):
    result = run_case(case)
    assert result.outcome.verdict == describe(case)["predicted"], result.outcome.detail


def tpu_skip_reason() -> str | None:
    try:
        import jax

        if jax.devices("tpu"):
            return None
    except Exception as e:  # no TPU backend: the reason is the error
        return f"no TPU here: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return "no TPU here: jax.devices('tpu') is empty"


@pytest.mark.tpu
@pytest.mark.parametrize("case", SEED_CASES, ids=lambda c: c.case_id)
def test_hardware_probes(case):
    reason = tpu_skip_reason()
    if reason:
        pytest.skip(reason)
    pytest.skip("no hardware implementation under test is installed on this TPU VM "
                "(tpu-sync-jax / tpu-sync-torch adapters run under -m tpu once installed)")
