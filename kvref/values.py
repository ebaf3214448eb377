"""What a caller's integers and flags may be, decided once for every check in
kvref: an integer is a Python or NumPy integer that fits in int64 (not a bool,
not a NumPy time span, which NumPy counts as an integer, not a 0-d array); a
flag is a Python or NumPy bool (not 1, not the string "false")."""

from __future__ import annotations

import numpy as np

from kvref.errors import NotAFlag, NotAnInteger

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def is_integer(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_, np.timedelta64))


def integer(value, name: str, low: int = INT64_MIN, high: int = INT64_MAX, *,
            expected: str | None = None, out_of_range=ValueError) -> int:
    """`value` as an int in [low, high], or an error naming `name`, what was
    expected and the value given (NotAnInteger, or `out_of_range`)."""
    expected = expected or _range_text(low, high)
    if not is_integer(value):
        raise NotAnInteger(f"{name} must be {expected}, got {_shown(value)}")
    if not low <= int(value) <= high:
        # Past int64 the bound goes unsaid in "a non-negative integer": name it.
        unsaid = int(value) > high and high == INT64_MAX and "int64" not in expected
        bound = f" no larger than {high} (int64)" if unsaid else ""
        raise out_of_range(f"{name} must be {expected}{bound}, got {int(value)}")
    return int(value)


REQUEST_ID_BYTES = 1024  # the longest request id, in UTF-8
UUID_MAX = 2**64 - 1  # a pull's uuid is a uint64 on the wire


def request_id(value) -> str:
    """A request id: non-empty text UTF-8 can carry (it crosses the wire in
    it), of at most REQUEST_ID_BYTES."""
    if not isinstance(value, str) or not value:
        raise TypeError(f"req_id must be a non-empty str, got {value!r}")
    try:
        size = len(value.encode())
    except UnicodeEncodeError as e:  # a lone surrogate: the pull would fail later, on the wire
        raise ValueError(f"req_id must be text UTF-8 can carry; {value[:64]!r} has {e.object[e.start:e.end]!r} "
                         f"at {e.start}") from None
    if size > REQUEST_ID_BYTES:
        raise ValueError(f"req_id must be at most {REQUEST_ID_BYTES} bytes in UTF-8, got {size}")
    return value


def request_uuid(value) -> int:
    return integer(value, "uuid", 0, UUID_MAX)


def flag(value, name: str) -> bool:
    """`value` as a bool, or NotAFlag naming `name` and the value given."""
    if not isinstance(value, (bool, np.bool_)):
        raise NotAFlag(f"{name} must be a bool, got {_shown(value)}")
    return bool(value)


def _range_text(low: int, high: int) -> str:
    if low == INT64_MIN and high == INT64_MAX:
        return "an integer that fits in int64"
    if high == INT64_MAX:
        return {0: "a non-negative integer", 1: "a positive integer"}.get(low, f"an integer of at least {low}")
    return f"an integer in [{low}, {high}]"


def _shown(value) -> str:
    """The value as the caller wrote it (NumPy 2 prints its scalars' types), cut short."""
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."
