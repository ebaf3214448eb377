"""A sharding's text form, its meaning (checked against JAX's own), the
compiler's per-shard layouts, and the reference manager's global block ids
on a mesh of simulated chips."""

import numpy as np
import pytest

import kvref
from kvref import oracle
from kvref.oracle import compiler
from kvref.sharding import Sharding
from kvref.sim_mesh import SimMesh

SHARDINGS = [
    ("mesh(model=4) spec(None,None,model)", (512, 16, 8, 128)),
    ("mesh(data=2,model=4) spec(data,None,model)", (512, 16, 8, 128)),
    ("mesh(data=2,model=2) spec((data,model),None)", (512, 16, 8, 128)),
    ("mesh(model=2,replica=2) spec(None,model)", (64, 4, 256)),
    ("mesh(data=4) spec()", (64, 6, 128)),
]


@pytest.mark.parametrize("text, dims", SHARDINGS)
def test_the_text_form_reads_back_as_written(text, dims):
    assert str(Sharding.parse(text)) == text
    assert Sharding.parse(f"  {text.replace(',', ', ')} ") == Sharding.parse(text)


@pytest.mark.parametrize("text, dims", SHARDINGS)
def test_each_devices_part_is_the_one_jax_gives_it(text, dims):
    """Against NamedSharding over devices of an ahead-of-time TPU topology (no TPU needed)."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    sharding = Sharding.parse(text)
    devices = compiler._devices("v6e:2x4", sharding.devices)[: sharding.devices]
    mesh = Mesh(np.array(devices, dtype=object).reshape(sharding.axis_sizes), sharding.axis_names)
    named = NamedSharding(mesh, PartitionSpec(*sharding.partition_spec()))
    assert sharding.shard_dims(dims) == named.shard_shape(dims)
    jax_starts = [tuple(s.start or 0 for s in named.devices_indices_map(dims)[d]) for d in devices]
    assert sharding.shard_starts(dims) == jax_starts


@pytest.mark.parametrize("text, message", [
    ("mesh(data=2) spec(model)", r"names axis model, not in the mesh \(axes: data\)"),
    ("mesh(data=0) spec(data)", r"mesh axis data .* has size 0; expected a positive integer"),
    ("mesh(data=2,data=2) spec(data)", "names an axis twice"),
    ("mesh(a=2,b=2) spec(a,a)", "splits two dimensions over one mesh axis"),
    ("mesh(a=two) spec(a)", r"mesh axis 'a=two' .* is not AXIS=SIZE"),
    ("spec(a) mesh(a=2)", r"cannot read sharding .*expected mesh\(AXIS=SIZE"),
    ("mesh() spec()", "has an empty mesh"),
    ("mesh(a=2) spec((a,))", r"spec entry '\(a,\)' .* is not None, an axis or"),
])
def test_a_sharding_that_cannot_be_read_names_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        Sharding.parse(text)


def test_a_sharding_that_does_not_fit_the_array_names_both():
    with pytest.raises(ValueError, match=r"splits 3 dimensions of a rank-2 array"):
        Sharding.parse("mesh(m=2) spec(None,None,m)").shard_dims((64, 8))
    with pytest.raises(ValueError, match=r"splits dimension 1 \(6\) into 4 parts, which does not divide it"):
        Sharding.parse("mesh(m=4) spec(None,m)").shard_dims((64, 6))


def test_a_mesh_larger_than_the_topology_is_refused_by_name():
    sharding = Sharding.parse("mesh(data=2,model=4) spec(data,None,model)")
    with pytest.raises(ValueError, match=r"a mesh of 8 devices is larger than topology v6e:2x2 \(4 devices\)"):
        oracle.lookup("bf16", (512, 16, 8, 128), "v6e:2x2", sharding=sharding)
    with pytest.raises(ValueError, match=r"a mesh of 4096 devices is larger than any v6e topology tried"):
        oracle.lookup("bf16", (4096, 8, 128), "v6e", sharding=Sharding.parse("mesh(d=4096) spec(d)"))


@pytest.mark.parametrize("generation", ["v5e", "v6e", "tpu7x"])
@pytest.mark.parametrize("text, dims", SHARDINGS[:4])
def test_a_shards_layout_is_the_compilers_for_the_mesh_and_the_model_sizes_it(generation, text, dims, tmp_path,
                                                                                monkeypatch):
    monkeypatch.setenv("KVREF_CACHE_DIR", str(tmp_path))
    sharding = Sharding.parse(text)
    answer = oracle.lookup("bf16", dims, generation, sharding=sharding)
    assert answer.shape.dims == sharding.shard_dims(dims)
    assert answer.shape.physical_size_bytes == answer.compiler_bytes  # the model agrees with the compiler
    assert oracle.lookup("bf16", dims, generation, sharding=sharding) == answer  # from the disk cache now


def test_a_shard_is_laid_out_for_its_own_shape_not_the_global_one(tmp_path, monkeypatch):
    """The reason per-shard layouts are asked for: 8 kv heads tile (8,128), 2 a device tile (2,128)."""
    monkeypatch.setenv("KVREF_CACHE_DIR", str(tmp_path))
    whole = oracle.tpu_layout("bf16", (512, 16, 8, 128), "v6e")
    shard = oracle.tpu_layout("bf16", (512, 16, 8, 128), "v6e", Sharding.parse("mesh(model=4) spec(None,None,model)"))
    assert whole.layout.tiles != shard.layout.tiles and shard.dims == (512, 16, 2, 128)


def _round_trip(text: str, dims=(64, 16, 8, 128), faults=()):
    mesh = SimMesh("v6e", 4)
    rng = np.random.default_rng(0)
    host = rng.standard_normal(dims).astype(np.float32)
    cache = mesh.put(host, text)
    manager = kvref.KVCacheManager([cache], dims[0], faults=faults)
    blocks = np.arange(dims[0])
    manager.d2h(blocks, blocks[::-1].copy()).result()  # block b into host block n-1-b
    manager.h2d(blocks, np.roll(blocks, 1)).result()  # host block j into block j-1
    return mesh, cache, np.roll(host[::-1], -1, axis=0), manager


@pytest.mark.parametrize("text", ["mesh(model=4) spec(None,None,model)", "mesh(data=4) spec(data)",
                                  "mesh(data=2,model=2) spec(data,None,model)",
                                  "mesh(model=2,replica=2) spec(None,None,model)"])
def test_the_reference_moves_global_blocks_of_a_sharded_cache(text):
    mesh, cache, expected, manager = _round_trip(text)
    for shard, part in zip(cache.addressable_shards, mesh.fetch_shards(cache)):
        np.testing.assert_array_equal(part, expected[shard.index])
    assert manager.num_shards == 4


def test_a_host_block_of_a_sharded_cache_holds_every_part_of_one_block():
    """Split over blocks, a host block holds one device's part; over heads, one part per slot."""
    for text, slots in [("mesh(data=4) spec(data)", 1), ("mesh(model=4) spec(None,None,model)", 4),
                        ("mesh(model=2,replica=2) spec(None,None,model)", 2)]:
        _, _, _, manager = _round_trip(text)
        per_block = 16 * 8 * 128 * 4 // slots
        assert manager.host_bytes == 64 * 16 * 8 * 128 * 4
        assert len(manager.read_block_bytes(0, 5, shard=slots - 1)) == per_block
        with pytest.raises(IndexError, match=rf"shard must be an integer in \[0, {slots}\)"):
            manager.read_block_bytes(0, 5, shard=slots)


def test_the_fault_models_misaddress_a_sharded_cache():
    mesh, cache, expected, _ = _round_trip("mesh(model=4) spec(None,None,model)", faults=["first_shard_only"])
    parts = mesh.fetch_shards(cache)
    assert np.array_equal(parts[0], expected[cache.addressable_shards[0].index])
    assert not np.array_equal(parts[1], expected[cache.addressable_shards[1].index])
    with pytest.raises(ValueError, match=r"device block range \[16, 17\) .* exceeds layer 0 \(16 blocks"):
        _round_trip("mesh(data=4) spec(data)", faults=["block_ids_on_every_shard"])


def test_explain_gives_one_devices_shard(capsys):
    from probes.run import cli

    assert cli.main(["explain", "bf16[512,16,8,128]", "-g", "v6e", "--sharding",
                     "mesh(model=4) spec(None,None,model)"]) == 0
    out = capsys.readouterr().out
    assert "bf16[512,16,2,128]{3,2,1,0:T(2,128)(2,1)}" in out and "one device's shard" in out
    assert cli.main(["explain", "bf16[512,6]", "-g", "v6e", "--sharding", "mesh(m=4) spec(None,m)"]) == 2
    assert "splits dimension 1 (6) into 4 parts" in capsys.readouterr().err


@pytest.mark.parametrize("sharding, probes, message", [
    ("mesh(model=4) spec(None,nope)", "roundtrip", r":3: spec of .* names axis nope, not in the mesh"),
    ("mesh(model=3) spec(None,model)", "roundtrip", r":3: sharding .* splits dimension 1 \(8\) into 3 parts"),
    ("mesh(model=2) spec(None,None,None,model)", "roundtrip", r":3: sharding .* splits 4 dimensions of a rank-3"),
    ("mesh(model=2) spec(None,model)", "deferred_construction",
     r":3: probe\(s\) \['deferred_construction'\] make caches on one device"),
])
def test_a_matrix_row_with_a_bad_sharding_names_its_line(tmp_path, sharding, probes, message):
    from probes.suite.matrix import load_matrix

    path = tmp_path / "m.csv"
    path.write_text(f'name,shape,probes,sharding\nok,"bf16[64,8,128]",roundtrip,\nbad,"bf16[64,8,128]",{probes},"{sharding}"\n')
    with pytest.raises(ValueError, match=message):
        load_matrix(str(path))


def test_a_mesh_size_is_ascii_digits():
    with pytest.raises(ValueError, match="is not AXIS=SIZE"):
        kvref.Sharding.parse("mesh(data=\u0662) spec(data)")  # an Arabic-Indic 2
