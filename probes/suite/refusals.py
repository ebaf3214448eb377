"""How probes read a manager's exceptions: which count as a clean refusal,
and the one-line form details quote."""

from __future__ import annotations

import kvref

# Refusals a manager may give for input it cannot handle.
CLEAN_REFUSALS = (kvref.LayoutError, kvref.HostBudgetError, ValueError)


def first_line(e: BaseException) -> str:
    """The exception as `Type: first line of its message`, for one-line details."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
