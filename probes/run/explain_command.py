"""`kvprobe explain`: the layout a TPU picks for a shape, and its block slices."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvref.generations import DEFAULT_GENERATION
from probes.run import options
from probes.run.subcommand import Command


def _sharding(value: str):
    from kvref.sharding import Sharding

    try:
        return Sharding.parse(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shapes", nargs="+", metavar="SHAPE",
                        help="'bf16[512,3,2048]' (layout from the compiler) or a full XLA layout text")
    options.add(parser, "generation", generation=[DEFAULT_GENERATION])
    parser.add_argument("--host-blocks", type=options.positive, default=None,
                        help="host blocks per layer for the host-pool estimate (default: dims[0])")
    parser.add_argument("--layers", type=options.positive, default=1, help="layers for the host-pool estimate")
    parser.add_argument("--sharding", type=_sharding, default=None, metavar="TEXT",
                        help="one device's shard of the cache split this way: 'mesh(model=4) spec(None,None,model)'")
    parser.add_argument("--png", type=_png, help="draw the physical memory map to this .png file, in a folder "
                        "that exists (one shape and generation; use {generation} in the name for several)")


def _png(value: str) -> str:
    """A .png path whose folder exists: checked before anything is explained."""
    path = Path(value)
    if path.suffix.lower() != ".png":
        raise argparse.ArgumentTypeError(f"{value!r}: expected a file name ending in .png (the map is a PNG)")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{value!r}: no folder {str(path.parent)!r} to write it in")
    return value


def run(args) -> int:
    from probes.report import explain, memory_map
    from probes.report.paths import file_safe

    gens = args.generation or [DEFAULT_GENERATION]
    # A full layout text does not depend on the generation: explain it once.
    jobs = [(text, None if "{" in text else gen) for text in args.shapes
            for gen in (gens[:1] if "{" in text else gens)]
    if args.png and len(jobs) > 1 and not any(k in args.png for k in ("{generation}", "{shape}")):
        raise ValueError("--png with several shapes or generations needs {generation} or {shape} "
                         "in the file name")
    for text, gen in jobs:
        e = explain.explain(text, gen, args.host_blocks, args.layers, args.sharding)
        print(explain.render(e) + "\n")
        if args.png:
            path = args.png.format(generation=gen or "given", shape=file_safe(str(e.shape)))
            memory_map.draw(e.shape, path, title=e.slices.reason or "addressable",
                            remedy=(f"remedy: {e.remedy.change}", e.remedy.shape) if e.remedy else None)
            print(f"  memory map      {path}\n")
    return 0


COMMAND = Command("explain", "the layout a TPU picks for a shape, and its block slices", arguments, run)
