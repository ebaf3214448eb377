"""The production library, tpu-sync-jax, on JAX CPU arrays and on a real TPU's
arrays (it needs Python 3.12: its workers run in the jax peer environment, see
probes.peer_env)."""

from __future__ import annotations

import numpy as np

import kvref
from probes.hardware import generation_of_device_kind
from probes.iut import KvrefJax, random_host, tpu_layout_of
from probes.sync_manager import JaxSyncManager, SyncLibrary


class TpuSyncJax(SyncLibrary, KvrefJax):
    name = "tpu-sync-jax"
    library = "tpu-sync-jax"
    view = JaxSyncManager
    backend = "jax-cpu"
    interpreter = "jax"

    def skip_reason(self):
        try:
            import tpu_sync.api.jax.kv_cache_manager  # noqa: F401
        except ImportError as e:
            return f"tpu-sync-jax is not importable here ({e}); run `kvprobe peer-env`"
        return None


class TpuSyncJaxTpu(TpuSyncJax):
    """tpu-sync-jax on a real TPU's arrays (pytest -m tpu on a TPU VM). Arrays
    take the layout the generation's compiler gives them; the reference
    predicts from the same layout."""

    name = "tpu-sync-jax-tpu"
    backend = "jax-tpu"
    targets = kvref.GENERATIONS
    jax_platforms = None  # the worker must see the TPU
    owns_device = True

    def skip_reason(self):
        reason = super().skip_reason()
        if reason:
            return reason
        found = local_tpu_generation()
        if found is None:
            return "no TPU here: jax.devices('tpu') found none"
        if found != self.generation:
            return f"this TPU is {found}, not {self.generation}"
        return None

    @property
    def device_kind(self) -> str:
        return tpu_device().device_kind

    layout_of = staticmethod(tpu_layout_of)

    def make_cache(self, dtype, dims, seed, mode="put", finite=False):
        import jax

        host = random_host(dtype, dims, seed, finite)
        return jax.device_put(host, tpu_device()), host

    def fetch(self, cache):
        import jax

        return np.asarray(jax.device_get(cache))

    def scramble(self, cache):
        # The public API offers no in-place device write. Without it the h2d of
        # a second permutation must still move every block for the check to hold.
        cache.block_until_ready()


def tpu_device():
    import jax

    return jax.devices("tpu")[0]


def local_tpu_generation() -> str | None:
    """The generation of the TPU this process has opened, or None."""
    try:
        kind = tpu_device().device_kind
    except Exception:  # no TPU backend at all
        return None
    return generation_of_device_kind(kind)
