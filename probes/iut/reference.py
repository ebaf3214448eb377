"""The reference: kvref's KVCacheManager as a Library, and the simulated TPU
of a generation as Arrays."""

from __future__ import annotations

from importlib import metadata

import kvref
from kvref.oracle import device_kind, lookup
from probes.iut.host_data import random_host


def tpu_layout_of(generation: str, key: kvref.ShapeKey) -> tuple[kvref.Shape, str]:
    """The generation's compiler layout, and where the answer came from."""
    answer = lookup(key.dtype, key.dims, generation)
    return answer.shape, f"{answer.source} ({answer.versions})"


class KvrefLibrary:
    """kvref.KVCacheManager with the case's fault models switched on."""

    distribution = "kvref"
    supports_faults = True

    def __init__(self, faults: kvref.Faults):
        self.faults = faults

    @property
    def version(self) -> str:
        return metadata.version(self.distribution)

    def skip_reason(self) -> str | None:
        return None

    def manager(self, caches, host_blocks, **options):
        return kvref.KVCacheManager(caches, host_blocks, faults=self.faults, **options)

    def transfer(self, manager, d2h, src, dst, sizes=None) -> None:
        future = (manager.d2h if d2h else manager.h2d)(src, dst, sizes)
        future.result(timeout=60)

    def plan_request(self, uuid: str):
        return kvref.StartTransferRequest(uuid=uuid, layer_ids=[0], src_block_ids=[1], dst_block_ids=[2])


class SimArrays:
    """Caches on the simulated TPU of the case's generation, laid out as that
    generation's compiler lays them out."""

    backend = "sim"
    PUT_DELAY_US = 20_000  # host->device copies still landing at construction

    def __init__(self, generation: str):
        self.device = kvref.SimDevice(generation)

    layout_of = staticmethod(tpu_layout_of)

    @property
    def device_kind(self) -> str:
        return device_kind(self.device.generation)

    def skip_reason(self) -> str | None:
        return None

    def make_cache(self, key, seed, mode="put", finite=False):
        host = random_host(key, seed, finite)
        if mode == "deferred":
            with self.device.defer_and_fuse():
                cache = self.device.zeros(key.dims, key.dtype)
                cache.write_(host)
            return cache, host
        layout = self.layout_of(self.device.generation, key)[0]
        return self.device.put(host, shape=layout, land_after_us=self.PUT_DELAY_US), host

    def fetch(self, cache):
        return cache.device.fetch(cache)

    def scramble(self, cache):
        cache.fill_(0)
        cache.await_buffer()

    def is_materialized(self, cache):
        return cache.state == kvref.BufferState.MATERIALIZED
