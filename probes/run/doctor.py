"""`kvprobe doctor`: what this machine offers the hardware path, in under a
minute. It says whether a TPU is here and why (the PCI bus, device nodes),
which chip and generation, the jax/libtpu/torch versions of each
environment, whether each IUT can start here (asked in its own
interpreter), and which probes apply to which IUT. It exits non-zero where
`make tpu-test` would fail for the harness's reasons: a TPU is here but its
runtime does not start, or an IUT on it cannot start."""

from __future__ import annotations

import argparse

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from probes.iut import (NO_TPU, PEER_ENVS, TpuUnavailable, google_pci_devices, holdable_chips, iut as resolve,
                         local_runtime, tpu_chips, tpu_devices, usable_iuts)
from probes.run import options
from probes.run.iuts_command import can_run_here
from probes.run.subcommand import Command
from probes.suite import matrix
from probes.suite.registry import PROBES, Scope

VERSIONS = ("jax", "jaxlib", "libtpu", "torch", "torch-xla", "torch-tpu", "tpu-sync-jax", "tpu-sync-torch")
VERSION_SCRIPT = (
    "import json\nfrom importlib import metadata\nfound = {}\n"
    f"for name in {VERSIONS!r}:\n"
    "    try:\n        found[name] = metadata.version(name)\n    except metadata.PackageNotFoundError:\n"
    "        pass\nprint(json.dumps(found))\n")
ASK_SECONDS = 60.0
# What the closing line is about, as a team runs it (`make tpu-test` is kvprobe's own checkout's target).
HARDWARE_RUN = "A hardware run here (`kvprobe run -g local --iut IUT`, `pytest -m tpu`; `make tpu-test` in kvprobe)"


@dataclass
class Diagnosis:
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what would fail `make tpu-test`
    echo: bool = False  # each line printed as it is found (a piped doctor shows progress)

    def say(self, text: str) -> None:
        self.lines.append(text)
        if self.echo:
            print(text, flush=True)

    def problem(self, text: str) -> None:
        self.problems.append(text)
        self.say(f"  PROBLEM: {text}")


def diagnose(names: list[str] | None = None, echo: bool = False) -> Diagnosis:
    """Everything, or only the IUTs `names` (each resolved, so a wrong name is an IUTError)."""
    d = Diagnosis(echo=echo)
    generation = _tpu(d)
    _memory_lock(d, generation)
    _environments(d)
    _iuts(d, generation, names)
    if d.problems:
        d.say(f"{HARDWARE_RUN} would fail for the harness's reasons ({len(d.problems)}):")
        for p in list(d.problems):
            d.say(f"  - {p}")
    else:
        d.say(f"{HARDWARE_RUN} would " + ("run the hardware cases" if generation
                                         else f"skip every hardware case: {NO_TPU}"))
    return d


def _tpu(d: Diagnosis) -> str | None:
    devices, chips = google_pci_devices(), tpu_chips()
    d.say("TPU")
    d.say(f"  Google PCI devices: {', '.join(devices) or 'none'}")
    if not chips:
        d.say(f"  {NO_TPU}")
        return None
    counted = tpu_devices()
    d.say(f"  TPU chips on the PCI bus: {', '.join(chips)} ({counted} devices)")
    try:
        generation, opened = local_runtime()
    except TpuUnavailable as e:
        d.problem(str(e))
        return None
    d.say(f"  generation: {generation}; its runtime opened {opened} devices")
    if counted > opened:  # sharded cases would be made for devices that are not there
        d.problem(f"the PCI bus was counted as {counted} devices ({len(chips)} chips), and the runtime "
                  f"opened {opened}: kvprobe would make caches over devices this TPU does not have")
    return generation


def _memory_lock(d: Diagnosis, generation: str | None) -> None:
    """Who runs, and how much memory it may lock: inside the loopback-only
    namespace a production worker runs in (`unshare -rn`) a process has no
    host capability, so the TPU runtime's pinned DMA buffers count against
    RLIMIT_MEMLOCK, even for root."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    shown = lambda limit: "unlimited" if limit == resource.RLIM_INFINITY else f"{limit // 1024} KiB"  # noqa: E731
    d.say(f"  effective uid {os.geteuid()}; locked memory (ulimit -l) {shown(soft)} (hard {shown(hard)})")
    if generation and soft != resource.RLIM_INFINITY:
        d.say(f"  WARNING: in a loopback-only namespace the TPU runtime's pinned buffers count against "
              f"{shown(soft)} of locked memory: if its workers fail to pin, raise it (ulimit -l unlimited, "
              "or memlock in /etc/security/limits.conf)")


def _environments(d: Diagnosis) -> None:
    import sys

    d.say("Environments")
    pythons = {"main": sys.executable, **{name: env.python() for name, env in PEER_ENVS.items()}}
    for name, python in pythons.items():
        if python is None:
            d.say(f"  {name:6} not installed ({PEER_ENVS[name].venv})")
            continue
        try:
            done = subprocess.run([str(python), "-c", VERSION_SCRIPT], capture_output=True, text=True,
                                  timeout=ASK_SECONDS)
            found = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}
        except (subprocess.TimeoutExpired, ValueError, IndexError):
            found = {}
        listed = ", ".join(f"{k} {v}" for k, v in found.items()) or "(could not ask it)"
        d.say(f"  {name:6} {python}: {listed}")


def _iuts(d: Diagnosis, generation: str | None, names: list[str] | None) -> None:
    d.say("IUTs")
    declared = usable_iuts() if names is None else {name: resolve(name) for name in names}
    # The IUTs that would probe this TPU are asked about it; the others about their first target.
    on_this_tpu = {name: generation is not None and i.owns_device and i.runs_on(generation)
                   for name, i in declared.items()}
    # Those that own a device are asked one at a time, beside the others: two at once
    # race for the TPU runtime's lock, and the loser says it cannot start.
    with ThreadPoolExecutor(max_workers=4) as pool, ThreadPoolExecutor(max_workers=1) as owners:
        answers = {name: (owners if i.owns_device else pool).submit(
            can_run_here, i, generation if on_this_tpu[name] else None) for name, i in declared.items()}
    chips = len(holdable_chips()) if generation else None  # each a producer's or consumer's own
    for name, iut in declared.items():
        version, reason = answers[name].result()
        applies = [p for p, probe in PROBES.items() if probe.scope != Scope.FUZZ and matrix.applies(iut, p, chips)]
        d.say(f"  {name} ({iut.library.distribution} {version or '?'}): "
              + ("can start here" if not reason else f"cannot start here: {reason}"))
        d.say(f"    probes: {', '.join(applies)}")
        for probe, why in matrix.not_applicable(iut, chips):
            d.say(f"    not {probe}: {why}")
        if on_this_tpu[name] and reason:
            d.problem(f"{name} targets this {generation} TPU but cannot start: {reason}")
    if generation and not any(on_this_tpu.values()):
        d.problem(f"no hardware IUT runs on {generation}")


def arguments(parser: argparse.ArgumentParser) -> None:
    options.add(parser, "iut", iut=None)  # unset: every IUT kvprobe finds


def run(args) -> int:
    """1 when `make tpu-test` would fail for the harness's reasons."""
    found = diagnose(args.iut or None, echo=True)
    return 1 if found.problems else 0


COMMAND = Command("doctor", "what this machine offers the hardware path, and whether `make tpu-test` would fail "
                  "for the harness's reasons (exit 1)", arguments, run)
