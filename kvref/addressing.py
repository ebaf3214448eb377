"""Where each layer's blocks live on the device and in the host pool."""

from __future__ import annotations

from dataclasses import dataclass

from kvref import _core
from kvref.buffers import DeviceBufferView
from kvref.errors import HostBudgetError
from kvref.faults import Faults
from kvref.slices import legacy_major_slice_byte_size, validate_major_slice_addressable

SLICE_POLICIES = ("uniform", "per_layer")
MAX_HOST_BYTES = 2**62  # offsets within a pool stay far from int64's end


@dataclass(frozen=True)
class HostPlan:
    layers: list  # _core.LayerAddressing per layer
    slice_bytes: tuple[int, ...]  # bytes per block, per layer
    host_bytes: int  # what the manager reports and the budget checks
    allocate_bytes: int  # what must be mapped so no copy leaves the pool


def layer_slice_bytes(view: DeviceBufferView, layer: int, faults: Faults) -> int:
    if faults.legacy_slice_formula:
        return legacy_major_slice_byte_size(view.shape)
    try:
        return validate_major_slice_addressable(view.shape)
    except ValueError as e:
        raise type(e)(f"layer {layer}: {e}") from None


def plan_host(views: list[list[DeviceBufferView]], host_blocks: int, policy: str,
              faults: Faults) -> HostPlan:
    """Slice sizes per layer, their device and host addressing, and the pool size."""
    slices = [layer_slice_bytes(layer[0], i, faults) for i, layer in enumerate(views)]
    mixed_from_layer0 = faults.allow_mixed_slices
    if policy == "uniform" and not mixed_from_layer0:
        for i, size in enumerate(slices):
            if size != slices[0]:
                raise ValueError(
                    f"layer {i} has {size}-byte blocks ({views[i][0].shape}) but layer 0 has "
                    f"{slices[0]}-byte blocks ({views[0][0].shape}); use slice_policy='per_layer' "
                    "or one manager per block size")
    shards = len(views[0])
    host_slices = [slices[0] if mixed_from_layer0 else s for s in slices]
    total = shards * host_blocks * sum(host_slices)
    if total > MAX_HOST_BYTES:  # before any C++ sees a size that does not fit
        raise HostBudgetError(f"the host pool would take {total:,} bytes ({host_blocks} host blocks x "
                              f"{len(views)} layers x {shards} shards), more than one pool can address "
                              f"({MAX_HOST_BYTES:,} bytes); nothing was allocated")
    layers, base, reach = [], 0, 0
    for i, layer in enumerate(views):
        # The old manager derived every layer's host stride from layer 0's slice.
        host_slice = slices[0] if mixed_from_layer0 else slices[i]
        a = _core.LayerAddressing()
        a.shards = [v.region for v in layer]
        a.device_blocks = layer[0].shape.dims[0]
        a.device_stride = a.copy_bytes = slices[i]
        a.host_base, a.host_stride = base, host_slice
        a.host_shard_stride = host_blocks * host_slice
        layers.append(a)
        reach = max(reach, base + (shards - 1) * a.host_shard_stride
                    + (host_blocks - 1) * host_slice + slices[i])
        base += shards * host_blocks * host_slice
    return HostPlan(layers, tuple(slices), base, max(base, reach))
