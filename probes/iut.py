"""Implementations under test, behind one small interface.

An adapter makes KV caches on its device, builds its manager, moves blocks,
reads caches back as logical arrays and scrambles them. The probes only talk
to this interface, so the same probe runs against the reference on the
simulated device, the reference on JAX CPU arrays, or a production library.
"""

from __future__ import annotations

import ctypes
from importlib import metadata

import numpy as np

import kvref
from kvref.oracle import lookup, table


class Adapter:
    name = ""
    backend = ""
    interpreter = "main"  # or a peer environment's name: its workers run there (probes.peer_env)
    targets: tuple[str, ...] = ("cpu",)  # the --generation values it runs on
    jax_platforms: str | None = "cpu"  # JAX_PLATFORMS for its workers (None: leave as is)
    owns_device = False  # True: a worker holds the real TPU, so cases run one at a time

    def __init__(self, generation: str, faults=()):
        self.generation = generation
        self.faults = tuple(faults)

    @property
    def version(self) -> str:
        return metadata.version("kvref")

    @property
    def device_kind(self) -> str:
        return ""

    def skip_reason(self) -> str | None:
        """Why this adapter cannot run here, or None."""
        return None

    @staticmethod
    def layout_of(generation: str, dtype: str, dims) -> tuple[kvref.Shape, str]:
        """The layout this IUT's device gives an array, and where it came from."""
        raise NotImplementedError

    def layout(self, dtype: str, dims) -> kvref.Shape:
        return self.layout_of(self.generation, dtype, dims)[0]

    def make_cache(self, dtype: str, dims, seed: int, mode: str = "put", finite: bool = False):
        """(device cache, its logical host contents). mode: put | deferred."""
        raise NotImplementedError

    def manager(self, caches, host_blocks: int, **options):
        return kvref.KVCacheManager(caches, host_blocks, faults=self.faults, **options)

    def transfer(self, manager, d2h: bool, src, dst, sizes=None) -> None:
        """One d2h or h2d, waited for; raises what the IUT raises."""
        future = (manager.d2h if d2h else manager.h2d)(src, dst, sizes)
        future.result(timeout=60)

    def d2h(self, manager, src, dst, sizes=None) -> None:
        self.transfer(manager, True, src, dst, sizes)

    def h2d(self, manager, src, dst, sizes=None) -> None:
        self.transfer(manager, False, src, dst, sizes)

    def plan_request(self, uuid: str):
        """A StartTransferRequest this IUT can parse: layer 0's block 1 to block 2."""
        return kvref.StartTransferRequest(uuid=uuid, layer_ids=[0], src_block_ids=[1], dst_block_ids=[2])

    def fetch(self, cache) -> np.ndarray:
        raise NotImplementedError

    def scramble(self, cache) -> None:
        raise NotImplementedError

    def is_materialized(self, cache) -> bool:
        return True


def random_host(dtype: str, dims, seed: int, finite: bool = False) -> np.ndarray:
    """Random bytes (every bit pattern, NaNs included), or with `finite`
    random small integers in the dtype, which survive any float conversion."""
    element = kvref.element_type(dtype)
    rng = np.random.default_rng(seed)
    if finite:
        return rng.integers(-8, 8, dims).astype(element.numpy)
    raw = rng.integers(0, 256, int(np.prod(dims)) * element.numpy.itemsize, dtype=np.uint8)
    return raw.view(element.numpy).reshape(dims)


def tpu_layout_of(generation: str, dtype: str, dims) -> tuple[kvref.Shape, str]:
    """The generation's compiler layout, and where the answer came from."""
    answer = lookup(dtype, dims, generation)
    return answer.shape, f"{answer.source} ({answer.versions})"


class KvrefSim(Adapter):
    """The reference manager on the simulated TPU of the case's generation."""

    name = "kvref-sim"
    backend = "sim"
    targets = kvref.GENERATIONS
    PUT_DELAY_US = 20_000  # host->device copies still landing at construction

    def __init__(self, generation: str, faults=()):
        super().__init__(generation, faults)
        self.device = kvref.SimDevice(generation)

    @property
    def device_kind(self) -> str:
        return table.load()["generations"].get(self.generation, {}).get("device_kind", "")

    layout_of = staticmethod(tpu_layout_of)

    def make_cache(self, dtype, dims, seed, mode="put", finite=False):
        host = random_host(dtype, dims, seed, finite)
        if mode == "deferred":
            with self.device.defer_and_fuse():
                cache = self.device.zeros(dims, dtype)
                cache.write_(host)
            return cache, host
        return self.device.put(host, shape=self.layout(dtype, dims),
                               land_after_us=self.PUT_DELAY_US), host

    def fetch(self, cache):
        return self.device.fetch(cache)

    def scramble(self, cache):
        cache.fill_(0)
        cache.await_buffer()

    def is_materialized(self, cache):
        return cache.state == kvref.BufferState.MATERIALIZED


class KvrefJax(Adapter):
    """The reference manager on JAX CPU arrays, read and written in place."""

    name = "kvref-jax"
    backend = "jax-cpu"

    def skip_reason(self):
        try:
            import jax  # noqa: F401
        except ImportError:
            return "jax is not installed (pip install 'kvref[oracle]')"
        return None

    @property
    def device_kind(self) -> str:
        return "cpu"

    @staticmethod
    def layout_of(generation, dtype, dims):
        return kvref.Shape(dtype, dims), "dense (JAX CPU)"

    def make_cache(self, dtype, dims, seed, mode="put", finite=False):
        import jax.numpy as jnp

        host = random_host(dtype, dims, seed, finite)
        # jnp.asarray dispatches asynchronously: the array may still be landing.
        return jnp.asarray(host), host

    def fetch(self, cache):
        return np.asarray(cache).copy()

    def scramble(self, cache):
        cache.block_until_ready()
        ctypes.memset(cache.unsafe_buffer_pointer(), 0, cache.nbytes)


def _adapters() -> dict[str, type[Adapter]]:
    from probes.iut_tpu_sync_jax import TpuSyncJax, TpuSyncJaxTpu
    from probes.iut_tpu_sync_torch import TpuSyncTorchTpu

    return {a.name: a for a in (KvrefSim, KvrefJax, TpuSyncJax, TpuSyncJaxTpu, TpuSyncTorchTpu)}


def adapter_class(iut: str) -> type[Adapter]:
    adapters = _adapters()
    if iut not in adapters:
        raise ValueError(f"unknown implementation under test {iut!r}; expected one of "
                         f"{sorted(adapters)}")
    return adapters[iut]


def check_target(iut: str, generation: str) -> None:
    targets = adapter_class(iut).targets
    if generation not in targets:
        raise ValueError(f"{iut} runs on {', '.join(targets)}, not {generation!r}")


def adapter_for(iut: str, generation: str, faults=()) -> Adapter:
    return adapter_class(iut)(generation, faults)
