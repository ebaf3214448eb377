"""Can an array's dim-0 rows be moved as independent byte ranges?

A KV-cache manager addresses block i as bytes [i*S, (i+1)*S). That is right
only when the physical size splits into dims[0] equal slices and every element
of row i lies in slice i. The check is exact and cheap: an element's physical
index is a sum of per-dim contributions, so a row's extent is its dim-0
contribution plus the minimum and maximum of the other dims' sums.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvref.errors import LayoutError
from kvref.limits import check_allocation
from kvref.shape import Shape


@dataclass(frozen=True)
class MajorSlice:
    shape_text: str  # the shape with its layout, as XLA writes it
    addressable: bool
    slice_bytes: int | None  # bytes per dim-0 row, when addressable
    rows_per_group: int  # smallest contiguous group of rows (1 when addressable)
    group_bytes: int | None  # bytes per such group
    reason: str  # why rows interleave; empty when addressable


def major_slice(shape: Shape) -> MajorSlice:
    if shape.rank == 0 or shape.dims[0] == 0 or shape.logical_elements == 0:
        return MajorSlice(str(shape), False, None, 0, None,
                          "the array has no dim-0 rows to address")
    rows = shape.dims[0]
    check_allocation(8 * 7 * rows, f"the major-slice analysis of {shape}")
    extents = _row_bit_extents(shape)
    for group in _candidate_groups(rows):
        bits = _group_bits(shape, extents, group)
        if bits is None:
            continue
        if group == 1:
            return MajorSlice(str(shape), True, bits // 8, 1, bits // 8, "")
        return MajorSlice(str(shape), False, None, group, bits // 8, _why_rows_interleave(shape))
    return MajorSlice(str(shape), False, None, rows, None, _why_rows_interleave(shape))


def validate_major_slice_addressable(shape: Shape) -> int:
    """The bytes per dim-0 row, or LayoutError naming the layout and why not."""
    info = major_slice(shape)
    if info.addressable:
        return info.slice_bytes
    raise LayoutError(f"{shape}: dim-0 rows are not contiguous byte ranges; {info.reason}. "
                      f"{_which_blocks_work(shape, info)}")


def legacy_major_slice_byte_size(shape: Shape) -> int:
    """The slice size the old manager computed, without any check: for rank >= 3
    tiled buffers, the first tile's footprint over the two minor-most physical
    dims times every other dim except dim 0; otherwise the dense row stride."""
    bits = shape.element_bits
    if shape.rank >= 3 and shape.layout.tiles:
        tile = (1,) * 2 + shape.layout.tiles[0]
        minor_pair = shape.physical_order[-2:]
        footprint = 1
        for d, t in zip(minor_pair, tile[-2:]):
            footprint *= math.ceil(shape.dims[d] / t) * t
        others = math.prod(shape.dims[d] for d in range(1, shape.rank) if d not in minor_pair)
        return -(-footprint * others * bits // 8)
    return -(-math.prod(shape.dims[1:]) * bits // 8)


def _row_bit_extents(shape: Shape) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the first bit and one past the last bit its elements occupy."""
    bits = shape.element_bits
    # Every other dim contributes 0 at coordinate 0, so the least a row reaches
    # is its own start; the most is found per dim without enumerating it.
    low = 0
    high = sum(shape._tiled.dim_max(d) for d in range(1, shape.rank))
    row = shape._tiled.dim_table(0).astype(np.int64)
    return (row + low) * bits, (row + high + 1) * bits


def _group_bits(shape: Shape, extents, group: int) -> int | None:
    """Bits per slice when every run of `group` rows owns one equal slice."""
    rows = shape.dims[0]
    n_groups = -(-rows // group)
    total_bits = shape._tiled.physical_elements * shape.element_bits
    if total_bits % n_groups or (total_bits // n_groups) % 8:
        return None
    size = total_bits // n_groups
    first, end = extents
    owner = np.arange(rows, dtype=np.int64) // group
    if np.all(first >= owner * size) and np.all(end <= (owner + 1) * size):
        return size
    return None


def _candidate_groups(rows: int) -> list[int]:
    divisors = {d for i in range(1, math.isqrt(rows) + 1) if rows % i == 0 for d in (i, rows // i)}
    powers = {1 << k for k in range(rows.bit_length()) if 1 << k <= rows}
    return sorted(divisors | powers)


def _which_blocks_work(shape: Shape, info: MajorSlice) -> str:
    if shape.rank == 0 or shape.logical_elements == 0:
        return "A KV cache needs a block dimension with at least one element per block."
    rows = shape.dims[0]
    if info.rows_per_group >= rows:
        return (f"No group of rows smaller than the whole buffer ({rows} rows, "
                f"{shape.physical_size_bytes} bytes) is contiguous, so no per-block transfer is possible.")
    return (f"Blocks of {info.rows_per_group} rows ({info.group_bytes} bytes) or multiples of that "
            f"would be contiguous.")


def _why_rows_interleave(shape: Shape) -> str:
    order = shape.physical_order
    outer = [d for d in order[: order.index(0)] if shape.dims[d] > 1]
    if outer:
        pieces = math.prod(shape.dims[d] for d in outer)
        return (f"dim 0 is not the outermost physical dim (physical order major to minor is "
                f"{list(order)}), so dim(s) {outer} split every row into {pieces} pieces strided "
                f"across the buffer")
    splits = _tiles_splitting_dim0(shape)
    if splits:
        parts = []
        for i, (tile, size) in enumerate(splits):
            tile_text = "T(" + ",".join(map(str, tile)) + ")" if i == 0 else "(" + ",".join(map(str, tile)) + ")"
            if i == 0:
                parts.append(f"tile {tile_text} holds {size} consecutive rows, so rows interleave "
                             "at tile granularity")
            else:
                parts.append(f"sub-tile {tile_text} packs {size} rows side by side "
                             f"({size} x {shape.element_bits}-bit elements per "
                             f"{size * shape.element_bits}-bit word)")
        return "dim 0 is tiled: " + "; ".join(parts)
    return (f"the physical size ({shape._tiled.physical_elements * shape.element_bits} bits) "
            f"does not split into {shape.dims[0]} equal row slices of whole bytes")


def _tiles_splitting_dim0(shape: Shape) -> list[tuple[tuple[int, ...], int]]:
    """(tile, size) for each tile level that cuts dim 0 into pieces of > 1 row."""
    labels = list(shape.physical_order)  # logical dim of each current digit, or None
    found = []
    for tile in shape.layout.tiles:
        labels = [None] * max(0, len(tile) - len(labels)) + labels
        head, tail = labels[: len(labels) - len(tile)], labels[len(labels) - len(tile):]
        for label, t in zip(tail, tile):
            if label == 0 and t > 1:
                found.append((tile, t))
        labels = head + tail + tail
    return found
