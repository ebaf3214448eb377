"""Which dim-0 row owns each physical element slot, found by packing: each
element is given a value naming its row, the layout model packs the array,
and the physical slots are read back. This is the harness's own, independent
answer to "can rows be moved as byte ranges?"; it never asks
kvref.major_slice, which it exists to check."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

import kvref

PADDING = -1


def physical_owners(shape: kvref.Shape) -> np.ndarray:
    """For every physical element slot, the dim-0 row whose element lies
    there, or PADDING (int32, `shape.physical_elements` long)."""
    owners = np.zeros(shape.physical_elements, dtype=np.int64)
    for place, slots in _packed_digits(shape):
        owners += (slots.astype(np.int64) - 1) * place
    owners[slots == 0] = PADDING
    return owners.astype(np.int32)


@dataclass(frozen=True)
class RowRanges:
    contiguous: bool  # row i is exactly bytes [i*slice_bytes, (i+1)*slice_bytes)
    slice_bytes: int | None


@functools.lru_cache(maxsize=512)
def row_byte_ranges(layout_text: str) -> RowRanges:
    """Whether every dim-0 row of the layout lies in its own equal byte range:
    each row's slice holds all of that row's elements, and nothing of any
    other row."""
    shape = kvref.Shape.parse(layout_text)
    if shape.rank == 0 or shape.logical_elements == 0:
        return RowRanges(False, None)
    rows, bits = shape.dims[0], shape.element_bits
    if shape.physical_elements % rows or (shape.physical_elements // rows * bits) % 8:
        return RowRanges(False, None)
    per_row = shape.logical_elements // rows
    for index, (place, slots) in enumerate(_packed_digits(shape)):
        slices = slots.reshape(rows, -1)
        digit = _digits(rows, place, _base(shape)).astype(slots.dtype)[:, None]
        if not ((slices == digit) | (slices == 0)).all():
            return RowRanges(False, None)  # some slot of slice i belongs to another row
        if index == 0 and not (np.count_nonzero(slices, axis=1) == per_row).all():
            return RowRanges(False, None)  # some element of row i lies outside slice i
    return RowRanges(True, slices.shape[1] * bits // 8)


def _base(shape: kvref.Shape) -> int:
    """Row digits per pass: what a slot holds, less 0 (padding); sub-byte
    types hold 4 bits whatever their storage."""
    bits = 4 if shape.element.is_sub_byte else shape.element_bits
    return min(2**bits - 1, 2**31 - 1)


def _digits(rows: int, place: int, base: int) -> np.ndarray:
    return (np.arange(rows, dtype=np.int64) // place) % base + 1


def _packed_digits(shape: kvref.Shape):
    """(place, slots) per pass: every element holds one base-`base` digit of
    its row number plus 1, packed; slots read back one value per slot."""
    if shape.rank == 0 or shape.logical_elements == 0:
        raise ValueError(f"{shape} has no dim-0 rows to own anything")
    rows, base = shape.dims[0], _base(shape)
    per_row = shape.logical_elements // rows
    place = 1
    while True:
        digits = np.broadcast_to(_digits(rows, place, base)[:, None], (rows, per_row))
        yield place, _slots(kvref.pack(_as_elements(digits, shape), shape), shape)
        if place * base >= rows:
            return
        place *= base


def _as_elements(values: np.ndarray, shape: kvref.Shape) -> np.ndarray:
    """Small non-negative integers as the bytes of the shape's element type."""
    storage = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[shape.element.numpy.itemsize]
    return np.ascontiguousarray(values, dtype=storage).view(shape.element.numpy).reshape(shape.dims)


def _slots(physical: np.ndarray, shape: kvref.Shape) -> np.ndarray:
    """The physical bytes as one unsigned value per element slot."""
    bits = shape.element_bits
    if bits == 4:  # two slots a byte, the first in the low bits
        return np.stack([physical & 0xF, physical >> 4], axis=-1).reshape(-1)
    if bits == 8:
        return physical
    return physical.view({16: np.uint16, 32: np.uint32, 64: np.uint64}[bits])
