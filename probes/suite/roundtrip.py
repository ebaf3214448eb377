"""Blocks moved out and back: the per-shape round trip, and the same over
layers of different block sizes."""

from __future__ import annotations

import time

import numpy as np

import kvref
from probes.iut.adapter import Adapter
from probes.suite.cases import Case
from probes.suite import sharded
from probes.suite.permutations import has_equal_rows, moving_permutations, wrong_after
from probes.suite.refusals import refused
from probes.suite.verdicts import CORRUPT, ERROR, PASS, Outcome

# mixed_slices' second layer; its first is the probe's subject.
MIXED_SECOND_LAYER = kvref.ShapeKey("bf16", (512, 16, 2048))


def roundtrip(case: Case, iut: Adapter) -> Outcome:
    """Distinct pattern per block, d2h in one permutation, scramble the
    device, h2d back in another, compare byte-exact. A matrix row's cache
    with a sharding is made over a mesh and read back device by device
    (probes.suite.sharded)."""
    if case.sharding:
        return sharded.round_trips(case, iut, [(case.sharding, case.shape)])
    cache, host = iut.make_cache(case.shape, case.seed)
    try:
        manager = iut.manager([cache], case.shape.dims[0])
    except Exception as e:  # a clean refusal, or the worker's ERROR
        return refused(iut, e)
    return permuted_round_trip(iut, manager, [cache], [host], case.seed)


def mixed_slices(case: Case, iut: Adapter) -> Outcome:
    """Layers with different block sizes: one uniform manager must refuse them,
    or, if it takes them, move every layer's blocks exactly."""
    pairs = [iut.make_cache(key, case.seed + i) for i, key in enumerate((case.shape, MIXED_SECOND_LAYER))]
    try:
        manager = iut.manager([c for c, _ in pairs], 512)
    except Exception as e:  # a clean refusal, or the worker's ERROR
        return refused(iut, e)
    return permuted_round_trip(iut, manager, [c for c, _ in pairs], [h for _, h in pairs], case.seed)


def permuted_round_trip(iut: Adapter, manager, caches, hosts, seed: int, fetch=None) -> Outcome:
    """d2h every block in one permutation, scramble the device, h2d back in
    another; device block perm_b[j] must then hold what block perm_a[j] held.
    No block comes back to where it started, and every block's contents are
    distinct, so a block that did not move is seen even where the device
    cannot be scrambled in place. `fetch(layer)` reads a layer back (default:
    the IUT's fetch of its cache)."""
    rows = min(c.shape[0] for c in hosts)
    for layer, host in enumerate(hosts):
        if has_equal_rows(host[:rows]):
            return Outcome(ERROR, f"layer {layer}: two blocks hold the same bytes, so a block "
                           "that did not move could pass; use contents with distinct blocks")
    perm_a, perm_b = moving_permutations(rows, seed + 1)
    start = time.perf_counter()
    iut.d2h(manager, perm_a, np.arange(rows))
    moved = time.perf_counter() - start
    for cache in caches:
        iut.scramble(cache)
    start = time.perf_counter()
    iut.h2d(manager, np.arange(rows), perm_b)
    moved += time.perf_counter() - start
    bytes_moved = 2 * rows * sum(manager.layer_bytes_per_block) * manager.num_shards
    for layer, (cache, host) in enumerate(zip(caches, hosts)):
        got = fetch(layer) if fetch else iut.fetch(cache)
        wrong = wrong_after(got, host, perm_a, perm_b)
        if wrong.any():
            return Outcome(CORRUPT, f"layer {layer}: {int(wrong.sum())} of {rows} rows differ after a "
                           f"permuted round trip (first: row {int(np.argmax(wrong))})",
                           host_bytes=manager.host_bytes, bytes_moved=bytes_moved, seconds=moved)
    how = "" if iut.arrays.scrambles_in_place else \
        " (device not scrambled in place: every block moved, none came back to its place)"
    return Outcome(PASS, f"{rows} blocks round-tripped byte-exact{how}", host_bytes=manager.host_bytes,
                   bytes_moved=bytes_moved, seconds=moved)
