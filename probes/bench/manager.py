"""Benchmark: the reference manager's d2h and h2d GB/s on the simulated device,
with the ratio to np.copyto of the same bytes measured in the same run, and
the per-block overhead of small blocks."""

from __future__ import annotations

import argparse

import numpy as np

import kvref
from probes.bench.timing import best_seconds


def manager_for(shape_text: str):
    shape = kvref.Shape.parse(shape_text)
    dev = kvref.SimDevice("tpu7x")
    rows = shape.dims[0]
    cache = dev.put(np.random.default_rng(0).integers(0, 127, shape.dims).astype(shape.element.numpy),
                    shape=shape)
    return kvref.KVCacheManager([cache], rows), rows


def throughput(shape_text: str, repeats: int) -> None:
    m, rows = manager_for(shape_text)
    perm = np.random.default_rng(1).permutation(rows)  # no two blocks merge into one copy
    host = np.arange(rows)
    total = rows * m.bytes_per_block
    src = np.random.default_rng(2).integers(0, 255, total, dtype=np.uint8)
    dst = np.empty_like(src)
    copy = best_seconds(lambda: np.copyto(dst, src), repeats)
    d2h = best_seconds(lambda: m.d2h(perm, host).result(), repeats)
    h2d = best_seconds(lambda: m.h2d(host, perm).result(), repeats)
    gb = total / 1e9
    print(f"{rows} blocks of {m.bytes_per_block // 1024} KiB ({shape_text}), best of {repeats}")
    print(f"  np.copyto  {gb / copy:6.2f} GB/s  (baseline)")
    print(f"  d2h        {gb / d2h:6.2f} GB/s  {copy / d2h:.2f}x copy")
    print(f"  h2d        {gb / h2d:6.2f} GB/s  {copy / h2d:.2f}x copy")


def per_block_overhead(shape_text: str, repeats: int) -> None:
    m, rows = manager_for(shape_text)
    perm = np.random.default_rng(1).permutation(rows)
    host = np.arange(rows)
    block = m.bytes_per_block
    src = np.random.default_rng(2).integers(0, 255, rows * block, dtype=np.uint8)
    dst = np.empty_like(src)
    copy = best_seconds(lambda: np.copyto(dst, src), repeats)
    d2h = best_seconds(lambda: m.d2h(perm, host).result(), repeats)
    print(f"{rows} blocks of {block // 1024} KiB ({shape_text}), best of {repeats}")
    print(f"  d2h {d2h / rows * 1e6:.2f} us per block; np.copyto of the same bytes "
          f"{copy / rows * 1e6:.2f} us per block; overhead {(d2h - copy) / rows * 1e6:.2f} us per block")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    throughput("bf16[64,128,1024]{2,1,0:T(8,128)(2,1)}", args.repeats)
    per_block_overhead("f32[4096,1024]{1,0}", args.repeats)


if __name__ == "__main__":
    main()
