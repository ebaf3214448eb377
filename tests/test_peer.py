"""The production library, probed in the peer environment (pytest -m peer).
These pass when the harness works, whatever verdicts tpu-sync-jax earns."""

import pytest

from probes import peer_env
from probes.cases import PROBES, ROBUSTNESS_PROBES, build_cases, load_matrix
from probes.predict import describe
from probes.runner import run_cases
from probes.verdicts import VERDICTS

pytestmark = pytest.mark.peer


@pytest.fixture(scope="module")
def peer_python():
    python = peer_env.peer_python()
    if python is None:
        pytest.skip(f"no peer environment at {peer_env.PEER_VENV}; run `kvprobe peer-env`")
    return python


def test_peer_environment_holds_the_pinned_library(peer_python):
    found = peer_env.verify(peer_python)
    assert found[peer_env.PEER_DIST] == peer_env.PEER_VERSION
    assert tuple(int(x) for x in found["python"].split(".")[:2]) >= (3, 12)
    assert tuple(int(x) for x in found["jax"].split(".")[:2]) >= (0, 11)


def test_forbidden_names_are_refused():
    with pytest.raises(peer_env.PeerEnvError, match="unrelated package"):
        peer_env.check_dists({"tpu-raiden-jax": "1.0", peer_env.PEER_DIST: peer_env.PEER_VERSION}, (3, 12))
    with pytest.raises(peer_env.PeerEnvError, match="expected 0.0.1rc"):
        peer_env.check_dists({peer_env.PEER_DIST: "0.0.0"}, (3, 12))
    with pytest.raises(peer_env.PeerEnvError, match="needs 3.12"):
        peer_env.check_dists({peer_env.PEER_DIST: peer_env.PEER_VERSION}, (3, 11))


@pytest.fixture(scope="module")
def side_by_side(peer_python):
    cases = [c for iut in ("kvref-jax", "tpu-sync-jax")
             for c in build_cases(["cpu"], load_matrix("cpu"), PROBES, iut)]
    return run_cases(cases, jobs=2)


def test_every_case_gets_one_verdict(side_by_side):
    assert len(side_by_side) == 2 * len(build_cases(["cpu"], load_matrix("cpu"), PROBES))
    for r in side_by_side:
        assert r.outcome.verdict in VERDICTS
        if r.outcome.verdict in ("HANG", "CRASH", "ERROR", "SKIP"):
            assert r.outcome.detail.strip(), r.case.case_id  # a finding keeps its evidence


def test_production_runs_in_its_own_interpreter(side_by_side):
    production = [r for r in side_by_side if r.case.iut == "tpu-sync-jax" and r.outcome.iut_version]
    assert production and all(r.outcome.iut_version == peer_env.PEER_VERSION for r in production)


def test_reference_earns_its_predictions_beside_it(side_by_side):
    for r in side_by_side:
        if r.case.iut == "kvref-jax":
            assert r.outcome.verdict == describe(r.case)["predicted"], (r.case.case_id, r.outcome.detail)


def test_robustness_probes_reach_the_production_library(side_by_side):
    seen = {r.case.probe for r in side_by_side if r.case.iut == "tpu-sync-jax"
            and r.outcome.verdict != "SKIP"}
    assert set(ROBUSTNESS_PROBES) <= seen
