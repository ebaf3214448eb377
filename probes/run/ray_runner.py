"""`kvprobe run --ray ADDRESS`: the same cases as Ray tasks over a cluster of
hosts, gathered into the same rows as a local run.

Each task runs the local runner's watched worker on its host
(probes.run.runner.run_case), so a verdict means what it means locally.
Scheduling:
- a case of a device-owning IUT asks for one unit of its generation's
  accelerator-type resource, which Ray gives each TPU host exactly one of: it
  runs only on hosts of its generation, one at a time per host;
- every other case asks for one CPU and spreads over the cluster.
A case no host of the cluster can take is SKIP with the reason. A task lost
with its worker or node is CRASH with Ray's error; a cluster that answers
nothing for `stall_seconds` leaves its outstanding cases HANG. Ray is
optional (`pip install 'kvref[ray]'`); the local runner needs none of it."""

from __future__ import annotations

import os
import socket
import time

from probes.iut import iut
from probes.run.hosts import ray_resource, this_host
from probes.run.runner import GRACE_SECONDS, CaseResult, run_case
from probes.suite.cases import Case
from probes.suite.verdicts import CRASH, ERROR, HANG, SKIP, Outcome

STALL_MARGIN_SECONDS = 120.0  # beyond the longest case's own limits
CONNECT_SECONDS = 10.0


def run_on_host(case_text: str) -> dict:
    """The task: one case, watched on this host, and where it ran."""
    import ray

    result = run_case(Case.from_json(case_text))
    host, generation = this_host(ray.get_runtime_context().get_node_labels())
    return {"outcome": result.outcome.to_dict(), "wall_seconds": result.wall_seconds,
            "stderr": result.stderr[-4000:], "host": host, "host_generation": generation}


def task_options(case: Case) -> dict:
    # No retries: a case whose worker or node died is a verdict, not a rerun.
    if iut(case.iut).owns_device:
        return {"num_cpus": 1, "resources": {ray_resource(case.generation): 1}, "max_retries": 0}
    return {"num_cpus": 1, "scheduling_strategy": "SPREAD", "max_retries": 0}


def unplaceable(case: Case, cluster: dict) -> str | None:
    """Why no host of the cluster can take this case, or None."""
    for resource, amount in task_options(case).get("resources", {}).items():
        if cluster.get(resource, 0) < amount:
            return (f"no host of generation {case.generation} in the Ray cluster (no node has the "
                    f"resource {resource}); join one to run {case.iut} there")
    return None


def run_cases_on_ray(cases: list[Case], address: str, progress=None, task=run_on_host,
                     stall_seconds: float | None = None) -> list[CaseResult]:
    """All cases as Ray tasks, in input order. `address`: 'local' starts a
    private cluster on this machine and stops it afterwards; 'auto' or
    HOST:PORT joins an existing one."""
    ray = _ray()
    started_here = not ray.is_initialized()
    if started_here:
        _connect(ray, address)
    try:
        cluster = ray.cluster_resources()
        remote = ray.remote(task)
        results: list[CaseResult | None] = [None] * len(cases)
        waiting = {}
        for i, case in enumerate(cases):
            reason = unplaceable(case, cluster)
            if reason:
                results[i] = CaseResult(case, Outcome(SKIP, reason), 0.0)
                _report(progress, results[i])
            else:
                waiting[remote.options(**task_options(case)).remote(case.to_json())] = (i, time.monotonic())
        stall = stall_seconds or max((c.startup_timeout + c.timeout + GRACE_SECONDS for c in cases),
                                     default=0) + STALL_MARGIN_SECONDS
        while waiting:
            done, _ = ray.wait(list(waiting), num_returns=1, timeout=stall)
            if not done:
                for ref, (i, submitted) in waiting.items():
                    ray.cancel(ref, force=True)
                    results[i] = CaseResult(cases[i], Outcome(
                        HANG, f"no answer from the Ray cluster in {stall:.0f}s (no case finished "
                        "meanwhile); cancelled", seconds=stall), time.monotonic() - submitted)
                    _report(progress, results[i])
                break
            for ref in done:
                i, submitted = waiting.pop(ref)
                results[i] = _collect(ray, ref, cases[i], time.monotonic() - submitted)
                _report(progress, results[i])
        return results
    finally:
        if started_here:
            ray.shutdown()  # stops a private cluster; only disconnects from a shared one


def _collect(ray, ref, case: Case, waited: float) -> CaseResult:
    try:
        found = ray.get(ref)
    except ray.exceptions.RayTaskError as e:  # the task itself raised: the harness failed
        return CaseResult(case, Outcome(ERROR, f"the Ray task failed: {e}"), waited)
    except (ray.exceptions.RayError, OSError) as e:  # the worker, node or object was lost
        return CaseResult(case, Outcome(CRASH, f"lost in the Ray cluster: {type(e).__name__}: {e}"), waited)
    outcome = Outcome(**found["outcome"])
    return CaseResult(case, outcome, found["wall_seconds"], found["stderr"], found["host"],
                      found["host_generation"])


def _report(progress, result: CaseResult) -> None:
    if progress:
        progress(result)


def _connect(ray, address: str) -> None:
    if address == "local":  # a private cluster of this machine, stopped by shutdown()
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        return
    if address != "auto":  # Ray retries an address nothing answers at forever
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=CONNECT_SECONDS).close()
        except (OSError, ValueError) as e:
            raise RuntimeError(f"no Ray cluster answers at {address!r} ({e}); expected 'auto', 'local' "
                               "or the head's HOST:PORT (`ray start --head` prints it)") from None
    ray.init(address=address, log_to_driver=False)


def _ray():
    try:
        import ray
    except ImportError as e:
        raise RuntimeError("--ray needs Ray: pip install 'kvref[ray]'") from e
    return ray

