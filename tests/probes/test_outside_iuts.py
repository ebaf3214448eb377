"""IUTs declared outside this project: the example package installed from
examples/, run from a directory outside the repository through the CLI and
the pytest plugin; IUTs named package.module:ATTR; every way a declaration can
be wrong, refused before any case runs; and planted bugs in outside wrappers
failing exactly the cases kvref's own fault model of that bug fails."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from importlib.metadata import version
from pathlib import Path

import pandas as pd
import pytest

from probes.report.results import disagreements
from probes.suite.verdicts import SKIP, Prediction

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "example-manager"
KVPROBE = [sys.executable, "-m", "probes.run.cli"]


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """A directory outside the repository, and an environment in which the
    example package is installed (pip, into a directory on PYTHONPATH)."""
    root = tmp_path_factory.mktemp("outside")
    site = root / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--target", str(site), str(EXAMPLE)], capture_output=True, text=True, timeout=300,
                          cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    work = root / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(work)])}
    return work, env


def run(command, work, env, timeout=600):
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=work, env=env)


def latest_csv(out: Path) -> pd.DataFrame:
    (path,) = sorted(out.glob("*/runs/*.csv"))[-1:]
    return pd.read_csv(path, keep_default_na=False)


def failing(frame: pd.DataFrame) -> set[str]:
    """The cases whose verdict is not one the reference predicts (a SKIP is no verdict)."""
    return set(disagreements(frame)["case_id"])


def test_the_example_package_is_qualified_from_outside_through_the_cli_and_the_plugin(outside, tmp_path):
    work, env = outside
    listed = run([*KVPROBE, "iuts"], work, env, timeout=300)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "example-manager  (kvprobe-example-manager 0.1.0)" in listed.stdout
    assert "entry point example-manager = example_manager.iut:EXAMPLE_MANAGER" in listed.stdout

    done = run([*KVPROBE, "run", "--iut", "example-manager", "-g", "tpu7x", "--out", str(tmp_path / "cli")],
               work, env)
    assert done.returncode == 0, done.stderr[-3000:]
    frame = latest_csv(tmp_path / "cli")
    assert set(frame["iut"]) == {"example-manager"} and len(frame) > 40
    assert failing(frame) == set() and (frame["verdict"] == "PASS").any()

    junit = tmp_path / "junit.xml"
    done = run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--kvprobe-iut", "example-manager",
                "--kvprobe-generation", "tpu7x", "--kvprobe-probe", "roundtrip,serving_step,bad_input",
                "--kvprobe-out", str(tmp_path / "plugin"), f"--junitxml={junit}", "-q", "--strict-markers",
                "-m", "not tpu"], work, env)
    assert done.returncode == 0, done.stdout[-3000:]
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    properties = {c.get("name"): {p.get("name"): p.get("value") for p in c.iter("property")} for c in cases}
    # Each item's time is its case's run (a worker started, a probe run), not its wait for a result made beside it.
    assert min(float(c.get("time")) for c in cases) > 0.01, sorted(float(c.get("time")) for c in cases)
    assert len(properties) == len(latest_csv(tmp_path / "plugin")) > 10
    assert set(properties) == set(latest_csv(tmp_path / "plugin")["case_id"])  # each item is named by its case id
    assert all(Prediction.parse(p["predicted"]).admits(p["verdict"]) for p in properties.values())


PLANTED = '''
"""Outside IUTs with a planted bug each: the example manager, wrapped."""
import dataclasses

import kvref
from example_manager.iut import EXAMPLE_MANAGER, ExampleLibrary
from example_manager.manager import BlockOffloader


class LegacySlices(BlockOffloader):
    """Sizes every block with the old formula."""

    @staticmethod
    def mover(kv_caches, host_blocks):
        return kvref.KVCacheManager(kv_caches, host_blocks, faults=("legacy_slice_formula",))


class SingleBlocks(BlockOffloader):
    """Moves the first block of every run only."""

    def offload(self, device_blocks, host_blocks, run_lengths=None):
        return super().offload(device_blocks, host_blocks)

    def restore(self, host_blocks, device_blocks, run_lengths=None):
        return super().restore(host_blocks, device_blocks)

    def save(self, device_blocks, run_lengths=None):
        return super().save(device_blocks)


def planted(manager_class):
    library = type(manager_class.__name__ + "Library", (ExampleLibrary,), {"manager_class": manager_class})
    return dataclasses.replace(EXAMPLE_MANAGER, library=library)


LEGACY_SLICES = planted(LegacySlices)
SINGLE_BLOCKS = planted(SingleBlocks)
'''


@pytest.mark.parametrize("attr, fault, probes", [
    ("LEGACY_SLICES", "legacy_slice_formula", "roundtrip,serving_step,mixed_slices,host_budget"),
    ("SINGLE_BLOCKS", "runs_as_single_blocks", "bad_input,host_chunks,transfer_parameters,roundtrip"),
])
def test_a_bug_planted_outside_fails_the_cases_its_fault_model_fails(outside, tmp_path, attr, fault, probes):
    work, env = outside
    (work / "planted_iuts.py").write_text(PLANTED)
    spec = f"planted_iuts:{attr}"
    common = ["-g", "tpu7x", "--probe", probes]
    done = run([*KVPROBE, "run", "--iut", spec, *common, "--out", str(tmp_path / "outside")], work, env)
    assert done.returncode == 1, done.stderr[-3000:]  # a planted bug: cases disagree, a CI job fails
    done = run([*KVPROBE, "run", "--iut", "kvref-sim", "--faults", fault, *common, "--out", str(tmp_path / "ref")],
               work, env)
    assert done.returncode == 1, done.stderr[-3000:]
    outside_frame, reference_frame = latest_csv(tmp_path / "outside"), latest_csv(tmp_path / "ref")
    assert set(outside_frame["iut"]) == {spec}
    expected = failing(reference_frame)
    assert expected, f"--faults {fault} fails none of {probes}: the comparison would prove nothing"
    assert failing(outside_frame) == expected
    assert (outside_frame["verdict"] == "PASS").any()

    done = run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--kvprobe-iut", spec,
                "--kvprobe-generation", "tpu7x", "--kvprobe-probe", probes, "-q", "-rf"], work, env)
    assert done.returncode == 1, done.stdout[-3000:]
    failed = {line.split(" ")[1].rsplit("::", 1)[1] for line in done.stdout.splitlines()
              if line.startswith("FAILED ")}
    assert failed == expected, done.stdout[-3000:]


@pytest.mark.parametrize("spec, needle", [
    ("no_such_module:IUT", "no_such_module:IUT: module no_such_module does not import: ModuleNotFoundError"),
    ("broken_iuts:MISSING", "broken_iuts:MISSING: module broken_iuts has no attribute 'MISSING'"),
    ("broken_iuts:NOT_AN_IUT", "broken_iuts:NOT_AN_IUT is a int, not an IUT"),
    ("broken_iuts:FUTURE", "broken_iuts:FUTURE declares protocol version 99; this kvprobe speaks 1"),
    ("broken_iuts:HALF", "broken_iuts:HALF: FewMembers lacks"),
    ("nobody", "unknown implementation under test 'nobody'"),
    (":X", "':X': expected package.module:ATTR"),
    ("exits_iuts:IUT", "exits_iuts:IUT: importing module exits_iuts ended its process before the import returned"),
    ("fails_iuts:IUT", "fails_iuts:IUT: importing module fails_iuts ended its process with status 3"),
    ("forks_iuts:IUT", "forks_iuts:IUT: module forks_iuts forks at import"),
    ("prints_iuts:IUT", "prints_iuts:IUT: module prints_iuts prints at import ('KVPROBE-RESULT"),
    ("forks_then_raises_iuts:IUT", "module forks_then_raises_iuts does not import: ValueError: broken"),
    ("prints_then_raises_iuts:IUT", "module prints_then_raises_iuts prints at import ('KVPROBE-RESULT"),
])
def test_a_declaration_that_cannot_be_used_is_one_error_before_any_case(outside, tmp_path, spec, needle):
    work, env = outside
    (work / "broken_iuts.py").write_text(textwrap.dedent('''
        from probes.iut.adapter import IUT
        from probes.iut.reference import KvrefLibrary, SimArrays

        NOT_AN_IUT = 42
        FUTURE = IUT("future", SimArrays, KvrefLibrary, targets=("tpu7x",), protocol=99)


        class FewMembers:
            distribution = "few"

            def manager(self, caches, host_blocks):
                return None


        HALF = IUT("half", SimArrays, FewMembers, targets=("tpu7x",))
    '''))
    # Modules that misbehave when imported: each is vetted in a process of its own.
    (work / "exits_iuts.py").write_text("import os\nos._exit(0)\n")
    (work / "fails_iuts.py").write_text("raise SystemExit(3)\n")
    (work / "forks_iuts.py").write_text("import os\nos.fork()\nfrom probes.iut.declared import KVREF_SIM as IUT\n")
    (work / "prints_iuts.py").write_text("print('KVPROBE-RESULT {}')\nfrom probes.iut.declared import KVREF_SIM as IUT\n")
    # Found by the imports fuzz category: a module that misbehaves and then raises was imported again in kvprobe.
    (work / "forks_then_raises_iuts.py").write_text("import os\nos.fork()\nraise ValueError('broken')\n")
    (work / "prints_then_raises_iuts.py").write_text("print('KVPROBE-RESULT {}')\nraise ValueError('broken')\n")
    done = run([*KVPROBE, "run", "--iut", spec, "-g", "tpu7x", "--out", str(tmp_path / "never")], work, env,
               timeout=120)
    assert done.returncode == 2 and needle in done.stderr, done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "never").exists() or not list((tmp_path / "never").rglob("*.csv"))
    if spec == "broken_iuts:HALF":
        assert "unlock" in done.stderr and "transfer" in done.stderr  # every missing member, named


def test_two_declarations_of_one_name_are_an_error_listing_both(outside, tmp_path):
    """A distribution whose entry point shadows a built-in IUT."""
    work, env = outside
    dist = tmp_path / "shadow" / "kvprobe_shadow-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kvprobe-shadow\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[kvprobe.iuts]\nkvref-sim = example_manager.iut:EXAMPLE_MANAGER\n")
    env = {**env, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), env["PYTHONPATH"]])}
    done = run([*KVPROBE, "run", "--iut", "kvref-sim", "-g", "tpu7x", "--out", str(tmp_path / "never")],
               work, env, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "two IUTs are named 'kvref-sim'" in done.stderr
    assert "(kvprobe-shadow 1.0)" in done.stderr and "probes.iut.declared:KVREF_SIM (kvref " in done.stderr


def test_an_outside_iut_names_its_own_interpreter(outside, tmp_path):
    """A path to a Python runs its workers; an environment of its own that is
    not built yet makes its cases SKIP, saying how to build it."""
    work, env = outside
    (work / "interpreters.py").write_text(textwrap.dedent(f'''
        import dataclasses
        from pathlib import Path
        from example_manager.iut import EXAMPLE_MANAGER
        from probes.iut.peer_env import PeerEnv

        BY_PATH = dataclasses.replace(EXAMPLE_MANAGER, interpreter={sys.executable!r})
        UNBUILT = dataclasses.replace(EXAMPLE_MANAGER, interpreter=PeerEnv(
            "example-env", Path({str(tmp_path / "no-env")!r}), {{"kvprobe-example-manager": "0.1.0"}}))
    '''))
    done = run([*KVPROBE, "run", "--iut", "interpreters:BY_PATH", "-g", "tpu7x", "--probe", "roundtrip",
                "--out", str(tmp_path / "path")], work, env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert set(latest_csv(tmp_path / "path")["verdict"]) <= {"PASS", "REJECTED"}
    done = run([*KVPROBE, "run", "--iut", "interpreters:UNBUILT", "-g", "tpu7x", "--probe", "roundtrip",
                "--out", str(tmp_path / "unbuilt")], work, env)
    assert done.returncode == 0, done.stderr[-2000:]
    frame = latest_csv(tmp_path / "unbuilt")
    assert set(frame["verdict"]) == {SKIP}
    assert "not installed at" in frame["detail"].iloc[0] and "kvprobe peer-env --iut IUT" in frame["detail"].iloc[0]


def test_a_module_that_hangs_at_import_is_refused_in_bounded_time(tmp_path, monkeypatch):
    from probes.iut import registry

    (tmp_path / "hangs_iuts.py").write_text("import time\ntime.sleep(3600)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "IMPORT_SECONDS", 2.0)
    with pytest.raises(registry.IUTError, match="hangs_iuts:IUT: module hangs_iuts did not finish importing in 2s"):
        registry.iut("hangs_iuts:IUT")
    assert "hangs_iuts" not in sys.modules


def test_a_copy_of_the_example_runs_from_its_folder_without_installing_anything(tmp_path):
    """As docs/iuts.md's outside-team path says: the example's package copied
    into a folder, `--iut package.module:ATTR` from that folder, nothing
    installed and no PYTHONPATH (the module is found from where kvprobe was
    started, as uvicorn and gunicorn find an app)."""
    import shutil

    shutil.copytree(EXAMPLE / "example_manager", tmp_path / "example_manager")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = [sys.executable, "-c", "import sys; from probes.run.cli import main; sys.exit(main())"]  # as the script
    done = run([*script, "run", "--iut", "example_manager.iut:EXAMPLE_MANAGER", "-g", "v5e", "--probe",
                "roundtrip", "--out", str(tmp_path / "out")], tmp_path, env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    frame = latest_csv(tmp_path / "out")
    assert len(frame) > 10 and not failing(frame) and set(frame["iut_version"]) == {"source"}


def test_a_member_that_raises_when_asked_is_one_error_before_any_case(outside, tmp_path):
    work, env = outside
    (work / "asked_iuts.py").write_text(textwrap.dedent('''
        from importlib import metadata

        from probes.iut.adapter import IUT
        from probes.iut.reference import KvrefLibrary, SimArrays


        class Unpackaged(KvrefLibrary):
            @property
            def version(self):
                return metadata.version("a-package-never-installed")


        IUT = IUT("unpackaged", SimArrays, Unpackaged, targets=("tpu7x",))
    '''))
    done = run([*KVPROBE, "run", "--iut", "asked_iuts:IUT", "-g", "tpu7x", "--out", str(tmp_path / "never")], work,
               env, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert "asked_iuts:IUT: its Library's version raised PackageNotFoundError" in line, line
    assert not (tmp_path / "never").exists()


def test_the_plugin_counts_its_items_as_pytest_counts_any(tmp_path):
    """From an outside folder, under --strict-markers and -W error (no warning
    of its own, as of kvref's editable import hook, which pytest would rewrite
    were it in the plugin's distribution): the items are counted as
    collected, -k deselects among them, --collect-only lists them."""
    plugin = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--strict-markers", "-W", "error",
              "--kvprobe-iut",
              "kvref-sim", "--kvprobe-generation", "tpu7x", "--kvprobe-probe", "roundtrip,bad_input"]
    listed = run([*plugin, "--collect-only", "-q"], tmp_path, os.environ, timeout=300)
    ids = [line for line in listed.stdout.splitlines() if line.startswith("kvprobe/")]
    assert listed.returncode == 0 and f"{len(ids)} tests collected" in listed.stdout, listed.stdout[-2000:]
    bad_input = [i for i in ids if "/bad_input/" in i]
    assert 0 < len(bad_input) < len(ids)
    done = run([*plugin, "-k", "bad_input", "-m", "not tpu"], tmp_path, os.environ, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    assert (f"collected {len(ids)} items / {len(ids) - len(bad_input)} deselected / {len(bad_input)} selected"
            in done.stdout), done.stdout[-2000:]


@pytest.mark.parametrize("option", ["iut", "probe", "faults"])
def test_the_plugin_refuses_an_option_given_no_value_in_one_line(tmp_path, option):
    """pytest's argparse hands `--kvprobe-NAME=--` over as an empty list: a usage error, not a silent default."""
    given = [] if option == "iut" else ["--kvprobe-iut", "kvref-sim"]
    done = run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *given, f"--kvprobe-{option}=--"],
               tmp_path, os.environ, timeout=300)
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"--kvprobe-{option}: no value" in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("jobs, code", [("1", 0), ("0", 4)])
def test_the_plugin_bounds_its_workers_with_kvprobe_jobs(tmp_path, jobs, code):
    """A shared CI runner bounds the plugin's workers as `kvprobe run --jobs` does; a bad count is refused."""
    done = run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--kvprobe-iut", "kvref-sim",
                "--kvprobe-generation", "tpu7x", "--kvprobe-probe", "bad_input", "-k", "bad_input and lengths",
                "--kvprobe-jobs", jobs], tmp_path, os.environ, timeout=300)
    assert done.returncode == code, done.stdout[-2000:] + done.stderr[-2000:]
    if code:
        assert "--kvprobe-jobs: expected a positive number" in done.stderr, done.stderr[-2000:]


def test_under_xdist_the_plugin_writes_one_run_of_every_case(tmp_path):
    """Each xdist worker used to write a run of its own share, and summary.json held one worker's: now the
    workers leave their rows to the controller, which writes one run of them all."""
    out = tmp_path / "out"
    done = run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--kvprobe-iut", "kvref-sim",
                "--kvprobe-generation", "tpu7x", "--kvprobe-probe", "bad_input", "--kvprobe-out", str(out)],
               tmp_path, os.environ, timeout=600)
    ran = re.search(r"(\d+) passed", done.stdout)
    assert done.returncode == 0 and ran, done.stdout[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cases"] == int(ran.group(1)) > 2, summary
    assert summary["kvprobe"].startswith(f"{version('kvref')}, the source tree {REPO} at "), summary["kvprobe"]
    assert len([f for f in summary["files"] if f.endswith(".csv")]) == 1 and not (out / ".kvprobe-parts").exists()


def test_the_example_passes_every_probe_unchanged(outside, tmp_path):
    """The shipped example is what a team copies: `--probe all` agrees with every prediction, and what it
    cannot be asked it declares not applicable, with why."""
    work, env = outside
    done = run([*KVPROBE, "run", "--iut", "example-manager", "-g", "tpu7x", "--probe", "all", "--out",
                str(tmp_path / "all")], work, env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    frame = latest_csv(tmp_path / "all")
    assert (frame["verdict"] == "PASS").sum() > 20 and "settings" not in set(frame["probe"])


def test_in_the_checkout_the_readme_pytest_line_collects_the_kvprobe_items_alone(tmp_path):
    """Run where a newcomer runs it (the repository, whose testpaths name kvref's own suite): the kvprobe
    items alone, unless a path is named."""
    plugin = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--kvprobe-iut", "kvref-sim",
              "--kvprobe-generation", "tpu7x", "--kvprobe-probe", "bad_input", "--collect-only", "-q"]
    alone = run(plugin, REPO, os.environ, timeout=300)
    named = run([*plugin, "tests/kvref/test_metrics.py"], REPO, os.environ, timeout=300)
    ids = [line for line in alone.stdout.splitlines() if "::" in line]
    assert alone.returncode == 0 and ids and all(i.startswith("kvprobe/") for i in ids), alone.stdout[-2000:]
    assert any(line.startswith("tests/kvref/test_metrics.py::") for line in named.stdout.splitlines()), \
        named.stdout[-2000:]


def test_a_node_id_as_pytest_prints_it_runs_that_case_alone(tmp_path):
    plugin = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--kvprobe-iut", "kvref-sim",
              "--kvprobe-generation", "tpu7x", "--kvprobe-probe", "bad_input", "-q"]
    listed = run([*plugin, "--collect-only"], tmp_path, os.environ, timeout=300)
    ids = [line for line in listed.stdout.splitlines() if line.startswith("kvprobe/")]
    assert len(ids) > 2, listed.stdout[-2000:]
    done = run([*plugin, ids[1]], tmp_path, os.environ, timeout=300)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


def test_sigterm_ends_a_plugin_session_as_ctrl_c_does_keeping_what_ran(tmp_path):
    """A CI job cancelled: the session ends at once with pytest's interrupted status, and its junitxml and its
    run (summary.json included) hold the cases that finished, as after Ctrl-C; not a death at -15."""
    out, junit = tmp_path / "out", tmp_path / "junit.xml"
    session = subprocess.Popen(
        [sys.executable, "-u", "-m", "pytest", "-p", "no:cacheprovider", "--kvprobe-iut", "kvref-sim",
         "--kvprobe-generation", "tpu7x", "--kvprobe-probe", "bad_input,contract_sequences",
         "--kvprobe-out", str(out), f"--junitxml={junit}", "-q"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    said, deadline = b"", time.monotonic() + 240
    while said.count(b".") < 3 and time.monotonic() < deadline:  # a few cases passed; the contract's still runs
        if select.select([session.stdout], [], [], 1.0)[0]:
            said += os.read(session.stdout.fileno(), 4096)
    session.send_signal(signal.SIGTERM)
    rest, _ = session.communicate(timeout=120)
    said += rest
    assert session.returncode == 2 and b"KeyboardInterrupt: signal SIGTERM" in said, said[-2000:]
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    # Its worker is killed: the contract's case did not run on to its end.
    assert not [c for c in cases if "contract_sequences" in c.get("name", "")], [c.attrib for c in cases]
    summary = json.loads((out / "summary.json").read_text())
    assert len(cases) >= 3 and summary["cases"] >= 3, (len(cases), summary)
