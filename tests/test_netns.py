"""The production library's workers, reproducers and benchmark run in a
network namespace of their own with only lo (probes.run.netns); every other
IUT's workers run as before; where no such namespace can be made, the cases
of a loopback_only IUT are SKIP with the reason, and nothing is started."""

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvref import ShapeKey
from probes.fuzz.sequences import addressable_shapes, random_sequence
from probes.iut import registry
from probes.iut.peer_env import PEER_ENVS
from probes.run import fuzz_command, netns, runner
from probes.run.fuzz_command import Finding
from probes.run.runner import CaseResult, run_case
from probes.suite.cases import Case
from probes.suite.matrix import build_cases, load_matrix
from probes.suite.verdicts import SKIP, Outcome

LOOPBACK_IUTS = ("tpu-sync-jax", "tpu-sync-jax-tpu", "tpu-sync-torch-tpu")

# A worker's probe, wrapped to say what network the worker saw (imported by
# the interpreter at start-up, so fresh and forked workers both have it).
SEEN = """\
import probes.run.probe_case as _case
from probes.run import netns as _netns

_run = _case.run_case_here


def _seen(text, on_probe_start=lambda timeout: None):
    outcome = _run(text, on_probe_start)
    outcome.detail += f" SEEN[{' '.join(_netns.interfaces())}; lo {'up' if _netns.lo_is_up() else 'down'}]"
    return outcome


_case.run_case_here = _seen
"""
ONLY_LO = "SEEN[lo; lo up]"
HOST = f"SEEN[{' '.join(netns.interfaces())}; lo up]"  # what this process sees
CASE = build_cases(["tpu7x"], [], probes=("plan_binding",), timeout=10.0)[0]  # kvref-sim


def seen_path(tmp_path) -> str:
    """A PYTHONPATH whose sitecustomize reports what each worker sees."""
    (tmp_path / "sitecustomize.py").write_text(SEEN)
    return os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)


def standin(monkeypatch, tmp_path, loopback_only: bool) -> None:
    """kvref-sim as the parent sees it: loopback_only or not, its workers
    reporting what they see. (A worker runs the real kvref-sim.)"""
    declared = dataclasses.replace(registry.iut("kvref-sim"), loopback_only=loopback_only,
                                   environment=(("PYTHONPATH", seen_path(tmp_path)),))
    monkeypatch.setitem(registry.RESOLVED, "kvref-sim", declared)


@pytest.fixture
def started(monkeypatch):
    """The commands of every process started while the test runs."""
    commands, popen = [], subprocess.Popen

    def spy(args, *rest, **options):
        commands.append(list(args))
        return popen(args, *rest, **options)

    monkeypatch.setattr(subprocess, "Popen", spy)
    return commands


def needs_namespace():
    if netns.unavailable():
        pytest.skip(netns.unavailable())


def test_the_production_library_and_its_builds_are_loopback_only():
    for name in LOOPBACK_IUTS:
        assert registry.iut(name).loopback_only, name
    assert registry.iut("tpu-sync-jax==0.0.1rc20260101000000").loopback_only  # a build inherits it
    assert not any(i.loopback_only for n, i in registry.usable_iuts().items() if n not in LOOPBACK_IUTS)


def test_a_namespace_has_only_lo_and_brings_it_up():
    needs_namespace()
    done = subprocess.run(["unshare", "-rn", sys.executable, "-m", "probes.run.netns", "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["lo", "up"], done.stderr
    # A bare `unshare -rn` leaves lo down: the entry brings it up.
    bare = subprocess.run(["unshare", "-rn", sys.executable, "-c",
                           "from probes.run import netns; print(netns.interfaces(), netns.lo_is_up())"],
                          capture_output=True, text=True, timeout=60)
    assert bare.stdout.split() == ["['lo']", "False"], bare.stderr


@pytest.mark.parametrize("fresh", [False, True], ids=["forked", "fresh"])
def test_a_loopback_only_worker_sees_no_interface_but_lo(monkeypatch, tmp_path, started, fresh):
    needs_namespace()
    standin(monkeypatch, tmp_path, loopback_only=True)
    result = run_case(CASE, python=sys.executable if fresh else None)
    assert result.outcome.verdict == "PASS", result.outcome.detail
    assert result.outcome.detail.endswith(ONLY_LO), result.outcome.detail
    module = "probes.run.worker" if fresh else "probes.run.zygote"
    assert any(c[:2] == [shutil.which("unshare"), "-rn"] and c[3:6] == ["-m", "probes.run.netns", module]
               for c in started), started
    if not fresh:  # forked by the namespaced zygote, over its socket's path: no fresh fallback
        assert not any(runner.WORKER in c for c in started), started


@pytest.mark.parametrize("fresh", [False, True], ids=["forked", "fresh"])
def test_every_other_worker_runs_as_before(monkeypatch, tmp_path, started, fresh):
    standin(monkeypatch, tmp_path, loopback_only=False)
    result = run_case(CASE, python=sys.executable if fresh else None)
    assert result.outcome.verdict == "PASS" and result.outcome.detail.endswith(HOST), result.outcome.detail
    assert all("unshare" not in c[0] and "probes.run.netns" not in c for c in started), started
    if fresh:
        assert started == [[sys.executable, "-m", runner.WORKER]]
    else:
        assert [c[:3] for c in started] in ([], [[sys.executable, "-m", "probes.run.zygote"]]), started


def test_the_namespaced_zygote_is_not_the_plain_one(monkeypatch, tmp_path):
    needs_namespace()
    standin(monkeypatch, tmp_path, loopback_only=False)
    plain = run_case(CASE).outcome.detail
    standin(monkeypatch, tmp_path, loopback_only=True)  # same interpreter, preload and environment
    namespaced = run_case(CASE).outcome.detail
    standin(monkeypatch, tmp_path, loopback_only=False)
    assert plain.endswith(HOST) and namespaced.endswith(ONLY_LO) and run_case(CASE).outcome.detail.endswith(HOST)


REASON = "no loopback-only network namespace can be made here: planted"


@pytest.mark.parametrize("fresh", [False, True], ids=["forked", "fresh"])
def test_without_a_namespace_the_cases_skip_and_nothing_runs(monkeypatch, tmp_path, started, fresh):
    monkeypatch.setattr(netns, "unavailable", lambda: REASON)
    standin(monkeypatch, tmp_path, loopback_only=True)
    result = run_case(CASE, python=sys.executable if fresh else None)
    assert (result.outcome.verdict, result.outcome.detail) == (SKIP, f"kvref-sim: {REASON}")
    production = next(c for c in build_cases(["cpu"], load_matrix("cpu"), ("roundtrip",), "tpu-sync-jax"))
    if PEER_ENVS["jax"].python() is not None:  # else it is SKIP for the missing environment
        assert run_case(production).outcome == Outcome(SKIP, f"tpu-sync-jax: {REASON}")
    assert started == []


def test_the_reason_when_unshare_is_missing(tmp_path):
    done = subprocess.run([sys.executable, "-c", "from probes.run import netns; print(netns.unavailable())"],
                          capture_output=True, text=True, env={**os.environ, "PATH": str(tmp_path)})
    assert done.stdout.strip() == ("no loopback-only network namespace can be made here: "
                                   "`unshare` (util-linux) is not installed"), done.stderr


def sequence_case(name: str, generation: str, calls: list | None = None) -> Case:
    """A random call sequence, as `kvprobe fuzz` makes them (or its first `calls`)."""
    spec = random_sequence(np.random.default_rng([0, 0]), addressable_shapes(name, generation))
    spec = {**spec, "calls": spec["calls"] if calls is None else calls}
    return Case("call_sequence", generation, name, "fuzz-0-0", ShapeKey.parse(spec["shape"]),
                timeout=30.0, startup_timeout=registry.iut(name).startup_seconds, calls=spec)


def reproducer(tmp_path, case: Case) -> str:
    """The reproducer `kvprobe fuzz` would write for `case`."""
    finding = Finding(CaseResult(case, Outcome("CORRUPT", "planted"), 0.0), case.case_id)
    return fuzz_command.write_reproducer(finding, tmp_path / "findings")


def test_a_reproducer_enters_the_namespace_before_anything_else():
    text = fuzz_command.REPRODUCER.format(
        title="t", iut="tpu-sync-jax", found_in="f", calls=1, detail="d", python="p", path="x",
        platforms="cpu", timeout=1, case="{}", namespace=fuzz_command.NAMESPACE)
    enter = text.index("NO_NAMESPACE = netns.enter()")
    assert enter < text.index("from probes.run.probe_case") and enter < text.index("faulthandler.dump")
    assert text.index("sys.exit(netns.SKIP_EXIT)") < text.index("from probes.run.probe_case")


def test_a_reproducer_of_another_iut_is_unchanged(tmp_path):
    text = reproducer(tmp_path, sequence_case("kvref-sim", "tpu7x")).read_text()
    assert "netns" not in text and "import sys\n\nos.environ.setdefault(" in text


def test_a_written_reproducer_runs_in_the_namespace_or_skips(monkeypatch, tmp_path):
    needs_namespace()
    standin(monkeypatch, tmp_path, loopback_only=True)  # as kvref-sim's would be written
    script = reproducer(tmp_path, sequence_case("kvref-sim", "tpu7x"))
    assert "netns.enter()" in script.read_text()
    env = {**os.environ, "PYTHONPATH": seen_path(tmp_path)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env=env, cwd="/")
    assert done.returncode == 0 and done.stdout.startswith("PASS") and ONLY_LO in done.stdout, \
        done.stdout + done.stderr
    # Where no namespace can be made (here: no unshare on the PATH), it runs nothing.
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**env, "PATH": str(tmp_path)}, cwd="/")
    assert done.returncode == netns.SKIP_EXIT and done.stdout.startswith("SKIP no loopback-only"), \
        done.stdout + done.stderr
    assert "SEEN[" not in done.stdout


@pytest.fixture(scope="module")
def peer_python():
    python = PEER_ENVS["jax"].python()
    if python is None:
        pytest.skip(PEER_ENVS["jax"].missing())
    needs_namespace()
    return str(python)


def production_case() -> Case:
    return next(c for c in build_cases(["cpu"], load_matrix("cpu"), ("roundtrip",), "tpu-sync-jax"))


@pytest.mark.peer
@pytest.mark.parametrize("fresh", [False, True], ids=["forked", "fresh"])
def test_a_production_worker_sees_no_interface_but_lo(monkeypatch, tmp_path, peer_python, fresh):
    declared = dataclasses.replace(registry.iut("tpu-sync-jax"),
                                   environment=(("PYTHONPATH", seen_path(tmp_path)),))
    monkeypatch.setitem(registry.RESOLVED, "tpu-sync-jax", declared)
    result = run_case(production_case(), python=peer_python if fresh else None)
    assert result.outcome.verdict == "PASS", result.outcome.detail
    assert result.outcome.detail.endswith(ONLY_LO), result.outcome.detail
    assert result.outcome.iut_version == PEER_ENVS["jax"].version


@pytest.mark.peer
def test_a_production_reproducer_runs_in_the_namespace(tmp_path, peer_python):
    # One block out and back in (the library crashes on longer random sequences: a finding).
    calls = [{"d2h": True, "src": [1], "dst": [1], "sizes": None},
             {"d2h": False, "src": [1], "dst": [2], "sizes": None}]
    script = reproducer(tmp_path, sequence_case("tpu-sync-jax", "cpu", calls))
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": seen_path(tmp_path)}
    done = subprocess.run([peer_python, str(script)], capture_output=True, text=True, timeout=300,
                          env=env, cwd="/")
    # Whatever verdict the library earns on the sequence, it earned it in the namespace.
    assert ONLY_LO in done.stdout and not done.stdout.startswith("SKIP"), done.stdout + done.stderr[-2000:]


@pytest.mark.peer
def test_the_benchmark_measures_the_production_library_in_the_namespace(peer_python):
    code = ("import sys\nfrom probes.bench import peer\nfrom probes.run import netns\n"
            "peer.main(['--repeats', '1', '--layers', '1'])\n"
            "print('SEEN', netns.interfaces(), netns.lo_is_up())\n")
    done = subprocess.run([peer_python, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tpu-sync-jax" in done.stdout and "SKIP" not in done.stdout and "ratio" in done.stdout
    assert "SEEN ['lo'] True" in done.stdout, done.stdout


def test_every_committed_reproducer_enters_the_namespace_before_the_library():
    """Each finding script under reports/ runs the production library only
    inside a loopback-only namespace: netns.enter() comes before anything
    that imports tpu_sync (directly, or through the harness's worker)."""
    scripts = sorted(Path(__file__).resolve().parents[1].glob("reports/*/findings/*.py"))
    assert scripts
    for script in scripts:
        text = script.read_text()
        loads = [i for i in (text.find("tpu_sync"), text.find("run_case_here")) if i >= 0]
        if not loads:
            continue
        entered = text.find("netns.enter()")
        assert 0 <= entered < min(loads), f"{script.name} imports the library outside a namespace"


def test_both_workers_of_a_two_process_case_share_one_loopback_only_namespace(monkeypatch, tmp_path):
    """A pull probe's producer and consumer see only lo, and reach each other there."""
    needs_namespace()
    standin(monkeypatch, tmp_path, loopback_only=True)
    case = Case("pull_blocks", "tpu7x", "kvref-sim", "pull_blocks-subset", ShapeKey("bf16", (256, 8, 1024)),
                timeout=30.0, kind="subset")
    outcome = run_case(case).outcome
    assert outcome.verdict == "PASS", outcome.detail
    assert outcome.detail.count("SEEN[") == outcome.detail.count(ONLY_LO) == 2, outcome.detail
