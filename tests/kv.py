"""Helpers for manager tests: caches with random contents, and the roundtrip
probe's own permuted round trip run on them."""

from __future__ import annotations

import kvref
from probes.iut.host_data import random_host
from probes.iut.registry import adapter_for
from probes.suite.roundtrip import permuted_round_trip
from probes.suite.verdicts import Outcome


def random_cache(device: kvref.SimDevice, dtype: str, dims, seed: int = 0, shape=None):
    """A device array (put from the host) with random contents, and those contents."""
    host = random_host(kvref.ShapeKey(dtype, dims), seed)
    return device.put(host, shape=shape), host


def round_trip(manager: kvref.KVCacheManager, caches, hosts, seed: int = 0) -> Outcome:
    """d2h every block in one permutation, scramble the device, h2d back in
    another, compare byte-exact: the roundtrip probe's check, on simulated
    caches of any device. PASS, or CORRUPT naming the first wrong layer."""
    return permuted_round_trip(adapter_for("kvref-sim", "tpu7x"), manager, caches, hosts, seed)
