"""Rebuild the shipped layout table from the live compiler:
`python -m kvref.oracle.refresh [--generation G ...]`.

Every answer's physical size from kvref's layout model must equal the size the
compiler reports; a mismatch stops the refresh, since the table would then
teach the model something false."""

from __future__ import annotations

import argparse
import datetime
import sys
import time

from kvref.generations import GENERATIONS
from kvref.oracle import compiler, table, table_key
from kvref.oracle.table_shapes import sharded_table_shapes, table_shapes
from kvref.shape_key import ShapeKey


def refresh(generations=GENERATIONS, out=table.TABLE_PATH) -> dict:
    data = {
        "versions": compiler.versions(),
        "generated": datetime.date.today().isoformat(),
        "generations": {},
    }
    shapes = table_shapes()
    for gen in generations:
        start = time.perf_counter()
        layouts, kind = {}, ""
        for dtype, dims, sharding in [(d, s, None) for d, s in shapes] + sharded_table_shapes():
            answer = compiler.compile_layout(dtype, dims, gen, sharding)
            if answer.shape.physical_size_bytes != answer.output_bytes:
                raise SystemExit(f"{gen}: model size {answer.shape.physical_size_bytes} != compiler "
                                 f"size {answer.output_bytes} for {answer.shape}")
            layouts[table_key(ShapeKey(dtype, dims), sharding)] = [str(answer.shape), answer.output_bytes]
            kind = answer.device_kind
        data["generations"][gen] = {"device_kind": kind, "layouts": layouts,
                                    "remedies": _remedies(shapes, layouts, gen)}
        print(f"{gen}: {len(layouts)} shapes in {time.perf_counter() - start:.1f}s", file=sys.stderr)
    table.save(data, out)
    return data


def _remedies(shapes, layouts: dict, generation: str) -> dict:
    """The cheapest remedy of every table shape whose blocks interleave, each
    candidate asked of the compiler."""
    from kvref import remedies
    from kvref.shape import Shape
    from kvref.slices import major_slice

    found = {}
    for dtype, dims in shapes:
        key = ShapeKey(dtype, dims)
        original = Shape.parse(layouts[str(key)][0])
        if not major_slice(original).addressable:
            best = remedies.remedies(key, generation, original)
            found[str(key)] = remedies.shipped_entry(best[0] if best else None)
    return found


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generation", action="append", choices=GENERATIONS,
                        help="generations to compile (default: all)")
    args = parser.parse_args(argv)
    refresh(tuple(args.generation or GENERATIONS))


if __name__ == "__main__":
    main()
