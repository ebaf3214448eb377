"""A mesh of simulated TPU chips, and arrays split over it as a serving stack
shards its KV caches. A `ShardedArray` is read as a jax.Array is: its
`addressable_shards`, each with the `index` (slices of the global array) it
holds and its `data` on one chip, laid out by the compiler for the shard."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvref.oracle import tpu_layout
from kvref.sharding import Sharding
from kvref.shape_key import ShapeKey
from kvref.sim import DeviceArray, SimDevice
from kvref.torch_interop import as_numpy


@dataclass(frozen=True)
class SimShard:
    device: SimDevice
    index: tuple[slice, ...]  # the part of the global array it holds
    data: DeviceArray


class ShardedArray:
    def __init__(self, mesh: "SimMesh", sharding: Sharding, key: ShapeKey, shards: list[SimShard]):
        self.mesh = mesh
        self.sharding = sharding
        self.key = key
        self.addressable_shards = shards

    @property
    def dims(self) -> tuple[int, ...]:
        return self.key.dims

    def __repr__(self) -> str:
        return f"ShardedArray({self.key} {self.sharding}, {self.mesh.generation})"


class SimMesh:
    """`devices` chips of `generation`, numbered 0 up; arrays split over the
    first as many of them as a sharding's mesh has devices."""

    def __init__(self, generation: str, devices: int):
        self.generation = generation
        self.devices = [SimDevice(generation, i) for i in range(int(devices))]

    def put(self, host_array, sharding, *, land_after_us: int = 0) -> ShardedArray:
        """Host -> every chip its part, each laid out by the compiler for the
        shard of this sharding (kvref.oracle)."""
        sharding = sharding if isinstance(sharding, Sharding) else Sharding.parse(sharding)
        if sharding.devices > len(self.devices):
            raise ValueError(f"{sharding} needs {sharding.devices} devices; this mesh has {len(self.devices)}")
        array = as_numpy(host_array)
        key = ShapeKey(array.dtype, array.shape)
        shard_dims = sharding.shard_dims(key.dims)
        layout = tpu_layout(key.dtype, key.dims, self.generation, sharding)
        shards = []
        for device, start in zip(self.devices, sharding.shard_starts(key.dims)):
            index = tuple(slice(s, s + n) for s, n in zip(start, shard_dims))
            shards.append(SimShard(device, index, device.put(np.ascontiguousarray(array[index]), shape=layout,
                                                             land_after_us=land_after_us)))
        return ShardedArray(self, sharding, key, shards)

    def fetch_shards(self, array: ShardedArray) -> list[np.ndarray]:
        """Every device's part, replicas included, in device order."""
        return [shard.device.fetch(shard.data) for shard in array.addressable_shards]

    def __repr__(self) -> str:
        return f"SimMesh({self.generation!r}, {len(self.devices)} devices)"
