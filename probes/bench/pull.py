"""Benchmark: a pull between two reference managers (two processes' worth of
manager in one, over loopback gRPC) against np.copyto of the same bytes
measured in the same run, per pull size."""

from __future__ import annotations

import argparse

import numpy as np

import kvref
from kvref.polling import wait_for
from probes.bench.timing import best_seconds

POLL_SECONDS = 0.0005
LAYERS = 4


def managers(shape_text: str):
    shape = kvref.Shape.parse(shape_text)
    dev = kvref.SimDevice()
    rng = np.random.default_rng(0)
    made = []
    for listen in ("127.0.0.1:0", None):
        caches = [dev.put(rng.integers(0, 127, shape.dims).astype(shape.element.numpy), shape=shape)
                  for _ in range(LAYERS)]
        made.append(kvref.KVCacheManager(caches, 8, listen=listen, timeout_s=60))
    return made


def pull_once(producer, consumer, blocks: list[int], n: list[int]) -> None:
    n[0] += 1
    req = f"req-{n[0]}"
    producer.register_read(req, n[0], blocks)
    consumer.start_read(req, n[0], producer.get_local_endpoints()[0]["endpoint"], blocks, blocks[::-1])
    if not wait_for(lambda: req in consumer.poll_stats()[1], 60, POLL_SECONDS):
        raise TimeoutError(f"{req} did not land in 60s")


def throughput(shape_text: str, count: int, repeats: int) -> None:
    producer, consumer = managers(shape_text)
    blocks = list(range(count))
    total = count * LAYERS * producer.bytes_per_block
    src = np.random.default_rng(2).integers(0, 255, total, dtype=np.uint8)
    dst = np.empty_like(src)
    copy = best_seconds(lambda: np.copyto(dst, src), repeats)
    n = [0]
    pull = best_seconds(lambda: pull_once(producer, consumer, blocks, n), repeats)
    gb = total / 1e9
    print(f"{count} blocks x {LAYERS} layers of {producer.bytes_per_block // 1024} KiB ({shape_text}), "
          f"best of {repeats}")
    print(f"  np.copyto  {gb / copy:6.2f} GB/s  (baseline)")
    print(f"  pull       {gb / pull:6.2f} GB/s  {copy / pull:.3f}x copy")
    producer.close()
    consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for shape, count in (("bf16[256,8,1024]{2,1,0:T(8,128)(2,1)}", 32),
                         ("bf16[256,8,1024]{2,1,0:T(8,128)(2,1)}", 256)):
        throughput(shape, count, args.repeats)


if __name__ == "__main__":
    main()
