"""Hypothesis strategies for random shapes with random tiled layouts."""

from __future__ import annotations

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

    assume(shape._tiled.physical_elements <= MAX_PHYSICAL_ELEMENTS)
    return shape


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))
