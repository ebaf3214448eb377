"""Probe work on several threads at once, always bounded in time: a lock
taken in opposite orders must show as a failure that names it, never as a
wait without end."""

from __future__ import annotations

import threading
import time
from typing import Callable, Sequence


def unfinished(works: Sequence[Callable[[], None]], seconds: float) -> int:
    """Run each callable on a daemon thread of its own, all at once, and wait
    up to `seconds` in all: how many were still running then. Each callable
    catches and reports its own errors."""
    threads = [threading.Thread(target=work, daemon=True) for work in works]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + seconds
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return sum(thread.is_alive() for thread in threads)
