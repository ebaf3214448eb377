"""Caches as JAX arrays: dense on the CPU, or on this machine's TPU.

A deferred cache is the output of a jitted computation still running when it
is handed over: JAX dispatches asynchronously, so `is_ready()` stays False
until the computation ends. The computation XORs the cache's bits with a key
an even number of times, with the count and key as arguments so that XLA
cannot fold it away, so its result is the host contents exactly."""

from __future__ import annotations

import ctypes
import functools

import numpy as np

import kvref
from kvref.sharding import uneven_parts
from probes.iut.dense_cpu import DenseCpuArrays
from probes.iut.hardware import NO_TPU, device_only_standin, local_tpu_generation, standin_platform, tpu_device, tpu_device_kind, tpu_jax_devices
from probes.iut.host_data import random_host
from probes.iut.reference import tpu_layout_of
from probes.iut.protocol import CacheMode, NoViews, NotInPlace


# Bytes a deferred cache's computation churns through: about half a second
# on one core, long enough to be still running when the manager is built.
PENDING_BYTES = 10 * 2**30


class JaxSteps:
    """What JAX arrays do alike on every device: no views, pending until their
    computation ends, and the serving engine's steps (module functions)."""

    def views(self, key, seeds):
        raise NoViews("a jax.Array has no views into another: slicing copies")

    def is_pending(self, cache):
        return not cache.is_ready()

    def serving_step(self, cache, new):
        return donating_step(cache, new)

    pending_bytes: int  # what a pending computation churns through on this device (see PENDING_BYTES)

    def dispatch_step(self, cache, new):
        return dispatched_step(cache, new, self.pending_bytes)

    def hold_copies(self, cache, seconds, until_step=False):
        return False  # no way to slow this device's copies from outside

    def read_by_step(self, cache):
        return read_by_step(cache)

    def donating_step(self, cache, new, in_place):
        return model_step(cache, new, in_place, self.pending_bytes // STEP_SHARE)

    def update_blocks(self, cache, blocks, values):
        return update_blocks(cache, blocks, values)

    def make_sharded_caches(self, key, sharding, seeds):
        """One jax.Array per seed over a mesh of this platform's devices, as
        tpu-inference allocates a layer (a NamedSharding)."""
        import jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        devices = self.mesh_devices()
        if len(devices) < sharding.devices:
            raise RuntimeError(f"{sharding} needs {sharding.devices} {devices[0].platform} devices and this "
                               f"process has {len(devices)} (JAX CPU devices: XLA_FLAGS="
                               f"--xla_force_host_platform_device_count={sharding.devices})")
        mesh = Mesh(np.array(devices[: sharding.devices]).reshape(sharding.axis_sizes), sharding.axis_names)
        named = NamedSharding(mesh, PartitionSpec(*sharding.partition_spec()))
        hosts = [random_host(key, seed) for seed in seeds]
        # A copy, as in jax_caches: the CPU may take the host memory as the shards' buffers.
        return [(jax.device_put(host.copy(), named), host) for host in hosts]

    def fetch_shards(self, cache):
        shards = sorted(cache.addressable_shards, key=lambda shard: shard.device.id)
        return [(shard.index, self.fetch(shard.data)) for shard in shards]

    def make_uneven_shards(self, key, dim, parts, seed):
        import jax

        devices = self.mesh_devices()
        if len(devices) < parts:
            raise RuntimeError(f"{parts} uneven shards need {parts} {devices[0].platform} devices and this "
                               f"process has {len(devices)}")
        host = random_host(key, seed)
        index = uneven_parts(key.dims, dim, parts)
        return [jax.device_put(host[where].copy(), device) for device, where in zip(devices, index)], host, index

    def mesh_devices(self) -> list:
        """The devices a sharded cache's mesh is made of."""
        raise NotImplementedError


class JaxCpuArrays(DenseCpuArrays, JaxSteps):
    """JAX CPU arrays, dense row-major; written in place through their buffer."""

    backend = "jax-cpu"
    scrambles_in_place = True
    platform = "JAX"
    pending_bytes = PENDING_BYTES

    @classmethod
    def sharded_layout_of(cls, generation, key, sharding):
        return cls.layout_of(generation, kvref.ShapeKey(key.dtype, sharding.shard_dims(key.dims)))

    def skip_reason(self):
        try:
            import jax  # noqa: F401
        except ImportError:
            return "jax is not installed (pip install 'kvref[oracle]')"
        return None

    def make_caches(self, key, seeds, mode=CacheMode.PUT, finite=False):
        import jax

        hosts = [random_host(key, seed, finite) for seed in seeds]
        return list(zip(jax_caches(hosts, jax.devices("cpu")[0], mode), hosts))

    def fetch(self, cache):
        return np.asarray(cache).copy()

    def mesh_devices(self):
        import jax

        return jax.devices("cpu")

    def scramble(self, cache):
        cache.block_until_ready()
        ctypes.memset(cache.unsafe_buffer_pointer(), 0, cache.nbytes)




def jax_caches(hosts: list[np.ndarray], device, mode: CacheMode, pending_bytes: int = PENDING_BYTES) -> list:
    """put and landing: `jax.device_put`, whose copies may still be in flight;
    deferred: the outputs of computations still running (see the module
    docstring), all dispatched after every input has landed."""
    import jax

    # A copy: on the CPU, device_put may take the host array's memory as the
    # device buffer itself, and the probes keep `host` as what is expected.
    arrays = [jax.device_put(host.copy(), device) for host in hosts]
    if mode == CacheMode.PUT:
        # Storage of XLA's own, as a serving stack's caches are (outputs of a
        # computation): a buffer borrowed from host memory is never aliased
        # by a step that takes it donated.
        return [_copy_step()(array) for array in arrays]
    if mode != CacheMode.DEFERRED:
        return arrays
    for array in arrays:
        array.block_until_ready()
    return [_identity_churn()(array, _rounds(host.nbytes * len(hosts), pending_bytes), _key(host.dtype))
            for array, host in zip(arrays, hosts)]


def donating_step(cache, new: np.ndarray):
    """A jitted step that gives the updated cache and donates the old one, as
    a serving engine's step does. XLA may reuse a donated buffer for the
    output, and then a manager that kept the old buffer would pass by luck;
    so the step's output always lives in a fresh buffer (computed while the
    old one is still held, which is then deleted, as donation deletes it)."""
    import jax

    updated = _update_step()(cache, jax.device_put(new.copy(), list(cache.devices())[0]))
    updated.block_until_ready()
    _retire(cache, updated)
    return updated


def dispatched_step(cache, new: np.ndarray, pending_bytes: int):
    """The same step still running when it returns: it computes (about half a
    second; `pending_bytes` sized for the device, see PENDING_BYTES) before its
    output holds `new`, and the cache it took is already gone, as a donated
    array is."""
    import jax

    device = list(cache.devices())[0]
    fresh = jax.device_put(new.copy(), device)
    fresh.block_until_ready()
    updated = _identity_churn()(fresh, _rounds(new.nbytes, pending_bytes), _key(new.dtype))
    cache.delete()  # the output was allocated while the cache was held: never its buffer
    return updated


STEP_SHARE = 20  # a model step computes for about this share of a pending computation (tens of ms)


def model_step(cache, new: np.ndarray, in_place: bool, pending_bytes: int):
    """A serving engine's model step, still running when it returns: a jitted
    computation of `new` that takes the cache donated. In place, its output
    is the cache (XLA aliases a donated input to the output of its shape: the
    same buffer, checked); otherwise it is computed into a buffer of its own,
    allocated while the cache is held, and the cache is deleted."""
    import jax

    if not in_place:
        return dispatched_step(cache, new, pending_bytes)
    device = list(cache.devices())[0]
    fresh = jax.device_put(new.copy(), device)
    fresh.block_until_ready()
    storage = cache.unsafe_buffer_pointer()
    output = _donating_churn()(cache, fresh, _rounds(new.nbytes, pending_bytes), _key(new.dtype))
    if output.unsafe_buffer_pointer() != storage:
        raise NotInPlace(f"XLA gave the donating step's output a buffer of its own on {device}")
    return output


def update_blocks(cache, blocks: list[int], values: np.ndarray):
    """A serving step that writes some blocks alone (`values` into the
    cache's first dimension at `blocks`), the cache donated and written in
    place, dispatched and not awaited; NotInPlace where XLA did not keep its
    storage (JAX CPU does, unless something held the buffer as it was
    dispatched)."""
    import jax

    device = list(cache.devices())[0]
    storage = cache.unsafe_buffer_pointer()
    output = _block_update()(cache, np.asarray(blocks, np.int32), jax.device_put(values, device))
    if output.unsafe_buffer_pointer() != storage:
        raise NotInPlace(f"XLA gave the step that writes blocks {blocks} a buffer of its own on {device}: the "
                         "cache was not donated in place")
    return output


@functools.cache
def _block_update():
    import jax

    return jax.jit(lambda cache, blocks, values: cache.at[blocks].set(values), donate_argnums=0)


def read_by_step(cache) -> np.ndarray:
    """What a computation dispatched now on the cache reads: a jitted bitwise
    copy, then the copy read back."""
    return np.asarray(_copy_step()(cache))


def _retire(old, new) -> None:
    """Delete the step's input, after checking its output has its own buffer."""
    if new.unsafe_buffer_pointer() == old.unsafe_buffer_pointer():
        raise RuntimeError("the step's output reused its input's buffer; a stale buffer could pass")
    old.delete()


@functools.cache
def _update_step():
    import jax

    return jax.jit(lambda cache, new: cache.at[...].set(new))


@functools.cache
def _copy_step():
    import jax
    import jax.numpy as jnp

    return jax.jit(lambda x: jnp.copy(x))


def _rounds(nbytes: int, pending_bytes: int = PENDING_BYTES) -> int:
    return 2 * max(1, min(100_000, pending_bytes // max(1, 2 * nbytes)))


@functools.cache
def _identity_churn():
    import jax
    import jax.numpy as jnp
    from jax import lax

    @jax.jit
    def churn(x, rounds, key):
        bits = x if x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.integer) else \
            lax.bitcast_convert_type(x, key.dtype)
        bits = lax.fori_loop(0, rounds, lambda i, v: v ^ key, bits)
        return bits if bits.dtype == x.dtype else lax.bitcast_convert_type(bits, x.dtype)

    return churn


@functools.cache
def _donating_churn():
    import jax

    # The output is written through the donated cache (`.at[...].set`), which XLA aliases in place.
    return jax.jit(lambda cache, new, rounds, key: cache.at[...].set(_identity_churn()(new, rounds, key)),
                   donate_argnums=0)


def _key(dtype: np.dtype):
    """The XOR key, in the type the computation works in."""
    import jax.numpy as jnp

    if dtype == np.bool_:
        return jnp.bool_(True)
    if np.issubdtype(dtype, np.integer) or dtype.kind in "iu" or "int" in dtype.name:
        return jnp.asarray(1, dtype=dtype)
    return jnp.asarray(0x5A, dtype={1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[dtype.itemsize])


def check_compiled_layout(cache, generation: str, sharding: kvref.Sharding | None = None) -> None:
    """The reference predicts from the compiler's layout (of one device's
    shard, with a sharding); a cache this TPU laid out otherwise would make
    that prediction meaningless. A mismatch is an error naming both layouts
    and the libtpu behind each."""
    from importlib import metadata

    key = kvref.ShapeKey(kvref.element_type(cache.dtype).name, tuple(cache.shape))
    expected, source = tpu_layout_of(generation, key, sharding)
    found = kvref.Layout.from_jax(cache.format.layout)
    if not found.equal(expected.layout, ignore_element_size=True):  # jax reports E only below a byte
        raise RuntimeError(f"this TPU laid out a {key} cache as {found} (libtpu {metadata.version('libtpu')} "
                           f"here); the prediction uses {expected.layout}, from {source}")


class JaxTpuArrays(JaxSteps):
    """JAX arrays on this machine's TPU, laid out by its compiler; the
    reference predicts from the same layout."""

    backend = "jax-tpu"
    scrambles_in_place = False  # the public API offers no in-place device write

    def __init__(self, generation: str):
        self.generation = generation

    @staticmethod
    def layout_of(generation, key):
        if standin_platform():
            return JaxCpuArrays.layout_of(generation, key)
        return tpu_layout_of(generation, key)

    @staticmethod
    def sharded_layout_of(generation, key, sharding):
        if standin_platform():
            return JaxCpuArrays.sharded_layout_of(generation, key, sharding)
        return tpu_layout_of(generation, key, sharding)

    @property
    def device_kind(self) -> str:
        kind = tpu_device_kind()
        return f"{kind} (standing in for a TPU)" if standin_platform() else kind

    def skip_reason(self):
        if device_only_standin():
            return None
        found = local_tpu_generation()
        if found is None:
            return NO_TPU
        if found != self.generation:
            return f"this TPU is {found}, not {self.generation}"
        return None

    # TPU HBM streams about a hundred times what one CPU core does: the same
    # half second of pending work is a hundred times the bytes.
    TPU_PENDING_BYTES = 100 * PENDING_BYTES

    @property
    def pending_bytes(self) -> int:
        return PENDING_BYTES if standin_platform() else self.TPU_PENDING_BYTES

    def make_caches(self, key, seeds, mode=CacheMode.PUT, finite=False):
        hosts = [random_host(key, seed, finite) for seed in seeds]
        caches = jax_caches(hosts, tpu_device(), mode, self.pending_bytes)
        if not standin_platform():
            for cache in caches:
                check_compiled_layout(cache, self.generation)
        return list(zip(caches, hosts))

    def mesh_devices(self):
        return tpu_jax_devices()

    def make_sharded_caches(self, key, sharding, seeds):
        pairs = super().make_sharded_caches(key, sharding, seeds)
        if not standin_platform():
            for cache, _ in pairs:
                check_compiled_layout(cache, self.generation, sharding)
        return pairs

    def fetch(self, cache):
        """Read from the device every time: jax keeps the host copy of an
        array's first read, which a manager's later writes do not update."""
        return read_by_step(cache)

    def scramble(self, cache):
        # The public API offers no in-place device write. Without it the h2d of
        # a second permutation must still move every block for the check to hold.
        cache.block_until_ready()

