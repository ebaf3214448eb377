"""Block permutations for round trips, and the checks on what they leave:
every block lands somewhere else, and every block's bytes are distinct."""

from __future__ import annotations

import numpy as np


def moving_permutations(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(perm_a, perm_b), random, with perm_b[j] != perm_a[j] for every j when
    rows > 1: device block perm_a[j] goes out to host j and back into
    perm_b[j], so every block lands somewhere else."""
    rng = np.random.default_rng(seed)
    perm_a = rng.permutation(rows)
    cycle = rng.permutation(rows)  # one cycle through every j: a derangement
    shift = np.empty(rows, dtype=np.int64)
    shift[cycle] = np.roll(cycle, -1)
    return perm_a, perm_a[shift]


def has_equal_rows(host: np.ndarray) -> bool:
    """Whether two dim-0 rows hold the same bytes: rows are sorted by a
    checksum, and only rows whose checksums are equal are compared in full."""
    rows = _byte_rows(host)
    if len(rows) < 2:
        return False
    words = _words(rows)
    sums = words.sum(axis=1, dtype=np.uint64)  # wraps mod 2**64: a checksum
    order = np.argsort(sums, kind="stable")
    for a, b in zip(order[:-1], order[1:]):
        if sums[a] == sums[b] and np.array_equal(rows[a], rows[b]):
            return True
    return False


def expected_after(host: np.ndarray, perm_a, perm_b) -> np.ndarray:
    """What the device holds after d2h in perm_a and h2d into perm_b."""
    out = np.empty_like(host)
    _byte_rows(out)[perm_b] = _byte_rows(host)[perm_a]  # bytes: fast whatever the dtype
    return out


def wrong_after(got: np.ndarray, host: np.ndarray, perm_a, perm_b) -> np.ndarray:
    """Per dim-0 row of `got`, whether it differs from what the device holds
    after d2h in perm_a and h2d into perm_b (expected_after), compared row
    by row in place, without making that copy."""
    have, had = _words(_byte_rows(got)), _words(_byte_rows(host))
    wrong = np.zeros(len(got), dtype=bool)
    for came_from, into in zip(perm_a.tolist(), perm_b.tolist()):
        wrong[into] = not np.array_equal(have[into], had[came_from])
    return wrong


def _byte_rows(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(len(array), -1).view(np.uint8)


def wrong_rows(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Per dim-0 row, whether its bytes differ."""
    rows = expected.shape[0]
    return (_words(got.view(np.uint8).reshape(rows, -1)) != _words(expected.view(np.uint8).reshape(rows, -1))).any(1)


def _words(rows: np.ndarray) -> np.ndarray:
    """Byte rows as 8-byte words where they split evenly (an eighth of the
    elements to sum or compare), else as they are."""
    return rows if rows.shape[1] % 8 else rows.view(np.uint64)
