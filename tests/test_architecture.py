"""The shape of the code: probes/ in rooms whose imports run one way, no
import circles, nothing of kvref's private parts used from probes/, and each
fault model named only where it is defined. Each check is also shown failing
on a planted violation."""

import ast
import re
from pathlib import Path

import kvref

ROOT = Path(__file__).resolve().parent.parent
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
