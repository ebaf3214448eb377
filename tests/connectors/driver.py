"""Drive tpu-inference 0.32.0's two KV connectors, unmodified, the way its
model runner does, against a library imported as `tpu_raiden`: the drop-in
facade (kvref.compat.tpu_sync) or the production tpu-sync-jax. Prints a
JSON summary (and writes it to --out): per connector and shape, the steps
run, the transfers checked byte for byte, the mismatches (the first ones
described), the exceptions (type and message) and what the connectors
logged at WARNING and above.

    python -m tests.connectors.driver --lib facade [--out FILE]
    python -m probes.run.netns tests.connectors.driver --lib tpu-sync-jax ...   # under `unshare -rn`

Run from the repository root with the peer environment's interpreter. Each
case runs in an interpreter of its own (a crash or hang of the library ends
that case only, recorded with its stacks); tpu-sync-jax runs only inside a
loopback-only network namespace (probes.run.netns), which the children
inherit."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.connectors import bootstrap

REPO = Path(__file__).resolve().parents[2]
CONNECTORS = ("offload", "disagg")
SHAPE_NAMES = ("bf16-tp4", "bf16-dp2-tp4", "fp8-tp4", "mla-tp4")
# Variants, reported and not held to the main cases' rules: the store and the
# host pool sized alike, as deployed (saves are refused once the store is
# full; offload.run); the disaggregated connector with the buffer lock on
# (RAIDEN_UNSAFE_SKIP_BUFFER_LOCK=false), which has a time limit of its own.
EXTRA_CASES = ("offload:bf16-tp4:same-pool", "disagg:bf16-tp4:buffer-lock")
REPORTED_ONLY = ("same-pool",)  # variants whose refusals are the point
VARIANT_TIMEOUT = {"buffer-lock": 30.0}
DEFAULT_STEPS = 14
CASE_TIMEOUT = 150.0
DEFAULT_JOBS = 2
CASE_MARK = "KVREF-CONNECTOR-CASE "  # the child's one line of JSON on stdout starts with this


def all_cases(connectors=CONNECTORS, shapes=SHAPE_NAMES) -> list[str]:
    cases = [f"{c}:{s}" for c in connectors for s in shapes]
    return cases + [c for c in EXTRA_CASES if c.split(":")[0] in connectors and c.split(":")[1] in shapes]


# --- one case, in this process ------------------------------------------------

def run_case(lib: str, case: str, steps: int) -> dict:
    """Set up this interpreter for `lib`, run one case, return its summary."""
    bootstrap.prepare_environment()
    bootstrap.put_standins_on_path()
    bootstrap.load_tpu_inference()
    module_map = bootstrap.install_library(lib)
    bootstrap.stand_in_runner_module()

    from tests.connectors import disagg, offload
    from tests.connectors.checks import Tally, install_log_capture
    from tests.connectors.engine import SHAPES

    connector, shape, *variant = case.split(":")
    tally = Tally(connector, shape + "".join(f":{v}" for v in variant))
    if "buffer-lock" in variant:
        os.environ["RAIDEN_UNSAFE_SKIP_BUFFER_LOCK"] = "false"  # read by the connector's register_runner
    capture = install_log_capture()
    capture.tally = tally
    started = time.monotonic()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # the offload connector prints each lookup
            if connector == "offload":
                offload.run(SHAPES[shape], steps, tally, same_pool="same-pool" in variant)
            elif connector == "disagg":
                disagg.run(SHAPES[shape], steps, tally)
            else:
                raise ValueError(f"unknown connector {connector!r}; expected one of {CONNECTORS}")
    except Exception as e:  # noqa: BLE001 (recorded with its type, message and traceback)
        tally.exception(e)
        if lib == "tpu-sync-jax" and connector == "offload":
            tally.counts["library_store_api"] = native_store_api()
    finally:
        capture.tally = None
        gc.collect()
    summary = {
        "case": case, "connector": connector, "shape": tally.shape,
        "outcome": "raised" if tally.exceptions else "ran",
        "seconds": round(time.monotonic() - started, 2),
        "steps": tally.counts.get("steps", 0) or (tally.counts.get("producer_steps", 0)
                                                 + tally.counts.get("consumer_steps", 0)),
        "transfers_checked": tally.transfers_checked, "blocks_compared": tally.blocks_compared,
        "mismatches": tally.mismatches, "first_mismatches": tally.mismatch_details,
        "exceptions": tally.exceptions, "counts": tally.counts, "aliasing": tally.aliasing,
        "logged_warnings_and_errors": tally.logged_count, "logged_errors": tally.logged_errors,
        "logged": tally.logged,
        "module_map": module_map,
        "reported_only": any(v in REPORTED_ONLY for v in variant),
    }
    return summary


def native_store_api() -> dict:
    """What tpu-sync-jax's native store offers instead (its bound signatures):
    it is in the wheel's extension, not under any module the connector imports."""
    try:
        from tpu_sync.frameworks.jax import _tpu_raiden_jax as native
    except Exception as e:  # noqa: BLE001
        return {"import": f"{type(e).__name__}: {e}"}
    store = getattr(native, "KVCacheStore", None)
    if store is None:
        return {"KVCacheStore": "absent from the extension"}
    return {name: (getattr(store, name).__doc__ or "").strip().split("\n")[0] if hasattr(store, name) else "absent"
            for name in ("__init__", "lookup", "pin", "release", "insert")}


# --- every case, each in a child interpreter -----------------------------------

def environment_facts(lib: str) -> dict:
    from probes.run import netns
    from importlib import metadata
    facts = {"lib": lib, "library_version": bootstrap.library_version(lib), "python": sys.version.split()[0],
             "interfaces": netns.interfaces(), "loopback_only_namespace": netns.only_loopback()}
    for dist in ("tpu-inference", "jax", "prometheus_client", "sympy"):
        try:
            facts[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            facts[dist] = "not installed"
    return facts


def run_child(lib: str, case: str, steps: int, timeout: float) -> dict:
    for variant, limit in VARIANT_TIMEOUT.items():
        if case.endswith(f":{variant}"):
            timeout = min(timeout, limit)
    command = [sys.executable, "-m", "tests.connectors.driver", "--lib", lib, "--one-case", case,
               "--steps", str(steps), "--timeout", str(timeout)]
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout + 15)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return {"case": case, "outcome": "timed out", "seconds": round(time.monotonic() - started, 2),
                "exceptions": [{"type": "TimeoutExpired", "message": f"no summary within {timeout + 15:.0f} s",
                                "where": "driver", "stderr_tail": err[-3000:]}]}
    for line in done.stdout.splitlines():
        if line.startswith(CASE_MARK):
            return json.loads(line[len(CASE_MARK):])
    if "Timeout (" in done.stderr:  # faulthandler's watchdog: the case hung; its stacks are in stderr
        return {"case": case, "outcome": "timed out", "seconds": round(time.monotonic() - started, 2),
                "exceptions": [{"type": "Hang", "message": f"no summary within {timeout - 5:.0f} s; the "
                                "interpreter dumped its stacks and exited", "where": "driver",
                                "stderr_tail": done.stderr[-3000:]}]}
    return {"case": case, "outcome": "crashed", "seconds": round(time.monotonic() - started, 2),
            "exceptions": [{"type": "ChildExit", "message": f"the case's interpreter exited {done.returncode} "
                            "with no summary", "where": "driver", "stderr_tail": done.stderr[-3000:]}]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.connectors.driver", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lib", choices=bootstrap.LIBRARIES, required=True)
    parser.add_argument("--connector", default=",".join(CONNECTORS), help="offload,disagg")
    parser.add_argument("--shape", default=",".join(SHAPE_NAMES), help=",".join(SHAPE_NAMES))
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="model steps per engine (>= 12)")
    parser.add_argument("--timeout", type=float, default=CASE_TIMEOUT, help="seconds per case")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help="cases run at once")
    parser.add_argument("--out", type=Path, help="also write the summary here")
    parser.add_argument("--one-case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be positive")

    if args.lib == "tpu-sync-jax":
        from probes.run import netns
        if not netns.only_loopback():
            print(f"tpu-sync-jax runs only inside a loopback-only network namespace; this process sees "
                  f"{netns.interfaces()}: run it as `unshare -rn {sys.executable} -m probes.run.netns "
                  "tests.connectors.driver ...`", file=sys.stderr)
            return 2

    if args.one_case:
        import faulthandler
        faulthandler.dump_traceback_later(max(args.timeout - 5, 1), exit=True)  # a hang: its stacks, then exit
        summary = run_case(args.lib, args.one_case, args.steps)
        print(CASE_MARK + json.dumps(summary, default=str), flush=True)
        return 0

    connectors = [c for c in args.connector.split(",") if c]
    shapes = [s for s in args.shape.split(",") if s]
    bad = [c for c in connectors if c not in CONNECTORS] + [s for s in shapes if s not in SHAPE_NAMES]
    if bad:
        parser.error(f"unknown connector or shape: {bad}")
    started = time.monotonic()
    cases = all_cases(connectors, shapes)
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(lambda case: run_child(args.lib, case, args.steps, args.timeout), cases))
    summary = {"environment": environment_facts(args.lib), "steps_requested": args.steps,
               "seconds": round(time.monotonic() - started, 2), "cases": results}
    text = json.dumps(summary, indent=1, default=str)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
