"""The C++ placement (offsets, pack, unpack) against the NumPy model."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvref
from kvref.placement import element_bit_offsets, element_physical_indices
from tests import numpy_model
from tests.strategies import random_array, same_bytes, shapes


@pytest.mark.parametrize("text, size", [
    # Sizes the TPU compiler reports for these layouts.
    ("bf16[64,3,5,128]{3,0,2,1:T(8,128)(2,1)}", 245_760),
    ("pred[33,17]{0,1:T(8,128)(4,1)}", 3_072),
    ("s4[100,3,7]{0,2,1:T(8,128)(8,1)E(4)}", 1_536),
    ("s4[100,3,7]{0,2,1:T(8,128)(4,1)}", 3_072),  # v3: no E(4), a byte each
    ("bf16[512,3,2048]{2,0,1:T(8,128)(2,1)}", 6_291_456),
    ("f32[7]{0:T(128)}", 512),
])
def test_physical_size_matches_compiler(text, size):
    assert kvref.Shape.parse(text).physical_size_bytes == size


@settings(max_examples=300, deadline=None)
@given(shapes())
def test_indices_match_model(shape):
    want, count = numpy_model.physical_indices(shape)
    assert shape._core.physical_elements == count
    np.testing.assert_array_equal(element_physical_indices(shape), want)


@settings(max_examples=300, deadline=None)
@given(shapes(), st.integers(0, 2**31))
def test_pack_matches_model_and_round_trips(shape, seed):
    x = random_array(shape, seed)
    packed = kvref.pack(x, shape)
    assert packed.dtype == np.uint8 and packed.size == shape.physical_size_bytes
    np.testing.assert_array_equal(packed, numpy_model.pack(x, shape))
    assert same_bytes(kvref.unpack(packed, shape), x)
    assert same_bytes(kvref.unpack(bytes(packed), shape), x)


@settings(max_examples=200, deadline=None)
@given(shapes())
def test_offsets_are_one_to_one(shape):
    bits = element_bit_offsets(shape).reshape(-1)
    assert len(np.unique(bits)) == bits.size
    assert bits.size == 0 or bits.max() + shape.element_bits <= shape.physical_size_bytes * 8
    byte_offsets = kvref.element_byte_offsets(shape)
    np.testing.assert_array_equal(byte_offsets, element_bit_offsets(shape) // 8)


def test_padding_is_zero():
    shape = kvref.Shape.parse("f32[3,5]{1,0:T(8,128)}")
    packed = kvref.pack(np.full((3, 5), -1, np.int32).view(np.float32), shape)
    offsets = kvref.element_byte_offsets(shape).reshape(-1)
    used = np.zeros(packed.size, bool)
    for o in offsets:
        used[o:o + 4] = True
    assert packed[used].min() == 0xFF and not packed[~used].any()


def test_bf16_sub_tile_packs_two_rows_per_word():
    shape = kvref.Shape.parse("bf16[8,128]{1,0:T(8,128)(2,1)}")
    offsets = kvref.element_byte_offsets(shape)
    # Rows 0 and 1 of column c share the 32-bit word at 4*c.
    assert offsets[0, 5] == 20 and offsets[1, 5] == 22 and offsets[2, 0] == 512


def test_pack_accepts_torch_tensors():
    torch = pytest.importorskip("torch")
    shape = kvref.Shape.parse("bf16[16,256]{1,0:T(8,128)(2,1)}")
    t = torch.arange(16 * 256, dtype=torch.float32).reshape(16, 256).to(torch.bfloat16)
    via_numpy = t.view(torch.int16).numpy().view(shape.element.numpy)
    packed = kvref.pack(t, shape)
    np.testing.assert_array_equal(packed, kvref.pack(via_numpy, shape))
    np.testing.assert_array_equal(kvref.unpack(torch.from_numpy(packed), shape), via_numpy)


@pytest.mark.parametrize("array, text, needle", [
    (np.zeros((4, 4), np.float32), "bf16[4,4]{1,0}", "f32[4, 4]"),
    (np.zeros((4, 5), np.float32), "f32[4,4]{1,0}", "f32[4, 5]"),
    (np.zeros((4, 4), np.complex64), "f32[4,4]{1,0}", "complex64"),
])
def test_pack_refuses_mismatched_arrays(array, text, needle):
    with pytest.raises(ValueError, match=r"does not match the layout") as e:
        kvref.pack(array, kvref.Shape.parse(text))
    assert needle in str(e.value) and text in str(e.value)


def test_unpack_refuses_wrong_buffer():
    shape = kvref.Shape.parse("f32[4,4]{1,0}")
    with pytest.raises(ValueError, match="has 63 bytes but f32"):
        kvref.unpack(np.zeros(63, np.uint8), shape)
    with pytest.raises(ValueError, match="1-D uint8"):
        kvref.unpack(np.zeros(16, np.float32), shape)
    with pytest.raises(TypeError, match="bytes or a uint8"):
        kvref.unpack("abc", shape)


@pytest.mark.parametrize("text", [
    # Big enough that pack and unpack split the work between threads.
    "bf16[1001,3,2050]{2,0,1:T(8,128)(2,1)}",
    "f32[2001,1100]{1,0:T(8,128)}",
    "s8[515,4,4100]{2,1,0:T(32,128)(4,1)}",
    "f32[3,1030,1100]{1,2,0:T(8,128)}",
    "s4[1000,9000]{1,0:T(8,128)(8,1)E(4)}",
])
def test_big_buffers_match_model(text):
    shape = kvref.Shape.parse(text)
    assert shape.physical_size_bytes >= 8 << 20 or shape.element_bits < 8
    x = random_array(shape, seed=5)
    packed = kvref.pack(x, shape)
    np.testing.assert_array_equal(packed, numpy_model.pack(x, shape))
    assert same_bytes(kvref.unpack(packed, shape), x)
