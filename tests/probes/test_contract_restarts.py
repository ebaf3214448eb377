"""Process death and restart in the contract (probes.suite.contract_restarts):
kvref's IUTs hold when their producer is killed and another takes its
place, and the fault models of a consumer that does not survive its
producer's death are found; the producer's process answers within its
bounds, or says it is gone."""

import re
import tempfile
from pathlib import Path

import pytest

import kvref
from probes.iut.registry import adapter_for
from probes.run import fuzz_command
from probes.run.runner import run_cases
from probes.suite.contract_sequences import CASE_SECONDS
from probes.suite.manager_process import ManagerGone, ManagerProcess
from tests.batch import BATCH_SECONDS

pytestmark = pytest.mark.timeout(BATCH_SECONDS)
SPEC = {"shape": "bf16[32,8,128]", "layers": 2, "host_blocks": 8, "mode": "put"}
LEFT_BEHIND = {"keyless_pool_in_shared_memory": r"named shared memory /dev/shm/kvref-pool-keyless-",
               "helper_process_outlives_manager": r"process \d+ \(sleep\), which it started, still running",
               "socket_file_left": r"the socket file \S+/kvref-local-\d+-\d+\.sock"}


def register(req, uuid, blocks):
    return {"rule": "register", "req": req, "uuid": uuid, "blocks": blocks}


def pull(req, uuid, remote, local, consumer=0, pick=None):
    """start_read of `remote`: the registration's blocks in the order `pick` takes them."""
    return {"rule": "pull", "req": req, "uuid": uuid, "pick": pick or list(range(len(remote))), "remote": remote,
            "local": local, "consumer": consumer, "parallelism": 1}


def restart(how, same_port, geometry="same", seed=1):
    return {"rule": "restart_producer", "how": how, "same_port": same_port, "geometry": geometry, "seed": seed}


def children() -> set[int]:
    """This process's children, as the kernel lists them."""
    return {int(pid) for task in Path("/proc/self/task").iterdir()
            for pid in (task / "children").read_text().split()}


def restart_consumer(consumer, how, geometry="same", seed=1):
    return {"rule": "restart_consumer", "consumer": consumer, "how": how, "geometry": geometry, "seed": seed}


SETTLE = {"rule": "settle"}
# Every kind of restart, pulls in flight at each: a pull waiting for a registration that never comes (so it is in
# flight when its producer goes), registrations gone with their producer, the same port and another, blocks of
# the second consumer's size.
RESTARTS = [pull("p-0", 999, [1], [2]), register("req-1", 77, [1, 2, 3]),
            restart("close", same_port=True),
            register("req-2", 78, [4, 9]), pull("p-1", 78, [4, 9], [10, 11]), pull("p-2", 77, [1, 2, 3], [3, 4, 5]),
            restart("kill", same_port=False, seed=2),
            SETTLE,
            register("req-3", 79, [2, 3]), pull("p-3", 79, [3, 2], [12, 13], pick=[1, 0]), pull("p-4", 1000, [5], [14]),
            restart("kill", same_port=True, seed=3),
            SETTLE,
            register("req-5", 81, [7, 8]), pull("p-5", 81, [7, 8], [16, 17]), SETTLE,
            restart("kill", same_port=False, geometry="other", seed=4),
            register("req-6", 82, [1, 2]), pull("p-6", 82, [1, 2], [18, 19], consumer=1),
            register("req-7", 83, [3]), pull("p-7", 83, [3], [20]), SETTLE,
            # The consumers' turn: one killed with a pull in flight, one closed, each replaced by a process.
            restart("kill", same_port=True, geometry="other", seed=5),  # the producer back to the first geometry
            register("req-8", 84, [4, 5]), pull("p-8", 84, [4, 5], [21, 22]),
            restart_consumer(0, "kill", seed=6),
            register("req-9", 85, [6]), pull("p-9", 85, [6], [23]), SETTLE,
            restart_consumer(1, "close", geometry="other", seed=7),  # now the producer's geometry: it lands
            register("req-10", 86, [7, 8]), pull("p-10", 86, [7, 8], [24, 25], consumer=1), SETTLE,
            restart_consumer(0, "kill", geometry="other", seed=8),  # not the producer's geometry: it fails
            register("req-11", 87, [9]), pull("p-11", 87, [9], [26]), SETTLE]


def sequence_case(name, generation, faults=()):
    return fuzz_command.contract_case(name, generation, kvref.Faults.parse(faults, environ={}), CASE_SECONDS / 2, 0,
                                      calls={"spec": SPEC, "seed": 5, "steps": RESTARTS})


@pytest.fixture(scope="module")
def ran():
    cases = {"kvref-sim": sequence_case("kvref-sim", "tpu7x"), "kvref-jax": sequence_case("kvref-jax", "cpu"),
             "kvref-compat": sequence_case("kvref-compat", "cpu"),
             "pull_route_reused": sequence_case("kvref-sim", "tpu7x", ["pull_route_reused"]),
             "lost_pull_unsettled": sequence_case("kvref-sim", "tpu7x", ["lost_pull_unsettled"]),
             **{fault: sequence_case("kvref-sim", "tpu7x", [fault]) for fault in LEFT_BEHIND}}
    yield dict(zip(cases, run_cases(list(cases.values()), jobs=2)))
    for left in Path(tempfile.gettempdir()).glob("kvref-local-*.sock"):  # socket_file_left's, of ended processes
        if not Path("/proc", left.name.split("-")[2]).exists():
            left.unlink(missing_ok=True)


@pytest.mark.parametrize("name", ["kvref-sim", "kvref-jax", "kvref-compat"])
def test_kvrefs_iuts_hold_through_their_producers_deaths(ran, name):
    outcome = ran[name].outcome
    assert outcome.verdict == "PASS", outcome.detail
    assert f"{len(RESTARTS)} steps held" in outcome.detail


@pytest.mark.parametrize("fault, said", [
    ("pull_route_reused", "reported failed"),  # it asks the dead producer's address, not the newcomer's
    ("lost_pull_unsettled", "never settled"),  # a pull cut by its producer's death
])
def test_a_consumer_that_does_not_survive_its_producers_death_is_found(ran, fault, said):
    outcome = ran[fault].outcome
    assert outcome.verdict == "ERROR" and said in outcome.detail, outcome.detail


@pytest.mark.parametrize("fault", LEFT_BEHIND)
def test_a_killed_manager_that_leaves_something_behind_is_found(ran, fault):
    outcome = ran[fault].outcome
    found = re.search(f"killed, left behind {LEFT_BEHIND[fault]}", outcome.detail)
    assert outcome.verdict == "ERROR" and found, outcome.detail


def test_a_killed_producer_is_gone_at_once_and_its_successor_on_its_port_answers():
    iut = adapter_for("kvref-sim", "tpu7x")
    key = kvref.ShapeKey.parse(SPEC["shape"])
    first = ManagerProcess(iut, key, [1, 2], 0, 6.0, 8)
    try:
        assert first.register_read("req-1", 5, [1, 2]) is True
        first.kill()
        with pytest.raises(ManagerGone, match="process (is gone|ended)"):  # at once, not "did not answer in time"
            first.register_read("req-2", 6, [3])
        port = int(first.get_local_endpoints()[0]["endpoint"].rpartition(":")[2])
    finally:
        first.kill()
    second = ManagerProcess(iut, key, [3, 4], port, 6.0, 8)
    try:
        assert second.get_local_endpoints()[0]["endpoint"].endswith(f":{port}")
        assert second.poll_stats() == ([], [], [])
    finally:
        second.close()


def test_a_producer_that_cannot_start_says_why_and_leaves_no_process():
    iut = adapter_for("kvref-sim", "tpu7x")
    before = children()
    with pytest.raises(ManagerGone, match=r"ended \(exit 1; .*LayoutError: .*no dim-0 rows"):
        ManagerProcess(iut, kvref.ShapeKey("bf16", (0,)), [1], 0, 6.0, 8)
    assert children() <= before
