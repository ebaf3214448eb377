"""`kvprobe coverage`: each library's surface, read from the library itself,
every entry exercised and judged by a rule or probe, or out of the model
with a reason; an entry with neither fails."""

import dataclasses
import sys
import textwrap

import pytest

from probes.iut import declared
from probes.iut.peer_env import interpreter_python
from probes.iut.surface import Surface, inventory
from probes.run import cli, coverage_command


def libraries():
    """Each library class this project declares an IUT of, with the first IUT that reads it on this machine."""
    seen = {}
    for value in vars(declared).values():
        if getattr(value, "library", None) is not None and hasattr(value, "owns_device") and not value.owns_device:
            seen.setdefault(value.library, value.name)
    return sorted(seen.items(), key=lambda item: item[1])


@pytest.mark.parametrize("library, name", libraries(), ids=[name for _, name in libraries()])
def test_every_entry_of_a_declared_library_is_ruled_or_out_with_a_reason(library, name):
    assert getattr(library, "SURFACE", None) is not None, f"{library.__name__} declares no SURFACE"
    python, missing = interpreter_python(getattr(declared, name.upper().replace("-", "_")).interpreter)
    if python is None:
        pytest.skip(f"{name}'s interpreter is not here: {missing}")
    surface, entries = coverage_command.entries_of(name)
    rows = coverage_command.judged(surface, entries)
    assert len(entries) > 20 and {e.kind for e in entries} >= {"call", "setting", "bound"}
    assert not [(row[0].key, row[3]) for row in rows if row[3]]


def test_the_production_wheel_is_read_whole():
    """The wheel's native module is read by its bound names, its environment
    variables from its Python and its native strings."""
    python, missing = interpreter_python(declared.TPU_SYNC_JAX.interpreter)
    if python is None:
        pytest.skip(f"tpu-sync-jax's interpreter is not here: {missing}")
    _, entries = coverage_command.entries_of("tpu-sync-jax")
    keys = {e.key for e in entries}
    assert "call tpu_sync.frameworks.jax._tpu_raiden_jax.KVCacheManager.h2h_read" in keys
    assert "env RAIDEN_SHM_KEY" in keys and "env RAIDEN_RPC_CONCURRENCY" in keys  # native, and Python
    assert "bound tpu_sync.api.jax.kv_cache_manager.KVCacheManager(timeout_s)" in keys
    assert not [k for k in keys if k.startswith("env GRPC_")]  # what a bundled library reads is not its own


@pytest.fixture
def library(tmp_path, monkeypatch):
    """A small library of a team's: a manager, a setting in the environment, a metrics dump."""
    (tmp_path / "teamlib").mkdir()
    (tmp_path / "teamlib" / "__init__.py").write_text("")
    (tmp_path / "teamlib" / "manager.py").write_text(textwrap.dedent('''
        import os
        LIMIT = "TEAMLIB_POOL_LIMIT"

        class Manager:
            def __init__(self, caches, timeout_s=5.0, on_evict=None):
                self.timeout = float(os.environ.get("TEAMLIB_TIMEOUT", timeout_s))

            def d2h(self, src, dst):
                pass

            def dump_metrics(self):
                return os.getenv(LIMIT)

        def _private():
            pass
        '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in [m for m in sys.modules if m.startswith("teamlib")]:
        del sys.modules[name]


def test_an_inventory_holds_calls_settings_the_environment_exports_and_time_bounds(library):
    keys = {e.key for e in inventory(("teamlib",), env_words=("TEAMLIB",))}
    assert keys == {
        "call teamlib.manager.Manager", "call teamlib.manager.Manager.d2h", "call teamlib.manager.Manager.dump_metrics",
        "setting teamlib.manager.Manager(caches)", "setting teamlib.manager.Manager(timeout_s)",
        "setting teamlib.manager.Manager(on_evict)", "env TEAMLIB_TIMEOUT", "env TEAMLIB_POOL_LIMIT",
        "export teamlib.manager.Manager.dump_metrics", "export teamlib.manager.Manager(on_evict)",
        "bound teamlib.manager.Manager(timeout_s)"}


def test_an_entry_with_neither_a_rule_nor_a_reason_fails_and_so_does_an_unknown_rule(library):
    entries = inventory(("teamlib",), env_words=("TEAMLIB",))
    surface = Surface(("teamlib",), ruled=(("call *.Manager.d2h", ("transfer",)), ("* *Manager(*", ("no_such_rule",))),
                      out=(("*", "everything else"),))
    rows = {row[0].key: row for row in coverage_command.judged(surface, entries)}
    assert rows["call teamlib.manager.Manager.d2h"][1:] == (("transfer",), "", "")
    assert "no_such_rule" in rows["setting teamlib.manager.Manager(timeout_s)"][3]
    assert rows["env TEAMLIB_TIMEOUT"][2] == "everything else"
    bare = Surface(("teamlib",), ruled=(("call *.Manager.d2h", ("transfer",)),))
    wrong = [row for row in coverage_command.judged(bare, entries) if row[3]]
    assert len(wrong) == len(entries) - 1 and all(row[3] == "neither a rule nor a reason" for row in wrong)
    assert "with neither" in coverage_command.table("teamlib", coverage_command.judged(bare, entries))


def test_the_command_lists_a_surface_and_fails_on_an_iut_without_one(capsys):
    assert cli.main(["coverage", "--iut", "kvref-sim"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("kvref-sim: ") and "0 with neither" in printed
    assert "call    kvref.manager.KVCacheManager.d2h  -> transfer" in printed
    assert cli.main(["coverage", "--iut", "tests.probes.test_coverage:NO_SURFACE"]) == 1
    assert "declares no SURFACE" in capsys.readouterr().out


# An IUT whose library declares no surface.
NO_SURFACE = dataclasses.replace(declared.KVREF_SIM, name="no-surface",
                                 library=type("Bare", (declared.KVREF_SIM.library,), {"SURFACE": None}))
