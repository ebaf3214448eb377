"""kvref over PyTorch/XLA lazy tensors on the XLA CPU device, in the xla
environment (`make xla-env`): kvref's own handling, then the probe suite on
IUT kvref-torch-xla, with the reference as it is and with its fault models."""

import subprocess

import pytest

from kvref import Faults
from probes.iut import peer_env, registry
from probes.run.runner import run_cases
from probes.suite.cases import Case
from probes.suite.matrix import build_cases, load_matrix
from probes.suite.predict import prediction
from probes.suite.registry import PROBES
from tests.peer_python import peer_python_or_skip

pytestmark = [pytest.mark.xla, pytest.mark.timeout(900)]

XLA_ENV = peer_env.PEER_ENVS["xla"]
IUT = "kvref-torch-xla"
# tests/xla_checks.py, run in the xla interpreter (this one has no torch_xla).
CHECKS = ["modified_in_place_between_transfers", "stale_with_the_buffer_resolved_once",
          "deferred_and_unwaited_caches_round_trip", "views_are_refused_by_name"]
CONSTRUCTION = ("deferred_construction", "host_transferred_construction", "pending_views")


@pytest.fixture(scope="module")
def xla_python():
    return peer_python_or_skip(XLA_ENV)


def test_xla_environment_holds_its_pins(xla_python):
    found = peer_env.verify(XLA_ENV, xla_python)
    assert found["torch-xla"] == "2.9.0" and found["torch"] == "2.9.0"


@pytest.mark.parametrize("check", CHECKS)
def test_kvref_over_xla_tensors(xla_python, check):
    done = subprocess.run([str(xla_python), "-m", "tests.xla_checks", check], capture_output=True,
                          text=True, timeout=600, cwd=peer_env.REPO)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-3000:]


AS_IT_IS_SECONDS = 1800  # every probe in watched workers: minutes, more on a loaded machine


# The rows whose caches the XLA CPU device treats differently: a rank-3 cache
# with every construction probe, a rank-2 one, and f8, which DLPack cannot
# carry (so no case is made of it). The whole matrix is `make xla-probe`'s.
ROWS = ("seed-rank3", "seed-rank2-bf16", "f8-rank3")


@pytest.fixture(scope="module")
def as_it_is(xla_python):
    rows = [row for row in load_matrix("cpu") if row.name in ROWS]
    assert len(rows) == len(ROWS)
    return run_cases(build_cases(["cpu"], rows, probes=tuple(PROBES), iut=IUT), jobs=2)


def landed_first(r) -> bool:
    """An unwaited sync on the XLA CPU device often hands its buffer over before
    the manager is built, and a save has landed when its call returns: then
    nothing was in flight, and the probe says so."""
    return ((r.case.probe == "host_transferred_construction" and r.outcome.verdict == "SKIP"
             and "none was in flight" in r.outcome.detail)
            or (r.case.probe == "release_order" and r.outcome.verdict == "ERROR"
                and r.outcome.detail.startswith("nothing in flight: ")))


@pytest.mark.timeout(AS_IT_IS_SECONDS)
def test_every_probe_earns_its_prediction(as_it_is):
    ran = {r.case.probe for r in as_it_is}
    applies = registry.iut(IUT).applies
    assert ran >= {p for p, declared in PROBES.items() if declared.default and applies(p)} | {"pending_views"}
    assert not [r for r in as_it_is if r.case.shape.dtype.startswith("f8")]  # declared unheld: never made
    for r in as_it_is:
        if not landed_first(r):
            assert prediction(r.case).admits(r.outcome.verdict), (r.case.case_id, r.outcome.detail)


def test_an_f8_cache_is_refused_as_its_iut_declares(xla_python):
    """Why kvref-torch-xla declares f8 caches unheld (no shape probe is made
    for them): kvref refuses such a cache, naming DLPack."""
    row = next(row for row in load_matrix("cpu") if row.name == "f8-rank3")
    assert not registry.iut(IUT).holds(row.shape.dtype)
    case = Case("roundtrip", "cpu", IUT, row.name, row.shape, startup_timeout=registry.iut(IUT).startup_seconds)
    [result] = run_cases([case], jobs=1)
    assert result.outcome.verdict == "REJECTED" and "DLPack has no f8" in result.outcome.detail, result.outcome


@pytest.mark.timeout(AS_IT_IS_SECONDS)
def test_construction_probes_saw_their_caches_pending(as_it_is):
    construction = [r for r in as_it_is if r.case.probe in CONSTRUCTION and not landed_first(r)]
    assert {r.case.probe for r in construction} >= {"deferred_construction", "pending_views"}
    assert all(r.outcome.pending_at_construction is True for r in construction), \
        [(r.case.case_id, r.outcome.detail) for r in construction if not r.outcome.pending_at_construction]
    views = [r.outcome for r in construction if r.case.probe == "pending_views"]
    assert all(o.verdict == "REJECTED" and "view" in o.detail for o in views)


def faulty_run(fault: str, probes: tuple[str, ...]):
    cases = build_cases(["cpu"], load_matrix("cpu")[:2], probes=probes, iut=IUT,
                        faults=Faults.parse([fault]), timeout=15.0)
    return {(r.case.probe, r.case.case_id): r.outcome for r in run_cases(cases, jobs=2)}


def test_awaiting_without_materializing_hangs_where_a_cache_is_pending(xla_python):
    """Deferred caches, and caches scrambled in place (`zero_()`, left pending)
    before their blocks come back, are graphs: awaiting them without running
    the graph never returns. Plans touch no cache."""
    found = faulty_run("no_materialize_before_await",
                       ("deferred_construction", "roundtrip", "serving_step", "inflight_step", "plan_binding"))
    for (probe, case_id), outcome in found.items():
        expected = "PASS" if probe == "plan_binding" else "HANG"  # dense layouts: no refusals
        assert outcome.verdict == expected, (case_id, outcome.detail[:500])


def test_a_buffer_resolved_once_moves_stale_storage(xla_python):
    """An XLA tensor updated in place gets a new buffer; a manager that kept
    the one it saw at construction moves the old bytes."""
    found = faulty_run("buffer_resolved_once", ("serving_step", "roundtrip", "inflight_step", "plan_binding"))
    for (probe, case_id), outcome in found.items():
        expected = {"serving_step": "CORRUPT", "roundtrip": "CORRUPT", "inflight_step": "CORRUPT",
                    "plan_binding": "PASS"}[probe]
        assert outcome.verdict == expected, (case_id, outcome.detail[:500])
