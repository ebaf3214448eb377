"""What crosses from Python into the C++ core: owners, not addresses; values
built whole by constructors that check them; enums, not strings and bools;
sizes checked for overflow before anything is allocated."""

import jax
import numpy as np
import pytest

import kvref
from kvref import _core
from kvref.buffers import region_of


def region(nbytes=4096):
    return _core.DeviceRegion.of_array(np.zeros(nbytes, np.uint8))


def layer(shards=None, device_blocks=4, shard_blocks=4, block_bytes=1024, host=None, placements=()):
    shards = [region()] if shards is None else shards
    return _core.LayerAddressing(shards=shards, placements=list(placements), device_blocks=device_blocks,
                                 shard_blocks=shard_blocks, block_bytes=block_bytes,
                                 host=host or _core.HostSpan(base=0, blocks=8, slice=1024))


def placed(first_block, host_slot=0, host_slots=1, reads=True):
    return _core.ShardPlacement(first_block=first_block, host_slot=host_slot, host_slots=host_slots, reads=reads)


# -- regions: C++ reads the address and size from the array it holds

def test_a_region_takes_its_size_from_the_array():
    assert region(4096).size == 4096
    assert _core.DeviceRegion.of_array(np.zeros((3, 5), np.float32)).size == 60


def test_a_jax_region_is_the_buffer_the_runtime_reports():
    array = jax.device_put(np.arange(64 * 8 * 128, dtype=np.float32).reshape(64, 8, 128))
    region = _core.DeviceRegion.of_array(array)
    assert region.size == array.on_device_size_in_bytes() == 64 * 8 * 128 * 4


@pytest.mark.parametrize("array, message", [
    (np.zeros((4, 4), np.float32)[:, ::2], "dense and row-major"),
    (np.zeros((4, 4), np.float32).T, "dense and row-major"),
])
def test_a_region_refuses_memory_it_cannot_address_as_bytes(array, message):
    with pytest.raises(ValueError, match=message):
        _core.DeviceRegion.of_array(array)


def test_a_region_refuses_what_is_not_an_array_naming_it():
    with pytest.raises(TypeError, match="got int"):
        _core.DeviceRegion.of_array(1234)


def test_raw_addresses_do_not_cross():
    assert not hasattr(_core.DeviceRegion, "of_pointer")


def test_an_array_smaller_than_its_layout_is_refused():
    shape = kvref.Shape("f32", (8, 128))
    with pytest.raises(ValueError, match=r"takes 2,048 bytes; its layout takes 4,096"):
        region_of(np.zeros((4, 128), np.float32), shape)


# -- layer addressing: one constructor, checked there

@pytest.mark.parametrize("name", ["device_blocks", "shard_blocks", "block_bytes"])
def test_layer_addressing_refuses_negative_counts(name):
    with pytest.raises(ValueError, match=f"{name} is -1; expected a count of zero or more"):
        layer(**{name: -1})


@pytest.mark.parametrize("field", ["base", "blocks", "slice"])
def test_a_host_span_of_negative_sizes_is_refused(field):
    span = {**dict(base=0, blocks=8, slice=1024), field: -1}
    with pytest.raises(ValueError, match=f"the host span's {field} is -1; expected a count of zero or more"):
        layer(host=_core.HostSpan(**span))


def test_values_cross_the_binding_by_name_only():
    with pytest.raises(TypeError):
        _core.ShardPlacement(0, 0, 1, True)  # positional: which number is which?
    with pytest.raises(TypeError):
        _core.HostSpan(0, 8, 1024)
    with pytest.raises(TypeError):
        _core.MoverFaults(True)
    assert _core.MoverFaults(unfenced_copies=True).unfenced_copies


def test_the_host_range_is_the_cores_to_compute():
    """A layer's span of the pool and how far its blocks reach come from C++, not from Python."""
    two_parts = layer(shards=[region(), region()], host=_core.HostSpan(base=4096, blocks=8, slice=1024))
    assert two_parts.host_extent == 2 * 8 * 1024
    assert two_parts.host_end(8) == 4096 + 8 * 1024 + 7 * 1024 + 1024
    with pytest.raises(ValueError, match="9 host blocks do not fit a layer's span of 8"):
        two_parts.host_end(9)


def test_layer_addressing_needs_a_shard():
    with pytest.raises(ValueError, match="at least one shard"):
        layer(shards=[])


def test_per_shard_placement_needs_one_entry_per_shard():
    with pytest.raises(ValueError, match="placements has 1 entries for 2 shards"):
        layer(shards=[region(), region()], placements=[placed(0)])


def test_a_shard_outside_the_layers_blocks_is_refused():
    with pytest.raises(ValueError, match=r"shard 1's blocks \[2, 4\) lie outside the layer's 3 blocks"):
        layer(shards=[region(), region()], device_blocks=3, shard_blocks=2, placements=[placed(0), placed(2)])


def test_a_shard_filling_a_part_its_layer_does_not_have_is_refused():
    with pytest.raises(ValueError, match="shard 1 fills part 2 of 2 of a host block"):
        layer(shards=[region(), region()], placements=[placed(0, 0, 2), placed(0, 2, 2)])


def test_layer_addressing_fields_are_read_only():
    a = layer()
    assert (a.device_blocks, a.block_bytes, a.shard_count) == (4, 1024, 1)
    with pytest.raises(AttributeError):
        a.block_bytes = 7


def test_the_mover_checks_layers_before_it_allocates_its_pool():
    # 2**60 bytes could never be mapped: a refusal naming the layers shows
    # they were checked first, and nothing was allocated.
    mixed = [layer(), layer(shards=[region(), region()])]
    with pytest.raises(ValueError, match="layer 1 has 2 shards, layer 0 1"):
        _core.BlockMover(mixed, 4, 2**60)
    with pytest.raises(ValueError, match="host blocks reach byte 4096, past the 1024-byte host pool"):
        _core.BlockMover([layer()], 4, 1024)
    with pytest.raises(ValueError, match="host_blocks is 0; expected at least one"):
        _core.BlockMover([layer()], 0, 2**60)


# -- enums, not strings and bools

def test_a_copy_takes_a_direction_not_a_flag():
    mover = _core.BlockMover([layer()], 4, 4096)
    zero, one = np.array([0], np.int64), np.array([1], np.int64)
    mover.copy(_core.Direction.DEVICE_TO_HOST, zero, zero, one).wait(10)
    with pytest.raises(TypeError):
        mover.copy(True, zero, zero, one)


def test_a_buffer_arrives_as_an_arrival_not_a_string():
    device = _core.SimDevice(90)
    tiled = kvref.Shape("f32", (4, 4))._tiled
    data = np.zeros(16, np.float32).view(np.uint8)
    buffer = _core.DeviceBuffer.create(device, tiled, data, 4, _core.Arrival.DEFERRED)
    assert buffer.state == kvref.BufferState.DEFERRED
    with pytest.raises(TypeError):
        _core.DeviceBuffer.create(device, tiled, data, 4, "defer")


def test_a_registered_plan_is_a_bound_value():
    plan_request = kvref.StartTransferRequest(uuid="u", peer="p:1", layer_ids=[0], src_block_ids=[1],
                                              dst_block_ids=[2])
    registry = _core.PlanRegistry(1, 8)
    registry.add("u", plan_request.SerializeToString(), True)
    plan = registry.get("u")
    assert isinstance(plan, kvref.Plan) and not isinstance(plan, dict)
    assert (plan.uuid, plan.peer, plan.layer_ids, plan.src_block_ids, plan.dst_block_ids, plan.is_sender) == \
        ("u", "p:1", [0], [1], [2], True)
    with pytest.raises(AttributeError):
        plan.uuid = "v"


# -- sizes that overflow are refused before any allocation

def test_a_logical_size_past_int64_is_an_overflow_not_an_allocation():
    device = _core.SimDevice(91)
    huge = _core.TiledLayout([2**59], _core.Layout([0], [], 0), 8)  # 2**59 bytes: fits
    with pytest.raises(OverflowError, match="logical byte count overflows int64"):
        _core.DeviceBuffer.create(device, huge, b"", 16, _core.Arrival.COMPUTED)


# -- the layout value: checked, printed and compared in one place

def test_the_layout_value_prints_xla_text_and_compares_as_xla_does():
    tiled = _core.Layout([1, 0], [[8, 128], [2, 1]], 16)
    assert str(tiled) == "{1,0:T(8,128)(2,1)E(16)}"
    untiled = _core.Layout([1, 0], [], 0)
    assert not tiled.equal(untiled, False, False)
    assert not tiled.equal(untiled, True, False)
    assert not tiled.equal(untiled, False, True)
    assert tiled.equal(untiled, True, True)
    assert str(kvref.Layout((2, 0, 1), ((8, 128),))) == "{2,0,1:T(8,128)}"


def test_python_and_cpp_share_the_tile_limit():
    assert kvref.shape.MAX_TILES == _core.MAX_TILES == 8
    with pytest.raises(kvref.LayoutError, match="a layout of 9 tiles; at most 8"):
        kvref.Layout((0,), ((1,),) * 9)


def test_the_core_leaks_nothing_at_exit():
    # nanobind names every bound object still alive when the interpreter ends
    # (a default argument's instance is one): a worker's stderr must not carry that.
    import subprocess
    import sys

    code = ("import numpy as np, kvref\n"
            "m = kvref.KVCacheManager([kvref.SimDevice('v5e').zeros((64, 8, 128), 'f32')], 4)\n"
            "m.d2h([0], [1]).result()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "leaked" not in done.stderr, done.stderr[-2000:]
