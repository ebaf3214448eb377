"""An independent NumPy model of XLA tiled placement, built from pad, reshape
and transpose, that the C++ core is checked against."""

from __future__ import annotations

import math

import numpy as np


def physical_indices(shape) -> tuple[np.ndarray, int]:
    """(physical element index of each logical element, physical element count)."""
    n = math.prod(shape.dims)
    phys = np.arange(n, dtype=np.int64).reshape(shape.dims)
    phys = np.transpose(phys, shape.physical_order) if shape.rank else phys
    for tile in shape.layout.tiles:
        k = len(tile)
        while phys.ndim < k:
            phys = phys[np.newaxis]
        lead, last = phys.shape[:-k], phys.shape[-k:]
        padded = [-(-d // t) * t for d, t in zip(last, tile)]
        phys = np.pad(phys, [(0, 0)] * len(lead) + [(0, p - d) for p, d in zip(padded, last)],
                      constant_values=-1)
        phys = phys.reshape(lead + tuple(x for p, t in zip(padded, tile) for x in (p // t, t)))
        nl = len(lead)
        phys = phys.transpose(list(range(nl)) + [nl + 2 * i for i in range(k)]
                              + [nl + 2 * i + 1 for i in range(k)])
    flat = phys.reshape(-1)
    out = np.empty(n, dtype=np.int64)
    valid = flat >= 0
    out[flat[valid]] = np.nonzero(valid)[0]
    return out.reshape(shape.dims), flat.size


def pack(array: np.ndarray, shape) -> np.ndarray:
    index, count = physical_indices(shape)
    bits = shape.element_bits
    if bits >= 8:
        phys = np.zeros(count, dtype=array.dtype)
        phys[index.reshape(-1)] = array.reshape(-1)
        return phys.view(np.uint8)
    out = np.zeros(-(-count * bits // 8), dtype=np.uint8)
    values = array.reshape(-1).view(np.uint8) & ((1 << bits) - 1)
    bit = index.reshape(-1) * bits
    np.bitwise_or.at(out, bit // 8, (values << (bit % 8)).astype(np.uint8))
    return out


def byte_offsets(shape) -> np.ndarray:
    """Byte offset of each logical element by the model: its physical index
    times the element's bits, in whole bytes (sub-byte elements that share a
    byte share its offset)."""
    index, _ = physical_indices(shape)
    return index * shape.element_bits // 8
