"""kvprobe as a team installs it: every module the kvprobe command and the
pytest plugin import when they load comes from the standard library, this
project, or a distribution kvref itself depends on (an import of an extra's
package is inside the function that needs it)."""

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
OWN = {"kvref", "probes"}


def loaded_at_import(path: Path) -> set[str]:
    """The top-level names a module imports when it is loaded (not those inside functions)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def dependencies(pyproject: Path) -> set[str]:
    return {Requirement(r).name.lower().replace("_", "-")
            for r in tomllib.loads(pyproject.read_text())["project"]["dependencies"]}


def test_what_kvprobe_loads_is_a_dependency_of_kvref():
    depends = dependencies(ROOT / "pyproject.toml")
    plugin = ROOT / "probes" / "run" / "pytest_plugin.py"  # loaded by pytest-kvprobe, which depends on pytest
    owners = packages_distributions()
    missing = {}
    for path in [*sorted((ROOT / "probes").rglob("*.py")), *sorted((ROOT / "kvref").rglob("*.py"))]:
        allowed = depends | (dependencies(ROOT / "plugins" / "pytest-kvprobe" / "pyproject.toml")
                             if path == plugin else set())
        for name in loaded_at_import(path) - OWN - set(sys.stdlib_module_names) - {"__future__"}:
            dists = {d.lower().replace("_", "-") for d in owners.get(name, [name])}
            if not dists & allowed:
                missing.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert missing == {}, f"imported when loaded, yet no dependency of kvref: {missing}"
