"""Finding an implementation under test by name, the same way in the parent,
the zygote and every worker (each resolves the name itself; nothing is
handed over but the name):

- `NAME`: an entry point of the group `kvprobe.iuts` of any installed
  distribution, this project's own IUTs included (probes.iut.declared),
  loading an IUT of that same name;
- `package.module:ATTR`: the IUT object ATTR of an importable module; its
  cases carry that text as their IUT name, so a worker imports the module too;
- either, `==VERSION`: that IUT with another build of its library
  (probes.iut.builds).

Every IUT is checked when it is resolved: an IUT object, a protocol version
the harness speaks, and both halves meeting the protocol. An outside
module is imported first in a watched process of its own (vet_import)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import os
import signal
import subprocess
import sys
from importlib import metadata

import kvref
from probes.iut import builds
from probes.iut.adapter import IUT, Adapter
from probes.iut.protocol import PROTOCOL_VERSIONS, Arrays, Library, missing_members

ENTRY_POINT_GROUP = "kvprobe.iuts"


RESOLVED: dict = {}  # name -> IUT, each entry point loaded once per process


class IUTError(ValueError):
    """An IUT name that resolves to nothing runnable; the message says why."""


@functools.cache
def _entry_points() -> dict[str, list[metadata.EntryPoint]]:
    """Every entry point of the group by name; one declaration seen twice
    (the same distribution on two paths) counts once."""
    found: dict[str, dict[tuple, metadata.EntryPoint]] = {}
    for point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(point.name, {})[(point.value, _distribution(point))] = point
    return {name: list(points.values()) for name, points in found.items()}


def _distribution(point: metadata.EntryPoint) -> str:
    dist = point.dist
    return f"{dist.metadata['Name']} {dist.version}" if dist is not None else "an unknown distribution"


def source_of(point: metadata.EntryPoint) -> str:
    return f"entry point {point.name} = {point.value} ({_distribution(point)})"


def checked(declared, where: str) -> IUT:
    """`declared` if it is an IUT the harness can drive; IUTError naming
    `where` and what is wrong otherwise."""
    if not isinstance(declared, IUT):
        raise IUTError(f"{where} is a {type(declared).__name__}, not an IUT (probes.iut.adapter.IUT)")
    if declared.protocol not in PROTOCOL_VERSIONS:
        raise IUTError(f"{where} declares protocol version {declared.protocol!r}; this kvprobe speaks "
                       f"{', '.join(map(str, PROTOCOL_VERSIONS))} (probes.iut.protocol)")
    for half, proto in ((declared.arrays, Arrays), (declared.library, Library)):
        if not isinstance(half, type):
            raise IUTError(f"{where}: its {proto.__name__} half is a {type(half).__name__}, not a class")
        missing = missing_members(half, proto)
        if missing:
            raise IUTError(f"{where}: {half.__qualname__} lacks {', '.join(missing)} of the "
                           f"{proto.__name__} protocol (probes.iut.protocol)")
    return declared


IMPORT_SECONDS = 60.0  # for an outside IUT's module to import in its own process
VETTED_VARIABLE = "KVPROBE_VETTED_IUTS"  # modules vetted by a parent, which its workers need not vet again
VETTED_MARK = "KVPROBE-VETTED"
RAISED_MARK = "KVPROBE-RAISED"  # the vetting process's own account of what the import raised
ASKED_MARK = "KVPROBE-ASKED"  # a member of the IUT's Library that raised when asked, and what it raised
# A module that forks and then raises has two tracebacks on one stderr, their
# lines interleaved: the exception is told on stdout, by the first process only.
# Then the Library is built and every member a worker asks first is asked once,
# as a worker would (a `version` that reads package metadata the module's
# package never installed fails every case otherwise, with no result).
VET_SCRIPT = f"""
import importlib, os, sys
first = os.getpid()
try:
    module = importlib.import_module(sys.argv[1])
except Exception as e:
    if os.getpid() == first:
        told = " ".join(f"{{type(e).__name__}}: {{e}}".split())
        print({RAISED_MARK!r}, first, told, flush=True)
    raise
print({VETTED_MARK!r}, os.getpid(), flush=True)
declared = getattr(module, sys.argv[2], None)
# (An IUT that runs in an interpreter of its own is asked there, by its workers and `kvprobe iuts`.)
from probes.iut.protocol import Library, missing_members
# (One that lacks members of the protocol kvprobe refuses naming them, in its own process.)
if os.getpid() == first and isinstance(getattr(declared, "library", None), type) \\
        and getattr(declared, "interpreter", "main") == "main" and not missing_members(declared.library, Library):
    import kvref
    asked = declared.library.__qualname__ + "(faults,options)"
    try:
        library = declared.library(kvref.Faults(), None)
        for asked in ("version", "skip_reason", "distribution", "supports_faults", "OPTION_SETS"):
            value = getattr(library, asked)
            if asked == "skip_reason":
                asked = "skip_reason()"
                value()
    except Exception as e:
        told = " ".join(f"{{type(e).__name__}}: {{e}}".split())
        print({ASKED_MARK!r}, first, asked, told, flush=True)
"""


def vet_import(module_name: str, spec: str, attr: str = "") -> None:
    """Import `module_name` first in a process of its own, bounded in time,
    so that a module which hangs, ends the process (os._exit, SystemExit),
    forks or prints at import is a one-line IUTError here, never a hang or a
    silent exit of kvprobe; and ask its IUT `attr`'s Library every member a
    worker asks first. Once per module and process tree."""
    if module_name in os.environ.get(VETTED_VARIABLE, "").split(os.pathsep):
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-c", VET_SCRIPT, module_name, attr], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=IMPORT_SECONDS)
    except subprocess.TimeoutExpired:
        out, err = None, ""
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # and whatever it forked
        except ProcessLookupError:
            pass
        proc.wait()
    if out is None:
        raise IUTError(f"{spec}: module {module_name} did not finish importing in {IMPORT_SECONDS:.0f}s "
                       "(it hangs at import?)")
    marks = [line for line in out.splitlines() if line.startswith(VETTED_MARK)]
    raised = [line.split(None, 2)[-1] for line in out.splitlines()
              if line.startswith(f"{RAISED_MARK} {proc.pid} ")]
    said = [line for line in out.splitlines()
            if line.strip() and not line.startswith((VETTED_MARK, RAISED_MARK, ASKED_MARK))]
    asked = [line.split(None, 3)[2:] for line in out.splitlines() if line.startswith(f"{ASKED_MARK} {proc.pid} ")]
    last = (err.strip().splitlines() or [""])[-1]
    if said:  # before anything else: what it printed would reach kvprobe's output on any later import
        raise IUTError(f"{spec}: module {module_name} prints at import ({said[0][:80]!r}); an IUT's module must "
                       "import silently: kvprobe's output is read by tools")
    if proc.returncode != 0 and raised:
        # Never imported here: what ran before the exception (a fork, say) would run in kvprobe too.
        raise IUTError(f"{spec}: module {module_name} does not import: {raised[0][:300]}")
    if proc.returncode != 0:
        raise IUTError(f"{spec}: importing module {module_name} ended its process with status {proc.returncode}"
                       + (f": {last}" if last else " (os._exit or SystemExit at import?)"))
    if not marks:
        raise IUTError(f"{spec}: importing module {module_name} ended its process before the import returned "
                       "(os._exit or SystemExit at import?)")
    if len(marks) > 1 or marks[0].split()[-1] != str(proc.pid):
        raise IUTError(f"{spec}: module {module_name} forks at import (the import returned in {len(marks)} "
                       "processes); an IUT's module must not start processes when imported")
    if asked:
        member, told = (asked[0] + [""])[:2]
        raise IUTError(f"{spec}: its Library's {member} raised {told[:300]} when asked, as every case's worker "
                       "asks it; no case would have a result")
    os.environ[VETTED_VARIABLE] = os.pathsep.join(filter(None, [os.environ.get(VETTED_VARIABLE), module_name]))


def _from_module(spec: str) -> IUT:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise IUTError(f"{spec!r}: expected package.module:ATTR")
    if os.getcwd() not in sys.path:  # as uvicorn and gunicorn find an app: from where kvprobe was started
        sys.path.insert(0, os.getcwd())
    vet_import(module_name, spec, attr)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 (whatever the import raised is the reason)
        raise IUTError(f"{spec}: module {module_name} does not import: {type(e).__name__}: {e}") from None
    if not hasattr(module, attr):
        raise IUTError(f"{spec}: module {module_name} has no attribute {attr!r}")
    # The spec is the name its cases carry, so every worker resolves it the same way.
    return dataclasses.replace(checked(getattr(module, attr), spec), name=spec)


def _from_entry_point(name: str) -> IUT:
    if name not in RESOLVED:
        RESOLVED[name] = _load_entry_point(name)
    return RESOLVED[name]


def _load_entry_point(name: str) -> IUT:
    points = _entry_points().get(name)
    if not points:
        close = difflib.get_close_matches(name, sorted(_entry_points()), 1)
        raise IUTError(f"unknown implementation under test {name!r}"
                       + (f" (did you mean {close[0]!r}?)" if close else "") + "; expected one of "
                       f"{sorted(_entry_points())}, package.module:ATTR, or either ==VERSION for a "
                       "build of its library (`kvprobe iuts` lists what is installed)")
    if len(points) > 1:
        raise IUTError(f"two IUTs are named {name!r}: " + "; ".join(source_of(p) for p in points)
                       + ". Uninstall or rename one")
    (point,) = points
    try:
        loaded = point.load()
    except Exception as e:  # noqa: BLE001
        raise IUTError(f"{source_of(point)} does not load: {type(e).__name__}: {e}") from None
    declared = checked(loaded, source_of(point))
    if declared.name != name:  # one name: neither may silently replace the other
        raise IUTError(f"{source_of(point)} loads an IUT named {declared.name!r}; an entry point's name is the "
                       "name of the IUT it loads: make them the same")
    return declared


def iut(name: str) -> IUT:
    """The IUT `name` resolves to (see the module's docstring), or IUTError."""
    base, version = builds.split(name)
    declared = _from_module(base) if ":" in base else _from_entry_point(base)
    if version is None:
        return declared
    if declared.library.distribution not in builds.LIBRARIES:
        raise IUTError(f"{base} has no builds to choose; builds exist for the libraries "
                       f"{', '.join(builds.LIBRARIES)}")
    return dataclasses.replace(declared, name=name, build=version)


def entry_point_names() -> list[str]:
    """The names the installed entry points declare (read once per process)."""
    return sorted(_entry_points())


def source_of_iut(name: str) -> str:
    """Where the IUT `name` is declared."""
    base, _ = builds.split(name)
    if ":" in base:
        return f"module {base.partition(':')[0]}"
    return "; ".join(source_of(p) for p in _entry_points().get(base, [])) or "nothing installed"


def known_iuts() -> dict[str, IUT | IUTError]:
    """Every IUT the installed entry points declare: the IUT, or why it cannot be used."""
    found: dict[str, IUT | IUTError] = {}
    for name in sorted(_entry_points()):
        try:
            found[name] = iut(name)
        except IUTError as e:
            found[name] = e
    return found


def usable_iuts() -> dict[str, IUT]:
    return {name: declared for name, declared in known_iuts().items() if isinstance(declared, IUT)}


def check_target(name: str, generation: str) -> None:
    iut(name).check_target(generation)


def adapter_for(name: str, generation: str, faults: kvref.Faults = kvref.Faults(),
                options: dict | None = None) -> Adapter:
    return Adapter(iut(name), generation, faults, options)
