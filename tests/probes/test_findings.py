"""Each finding's reproducer stands alone, hand-written
(reports/<generation>/findings/*.py) or rendered from a finding kept as data
(findings/blocks-*.json, `kvprobe fuzz --reproducer`): it starts with the one opening that puts it in a loopback-only network
namespace (probes.run.reproducers.opening, from probes.run.netns), imports
nothing but the library, jax, numpy and the standard library, prints SKIP and
exits 77 having imported nothing of the library where no namespace can be
made, and, run alone in the peer environment, fails as its finding says."""

import ast
import functools
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from probes.iut.peer_env import PEER_ENVS, REPO
from probes.run import netns, reproducers
from tests.batch import BATCH_SECONDS, selected
from tests.peer_python import peer_python_or_skip

HAND_WRITTEN = sorted(REPO.glob("reports/*/findings/*.py"))
KEPT = sorted(REPO.glob("reports/*/findings/blocks-*.json"))  # findings of `kvprobe fuzz --model blocks`
SCRIPTS = HAND_WRITTEN + KEPT  # a reproducer, or the finding it is rendered from
LIBRARY = {"tpu_sync", "jax", "numpy"}  # what a reproducer may import besides the standard library
# Put first on a reproducer's path: every import of the library or of this
# project says so and fails, so a test that runs one outside a namespace can
# see an attempt without the library ever running there.
BLOCKER = """\
import sys

class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tpu_sync", "probes", "kvref"):
            print("BLOCKED", name, file=sys.stderr, flush=True)
            raise ImportError(f"{name} is blocked in this test")
        return None

sys.meta_path.insert(0, _Blocked())
"""


@pytest.fixture(scope="module")
def script_of(tmp_path_factory):
    """The reproducer of each of SCRIPTS: itself, or the one its finding renders."""
    folder = tmp_path_factory.mktemp("rendered")

    def script(source: Path) -> Path:
        if source.suffix != ".json":
            return source
        rendered = folder / f"{source.stem}.py"
        if not rendered.exists():
            rendered.write_text(reproducers.render(source))
        return rendered
    return script


def code_of(script: Path) -> str:
    """The script after its docstring."""
    text = script.read_text()
    return "".join(text.splitlines(keepends=True)[ast.parse(text).body[0].end_lineno:])


def imported(source: str) -> set[str]:
    """The top-level names of every module `source` imports, in its own code
    and in any code it carries as text for a child process to run."""
    found, tree = set(), ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "import " in node.value:
            try:
                found |= imported(node.value)
            except SyntaxError:  # text, not code
                pass
    return found


def test_there_are_reproducers():
    assert len(HAND_WRITTEN) >= 20 and len(KEPT) >= 6 and all(s.parent.name == "findings" for s in SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_a_reproducer_starts_with_the_one_opening(script_of, script):
    """The same lines open every reproducer, word for word, as
    probes.run.netns declares them: they cannot drift apart."""
    assert code_of(script_of(script)).startswith("\n" + reproducers.opening()), \
        f"{script.name} does not start with the opening: `.venv/bin/python -m probes.run.reproducers {script}`"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_a_reproducer_imports_only_the_library_jax_numpy_and_the_standard_library(script_of, script):
    found = imported(script_of(script).read_text())
    others = found - LIBRARY - sys.stdlib_module_names
    assert "tpu_sync" in found and not others, (script.name, sorted(others))


def test_the_opening_is_the_standard_library_code_the_harness_enters_by():
    """netns.enter(), the harness's way in (the benchmark's too), is the
    opening's: one piece of code, which defines and runs nothing else."""
    assert imported(netns.opening()) <= set(sys.stdlib_module_names)
    names: dict = {}
    exec(compile(netns.opening(), "<opening>", "exec"), names)
    assert names["enter"].__doc__ == netns.enter.__doc__ and names["SKIP_EXIT"] == netns.SKIP_EXIT == 77
    assert reproducers.opening().endswith('sys.exit(SKIP_EXIT)\n')


def run_outside(script: Path, tmp_path: Path, path: str) -> subprocess.CompletedProcess:
    """`script` alone, with `path` as its PATH, the library and this project
    blocked, and every import it makes timed (`-X importtime`)."""
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    python = PEER_ENVS["jax"].python() or sys.executable
    env = {**os.environ, "PATH": path, "PYTHONPATH": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    env.pop(netns.ENTERED, None)
    return subprocess.run([str(python), "-X", "importtime", str(script)], capture_output=True, text=True,
                          timeout=120, env=env, cwd="/")


def modules(importtime: str) -> set[str]:
    """The modules `-X importtime` says were imported."""
    return {line.split("|")[-1].strip() for line in importtime.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_without_unshare_a_reproducer_skips_having_imported_nothing_of_the_library(script_of, script, tmp_path):
    (tmp_path / "bin").mkdir()  # a PATH with no unshare on it
    done = run_outside(script_of(script), tmp_path, str(tmp_path / "bin"))
    assert done.returncode == netns.SKIP_EXIT, done.stdout + done.stderr[-2000:]
    assert done.stdout == "SKIP no loopback-only network namespace can be made here: " \
                          "`unshare` (util-linux) is not installed\n"
    assert "BLOCKED" not in done.stderr
    loaded = {m.split(".")[0] for m in modules(done.stderr)}
    assert not loaded & {"tpu_sync", "jax", "numpy", "probes", "kvref"}, loaded


def test_where_the_kernel_refuses_unshare_a_reproducer_skips_with_its_words(tmp_path):
    """An `unshare` that refuses (as where user namespaces are off) is asked
    before the reproducer re-executes itself: its failure is never taken
    for the finding's."""
    (tmp_path / "bin").mkdir()
    refuses = tmp_path / "bin" / "unshare"
    refuses.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    refuses.chmod(0o755)
    script = REPO / "reports" / "cpu" / "findings" / "no_layers.py"
    done = run_outside(script, tmp_path, f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert done.returncode == netns.SKIP_EXIT, done.stdout + done.stderr[-2000:]
    assert done.stdout == ("SKIP no loopback-only network namespace can be made here: `unshare -rn` refused "
                           "(unshare: unshare failed: Operation not permitted)\n")
    assert "BLOCKED" not in done.stderr


def test_rewriting_a_reproducer_keeps_its_own_code_and_gives_it_the_opening():
    script = REPO / "reports" / "cpu" / "findings" / "no_layers.py"
    text = script.read_text()
    assert reproducers.rewrite(text) == text
    stale = text.replace("# The library listens on every interface", "# An older opening", 1)
    assert reproducers.rewrite(stale) == text


@pytest.fixture(scope="module")
def peer_python():
    python = peer_python_or_skip(PEER_ENVS["jax"])
    if netns.unavailable():
        pytest.skip(netns.unavailable())
    return python


def reproduce(peer_python, script) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu", FINDING_TIMEOUT="10", PYTHONPATH="", PYTHONPROFILEIMPORTTIME="1")
    env.pop(netns.ENTERED, None)
    return subprocess.run([str(peer_python), str(script)], capture_output=True, text=True,
                          timeout=120, env=env, cwd="/")


@pytest.fixture(scope="module")
def reproduced(request, peer_python, script_of):
    """Each selected reproducer's run, two at a time (most of a run is a wait)."""
    scripts = [params["script"] for params in selected(request, "test_each_finding_reproduces_alone")]
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(scripts, pool.map(functools.partial(reproduce, peer_python), map(script_of, scripts))))


@pytest.mark.peer
@pytest.mark.timeout(BATCH_SECONDS)  # the first waits for every reproducer
@pytest.mark.parametrize("script", [s for s in SCRIPTS if s.parent.parent.name == "cpu"], ids=lambda p: p.stem)
def test_each_finding_reproduces_alone(reproduced, script):
    """A finding's reproducer fails on its own (an assertion, a crash or the
    watchdog of a hang), in a loopback-only namespace it entered itself,
    with nothing of the harness or of kvref imported (-X importtime, in
    every process it starts)."""
    done = reproduced[script]
    assert not done.stdout.startswith("SKIP") and done.returncode != netns.SKIP_EXIT, done.stdout
    assert done.returncode != 0, f"{script.name} no longer fails:\n{done.stdout[-2000:]}"
    assert "ok" not in done.stdout.split()
    assert not {m for m in modules(done.stderr) if m.split(".")[0] in ("probes", "kvref")}, script.name
