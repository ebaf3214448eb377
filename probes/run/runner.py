"""Runs probe cases in watched worker processes, in parallel, and gives each
exactly one verdict."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from probes.iut import STARTUP_SECONDS, TpuUnavailable, build_missing, environment, iut, python_of, side_environments
from probes.run import netns
from probes.run.hosts import this_host
from probes.run.channel import DESCRIBED, RESULT
from probes.run.forked import Ran, ZygoteLost, ZygoteUnavailable, kill_live, resume, run_watched, zygote_for
from probes.run.pair import PAIR_PREFIX, ran_of, side_ending
from probes.suite.cases import Case
from probes.suite.registry import probe
from probes.suite.pull_failures import DIES
from probes.suite.rendezvous import ROLES, posted_by
from probes.suite.verdicts import CRASH, ERROR, HANG, PASS, SKIP, WATCHDOG_FIRED, Outcome, both_sides

WORKER = "probes.run.worker"
PAIR = "probes.run.pair"
PAIR_GRACE_SECONDS = 5.0  # beyond the workers' limit, for their parent to report them

GRACE_SECONDS = 1.0  # beyond the worker's own watchdog, before the parent kills it


@dataclass
class CaseResult:
    case: Case
    outcome: Outcome
    wall_seconds: float
    stderr: str = ""
    host: str = ""  # where its worker ran, and that host's TPU generation ("" for none)
    host_generation: str = ""


def run_case(case: Case, python: str | None = None) -> CaseResult:
    """One case in its own watched process. By default it is forked from the
    warm zygote of the IUT's interpreter; a device-owning IUT, an explicit
    `python`, or a zygote that cannot start gets a fresh interpreter. The
    workers of a loopback_only IUT, fresh or forked, run in a network namespace
    with only lo (probes.run.netns); where none can be made its cases are SKIP."""
    declared = iut(case.iut)  # the one place a case's IUT is resolved; its value is passed on
    fresh = python is not None or declared.owns_device
    found, missing = (python, "") if python else python_of(declared)
    if found is None:
        return CaseResult(case, Outcome(SKIP, f"{case.iut}: {missing}"), 0.0, "", *this_host())
    python = found
    if reason := build_missing(declared):
        return CaseResult(case, Outcome(SKIP, f"{case.iut}: {reason}"), 0.0, "", *this_host())
    if declared.loopback_only and (reason := netns.unavailable()):
        return CaseResult(case, Outcome(SKIP, f"{case.iut}: {reason}"), 0.0, "", *this_host())
    two_process = probe(case.probe).two_process
    try:  # the runtime's environment could not be read, or the host has too few chips for both sides
        env = environment(declared)
        envs = side_environments(declared, env, len(ROLES)) if two_process else None
    except TpuUnavailable as e:
        return CaseResult(case, Outcome(ERROR, f"{case.iut}: {e}"), 0.0, "", *this_host())
    if two_process:
        shared = not (fresh or probe(case.probe).own_network)  # a zygote's namespace is every case's it forks
        return _run_two(case, python, envs, declared.preload if shared else None)
    start = time.monotonic()
    text = case.to_json()
    limit = case.startup_timeout + case.timeout + GRACE_SECONDS
    isolated = declared.loopback_only
    try:
        ran = (_run_fresh(python, text, env, limit, isolated) if fresh
               else zygote_for(python, case.iut, declared.preload, env, isolated).run(text, env, limit))
    except ZygoteUnavailable:  # no warm parent for it: a fresh interpreter
        ran = _run_fresh(python, text, env, limit, isolated)
    except ZygoteLost as e:
        return CaseResult(case, Outcome(ERROR, str(e)), time.monotonic() - start, "", *this_host())
    outcome = classify(ran, case.timeout, case.startup_timeout)
    return CaseResult(case, outcome, time.monotonic() - start, ran.err, *this_host())


def _run_two(case: Case, python: str, envs: list[dict], preload: tuple[str, ...] | None) -> CaseResult:
    """A two-process case: its producer and consumer workers side by side,
    in one loopback-only network namespace of their own where one can be
    made (a loopback_only IUT's cases are SKIP where none can), and one
    verdict from both. Both are forked from the IUT's warm zygote (in such a
    namespace, shared by the cases it forks, each on ports of its own);
    `preload` None, or no zygote: fresh interpreters (probes.run.pair), in a
    namespace of the case's own."""
    start = time.monotonic()
    limit = case.startup_timeout + case.timeout + GRACE_SECONDS
    isolated = netns.unavailable() is None
    ran = None if preload is None else _forked_pair(case, python, envs[0], preload, isolated, limit)
    if isinstance(ran, CaseResult):
        return ran
    if ran is None:
        ran, parent = _fresh_pair(case, python, envs, isolated, limit)
        if ran is None:
            return CaseResult(case, Outcome(ERROR, f"the two workers' parent exited {parent.returncode} without "
                                            f"their results\n{parent.err[-4000:]}"), time.monotonic() - start,
                              parent.err, *this_host())
    ran, dying = ran
    outcomes = [Outcome(PASS, "killed itself mid-pull, as the probe has it do")
                if role in dying and worker.returncode == -signal.SIGKILL
                else classify(worker, case.timeout, case.startup_timeout) for role, worker in zip(ROLES, ran)]
    stderr = "\n".join(f"--- {role} ---\n{worker.err}" for role, worker in zip(ROLES, ran))
    return CaseResult(case, both_sides(dict(zip(ROLES, outcomes))), time.monotonic() - start, stderr,
                      *this_host())


def _role_cases(case: Case, folder: str) -> list[str]:
    return [dataclasses.replace(case, role=role, rendezvous=folder).to_json() for role in ROLES]


def _forked_pair(case: Case, python: str, env: dict, preload: tuple[str, ...], isolated: bool, limit: float):
    """(both workers' Ran, the roles that said they would die), forked from
    the zygote; None where there is none; a CaseResult when it died under them."""
    folder = tempfile.mkdtemp(prefix="kvprobe-pair-")
    try:
        zygote = zygote_for(python, case.iut, preload, env, isolated)
        def side(text: str):
            with side_ending(text):
                return zygote.run(text, env, limit)
        with ThreadPoolExecutor(len(ROLES)) as pool:
            runs = [pool.submit(side, text) for text in _role_cases(case, folder)]
            errors = [run.exception() for run in runs]
        lost = next((e for e in errors if isinstance(e, ZygoteLost)), None)
        if lost is not None:
            return CaseResult(case, Outcome(ERROR, str(lost)), 0.0, "", *this_host())
        if any(errors):
            if all(isinstance(e, ZygoteUnavailable) for e in errors if e):
                return None
            raise next(e for e in errors if e)
        return [run.result() for run in runs], {role for role in ROLES if posted_by(folder, role, DIES)}
    except ZygoteUnavailable:
        return None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _fresh_pair(case: Case, python: str, envs: list[dict], isolated: bool, limit: float):
    """(both workers' Ran and the roles that said they would die, or None;
    their parent's Ran), started fresh by probes.run.pair, each worker with
    its role's environment."""
    folder = tempfile.mkdtemp(prefix="kvprobe-pair-")
    try:
        command = netns.python_command(python, PAIR) if isolated else [python, "-m", PAIR]
        request = json.dumps({"cases": _role_cases(case, folder), "limit": limit, "envs": envs})
        parent = run_watched(command, request, limit + PAIR_GRACE_SECONDS, envs[0])
        dying = {role for role in ROLES if posted_by(folder, role, DIES)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    line = next((text for text in reversed(parent.out.splitlines()) if text.startswith(PAIR_PREFIX)), None)
    if line is None:
        return None, parent
    return ([ran_of(fields) for fields in json.loads(line[len(PAIR_PREFIX):])], dying), parent


def _run_fresh(python: str, text: str, env: dict, limit: float, loopback_only: bool = False) -> Ran:
    """`python -m probes.run.worker` with the case on stdin; `loopback_only`:
    in a network namespace of its own with only lo."""
    command = netns.python_command(python, WORKER) if loopback_only else [python, "-m", WORKER]
    return run_watched(command, text, limit, env)


def classify(ran: Ran, timeout: float, startup_timeout: float = STARTUP_SECONDS) -> Outcome:
    """One verdict from everything the worker did, from start to exit: a
    result from its verdict channel stands only if it is the channel's one
    result, nothing forged came with it, and the process then exited cleanly.
    A crash, a non-zero exit or a hang while arrays and managers are released
    at exit is the verdict, "after the probe", with what the probe had
    reported. A hang before the probe started is one of the start-up, with
    its own limit. A failure in the probe keeps what the worker said of the
    IUT before it."""
    returncode, err, killed, heard = ran.returncode, ran.err, ran.killed, ran.heard
    results, described = heard.payloads(RESULT), heard.payloads(DESCRIBED)
    described = Outcome(ERROR, "", **described[-1]) if described else None
    if tampered := heard.tampered():
        return _finding(described, ERROR, f"{tampered}: something besides the worker wrote to it (the IUT's "
                        f"code, or a process it forked), so no verdict it carried stands\n{err[-4000:]}")
    reported = Outcome(**results[0]) if results else None
    after, said = "", ""
    if reported is not None:
        after = " after the probe"
        said = f" (the probe had reported {reported.verdict}: {reported.detail.strip()[:300]})"
    if not heard.probe_started and (killed or (WATCHDOG_FIRED in err and returncode == 1)):
        return Outcome(HANG, f"start-up (imports, the device runtime, the adapter's checks) did not "
                       f"finish in {startup_timeout}s; stacks:\n{err[-4000:]}", seconds=startup_timeout)
    if killed:
        return _finding(reported or described, HANG, f"no answer in {timeout}s{after}; killed{said}\n"
                        f"{err[-4000:]}", seconds=timeout)
    if WATCHDOG_FIRED in err and returncode == 1:
        return _finding(reported or described, HANG, f"watchdog fired after {timeout}s{after}{said}; "
                        f"stacks:\n{err[-4000:]}", seconds=timeout)
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        return _finding(reported or described, CRASH, f"killed by {name}{after}{said}\n{err[-4000:]}")
    if returncode != 0 and reported is not None:
        return _finding(reported, CRASH, f"exited {returncode}{after}{said}\n{err[-4000:]}")
    if reported is not None:
        return reported
    return _finding(described, ERROR, f"worker exited {returncode} without a result\n{err[-4000:]}")


def _finding(reported: Outcome | None, verdict: str, detail: str, **fields) -> Outcome:
    """A failing verdict, keeping what the worker had reported about the IUT
    (its result, or what it said before the probe)."""
    if reported is None:
        return Outcome(verdict, detail, **fields)
    return dataclasses.replace(reported, verdict=verdict, detail=detail, **fields)


class CasePools:
    """Where the cases of a run start: `jobs` at a time (default: the core
    count; one where a case owns the device: one device, one worker). Cases
    whose probe mostly waits on the device (Probe.waits) run `jobs` at a time
    beside the others, not in their place."""

    def __init__(self, cases: list[Case], jobs: int | None = None, python: str | None = None):
        resume()  # a run interrupted before this one in the process stopped its workers, not these
        jobs = 1 if owns_device(cases) else jobs or os.cpu_count() or 1
        self.python = python
        self.working = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="working")
        self.waiting = self.working if jobs == 1 else ThreadPoolExecutor(max_workers=jobs,
                                                                          thread_name_prefix="waiting")

    def start(self, case: Case):
        """The future of the case's result."""
        return (self.waiting if probe(case.probe).waits else self.working).submit(run_case, case, self.python)

    def shutdown(self, stop: bool = False) -> None:
        """Wait for every case; with `stop`, start no queued one and wait for none."""
        for pool in {self.working, self.waiting}:
            pool.shutdown(wait=not stop, cancel_futures=stop)


def run_cases(cases: list[Case], jobs: int | None = None, python: str | None = None,
              progress=None) -> list[CaseResult]:
    """All cases, as CasePools starts them, in input order. `progress(result)`
    is called as each finishes, in input order."""
    pools = CasePools(cases, jobs, python)
    futures = [pools.start(case) for case in cases]
    results = []
    try:
        for future in futures:
            result = future.result()
            if progress:
                progress(result)
            results.append(result)
    except KeyboardInterrupt as stop:
        # Ctrl-C (or SIGTERM, SIGHUP): no queued case starts, every running worker
        # ends now, and what had finished is kept (a case killed here earned no verdict).
        finished = [f.result() for f in futures if f.done() and not f.cancelled() and not f.exception()]
        pools.shutdown(stop=True)
        kill_live()
        raise Interrupted(finished, getattr(stop, "signum", signal.SIGINT)) from None
    pools.shutdown()
    return results


class Interrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C (or the signal `signum`), with the cases that had finished."""

    def __init__(self, finished: list[CaseResult], signum: int = signal.SIGINT):
        super().__init__(f"interrupted with {len(finished)} cases finished")
        self.finished, self.signum = finished, signum


def owns_device(cases: list[Case]) -> bool:
    """Whether any case's worker holds a real TPU, which one process may hold at a time."""
    return any(iut(name).owns_device for name in {c.iut for c in cases})
