"""The reproducer script a finding of `kvprobe fuzz` (probes.run.findings:
reports/<generation>/findings/blocks-*.json and contract-*.json) renders on
demand: `kvprobe fuzz --reproducer FILE`; nothing generated is committed.

Every reproducer starts, after its docstring, with `opening()`: the lines of
probes.run.netns that put it in a loopback-only network namespace (standard
library only), then the call that prints SKIP and exits 77 where none can be
made. A call sequence against tpu-sync-jax on JAX CPU arrays replays against
the library alone (handed to the library's authors, it runs without this
harness): the block model, the sequence's one runner
(probes.suite.call_sequence.held), the reading of the library's refusals and
the computation that keeps a cache pending are the harness's own
definitions, copied in (`copied`). Any other IUT's replays through the
harness's worker code (`probes.run.probe_case`), which its library (kvref)
ships with: so does every contract sequence, on any IUT a team declares
(its finding held as data, the case's JSON).

The hand-written reproducers beside them (reports/cpu/findings/*.py) start
with the same opening: `python -m probes.run.reproducers SCRIPT...` gives
them the current one."""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

import numpy as np

import kvref
from probes.iut import CHECKOUT, declared_env, iut, jax_arrays, tpu_sync
from probes.run import netns
from probes.run.findings import read_finding
from probes.suite import block_model, call_sequence, refusals
from probes.suite.cases import Case
from probes.suite.verdicts import CORRUPT, ERROR, PASS

# After the opening: where no namespace can be made, nothing of the library runs.
ENTER = '''

if NO_NAMESPACE := enter():
    print("SKIP", NO_NAMESPACE)
    sys.exit(SKIP_EXIT)
'''

DOCSTRING = '''"""{title}

Found by `kvprobe fuzz --iut {iut}` (in {found_in}) and shrunk to {calls}:
{detail}
{also}
Rendered from {finding} (`kvprobe fuzz --reproducer {finding}`);
run with {python}.
{how}"""

'''

THROUGH_THE_HARNESS = """\
It replays the sequence through the harness's own adapter, prints the verdict
and exits non-zero (or crashes, or hangs until its watchdog), as it did then."""

ALONE = """\
It replays the sequence against the library alone (the harness's block model,
its sequence runner and its reading of the library's refusals copied in),
prints the verdict and exits non-zero (or crashes, or hangs until its
watchdog), as it did then."""

HARNESS_REPLAY = '''
import faulthandler  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

os.environ.setdefault("JAX_PLATFORMS", {platforms!r})
os.environ.update({environment!r})  # what the IUT declares its workers run with, as they run
faulthandler.dump_traceback_later({timeout}, exit=True)

from probes.run.probe_case import run_case_here  # noqa: E402

CASE = {case!r}

outcome = run_case_here(CASE)
print(outcome.verdict, outcome.detail)
sys.exit(0 if outcome.verdict == "PASS" else 1)
'''

# A call sequence against tpu-sync-jax's KVCacheManager on JAX CPU arrays, as
# probes.suite.call_sequence runs it through the adapter (probes.iut.tpu_sync's
# JaxSyncManager, probes.iut.jax_arrays's JaxCpuArrays): the same caches, calls
# and checks, one verdict.
TPU_SYNC_JAX_REPLAY = '''
import faulthandler  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import threading  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

os.environ.setdefault("JAX_PLATFORMS", {platforms!r})
faulthandler.dump_traceback_later({timeout}, exit=True)

CASE = {case!r}
SEQUENCE = json.loads(CASE)["calls"]
# How the manager is built: keyword arguments, and (upper case) variables set before the library is imported.
OPTIONS = dict(json.loads(CASE)["iut_options"])
os.environ.update({{name: str(value) for name, value in OPTIONS.items() if name.isupper()}})

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from tpu_sync.api.jax.kv_cache_manager import KVCacheManager  # noqa: E402

DIMS, DTYPE = {dims!r}, jnp.dtype({dtype!r})  # SEQUENCE["shape"]
PASS, CORRUPT, ERROR = {verdicts}  # the harness's verdicts

{copied}


def finish(verdict: str, detail: str):
    print(verdict, detail)
    sys.exit(0 if verdict == PASS else 1)


# Each layer's contents: small integers, which survive the library's float32 reads of its pool.
hosts = [np.random.default_rng(json.loads(CASE)["seed"] + layer).integers(-8, 8, DIMS).astype(DTYPE)
         for layer in range(SEQUENCE["layers"])]
caches = [jax.device_put(host.copy(), jax.devices("cpu")[0]) for host in hosts]
if SEQUENCE["mode"] == "deferred":  # the outputs of computations still running when the manager is built
    for cache in caches:
        cache.block_until_ready()
    caches = [_identity_churn()(cache, _rounds(host.nbytes * len(hosts)), _key(host.dtype))
              for cache, host in zip(caches, hosts)]
try:
    manager = KVCacheManager(caches, 0, host_blocks_to_allocate=SEQUENCE["host_blocks"],
                             **{{name: value for name, value in OPTIONS.items() if not name.isupper()}})
except Exception as e:  # a clean refusal here is a finding too: these layouts are addressable
    finish(ERROR, f"construction refused or failed: {{first_line(e)}}")
block_bytes = layer_block_sizes(manager._impl, int(manager._impl.num_layers))


def blocks(array) -> list[bytes]:
    """A dense CPU array's blocks, as the manager addresses them."""
    data = np.asarray(array).tobytes()
    return [data[i:i + block_bytes[0]] for i in range(0, len(data), block_bytes[0])]


def host_block(layer: int, block: int) -> bytes:
    """One block of the pool, read as the jax wheel offers: the first n float32 values of a layer's pool."""
    floats = block_bytes[layer] // 4
    values = manager._impl.read_host_memory(layer, 0, (block + 1) * floats)
    return np.asarray(values[block * floats:], dtype=np.float32).tobytes()


def transfer(request: dict) -> None:
    """The request's lists as they are (JSON's ints, bools and None): the library's bindings judge them."""
    move = manager.d2h if request["d2h"] else manager.h2d
    SyncPending(move(request["src"], request["dst"], request["sizes"])).wait()


model = BlockModel([blocks(host) for host in hosts], host_blocks=SEQUENCE["host_blocks"], zeroed_pool=False)
wrong = held(SEQUENCE["calls"], model, transfer=transfer, refuses=refuses,
             device_blocks=lambda: [blocks(np.asarray(cache)) for cache in caches], host_block=host_block)
if wrong is not None:
    finish(*wrong)
finish(PASS, f"{{len(SEQUENCE['calls'])}} calls held to the model")
'''

# What TPU_SYNC_JAX_REPLAY copies from the harness: (module, top-level names).
COPIED = (
    (block_model, ("INT64_MIN", "BlockModel")),
    (call_sequence, ("held", "_one", "_check")),
    (tpu_sync, ("AsyncFailure", "REFUSAL_CODES", "POOL_FULL", "JAX_STATUS", "UNCODED", "TORCH_WRAPPED", "RUNTIME_FAILURES",
                "CHECKS", "PYTHON_REFUSALS", "refuses", "layer_block_sizes", "SyncPending")),
    (refusals, ("first_line",)),
    (jax_arrays, ("PENDING_BYTES", "_rounds", "_identity_churn", "_key")),
)


def opening() -> str:
    """What every reproducer starts with after its docstring."""
    return netns.opening() + ENTER


def copied() -> str:
    """COPIED's definitions, each with the comment lines above it, in their modules' words."""
    chunks: list[tuple[bool, str]] = []  # (a def or class, its text)
    for module, names in COPIED:
        source = Path(module.__file__).read_text()
        lines, wanted = source.splitlines(keepends=True), set(names)
        for node in ast.parse(source).body:
            defined = _names(node) & wanted
            if not defined:
                continue
            wanted -= defined
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", ())]) - 1
            while start and lines[start - 1].startswith("#"):
                start -= 1
            defines = isinstance(node, (ast.FunctionDef, ast.ClassDef))
            chunks.append((defines, "".join(lines[start:node.end_lineno])))
        if wanted:
            raise LookupError(f"{module.__name__} no longer defines {sorted(wanted)}")
    text = (f"# The harness's own definitions ({', '.join(m.__name__ for m, _ in COPIED)}), "
            "as it judged the sequence:\n" + chunks[0][1])
    for (before, _), (defines, chunk) in zip(chunks, chunks[1:]):
        text += ("\n\n" if before or defines else "") + chunk
    return text.rstrip()


def _names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return {n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)}


def replays_alone(case: Case) -> bool:
    """Whether `case` replays against its library alone: tpu-sync-jax's manager on JAX CPU arrays."""
    declared = iut(case.iut)
    return "calls" in case.calls and issubclass(declared.library, tpu_sync.TpuSyncJaxLibrary) and \
        issubclass(declared.arrays, jax_arrays.JaxCpuArrays)  # a blocks sequence's calls


def replay(case: Case) -> str:
    """The code of a call sequence's reproducer, after its docstring."""
    declared = iut(case.iut)
    timeout = float(case.startup_timeout) + float(case.timeout)
    if not 0 < timeout < float("inf"):
        raise ValueError(f"the finding's timeouts add up to {timeout}; expected a positive number of seconds")
    fields = dict(platforms=declared.jax_platforms or "", timeout=repr(timeout), case=case.to_json())
    if replays_alone(case):  # a blocks sequence on tpu-sync-jax
        key = kvref.ShapeKey.parse(case.calls["shape"])
        return opening() + TPU_SYNC_JAX_REPLAY.format(
            dims=key.dims, dtype=np.dtype(kvref.element_type(key.dtype).numpy).name, copied=copied(),
            verdicts=", ".join(repr(str(v)) for v in (PASS, CORRUPT, ERROR)), **fields)
    text = HARNESS_REPLAY.format(environment=dict(declared.environment), **fields)
    return opening() + text if declared.loopback_only else text.replace("  # noqa: E402", "").lstrip("\n")


def _reproducer_python(interpreter) -> str:
    """The IUT's interpreter as the reproducer names it: relative to the repository where it lies in it."""
    if interpreter == "main":
        return ".venv/bin/python"
    env = declared_env(interpreter)
    python = Path(interpreter) if env is None else env.venv / "bin" / "python"
    return str(python.relative_to(CHECKOUT)) if python.is_relative_to(CHECKOUT) else str(python)


def render(path: Path, option_set: int = 0) -> str:
    """The standalone reproducer of the finding at `path`, under its
    `option_set`-th way of building the manager; ValueError in one line
    naming the file where the finding names what cannot be replayed."""
    finding = read_finding(path, "blocks", "contract")
    try:
        return _rendered(path, finding, option_set)
    except ValueError as e:
        said = " ".join(str(e).split())
        raise ValueError(said if said.startswith(f"{path}:") else f"{path}: {said}") from None


def _rendered(path: Path, finding: dict, option_set: int) -> str:
    sets = finding["option_sets"]
    if not 0 <= option_set < len(sets):
        raise ValueError(f"{path}: option set {option_set}; it has {len(sets)} (0 to {len(sets) - 1})")
    case = Case.from_json(json.dumps({**finding["case"], "iut_options": sets[option_set]}))
    first = finding["detail"].splitlines()[0] if finding["detail"] else finding["verdict"]
    title = f"{case.iut} {finding['iut_version']} ({case.options_text}): {finding['verdict']}: {first}"[:300]
    others = [Case.from_json(json.dumps({**finding["case"], "iut_options": s})).options_text
              for i, s in enumerate(sets) if i != option_set]
    also = f"It failed alike built with {'; '.join(others)}.\n" if others else ""
    said = {name: _inert(str(value)) for name, value in dict(
        title=title, iut=case.iut, found_in=finding["found_in"], detail=finding["detail"], also=also,
        finding=path, python=_reproducer_python(iut(case.iut).interpreter)).items()}
    shrunk = f"{len(case.calls['calls'])} call(s)" if finding["model"] == "blocks" else \
        f"a sequence of {len(case.calls['steps'])} step(s)"
    return DOCSTRING.format(calls=shrunk, how=ALONE if replays_alone(case) else THROUGH_THE_HARNESS,
                            **said) + replay(case)


def _inert(text: str) -> str:
    """`text` as it may stand inside the reproducer's docstring: a finding is
    someone else's data, so no quote can end the docstring, no backslash
    escape what follows, and no character the parser refuses gets through."""
    text = text.replace("\\", "\\\\").replace('"', '\\"')
    return "".join(c if c == "\n" or c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def rewrite(text: str) -> str:
    """A hand-written reproducer with the current opening, its own code kept."""
    lines = text.splitlines(keepends=True)
    docstring = ast.parse(text).body[0]
    head, code = "".join(lines[:docstring.end_lineno]) + "\n", "".join(lines[docstring.end_lineno:])
    if ENTER.strip() not in code:
        raise ValueError("no opening to replace: it does not end with the call of ENTER")
    return head + opening() + code[code.index(ENTER.strip()) + len(ENTER.strip()) + 1:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Give hand-written reproducers the current opening.")
    parser.add_argument("scripts", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for script in args.scripts:
        text = script.read_text()
        new = rewrite(text)
        if new != text:
            script.write_text(new)
            print("rewrote", script)
    return 0


if __name__ == "__main__":
    sys.exit(main())
