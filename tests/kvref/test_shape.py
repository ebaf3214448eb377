"""Shape text, element types, and clear errors for bad input."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings

import kvref
from kvref import LayoutError, Shape, ShapeKey
from tests.strategies import shapes


@pytest.mark.parametrize("text", [
    "bf16[512,3,2048]{2,0,1:T(8,128)(2,1)}",
    "s4[100,3,7]{0,2,1:T(8,128)(8,1)E(4)}",
    "s4[64]{0:E(4)}",
    "f32[7]{0:T(128)}",
    "pred[33,17]{0,1:T(8,128)(4,1)}",
    "f32[4,4]{0,1}",
    "f8e4m3fn[2,3,4,5,6]{4,3,2,1,0:T(8,128)(4,1)}",
])
def test_text_round_trips(text):
    shape = kvref.Shape.parse(text)
    assert str(shape) == text
    assert kvref.Shape.parse(str(shape)) == shape


@settings(max_examples=200, deadline=None)
@given(shapes())
def test_random_shapes_round_trip(shape):
    assert kvref.Shape.parse(str(shape)) == shape


def test_parts_and_default_layout():
    shape = kvref.Shape.parse("bf16[512,3,2048]{2,0,1:T(8,128)(2,1)}")
    assert shape.dtype == "bf16" and shape.dims == (512, 3, 2048)
    assert shape.layout.minor_to_major == (2, 0, 1)
    assert shape.layout.tiles == ((8, 128), (2, 1)) and shape.layout.element_bits == 0
    plain = kvref.Shape.parse("f32[3,4]")
    assert str(plain) == "f32[3,4]{1,0}" and plain.physical_size_bytes == 48


@pytest.mark.parametrize("text, needle", [
    ("bf17[4,4]{1,0}", "unknown element type 'bf17'"),
    ("bf16[4,4", "malformed shape text 'bf16[4,4'"),
    ("bf16[4,x]{1,0}", "malformed dims '4,x'"),
    ("bf16[4,4]{1,1}", "minor_to_major [1, 1] is not a permutation"),
    ("bf16[4,4]{2,0}", "minor_to_major [2, 0] is not a permutation"),
    ("bf16[4,4]{0}", "has 1 dims but the shape"),
    ("bf16[4,4]{1,0:T(0,128)}", "tile (0, 128) must have one or more positive sizes"),
    ("bf16[4,4]{1,0:T(-8,128)}", "malformed tile '-8,128'"),
    ("bf16[4,4]{1,0:T()}", "tile () must have one or more positive sizes"),
    ("bf16[4,4]{1,0:T(8,128)S(1)}", "unsupported layout part 'S(1)'"),
    ("bf16[4,4]{1,0:E(4)}", "E(4) does not fit bf16"),
    ("s4[4,4]{1,0:E(3)}", "E(3) does not fit s4; expected E(4) or E(8)"),
    ("bf16[-4,4]{1,0}", "malformed dims '-4,4'"),
    ("f32[512,16,\uff13]", "expected comma-separated integers of ASCII digits"),
    ("f8e4m3fn[512,4,1_024]", "malformed dims '512,4,1_024'"),
    ("f32[+512]", "malformed dims '+512'"),
    ("u16[4]{0:T(9223372036854775807)}", "physical bit count overflows int64"),
    ("f16[3]{0:E(\u0664)}", "unsupported layout part"),
    ("f32[4294967296,4294967296]{1,0}", "overflows int64"),
    ("f32[99999999999999999999]{0}", "does not fit in int64"),
])
def test_bad_text_is_refused_quoting_it(text, needle):
    with pytest.raises(ValueError) as e:
        kvref.Shape.parse(text)
    assert needle in str(e.value)
    assert isinstance(e.value, kvref.LayoutError)
    assert text in str(e.value)


def test_bad_constructor_arguments():
    with pytest.raises(kvref.LayoutError, match="dims \\[-1\\] must not be negative"):
        kvref.Shape("f32", (-1,))
    with pytest.raises(kvref.LayoutError, match="dim 1.5 is not an integer"):
        kvref.Shape("f32", (1.5,))
    with pytest.raises(ValueError, match="unknown element type 'complex64'"):
        kvref.Shape("complex64", (1,))
    with pytest.raises(TypeError, match="expects str"):
        kvref.Shape.parse(b"f32[1]")


@pytest.mark.parametrize("name, np_dtype", [
    ("bf16", ml_dtypes.bfloat16), ("f8e4m3fn", ml_dtypes.float8_e4m3fn),
    ("f8e5m2", ml_dtypes.float8_e5m2), ("s4", ml_dtypes.int4), ("u4", ml_dtypes.uint4),
    ("pred", np.bool_), ("s8", np.int8), ("u64", np.uint64), ("f16", np.float16), ("f64", np.float64),
])
def test_element_types_map_both_ways(name, np_dtype):
    t = kvref.element_type(name)
    assert t.numpy == np.dtype(np_dtype)
    assert kvref.element_type(np_dtype) is t
    assert kvref.element_type(np.dtype(np_dtype)) is t


def test_every_xla_type_is_known():
    assert set(kvref.ELEMENT_TYPES) == {
        "pred", "s4", "u4", "s8", "u8", "s16", "u16", "s32", "u32", "s64", "u64",
        "f8e4m3fn", "f8e5m2", "f16", "bf16", "f32", "f64"}


def test_jax_dtypes_map():
    jnp = pytest.importorskip("jax.numpy")
    assert kvref.element_type(jnp.bfloat16).name == "bf16"
    assert kvref.element_type(jnp.int4).name == "s4"
    assert kvref.element_type(jnp.zeros(2, jnp.float8_e4m3fn).dtype).name == "f8e4m3fn"


def test_torch_dtypes_map():
    torch = pytest.importorskip("torch")
    assert kvref.element_type(torch.bfloat16).name == "bf16"
    assert kvref.element_type(torch.float8_e4m3fn).name == "f8e4m3fn"
    assert kvref.element_type(torch.bool).name == "pred"
    with pytest.raises(ValueError, match="torch dtype torch.complex64 has no XLA element type"):
        kvref.element_type(torch.complex64)


def test_a_layout_is_kept_in_normal_form_and_compared_as_xla_does():
    explicit = Shape.parse("bf16[8,128]{1,0:T(8,128)(2,1)E(16)}")
    assert explicit == Shape.parse("bf16[8,128]{1,0:T(8,128)(2,1)}")
    assert str(explicit) == "bf16[8,128]{1,0:T(8,128)(2,1)}"
    packed = Shape.parse("s4[8,128]{1,0:T(8,128)(2,1)E(4)}")
    assert packed != Shape.parse("s4[8,128]{1,0:T(8,128)(2,1)}")  # E(4) is not s4's storage size
    assert packed.equal(Shape.parse("s4[8,128]{1,0:T(8,128)(2,1)}"), ignore_element_size=True)
    untiled = Shape.parse("bf16[8,128]{1,0}")
    assert not untiled.equal(explicit) and untiled.equal(explicit, ignore_tiles=True)
    assert not untiled.equal(Shape.parse("bf16[8,128]{0,1}"), ignore_tiles=True)
    assert untiled.equal(Shape.parse("bf16[8,128]{0,1}"), ignore_layout=True)


@pytest.mark.parametrize("text", ["bf16[-1,2]", "bf16[1,,2]", "bf16[1, 2]", "xx[1]", "bf16[1"])
def test_shape_and_shape_key_read_one_text_form(text):
    with pytest.raises(LayoutError) as whole:
        Shape.parse(text)
    with pytest.raises(LayoutError) as key:
        ShapeKey.parse(text)
    assert str(key.value).split(";")[0].split(" (in ")[0] == str(whole.value).split(";")[0].split(" (in ")[0]
    assert ShapeKey.parse(" bf16[1,2] ") == Shape.parse(" bf16[1,2] ").key
    with pytest.raises(LayoutError, match="no layout"):
        ShapeKey.parse("bf16[1,2]{1,0}")
