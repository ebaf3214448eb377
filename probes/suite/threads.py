"""Probe work on several threads at once, always bounded in time: a lock
taken in opposite orders must show as a failure that names it, never as a
wait without end."""

from __future__ import annotations

import threading
import time
from typing import Callable, Sequence


def unfinished(works: Sequence[Callable[[], None]], seconds: float, progress: Callable[[], int] | None = None,
               most_seconds: float | None = None) -> int:
    """Run each callable on a daemon thread of its own, all at once, and wait
    up to `seconds` in all: how many were still running then. Each callable
    catches and reports its own errors. With `progress` (a count the works
    raise as they go), the wait ends only once `seconds` pass with no
    progress, or at `most_seconds`: a slow machine's works finish, a lock
    that stops them all is found as quickly as before."""
    threads = [threading.Thread(target=work, daemon=True) for work in works]
    for thread in threads:
        thread.start()
    start = time.monotonic()
    stalled_at, seen = start + seconds, progress() if progress else 0
    end = start + (most_seconds if progress and most_seconds else seconds)
    for thread in threads:
        while thread.is_alive() and time.monotonic() < min(stalled_at, end):
            thread.join(min(0.1, max(0.0, min(stalled_at, end) - time.monotonic())))
            if progress is not None and (now := progress()) != seen:
                seen, stalled_at = now, time.monotonic() + seconds
    return sum(thread.is_alive() for thread in threads)