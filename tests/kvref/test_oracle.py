"""The compiler's layouts: verified facts against the shipped table and the
live compiler; the table against the model; lookup order and errors."""

import importlib.util
import random

import pytest

import kvref
from kvref.oracle import compiler, lookup, table, table_key
from kvref.oracle.table_shapes import sharded_table_shapes, table_shapes
from tests.facts import fact_cases

HAVE_LIBTPU = all(importlib.util.find_spec(m) for m in ("jax", "libtpu"))
oracle = pytest.mark.skipif(not HAVE_LIBTPU, reason="jax and libtpu are not installed "
                            "(pip install 'kvref[oracle]')")


@pytest.mark.parametrize("gen, dtype, dims, text, addressable", fact_cases())
def test_facts_in_shipped_table(gen, dtype, dims, text, addressable):
    answer = lookup(dtype, dims, gen, live=False)
    assert answer.source == "table"
    assert str(answer.shape) == text
    assert kvref.major_slice(answer.shape).addressable == addressable


@pytest.mark.oracle
@oracle
@pytest.mark.parametrize("gen, dtype, dims, text, addressable", fact_cases())
def test_facts_from_live_compiler(gen, dtype, dims, text, addressable):
    answer = compiler.compile_layout(dtype, dims, gen)
    assert str(answer.shape) == text
    assert answer.shape.physical_size_bytes == answer.output_bytes
    assert kvref.major_slice(answer.shape).addressable == addressable


@pytest.mark.oracle
@oracle
def test_sample_of_table_recompiles_identically():
    rng = random.Random(7)
    data = table.load()
    for gen in kvref.GENERATIONS:
        for dtype, dims in rng.sample(table_shapes(), 8):
            key = str(kvref.ShapeKey(dtype, dims))
            answer = compiler.compile_layout(dtype, dims, gen)
            assert data["generations"][gen]["layouts"][key] == [str(answer.shape), answer.output_bytes]


def test_the_tables_shards_are_the_compilers_over_their_mesh():
    data = table.load()
    for gen in ("v5e", "tpu7x"):
        for dtype, dims, sharding in sharded_table_shapes()[:4]:
            answer = compiler.compile_layout(dtype, dims, gen, sharding)
            key = table_key(kvref.ShapeKey(dtype, dims), sharding)
            assert data["generations"][gen]["layouts"][key] == [str(answer.shape), answer.output_bytes]


def test_table_covers_every_generation_and_agrees_with_model():
    data = table.load()
    assert set(data["generations"]) == set(kvref.GENERATIONS)
    assert {"jax", "libtpu"} <= set(data["versions"])
    keys = {str(kvref.ShapeKey(d, dims)) for d, dims in table_shapes()}
    keys |= {table_key(kvref.ShapeKey(d, dims), s) for d, dims, s in sharded_table_shapes()}
    for gen, entry in data["generations"].items():
        assert set(entry["layouts"]) == keys, gen
        assert len(keys) >= 300
        for text, size in entry["layouts"].values():
            assert kvref.Shape.parse(text).physical_size_bytes == size, (gen, text)


def test_layouts_differ_between_generations():
    v3 = kvref.tpu_layout("s8", (512, 12288), "v3")
    v4 = kvref.tpu_layout("s8", (512, 12288), "v4")
    assert v3 != v4 and v3.layout.tiles[0] == (8, 128) and v4.layout.tiles[0] == (32, 128)


def test_sub_byte_without_element_size_takes_a_byte():
    v3 = kvref.tpu_layout("s4", (512, 16, 128), "v3")
    v5e = kvref.tpu_layout("s4", (512, 16, 128), "v5e")
    assert v3.layout.element_bits == 0 and v3.element_bits == 8
    assert v5e.layout.element_bits == 4
    assert v3.physical_size_bytes == 2 * v5e.physical_size_bytes


def test_tpu_layout_accepts_numpy_dtypes():
    import ml_dtypes

    assert kvref.tpu_layout(ml_dtypes.bfloat16, [512, 6144], "tpu7x") == \
        kvref.tpu_layout("bf16", (512, 6144), "tpu7x")


def test_bad_lookups_name_the_problem():
    with pytest.raises(ValueError, match="unknown TPU generation 'V9'"):
        kvref.tpu_layout("bf16", (8, 128), "V9")
    with pytest.raises(kvref.OracleUnavailable, match="Invalid TPU external name"):
        kvref.tpu_layout("bf16", (8, 128), "v9")
    with pytest.raises(ValueError, match="unknown element type 'bf17'"):
        kvref.tpu_layout("bf17", (8, 128), "v4")
    with pytest.raises(ValueError, match="dim -1"):
        kvref.tpu_layout("bf16", (8, -1), "v4")
    with pytest.raises(kvref.OracleUnavailable, match=r"bf16\[3,5,7\] on v4 is not in the shipped"):
        lookup("bf16", (3, 5, 7), "v4", live=False)


def test_missing_compiler_says_which_extra(monkeypatch):
    from importlib import metadata

    real_version = metadata.version

    def without_jax(dist):
        if dist == "jax":
            raise metadata.PackageNotFoundError(dist)
        return real_version(dist)

    monkeypatch.setattr(metadata, "version", without_jax)
    with pytest.raises(kvref.OracleUnavailable,
                       match=r"not in the shipped layout table.*needs jax.*kvref\[oracle\]"):
        kvref.tpu_layout("bf16", (3, 5, 7), "v4")


@pytest.mark.oracle
@oracle
def test_live_lookup_is_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("KVREF_CACHE_DIR", str(tmp_path))
    first = lookup("bf16", (3, 5, 7), "v5e")
    assert first.source == "compiler" and "libtpu" in first.versions
    assert list(tmp_path.glob("tpu-layouts-*.json"))

    def must_not_compile(*a, **k):
        raise AssertionError("compiled again despite the cache")

    monkeypatch.setattr(compiler, "compile_layout", must_not_compile)
    assert lookup("bf16", (3, 5, 7), "v5e").shape == first.shape


@pytest.mark.oracle
def test_v4_is_compiled_for_the_megacore_devices_its_hosts_have():
    # libtpu describes v4:2x2x1 as 8 single TensorCores; a v4 host runs its 4 chips as 4 megacore devices.
    assert len(compiler._devices("v4", 1)) == 4
