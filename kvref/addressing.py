"""Where each layer's blocks live on the device and in the host pool."""

from __future__ import annotations

from dataclasses import dataclass

from kvref import _core
from kvref.buffers import DeviceBufferView
from kvref.errors import PoolTooLarge
from kvref.faults import Faults
from kvref.sharding import ShardPlacement
from kvref.slices import legacy_major_slice_byte_size, validate_major_slice_addressable

SLICE_POLICIES = ("uniform", "per_layer")
MAX_HOST_BYTES = 2**62  # offsets within a pool stay far from int64's end


@dataclass(frozen=True)
class HostPlan:
    layers: list  # _core.LayerAddressing per layer
    slice_bytes: tuple[int, ...]  # bytes per block, per layer
    host_bytes: int  # what the manager reports and the budget checks
    allocate_bytes: int  # what must be mapped so no copy leaves the pool
    host_slots: tuple[int, ...]  # per layer, the parts a host block holds (one per shard unless split)


def layer_slice_bytes(view: DeviceBufferView, layer: int, faults: Faults) -> int:
    if faults.legacy_slice_formula:
        return legacy_major_slice_byte_size(view.shape)
    try:
        return validate_major_slice_addressable(view.shape)
    except ValueError as e:
        raise type(e)(f"layer {layer}: {e}") from None


def plan_host(views: list[list[DeviceBufferView]], host_blocks: int, policy: str,
              faults: Faults, placements: list[list[ShardPlacement] | None] | None = None) -> HostPlan:
    """Slice sizes per layer, their device and host addressing, and the pool
    size. `placements`, per layer: where each shard of a cache split over
    devices lies (kvref.sharding), or None where every shard holds every block."""
    placements = [_placed(p, faults) for p in (placements or [None] * len(views))]
    slices = [layer_slice_bytes(layer[0], i, faults) for i, layer in enumerate(views)]
    mixed_from_layer0 = faults.allow_mixed_slices
    if policy == "uniform" and not mixed_from_layer0:
        for i, size in enumerate(slices):
            if size != slices[0]:
                raise ValueError(
                    f"layer {i} has {size}-byte blocks ({views[i][0].shape}) but layer 0 has "
                    f"{slices[0]}-byte blocks ({views[0][0].shape}); use slice_policy='per_layer' "
                    "or one manager per block size")
    slots = [placed[0].host_slots if placed else len(layer) for placed, layer in zip(placements, views)]
    host_slices = [slices[0] if mixed_from_layer0 else s for s in slices]
    total = host_blocks * sum(n * s for n, s in zip(slots, host_slices))
    if total > MAX_HOST_BYTES:  # before any C++ sees a size that does not fit
        raise PoolTooLarge(f"the host pool would take {total:,} bytes ({host_blocks} host blocks x "
                              f"{len(views)} layers x {max(slots)} shards), more than one pool can address "
                              f"({MAX_HOST_BYTES:,} bytes); nothing was allocated")
    layers, base, reach = [], 0, 0
    for i, layer in enumerate(views):
        # The old manager derived every layer's host stride from layer 0's slice.
        host_slice = slices[0] if mixed_from_layer0 else slices[i]
        addressed = layer[:1] if faults.first_shard_only else layer
        placed = placements[i][: len(addressed)] if placements[i] else []
        shard_blocks = layer[0].shape.dims[0]
        device_blocks = shard_blocks + max((p.first_block for p in placements[i] or ()), default=0)
        addressing = _core.LayerAddressing(
            shards=[v.region for v in addressed], device_blocks=device_blocks, shard_blocks=shard_blocks,
            block_bytes=slices[i],
            placements=placed,
            host=_core.HostSpan(base=base, blocks=host_blocks, slice=host_slice))
        layers.append(addressing)
        reach = max(reach, addressing.host_end(host_blocks))
        base += addressing.host_extent
    return HostPlan(layers, tuple(slices), base, max(base, reach), tuple(slots))


def _placed(placements: list[ShardPlacement] | None, faults: Faults) -> list[ShardPlacement] | None:
    """None where every shard holds every block at a host slot of its own
    (as that fault model takes every sharded cache)."""
    return None if faults.block_ids_on_every_shard or not placements else placements
