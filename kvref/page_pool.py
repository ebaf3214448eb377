"""The page pool a parent lends to the workers it forks (csrc/page_pool.h says
why): a parent reserves it before forking, each worker attaches to a slot,
and the simulated device's memory then comes from that slot. NumPy arrays
come from it only inside `lent_arrays()`: a probe's own contents and
readbacks, never an implementation's host memory, which probes measure as
the process's own."""

from __future__ import annotations

import contextlib

from kvref import _core

reserve = _core.reserve_page_pool
attach = _core.attach_page_pool
stats = _core.page_pool_stats


@contextlib.contextmanager
def lent_arrays():
    """NumPy arrays of 256 KiB or more made inside (in this thread's context)
    come from this worker's slot, zero-filled; elsewhere, and in a process
    with no slot, NumPy allocates as it always does."""
    if not _core.page_pool_attached():
        yield
        return
    replaced = _core.set_array_memory(_core.page_pool_array_memory)
    try:
        yield
    finally:
        _core.set_array_memory(replaced)
