"""Caches as JAX arrays: dense on the CPU, or on this machine's TPU."""

from __future__ import annotations

import ctypes

import numpy as np

import kvref
from probes.iut.hardware import local_tpu_generation, tpu_device
from probes.iut.host_data import random_host
from probes.iut.reference import tpu_layout_of


class JaxCpuArrays:
    """JAX CPU arrays, dense row-major; written in place through their buffer."""

    backend = "jax-cpu"

    def __init__(self, generation: str):
        self.generation = generation

    @staticmethod
    def layout_of(generation, key):
        return kvref.Shape(key.dtype, key.dims), "dense (JAX CPU)"

    @property
    def device_kind(self) -> str:
        return "cpu"

    def skip_reason(self):
        try:
            import jax  # noqa: F401
        except ImportError:
            return "jax is not installed (pip install 'kvref[oracle]')"
        return None

    def make_cache(self, key, seed, mode="put", finite=False):
        import jax.numpy as jnp

        host = random_host(key, seed, finite)
        # jnp.asarray dispatches asynchronously: the array may still be landing.
        return jnp.asarray(host), host

    def fetch(self, cache):
        return np.asarray(cache).copy()

    def scramble(self, cache):
        cache.block_until_ready()
        ctypes.memset(cache.unsafe_buffer_pointer(), 0, cache.nbytes)

    def is_materialized(self, cache):
        return bool(cache.is_ready())


class JaxTpuArrays:
    """JAX arrays on this machine's TPU, laid out by its compiler; the
    reference predicts from the same layout."""

    backend = "jax-tpu"

    def __init__(self, generation: str):
        self.generation = generation

    layout_of = staticmethod(tpu_layout_of)

    @property
    def device_kind(self) -> str:
        return tpu_device().device_kind

    def skip_reason(self):
        found = local_tpu_generation()
        if found is None:
            return "no TPU here: jax.devices('tpu') found none"
        if found != self.generation:
            return f"this TPU is {found}, not {self.generation}"
        return None

    def make_cache(self, key, seed, mode="put", finite=False):
        import jax

        host = random_host(key, seed, finite)
        return jax.device_put(host, tpu_device()), host

    def fetch(self, cache):
        import jax

        return np.asarray(jax.device_get(cache))

    def scramble(self, cache):
        # The public API offers no in-place device write. Without it the h2d of
        # a second permutation must still move every block for the check to hold.
        cache.block_until_ready()

    def is_materialized(self, cache):
        return bool(cache.is_ready())
