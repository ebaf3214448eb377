"""The runner: one verdict per case, and no worker outlives its run."""

import dataclasses
import os
import stat
import subprocess
import sys
import threading
import time
from importlib import metadata

import pytest

from kvref import ShapeKey
from kvref.oracle import device_kind
from probes.run.channel import DESCRIBED, PHASE, RESULT as RESULT_KIND, Heard
from probes.run import forked
from probes.run.forked import Ran
from probes.run.runner import classify, run_case, run_cases
from probes.suite.cases import Case
from probes.suite.matrix import build_cases


def fake_python(tmp_path, body: str) -> str:
    """An interpreter stand-in that ignores its arguments and runs `body`."""
    path = tmp_path / "python"
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def real_worker(tmp_path, patch: str) -> str:
    """An interpreter stand-in that runs the real worker after `patch`, which
    may change what it runs through `p` (probes.run.probe_case)."""
    (tmp_path / "planted.py").write_text("import runpy\nimport probes.run.probe_case as p\n" + patch +
                                         "runpy.run_module('probes.run.worker', run_name='__main__')\n")
    return fake_python(tmp_path, f'exec {sys.executable} {tmp_path / "planted.py"}')


def said(kind: str, payload: str = "null") -> str:
    """A stand-in worker's line saying `kind` over its verdict channel, after
    it read the channel's token (TOKEN)."""
    return f"""printf '{{"token": "%s", "kind": "{kind}", "payload": {payload}}}\\n' "$token" >&$KVPROBE_CHANNEL_FD"""


TOKEN = "read -r token"  # the verdict channel's token: the first line on a worker's stdin
PROBING = f"{TOKEN}\n{said(PHASE)}"  # a stand-in worker whose start-up is over
SHAPE = ShapeKey("bf16", (512, 16, 2048))


def test_unresponsive_worker_costs_its_limits_plus_a_second_and_leaves_nothing(tmp_path):
    pids = tmp_path / "pids"
    python = fake_python(tmp_path, f"{PROBING}\nsleep 1000 & echo $! >> {pids}\necho $$ >> {pids}\n"
                                   "trap '' TERM\nwait")
    c = Case("roundtrip", "tpu7x", shape=SHAPE, timeout=1.0, startup_timeout=0.5)
    result = run_case(c, python=python)
    assert result.outcome.verdict == "HANG" and "no answer in 1.0s; killed" in result.outcome.detail
    time.sleep(0.2)
    for pid in map(int, pids.read_text().split()):
        assert not alive(pid), f"process {pid} outlived its case"


def test_crashing_worker_is_a_crash(tmp_path):
    python = fake_python(tmp_path, "kill -SEGV $$")
    result = run_case(Case("roundtrip", "tpu7x", timeout=5.0), python=python)
    assert result.outcome.verdict == "CRASH" and "SIGSEGV" in result.outcome.detail


def test_a_worker_that_dies_in_its_probe_keeps_what_it_said_of_the_iut(tmp_path):
    """The worker names the IUT (version, backend, device kind) before the
    probe runs: a crash or hang in the probe keeps it, as a result would."""
    python = real_worker(tmp_path, "import os, signal\n"
                                   "declared = p.probe\n"
                                   "class Dies:\n"
                                   "    def __init__(self, name):\n"
                                   "        self.address_space_headroom = declared(name).address_space_headroom\n"
                                   "    def run(self, case, iut):\n"
                                   "        os.kill(os.getpid(), signal.SIGSEGV)\n"
                                   "p.probe = Dies\n")
    case = build_cases(["tpu7x"], [], probes=("plan_binding",), timeout=10.0)[0]
    outcome = run_case(case, python=python).outcome
    assert outcome.verdict == "CRASH" and "SIGSEGV" in outcome.detail, outcome.detail
    assert (outcome.iut_version, outcome.backend, outcome.device_kind) == \
        (metadata.version("kvref"), "sim", device_kind("tpu7x"))
    heard = Heard([{"kind": DESCRIBED, "payload": {"iut_version": "1.2", "backend": "jax-cpu", "device_kind": "cpu"}},
                   {"kind": PHASE}])
    outcome = classify(Ran(1, "", "Timeout (0:00:02)!\n", False, heard), timeout=2.0)
    assert (outcome.verdict, outcome.iut_version, outcome.device_kind) == ("HANG", "1.2", "cpu")
    assert classify(Ran(-11, "", "", False, Heard()), timeout=2.0).device_kind == ""  # nothing said: nothing kept


def test_exit_without_result_is_an_error(tmp_path):
    python = fake_python(tmp_path, "echo 'ImportError: no probes' >&2; exit 3")
    result = run_case(Case("roundtrip", "tpu7x", timeout=5.0), python=python)
    assert result.outcome.verdict == "ERROR" and "exited 3" in result.outcome.detail
    assert "ImportError: no probes" in result.outcome.detail


def test_classify_watchdog_exit():
    err = "Timeout (0:00:02)!\nThread 0x1 (most recent call first):\n  File \"x.py\", line 1 in f\n"
    outcome = classify(Ran(1, "", err, False, Heard([{"kind": PHASE}])), timeout=2.0)
    assert outcome.verdict == "HANG" and "watchdog fired after 2.0s" in outcome.detail and "x.py" in outcome.detail


def test_a_hang_in_start_up_is_reported_as_start_up(tmp_path):
    """A worker stuck before its probe starts (a cold TPU runtime, an import)
    has the start-up limit, and the verdict says it was start-up."""
    err = "Timeout (0:05:00)!\nThread 0x1 (most recent call first):\n  File \"libtpu.py\", line 9 in init\n"
    outcome = classify(Ran(1, "", err, False, Heard()), timeout=30.0, startup_timeout=300.0)
    assert outcome.verdict == "HANG" and "start-up" in outcome.detail and "300.0s" in outcome.detail
    python = fake_python(tmp_path, "sleep 30")  # killed at its start-up limit, not after its 30 s
    outcome = run_case(Case("roundtrip", "tpu7x", shape=SHAPE, timeout=0.5, startup_timeout=1.0),
                       python=python).outcome
    assert outcome.verdict == "HANG" and outcome.detail.startswith("start-up") and "did not finish in 1.0s" in outcome.detail


def test_the_real_worker_gives_start_up_its_own_limit(tmp_path):
    """The worker's start-up may take longer than the probe's limit: a start-up
    of 2 s under a 1 s probe limit still runs the probe."""
    python = real_worker(tmp_path, "import time\n"
                                   "_run = p.run_case_here\n"
                                   "def slow(text, on_probe_start):\n"
                                   "    time.sleep(2)\n"
                                   "    return _run(text, on_probe_start)\n"
                                   "p.run_case_here = slow\n")
    case = build_cases(["tpu7x"], [], probes=("plan_binding",), timeout=10.0)[0]
    case = dataclasses.replace(case, startup_timeout=5.0)
    assert run_case(case, python=python).outcome.verdict == "PASS"
    outcome = run_case(dataclasses.replace(case, startup_timeout=1.0), python=python).outcome
    assert outcome.verdict == "HANG" and outcome.detail.startswith("start-up") and "slow" in outcome.detail


def test_parallel_runs_keep_input_order():
    cases = build_cases(("v3", "v4", "v5e", "tpu7x"), [], probes=("plan_binding",))
    results = run_cases(cases, jobs=2)
    assert [r.case.generation for r in results] == ["v3", "v4", "v5e", "tpu7x"]
    assert all(r.outcome.verdict == "PASS" for r in results)


def test_unknown_iut_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="unknown implementation under test 'nope'"):
        run_case(Case("roundtrip", "tpu7x", iut="nope", shape=ShapeKey("bf16", (512, 16, 2048))))


def test_peer_cases_skip_without_the_peer_environment(monkeypatch):
    monkeypatch.setenv("KVPROBE_PEER_PYTHON", "/nonexistent/python")
    result = run_case(Case("roundtrip", "cpu", iut="tpu-sync-jax", shape=ShapeKey("f32", (64, 128))))
    assert result.outcome.verdict == "SKIP" and "kvprobe peer-env" in result.outcome.detail


RESULT = said(RESULT_KIND, '{"verdict": "PASS", "detail": "2 blocks round-tripped"}')


@pytest.mark.parametrize("teardown, verdict, needle", [
    ("kill -SEGV $$", "CRASH", "killed by SIGSEGV after the probe"),
    ("exit 134", "CRASH", "exited 134 after the probe"),
    ("echo 'Timeout (0:00:02)!' >&2; echo 'File \"teardown.py\"' >&2; exit 1", "HANG",
     "watchdog fired after 2.0s after the probe"),
    ("sleep 30", "HANG", "no answer in 2.0s after the probe; killed"),
])
def test_a_failure_after_the_result_line_is_the_verdict(tmp_path, teardown, verdict, needle):
    """A worker that reports PASS and then crashes, fails or hangs while it
    releases arrays and managers earns CRASH or HANG, not the PASS it printed."""
    python = fake_python(tmp_path, f"{PROBING}\n{RESULT}\n{teardown}")
    outcome = run_case(Case("roundtrip", "tpu7x", shape=SHAPE, timeout=2.0, startup_timeout=1.0),
                       python=python).outcome
    assert outcome.verdict == verdict, outcome.detail
    assert needle in outcome.detail and "the probe had reported PASS: 2 blocks round-tripped" in outcome.detail


def test_what_a_worker_leaves_holding_its_pipes_goes_when_it_exits(tmp_path):
    """A worker that exits leaving a process of its own holding its stdout
    ends there: that process is killed and the case keeps its verdict, not a
    kill at the deadline (a minute away here)."""
    pids = tmp_path / "pids"
    python = fake_python(tmp_path, f"{TOKEN}\n{RESULT}\nsleep 1000 &\necho $! > {pids}\nexit 0")
    case = Case("roundtrip", "tpu7x", shape=SHAPE, timeout=30.0, startup_timeout=30.0)
    outcome = run_case(case, python=python).outcome
    assert outcome.verdict == "PASS" and outcome.detail == "2 blocks round-tripped", outcome.detail
    assert not alive(int(pids.read_text()))


def group_left_behind(command: str) -> tuple[int, int]:
    """(the group, the pid of `command`) once the group's leader has exited and
    been reaped, leaving `command` running in the group."""
    leader = subprocess.Popen(["sh", "-c", f"{command} > /dev/null & echo $!"], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    member = int(leader.stdout.readline())
    leader.communicate()
    return leader.pid, member


def test_a_group_ends_when_each_member_has_exited_not_when_its_kill_is_queued(monkeypatch):
    """After its kill a group is waited on: here no kill arrives and the member
    ends by itself a moment later; end_group returns only after that."""
    monkeypatch.setattr(forked, "kill_group", lambda pid: None)
    group, member = group_left_behind("sleep 0.5")
    forked.end_group(group)
    assert not alive(member)


def test_a_group_that_does_not_end_is_waited_on_for_a_bounded_time(monkeypatch):
    monkeypatch.setattr(forked, "kill_group", lambda pid: None)
    monkeypatch.setattr(forked, "DRAIN_SECONDS", 0.2)
    group, member = group_left_behind("sleep 1000")
    try:
        forked.end_group(group)  # returns, the member still running
        assert alive(member)
    finally:
        os.kill(member, 9)


def test_a_clean_exit_keeps_the_reported_verdict(tmp_path):
    python = fake_python(tmp_path, f"{TOKEN}\n{RESULT}\nexit 0")
    outcome = run_case(Case("roundtrip", "tpu7x", shape=ShapeKey("bf16", (512, 16, 2048)), timeout=5.0),
                       python=python).outcome
    assert outcome.verdict == "PASS" and outcome.detail == "2 blocks round-tripped"


def test_the_real_worker_watches_its_own_teardown(tmp_path):
    """The worker leaves its watchdog armed through interpreter exit: a
    non-daemon thread that never ends keeps the process from exiting after
    the result line, and that is a HANG with the thread's stack."""
    (tmp_path / "stuck_worker.py").write_text(
        "import runpy, threading, time\n"
        "def stuck_at_exit():\n    time.sleep(3600)\n"
        "threading.Thread(target=stuck_at_exit).start()\n"
        "runpy.run_module('probes.run.worker', run_name='__main__')\n")
    python = fake_python(tmp_path, f'exec {sys.executable} {tmp_path / "stuck_worker.py"}')
    case = Case("plan_binding", "tpu7x", shape=ShapeKey("bf16", (512, 8, 2048)), timeout=4.0)
    outcome = run_case(case, python=python).outcome
    assert outcome.verdict == "HANG", outcome.detail
    assert "after the probe" in outcome.detail and "stuck_at_exit" in outcome.detail


def test_cases_that_wait_on_the_device_run_beside_the_others(monkeypatch):
    """Probe.waits sends a case to a pool of its own, so a step's sleep never
    holds a computing case's place; results still come in input order, and a
    single job (a device-owning run) keeps one pool."""
    from probes.run import runner
    from probes.suite.registry import probe

    def record(case, python=None):
        return threading.current_thread().name

    monkeypatch.setattr(runner, "run_case", record)
    cases = build_cases(["v5e"], [], probes=("plan_binding", "inflight_step", "serving_step"))
    waits = [probe(c.probe).waits for c in cases]
    assert sorted(waits) == [False, False, True]
    threads = run_cases(cases, jobs=2)
    assert [t.split("_")[0] for t in threads] == ["waiting" if w else "working" for w in waits]
    assert {t.split("_")[0] for t in run_cases(cases, jobs=1)} == {"working"}


def test_a_two_process_case_forks_both_workers_from_the_zygote_unless_it_reads_its_network(monkeypatch):
    """Both workers of a pull forked from the IUT's warm zygote, sharing its
    network namespace; a probe that reads its namespace's counters gets one
    of its own, fresh."""
    from probes.run import runner as watched
    from probes.suite.registry import probe as declared

    def no(*_):
        raise AssertionError("this path must not be taken")
    forked = Case("pull_blocks", "tpu7x", "kvref-sim", "pull_blocks-subset", declared("pull_blocks").subject,
                  timeout=30.0, kind="subset")
    own = Case("pull_failures", "tpu7x", "kvref-sim", "pull_failures-connection_refused",
               declared("pull_failures").subject, timeout=30.0, kind="connection_refused")
    monkeypatch.setattr(watched, "_fresh_pair", no)
    assert watched.run_case(forked).outcome.verdict == "PASS"
    monkeypatch.undo()
    monkeypatch.setattr(watched, "_forked_pair", no)
    assert watched.run_case(own).outcome.verdict == "PASS"


def test_a_side_that_cannot_start_lets_the_other_stop_waiting_at_once(monkeypatch, tmp_path):
    """A two-process case whose consumer's worker dies before it runs
    anything (here, its interpreter cannot find its standard library): the
    producer hears that the consumer is done and stops waiting for it,
    rather than waiting out its limit for what will never be posted."""
    from probes.run import runner as watched
    from probes.suite.registry import probe as declared

    real = watched.side_environments

    def consumer_cannot_start(iut, env, sides):
        producer, consumer = real(iut, env, sides)
        return [producer, {**consumer, "PYTHONHOME": str(tmp_path / "no-python-here")}]
    monkeypatch.setattr(watched, "side_environments", consumer_cannot_start)
    monkeypatch.setattr(watched, "_forked_pair", lambda *_: None)  # fresh workers, each with its own environment
    case = Case("pull_blocks", "tpu7x", "kvref-sim", "pull_blocks-subset", declared("pull_blocks").subject,
                timeout=600.0, kind="subset")
    found = watched.run_case(case)
    assert found.outcome.verdict != "PASS"
    assert "the consumer finished its side without posting" in found.outcome.detail, found.outcome.detail[-2000:]


def test_a_copy_of_the_environment_survives_a_key_going_while_it_is_read(monkeypatch):
    """pytest unsets PYTEST_CURRENT_TEST from its main thread while the
    plugin prepares cases on others: the copy is read again, never a KeyError."""
    import os

    from probes.iut import launch

    real, calls = os.environ.__class__.__getitem__, []

    def vanishing(self, key):  # the first read of one key finds it gone, as if unset midway
        if key == "KVPROBE_GOING" and not calls:
            calls.append(key)
            raise KeyError(key)
        return real(self, key)

    monkeypatch.setenv("KVPROBE_GOING", "1")
    monkeypatch.setattr(os.environ.__class__, "__getitem__", vanishing)
    assert launch.environ_now()["KVPROBE_GOING"] == "1" and calls == ["KVPROBE_GOING"]
