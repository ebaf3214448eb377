"""The +221 GiB case: a host pool sized from a whole-buffer "slice"."""

from __future__ import annotations

import gc

from probes.iut.adapter import Adapter
from probes.suite.cases import Case
from probes.suite.ownership import row_byte_ranges
from probes.suite.refusals import first_line, refused
from probes.suite.verdicts import ERROR, PASS, Outcome

BUDGET_LAYERS, BUDGET_HOST_BLOCKS = 20, 1886
# How far the worker's address space may grow in this probe: a manager
# without a budget check must fail to allocate, not take the machine.
ADDRESS_SPACE_HEADROOM = 16 * 2**30
POOL_SLACK_BYTES = 256 * 2**20  # staging and threads cost something


def host_budget(case: Case, iut: Adapter) -> Outcome:
    """20 layers of bf16[512,3,2048] with 1886 host blocks. Where that layout
    interleaves blocks (every TPU generation) it must be refused before any
    host memory is allocated; where blocks are contiguous (dense CPU arrays)
    the pool must be exactly layers x blocks x block size: as the manager
    reports it, and as its address space grew (the judge for a manager that
    does not report its pool)."""
    caches = [iut.make_cache(case.shape, case.seed + i)[0] for i in range(BUDGET_LAYERS)]
    before = address_space_bytes()
    try:
        manager = iut.manager(caches, BUDGET_HOST_BLOCKS)
    except Exception as e:  # a clean refusal, a host OOM, or the worker's ERROR
        if isinstance(e, MemoryError) and not iut.refuses(e):
            return Outcome(ERROR, f"host OOM: the pool was allocated and failed: {first_line(e)}")
        return refused(iut, e)
    grown = address_space_bytes() - before
    rows = row_byte_ranges(str(iut.layout(case.shape)))
    if not rows.contiguous:
        return Outcome(ERROR, f"constructed over a layout whose blocks interleave; the address "
                       f"space grew by {grown:,} bytes", host_bytes=grown)
    expected = BUDGET_LAYERS * BUDGET_HOST_BLOCKS * rows.slice_bytes
    reported = manager.host_bytes
    if reported is not None and reported != expected:
        return Outcome(ERROR, f"reports a {reported:,}-byte host pool; expected {expected:,}",
                       host_bytes=reported)
    if reported is None and grown < expected:
        return Outcome(ERROR, f"the address space grew by only {grown:,} bytes for a {expected:,}-byte "
                       "pool, and the manager does not report its pool: its size cannot be judged",
                       host_bytes=grown)
    # A whole buffer per block costs 512x.
    if grown > 2 * expected + POOL_SLACK_BYTES:
        return Outcome(ERROR, f"the address space grew by {grown:,} bytes for a {expected:,}-byte "
                       "pool", host_bytes=grown)
    return Outcome(PASS, f"constructed; {expected:,}-byte pool, address space grew by {grown:,} bytes",
                   host_bytes=reported if reported is not None else grown)


REBUILDS = 20
REBUILD_HOST_BLOCKS = 4096
POOL_TOLERANCE = 0.01  # a pool may exceed what its blocks need by this share (and measure this much short)
FIXED_SLACK_BYTES = 64 * 2**20  # what the 20th manager may hold beyond the first (allocator caches)


def repeated_construction(case: Case, iut: Adapter) -> Outcome:
    """A manager built and dropped REBUILDS times over the same caches holds
    no more host memory than one, and its pool is within 1% of the bytes its
    blocks need: as the manager reports it, or, for one that does not, as
    the process's memory grows per host block (_pool_by_growth)."""
    caches = [iut.make_cache(case.shape, case.seed + i)[0] for i in range(2)]
    before = address_space_bytes()
    try:
        manager = iut.manager(caches, REBUILD_HOST_BLOCKS)
    except Exception as e:  # a clean refusal, or the worker's ERROR
        return refused(iut, e)
    one = address_space_bytes() - before
    per_block = sum(manager.layer_bytes_per_block) * manager.num_shards
    expected = per_block * REBUILD_HOST_BLOCKS
    reported = manager.host_bytes
    pool = reported if reported is not None else _pool_by_growth(iut, caches, expected)
    # Measured growth misses the odd page another mapping gave back meanwhile: within
    # the tolerance below the expected size, as above it, the pool is judged.
    if reported is None and pool < expected * (1 - POOL_TOLERANCE):
        return Outcome(ERROR, f"the manager does not report its pool, and the address space grew by only "
                       f"{pool:,} bytes for {expected:,} bytes of blocks: its size cannot be judged",
                       host_bytes=pool)
    if pool > expected * (1 + POOL_TOLERANCE):
        how = "reports" if reported is not None else f"takes {pool / REBUILD_HOST_BLOCKS:,.0f} bytes of " \
              f"memory per host block, so"
        return Outcome(ERROR, f"{how} a {pool:,}-byte pool for {expected:,} bytes of blocks "
                       f"({per_block:,} a block; allowed: 1% more)", host_bytes=pool)
    settled = address_space_bytes()  # one manager alive, whatever measuring it left mapped
    for _ in range(REBUILDS - 1):
        del manager
        gc.collect()
        manager = iut.manager(caches, REBUILD_HOST_BLOCKS)
    grown = address_space_bytes() - settled
    if grown > FIXED_SLACK_BYTES:
        return Outcome(ERROR, f"{REBUILDS - 1} more managers built and dropped in turn left {grown:,} more bytes "
                       f"of address space mapped than one (a {one:,}-byte manager)", host_bytes=grown)
    return Outcome(PASS, f"{REBUILDS} managers built and dropped in turn hold {grown:,} bytes more than one "
                   f"({one:,}); pool {pool:,} bytes for {expected:,} bytes of blocks", host_bytes=pool)


def _pool_by_growth(iut: Adapter, caches, expected: int, measurements: int = 3) -> int:
    """A pool of REBUILD_HOST_BLOCKS blocks as this process's memory sees it:
    two more managers alive beside the first, of N and 2N blocks; what the
    second costs beyond the first is N blocks of pool, and one-time and
    per-manager costs (threads, listeners) cancel out. Measured in address
    space and in resident anonymous memory (a library that fills its pool
    has it resident; thread stacks, which glibc reuses between threads and so
    map unevenly, are mostly not): the measure nearest the expected size, the
    median of `measurements` each."""
    found = {address_space_bytes: [], anonymous_resident_bytes: []}
    for _ in range(measurements):
        marks = {measure: measure() for measure in found}
        same = iut.manager(caches, REBUILD_HOST_BLOCKS)
        middles = {measure: measure() for measure in found}
        double = iut.manager(caches, 2 * REBUILD_HOST_BLOCKS)
        for measure, values in found.items():
            values.append((measure() - middles[measure]) - (middles[measure] - marks[measure]))
        del same, double
        gc.collect()
    medians = [sorted(values)[len(values) // 2] for values in found.values()]
    return min(medians, key=lambda pool: abs(pool - expected))


def anonymous_resident_bytes() -> int:
    return _status_bytes("RssAnon:")


def address_space_bytes() -> int:
    return _status_bytes("VmSize:")


def _status_bytes(field: str) -> int:
    """A field of /proc/self/status given in kB, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")
