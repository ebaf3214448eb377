"""The shape of the code: probes/ in rooms whose imports run one way, no
import circles, nothing of kvref's private parts used from probes/, and each
fault model named only where it is defined. Each check is also shown failing
on a planted violation. And the steps ARCHITECTURE.md gives for a new TPU
generation and a new probe take the places it says."""

import ast
import importlib
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import kvref

ROOT = Path(__file__).resolve().parents[2]
# probes' rooms, lowest first: a module may import its own room or a lower one.
ROOMS = ["iut", "suite", "fuzz", "report", "run", "bench"]


def modules(package: str) -> dict[str, Path]:
    found = {}
    for path in (ROOT / package).rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


PROBES = modules("probes")
KVREF = modules("kvref")


def imports_of(text: str, importer: str) -> list[tuple[str, list[str], int]]:
    """(module, imported names, line) for every import at any depth."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importer's package
                package = importer.split(".")[: -node.level]
                base = ".".join(package + ([base] if base else []))
            found.append((base, [a.name for a in node.names], node.lineno))
    return found


def probe_edges(sources: dict[str, str]) -> dict[str, set[str]]:
    """probes module -> the probes modules it imports (`from pkg import mod`
    counts as importing pkg.mod)."""
    edges = {}
    for name, text in sources.items():
        targets = set()
        for module, names, _ in imports_of(text, name):
            if module.split(".")[0] == "probes":
                subs = [f"{module}.{n}" for n in names if f"{module}.{n}" in sources]
                targets.update(subs or [module])
        edges[name] = targets - {name}
    return edges


def room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else None


def against_room_order(edges) -> list[tuple[str, str]]:
    return [(m, t) for m, targets in edges.items() for t in targets
            if room(t) and room(m) and ROOMS.index(room(t)) > ROOMS.index(room(m))]


def find_circle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node, [node])
            if found:
                return found
    return None


def private_uses(name: str, text: str, private_attributes: set[str]) -> list[str]:
    """Imports of kvref's private modules or names, and reads of attributes
    kvref keeps private, in one probes module."""
    wrong = []
    for module, names, line in imports_of(text, name):
        if module.split(".")[0] == "kvref" and any(p.startswith("_") for p in module.split(".")[1:] + names):
            wrong.append(f"{name}:{line} imports {module} {names}")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Attribute) and node.attr in private_attributes \
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            wrong.append(f"{name}:{node.lineno} reads .{node.attr}")
    return wrong


def kvref_private_attributes() -> set[str]:
    found = {"_core"}
    for path in KVREF.values():
        found |= set(re.findall(r"self\.(_[a-z]\w*)\s*=", path.read_text()))
    return found


def fault_literals(name: str, text: str) -> list[str]:
    return [f"{name}:{node.lineno}: {node.value[:60]!r}" for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and any(fault in node.value for fault in kvref.Faults.known())]


SOURCES = {name: path.read_text() for name, path in PROBES.items()}


def test_every_probes_module_lives_in_a_room():
    loose = [m for m in PROBES if m != "probes" and room(m) is None]
    assert not loose, f"modules outside {ROOMS}: {loose}"


def test_imports_run_one_way_between_rooms():
    assert against_room_order(probe_edges(SOURCES)) == []
    planted = {**SOURCES, "probes.iut.planted": "from probes.run.runner import run_case\n"}
    assert against_room_order(probe_edges(planted)) == [("probes.iut.planted", "probes.run.runner")]


# The rooms that reach probes/iut only through its face (probes/iut/__init__.py's FACE).
THROUGH_THE_FACE = ("run", "report", "bench")


def past_the_face(name: str, text: str, face: set[str]) -> list[str]:
    """Imports in one module of a room left of probes/iut that go past its
    face: a module of probes/iut named, or a name the face does not offer."""
    wrong = []
    for module, names, line in imports_of(text, name):
        if module.startswith("probes.iut."):
            wrong.append(f"{name}:{line} imports {module}")
        elif module == "probes.iut" and set(names) - face:
            wrong.append(f"{name}:{line} imports {sorted(set(names) - face)} from probes.iut, not on its face")
    return wrong


def test_the_rooms_left_of_probes_iut_reach_it_through_its_face_alone():
    from probes.iut import FACE

    face = set(FACE)
    through = {name: text for name, text in SOURCES.items() if room(name) in THROUGH_THE_FACE}
    assert through and [w for name, text in through.items() for w in past_the_face(name, text, face)] == []
    planted = "from probes.iut.registry import iut\nfrom probes.iut import standin_vm\n"
    assert len(past_the_face("probes.run.planted", planted, face)) == 2
    import probes.iut

    assert all(getattr(probes.iut, name) is not None for name in FACE)  # each name on the face resolves
    for name, where in FACE.items():  # to what it names: a name that is also a module's is that module once loaded
        module, _, attribute = where.partition(":")
        loaded = importlib.import_module(f"probes.iut.{module}")
        assert getattr(probes.iut, name) is (getattr(loaded, attribute) if attribute else loaded), name


def test_the_face_hands_out_names_and_a_whole_module_only_where_its_source_is_read():
    from probes.iut import FACE

    modules = sorted(name for name, where in FACE.items() if ":" not in where)
    assert modules == ["jax_arrays", "tpu_sync"], modules  # a reproducer copies parts of their source
    readers = sorted(name for name, text in SOURCES.items()
                     if room(name) in THROUGH_THE_FACE and re.search(r"from probes\.iut import .*\btpu_sync\b", text))
    assert readers == ["probes.run.reproducers"], readers


def test_no_import_circle():
    assert find_circle(probe_edges(SOURCES)) is None
    planted = {**SOURCES, "probes.suite.cases": SOURCES["probes.suite.cases"]
               + "\ndef f():\n    from probes.suite import registry\n"}
    circle = find_circle(probe_edges(planted))
    assert circle and "probes.suite.cases" in circle and "probes.suite.registry" in circle


def test_probes_use_only_kvrefs_public_api():
    private = kvref_private_attributes()
    assert [w for name, text in SOURCES.items() for w in private_uses(name, text, private)] == []
    planted = "from kvref import _core\nimport kvref\nx = kvref.Shape.parse('f32[1]')._core\n"
    assert len(private_uses("probes.x", planted, private)) == 2


def test_fault_names_appear_only_where_they_are_defined():
    checked = {**SOURCES, **{name: path.read_text() for name, path in KVREF.items()
                             if name != "kvref.faults"}}
    assert [w for name, text in checked.items() for w in fault_literals(name, text)] == []
    assert fault_literals("x", "if 'legacy_slice_formula' in faults: pass\n")


def test_a_new_generation_declared_in_chips_alone_reaches_every_list(monkeypatch):
    """ARCHITECTURE.md's step for a new TPU type: one TpuChip in CHIPS; every
    other list is derived from it (the module, read again with one more chip)."""
    import importlib.util

    path = Path(kvref.generations.__file__)
    text = path.read_text()
    chip = '    TpuChip("v9", "v9:2x2", ("TPU v9",), ("0x0099",), "TPU-V9", "TPU v9", devices_per_chip=4),\n'
    anchor = "GOOGLE_PCI_VENDOR = "
    assert text.count(")\n" + anchor) == 1
    spec = importlib.util.spec_from_loader("generations_with_v9", loader=None)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    exec(compile(text.replace(")\n" + anchor, chip + ")\n" + anchor), str(path), "exec"), module.__dict__)
    assert "v9" in module.GENERATIONS and module.TOPOLOGIES["v9"] == "v9:2x2"
    assert module.RAY_ACCELERATOR_TYPES["v9"] == "TPU-V9" and module.TORCH_TPU_NAMES["TPU v9"] == "v9"
    assert "v9" in module.CHIP_NAMES and module.DEVICES_PER_CHIP["v9"] == 4
    assert module.chip_of_device_kind("TPU v9") == module.chip_of_pci_device("0x0099") == "v9"
    assert module.check_generation("v9") == "v9"


def test_a_new_probe_declared_in_the_registry_alone_reaches_the_run(monkeypatch, tmp_path):
    """ARCHITECTURE.md's step for a new probe: its function and one Probe in
    PROBES; the CLI, the plugin's options, case building, predictions and the
    report take it from there (the worker imports the same registry)."""
    import argparse

    import pandas as pd

    from probes.report.summary import write_generation_report
    from probes.run import options, rows
    from probes.run.runner import CaseResult
    from probes.suite import registry
    from probes.suite.matrix import build_cases
    from probes.suite.predict import describe
    from probes.suite.verdicts import PASS, Outcome

    def teleport(case, iut):
        """Moves every block by teleportation."""
        return Outcome(PASS, "teleported")

    declared = registry.Probe("teleport", teleport, "generation", registry.always(PASS),
                              subject=registry.PLAN_SHAPE)
    monkeypatch.setitem(registry.PROBES, "teleport", declared)
    assert options.probes("teleport,roundtrip") == ["teleport", "roundtrip"]
    with pytest.raises(argparse.ArgumentTypeError):
        options.probes("teleportation")
    cases = build_cases(["tpu7x"], [], probes=("teleport",))
    assert [c.probe for c in cases] == ["teleport"]
    assert describe(cases[0])["predicted"] == "PASS"
    frame = rows.to_frame([CaseResult(cases[0], Outcome(PASS, "teleported"), 0.1)], "run")
    assert isinstance(frame, pd.DataFrame) and frame["probe"].tolist() == ["teleport"]
    summary = write_generation_report(frame, tmp_path / "tpu7x").read_text()
    assert "teleport" in summary


def unmapped(text: str) -> list[str]:
    """Modules of kvref, probes and the C++ core that ARCHITECTURE.md (`text`)
    does not name: a Python module by its file name, a C++ unit by its header
    or, without one, its source; a proto by its file."""
    named = lambda name: re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text) is not None  # noqa: E731
    missing = [str(p.relative_to(ROOT)) for p in [*KVREF.values(), *PROBES.values()]
               if p.name != "__init__.py" and not named(p.name)]
    missing += [str(p.relative_to(ROOT)) for p in (ROOT / "kvref" / "proto").glob("*.proto") if not named(p.name)]
    for source in sorted((ROOT / "csrc").iterdir()):
        header = source.with_suffix(".h")
        unit = header if source.suffix == ".cc" and header.exists() else source
        if not named(unit.name):
            missing.append(str(source.relative_to(ROOT)))
    return missing


def test_the_map_names_every_module():
    assert unmapped((ROOT / "ARCHITECTURE.md").read_text()) == []


def test_a_module_left_off_the_map_is_found():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    assert "kvref/host_transfers.py" in unmapped(text.replace("host_transfers.py", "elsewhere"))
    assert "csrc/block_mover.cc" in unmapped(text.replace("block_mover.h", "elsewhere"))


def test_the_managers_settings_are_declared_once():
    """One record, one check per field, and the manager's constructor names none of them itself."""
    import dataclasses
    import inspect

    names = [f.name for f in dataclasses.fields(kvref.ManagerSettings)]
    checks = sorted(n[len("_check_"):] for n in vars(kvref.ManagerSettings) if n.startswith("_check_"))
    assert checks == sorted(names)
    own = set(inspect.signature(kvref.KVCacheManager.__init__).parameters) - {"self", "kv_caches", "faults", "settings"}
    assert own == {"host_blocks"}  # the one setting every manager needs, passed into the record


def test_an_unknown_setting_is_refused_by_name_and_a_manager_keeps_its_record():
    cache = kvref.SimDevice("v6e").put(np.zeros((8, 8, 128), np.float32))
    with pytest.raises(TypeError, match=r"unknown manager setting\(s\) \['paralelism'\]"):
        kvref.KVCacheManager([cache], 4, paralelism=2)
    manager = kvref.KVCacheManager([cache], 4, parallelism=np.int64(2))
    assert manager.settings == kvref.ManagerSettings(host_blocks=4, parallelism=2)


def test_the_plugins_options_are_the_commands_options():
    """Each `--kvprobe-NAME` is declared in probes.run.options, as its
    command's `--NAME` is: one help, one parser, one default (or unset)."""
    from probes.run import options, pytest_plugin

    added = {}

    class Group:
        def addoption(self, flag, **kwargs):
            added[flag] = kwargs

    class Parser:
        def getgroup(self, *args):
            return Group()

    pytest_plugin.pytest_addoption(Parser())
    assert added and {flag.removeprefix("--kvprobe-") for flag in added} <= set(options.OPTIONS)
    for flag, kwargs in added.items():
        assert kwargs["help"].startswith(options.OPTIONS[flag.removeprefix("--kvprobe-")].help), flag


def test_every_option_of_a_run_is_declared_once():
    """No command declares --iut, --generation or another option OPTIONS
    declares by hand: each comes from options.add or options.add_one."""
    from probes.run import options
    flags = "|".join(re.escape(f"--{name}") for name in options.OPTIONS)
    by_hand = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "probes").rglob("*.py"))
               for n, line in enumerate(path.read_text().splitlines(), 1)
               if re.search(rf"""add_argument\(\s*["'](?:{flags})["']""", line)]
    assert by_hand == []


def test_the_default_generation_is_one_name():
    source = "\n".join(p.read_text() for p in Path(kvref.__file__).parent.parent.glob("probes/run/*.py"))
    source += (Path(kvref.__file__).parent / "sim.py").read_text()
    named = "|".join(map(re.escape, kvref.GENERATIONS))
    assert not re.search(rf"""default=\[?["'](?:{named})["']|generation: str = ["'](?:{named})|or \[["'](?:{named})""", source)
    # The fuzz campaigns and benchmarks take the default, by its name.
    elsewhere = {path: path.read_text() for folder in ("fuzz", "bench") for path in (ROOT / "probes" / folder).glob("*.py")}
    default = re.escape(kvref.generations.DEFAULT_GENERATION)
    assert [str(p) for p, text in elsewhere.items() if re.search(rf"""["']{default}["']""", text)] == []
    assert kvref.generations.DEFAULT_GENERATION == kvref.GENERATIONS[-1]


def test_each_command_is_declared_by_its_own_module_and_the_parser_is_their_table():
    """Every `kvprobe` command is a Command some probes.run module declares
    (with its arguments and its run); cli.py lists them and declares none."""
    import importlib
    import pkgutil

    import probes.run
    from probes.run import cli
    from probes.run.subcommand import Command

    declared = {}
    for module in pkgutil.iter_modules(probes.run.__path__):
        if module.name in ("cli", "netns", "pytest_plugin"):  # netns and the plugin run as __main__ or in pytest
            continue
        for name, value in vars(importlib.import_module(f"probes.run.{module.name}")).items():
            if isinstance(value, Command):
                declared[value.name] = f"{module.name}.{name}"
    assert sorted(c.name for c in cli.COMMANDS) == sorted(declared)
    assert not any(isinstance(v, Command) for v in vars(cli).values() if v not in cli.COMMANDS)
    source = Path(cli.__file__).read_text()
    # kvprobe's own --version is the one option the parser declares; a command's are its module's
    assert source.count("add_argument(") == source.count('add_argument("--version"') and "add_parser(" not in source
    parsed = cli.build_parser().parse_args(["diff", "a.csv", "b.csv"])
    assert parsed.run.__module__ == "probes.run.diff_command"


TEST_ROOMS = ("kvref", "probes", "integration")  # tests/<room>/test_*.py; helpers at tests/ itself


def test_the_tests_map_names_every_test_module_and_helper():
    text = (ROOT / "tests" / "README.md").read_text()
    helpers = [p.name for p in sorted((ROOT / "tests").glob("*.py")) if p.name != "__init__.py"]
    modules = [f"{p.parent.name}/{p.name}" for p in sorted((ROOT / "tests").glob("*/test_*.py"))]
    assert modules and not [p for p in (ROOT / "tests").glob("test_*.py")]  # no test module left loose
    assert {m.partition("/")[0] for m in modules} == set(TEST_ROOMS)
    missing = [name for name in helpers + modules if f"`{name}`" not in text]
    assert missing == []
