"""Benchmark: pack and unpack GB/s for a tiled KV-cache layout, with the ratio
to np.copyto of the same bytes measured in the same run."""

from __future__ import annotations

import argparse

import numpy as np

import kvref
from probes.bench.timing import best_seconds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="bf16[512,16,2048]{2,1,0:T(8,128)(2,1)}")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)

    shape = kvref.Shape.parse(args.shape)
    rng = np.random.default_rng(0)
    logical = rng.integers(0, 256, shape.logical_elements * shape.element.numpy.itemsize,
                           dtype=np.uint8).view(shape.element.numpy).reshape(shape.dims)
    physical = np.empty(shape.physical_size_bytes, np.uint8)
    out = np.empty_like(logical)
    flat_in = logical.reshape(-1).view(np.uint8)
    flat_out = np.empty_like(flat_in)

    copy = best_seconds(lambda: np.copyto(flat_out, flat_in), args.repeats)
    pack = best_seconds(lambda: kvref.pack(logical, shape, out=physical), args.repeats)
    unpack = best_seconds(lambda: kvref.unpack(physical, shape, out=out), args.repeats)
    assert np.array_equal(out.view(np.uint8), logical.view(np.uint8)), "round trip failed"

    gb = flat_in.nbytes / 1e9
    print(f"{shape}: {flat_in.nbytes / 2**20:.0f} MiB, best of {args.repeats}")
    print(f"  np.copyto  {gb / copy:6.2f} GB/s  (baseline)")
    print(f"  pack       {gb / pack:6.2f} GB/s  {copy / pack:.2f}x copy")
    print(f"  unpack     {gb / unpack:6.2f} GB/s  {copy / unpack:.2f}x copy")


if __name__ == "__main__":
    main()
