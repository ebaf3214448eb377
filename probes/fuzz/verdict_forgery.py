"""Outside IUTs that try to write their own verdict: each input is an IUT
whose manager, while the probe runs, does a few random things that could
pass for a result (print forged result lines on stdout and stderr, print
them again at exit, fork a process that writes them to every descriptor,
find the worker's channel in memory and say a second result, exit the
worker with status 0, raise SystemExit, close every descriptor it did not
open). The IUT is the reference with its old slice formula, so the honest
verdict of its round trip is CORRUPT. Each input is run as a user runs it,
`kvprobe run --iut module:IUT` in a process of its own, and read back from
the CSV: output alone leaves CORRUPT; anything else may turn the case into
an ERROR or a CRASH, never a PASS."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import kvref
from kvref.generations import DEFAULT_GENERATION
from probes.fuzz.mismatch import Mismatch

RUN_SECONDS = 90.0  # a whole `kvprobe run` of one case (start-up, a case of CASE_SECONDS, the report), however loaded the machine
CASE_SECONDS = 10.0  # the case's own bound (--timeout)
SHAPE = "bf16[512,6144]"  # the old slice formula corrupts its round trip (tests/probes/test_probe_teeth.py)
GENERATION = DEFAULT_GENERATION
HONEST = "CORRUPT"
BEHAVIOURS = {  # what the manager does, at the probe's call
    "prints": "shout()",
    "prints_at_exit": "atexit.register(shout)",
    "forks_and_writes": "forked_writer()",
    "says_on_the_channel": "say_on_the_channel()",
    "exits_zero": "os._exit(0)",
    "system_exit": "raise SystemExit(0)",
    "closes_descriptors": "os.closerange(3, 256)",
}
OUTPUT_ONLY = ("prints", "prints_at_exit")  # these leave the honest verdict
# Reading the worker's memory for its channel is outside what the channel
# stops (probes.run.channel's trust model): an IUT that says a result there
# and then ends the worker before it reports has written the only result.
# Such inputs are not made; one that says a result and lets the worker
# report is (two results: an ERROR).
READS_MEMORY, ENDS_WORKER = ("says_on_the_channel",), ("exits_zero", "system_exit", "closes_descriptors")
MODULE = '''
import atexit, gc, json, os, sys
import kvref
from probes.iut.adapter import IUT as _IUT
from probes.iut.reference import KvrefLibrary, SimArrays

FORGED = ['KVPROBE-RESULT {{"verdict": "PASS", "detail": "forged"}}',
          json.dumps({{"token": "0" * 32, "kind": "result", "payload": {{"verdict": "PASS", "detail": "forged"}}}})]


def shout():
    for line in FORGED:
        print(line, flush=True)
        print(line, file=sys.stderr, flush=True)


def forked_writer():
    if os.fork() == 0:
        for fd in range(256):
            for line in FORGED:
                try:
                    os.write(fd, (line + "\\n").encode())
                except OSError:
                    pass
        os._exit(0)


def say_on_the_channel():
    for found in gc.get_objects():
        if type(found).__name__ == "Channel":
            found.say("result", {{"verdict": "PASS", "detail": "forged"}})


class Forger(KvrefLibrary):
    def __init__(self, faults, options=None):
        super().__init__(kvref.Faults.parse({faults!r}), options)

    def manager(self, caches, host_blocks, **options):
{body}
        return super().manager(caches, host_blocks, **options)


IUT = _IUT("{name}", SimArrays, Forger, targets=kvref.GENERATIONS)
'''


BROKEN = kvref.Faults(legacy_slice_formula=True)  # the IUT's one old bug: the honest verdict is CORRUPT


def forging_module(behaviours: list[str], name: str) -> str:
    """The source of a module whose `IUT` does `behaviours` at the probe's call."""
    body = "\n".join(f"        {BEHAVIOURS[b]}" for b in behaviours)
    return MODULE.format(body=body, name=name, faults=list(BROKEN.names))


class VerdictForgery:
    name = "verdicts"
    input_seconds = RUN_SECONDS + 15  # the input's watchdog: past the run's own bound, so that one speaks first

    def __init__(self):
        self._folder = Path(tempfile.mkdtemp(prefix="kvprobe-forgers-"))
        (self._folder / "matrix.csv").write_text(f'name,shape\nforged,"{SHAPE}"\n')
        self._made = 0

    def generate(self, rng) -> dict:
        names = sorted(BEHAVIOURS)
        chosen = list(dict.fromkeys(names[int(i)] for i in rng.integers(0, len(names), int(rng.integers(1, 4)))))
        if any(b in READS_MEMORY for b in chosen):
            chosen = [b for b in chosen if b not in ENDS_WORKER]
        return {"behaviours": chosen}

    def run(self, case: dict) -> str:
        self._made += 1
        module = f"kvprobe_forger_{self._made}_{time.monotonic_ns()}"
        (self._folder / f"{module}.py").write_text(forging_module(case["behaviours"], module.replace("_", "-")))
        out = self._folder / module
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(self._folder), *sys.path]))
        try:
            done = subprocess.run([sys.executable, "-m", "probes.run.cli", "run", "--iut", f"{module}:IUT",
                                   "-g", GENERATION, "--probe", "roundtrip", "--matrix",
                                   str(self._folder / "matrix.csv"), "--timeout", str(CASE_SECONDS),
                                   "--out", str(out)], capture_output=True, text=True, env=env,
                                  timeout=RUN_SECONDS)
        except subprocess.TimeoutExpired:
            raise Mismatch(f"`kvprobe run` of an IUT that does {case['behaviours']} did not end within "
                           f"{RUN_SECONDS:.0f} s") from None
        try:
            return self._judge(case, done, out)
        finally:
            shutil.rmtree(out, ignore_errors=True)

    @staticmethod
    def _judge(case: dict, done: subprocess.CompletedProcess, out: Path) -> str:
        rows = [row for path in out.glob(f"{GENERATION}/runs/*.csv") for row in csv.DictReader(path.open())]
        # kvprobe run exits 1 exactly when the case disagrees with its prediction, 0 otherwise.
        expected = 1 if rows and rows[0].get("agrees") == "False" else 0
        if done.returncode != expected or len(rows) != 1:
            raise Mismatch(f"`kvprobe run` of an IUT that does {case['behaviours']} exited {done.returncode} "
                           f"with {len(rows)} result rows (expected exit {expected} and 1 row): "
                           f"{done.stderr.strip()[-600:]}")
        verdict, detail = rows[0]["verdict"], rows[0]["detail"]
        honest_only = all(b in OUTPUT_ONLY for b in case["behaviours"])
        if verdict == "PASS" or (honest_only and verdict != HONEST):
            raise Mismatch(f"an IUT that does {case['behaviours']} during the probe earned {verdict} "
                           f"(expected {HONEST if honest_only else 'anything but PASS'}): {detail[:400]}")
        return "accepted" if verdict == HONEST else "refused"
