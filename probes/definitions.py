"""The probes. Each takes a case and an adapter and returns an Outcome; a clean
refusal of input the reference also refuses is REJECTED, wrong bytes CORRUPT,
anything else unexpected ERROR. Hangs and crashes are the runner's to see."""

from __future__ import annotations

import time

import numpy as np

import kvref
from probes.cases import Case
from probes.iut import Adapter
from probes.verdicts import CORRUPT, ERROR, PASS, REJECTED, SKIP, Outcome

# The fixed inputs of the once-per-generation probes.
MIXED_SHAPES = (("bf16", (512, 8, 2048)), ("bf16", (512, 16, 2048)))
PLAN_SHAPE = ("bf16", (512, 8, 2048))
BUDGET_SHAPE, BUDGET_LAYERS, BUDGET_HOST_BLOCKS = ("bf16", (512, 3, 2048)), 20, 1886
SUBJECT_SHAPES = {"mixed_slices": MIXED_SHAPES[0], "plan_binding": PLAN_SHAPE,
                  "host_budget": BUDGET_SHAPE}

# Refusals a manager may give for input it cannot handle.
CLEAN_REFUSALS = (kvref.LayoutError, kvref.HostBudgetError, ValueError)


def roundtrip(case: Case, iut: Adapter) -> Outcome:
    """Distinct pattern per block, d2h in one permutation, scramble the
    device, h2d back in another, compare byte-exact."""
    cache, host = iut.make_cache(case.dtype, case.dims, case.seed)
    try:
        manager = iut.manager([cache], case.dims[0])
    except CLEAN_REFUSALS as e:
        return Outcome(REJECTED, first_line(e))
    return _permuted_round_trip(iut, manager, [cache], [host], case.seed)


def deferred_construction(case: Case, iut: Adapter) -> Outcome:
    """A manager over caches straight from DEFER_AND_FUSE must construct (the
    watchdog turns a hang into HANG) and leave the caches materialized."""
    caches = [iut.make_cache(case.dtype, case.dims, case.seed + i, mode="deferred")[0] for i in range(2)]
    try:
        manager = iut.manager(caches, 4)
    except CLEAN_REFUSALS as e:
        return Outcome(REJECTED, first_line(e))
    if not all(iut.is_materialized(c) for c in caches):
        return Outcome(ERROR, "constructed, but the caches are not materialized")
    return Outcome(PASS, "constructed over deferred caches", host_bytes=manager.host_bytes)


def host_transferred_construction(case: Case, iut: Adapter) -> Outcome:
    """Caches whose host->device copies are still landing: construction must
    wait for them, and the first blocks moved must be the landed bytes."""
    pairs = [iut.make_cache(case.dtype, case.dims, case.seed + i, mode="put", finite=True)
             for i in range(2)]
    caches = [c for c, _ in pairs]
    try:
        manager = iut.manager(caches, 4)
        iut.d2h(manager, [0, 1], [0, 1])
    except CLEAN_REFUSALS as e:
        return Outcome(REJECTED, first_line(e))
    for layer, (_, host) in enumerate(pairs):
        expected = kvref.pack(host, iut.layout(case.dtype, case.dims))
        block = manager.layer_bytes_per_block[layer]
        got = manager.read_block_bytes(layer, 1)
        if got != expected[block:2 * block].tobytes():
            return Outcome(CORRUPT, f"layer {layer}: block 1 moved before its host copy landed")
    return Outcome(PASS, "constructed over landing caches", host_bytes=manager.host_bytes)


def mixed_slices(case: Case, iut: Adapter) -> Outcome:
    """Layers with different block sizes: one uniform manager must refuse them,
    or, if it takes them, move every layer's blocks exactly."""
    pairs = [iut.make_cache(dtype, dims, case.seed + i) for i, (dtype, dims) in enumerate(MIXED_SHAPES)]
    try:
        manager = iut.manager([c for c, _ in pairs], 512)
    except CLEAN_REFUSALS as e:
        return Outcome(REJECTED, first_line(e))
    return _permuted_round_trip(iut, manager, [c for c, _ in pairs], [h for _, h in pairs], case.seed)


def plan_binding(case: Case, iut: Adapter) -> Outcome:
    """Plans as bytes and as the message are accepted; str and malformed bytes
    are refused with TypeError and ValueError."""
    cache, _ = iut.make_cache(*PLAN_SHAPE, case.seed)
    manager = iut.manager([cache], 4)
    checks = [
        ("bytes", iut.plan_request("p0").SerializeToString(), None),
        ("message", iut.plan_request("p1"), None),
        ("str", iut.plan_request("p2").SerializeToString().decode("latin-1"), TypeError),
        ("malformed bytes", b"\xff\xff\xff", ValueError),
    ]
    for i, (label, payload, expected) in enumerate(checks):
        try:
            manager.register_active_plan(f"p{i}", payload, is_sender=True)
        except NotImplementedError as e:
            return Outcome(SKIP, str(e))
        except Exception as e:  # compared with what this input should raise
            if expected is None or not isinstance(e, expected):
                return Outcome(ERROR, f"{label} plan: {first_line(e)}")
            continue
        if expected is not None:
            return Outcome(ERROR, f"{label} plan was accepted; expected {expected.__name__}")
    return Outcome(PASS, "bytes and message accepted; str and malformed refused")


def host_budget(case: Case, iut: Adapter) -> Outcome:
    """The +221 GiB case: 20 layers of bf16[512,3,2048] with 1886 host blocks.
    Where that layout interleaves blocks (every TPU generation) it must be
    refused before any host memory is allocated; where blocks are contiguous
    (dense CPU arrays) the pool must be exactly layers x blocks x block size."""
    caches = [iut.make_cache(*BUDGET_SHAPE, case.seed + i)[0] for i in range(BUDGET_LAYERS)]
    before = _address_space_bytes()
    try:
        manager = iut.manager(caches, BUDGET_HOST_BLOCKS)
    except (kvref.LayoutError, kvref.HostBudgetError) as e:
        return Outcome(REJECTED, first_line(e))
    except MemoryError as e:
        return Outcome(ERROR, f"host OOM: the pool was allocated and failed: {first_line(e) or 'MemoryError'}")
    grown = _address_space_bytes() - before
    info = kvref.major_slice(iut.layout(*BUDGET_SHAPE))
    if not info.addressable:
        return Outcome(ERROR, f"constructed over a layout whose blocks interleave; the address "
                       f"space grew by {grown:,} bytes", host_bytes=grown)
    expected = BUDGET_LAYERS * BUDGET_HOST_BLOCKS * info.slice_bytes
    reported = manager.host_bytes
    if reported is not None and reported != expected:
        return Outcome(ERROR, f"reports a {reported:,}-byte host pool; expected {expected:,}",
                       host_bytes=reported)
    # Staging and threads cost something; a whole buffer per block costs 512x.
    if grown > 2 * expected + POOL_SLACK_BYTES:
        return Outcome(ERROR, f"the address space grew by {grown:,} bytes for a {expected:,}-byte "
                       "pool", host_bytes=grown)
    return Outcome(PASS, f"constructed; {expected:,}-byte pool, address space grew by {grown:,} bytes",
                   host_bytes=reported if reported is not None else grown)


POOL_SLACK_BYTES = 256 * 2**20


def _address_space_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


PROBE_FUNCTIONS = {f.__name__: f for f in (roundtrip, deferred_construction,
                                           host_transferred_construction, mixed_slices,
                                           plan_binding, host_budget)}


def _permuted_round_trip(iut, manager, caches, hosts, seed) -> Outcome:
    rows = min(c.shape[0] for c in hosts)
    rng = np.random.default_rng(seed + 1)
    perm_a, perm_b = rng.permutation(rows), rng.permutation(rows)
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
        expected = np.empty_like(host)
        expected[perm_b] = host[perm_a]
        got = iut.fetch(cache)
        wrong = (got.view(np.uint8).reshape(rows, -1) != expected.view(np.uint8).reshape(rows, -1)).any(1)
        if wrong.any():
            return Outcome(CORRUPT, f"layer {layer}: {int(wrong.sum())} of {rows} rows differ after a "
                           f"permuted round trip (first: row {int(np.argmax(wrong))})",
                           host_bytes=manager.host_bytes, bytes_moved=bytes_moved, seconds=moved)
    return Outcome(PASS, f"{rows} blocks round-tripped byte-exact", host_bytes=manager.host_bytes,
                   bytes_moved=bytes_moved, seconds=moved)


def first_line(e: BaseException) -> str:
    """The exception as `Type: first line of its message`, for one-line details."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
