"""The C++ placement (offsets, pack, unpack) against the NumPy model."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvref
from kvref.placement import element_bit_offsets, element_physical_indices
from tests import numpy_model
from probes.iut.host_data import random_host
from tests.strategies import same_bytes, shapes


@pytest.mark.parametrize("text, size", [
    # Sizes the TPU compiler reports for these layouts.
    ("bf16[64,3,5,128]{3,0,2,1:T(8,128)(2,1)}", 245_760),
    ("pred[33,17]{0,1:T(8,128)(4,1)}", 3_072),
    ("s4[100,3,7]{0,2,1:T(8,128)(8,1)E(4)}", 1_536),
    # Worked by hand. v3, no E(4): physically [3,7,100], T(8,128) pads [7,100]
    # to [8,128]: 3*8*128 slots, a byte each.
    ("s4[100,3,7]{0,2,1:T(8,128)(4,1)}", 3_072),
    # Physically [3,512,2048], no padding: 3*512*2048 elements * 2 bytes.
    ("bf16[512,3,2048]{2,0,1:T(8,128)(2,1)}", 6_291_456),
    # One 128-element tile * 4 bytes.
    ("f32[7]{0:T(128)}", 512),
])
def test_physical_size_matches_compiler(text, size):
    assert kvref.Shape.parse(text).physical_size_bytes == size


@settings(max_examples=300, deadline=None)
@given(shapes())
def test_indices_match_model(shape):
    want, count = numpy_model.physical_indices(shape)
    assert shape._tiled.physical_elements == count
    np.testing.assert_array_equal(element_physical_indices(shape), want)


@settings(max_examples=300, deadline=None)
@given(shapes(), st.integers(0, 2**31))
def test_pack_matches_model_and_round_trips(shape, seed):
    x = random_host(shape.key, seed)
    packed = kvref.pack(x, shape)
    assert packed.dtype == np.uint8 and packed.size == shape.physical_size_bytes
    np.testing.assert_array_equal(packed, numpy_model.pack(x, shape))
    assert same_bytes(kvref.unpack(packed, shape), x)
    assert same_bytes(kvref.unpack(bytes(packed), shape), x)


@settings(max_examples=200, deadline=None)
@given(shapes())
def test_offsets_are_one_to_one_and_match_model(shape):
    bits = element_bit_offsets(shape).reshape(-1)
    assert len(np.unique(bits)) == bits.size
    assert bits.size == 0 or bits.max() + shape.element_bits <= shape.physical_size_bytes * 8
    # Against the NumPy model, not kvref's own indices: a wrong but one-to-one
    # placement passes the two checks above.
    np.testing.assert_array_equal(kvref.element_byte_offsets(shape),
                                  numpy_model.byte_offsets(shape))


def test_small_tiled_layout_by_hand():
    """bf16[4,3]{1,0:T(2,2)} worked out by hand. Row-major [4,3] padded to
    [4,4] is a 2x2 grid of 2x2 tiles, tiles row-major, elements row-major in
    each: element (r, c) is slot 4*(2*(r//2) + c//2) + 2*(r%2) + c%2, at byte
    2*slot. Holding 1..12 row-major, the 16 slots are (0 = padding):
      tile (0,0): 1  2  4  5    tile (0,1): 3 _  6 _
      tile (1,0): 7  8 10 11    tile (1,1): 9 _ 12 _"""
    shape = kvref.Shape.parse("bf16[4,3]{1,0:T(2,2)}")
    x = np.arange(1, 13, dtype=np.uint16).reshape(4, 3).view(shape.element.numpy)
    slots = np.array([1, 2, 4, 5, 3, 0, 6, 0, 7, 8, 10, 11, 9, 0, 12, 0], np.uint16)
    assert shape.physical_size_bytes == 32
    np.testing.assert_array_equal(kvref.pack(x, shape), slots.view(np.uint8))
    assert same_bytes(kvref.unpack(slots.view(np.uint8), shape), x)
    np.testing.assert_array_equal(kvref.element_byte_offsets(shape), [[0, 2, 8],
                                                                      [4, 6, 12],
                                                                      [16, 18, 24],
                                                                      [20, 22, 28]])


def test_sub_byte_elements_share_bytes_by_hand():
    """s4[2,3]{1,0:T(2,2)E(4)} by hand: [2,3] padded to [2,4] is two 2x2
    tiles, so (r, c) is slot 4*(c//2) + 2*r + c%2, at bits 4*slot; the even
    slot of each byte is its low nibble. Holding [[1,2,3],[4,5,6]]: bytes
    0x21 (slots 0,1), 0x54 (2,3), 0x03 (4, padding), 0x06 (6, padding)."""
    shape = kvref.Shape.parse("s4[2,3]{1,0:T(2,2)E(4)}")
    x = np.array([[1, 2, 3], [4, 5, 6]], np.uint8).view(shape.element.numpy)
    assert shape.physical_size_bytes == 4
    np.testing.assert_array_equal(kvref.pack(x, shape), [0x21, 0x54, 0x03, 0x06])
    np.testing.assert_array_equal(kvref.element_byte_offsets(shape), [[0, 0, 2], [1, 1, 3]])
    assert same_bytes(kvref.unpack(np.array([0x21, 0x54, 0x03, 0x06], np.uint8), shape), x)


def test_padding_is_zero():
    """f32[3,5]{1,0:T(8,128)} by hand: one 8x128 tile, element (r, c) at byte
    4*(128*r + c), so the data is bytes [512*r, 512*r + 20) of rows 0..2 and
    everything else of the 4,096 bytes is padding."""
    shape = kvref.Shape.parse("f32[3,5]{1,0:T(8,128)}")
    packed = kvref.pack(np.full((3, 5), -1, np.int32).view(np.float32), shape)
    assert packed.size == 4096
    used = np.zeros(packed.size, bool)
    for r in range(3):
        used[512 * r:512 * r + 20] = True
    assert (packed[used] == 0xFF).all() and not packed[~used].any()


def test_bf16_sub_tile_packs_two_rows_per_word():
    shape = kvref.Shape.parse("bf16[8,128]{1,0:T(8,128)(2,1)}")
    offsets = kvref.element_byte_offsets(shape)
    # By hand: (2,1) sub-tiles of the 8x128 tile put (r, c) in slot
    # 256*(r//2) + 2*c + r%2, so rows 0 and 1 of column c share the 32-bit
    # word at 4*c, and row 2 starts after 256 slots (512 bytes).
    assert offsets[0, 5] == 20 and offsets[1, 5] == 22 and offsets[2, 0] == 512


def test_pack_accepts_torch_tensors():
    torch = pytest.importorskip("torch")
    shape = kvref.Shape.parse("bf16[16,256]{1,0:T(8,128)(2,1)}")
    t = torch.arange(16 * 256, dtype=torch.float32).reshape(16, 256).to(torch.bfloat16)
    via_numpy = t.view(torch.int16).numpy().view(shape.element.numpy)
    packed = kvref.pack(t, shape)
    np.testing.assert_array_equal(packed, numpy_model.pack(via_numpy, shape))
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
    x = random_host(shape.key, 5)
    packed = kvref.pack(x, shape)
    np.testing.assert_array_equal(packed, numpy_model.pack(x, shape))
    assert same_bytes(kvref.unpack(packed, shape), x)
