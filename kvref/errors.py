"""Exceptions kvref raises."""

from kvref import _core

# A d2h_auto_allocate the host pool cannot hold; no chunk was taken (a ValueError).
HostPoolExhausted = _core.HostPoolExhausted


class LayoutError(ValueError):
    """A layout is malformed, or cannot do what was asked of it (for example,
    its dim-0 rows are not contiguous byte ranges)."""


class HostBudgetError(MemoryError):
    """The host pool would exceed the budget; nothing was allocated."""


class PoolTooLarge(HostBudgetError):
    """The host pool would be larger than one pool's offsets can address,
    whatever the budget; nothing was allocated."""


class NotAnInteger(TypeError, ValueError):
    """A value that must be an integer is not one (a bool, a float, a time
    span, a string...). A TypeError, and a ValueError like every other
    refused block list."""


class NotAFlag(TypeError):
    """A value that must be a bool is not one."""


class PeerTransferFailed(RuntimeError):
    """A host-to-host transfer that failed after it was accepted: the peer
    refused it, went away, or answered what was not asked."""
