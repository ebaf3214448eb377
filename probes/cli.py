"""The `kvprobe` command."""

from __future__ import annotations

import argparse
import sys

from kvref.generations import GENERATIONS


def _generations(value: str) -> list[str]:
    names = list(GENERATIONS) if value == "all" else [v.strip() for v in value.split(",")]
    for name in names:
        if name not in GENERATIONS:
            raise argparse.ArgumentTypeError(
                f"unknown generation {name!r}; expected one of {', '.join(GENERATIONS)} or 'all'")
    return names


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return n


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvprobe", description=(
        "Qualify KV-cache block offload against TPU layouts."))
    sub = parser.add_subparsers(dest="command", required=True)

    ex = sub.add_parser("explain", help="the layout a TPU picks for a shape, and its block slices")
    ex.add_argument("shapes", nargs="+", metavar="SHAPE",
                    help="'bf16[512,3,2048]' (layout from the compiler) or a full XLA layout text")
    ex.add_argument("--generation", "-g", type=_generations, default=None,
                    help="one, several (comma-separated) or 'all' (default tpu7x)")
    ex.add_argument("--host-blocks", type=_positive, default=None,
                    help="host blocks per layer for the host-pool estimate (default: dims[0])")
    ex.add_argument("--layers", type=_positive, default=1, help="layers for the host-pool estimate")
    ex.add_argument("--png", help="draw the physical memory map to this file "
                    "(one shape and generation; use {generation} in the name for several)")
    ex.set_defaults(run=_explain)
    return parser


def _explain(args) -> int:
    from probes import explain, memory_map

    gens = args.generation or ["tpu7x"]
    # A full layout text does not depend on the generation: explain it once.
    jobs = [(text, None if "{" in text else gen) for text in args.shapes
            for gen in (gens[:1] if "{" in text else gens)]
    if args.png and len(jobs) > 1 and not any(k in args.png for k in ("{generation}", "{shape}")):
        raise ValueError("--png with several shapes or generations needs {generation} or {shape} "
                         "in the file name")
    for text, gen in jobs:
        e = explain.explain(text, gen, args.host_blocks, args.layers)
        print(explain.render(e) + "\n")
        if args.png:
            path = args.png.format(generation=gen or "given", shape=_file_safe(str(e.shape)))
            memory_map.draw(e.shape, path, title=e.slices.reason or "addressable")
            print(f"  memory map      {path}\n")
    return 0


def _file_safe(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, RuntimeError) as e:
        print(f"kvprobe: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
