"""One way to wait for what another thread or process brings about: ask a
condition again and again, bounded in time and in count."""

from __future__ import annotations

import time
from typing import Callable


def wait_for(condition: Callable[[], object], seconds: float, interval: float = 0.01) -> bool:
    """Ask `condition()` until it holds or `seconds` have passed, sleeping
    `interval` between asks (at most seconds / interval + 2 asks, however
    fast it answers); whether it held when last asked."""
    deadline = time.monotonic() + seconds
    for _ in range(int(seconds / interval) + 1):
        if condition():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(interval, left))
    return bool(condition())
