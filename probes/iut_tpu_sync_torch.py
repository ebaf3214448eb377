"""The production library tpu-sync-torch on a real TPU's TorchTPU tensors
(`pytest -m tpu` or `kvprobe run --iut tpu-sync-torch-tpu` on a TPU VM; its
workers run in the torch peer environment, see probes.peer_env).

TorchTPU has no CPU device, so off a TPU every case SKIPs with the reason. The
calls follow what the pinned wheels ship: tpu_sync.api.torch's KVCacheManager
and plan message, TorchTPU's `torch.tpu.set_eager_mode` for DEFER_AND_FUSE, and
its sync module's `is_materialized` / `synchronize`."""

from __future__ import annotations

import kvref
from probes.iut import Adapter, random_host, tpu_layout_of
from probes.sync_manager import SyncLibrary, TorchSyncManager, plan_number
from probes.torch_arrays import from_torch, to_torch, torch_dtype

# torch.tpu.get_device_name() -> generation. TorchTPU names the chips it
# supports by PCI id; it has no v3.
TORCH_TPU_NAMES = {"TPU v4": "v4", "TPU v5e": "v5e", "TPU v5p": "v5p", "TPU v6e": "v6e",
                   "TPU v7": "tpu7x"}


class TpuSyncTorchTpu(SyncLibrary, Adapter):
    name = "tpu-sync-torch-tpu"
    library = "tpu-sync-torch"
    view = TorchSyncManager
    backend = "torch-tpu"
    interpreter = "torch"
    targets = tuple(g for g in kvref.GENERATIONS if g in TORCH_TPU_NAMES.values())
    jax_platforms = None
    owns_device = True

    def __init__(self, generation: str, faults=()):
        super().__init__(generation, faults)
        self._layouts_checked: set = set()

    def skip_reason(self):
        try:
            import torch
            import torch_tpu  # noqa: F401  (registers the "tpu" device)
            import tpu_sync.api.torch.kv_cache_manager  # noqa: F401
        except ImportError as e:
            return f"tpu-sync-torch or TorchTPU is not importable here ({e}); run " \
                   "`kvprobe peer-env --lib torch` on a TPU VM"
        if not torch.accelerator.is_available():
            return "no TPU here: torch.accelerator.is_available() is False"
        found = TORCH_TPU_NAMES.get(self.device_kind)
        if found != self.generation:
            return f"this TPU is {self.device_kind} ({found or 'unknown to kvref'}), not {self.generation}"
        return None

    @property
    def device_kind(self) -> str:
        import torch

        return torch.tpu.get_device_name()

    layout_of = staticmethod(tpu_layout_of)

    def make_cache(self, dtype, dims, seed, mode="put", finite=False):
        """put: `cpu_tensor.to("tpu")`, whose copy may still be landing.
        deferred: a clone recorded under DEFER_AND_FUSE, not yet run."""
        import torch

        self._check_layout(dtype, dims)
        host = random_host(dtype, dims, seed, finite)
        cache = to_torch(host).to("tpu")
        if mode == "deferred":
            with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
                cache = cache.clone()
            if self.is_materialized(cache):
                raise RuntimeError("a clone made under DEFER_AND_FUSE was materialized at once: "
                                   "nothing deferred is left to probe")
        return cache, host

    def plan_request(self, uuid: str):
        """The wheel's own StartTransferRequest: layer 0's block 1 to block 2."""
        from tpu_sync.rpc import raiden_service_pb2 as rpc

        entry = rpc.ShardPushEntryProto(layer_idx=0, src_block_id=1, dst_block_id=2, count=1)
        return rpc.StartTransferRequest(uuid=plan_number(uuid), req_id=uuid, is_sender=True,
                                        shard_push_schedules={0: rpc.ShardPushScheduleProto(entries=[entry])})

    def fetch(self, cache):
        return from_torch(cache)

    def scramble(self, cache):
        # In place, as a serving engine writes its cache: the manager must
        # still be moving this storage afterwards, not a copy of it.
        cache.zero_()
        _sync().synchronize([cache], wait=True)

    def is_materialized(self, cache):
        return bool(_sync().is_materialized(cache))

    def _check_layout(self, dtype, dims):
        """The reference predicts from the compiler's layout; a tensor that
        TorchTPU laid out otherwise would make that prediction meaningless. A
        scratch tensor is read, so the probed caches stay as the probe made them."""
        import torch
        from torch_tpu._internal.compile import tpu_torch_compile

        if (dtype, tuple(dims)) in self._layouts_checked:
            return
        scratch = torch.empty(tuple(dims), dtype=torch_dtype(dtype), device="tpu")
        _sync().synchronize([scratch], wait=True)
        # (minor_to_major, tiles, an int): the first two are what the compiler also decides
        found = tpu_torch_compile.get_device_layout_if_materialized(scratch)
        expected = self.layout(dtype, dims).layout
        if found is None:
            raise RuntimeError(f"TorchTPU reports no layout for a materialized {dtype}{list(dims)}")
        if (tuple(found[0]), tuple(map(tuple, found[1]))) != (expected.minor_to_major, expected.tiles):
            raise RuntimeError(f"TorchTPU laid out {dtype}{list(dims)} as {found}; the compiler's "
                               f"layout, which the prediction uses, is {expected}")
        self._layouts_checked.add((dtype, tuple(dims)))


def _sync():
    from torch_tpu._internal import sync

    return sync
