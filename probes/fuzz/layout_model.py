"""An independent model of shape text: which texts are valid XLA shapes with
layouts, and how many bytes a valid one takes, computed with Python's
unbounded ints so that nothing can wrap."""

from __future__ import annotations

import re

import kvref
from kvref.shape import MAX_TILES  # the documented limit on tiles per layout

INT64_MAX = 2**63 - 1
_TEXT = re.compile(r"([a-z][a-z0-9]*)\[([0-9,]*)\](?:\{([0-9,]*)(?::((?:T(?:\([0-9,]*\))+)?(?:E\([0-9]+\))?))?\})?",
                   re.ASCII)


def expected_bytes(text: str) -> int | None:
    """The physical size of a valid shape text; None for one that must be refused."""
    m = _TEXT.fullmatch(text.strip(" \t\n\r\f\v"))
    if not m:
        return None
    dtype, dims_text, order_text, extra = m.groups()
    if dtype not in kvref.ELEMENT_TYPES or ",," in dims_text or dims_text.startswith(",") \
            or dims_text.endswith(","):
        return None
    dims = [int(d) for d in dims_text.split(",")] if dims_text else []
    order = [int(d) for d in order_text.split(",")] if order_text else []
    if order_text is None:
        order = list(range(len(dims) - 1, -1, -1))
    if sorted(order) != list(range(len(dims))) or any(d > INT64_MAX for d in dims):
        return None
    tiles, bits = _extras(extra or "")
    if tiles is None or len(tiles) > MAX_TILES or \
            any(not tile or min(tile) <= 0 or max(tile) > INT64_MAX for tile in tiles):
        return None
    element = kvref.ELEMENT_TYPES[dtype]
    if not _bits_fit(element, bits):
        return None
    logical = 1
    for d in dims:
        logical *= d
    if logical > INT64_MAX:
        return None
    shape = [dims[d] for d in reversed(order)]
    for tile in tiles:
        shape = [1] * max(0, len(tile) - len(shape)) + shape
        head, tail = shape[: len(shape) - len(tile)], shape[len(shape) - len(tile):]
        shape = head + [-(-d // t) for d, t in zip(tail, tile)] + list(tile)
    physical = 1
    for d in shape:
        physical *= d
    total_bits = physical * (bits or element.storage_bits)
    if physical > INT64_MAX or total_bits > INT64_MAX:
        return None
    return -(-total_bits // 8)


def _extras(extra: str):
    tiles = [tuple(int(t) for t in group.split(",")) if group else ()
             for group in re.findall(r"\(([0-9,]*)\)", extra.split("E(")[0])]
    if any(",," in g or g.startswith(",") or g.endswith(",") for g in re.findall(r"\(([0-9,]*)\)", extra)):
        return None, 0
    bits = re.search(r"E\(([0-9]+)\)", extra)
    return tiles, int(bits.group(1)) if bits else 0


def _bits_fit(element, bits: int) -> bool:
    if bits in (0, element.storage_bits):
        return True
    return element.is_sub_byte and element.bit_width <= bits < 8 and 8 % bits == 0
