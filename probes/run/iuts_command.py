"""`kvprobe iuts`: every IUT kvprobe can see, where it is declared, and
whether it can run here. Whether it can is asked in the IUT's own
interpreter (`python -m probes.run.iuts_command NAME TARGET` prints the
adapter's skip reason and the library's version as JSON), in a loopback-only
network namespace where the IUT asks for one, so the answer is the one its
workers would get."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from probes.iut import IUT, IUTError, TpuUnavailable, environment, iut, known_iuts, python_of, source_of_iut
from probes.run import netns
from probes.run.subcommand import Command

CHECK_SECONDS = 120.0  # a cold JAX or torch import in the IUT's interpreter; never less than a case's start-up


def can_run_here(declared: IUT, target: str | None = None) -> tuple[str, str]:
    """(the library's version or "", "" when it can run here, on `target`
    (default: its first), or why not)."""
    python, missing = python_of(declared)
    if python is None:
        return "", missing
    if declared.loopback_only and (reason := netns.unavailable()):
        return "", reason
    target = target or declared.targets[0]
    command = ([*netns.python_command(python, "probes.run.iuts_command", declared.name, target)]
               if declared.loopback_only else [python, "-m", "probes.run.iuts_command", declared.name, target])
    limit = max(CHECK_SECONDS, declared.startup_seconds)  # it starts as a case's worker starts
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit, env=environment(declared))
    except subprocess.TimeoutExpired:
        return "", f"its interpreter did not answer in {limit:.0f} s"
    except TpuUnavailable as e:
        return "", str(e)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return "", f"its interpreter failed: {' '.join(done.stderr.split())[-400:]}"
    answer = json.loads(lines[-1])
    return answer["version"], answer["skip_reason"] or ""


def listing(extra: list[str]):
    """Each IUT's entry, in order, as soon as its interpreter answered (the
    IUTs are asked at once), so a piped listing shows progress."""
    found: dict[str, IUT | IUTError] = known_iuts()
    for name in extra:
        try:
            found[name] = iut(name)
        except IUTError as e:
            found[name] = e
    usable = {name: d for name, d in found.items() if isinstance(d, IUT)}
    with ThreadPoolExecutor(max_workers=4) as pool:
        asked = {name: pool.submit(can_run_here, declared) for name, declared in usable.items()}
        for name, declared in found.items():
            if isinstance(declared, IUTError):
                yield f"{name}\n  cannot be used: {declared}"
                continue
            version, reason = asked[name].result()
            yield (f"{name}  ({declared.library.distribution} {version or '?'})\n"
                   f"  declared by  {source_of_iut(name)}\n"
                   f"  targets      {', '.join(declared.targets)}"
                   f"{' and any TPU type libtpu compiles for' if declared.any_tpu_type else ''}\n"
                   f"  interpreter  {python_of(declared)[0] or declared.interpreter}\n"
                   f"  here         {'runs' if not reason else 'cannot run: ' + reason}")


def _answer(name: str, target: str) -> None:
    import kvref
    from probes.iut import adapter_for

    adapter = adapter_for(name, target, kvref.Faults())
    print(json.dumps({"version": _version(adapter), "skip_reason": adapter.skip_reason()}))


def _version(adapter) -> str:
    try:
        return adapter.version
    except Exception:  # noqa: BLE001 (a library that is not installed has no version)
        return ""


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="IUT", help="also these (package.module:ATTR)")


def run(args) -> int:
    for entry in listing(args.names):
        print(entry, flush=True)
    return 0


COMMAND = Command("iuts", "every implementation under test kvprobe can see, where each is declared, and why any "
                  "cannot run here", arguments, run)


if __name__ == "__main__":
    _answer(*sys.argv[1:3])
