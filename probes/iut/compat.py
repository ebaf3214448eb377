"""kvref's drop-in facade (kvref.compat.tpu_sync) as a Library: the
production wrapper's API, served by the reference, driven through the same
calls as tpu-sync-jax (its futures' Await and IsReady, its pull and store
calls), so each probe qualifies the facade a serving stack would test
against."""

from __future__ import annotations

import os

import kvref
from kvref.compat import tpu_sync
from probes.iut.exports import KV_EXPORTS, scraped
from probes.iut.surfaces import KVREF_COMPAT
from probes.iut.standin_rails import rails_environment
from probes.iut.store_views import KvrefStoreView
from probes.iut.tpu_sync import PULL_SLOT_BLOCKS, PULL_SLOTS, SyncLibrary, SyncManagerView, WrapperHostTransfers, pool_port


class CompatManagerView(SyncManagerView):
    """The facade's manager; what the harness reads of it (sizes, host
    blocks) comes from the reference underneath, not from the API under test."""

    def __init__(self, caches, host_blocks: int, options: dict):
        self.manager = tpu_sync.KVCacheManager(caches, 0, host_blocks_to_allocate=host_blocks, **options)
        reference = self.manager.reference
        self.num_layers, self.num_shards = reference.num_layers, reference.num_shards
        self.layer_bytes_per_block = tuple(reference.layer_bytes_per_block)
        self.host_blocks = host_blocks
        self.host_bytes = reference.host_bytes

    def read_block_bytes(self, layer: int, block: int, shard: int = 0) -> bytes:
        return self.manager.reference.read_block_bytes(layer, block, shard)

    def register_active_plan(self, uuid, request, is_sender):
        raise NotImplementedError("the wrapper API has no register_active_plan")

    def active_plan(self, uuid):
        raise NotImplementedError("the wrapper API has no active plans")


class CompatLibrary(WrapperHostTransfers, SyncLibrary):
    """The facade, built as tpu-inference's connectors build the wrapper. Its
    fault models are kvref's, which the manager underneath reads from
    $KVREF_FAULTS (set here: the facade's constructor is the wrapper's)."""
    SURFACE = KVREF_COMPAT  # what it offers, mapped to the model (`kvprobe coverage`)

    distribution = "kvref"
    module = "kvref.compat.tpu_sync"
    view = CompatManagerView
    supports_faults = True
    OPTION_SETS = ({},)

    def __init__(self, faults: kvref.Faults, options: dict | None = None):
        if options:
            raise ValueError(f"the facade is built one way; got options {options}")
        self.options = {}
        self.faults = faults
        if faults:
            os.environ[kvref.faults.ENV_VAR] = ",".join(faults.names)

    def wrapper(self):
        return tpu_sync.KVCacheManager

    def refuses(self, e: BaseException) -> bool:
        """kvref's refusals, as the facade raises them (a full pool is also the wrapper's RuntimeError)."""
        return isinstance(e, (kvref.LayoutError, kvref.HostBudgetError, ValueError))

    EXPORTS = KV_EXPORTS

    def exports(self) -> dict[str, float]:
        return scraped(tpu_sync.get_raiden_metrics_prometheus_text())

    def pull_manager(self, caches, form, listen, timeout_s, max_blocks, sub_managers=1):
        """As the disaggregated connector builds it ("slots": max_blocks,
        num_slots and any free control port) or the offload connector does
        ("pool"). Sub-managers: the facade's split per data-plane NIC
        (ENABLE_MULTI_NUMA), on a stand-in host with that many NICs."""
        if sub_managers > 1:
            os.environ.update(rails_environment(sub_managers))
        if form == "pool":
            return tpu_sync.KVCacheManager(caches, pool_port(listen), host_blocks_to_allocate=max_blocks)
        return tpu_sync.KVCacheManager(caches, 0, max_blocks=max_blocks, num_slots=PULL_SLOTS, timeout_s=timeout_s)

    def port_manager(self, caches, port, timeout_s, max_blocks):
        """As a serving stack names the control port."""
        return tpu_sync.KVCacheManager(caches, port, max_blocks=max_blocks, num_slots=PULL_SLOTS, timeout_s=timeout_s)

    def worker_manager(self, caches, worker_port, controller, worker_id, node_id, timeout_s):
        return tpu_sync.KVCacheManager(caches, 0, max_blocks=PULL_SLOT_BLOCKS, num_slots=PULL_SLOTS, timeout_s=timeout_s,
                                       raiden_worker_port=worker_port, raiden_controller_address=controller,
                                       worker_id=worker_id, node_id=node_id)

    def close_manager(self, manager) -> None:
        manager.reference.close()

    def pull_failure(self, manager, req_id) -> str:
        return manager.reference.failure_reason(req_id)

    def plan_request(self, uuid: str, src_block: int, dst_block: int):
        raise NotImplementedError("the wrapper API has no register_active_plan")

    def plan_fields(self, request, is_sender: bool) -> dict:
        raise NotImplementedError("the wrapper API has no active plans")

    def kv_store(self, capacity: int) -> KvrefStoreView:
        return KvrefStoreView(tpu_sync.KVCacheStore(capacity=capacity))
