"""Workers forked from a warm zygote are watched like fresh ones: a crash, a
hang, a failure after the result line, and every process they start, end as
they would in a fresh interpreter."""

import json
import os
import sys
import threading
import time

import pytest

from probes.run import forked
from probes.run.runner import classify, run_case
from probes.run.worker import PHASE_PROBE
from kvref import ShapeKey
from probes.suite.matrix import MatrixRow, build_cases
from tests.probes.test_runner import alive


def planted_zygote(tmp_path, body: str) -> forked.Zygote:
    """A zygote that preloads a module replacing the probe run with `body`
    (the body of `def run(text, on_probe_start)`)."""
    (tmp_path / "planted_run.py").write_text(
        "import os, signal, subprocess, sys, threading, time\n"
        "import probes.run.probe_case as p\n"
        "from probes.suite.verdicts import Outcome\n"
        "def run(text, on_probe_start):\n"
        + "".join(f"    {line}\n" for line in body.splitlines())
        + "p.run_case_here = run\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"}
    return forked.Zygote(sys.executable, CASE.iut, ("planted_run",), env)


CASE = build_cases(["tpu7x"], [], probes=("plan_binding",), timeout=2.0)[0]
RESULT = "return Outcome('PASS', 'ok')"  # the worker says it over the verdict channel


def run_planted(tmp_path, body: str, timeout: float = 3.0):
    zygote = planted_zygote(tmp_path, body)
    try:
        ran = zygote.run(CASE.to_json(), dict(os.environ), timeout)
    finally:
        zygote.close()
    return classify(ran, CASE.timeout, CASE.startup_timeout), ran.out, ran.err


def test_a_forked_worker_that_crashes_is_a_crash(tmp_path):
    outcome, _, _ = run_planted(tmp_path, "os.kill(os.getpid(), signal.SIGSEGV)")
    assert outcome.verdict == "CRASH" and "SIGSEGV" in outcome.detail


def test_a_forked_worker_that_hangs_after_its_result_is_killed_with_all_it_started(tmp_path):
    pids = tmp_path / "pids"
    body = ("on_probe_start(30.0)\n"
            "child = subprocess.Popen(['sleep', '1000'])\n"
            f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
            "threading.Thread(target=time.sleep, args=(1000,)).start()  # the exit waits for it\n"
            f"{RESULT}")
    outcome, out, err = run_planted(tmp_path, body, timeout=2.0)
    assert outcome.verdict == "HANG" and "after the probe" in outcome.detail, outcome.detail
    assert "the probe had reported PASS: ok" in outcome.detail and PHASE_PROBE in err
    time.sleep(0.2)
    for pid in map(int, pids.read_text().split()):
        assert not alive(pid), f"process {pid} outlived its case"


@pytest.mark.parametrize("release, verdict, needle", [
    # an atexit handler that never returns
    ("import atexit\natexit.register(time.sleep, 1000)", "HANG", "after the probe"),
    # an object in a reference cycle whose finalizer crashes: the exit's collection runs it
    ("class Cycle:\n    def __del__(self):\n        os.kill(os.getpid(), signal.SIGSEGV)\n"
     "c = Cycle()\nc.me = c\ndel c", "CRASH", "SIGSEGV after the probe"),
    # a module of the case's own, whose teardown at the full shutdown crashes
    ("sys.modules['case_own'] = type(sys)('case_own')\n"
     "class Teardown:\n    def __del__(self):\n        os.kill(os.getpid(), signal.SIGSEGV)\n"
     "sys.modules['case_own'].held = Teardown()", "CRASH", "SIGSEGV after the probe"),
])
def test_a_forked_worker_is_watched_while_it_releases(tmp_path, release, verdict, needle):
    """A forked worker skips only the teardown of the zygote's own modules:
    its atexit handlers, its objects in cycles and modules it imported are
    released at its exit, and a hang or crash there is the verdict."""
    outcome, _, _ = run_planted(tmp_path, f"on_probe_start(2.0)\n{release}\n{RESULT}", timeout=6.0)
    assert outcome.verdict == verdict and needle in outcome.detail, outcome.detail
    assert "the probe had reported PASS: ok" in outcome.detail


def test_a_forked_worker_that_leaves_a_process_holding_its_pipes_ends_when_it_exits(tmp_path):
    pids = tmp_path / "pids"
    body = ("child = subprocess.Popen(['sleep', '1000'])  # holds the worker's stdout and stderr\n"
            f"open({str(pids)!r}, 'w').write(str(child.pid))\n{RESULT}")
    outcome, _, _ = run_planted(tmp_path, body, timeout=60.0)
    assert outcome.verdict == "PASS" and outcome.detail == "ok", outcome.detail  # not killed at the deadline
    assert not alive(int(pids.read_text()))


def test_the_watchdog_of_a_forked_worker_fires(tmp_path):
    outcome, _, err = run_planted(tmp_path, "on_probe_start(0.5)\ntime.sleep(30)", timeout=10.0)
    assert outcome.verdict == "HANG" and "watchdog fired after 2.0s" in outcome.detail
    assert "planted_run.py" in err  # the stacks say where it hung


def test_a_forked_worker_sees_the_case_environment_not_the_zygotes(tmp_path):
    zygote = planted_zygote(tmp_path, "print('SEEN', os.environ.get('KVPROBE_SEEN'), flush=True)\n"
                                      "raise SystemExit(0)")
    try:
        out = zygote.run(CASE.to_json(), {**os.environ, "KVPROBE_SEEN": "case"}, 10.0).out
    finally:
        zygote.close()
    assert "SEEN case" in out


def test_a_closed_zygote_still_reports_its_running_case_then_exits(tmp_path):
    zygote = planted_zygote(tmp_path, f"time.sleep(1)\n{RESULT}")
    found = {}

    def run():
        found["result"] = zygote.run(CASE.to_json(), dict(os.environ), 10.0)

    import threading

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.3)
    zygote.close(wait=0)
    thread.join()
    ran = found["result"]
    assert ran.returncode == 0 and not ran.killed and ran.heard.payloads("result")[0]["detail"] == "ok"
    zygote.proc.wait(5)
    with pytest.raises(forked.ZygoteUnavailable, match="did not fork"):
        zygote.run(CASE.to_json(), dict(os.environ), 1.0)
    zygote.close()


def test_a_zygote_whose_runner_died_removes_its_folder(tmp_path):
    zygote = planted_zygote(tmp_path, RESULT)
    assert os.path.exists(zygote.path)
    zygote.proc.stdin.close()  # what the runner's death does; it cannot remove the folder then
    zygote.proc.wait(10)
    assert not os.path.exists(zygote.dir)


@pytest.mark.parametrize("probe", ["roundtrip", "deferred_construction", "plan_binding", "host_budget"])
def test_forked_and_fresh_workers_give_the_same_verdicts(probe):
    row = MatrixRow("m", ShapeKey.parse("bf16[512,8,256]"), (probe,))
    case = next(c for c in build_cases(["v5e"], [row], probes=(probe,)) if c.probe == probe)
    forked_outcome = run_case(case).outcome
    fresh_outcome = run_case(case, python=sys.executable).outcome
    assert forked_outcome.verdict == fresh_outcome.verdict
    if probe != "host_budget":  # its detail holds a measured address-space growth
        assert forked_outcome.detail == fresh_outcome.detail
    assert forked_outcome.verdict in ("PASS", "REJECTED"), forked_outcome.detail
    assert json.dumps(forked_outcome.to_dict())  # a whole outcome came back


def test_a_zygote_let_go_for_a_newer_one_is_reaped_once_it_exits(monkeypatch):
    """Past KEPT zygotes the least recently used is closed; once it exits it
    is waited for at the next zygote asked for, not left a zombie until the
    session ends (a team's long pytest run)."""
    monkeypatch.setattr(forked, "KEPT", 1)
    old = forked.zygote_for(sys.executable, CASE.iut, (), {**os.environ, "KVPROBE_ZYGOTE_TEST": "old"})
    forked.zygote_for(sys.executable, CASE.iut, (), {**os.environ, "KVPROBE_ZYGOTE_TEST": "new"})
    pid = old.proc.pid
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not _zombie(pid):
        time.sleep(0.05)
    assert _zombie(pid), "the closed zygote did not exit"
    forked.zygote_for(sys.executable, CASE.iut, (), {**os.environ, "KVPROBE_ZYGOTE_TEST": "new"})
    assert not os.path.exists(f"/proc/{pid}") and not os.path.exists(old.dir)
    forked.close_all()


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return False


def test_an_interrupt_while_a_zygote_starts_ends_it_and_any_worker_started_after(tmp_path):
    # Ctrl-C in the first seconds of a run: the zygote still importing was not a live worker, so
    # the interrupted run waited READY_SECONDS for it, and then started a fresh worker in its place.
    slow = tmp_path / "python"
    slow.write_text("#!/bin/sh\nexec sleep 3600\n")  # an interpreter that never says it is ready
    slow.chmod(0o755)
    interrupt = threading.Timer(1.0, forked.kill_live)
    interrupt.start()
    started = time.monotonic()
    try:
        with pytest.raises(forked.ZygoteUnavailable):
            forked.Zygote(str(slow), "kvref-sim", (), dict(os.environ))
        assert time.monotonic() - started < forked.READY_SECONDS / 4
        late = forked.run_watched([str(slow)], "", 600)  # what the runner starts in the zygote's place
        assert late.killed or late.returncode != 0
        assert time.monotonic() - started < forked.READY_SECONDS / 4
    finally:
        interrupt.cancel()
        forked.resume()
