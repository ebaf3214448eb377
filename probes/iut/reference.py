"""The reference: kvref's KVCacheManager as a Library, and the simulated TPU
of a generation as Arrays."""

from __future__ import annotations

import functools
import os
from importlib import metadata

import numpy as np

import kvref
import kvref.metrics
from kvref.compat.tpu_sync import SHM_KEY_VARIABLE
from kvref.oracle import device_kind, lookup
from kvref.sharding import uneven_parts
from kvref.sim_mesh import SimMesh
from probes.iut.surfaces import KVREF
from probes.iut.exports import KV_EXPORTS, scraped
from probes.iut.host_data import random_host
from probes.iut.protocol import CacheMode, NoViews
from probes.iut.store_views import KvrefStoreView


def tpu_layout_of(generation: str, key: kvref.ShapeKey,
                  sharding: kvref.Sharding | None = None) -> tuple[kvref.Shape, str]:
    """The generation's compiler layout (of one device's shard, with a
    sharding), and where the answer came from."""
    answer = lookup(key.dtype, key.dims, generation, sharding=sharding)
    return answer.shape, f"{answer.source} ({answer.versions})"


@functools.cache
def _installed(distribution: str) -> str:
    """An installed distribution's version (reading its metadata costs milliseconds a case)."""
    return metadata.version(distribution)


class KvrefLibrary:
    """kvref.KVCacheManager with the case's fault models switched on."""
    SURFACE = KVREF  # what it offers, mapped to the model (`kvprobe coverage`)

    distribution = "kvref"
    supports_faults = True
    OPTION_SETS = ({},)

    def __init__(self, faults: kvref.Faults, options: dict | None = None):
        if options:
            raise ValueError(f"kvref's manager is built one way; got options {options}")
        self.faults = faults

    @property
    def version(self) -> str:
        return _installed(self.distribution)

    def skip_reason(self) -> str | None:
        return None

    def manager(self, caches, host_blocks, **options):
        """`enable_shm=True`: the pool attached under $RAIDEN_SHM_KEY, as the facade does."""
        if options.pop("enable_shm", False):
            options["shm_key"] = os.environ.get(SHM_KEY_VARIABLE)
        return kvref.KVCacheManager(caches, host_blocks, faults=self.faults, **options)

    def refuses(self, e: BaseException) -> bool:
        return isinstance(e, (kvref.LayoutError, kvref.HostBudgetError, ValueError))

    EXPORTS = KV_EXPORTS

    def exports(self) -> dict[str, float]:
        return scraped(kvref.metrics.prometheus_text())

    def kv_store(self, capacity: int) -> KvrefStoreView:
        return KvrefStoreView(kvref.KVCacheStore(capacity, faults=self.faults))

    def pull_manager(self, caches, form, listen, timeout_s, max_blocks, sub_managers=1):
        """"slots": pull slots of max_blocks blocks; "pool": the default slots
        beside a pool of max_blocks host blocks. Layers of several block
        sizes are each addressed with their own (a pull moves them all)."""
        slots = {"pull_slots": 4, "pull_slot_blocks": max_blocks} if form == "slots" else {}
        return kvref.KVCacheManager(caches, max_blocks, faults=self.faults, timeout_s=timeout_s,
                                    slice_policy="per_layer",
                                    listen="127.0.0.1:0" if listen else None, sub_managers=sub_managers, **slots)

    def port_manager(self, caches, port, timeout_s, max_blocks):
        return kvref.KVCacheManager(caches, max_blocks, faults=self.faults, timeout_s=timeout_s,
                                    slice_policy="per_layer", listen=f"127.0.0.1:{port}", pull_slots=4,
                                    pull_slot_blocks=max_blocks)

    def close_manager(self, manager) -> None:
        manager.close()

    def host_manager(self, caches, listen, timeout_s, host_blocks):
        return kvref.KVCacheManager(caches, host_blocks, faults=self.faults, timeout_s=timeout_s,
                                    slice_policy="per_layer", listen="127.0.0.1:0" if listen else None,
                                    serve_host=listen)

    def host_read(self, manager, peer, block_ids):
        chunks, future = manager.h2h_read(peer, block_ids)
        return chunks, KvrefPending(future)

    def host_write(self, manager, peer, block_ids):
        chunks, future = manager.h2h_write(peer, block_ids)
        return chunks, KvrefPending(future)

    def host_copy(self, manager, d2h, src, dst, sizes) -> None:
        self.transfer(manager, d2h, src, dst, sizes)

    def host_save(self, manager, src):
        return self.save(manager, src)

    def host_unlock(self, manager, chunk_ids) -> None:
        self.unlock(manager, chunk_ids)

    def pull_failure(self, manager, req_id) -> str:
        return manager.failure_reason(req_id)

    def transfer(self, manager, d2h, src, dst, sizes=None) -> None:
        self.start(manager, d2h, src, dst, sizes).wait()

    def start(self, manager, d2h, src, dst, sizes=None):
        return KvrefPending((manager.d2h if d2h else manager.h2d)(src, dst, sizes))

    def save(self, manager, src, sizes=None):
        chunks, future = manager.d2h_auto_allocate(src, sizes)
        return chunks, KvrefPending(future)

    def unlock(self, manager, chunk_ids) -> None:
        manager.unlock_blocks(chunk_ids)

    def plan_request(self, uuid: str, src_block: int, dst_block: int):
        return kvref.StartTransferRequest(uuid=uuid, layer_ids=[0], src_block_ids=[src_block],
                                          dst_block_ids=[dst_block])

    def plan_fields(self, request, is_sender: bool) -> dict:
        return {"uuid": request.uuid, "peer": request.peer, "layer_ids": list(request.layer_ids),
                "src_block_ids": list(request.src_block_ids),
                "dst_block_ids": list(request.dst_block_ids), "is_sender": is_sender}


class KvrefPending:
    """A kvref transfer's future, waited for with a bound (the probe's own
    watchdog is longer)."""

    def __init__(self, future):
        self.future = future

    def wait(self) -> None:
        self.future.result(timeout=60)

    def done(self) -> bool:
        return self.future.done()


class SimArrays:
    """Caches on the simulated TPU of the case's generation, laid out as that
    generation's compiler lays them out."""

    backend = "sim"
    scrambles_in_place = True
    runs_in_forked_child = True  # a SimDevice made in the child runs there
    # Host->device copies, steps and donating steps stay in flight until the
    # device is asked for a result (kvref.DeviceArray.write_'s until_needed),
    # at most this long: in flight whenever a probe looks, on any machine,
    # and done as soon as the manager needs them.
    IN_FLIGHT_US = 5_000_000

    def __init__(self, generation: str):
        self.device = kvref.SimDevice(generation)
        self.mesh = None  # made for the first sharded cache

    layout_of = staticmethod(tpu_layout_of)
    sharded_layout_of = staticmethod(tpu_layout_of)

    @property
    def device_kind(self) -> str:
        return device_kind(self.device.generation)

    def skip_reason(self) -> str | None:
        return None

    def make_caches(self, key, seeds, mode=CacheMode.PUT, finite=False):
        hosts = [random_host(key, seed, finite) for seed in seeds]
        if mode == CacheMode.DEFERRED:
            with self.device.defer_and_fuse():
                caches = [self.device.zeros(key.dims, key.dtype).write_(host) for host in hosts]
            return list(zip(caches, hosts))
        layout = self.layout_of(self.device.generation, key)[0]
        landing = mode == CacheMode.LANDING
        return [(self.device.put(host, shape=layout, land_after_us=self.IN_FLIGHT_US if landing else 0,
                                 until_needed=landing), host) for host in hosts]

    def make_sharded_caches(self, key, sharding, seeds):
        """On a mesh of simulated chips of this generation, each shard laid out
        as the compiler lays it out for the whole mesh."""
        hosts = [random_host(key, seed) for seed in seeds]
        if self.mesh is None or len(self.mesh.devices) < sharding.devices:
            self.mesh = SimMesh(self.device.generation, sharding.devices)  # one mesh for all a case's caches
        return [(self.mesh.put(host, sharding), host) for host in hosts]

    def fetch_shards(self, cache):
        return [(shard.index, shard.device.fetch(shard.data)) for shard in cache.addressable_shards]

    def make_uneven_shards(self, key, dim, parts, seed):
        host = random_host(key, seed)
        index = uneven_parts(key.dims, dim, parts)
        if self.mesh is None or len(self.mesh.devices) < parts:
            self.mesh = SimMesh(self.device.generation, parts)
        return ([device.put(np.ascontiguousarray(host[where])) for device, where in zip(self.mesh.devices, index)],
                host, index)

    def views(self, key, seeds):
        raise NoViews("the simulated device has no views of one array into another")

    def fetch(self, cache):
        return cache.device.fetch(cache)

    def scramble(self, cache):
        cache.fill_(0)
        cache.await_buffer()

    def is_pending(self, cache):
        return cache.state != kvref.BufferState.MATERIALIZED

    def serving_step(self, cache, new):
        """An in-place write recorded under DEFER_AND_FUSE, still pending."""
        with cache.device.defer_and_fuse():
            cache.write_(new)
        return cache

    def dispatch_step(self, cache, new):
        """An in-place op launched now, computing until its result is needed."""
        return cache.write_(new, run_us=self.IN_FLIGHT_US, until_needed=True)

    def read_by_step(self, cache):
        return cache.device.fetch(cache)

    def donating_step(self, cache, new, in_place):
        """Still running when the save after it is issued."""
        return cache.donate(new, aliased=in_place, run_us=self.IN_FLIGHT_US, until_needed=True)

    def update_blocks(self, cache, blocks, values):
        """A serving step writing some blocks alone, the cache donated and
        written in place, still running until a result is needed."""
        return cache.donate_rows(blocks, values, run_us=self.IN_FLIGHT_US, until_needed=True)

    def hold_copies(self, cache, seconds, until_step=False):
        cache.hold_next_dma(int(seconds * 1e6), until_next_op=until_step)
        return True

    def fail_copies(self, cache, start, end):
        """Every later copy touching bytes [start, end) of the cache's storage fails."""
        cache.fail_dma_in(start, end)


_installed(KvrefLibrary.distribution)  # read where this module is imported: a zygote's workers find it read
