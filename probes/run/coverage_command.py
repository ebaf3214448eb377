"""`kvprobe coverage --iut NAME`: every entry of an IUT's surface, read from
its library in its own interpreter (probes.iut.surface), with the contract's
rules and the probes that exercise and judge it, or the reason it is out of
the model (its library's SURFACE). Exit 1 when an entry has neither, or names
a rule or probe that does not exist."""

from __future__ import annotations

import argparse
import json
import subprocess

from probes.run import netns, options
from probes.run.subcommand import Command

INVENTORY_SECONDS = 300.0  # importing every module of a library (JAX, its native modules) in its interpreter


class NoSurface(ValueError):
    """An IUT whose surface cannot be read here, and why."""


def entries_of(name: str):
    """(the IUT's Surface, every Entry of it), read in the IUT's interpreter."""
    from probes.iut import Entry, environment, iut, python_of

    declared = iut(name)
    surface = getattr(declared.library, "SURFACE", None)
    if surface is None:
        raise NoSurface(f"{name}: its library declares no SURFACE (probes.iut.surface.Surface), so its surface "
                        "cannot be read")
    python, missing = python_of(declared)
    if python is None:
        raise NoSurface(f"{name}: {missing}")
    arguments = [*surface.roots, *(f"--env-word={word}" for word in surface.env_words)]
    command = netns.python_command(python, "probes.iut.surface", *arguments) if declared.loopback_only and \
        not netns.unavailable() else [python, "-m", "probes.iut.surface", *arguments]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=INVENTORY_SECONDS,
                              env=environment(declared))
    except subprocess.TimeoutExpired:
        raise NoSurface(f"{name}: its interpreter did not read the surface in {INVENTORY_SECONDS:.0f} s") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    if done.returncode or not lines:
        raise NoSurface(f"{name}: its interpreter could not read the surface: {' '.join(done.stderr.split())[-400:]}")
    return surface, [Entry(**fields) for fields in json.loads(lines[-1])]


def judged(surface, entries) -> list[tuple[object, tuple[str, ...], str, str]]:
    """(entry, its rules and probes, the reason it is out, what is wrong) for each entry."""
    from probes.suite.contract_sequences import RULES
    from probes.suite.registry import PROBES

    known = set(RULES) | set(PROBES)
    rows = []
    for entry in entries:
        rules, reason = surface.judged(entry)
        unknown = [r for r in rules if r not in known]
        problem = (f"names {', '.join(unknown)}, which is no rule of the contract nor a probe" if unknown else
                   "" if rules or reason else "neither a rule nor a reason")
        rows.append((entry, rules, reason, problem))
    return rows


def table(name: str, rows) -> str:
    ruled = sum(1 for _, rules, _, problem in rows if rules and not problem)
    out = sum(1 for _, rules, reason, _ in rows if reason and not rules)
    wrong = [row for row in rows if row[3]]
    lines = [f"{name}: {len(rows)} entries: {ruled} exercised and judged by rules or probes, {out} out of the "
             f"model with a reason, {len(wrong)} with neither"]
    for entry, rules, reason, problem in rows:
        said = f"!! {problem}" if problem else ", ".join(rules) if rules else f"out: {reason}"
        lines.append(f"  {entry.kind:7} {entry.name}  -> {said}")
    return "\n".join(lines)


def arguments(parser: argparse.ArgumentParser) -> None:
    options.add(parser, "iut", iut=["tpu-sync-jax"])


def run(args) -> int:
    """1 when an entry of a surface has neither a rule nor a reason."""
    found = 0
    for name in args.iut:
        try:
            surface, entries = entries_of(name)
        except NoSurface as e:
            print(f"kvprobe coverage: {e}")
            found = 1
            continue
        rows = judged(surface, entries)
        print(table(name, rows))
        found |= any(row[3] for row in rows)
    return 1 if found else 0


COMMAND = Command("coverage", "every entry of an IUT's surface (its calls, settings, environment variables, exports "
                  "and time bounds, read from the library) with the rules that judge it, or why it is out of the model",
                  arguments, run)
