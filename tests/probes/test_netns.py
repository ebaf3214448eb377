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
from probes.run import findings, netns, reproducers, runner
from probes.run.runner import run_case
from probes.suite.cases import Case
from probes.suite.matrix import build_cases, load_matrix
from probes.suite.verdicts import SKIP, Outcome
from tests.probes.test_findings import imported

LOOPBACK_IUTS = ("tpu-sync-jax", "tpu-sync-jax-tpu", "tpu-sync-torch-tpu")

# A worker's probe, wrapped to say what network the worker saw (imported by
# the interpreter at start-up, so fresh and forked workers both have it).
SEEN = """\
import probes.run.probe_case as _case
from probes.run import netns as _netns

_run = _case.run_case_here


def _seen(text, on_probe_start=lambda timeout, described=None: None):
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


def reproducer(tmp_path, case: Case) -> Path:
    """The reproducer `kvprobe fuzz --reproducer` renders of the finding
    `kvprobe fuzz` would keep for `case`."""
    finding = findings.write_finding(case, "CORRUPT", "planted", "", case.case_id, tmp_path / "findings")
    script = tmp_path / "reproducer.py"
    script.write_text(reproducers.render(finding))
    return script


def test_a_reproducer_enters_the_namespace_before_anything_else(monkeypatch, tmp_path):
    """The production library's reproducer, and one replaying through the
    harness for any loopback_only IUT: the opening first, then the library."""
    alone = reproducers.replay(sequence_case("tpu-sync-jax", "cpu"))
    standin(monkeypatch, tmp_path, loopback_only=True)
    harness = reproducers.replay(sequence_case("kvref-sim", "tpu7x"))
    for text, library in ((alone, "from tpu_sync"), (harness, "from probes.run.probe_case")):
        assert text.startswith(reproducers.opening())
        assert text.index("sys.exit(SKIP_EXIT)") < text.index(library) and "faulthandler.dump" not in netns.opening()
    assert not {m for m in imported(alone) if m in ("probes", "kvref")}


def test_a_reproducer_of_another_iut_is_unchanged(tmp_path):
    text = reproducer(tmp_path, sequence_case("kvref-sim", "tpu7x")).read_text()
    assert "netns" not in text and "import sys\n\nos.environ.setdefault(" in text


def test_a_written_reproducer_runs_in_the_namespace_or_skips(monkeypatch, tmp_path):
    needs_namespace()
    standin(monkeypatch, tmp_path, loopback_only=True)  # as kvref-sim's would be written
    script = reproducer(tmp_path, sequence_case("kvref-sim", "tpu7x"))
    assert script.read_text().split('"""\n\n', 1)[1].startswith(reproducers.opening())
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


# What a process saw at its exit: a reproducer replaying against the library
# alone runs none of the harness's code to report it.
SEEN_AT_EXIT = """\
import atexit


def _seen():
    from probes.run import netns
    print(f"SEEN[{' '.join(netns.interfaces())}; lo {'up' if netns.lo_is_up() else 'down'}]", flush=True)


atexit.register(_seen)
"""


@pytest.mark.peer
def test_a_production_reproducer_runs_in_the_namespace(tmp_path, peer_python):
    # One block out and back in (the library crashes on longer random sequences: a finding).
    calls = [{"d2h": True, "src": [1], "dst": [1], "sizes": None},
             {"d2h": False, "src": [1], "dst": [2], "sizes": None}]
    script = reproducer(tmp_path, sequence_case("tpu-sync-jax", "cpu", calls))
    (tmp_path / "seen").mkdir()
    (tmp_path / "seen" / "sitecustomize.py").write_text(SEEN_AT_EXIT)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(tmp_path / "seen")}
    done = subprocess.run([peer_python, str(script)], capture_output=True, text=True, timeout=300,
                          env=env, cwd="/")
    # The sequence held to the model, and it ran in the namespace.
    assert done.returncode == 0 and done.stdout.startswith("PASS 2 calls held to the model"), \
        done.stdout + done.stderr[-2000:]
    assert ONLY_LO in done.stdout, done.stdout


@pytest.mark.peer
def test_the_benchmark_measures_the_production_library_in_the_namespace(peer_python):
    code = ("import sys\nfrom probes.bench import peer\nfrom probes.run import netns\n"
            "peer.main(['--repeats', '1', '--layers', '1'])\n"
            "print('SEEN', netns.interfaces(), netns.lo_is_up())\n")
    done = subprocess.run([peer_python, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tpu-sync-jax" in done.stdout and "SKIP" not in done.stdout and "ratio" in done.stdout
    assert "SEEN ['lo'] True" in done.stdout, done.stdout


def test_both_workers_of_a_two_process_case_share_one_loopback_only_namespace(monkeypatch, tmp_path):
    """A pull probe's producer and consumer see only lo, and reach each other there."""
    needs_namespace()
    standin(monkeypatch, tmp_path, loopback_only=True)
    case = Case("pull_blocks", "tpu7x", "kvref-sim", "pull_blocks-subset", ShapeKey("bf16", (256, 8, 1024)),
                timeout=30.0, kind="subset")
    outcome = run_case(case).outcome
    assert outcome.verdict == "PASS", outcome.detail
    assert outcome.detail.count("SEEN[") == outcome.detail.count(ONLY_LO) == 2, outcome.detail


RAILS_SCRIPT = """
import os, socket
from probes.iut import standin_rails

read, write = os.pipe()
child = os.fork()
if child == 0:  # joins the namespace its parent makes, as a pull case's consumer joins the producer's
    os.close(write)
    pid = int(os.read(read, 32))
    standin_rails.join_namespace(pid)
    names = [line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]]
    with socket.socket() as s:
        s.bind(("10.233.1.1", 0))  # the second rail's own address
    print(sorted(names), flush=True)
    os._exit(0)
os.close(read)
standin_rails.enter_rails_namespace(2)
os.write(write, str(os.getpid()).encode())
_, status = os.waitpid(child, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


def test_a_rails_namespace_is_made_by_one_process_and_joined_by_another():
    """The stand-in data-plane NICs a pull case's two workers share
    (probes.iut.standin_rails), made inside a loopback-only namespace."""
    from probes.iut.standin_rails import cannot_make_interfaces
    from tests.peer_python import peer_python_or_skip

    python = peer_python_or_skip(PEER_ENVS["jax"])
    why = netns.unavailable()
    if why:
        pytest.skip(why)
    done = subprocess.run(netns.python_command(python, "-c", RAILS_SCRIPT), capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[2])
    if "no `ip` command" in (cannot_make_interfaces() or ""):
        pytest.skip(cannot_make_interfaces())
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["['kvrail0', 'kvrail0p', 'kvrail1', 'kvrail1p', 'lo']", "child 0"], \
        done.stdout + done.stderr[-2000:]
