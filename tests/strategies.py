"""Hypothesis strategies for random shapes with random tiled layouts."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

from kvref import Layout, Shape

DTYPES = ["pred", "s4", "u4", "s8", "u8", "s16", "u16", "s32", "u32", "s64", "u64",
          "f8e4m3fn", "f8e5m2", "f16", "bf16", "f32", "f64"]
MAX_PHYSICAL_ELEMENTS = 200_000


@st.composite
def shapes(draw, max_rank=4, max_dim=12, dtypes=DTYPES):
    dtype = draw(st.sampled_from(dtypes))
    rank = draw(st.integers(0, max_rank))
    dims = tuple(draw(st.lists(st.integers(1, max_dim), min_size=rank, max_size=rank)))
    minor_to_major = tuple(draw(st.permutations(range(rank))))
    n_tiles = draw(st.integers(0, 3))
    tiles = tuple(
        tuple(draw(st.lists(st.integers(1, 8), min_size=1, max_size=rank + 1)))
        for _ in range(n_tiles))
    bits = draw(st.sampled_from([0, 4])) if dtype in ("s4", "u4") else 0
    shape = Shape(dtype, dims, Layout(minor_to_major, tiles, bits))
    from hypothesis import assume

    assume(shape._core.physical_elements <= MAX_PHYSICAL_ELEMENTS)
    return shape


def random_array(shape, seed: int = 0) -> np.ndarray:
    """Distinct-looking random contents of the right dtype (bit patterns for
    floats, so NaNs and all else round-trip as bytes)."""
    rng = np.random.default_rng(seed)
    dtype = shape.element.numpy
    n = math.prod(shape.dims)
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(np.bool_).reshape(shape.dims)
    if dtype in (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4)):
        return rng.integers(0, 16, n, dtype=np.uint8).view(dtype).reshape(shape.dims)
    raw = rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape.dims)


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))
