"""The production library, tpu-sync-jax, on JAX CPU arrays (it needs Python
3.12: its workers run in the peer environment, see probes.peer_env)."""

from __future__ import annotations

from importlib import metadata

import numpy as np

import kvref
from kvref.oracle import table
from probes.iut import KvrefJax, random_host, tpu_layout_of


class TpuSyncManager:
    """tpu-sync-jax's KVCacheManager behind the attributes the probes read.
    It keeps no reference to the caches: release-order probes rely on that."""

    def __init__(self, caches, host_blocks: int, parallelism: int = 2):
        from tpu_sync.api.jax.kv_cache_manager import KVCacheManager

        self.manager = KVCacheManager(caches, 0, host_blocks_to_allocate=host_blocks,
                                      unsafe_skip_buffer_lock=True, parallelism=parallelism)
        impl = self.manager._impl
        self.num_layers, self.num_shards = impl.num_layers, impl.num_shards
        self.slice_bytes = impl.slice_byte_size
        self.layer_bytes_per_block = (self.slice_bytes,) * self.num_layers
        self.host_blocks = host_blocks
        self.host_bytes = None  # the library does not report its pool size

    def read_block_bytes(self, layer: int, block: int, shard: int = 0) -> bytes:
        """One host block, through the reader the library offers:
        read_host_memory(layer, shard, n) returns the first n float32 values of
        that pool (get_host_pointer answers 0 on JAX CPU arrays). NaN payloads
        may not survive the trip through Python floats: probes that read host
        blocks use finite contents."""
        if not 0 <= block < self.host_blocks:
            raise IndexError(f"host block {block} is out of range [0, {self.host_blocks})")
        floats = self.slice_bytes // 4
        values = self.manager._impl.read_host_memory(layer, shard, (block + 1) * floats)
        return np.asarray(values[block * floats:], dtype=np.float32).tobytes()

    def register_active_plan(self, uuid, request, is_sender):
        raise NotImplementedError("tpu-sync-jax offers no register_active_plan")


class TpuSyncJax(KvrefJax):
    name = "tpu-sync-jax"
    backend = "jax-cpu"
    interpreter = "peer"

    def skip_reason(self):
        try:
            import tpu_sync.api.jax.kv_cache_manager  # noqa: F401
        except ImportError as e:
            return f"tpu-sync-jax is not importable here ({e}); run `kvprobe peer-env`"
        return None

    @property
    def version(self) -> str:
        return metadata.version("tpu-sync-jax")

    def manager(self, caches, host_blocks, **options):
        if options.get("slice_policy", "uniform") != "uniform":
            raise NotImplementedError("tpu-sync-jax has no slice_policy")
        return TpuSyncManager(caches, host_blocks)

    def transfer(self, manager, d2h: bool, src, dst, sizes=None) -> None:
        m = manager.manager
        future = (m.d2h if d2h else m.h2d)([int(x) for x in src], [int(x) for x in dst],
                                           None if sizes is None else [int(x) for x in sizes])
        future.Await()


class TpuSyncJaxTpu(TpuSyncJax):
    """tpu-sync-jax on a real TPU's arrays (pytest -m tpu on a TPU VM). Arrays
    take the layout the generation's compiler gives them; the reference
    predicts from the same layout."""

    name = "tpu-sync-jax-tpu"
    backend = "jax-tpu"
    targets = kvref.GENERATIONS
    jax_platforms = None  # the worker must see the TPU

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
    """The generation of this machine's TPU, from the device kinds the layout
    table records per generation."""
    try:
        kind = tpu_device().device_kind
    except Exception:  # no TPU backend at all
        return None
    for gen, entry in table.load()["generations"].items():
        if entry.get("device_kind") == kind:
            return gen
    return None
