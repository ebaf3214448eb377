"""The harness's own answer to "are rows byte ranges?" (probes.suite.ownership),
which the predictions use, against brute force on small layouts and against
kvref.major_slice, which it is there to check, on random layouts."""

import numpy as np
import pytest
from hypothesis import given, settings

import kvref
from probes.suite.ownership import PADDING, RowRanges, physical_owners, row_byte_ranges
from tests.numpy_model import physical_indices
from tests.strategies import shapes


def model_owners(shape: kvref.Shape) -> np.ndarray:
    """Owners from the NumPy model's placement (pad, reshape, transpose)."""
    index, count = physical_indices(shape)
    owners = np.full(count, PADDING)
    owners[index.reshape(shape.dims[0], -1)] = np.arange(shape.dims[0])[:, None]
    return owners


@pytest.mark.parametrize("text", [
    "bf16[16,128]{1,0:T(8,128)(2,1)}",
    "s8[33,17]{0,1:T(8,128)(4,1)}",
    "s4[10,3,7]{0,2,1:T(8,128)(8,1)E(4)}",
    "f32[6,5,3]{2,0,1:T(4,128)}",
    "pred[9,5]{1,0:T(8,128)(4,1)}",
    "f16[4,3,9]{2,1,0}",
])
def test_owners_match_the_numpy_model(text):
    shape = kvref.Shape.parse(text)
    assert np.array_equal(physical_owners(shape), model_owners(shape))


@pytest.mark.parametrize("text, contiguous, slice_bytes", [
    # Seed layouts: refused on every TPU generation that picks them.
    ("bf16[512,3,2048]{2,0,1:T(8,128)(2,1)}", False, None),
    ("bf16[512,6144]{1,0:T(8,128)(2,1)}", False, None),
    ("s8[512,12288]{1,0:T(32,128)(4,1)}", False, None),
    # A row of bf16[512,16,2048] is 16 x 2048 x 2 bytes, tiles whole within it.
    ("bf16[512,16,2048]{2,1,0:T(8,128)(2,1)}", True, 65536),
    ("f32[1024]{0:T(1024)}", True, 4),
    ("f32[7]{0:T(128)}", False, None),  # 512 bytes do not split into 7 rows
])
def test_seed_layouts(text, contiguous, slice_bytes):
    assert row_byte_ranges(text) == RowRanges(contiguous, slice_bytes)


@settings(max_examples=300, deadline=None)
@given(shapes())
def test_major_slice_agrees_with_the_independent_answer(shape):
    independent = row_byte_ranges(str(shape))
    info = kvref.major_slice(shape)
    assert info.addressable == independent.contiguous, str(shape)
    assert info.slice_bytes == independent.slice_bytes, str(shape)
