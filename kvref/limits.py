"""How much memory one call may ask for. Sizes are checked against the limit
before anything is allocated, so a layout too big for this machine is an
error saying how much was asked, not a failed allocation, and never a
machine brought to its knees by an allocation that did fit in RAM."""

from __future__ import annotations

import os

ENV_VAR = "KVREF_MAX_ALLOCATION_BYTES"  # a fixed limit instead of the memory available


class AllocationError(MemoryError):
    """A call would allocate more than the limit; nothing was allocated."""


def memory_available() -> int:
    """Bytes of memory available now (MemAvailable)."""
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def allocation_limit() -> int:
    fixed = os.environ.get(ENV_VAR)
    return int(fixed) if fixed else memory_available()


def check_allocation(nbytes: int, what: str) -> None:
    """AllocationError when `nbytes` for `what` is over the limit."""
    limit = allocation_limit()
    if nbytes > limit:
        raise AllocationError(f"{what} would allocate {nbytes:,} bytes ({nbytes / 2**30:.1f} GiB), "
                              f"over the {limit:,}-byte limit (the memory available now, or "
                              f"${ENV_VAR}); nothing was allocated")
