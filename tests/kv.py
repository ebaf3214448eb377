"""Helpers for manager tests: caches with a distinct pattern per block, and
permuted round trips."""

from __future__ import annotations

import numpy as np

import kvref
from probes.iut import random_host


def random_cache(device: kvref.SimDevice, dtype: str, dims, seed: int = 0, shape=None):
    """A device array (put from the host) with random contents, and those contents."""
    host = random_host(dtype, dims, seed)
    return device.put(host, shape=shape), host


def permuted_round_trip(manager: kvref.KVCacheManager, caches, seed: int = 1) -> None:
    """d2h every block in one permutation, scramble the device, h2d back in
    another. Afterwards device block perm_b[j] should hold what block perm_a[j] held."""
    rng = np.random.default_rng(seed)
    rows = caches[0].dims[0]
    perm_a, perm_b = rng.permutation(rows), rng.permutation(rows)
    manager.d2h(perm_a, np.arange(rows)).result(timeout=60)
    for cache in caches:
        cache.fill_(0)
        cache.await_buffer()
    manager.h2d(np.arange(rows), perm_b).result(timeout=60)
    return perm_a, perm_b


def expected_after(host: np.ndarray, perm_a, perm_b) -> np.ndarray:
    out = np.empty_like(host)
    out[perm_b] = host[perm_a]
    return out


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))
