"""Naming an outside IUT (`--iut package.module:ATTR`) whose module misbehaves
at import: each input is a module made of a few random behaviours (print,
os._exit, SystemExit, fork, hang, raise, no such attribute, not an IUT) or
none, resolved by probes.iut.registry as the CLI and the plugin resolve it.
A module with no misbehaviour resolves to its IUT; any misbehaviour is one
IUTError of one line, within the import bound, with this process alive and
nothing printed in its name."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

from probes.fuzz.mismatch import Mismatch
from probes.iut import registry

IMPORT_SECONDS = 6.0  # the registry's bound on an import, lowered so a hang costs less (a loaded machine's
# plain import of an IUT module took over 2 s)
SLACK_S = 10.0  # beyond it, for the vetting interpreter to start and be reaped on a loaded machine
BEHAVIOURS = {
    "prints": "print('KVPROBE-RESULT {{\"verdict\": \"PASS\"}}')",  # a forged verdict line
    "writes_stderr": "import sys; sys.stderr.write('noise\\n')",
    "exits": "import os; os._exit({code})",
    "system_exit": "raise SystemExit({code})",
    "forks": "import os; os.fork()",
    "hangs": "import time; time.sleep(3600)",
    "raises": "raise ValueError('broken at import')",
    "no_attr": "del IUT",
    "not_iut": "IUT = 42",
}
# Behaviours that make the IUT unusable. stderr is the module's own to write.
HARMLESS = ("writes_stderr",)
VALID = "from probes.iut.declared import KVREF_SIM as IUT"


class OutsideImports:
    name = "imports"

    def __init__(self):
        self._folder = Path(tempfile.mkdtemp(prefix="kvprobe-imports-"))
        sys.path.insert(0, str(self._folder))
        registry.IMPORT_SECONDS = IMPORT_SECONDS
        self._made = 0

    def generate(self, rng) -> dict:
        names = sorted(BEHAVIOURS)
        chosen = [names[int(i)] for i in rng.integers(0, len(names), int(rng.integers(0, 3)))]
        return {"behaviours": chosen, "code": int(rng.integers(0, 4))}

    def run(self, case: dict) -> str:
        os.environ.pop(registry.VETTED_VARIABLE, None)  # each module is vetted afresh; the list stays short
        self._made += 1
        module = f"kvprobe_fuzz_iut_{self._made}_{time.monotonic_ns()}"
        lines = [VALID] + [BEHAVIOURS[b].format(code=case["code"]) for b in case["behaviours"]]
        (self._folder / f"{module}.py").write_text("\n".join(lines) + "\n")
        harmful = [b for b in case["behaviours"] if b not in HARMLESS]
        printed = io.StringIO()
        started = time.monotonic()
        try:
            with contextlib.redirect_stdout(printed):
                resolved = registry.iut(f"{module}:IUT")
        except registry.IUTError as e:
            return self._refused(case, str(e), harmful, time.monotonic() - started, printed.getvalue())
        except BaseException as e:  # noqa: BLE001 (anything else, SystemExit included, is the finding)
            raise Mismatch(f"resolving a module that does {case['behaviours']} raised {type(e).__name__}: {e}; "
                           "expected an IUTError of one line") from None
        if harmful:
            raise Mismatch(f"a module that does {harmful} at import resolved to {resolved.name}")
        if printed.getvalue():
            raise Mismatch(f"resolving printed {printed.getvalue()[:200]!r} on this process's stdout")
        return "accepted"

    @staticmethod
    def _refused(case: dict, message: str, harmful: list[str], elapsed: float, printed: str) -> str:
        if not harmful:
            raise Mismatch(f"a module that does only {case['behaviours'] or 'nothing'} was refused: {message}")
        if "\n" in message or not message:
            raise Mismatch(f"the refusal of a module that does {harmful} is not one line: {message!r}")
        if elapsed > IMPORT_SECONDS + SLACK_S:
            raise Mismatch(f"the refusal of a module that does {harmful} took {elapsed:.1f}s, past the import "
                           f"bound of {IMPORT_SECONDS}s")
        if printed:
            raise Mismatch(f"resolving printed {printed[:200]!r} on this process's stdout")
        return "refused"
