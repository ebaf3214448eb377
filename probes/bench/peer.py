"""Benchmark: d2h and h2d GB/s of the reference and of tpu-sync-jax on the
same JAX CPU arrays, in the same run, with the ratio (target: the reference
at least 1.5x the production library). Runs in the peer environment:
`.venv-peer/bin/python -m probes.bench.peer`, in a network namespace of its own
with only lo (it re-executes itself under `unshare -rn` before importing the
library, which listens on every interface); where none can be made, the
production library's part is SKIP with the reason and the reference's runs."""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

import kvref  # noqa: E402
from probes.bench.timing import best_seconds  # noqa: E402
from probes.iut import JaxSyncManager  # noqa: E402
from probes.run import netns  # noqa: E402


TARGET = 1.5  # the reference against the production library on the same arrays


def main(argv=None) -> None:
    no_namespace = netns.enter()  # first: nothing of tpu_sync is imported yet
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 16],
                        help="layers of 16 MiB per run (default: 2, which stay in cache, and 16, which do not)")
    args = parser.parse_args(argv)
    for layers in args.layers:
        compare(layers, args.repeats, no_namespace)


def compare(layers: int, repeats: int, no_namespace: str | None) -> None:
    """Both libraries over the same `layers` JAX CPU arrays of 64 blocks of 256 KiB."""
    import jax.numpy as jnp

    rows, dims = 64, (64, 128, 1024)  # 256 KiB blocks
    rng = np.random.default_rng(0)
    caches = [jnp.asarray(rng.integers(-8, 8, dims).astype(kvref.element_type("bf16").numpy))
              for _ in range(layers)]
    reference = kvref.KVCacheManager(caches, rows)
    perm, host = rng.permutation(rows).tolist(), list(range(rows))
    moved = layers * rows * reference.bytes_per_block
    total = moved / 1e9

    timings = {
        ("reference", "d2h"): lambda: reference.d2h(perm, host).result(),
        ("reference", "h2d"): lambda: reference.h2d(host, perm).result(),
    }
    if not no_namespace:
        production = JaxSyncManager(caches, rows, {}).manager  # as its users build it
        timings[("tpu-sync-jax", "d2h")] = lambda: production.d2h(perm, host).Await()
        timings[("tpu-sync-jax", "h2d")] = lambda: production.h2d(host, perm).Await()
    gbps = {key: total / best_seconds(fn, repeats) for key, fn in timings.items()}
    print(f"{layers} layers x {rows} blocks of {reference.bytes_per_block // 1024} KiB "
          f"({moved >> 20} MiB), JAX CPU arrays, best of {repeats}")
    for direction in ("d2h", "h2d"):
        if no_namespace:
            print(f"  {direction}: reference {gbps[('reference', direction)]:6.2f} GB/s   "
                  f"tpu-sync-jax SKIP: {no_namespace}")
            continue
        ref, prod = gbps[("reference", direction)], gbps[("tpu-sync-jax", direction)]
        print(f"  {direction}: reference {ref:6.2f} GB/s   tpu-sync-jax {prod:6.2f} GB/s   "
              f"ratio {ref / prod:.2f}x (target {TARGET:.1f}x)")


if __name__ == "__main__":
    main()
