"""Random call sequences for `kvprobe fuzz`: shapes whose rows are byte ranges
on the target, a host pool, and d2h/h2d requests, valid and invalid, some
split between two threads (run by probes.suite.call_sequence)."""

from __future__ import annotations

import kvref
from probes.fuzz.kvref_api import random_request
from probes.iut.registry import iut
from probes.suite.ownership import row_byte_ranges

# Float contents only: one library reads its host pool back as float32 values.
SHAPES = ("bf16[64,8,128]", "f32[32,4,256]", "bf16[128,2,128]", "bf16[16,8,2048]", "f32[64,1,128]")


def addressable_shapes(iut_name: str, generation: str) -> list[str]:
    """The sequence shapes whose rows are byte ranges on this target."""
    declared = iut(iut_name)
    return [text for text in SHAPES
            if row_byte_ranges(str(declared.layout_of(generation, kvref.ShapeKey.parse(text))[0])).contiguous]


def random_sequence(rng, shapes: list[str], length: int = 10) -> dict:
    key = kvref.ShapeKey.parse(shapes[int(rng.integers(len(shapes)))])
    rows = key.dims[0]
    host_blocks = int(rng.integers(1, 2 * rows))
    calls = []
    for _ in range(length):
        if rng.random() < 0.15 and min(rows, host_blocks) >= 2:
            # one valid request split between two threads: disjoint destinations
            request = random_request(rng, rows, host_blocks, bool(rng.random() < 0.5), valid=True)
            while len(request["src"]) < 2:
                request = random_request(rng, rows, host_blocks, request["d2h"], valid=True)
            half = len(request["src"]) // 2
            calls.append({"concurrent": [{**request, "src": request["src"][:half], "dst": request["dst"][:half]},
                                         {**request, "src": request["src"][half:], "dst": request["dst"][half:]}]})
        else:
            calls.append(random_request(rng, rows, host_blocks, bool(rng.random() < 0.5),
                                        valid=bool(rng.random() < 0.6)))
    return {"shape": str(key), "layers": int(rng.integers(1, 3)), "host_blocks": host_blocks,
            "mode": "deferred" if rng.random() < 0.2 else "put", "calls": calls}


