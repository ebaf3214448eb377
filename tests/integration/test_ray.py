"""`kvprobe run --ray`: a Ray cluster this test starts on 127.0.0.1, with nodes
standing in for TPU hosts of two generations (each has the one unit of its
accelerator-type resource and the label a real TPU host gets)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from kvref import ShapeKey
from kvref.polling import wait_for
from probes.report import results
from probes.run import rows
from probes.run.hosts import RAY_ACCELERATOR_LABEL, RAY_ACCELERATOR_TYPES, ray_resource
from probes.run.ray_runner import run_cases_on_ray, run_on_host
from probes.run.runner import run_cases
from probes.suite.matrix import MatrixRow, build_cases

# Ray's switch for a cluster on the loopback address only; read when Ray is imported.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray")
import psutil  # noqa: E402  (a Ray dependency)
from ray import cloudpickle  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the tasks below run on the cluster

TPU_HOSTS = ("v4", "v5e")
MATRIX = [MatrixRow("small", ShapeKey("bf16", (512, 8, 256)), ("roundtrip",)),
          MatrixRow("f32", ShapeKey("f32", (512, 8, 128)), ("roundtrip",))]


def ray_processes() -> list[psutil.Process]:
    me = psutil.Process()
    return [p for p in me.children(recursive=True)
            if any(name in " ".join(_cmdline(p)) for name in ("raylet", "gcs_server", "default_worker"))]


STARTS = 3  # Ray gives a raylet 30 s to register and its GCS server a while to publish its port; a loaded machine
# can miss either, and the cluster is then started anew
STARTUP_TIMEOUTS = ("timed out during startup", "timed out waiting for file")  # Ray's words for those two waits


def started() -> Cluster:
    """A head and one node per TPU host; started again, up to STARTS times, where a raylet or the GCS server
    missed Ray's wait for it (the setting up, not a test, is tried again)."""
    for attempt in range(STARTS):
        cluster = None
        try:
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1"})
            for gen in TPU_HOSTS:
                cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", resources={ray_resource(gen): 1},
                                 labels={RAY_ACCELERATOR_LABEL: RAY_ACCELERATOR_TYPES[gen]})
            cluster.wait_for_nodes()
            return cluster
        except Exception as e:  # noqa: BLE001 (Ray raises a bare Exception for it)
            if not any(words in str(e).lower() for words in STARTUP_TIMEOUTS) or attempt == STARTS - 1:
                raise
            if cluster is not None:
                cluster.shutdown()
            for process in ray_processes():
                process.kill()
            wait_for(lambda: not ray_processes(), 30, 0.5)
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def cluster():
    os.environ["KVPROBE_TPU_STANDIN"] = "cpu"  # the hardware adapter's code on JAX CPU devices
    # Ray waits 30 s for its GCS server to write its port; beside the engine test on two cores that
    # ran out once (CI, 2026-12-06). Ray's own knob for that wait, set for the cluster this module starts.
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")
    cluster = started()
    yield cluster
    cluster.shutdown()
    os.environ.pop("KVPROBE_TPU_STANDIN", None)
    assert wait_for(lambda: not ray_processes(), 30, 0.5), "the cluster left processes behind"


def test_a_ray_run_writes_the_rows_a_local_run_writes(cluster):
    cases = build_cases(TPU_HOSTS, MATRIX, probes=("roundtrip", "plan_binding", "deferred_construction"))
    local = results.deterministic(rows.to_frame(run_cases(cases, jobs=2), "local"))
    on_ray = run_cases_on_ray(cases, cluster.address)
    remote = results.deterministic(rows.to_frame(on_ray, "ray"))
    assert len(remote) == len(cases) and set(remote["verdict"]) <= {"PASS", "REJECTED"}
    assert remote.equals(local), remote.compare(local)
    assert all(r.host for r in on_ray)


def test_hardware_cases_run_only_on_hosts_of_their_generation(cluster):
    cases = build_cases(("v4", "v5e", "v6e"), [], probes=("mixed_slices",), iut="tpu-sync-jax-tpu")
    found = run_cases_on_ray(cases, cluster.address)
    for result in found:
        if result.case.generation == "v6e":  # no such host joined
            assert result.outcome.verdict == "SKIP" and "no host of generation v6e" in result.outcome.detail
        else:
            assert result.host_generation == result.case.generation, (result.case.case_id, result.host_generation)
    assert {r.case.generation for r in found if r.host_generation} == {"v4", "v5e"}


def timed_task(case_text: str) -> dict:
    """Records when it ran on which node, for a hardware case that holds its host for a while."""
    import ray as r

    start = time.monotonic()
    time.sleep(0.5)
    found = run_on_host(case_text)
    found["outcome"]["detail"] = f"{r.get_runtime_context().get_node_id()} {start} {time.monotonic()}"
    return found


def test_one_hardware_case_at_a_time_per_host(cluster):
    cases = build_cases(("v4",), [], probes=("serving_step", "host_budget", "mixed_slices"),
                        iut="tpu-sync-jax-tpu")
    spans = sorted((float(a), float(b)) for node, a, b in
                   (r.outcome.detail.split() for r in run_cases_on_ray(cases, cluster.address, task=timed_task)))
    assert len(spans) == len(cases) >= 3
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:])), spans


def dying_task(case_text: str) -> dict:
    """Kills its own Ray worker process for one case; runs the others."""
    if '"plan_binding"' in case_text:
        os.kill(os.getpid(), signal.SIGKILL)
    return run_on_host(case_text)


def test_a_task_whose_worker_is_killed_is_a_crash_and_the_run_goes_on(cluster):
    cases = build_cases(("v4",), MATRIX, probes=("roundtrip", "plan_binding"))
    found = {r.case.probe + "/" + r.case.case_id: r.outcome for r in
             run_cases_on_ray(cases, cluster.address, task=dying_task)}
    crashed = [k for k, o in found.items() if o.verdict == "CRASH"]
    assert len(crashed) == 1 and crashed[0].startswith("plan_binding")
    assert "lost in the Ray cluster" in found[crashed[0]].detail and "Worker" in found[crashed[0]].detail
    assert all(o.verdict in ("PASS", "REJECTED") for k, o in found.items() if k not in crashed)


def silent_task(case_text: str) -> dict:
    time.sleep(3600)


def test_a_cluster_that_answers_nothing_leaves_its_cases_hang(cluster):
    cases = build_cases(("v4",), [], probes=("plan_binding",))
    # A runner that waited for the task (an hour) would outlast the module's own limit.
    (result,) = run_cases_on_ray(cases, cluster.address, task=silent_task, stall_seconds=3.0)
    assert result.outcome.verdict == "HANG" and "no answer from the Ray cluster in 3s" in result.outcome.detail


def test_kvprobe_run_ray_local_starts_and_stops_its_own_cluster(tmp_path):
    matrix = tmp_path / "m.csv"
    matrix.write_text("name,shape,probes\nsmall,\"bf16[512,8,256]\",roundtrip\n")
    before = {p.pid for p in psutil.process_iter() if "raylet" in " ".join(_cmdline(p))}
    done = subprocess.run([sys.executable, "-m", "probes.run.cli", "run", "--ray", "local", "--generation", "v4",
                           "--matrix", str(matrix), "--probe", "roundtrip", "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    frame = results.read_run(results.latest_run(tmp_path / "r" / "v4"))
    assert list(frame["verdict"]) == ["PASS"] and frame["host"].iloc[0]
    time.sleep(1)
    after = {p.pid for p in psutil.process_iter() if "raylet" in " ".join(_cmdline(p))}
    assert after <= before, "the private cluster outlived the run"


def _cmdline(process) -> list[str]:
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):  # gone, or a zombie: not running
        return []


def test_generation_resources_are_one_unit_per_host_and_named_as_ray_names_tpus():
    assert ray_resource("v5e") == "accelerator_type:TPU-V5LITEPOD"
    with pytest.raises(ValueError, match="no Ray accelerator type for generation 'cpu'"):
        ray_resource("cpu")




def test_an_address_nothing_answers_at_is_a_clear_error_not_a_wait():
    cases = build_cases(("v4",), [], probes=("plan_binding",))
    with pytest.raises(RuntimeError, match="no Ray cluster answers at '127.0.0.1:9'"):
        run_cases_on_ray(cases, "127.0.0.1:9")
