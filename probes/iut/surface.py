"""What a library offers its callers, read from the library itself, in the
interpreter it runs in: every public function, class, method and property of
its modules (native ones included, by their bound names), the settings it
reads (its classes' constructor arguments, and the environment variables its
Python reads and its native modules name), what it exports besides return
values (calls and arguments that carry metrics, telemetry, statistics and
callbacks), and every time bound its signatures state. `kvprobe coverage`
holds each entry to the rules and probes that exercise it, or the reason it
is out of the model (a library's `SURFACE`, `Surface` below).

Run as `python -m probes.iut.surface ROOT...`, it prints the inventory as JSON."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import re
import sys
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

KINDS = ("call", "setting", "env", "export", "bound")
# Argument names that state a time bound, and names of what a caller reads besides a return value.
TIME = re.compile(r"timeout|deadline|ttl|seconds|(^|_)s$|_ms$|interval|period")
EXPORTED = re.compile(r"metric|telemetry|stats|dump|prometheus|flush|callback|^on_|handler|counter|gauge|histogram")
ENV_NAME = re.compile(rb"(?<![A-Za-z0-9_])([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)\x00")
PY_LITERAL = re.compile(r"""["']([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)["']""")  # a name kept in a constant first
PY_ENV = re.compile(r"""(?:environ(?:\.get)?\s*[\[(]|getenv\s*\()\s*["']([A-Z][A-Z0-9_]+)["']""")
# What the libraries a native module links in read, not the library's own settings.
BUNDLED = re.compile(r"^(GRPC|HWLOC|TF|XLA|AWS|SSL|XDG|PERFETTO|TEST|GOOGLE|ABSL|OPENSSL|CURL|PJRT|ASN1|EVP|X509|"
                     r"TLS|HTTP|ALG|API|SSL3|DTLS|PKCS\d*|RSA|EC|NID|ERR|BIO|CMS|OCSP)_")
MAX_ENTRIES = 20000  # a library that names more is refused, not walked for ever


@dataclass(frozen=True)
class Entry:
    kind: str  # one of KINDS
    name: str  # e.g. "tpu_sync.api.jax.kv_cache_manager.KVCacheManager.d2h", "RAIDEN_SHM_KEY"
    detail: str = ""  # its signature, default or where it was read

    @property
    def key(self) -> str:
        """How a library's SURFACE names it: `KIND NAME`."""
        return f"{self.kind} {self.name}"


@dataclass(frozen=True)
class Surface:
    """How a library's surface maps to the model: the roots to read (packages,
    modules, or classes as `module:Class`), and for each entry (matched by
    `KIND NAME` patterns, fnmatch, first match wins) the rules and probes that
    exercise and judge it, or the reason it is out of the model. The native
    environment variables that count are those that contain one of `env_words`."""

    roots: tuple[str, ...]
    ruled: tuple[tuple[str, tuple[str, ...]], ...] = ()
    out: tuple[tuple[str, str], ...] = ()
    env_words: tuple[str, ...] = ()

    def judged(self, entry: Entry) -> tuple[tuple[str, ...], str]:
        """(rules and probes, "") or ((), the reason it is out), or ((), "") where neither is declared."""
        for pattern, rules in self.ruled:
            if fnmatchcase(entry.key, pattern):
                return tuple(rules), ""
        for pattern, reason in self.out:
            if fnmatchcase(entry.key, pattern):
                return (), reason
        return (), ""


def inventory(roots: tuple[str, ...], env_words: tuple[str, ...] = ()) -> list[Entry]:
    """Every entry of the roots' surface, in a stable order."""
    found: dict[str, Entry] = {}
    for module, owner in _modules(roots):
        for entry in _module_entries(module, owner):
            found.setdefault(entry.key, entry)
        if len(found) > MAX_ENTRIES:
            raise ValueError(f"{', '.join(roots)}: more than {MAX_ENTRIES} entries")
    for entry in _environment(roots, env_words):
        found.setdefault(entry.key, entry)
    return sorted(found.values(), key=lambda e: (KINDS.index(e.kind), e.name))


def _modules(roots: tuple[str, ...]):
    """(module, the one class of it to read or None) for every root, packages walked."""
    for root in roots:
        name, _, cls = root.partition(":")
        module = importlib.import_module(name)
        if cls:
            yield module, cls
            continue
        yield module, None
        for dotted in _submodules(name, list(getattr(module, "__path__", []) or [])):
            if _public(dotted) and not dotted.endswith(("_pb2", "_pb2_grpc")):
                try:
                    yield importlib.import_module(dotted), None
                except Exception:  # noqa: BLE001 (a module that cannot import here offers nothing here)
                    continue


def _submodules(name: str, places: list[str]) -> list[str]:
    """Every module under a package's folders, namespace packages (no __init__.py) included, which pkgutil skips."""
    found = set()
    for place in places:
        for path in Path(place).rglob("*"):
            if path.suffix not in (".py", ".so") or "__pycache__" in path.parts:
                continue
            parts = path.relative_to(place).with_suffix("").parts
            stem = parts[-1].split(".")[0]  # _ext.cpython-312-x86_64-linux-gnu -> _ext
            parts = parts[:-1] if stem == "__init__" else (*parts[:-1], stem)
            if parts:
                found.add(".".join((name, *parts)))
    return sorted(found)


def _public(dotted: str) -> bool:
    """A module of the public surface: no part of its name private, but a
    native module's own (`_tpu_raiden_jax`), whose bound names are public."""
    *package, last = dotted.split(".")
    if any(part.startswith("_") for part in package[1:]):
        return False
    if not last.startswith("_"):
        return True
    spec = importlib.util.find_spec(dotted)
    return bool(spec and spec.origin and spec.origin.endswith(".so"))


def _module_entries(module, only: str | None):
    name = module.__name__
    for attr, value in sorted(vars(module).items()):
        if attr.startswith("_") or (only and attr != only):
            continue
        if getattr(value, "__module__", name) != name and not only:
            continue  # re-exported: entered where it is defined
        if inspect.isclass(value):
            yield from _class_entries(f"{name}.{attr}", value)
        elif callable(value):
            yield from _callable_entries(f"{name}.{attr}", value)
        elif _metrics(value):
            for metric in value:
                yield Entry("export", f"{name}.{attr}.{metric.name}", str(metric.description))


def _metrics(value) -> bool:
    """A registry's list of the metrics it exports: each item named and described."""
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(getattr(item, "name", None), str) and hasattr(item, "description") for item in value)


def _class_entries(qualified: str, cls):
    yield Entry("call", qualified, _signature(cls))
    init = vars(cls).get("__init__")
    for parameter, default in _parameters(init if init is not None else cls):
        yield Entry("setting", f"{qualified}({parameter})", default)
        if TIME.search(parameter):
            yield Entry("bound", f"{qualified}({parameter})", default)
        if EXPORTED.search(parameter):
            yield Entry("export", f"{qualified}({parameter})", default)
    for attr, member in sorted(vars(cls).items()):
        if attr.startswith("_"):
            continue
        if isinstance(member, (classmethod, staticmethod)):
            member = member.__func__
        if isinstance(member, property) or type(member).__name__ in ("nb_property", "getset_descriptor"):
            yield Entry("call", f"{qualified}.{attr}", "property")
        elif callable(member):
            yield from _callable_entries(f"{qualified}.{attr}", member)


def _callable_entries(qualified: str, function):
    yield Entry("call", qualified, _signature(function))
    if EXPORTED.search(qualified.rsplit(".", 1)[-1]):
        yield Entry("export", qualified, _signature(function))
    for parameter, default in _parameters(function):
        if TIME.search(parameter):
            yield Entry("bound", f"{qualified}({parameter})", default)
        if EXPORTED.search(parameter):
            yield Entry("export", f"{qualified}({parameter})", default)


def _signature(function) -> str:
    try:
        return str(inspect.signature(function))
    except (TypeError, ValueError):  # a native callable: its first line of documentation names it
        doc = (getattr(function, "__doc__", "") or "").strip().splitlines()
        return doc[0][:300] if doc else ""


def _parameters(function) -> list[tuple[str, str]]:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        found = re.match(r"\w+\((.*)\)", _signature(function))
        return [(p.split(":")[0].split("=")[0].strip(), "=" + p.split("=", 1)[1].strip() if "=" in p else "")
                for p in (found.group(1).split(", ") if found else []) if p.strip() and p.strip() not in
                ("self", "/", "*")]
    return [(p.name, "" if p.default is inspect.Parameter.empty else f"={p.default!r}") for p in parameters
            if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _environment(roots: tuple[str, ...], env_words: tuple[str, ...]):
    """The variables the roots' Python reads (os.environ, getenv) and their native modules name."""
    for root in roots:
        spec = importlib.util.find_spec(root.partition(":")[0])
        if spec is None or spec.origin is None and not spec.submodule_search_locations:
            continue
        places = list(spec.submodule_search_locations or []) or [str(Path(spec.origin).parent)]
        files = [Path(spec.origin)] if not spec.submodule_search_locations else \
            [f for place in places for f in Path(place).rglob("*") if f.suffix in (".py", ".so")]
        for path in sorted(files):
            if path.suffix == ".py":
                text = path.read_text(errors="replace")
                named = {n for n in PY_LITERAL.findall(text) if any(word in n for word in env_words)}
                for name in sorted(set(PY_ENV.findall(text)) | named):
                    yield Entry("env", name, f"read by {path.name}")
            elif path.suffix == ".so":
                for raw in sorted(set(ENV_NAME.findall(path.read_bytes()))):
                    name = raw.decode()
                    if not BUNDLED.match(name) and any(word in name for word in env_words):
                        yield Entry("env", name, f"named in {path.name}")


def main(argv: list[str]) -> int:
    words = tuple(a[len("--env-word="):] for a in argv if a.startswith("--env-word="))
    roots = tuple(a for a in argv if not a.startswith("--"))
    print(json.dumps([vars(e) for e in inventory(roots, words)]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
