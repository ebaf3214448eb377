"""Major-slice analysis: exact addressability, group sizes, legacy formula."""

import numpy as np
import pytest
from hypothesis import given, settings

import kvref
from tests import numpy_model
from tests.strategies import shapes


def brute_force_slices(shape, group):
    """Bits per slice if every run of `group` rows owns one equal slice, by
    looking at every element's bit range."""
    rows = shape.dims[0]
    n_groups = -(-rows // group)
    index, count = numpy_model.physical_indices(shape)
    total = count * shape.element_bits
    if total % n_groups or (total // n_groups) % 8:
        return None
    size = total // n_groups
    start = index.reshape(rows, -1) * shape.element_bits
    owner = (np.arange(rows) // group)[:, None]
    ok = (start >= owner * size) & (start + shape.element_bits <= (owner + 1) * size)
    return size if ok.all() else None


@settings(max_examples=300, deadline=None)
@given(shapes(max_rank=3))
def test_major_slice_matches_brute_force(shape):
    info = kvref.major_slice(shape)
    if shape.rank == 0:
        assert not info.addressable
        return
    rows = shape.dims[0]
    single = brute_force_slices(shape, 1)
    assert info.addressable == (single is not None)
    if info.addressable:
        assert info.slice_bytes * 8 == single and info.rows_per_group == 1
    else:
        assert info.reason
        for g in range(1, info.rows_per_group):
            if rows % g == 0 or g & (g - 1) == 0:
                assert brute_force_slices(shape, g) is None
        if info.rows_per_group < rows:
            assert brute_force_slices(shape, info.rows_per_group) == info.group_bytes * 8


SEEDS = {
    "bf16[512,3,2048]{2,0,1:T(8,128)(2,1)}": (512, "not the outermost physical dim"),
    "bf16[512,6144]{1,0:T(8,128)(2,1)}": (8, "tile T(8,128) holds 8 consecutive rows"),
    "s8[512,12288]{1,0:T(32,128)(4,1)}": (32, "sub-tile (4,1) packs 4 rows"),
    "bf16[1024,32,576]{0,2,1:T(8,128)(2,1)}": (1024, "physical order major to minor is [1, 2, 0]"),
}


@pytest.mark.parametrize("text", SEEDS)
def test_seed_layouts_refused_with_layout_and_reason(text):
    rows, needle = SEEDS[text]
    shape = kvref.Shape.parse(text)
    info = kvref.major_slice(shape)
    assert not info.addressable and info.rows_per_group == rows and needle in info.reason
    with pytest.raises(kvref.LayoutError) as e:
        kvref.validate_major_slice_addressable(shape)
    assert text in str(e.value) and needle in str(e.value)
    if rows < shape.dims[0]:
        assert f"Blocks of {rows} rows" in str(e.value)
    else:
        assert "no per-block transfer is possible" in str(e.value)


@pytest.mark.parametrize("text, slice_bytes", [
    ("bf16[512,16,2048]{2,1,0:T(8,128)(2,1)}", 16 * 2048 * 2),
    ("bf16[512,4,2048]{2,1,0:T(4,128)(2,1)}", 4 * 2048 * 2),
    ("bf16[2048,64,2,128]{3,2,1,0:T(2,128)(2,1)}", 64 * 2 * 128 * 2),
    ("f32[512,1,128]{2,1,0:T(1,128)}", 512),
    ("f32[512,100]{1,0}", 400),
])
def test_addressable_layouts(text, slice_bytes):
    shape = kvref.Shape.parse(text)
    assert kvref.validate_major_slice_addressable(shape) == slice_bytes
    assert slice_bytes * shape.dims[0] == shape.physical_size_bytes


@pytest.mark.parametrize("text, legacy", [
    # The old formula took the whole 6 MiB buffer as one row's slice.
    ("bf16[512,3,2048]{2,0,1:T(8,128)(2,1)}", 6 * 2**20),
    # Rank 2: the dense row stride, blind to the 8-row tiles.
    ("bf16[512,6144]{1,0:T(8,128)(2,1)}", 6144 * 2),
    ("s8[512,12288]{1,0:T(32,128)(4,1)}", 12288),
    # Where the layout is addressable the old formula was right.
    ("bf16[512,16,2048]{2,1,0:T(8,128)(2,1)}", 16 * 2048 * 2),
    # Tile padding of the two minor-most dims counts: 3 -> 8 rows.
    ("f32[10,3,100]{2,1,0:T(8,128)}", 8 * 128 * 4),
])
def test_legacy_formula(text, legacy):
    assert kvref.legacy_major_slice_byte_size(kvref.Shape.parse(text)) == legacy


def test_no_rows():
    for text in ("f32[]", "f32[0,4]{1,0}"):
        info = kvref.major_slice(kvref.Shape.parse(text))
        assert not info.addressable and "no dim-0 rows" in info.reason


@settings(max_examples=300, deadline=None)
@given(shapes())
def test_dim_max_is_the_largest_table_entry(shape):
    """The analysis takes each dim's largest contribution without enumerating
    the dim; enumeration gives the same number."""
    for d in range(shape.rank):
        table = shape._tiled.dim_table(d)
        assert shape._tiled.dim_max(d) == (int(table.max()) if table.size else 0), (str(shape), d)
