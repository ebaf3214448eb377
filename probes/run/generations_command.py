"""`kvprobe generations`: the TPU generations shipped, and the TPU types the
installed libtpu compiles for."""

from __future__ import annotations

import argparse

from probes.run.subcommand import Command


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="TYPE", help="more TPU types to try (chip or chip:topology)")


def run(args) -> int:
    from kvref import GENERATIONS
    from kvref.generations import CHIP_NAMES, DEFAULT_TOPOLOGIES, TOPOLOGIES
    from kvref.oracle import compiler, device_kind

    print("shipped (layouts from the table):")
    for name in GENERATIONS:
        print(f"  {name:8} {TOPOLOGIES[name]:14} {device_kind(name)}")
    print(f"the installed libtpu (a bare chip takes the first of {', '.join(DEFAULT_TOPOLOGIES)} it accepts):")
    for name in dict.fromkeys([*CHIP_NAMES, *args.names]):
        reason = compiler.accepts(name)
        print(f"  {name:14} " + (f"compiles for it: {compiler.device_kind(name)}" if reason is None
                                 else f"no: {reason}"))
    return 0


COMMAND = Command("generations", "the TPU generations shipped, and the TPU types the installed libtpu compiles for",
                  arguments, run)
