"""Caches as TorchTPU tensors on this machine's TPU (`pytest -m tpu` or
`kvprobe run --iut tpu-sync-torch-tpu` on a TPU VM).

TorchTPU has no CPU device, so off a TPU every case SKIPs with the reason. The
calls follow what the pinned torch-tpu wheel ships: `torch.tpu.set_eager_mode`
for DEFER_AND_FUSE, and its sync module's `is_materialized` / `synchronize`."""

from __future__ import annotations

import kvref
from kvref.generations import TORCH_TPU_NAMES
from probes.iut.hardware import NO_TPU, TpuUnavailable, torch_tpu_blind, tpu_visible
from probes.iut.host_data import random_host
from probes.iut.reference import tpu_layout_of
from probes.iut.protocol import CacheMode, NoViews

# torch.tpu.get_device_name() names a chip as TORCH_TPU_NAMES says; it has no v3.
TORCH_TPU_GENERATIONS = tuple(g for g in kvref.GENERATIONS if g in TORCH_TPU_NAMES.values())


class TorchTpuArrays:
    backend = "torch-tpu"
    scrambles_in_place = True

    def __init__(self, generation: str):
        self.generation = generation

    layout_of = staticmethod(tpu_layout_of)

    @property
    def device_kind(self) -> str:
        import torch

        return torch.tpu.get_device_name()

    def skip_reason(self):
        try:
            import torch
            import torch_tpu  # noqa: F401  (registers the "tpu" device)
        except ImportError as e:
            return f"TorchTPU is not importable here ({e}); run `kvprobe peer-env --lib torch` " \
                   "on a TPU VM"
        if not tpu_visible():
            return NO_TPU
        blind = torch_tpu_blind()
        if blind:
            return blind
        if not torch.accelerator.is_available():
            raise TpuUnavailable("a TPU is here, but torch.accelerator.is_available() is False")
        found = TORCH_TPU_NAMES.get(self.device_kind)
        if found != self.generation:
            return f"this TPU is {self.device_kind} ({found or 'unknown to kvref'}), not {self.generation}"
        return None

    def make_caches(self, key, seeds, mode=CacheMode.PUT, finite=False):
        """put and landing: `cpu_tensor.to("tpu")`, whose copies may still be landing.
        deferred: clones recorded under DEFER_AND_FUSE, not yet run (the
        probes check that they are still pending when the manager is built)."""
        import torch

        hosts = [random_host(key, seed, finite) for seed in seeds]
        caches = [kvref.to_torch(host).to("tpu") for host in hosts]
        if mode == CacheMode.DEFERRED:
            with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
                caches = [cache.clone() for cache in caches]
        return list(zip(caches, hosts))

    def views(self, key, seeds):
        raise NoViews("the TorchTPU adapter makes no views yet")

    def fetch(self, cache):
        contents = kvref.from_torch(cache)  # waits for the cache to materialize
        self._check_layout(cache)
        return contents

    def scramble(self, cache):
        # In place, as a serving engine writes its cache: the manager must
        # still be moving this storage afterwards, not a copy of it.
        cache.zero_()
        _sync().synchronize([cache], wait=True)

    def is_pending(self, cache):
        """Recorded and not launched. is_materialized is False for a tensor
        already executing too, which finishes on its own: where TorchTPU has
        is_materializing, an executing tensor is not pending."""
        sync = _sync()
        if sync.is_materialized(cache):
            return False
        materializing = getattr(sync, "is_materializing", None)
        return not (materializing is not None and materializing(cache))

    def serving_step(self, cache, new):
        """An in-place copy recorded under DEFER_AND_FUSE, still pending."""
        import torch

        update = kvref.to_torch(new).to("tpu")
        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
            cache.copy_(update)
        return cache

    def dispatch_step(self, cache, new):
        """An in-place copy issued eagerly: TorchTPU runs it asynchronously."""
        cache.copy_(kvref.to_torch(new).to("tpu"))
        return cache

    def hold_copies(self, cache, seconds, until_step=False):
        return False  # no way to slow this device's copies from outside

    def donating_step(self, cache, new, in_place):
        """In place: the eager copy of dispatch_step, into the tensor's own
        storage. A torch tensor's storage is never given up by a step."""
        if not in_place:
            raise NotImplementedError("a TorchTPU tensor keeps its storage across a step; no step gives it up")
        return self.dispatch_step(cache, new)

    def read_by_step(self, cache):
        """A computation on the cache (a double flip, bit-exact), read back."""
        return kvref.from_torch(cache.flip(0).flip(0).cpu())

    def _check_layout(self, cache) -> None:
        """The reference predicts from the compiler's layout; a cache that
        TorchTPU laid out otherwise would make that prediction meaningless.
        Read from the cache under test itself, once it is materialized
        (get_device_layout_if_materialized answers None before)."""
        from torch_tpu._internal.compile import tpu_torch_compile

        key = kvref.ShapeKey(kvref.element_type(cache.dtype).name, tuple(cache.shape))
        found = tpu_torch_compile.get_device_layout_if_materialized(cache)
        if found is None:
            raise RuntimeError(f"TorchTPU reports no layout for a materialized {key} cache")
        # (minor_to_major, tiles, an int): the first two are what the compiler also decides
        expected = self.layout_of(self.generation, key)[0].layout
        if not kvref.Layout(tuple(found[0]), tuple(map(tuple, found[1]))).equal(expected, ignore_element_size=True):
            raise RuntimeError(f"TorchTPU laid out a {key} cache as {found}; the compiler's layout, "
                               f"which the prediction uses, is {expected}")


def _sync():
    from torch_tpu._internal import sync

    return sync
