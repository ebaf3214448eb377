"""The production library, probed in the peer environment (pytest -m peer).
These pass when the harness works, whatever verdicts tpu-sync-jax earns."""

import pytest

from probes.iut import peer_env
from probes.run.runner import run_cases
from probes.suite.matrix import build_cases, load_matrix
from probes.suite.predict import prediction
from probes.suite.registry import PROBES, Scope
from tests.peer_python import peer_python_or_skip

ROBUSTNESS_PROBES = {name for name, p in PROBES.items() if p.scope == Scope.ROBUSTNESS}

pytestmark = pytest.mark.peer


JAX_ENV = peer_env.PEER_ENVS["jax"]


@pytest.fixture(scope="module")
def peer_python():
    return peer_python_or_skip(JAX_ENV)


def test_peer_environment_holds_the_pinned_library(peer_python):
    found = peer_env.verify(JAX_ENV, peer_python)
    assert found[JAX_ENV.library] == JAX_ENV.version
    assert tuple(int(x) for x in found["python"].split(".")[:2]) >= (3, 12)
    assert tuple(int(x) for x in found["jax"].split(".")[:2]) >= (0, 11)


def test_forbidden_names_are_refused():
    pinned = dict(JAX_ENV.pins)
    with pytest.raises(peer_env.PeerEnvError, match="unrelated package"):
        peer_env.check_dists(JAX_ENV, {"tpu-raiden-jax": "1.0", **pinned}, (3, 12))
    with pytest.raises(peer_env.PeerEnvError, match="expected 0.0.1rc"):
        peer_env.check_dists(JAX_ENV, {JAX_ENV.library: "0.0.0"}, (3, 12))
    with pytest.raises(peer_env.PeerEnvError, match="made with Python 3.12"):
        peer_env.check_dists(JAX_ENV, pinned, (3, 11))


def test_torch_environment_holds_every_pin():
    torch_env = peer_env.PEER_ENVS["torch"]
    installed = {"tpu_sync_torch": peer_env.SYNC_VERSION, "torch": "2.13.0+cpu", "torch_tpu": "0.2.0"}
    assert peer_env.check_dists(torch_env, installed, (3, 12))["torch-tpu"] == "0.2.0"
    for dist, wrong in (("torch_tpu", None), ("torch", "2.14.1")):
        broken = {k: v for k, v in {**installed, dist: wrong}.items() if v}
        with pytest.raises(peer_env.PeerEnvError, match=f"{dist.replace('_', '-')} .* expected"):
            peer_env.check_dists(torch_env, broken, (3, 12))
    with pytest.raises(ValueError, match="expected one of \\['jax', 'torch', 'xla'\\]"):
        peer_env.peer_env("tensorflow")


# Every probe on both libraries, each case a watched worker: minutes, more on
# a loaded machine. The first test to ask for it pays for it.
SIDE_BY_SIDE_SECONDS = 1800
# What the harness does with a case is the same for every row of the matrix
# and every way the library is built: two rows (one rank-3 cache with every
# construction probe, one other); the library's other builds by one kind of
# each probe, and not for the probes between two managers. The whole matrix
# is `make peer-probe`'s.
ROWS = 2


def side_by_side_cases():
    made = [c for iut in ("kvref-jax", "tpu-sync-jax")
            for c in build_cases(["cpu"], load_matrix("cpu")[:ROWS], PROBES, iut)]
    first_kinds = {}
    for c in made:
        first_kinds.setdefault((c.iut, c.options_text, c.probe), c.kind)
    return [c for c in made if not (c.iut_options and (PROBES[c.probe].two_process
                                                       or c.kind != first_kinds[c.iut, c.options_text, c.probe]))]


@pytest.fixture(scope="module")
def side_by_side(peer_python):
    return run_cases(side_by_side_cases(), jobs=2)


@pytest.mark.timeout(SIDE_BY_SIDE_SECONDS)
def test_every_case_gets_one_verdict(side_by_side):
    expected = [c.case_id + c.options_text for c in side_by_side_cases()]
    assert sorted(r.case.case_id + r.case.options_text for r in side_by_side) == sorted(expected)
    for r in side_by_side:
        if r.outcome.verdict != "PASS":
            assert r.outcome.detail.strip(), r.case.case_id  # a finding keeps its evidence


@pytest.mark.timeout(SIDE_BY_SIDE_SECONDS)
def test_production_library_is_probed_as_its_users_build_it(side_by_side):
    built = {r.case.options_text for r in side_by_side if r.case.iut == "tpu-sync-jax"}
    assert built == {"defaults", "unsafe_skip_buffer_lock=False", "RAIDEN_ENABLE_ASYNC_DISPATCH='1'"}


@pytest.mark.timeout(SIDE_BY_SIDE_SECONDS)
def test_no_pass_for_a_construction_that_had_nothing_pending(side_by_side):
    construction = [r for r in side_by_side
                    if r.case.probe in ("deferred_construction", "host_transferred_construction")]
    assert construction
    for r in construction:
        if r.outcome.verdict == "PASS":
            assert r.outcome.pending_at_construction is True, r.case.case_id
        if r.outcome.pending_at_construction is False:
            assert r.outcome.verdict in ("SKIP", "ERROR"), r.case.case_id


@pytest.mark.timeout(SIDE_BY_SIDE_SECONDS)
def test_production_runs_in_its_own_interpreter(side_by_side):
    production = [r for r in side_by_side if r.case.iut == "tpu-sync-jax" and r.outcome.iut_version]
    assert production and all(r.outcome.iut_version == JAX_ENV.version for r in production)


@pytest.mark.timeout(SIDE_BY_SIDE_SECONDS)
def test_reference_earns_its_predictions_beside_it(side_by_side):
    for r in side_by_side:
        if r.case.iut == "kvref-jax":
            if r.outcome.verdict == "SKIP":
                # JAX CPU copies may land before the manager is built: then nothing was in
                # flight. And a jax.Array has no views.
                assert r.case.probe in ("host_transferred_construction", "pending_views"), r.outcome.detail
                assert "none was in flight" in r.outcome.detail or "no views" in r.outcome.detail
                continue
            if r.case.probe == "release_order" and r.outcome.verdict == "ERROR":
                # Its saves land before the call returns: none is running when it is dropped.
                assert r.outcome.detail.startswith("nothing in flight: "), r.outcome.detail
                continue
            assert prediction(r.case).admits(r.outcome.verdict), (r.case.case_id, r.outcome.detail)


@pytest.mark.timeout(SIDE_BY_SIDE_SECONDS)
def test_robustness_probes_reach_the_production_library(side_by_side):
    seen = {r.case.probe for r in side_by_side if r.case.iut == "tpu-sync-jax"
            and r.outcome.verdict != "SKIP"}
    assert set(ROBUSTNESS_PROBES) <= seen


@pytest.mark.timeout(SIDE_BY_SIDE_SECONDS)
def test_the_production_split_into_sub_managers_is_probed_over_stand_in_rails(side_by_side):
    """tpu-sync-jax splits a manager over the host's data-plane NICs; its
    pull cases of several sub-managers run over the veth rails of a
    namespace of their own (probes.iut.standin_rails), never SKIP here."""
    split = [r for r in side_by_side if r.case.iut == "tpu-sync-jax" and r.case.probe == "pull_blocks"
             and r.case.kind in ("sub_managers", "broadcast")]
    assert len(split) == 2
    for r in split:
        assert r.outcome.verdict != "SKIP", r.outcome.detail
