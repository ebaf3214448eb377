"""The fuzz category `finding_files` (make fuzz), the run room's own: a
finding of `kvprobe fuzz` as it may reach someone else (a field replaced by
any JSON value, code among them; a key dropped or added; the file cut at
any byte, nested past any parser's depth, or bytes that are no text).
`kvprobe fuzz --replay` and `--reproducer` read each through read_finding:
a finding, or one ValueError in one line naming the file, never another
exception. A reproducer rendered from one it takes holds every field as
data: its code is the code of the kept finding's reproducer, constant for
constant (no field's text can end a string and become code)."""

from __future__ import annotations

import ast
import functools
import json
import tempfile
from pathlib import Path

from probes.fuzz.mismatch import Mismatch
from probes.run.findings import read_finding
from probes.run.reproducers import render

BASE = Path(__file__).resolve().parents[2] / "reports" / "cpu" / "findings" / "contract-tpu_sync_jax-error-19.json"
JUNK = ('"""', "'''", "\\", '"""); import os; os.system("true")  #', "\x00", "\u2028", "{case}", "{{", "",
        "x" * 70_000, 2**64, -1, 0, 1e308, None, True, [], {}, [[[]]], {"a": {"b": []}})
DEPTH = 100_000  # nested lists, past json's recursion


@functools.cache
def _base() -> dict:
    return json.loads(BASE.read_text())


@functools.cache
def _shape_of_base() -> str:
    return shape(render(BASE))


def shape(script: str) -> str:
    """A script's code with every constant replaced by its type: what a field's text could change if it got out."""
    tree = ast.parse(script)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            node.value = type(node.value).__name__
    return ast.dump(tree)


def _places(value, path=()):
    """Every place in a JSON value: each leaf, and each container."""
    yield path
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        yield from _places(child, (*path, key))


def _at(value, path):
    for key in path:
        value = value[key]
    return value


class FindingFiles:
    name = "finding_files"

    def generate(self, rng) -> dict:
        finding = json.loads(json.dumps(_base()))
        places = list(_places(finding))[1:]
        how = str(rng.choice(["field", "field", "field", "drop", "add", "cut", "deep", "bytes"]))
        where = places[int(rng.integers(len(places)))]
        if how == "field":
            parent = _at(finding, where[:-1])
            parent[where[-1]] = JUNK[int(rng.integers(len(JUNK)))]
        elif how == "drop" and isinstance(parent := _at(finding, where[:-1]), dict):
            del parent[where[-1]]
        elif how == "add" and isinstance(container := _at(finding, where), dict):
            container[str(JUNK[int(rng.integers(len(JUNK)))])] = JUNK[int(rng.integers(len(JUNK)))]
        data = json.dumps(finding).encode()
        if how == "cut":
            data = data[:int(rng.integers(0, len(data) + 1))]
        elif how == "deep":
            data = b"[" * DEPTH + b"]" * DEPTH
        elif how == "bytes":
            data = bytes(int(b) for b in rng.integers(0, 256, int(rng.integers(0, 300))))
        return {"how": how, "where": [str(key) for key in where], "data": data.hex()}

    def run(self, case: dict) -> str:
        what = f"{case['how']} at {'/'.join(case['where'])}"
        with tempfile.TemporaryDirectory(prefix="kvprobe-finding-") as folder:
            path = Path(folder) / "finding.json"
            path.write_bytes(bytes.fromhex(case["data"]))
            for step, call in (("read_finding", lambda: read_finding(path, "blocks", "contract")),
                               ("render", lambda: render(path))):
                try:
                    said = call()
                except ValueError as e:
                    if str(path) not in str(e) or "\n" in str(e):
                        raise Mismatch(f"{what}: {step} refused it, but not in one line naming the file: "
                                       f"{str(e)[:300]!r}") from None
                    return "refused"
                except Exception as e:  # noqa: BLE001 - what this category looks for
                    raise Mismatch(f"{what}: {type(e).__name__} from {step}: {str(e)[:300]}") from None
        try:
            code = shape(said)  # `said`: the reproducer's text
        except SyntaxError as e:
            raise Mismatch(f"{what}: the reproducer is not Python ({e}): a field got out of its string") from None
        if code != _shape_of_base():
            raise Mismatch(f"{what}: the reproducer's code is not the kept finding's: a field got out of its "
                           "string")
        return "accepted"
