"""A fuzz campaign over kvref's API: `python -m probes.fuzz.campaign
--inputs 100000 --lifecycle 600 --listener 2000 --imports 200` (`make fuzz`). Inputs run in a worker process
that logs each one before running it, so a crash or a hang is pinned to the
input that caused it, and the campaign goes on from the next (kvref's API,
and INPUT_CATEGORIES: addresses, run files, recovered store tables,
metadata, thread starts). The lifecycle
cases (probes.fuzz.lifecycle) each run in a process of their own besides, and
the listener's (probes.fuzz.listener) put a hostile peer before a manager's
listener, and the imports' (probes.fuzz.outside_imports) name outside IUTs
whose modules misbehave at import.
Prints inputs, refusals, acceptances and failures per category, with every
failure's input."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from probes.fuzz.kvref_api import CATEGORIES
from probes.suite.verdicts import WATCHDOG_FIRED

INPUT_SECONDS = 30.0  # one input's watchdog in the worker, where its category declares no input_seconds


@dataclass
class Tally:
    category: str
    inputs: int = 0
    accepted: int = 0
    refused: int = 0
    failures: list[dict] = field(default_factory=list)  # index, kind, detail, input


def run_category(spec: str, count: int, seed: int, log_dir: Path) -> Tally:
    """`count` inputs of the category `spec` ("module:Class"), in as many
    worker processes as crashes and hangs need."""
    module, name = spec.split(":")
    category = getattr(importlib.import_module(module), name)
    tally = Tally(category.name)
    watchdog = getattr(category, "input_seconds", INPUT_SECONDS)
    start = 0
    while start < count:
        log = log_dir / f"{tally.category}-{start}.log"
        done = subprocess.run([sys.executable, "-m", "probes.fuzz.input_runner", spec, str(start), str(count),
                               str(seed), str(log), str(watchdog)],
                              capture_output=True, text=True)
        started, next_start = None, count
        for line in log.read_text().splitlines() if log.exists() else []:
            record = json.loads(line)
            if record["event"] == "start":
                started = record
                continue
            started = None
            tally.inputs += 1
            if record["event"] in ("accepted", "refused"):
                setattr(tally, record["event"], getattr(tally, record["event"]) + 1)
            else:
                tally.failures.append(record)
        if started is not None:  # the worker died inside this input
            tally.inputs += 1
            kind = "hang" if WATCHDOG_FIRED in done.stderr else "crash"
            tally.failures.append({"index": started["index"], "event": kind, "input": started["input"],
                                   "detail": f"exit {done.returncode}: {done.stderr.strip()[-1500:]}"})
            next_start = started["index"] + 1
        elif done.returncode != 0:
            raise RuntimeError(f"the fuzz worker failed outside any input: {done.stderr[-2000:]}")
        start = next_start
    return tally


# Input categories beside kvref's API: addresses peers dial, run files a user holds.
INPUT_CATEGORIES = ["probes.fuzz.addresses:PeerAddresses", "probes.report.run_file_inputs:RunFiles",
                    "probes.fuzz.store_tables:RecoveredStoreTables", "probes.fuzz.metadata:MetadataFields",
                    "probes.fuzz.thread_starts:ThreadStarts", "probes.run.finding_inputs:FindingFiles"]
LIFECYCLE = "probes.fuzz.lifecycle:Lifecycle"
LISTENER = "probes.fuzz.listener:HostilePeer"
IMPORTS = "probes.fuzz.outside_imports:OutsideImports"
VERDICTS = "probes.fuzz.verdict_forgery:VerdictForgery"


def campaign(total: int, seed: int = 0, specs=None, lifecycle: int = 0, listener: int = 0,
             imports: int = 0, verdicts: int = 0) -> list[Tally]:
    """`total` inputs shared by the API categories, then `lifecycle` cases,
    `listener` inputs, `imports` outside IUTs and `verdicts` outside IUTs
    that try to write their own verdict."""
    specs = specs or [f"probes.fuzz.kvref_api:{type(c).__name__}" for c in CATEGORIES.values()] + INPUT_CATEGORIES
    per = -(-total // len(specs)) if total else 0
    counts = [(spec, per) for spec in specs] + [(LIFECYCLE, lifecycle), (LISTENER, listener), (IMPORTS, imports),
                                                 (VERDICTS, verdicts)]
    with tempfile.TemporaryDirectory(prefix="kvref-fuzz-") as tmp:
        return [run_category(spec, count, seed, Path(tmp)) for spec, count in counts if count]


def render(tallies: list[Tally], seconds: float) -> str:
    lines = [f"{'category':<15} {'inputs':>8} {'refused':>8} {'accepted':>9} {'failures':>9}"]
    for t in tallies:
        lines.append(f"{t.category:<15} {t.inputs:>8,} {t.refused:>8,} {t.accepted:>9,} {len(t.failures):>9,}")
    inputs = sum(t.inputs for t in tallies)
    lines.append(f"{'total':<15} {inputs:>8,} {sum(t.refused for t in tallies):>8,} "
                 f"{sum(t.accepted for t in tallies):>9,} {sum(len(t.failures) for t in tallies):>9,}"
                 f"   ({seconds:.1f} s, {inputs / max(seconds, 1e-9):,.0f} inputs/s)")
    for t in tallies:
        for f in t.failures:
            lines.append(f"FAILURE {t.category} #{f['index']} {f['event']}: {f['detail'][:500]}\n"
                         f"  input: {json.dumps(f['input'])[:1000]}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=100_000, help="inputs in all (default 100000)")
    parser.add_argument("--lifecycle", type=int, default=600,
                        help="process-lifecycle cases, each in a process of its own (default 600)")
    parser.add_argument("--listener", type=int, default=2000,
                        help="hostile peers' calls to a manager's listener (default 2000)")
    parser.add_argument("--imports", type=int, default=200,
                        help="outside IUTs whose modules misbehave at import (default 200)")
    parser.add_argument("--verdicts", type=int, default=100,
                        help="outside IUTs that try to write their own verdict, each a `kvprobe run` (default 100)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    start = time.perf_counter()
    tallies = campaign(args.inputs, args.seed, lifecycle=args.lifecycle, listener=args.listener,
                       imports=args.imports, verdicts=args.verdicts)
    print(render(tallies, time.perf_counter() - start))
    return 1 if any(t.failures for t in tallies) else 0


if __name__ == "__main__":
    sys.exit(main())
