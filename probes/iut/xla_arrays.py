"""Caches as PyTorch/XLA tensors on the XLA CPU device (`PJRT_DEVICE=CPU`):
real lazy tensors, no TPU needed.

- put: copied to the device and synced, waited for.
- deferred: a device tensor with its rows reversed twice (`flip(0).flip(0)`:
  bit-exact, not a view), recorded and never synced, so
  `_check_tensor_need_materialization` says it is pending. (A `clone()` of a
  device tensor is not: it is device data at once.)
- landing: the device tensor selected (over zeros) through a condition that
  is always true but known only once a large matrix product is done, synced
  without waiting: its buffer is promised but not there while the product runs (PjRt
  has no buffer for it yet).

`scramble` zeroes the cache in place and leaves it pending, and
`serving_step` overwrites it in place and syncs: either way the tensor gets a
new buffer, so a manager must move its live storage, not the one it saw at
construction. `views` gives pending views of a stacked cache."""

from __future__ import annotations

import os

import numpy as np

import kvref
from probes.iut.dense_cpu import DenseCpuArrays
from probes.iut.host_data import random_host
from probes.iut.protocol import CacheMode, NotInPlace

# The landing graph's product: n x n f32, about 2 n^3 flops (a few hundred ms
# on one core), long enough to outlast building the manager.
LANDING_MATMUL_N = 2048


class TorchXlaArrays(DenseCpuArrays):
    backend = "torch-xla-cpu"
    scrambles_in_place = True
    platform = "XLA"

    def skip_reason(self):
        if os.environ.get("PJRT_DEVICE", "CPU") != "CPU":
            return f"PJRT_DEVICE={os.environ['PJRT_DEVICE']}: these caches live on the XLA CPU device"
        try:
            import torch_xla  # noqa: F401
        except ImportError:
            return "torch_xla is not installed here: run `kvprobe peer-env --lib xla` (`make xla-env`)"
        return None

    def make_caches(self, key, seeds, mode=CacheMode.PUT, finite=False):
        import torch
        import torch_xla

        hosts = [random_host(key, seed, finite) for seed in seeds]
        device = torch_xla.device()
        placed = [kvref.to_torch(host).to(device) for host in hosts]
        torch_xla.sync(wait=True)
        if mode == CacheMode.PUT:
            return list(zip(placed, hosts))
        caches = [t.flip(0).flip(0) for t in placed]
        if mode == CacheMode.LANDING:
            a = torch.rand(LANDING_MATMUL_N, LANDING_MATMUL_N, device=device)
            product = (a @ a).sum()
            gate = product == product  # finite, so true; XLA cannot know that before computing it
            # Between the cache and zeros, so no simplification can hand back the input itself.
            caches = [torch.where(gate, t, torch.zeros_like(t)) for t in placed]
            torch_xla.sync(wait=False)
        return list(zip(caches, hosts))

    def views(self, key, seeds):
        """Row i of one stacked tensor per seed; a view stays a pending graph
        until it is itself materialized, even after its base is synced."""
        import torch
        import torch_xla

        hosts = [random_host(key, seed) for seed in seeds]
        stacked = torch.stack([kvref.to_torch(h) for h in hosts]).to(torch_xla.device())
        torch_xla.sync(wait=True)
        return ([(stacked[i], host) for i, host in enumerate(hosts)],
                lambda layer: kvref.from_torch(stacked)[layer])

    def fetch(self, cache):
        return kvref.from_torch(cache)

    def scramble(self, cache):
        cache.zero_()  # recorded, not run: the tensor is pending until something syncs it

    def is_pending(self, cache):
        import torch_xla

        xla = torch_xla._XLAC
        if xla._check_tensor_need_materialization([cache])[0]:
            return True
        try:
            xla._unsafe_buffer_pointer(cache)
        except RuntimeError:  # synced, but PjRt has no buffer for it yet
            return True
        return False

    def serving_step(self, cache, new: np.ndarray):
        import torch_xla

        cache.copy_(kvref.to_torch(new).to(cache.device))
        torch_xla.sync(wait=True)
        return cache

    def dispatch_step(self, cache, new: np.ndarray):
        """The in-place copy of `new`, recorded and not synced: a lazy tensor's
        step is in flight until something syncs it (an unwaited sync on the
        XLA CPU device hands its buffer over too soon to be seen running).
        The double flip makes it a computation (a copy of device data is not)."""
        cache.copy_(kvref.to_torch(new).to(cache.device).flip(0).flip(0))
        return cache

    def hold_copies(self, cache, seconds, until_step=False):
        return False  # no way to slow this device's copies from outside

    def donating_step(self, cache, new: np.ndarray, in_place: bool):
        """A synced step writing `new` into the tensor. torch_xla aliases an
        in-place op's output to its input only where the graph reads the
        input: in place, the step selects `new` through a mask computed from
        the cache (true everywhere, NaN included; checked to keep the
        buffer); otherwise it copies a computation of `new`, which gets a
        new buffer and frees the old."""
        import torch
        import torch_xla

        update = kvref.to_torch(new).to(cache.device)
        torch_xla.sync(wait=True)
        storage = torch_xla._XLAC._unsafe_buffer_pointer(cache)
        if in_place:
            cache.copy_(torch.where((cache != cache) | (cache == cache), update, cache))
        else:
            cache.copy_(update.flip(0).flip(0))
        torch_xla.sync(wait=True)
        if in_place and torch_xla._XLAC._unsafe_buffer_pointer(cache) != storage:
            raise NotInPlace(f"torch_xla gave the in-place step's output a new buffer on {cache.device}")
        return cache

    def read_by_step(self, cache):
        """A computation on the cache (a double flip, bit-exact), synced and read."""
        return kvref.from_torch(cache.flip(0).flip(0).cpu())
