"""The reference manager: construction checks, exact round trips, host pools."""

import numpy as np
import pytest

import kvref
from tests.kv import random_cache, round_trip


@pytest.fixture
def dev():
    return kvref.SimDevice("tpu7x")


def test_permuted_round_trip_is_byte_exact(dev):
    pairs = [random_cache(dev, "bf16", (512, 16, 2048), seed=i) for i in range(2)]
    caches = [c for c, _ in pairs]
    m = kvref.KVCacheManager(caches, 512)
    assert m.bytes_per_block == 16 * 2048 * 2 and m.num_layers == 2 and m.num_shards == 1
    assert m.host_bytes == 2 * 512 * 65536
    assert round_trip(m, caches, [h for _, h in pairs]).verdict == "PASS"


@pytest.mark.parametrize("dims, dtype, layout", [
    ((512, 3, 2048), "bf16", "bf16[512,3,2048]{2,0,1:T(8,128)(2,1)}"),
    ((512, 6144), "bf16", "bf16[512,6144]{1,0:T(8,128)(2,1)}"),
    ((512, 12288), "s8", "s8[512,12288]{1,0:T(32,128)(4,1)}"),
])
def test_seed_layouts_are_refused_naming_the_layout(dev, dims, dtype, layout):
    cache = dev.zeros(dims, dtype)
    with pytest.raises(kvref.LayoutError, match="layer 0: ") as e:
        kvref.KVCacheManager([cache], 16)
    assert layout in str(e.value)


def test_uniform_policy_names_both_mismatched_layers(dev):
    a, b = dev.zeros((512, 8, 2048), "bf16"), dev.zeros((512, 16, 2048), "bf16")
    with pytest.raises(ValueError, match=r"layer 1 has 65536-byte blocks .* layer 0 has 32768-byte"):
        kvref.KVCacheManager([a, b], 8)


def test_per_layer_policy_sizes_and_addresses_each_layer(dev):
    pairs = [random_cache(dev, "bf16", (512, n, 2048), seed=n) for n in (8, 16, 4)]
    caches = [c for c, _ in pairs]
    m = kvref.KVCacheManager(caches, 512, slice_policy="per_layer")
    assert m.layer_bytes_per_block == (32768, 65536, 16384)
    assert m.host_bytes == 512 * (32768 + 65536 + 16384)
    with pytest.raises(ValueError, match="layers have different block sizes"):
        m.bytes_per_block
    assert round_trip(m, caches, [h for _, h in pairs]).verdict == "PASS"


def test_host_block_bytes_read_and_write(dev):
    cache, host = random_cache(dev, "bf16", (512, 16, 2048))
    m = kvref.KVCacheManager([cache], 4)
    m.d2h([7], [2]).result()
    block = m.read_block_bytes(0, 2)
    assert isinstance(block, bytes) and len(block) == 65536
    assert block == cache.physical_bytes()[7 * 65536:8 * 65536].tobytes()
    payload = bytes(range(256)) * 256
    for kind in (bytes, bytearray, memoryview, lambda p: np.frombuffer(p, np.uint8)):
        m.write_block_bytes(0, 1, kind(payload))
        assert m.read_block_bytes(0, 1) == payload
    m.h2d([1], [9]).result()
    assert cache.physical_bytes()[9 * 65536:10 * 65536].tobytes() == payload


def test_multi_shard_layers(dev):
    other = kvref.SimDevice("tpu7x", id=1)
    layers = [[random_cache(d, "bf16", (512, 8, 2048), seed=10 * i + d.id) for d in (dev, other)]
              for i in range(2)]
    caches = [[c for c, _ in layer] for layer in layers]
    m = kvref.KVCacheManager(caches, 512)
    assert m.num_shards == 2 and m.host_bytes == 2 * 2 * 512 * 32768
    outcome = round_trip(m, [c for layer in caches for c in layer], [h for layer in layers for _, h in layer])
    assert outcome.verdict == "PASS", outcome.detail


def test_runs_of_blocks(dev):
    cache, host = random_cache(dev, "bf16", (512, 8, 2048))
    m = kvref.KVCacheManager([cache], 64)
    m.d2h([0, 100], [10, 30], [5, 20]).result()
    assert m.read_block_bytes(0, 12) == cache.physical_bytes()[2 * 32768:3 * 32768].tobytes()
    assert m.read_block_bytes(0, 49) == cache.physical_bytes()[119 * 32768:120 * 32768].tobytes()


def test_host_budget_refuses_before_allocating(dev, monkeypatch):
    caches = [dev.zeros((512, 8, 2048), "bf16") for _ in range(2)]
    monkeypatch.setattr(kvref.manager._core, "BlockMover", _must_not_allocate)
    with pytest.raises(kvref.HostBudgetError, match=r"2,097,152 bytes .* over the 1,000,000-byte budget"):
        kvref.KVCacheManager(caches, 32, host_budget_bytes=1_000_000)


def test_jax_cpu_arrays_round_trip_in_place():
    jnp = pytest.importorskip("jax.numpy")
    import jax

    rng = np.random.default_rng(3)
    hosts = [rng.standard_normal((64, 4, 128)).astype(np.float32) for _ in range(2)]
    # Still computing when handed over: JAX dispatches asynchronously.
    caches = [jnp.asarray(h) * 2 for h in hosts]
    m = kvref.KVCacheManager(caches, 64)
    assert m.bytes_per_block == 4 * 128 * 4
    perm_a = rng.permutation(64)
    m.d2h(perm_a, np.arange(64)).result()
    pool = m.host_pool().view(np.float32).reshape(2, 64, 4, 128)
    np.testing.assert_array_equal(pool[1], hosts[1][perm_a] * 2)
    pool[:] = 0
    m.write_block_bytes(0, 3, (np.arange(512, dtype=np.float32)).tobytes())
    m.h2d([3], [0]).result()
    np.testing.assert_array_equal(np.asarray(caches[0])[0].reshape(-1), np.arange(512))
    assert isinstance(caches[0], jax.Array)


def _must_not_allocate(*args, **kwargs):
    raise AssertionError("the host pool was allocated before the budget check")


def test_transfers_move_what_in_place_ops_wrote_since_construction(dev):
    """A serving step writes the cache in place (recorded, still pending):
    the next transfer runs it first and moves the new contents."""
    cache, _ = random_cache(dev, "bf16", (512, 8, 2048), seed=1)
    m = kvref.KVCacheManager([cache], 4)
    m.d2h([5], [0]).result()
    new = np.full((512, 8, 2048), 3, dtype=kvref.element_type("bf16").numpy)
    with dev.defer_and_fuse():
        cache.write_(new)
    assert cache.state == kvref.BufferState.DEFERRED
    m.d2h([5], [1]).result()
    assert m.read_block_bytes(0, 1) == kvref.pack(new, cache.shape)[5 * 32768:6 * 32768].tobytes()
    # The old behaviour moves the storage as it was at construction; the
    # simulated DMA engine refuses a buffer with ops still pending.
    stale = kvref.KVCacheManager([cache], 4, faults=["buffer_resolved_once"])
    with dev.defer_and_fuse():
        cache.write_(new)
    with pytest.raises(kvref.DeviceError, match="not materialized"):
        stale.d2h([5], [1]).result()


def test_a_donated_jax_array_is_refused_by_name():
    jax = pytest.importorskip("jax")
    cache = jax.numpy.zeros((64, 4, 128), jax.numpy.float32)
    m = kvref.KVCacheManager([cache], 4)
    m.d2h([1], [0]).result()
    step = jax.jit(lambda c: c + 1, donate_argnums=0)
    step(cache).block_until_ready()  # the output, which may alias the storage, is dropped at once
    assert cache.is_deleted()
    with pytest.raises(ValueError, match=r"layer 0 shard 0: the f32\[64,4,128\]\{2,1,0\} jax.Array the manager "
                       r"addresses was deleted \(donated to a step.*no live array on cpu:0 holds that storage"):
        m.d2h([1], [1])
