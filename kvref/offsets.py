"""Checking and converting the block-offset lists transfers take."""

from __future__ import annotations

import collections
import sys

import numpy as np

from kvref import _core
from kvref.errors import NotAnInteger
from kvref.values import INT64_MAX, integer


def block_list(values, name: str) -> np.ndarray:
    """A 1-D int64 array from a list or array of integers, or a ValueError
    naming the argument and what was wrong (with the value the caller gave)."""
    if isinstance(values, (str, bytes)) or np.isscalar(values):
        raise ValueError(f"{name} must be a list of block numbers, got {values!r}")
    # Only a program that imported numpy.ma holds a masked array; importing it here would cost every caller.
    masked = sys.modules.get("numpy.ma")
    if masked is not None and isinstance(values, masked.MaskedArray):
        raise ValueError(f"{name} is a masked array; a block list has no masked entries: pass plain integers")
    if isinstance(values, list):  # the common case, plain ints that fit in int64, checked at C speed
        exact = _core.exact_int64s(values)
        if exact is not None:
            return exact
    if not isinstance(values, np.ndarray):
        checked = []
        for i, value in enumerate(values):
            if np.ndim(value):
                raise ValueError(f"{name} must be 1-D, got a sequence at index {i}")
            checked.append(integer(value, f"{name}[{i}]", expected="an integer block number that fits in int64"))
        # Each element converts alone: NumPy would make a list of uint64 and int64 scalars float64.
        return np.array(checked, dtype=np.int64)
    array = values
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if array.size and (array.dtype == np.bool_ or array.dtype.kind not in "iu"):
        raise NotAnInteger(f"{name} must hold integers, got {array.dtype}")
    if array.dtype.kind == "u" and array.size and int(array.max()) > INT64_MAX:
        at = int(np.argmax(array > INT64_MAX))
        raise ValueError(f"{name}[{at}] must be an integer block number that fits in int64, "
                         f"got {int(array[at])}")
    return np.ascontiguousarray(array, dtype=np.int64)


def transfer_lists(src, dst, sizes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    src, dst = block_list(src, "src_offsets"), block_list(dst, "dst_offsets")
    sizes = np.ones_like(src) if sizes is None else block_list(sizes, "copy_sizes")
    if not (len(src) == len(dst) == len(sizes)):
        raise ValueError(f"src_offsets, dst_offsets and copy_sizes must have equal lengths, "
                         f"got {len(src)}, {len(dst)} and {len(sizes)}")
    return src, dst, sizes


def id_problem(ids: list[int], what: str, limit: int | None, whose: str, *, once: bool = True) -> str:
    """'' when `ids` name at least one of this manager's `whose` (device or
    host blocks), each in [0, limit) (limit None: the peer's, so only
    non-negative) and, if `once`, once; else what is wrong, naming the
    argument `what`."""
    if not ids:
        return f"{what} is empty; expected at least one of the {whose}"
    bad = [b for b in ids if b < 0 or (limit is not None and b >= limit)]
    if bad:
        bound = "non-negative" if limit is None else f"in [0, {limit}) (this manager's {whose})"
        return f"{what} must be {bound}, got {bad[0]}"
    repeated = sorted(b for b, n in collections.Counter(ids).items() if n > 1) if once else []
    if repeated:
        return f"{what} names {whose} {repeated[:8]} more than once; each is moved once"
    return ""
