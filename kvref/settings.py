"""The manager's settings a serving engine passes through unchecked (often
from the environment): each checked here, with an error naming the setting,
the value and what was expected."""

from __future__ import annotations

import math

import numpy as np

from kvref.values import integer

MAX_PARALLELISM = 1024  # parts per transfer; more only costs threads and bookkeeping


def check_parallelism(value) -> int | None:
    """None (the copy pool's threads) or an integer in [1, MAX_PARALLELISM]."""
    return None if value is None else integer(value, "parallelism", 1, MAX_PARALLELISM)


MAX_TIMEOUT_S = 1e7  # a wait's limit converts to the steady clock's int64 nanoseconds: far below their 292 years


def check_timeout(value) -> float | None:
    """None (no limit) or a positive, finite number of seconds."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"timeout_s must be a number of seconds, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"timeout_s must be positive and finite, got {value!r}")
    if value > MAX_TIMEOUT_S:
        raise ValueError(f"timeout_s must be at most {MAX_TIMEOUT_S:.0f} s (about 116 days: past what the "
                         f"waits' clocks hold, every wait would fail at once), got {value!r}")
    return float(value)
