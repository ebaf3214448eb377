"""Benchmark: the reference manager's d2h and h2d GB/s on the simulated device,
with the ratio to np.copyto of the same bytes measured in the same run, the
per-block overhead of small blocks, and d2h_auto_allocate against d2h of the
same blocks (with the cost of allocating and unlocking one chunk)."""

from __future__ import annotations

import argparse

import numpy as np

import kvref
from probes.bench.timing import best_interleaved, best_seconds


def manager_for(shape_text: str):
    shape = kvref.Shape.parse(shape_text)
    dev = kvref.SimDevice()
    rows = shape.dims[0]
    cache = dev.put(np.random.default_rng(0).integers(0, 127, shape.dims).astype(shape.element.numpy),
                    shape=shape)
    return kvref.KVCacheManager([cache], rows), rows


COPY_TARGET = 1.5  # d2h and h2d against one thread's np.copyto of the same bytes


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
    print(f"  d2h        {gb / d2h:6.2f} GB/s  {copy / d2h:.2f}x copy (target {COPY_TARGET:.1f}x)")
    print(f"  h2d        {gb / h2d:6.2f} GB/s  {copy / h2d:.2f}x copy (target {COPY_TARGET:.1f}x)")


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


AUTO_ALLOCATE_TARGET = 1.05  # d2h_auto_allocate within 5% of d2h
CHUNK_CALL_TARGET_US = 2.0  # allocating and unlocking one chunk


def auto_allocate(shape_text: str, repeats: int) -> None:
    """Every block saved into chunks the manager picks, then unlocked, against
    d2h of the same blocks into host blocks the caller names; the difference
    per block is what allocating and unlocking one chunk costs."""
    m, rows = manager_for(shape_text)
    blocks = np.random.default_rng(1).permutation(rows)  # no two blocks merge into one copy
    host = np.arange(rows)

    def save_and_unlock():
        chunks, future = m.d2h_auto_allocate(blocks)
        future.result()
        m.unlock_blocks(chunks)

    d2h, auto = best_interleaved([lambda: m.d2h(blocks, host).result(), save_and_unlock], repeats)
    per_chunk = max(0.0, auto - d2h) / rows
    print(f"{rows} blocks of {m.bytes_per_block // 1024} KiB ({shape_text}), best of {repeats}")
    print(f"  d2h                       {d2h * 1e3:7.3f} ms  (baseline)")
    print(f"  d2h_auto_allocate+unlock  {auto * 1e3:7.3f} ms  {auto / d2h:.3f}x d2h "
          f"(target {AUTO_ALLOCATE_TARGET:.2f}x); allocating and unlocking costs "
          f"{per_chunk * 1e6:.3f} us a chunk (target {CHUNK_CALL_TARGET_US:.1f} us)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    throughput("bf16[64,128,1024]{2,1,0:T(8,128)(2,1)}", args.repeats)  # 16 MiB: the copies stay in cache
    throughput("bf16[1024,128,1024]{2,1,0:T(8,128)(2,1)}", args.repeats)  # 256 MiB: more than any cache holds
    per_block_overhead("f32[4096,1024]{1,0}", args.repeats)
    auto_allocate("bf16[64,128,1024]{2,1,0:T(8,128)(2,1)}", args.repeats)  # 64 blocks of 256 KiB
    auto_allocate("f32[4096,256]{1,0}", args.repeats)  # many small blocks: the per-chunk cost shows


if __name__ == "__main__":
    main()
