"""The options of a run, each declared once with its default, its parser and
its help: `kvprobe run` and its siblings (qualify, bisect, fuzz) and the
pytest plugin (`--kvprobe-NAME`) all take them from here, and a bad value
is the same error everywhere."""

from __future__ import annotations

import argparse
import difflib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import kvref
from kvref import GENERATIONS
from kvref.generations import check_generation
from probes.suite.cases import PROBE_SECONDS
from probes.suite.matrix import DEFAULT_MATRIX, names_a_case_kind
from probes.suite.registry import DEFAULT_PROBES, PROBES


MOST_COUNT = 2**31  # a count (layers, blocks, workers) beyond which nothing kvprobe does makes sense
MOST_SECONDS = 7 * 86400.0  # a time limit: a week, where a clock, a timer or a sleep still takes it


def positive_number(cast, most: float):
    def parse(value: str):
        try:
            number = cast(value)
        except ValueError:
            number = 0
        shown = value if len(value) <= 24 else f"{value[:12]}... ({len(value)} characters)"
        if not number > 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {shown!r}")
        if isinstance(number, float) and not math.isfinite(number):
            raise argparse.ArgumentTypeError(f"expected a positive number, not infinite or NaN, got {shown!r}")
        if number > most:  # (an int of any length compares; converting it to a float may overflow)
            bound = f"{most:,}" if isinstance(most, int) else f"{most:g}"
            raise argparse.ArgumentTypeError(f"expected a positive number of at most {bound}, got {shown!r}")
        return number
    return parse


positive = positive_number(int, MOST_COUNT)
seconds = positive_number(float, MOST_SECONDS)


def generations(value: str) -> list[str]:
    """'all', 'cpu', 'local' (this TPU) or TPU types, comma-separated."""
    names = list(GENERATIONS) if value == "all" else [v.strip() for v in value.split(",")]
    names = [local_generation() if name == "local" else name for name in names]
    for name in names:
        if name == "cpu":
            continue
        try:
            check_generation(name)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{e}{meant(name)}; or 'all', or 'cpu' (CPU implementations)") from None
    return names


def meant(name: str) -> str:
    """' (did you mean ...?)' naming the shipped TPU types close to `name`, or ''."""
    close = [g for g in GENERATIONS if g != name and g.startswith(name)] or \
        difflib.get_close_matches(name, list(GENERATIONS), 2)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def local_generation() -> str:
    """`local`: the TPU generation of this machine."""
    from probes.iut import NO_TPU, local_generation as this_machines

    generation = this_machines()
    if generation is None:
        raise argparse.ArgumentTypeError(f"'local': {NO_TPU}")
    return generation


def probes(value: str) -> list[str]:
    if value == "all":
        return list(PROBES)
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = sorted(name for name in names if not names_a_case_kind(name))
    if unknown or not names:
        close = difflib.get_close_matches(unknown[0], list(PROBES), 1) if unknown else []
        raise argparse.ArgumentTypeError(f"unknown probe(s) {unknown or value!r}"
                                         + (f" (did you mean {close[0]!r}?)" if close else "") + "; expected any of "
                                         f"{', '.join(PROBES)}, or probe/kind for one kind of one")
    return names


def faults(value: str) -> kvref.Faults:
    try:
        return kvref.Faults.parse(value, environ={})
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def names(value: str) -> list[str]:
    return [x for x in value.split(",") if x]


@dataclass(frozen=True)
class Option:
    name: str  # --NAME (and the plugin's --kvprobe-NAME)
    parse: Callable | None
    default: object
    help: str
    short: str = ""
    metavar: str | None = None
    unset: str = ""  # what leaving it unset means where a command lets it be (the plugin)
    shown_default: str = ""  # the default as help shows it, where its help does not say it
    several: bool = False  # takes several values (comma-separated); add_one takes one


OPTIONS = {o.name: o for o in (
    Option("generation", generations, list(GENERATIONS), "one, several (comma-separated), 'all' or 'local' "
           "(this TPU)", "-g", unset="the IUT's targets, or this TPU for an IUT on real hardware",
           shown_default="all", several=True),
    Option("iut", names, ["kvref-sim"], "implementation(s) under test, comma-separated (several give a "
           "side-by-side report): a name `kvprobe iuts` lists, or package.module:ATTR; either ==VERSION for "
           "another build of its library", unset="no kvprobe cases are collected", several=True),
    Option("matrix", None, DEFAULT_MATRIX, f"shape matrices, comma-separated (default {DEFAULT_MATRIX}): "
           "'default', 'serving' (the caches tpu-inference allocates for a few models, sharded), 'seed', 'cpu', "
           "or a CSV file (name,shape[,probes][,sharding])"),
    Option("probe", probes, None, f"comma-separated probes, or 'all' (default: {', '.join(DEFAULT_PROBES)}; "
           f"'all' adds {', '.join(p for p in PROBES if p not in DEFAULT_PROBES)})", several=True),
    Option("jobs", positive, None, "parallel workers (default: cores)", "-j"),
    Option("timeout", seconds, PROBE_SECONDS, "seconds per case (a probe, to its worker's exit)"),
    Option("faults", faults, kvref.Faults(), "comma-separated kvref fault models to switch on (kvref IUTs)"),
    Option("out", Path, Path("reports"), "report directory", unset="the run's CSVs and reports are not written"),
)}


def check_given(values: dict[str, object], prefix: str = "--") -> None:
    """Each of OPTIONS as parsed (`values`: by name): ValueError for one given
    no value. argparse takes `--NAME=--` as an empty list, never asking the
    option's own parser, and a command would then run with nothing selected
    or a silent default."""
    for name, value in values.items():
        if name in OPTIONS and isinstance(value, (list, tuple)) and not value:
            raise ValueError(f"{prefix}{name}: no value (`--` is not one); expected {OPTIONS[name].help}")


def add(parser: argparse.ArgumentParser, *which: str, **defaults) -> None:
    """The options `which` on a command, with other defaults where given."""
    for name in which:
        option = OPTIONS[name]
        flags = [f"--{name}"] + ([option.short] if option.short else [])
        default = defaults.get(name, option.default)
        if name in defaults:  # the command's own default, said as it is
            shown = "" if default is None else f" (default: {','.join(map(str, default)) if isinstance(default, list) else default})"
        else:
            shown = f" (default: {option.shown_default})" if option.shown_default else ""
        kwargs = {"default": default, "help": option.help + shown}
        if option.parse is not None:
            kwargs["type"] = option.parse
        parser.add_argument(*flags, **kwargs)


def add_one(parser: argparse.ArgumentParser, name: str, default, purpose: str) -> None:
    """The option `name` where a command gives it a meaning of its own (one
    IUT to bisect, one target to fuzz, a sequence's timeout): its flags and
    parsing from OPTIONS (one value of those that take several), its purpose
    and default the command's."""
    option = OPTIONS[name]
    flags = [f"--{name}"] + ([option.short] if option.short else [])
    shown = "" if default is None else f" (default: {default})"
    kwargs = {"type": _one(name)} if option.several else {"type": option.parse} if option.parse else {}
    parser.add_argument(*flags, default=default, metavar=name.upper(), help=purpose + shown, **kwargs)


def _one(name: str) -> Callable[[str], str]:
    def one(value: str) -> str:
        if "," in value or not value.strip():
            raise argparse.ArgumentTypeError(f"expected one {name.upper()}, not several or none, got {value!r}")
        return value
    one.__name__ = name  # argparse names the option's type in its error
    return one


def add_to_pytest(group, *which: str, raw: tuple[str, ...] = (), **defaults) -> None:
    """The options `which` as `--kvprobe-NAME`, with other defaults where
    given (None: unset, as its help then says); those in `raw` are taken as
    text, for the plugin to parse where it needs more than the value."""
    for name in which:
        option = OPTIONS[name]
        default = defaults.get(name, option.default)
        kwargs = {"default": default, "metavar": name.upper(),
                  "help": option.help + (f"; unset: {option.unset}" if default is None and option.unset else "")}
        if option.parse is not None and name not in raw:
            kwargs["type"] = option.parse
        group.addoption(f"--kvprobe-{name}", **kwargs)
