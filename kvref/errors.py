"""Exceptions kvref raises."""

from kvref import _core

# A d2h_auto_allocate the host pool cannot hold; no chunk was taken (a ValueError).
HostPoolExhausted = _core.HostPoolExhausted


class LayoutError(ValueError):
    """A layout is malformed, or cannot do what was asked of it (for example,
    its dim-0 rows are not contiguous byte ranges)."""


class HostBudgetError(MemoryError):
    """The host pool would exceed the budget; nothing was allocated."""
