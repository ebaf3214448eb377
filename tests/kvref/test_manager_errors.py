"""Bad input: a clear error, and device and host state left as they were."""

import numpy as np
import pytest

import kvref
from tests.kv import random_cache


@pytest.fixture
def setup():
    dev = kvref.SimDevice("tpu7x")
    cache, _ = random_cache(dev, "bf16", (512, 8, 2048))
    m = kvref.KVCacheManager([cache], 16)
    m.d2h(np.arange(16), np.arange(16)).result()
    return dev, cache, m


def snapshot(cache, m):
    return cache.physical_bytes().copy(), m.host_pool().copy()


@pytest.mark.parametrize("call, error, needle", [
    (lambda m: m.d2h([0, 1], [0]), ValueError, "equal lengths, got 2, 1 and 2"),
    (lambda m: m.d2h([0], [0], [1, 1]), ValueError, "got 1, 1 and 2"),
    (lambda m: m.d2h([-1], [0]), ValueError, "device block range [-1, 0) at index 0 is out of range"),
    (lambda m: m.d2h([512], [0]), ValueError, "device block range [512, 513) at index 0 exceeds layer 0"),
    (lambda m: m.d2h([510], [0], [3]), ValueError, "exceeds layer 0"),
    (lambda m: m.d2h([0], [16]), ValueError, "host block range [16, 17) at index 0 exceeds the 16 host blocks"),
    (lambda m: m.d2h([0, 1], [3, 4], [2, 1]), ValueError, "host block ranges [3, 5) and [4, 5) overlap"),
    (lambda m: m.h2d([0, 1], [7, 7]), ValueError, "device block ranges [7, 8) and [7, 8) overlap"),
    (lambda m: m.h2d([0], [0], [0]), ValueError, "copy size 0 at index 0 must be at least one block"),
    (lambda m: m.h2d([0.5], [0]), ValueError, "src_offsets[0] must be an integer block number that fits in int64, got 0.5"),
    (lambda m: m.h2d(np.array([0.5]), [0]), ValueError, "src_offsets must hold integers, got float64"),
    (lambda m: m.h2d([[0]], [0]), ValueError, "src_offsets must be 1-D"),
    (lambda m: m.h2d(np.zeros((1, 1), np.int64), [0]), ValueError, "src_offsets must be 1-D, got shape (1, 1)"),
    (lambda m: m.h2d(3, [0]), ValueError, "src_offsets must be a list of block numbers"),
    (lambda m: m.h2d([True], [0]), ValueError, "src_offsets[0] must be an integer block number that fits in int64, got True"),
    (lambda m: m.d2h([31, True], [15, 11]), ValueError, "src_offsets[1] must be an integer block number"),
    (lambda m: m.d2h([31, "1"], [15, 11]), ValueError, "src_offsets[1] must be an integer block number that fits in "
     "int64, got '1'"),
    (lambda m: m.d2h([31, -2**63 - 1], [15, 11]), ValueError, "got -9223372036854775809"),
    (lambda m: m.h2d(np.array([True]), [0]), ValueError, "src_offsets must hold integers, got bool"),
    (lambda m: m.d2h([2**63 - 1], [0]), ValueError,
     "device block range [9223372036854775807, 9223372036854775808) at index 0 is out of range"),
    (lambda m: m.d2h([2**64], [0]), ValueError, "src_offsets[0] must be an integer block number that fits in int64, got 18446744073709551616"),
    (lambda m: m.read_block_bytes(2**31, 0), IndexError, "layer must be an integer in [0, 1), got 2147483648"),
    (lambda m: m.write_block_bytes(0, 0, np.zeros(32768, dtype=object)), TypeError,
     "payload must be bytes (bytes, bytearray, a byte memoryview or a uint8 array), got an array of object"),
    (lambda m: m.write_block_bytes(0, 0, np.zeros(8192, np.float32)), TypeError, "got an array of float32"),
    (lambda m: m.write_block_bytes(0, 0, b"x" * 10), ValueError, "payload has 10 bytes, expected 32768"),
    (lambda m: m.write_block_bytes(0, 0, "x" * 32768), TypeError, "payload must be bytes"),
    (lambda m: m.write_block_bytes(0, 16, b"x" * 32768), IndexError, "host block must be an integer in [0, 16), got 16"),
    (lambda m: m.write_block_bytes(1, 0, b"x" * 32768), IndexError, "layer must be an integer in [0, 1), got 1"),
    (lambda m: m.read_block_bytes(0, -1), IndexError, "host block must be an integer in [0, 16), got -1"),
    (lambda m: m.read_block_bytes(0, 0, shard=1), IndexError, "shard must be an integer in [0, 1), got 1"),
    (lambda m: m.read_block_bytes("0", 0), TypeError, "layer must be an integer"),
])
def test_bad_transfers_change_nothing(setup, call, error, needle):
    dev, cache, m = setup
    before = snapshot(cache, m)
    with pytest.raises(error) as e:
        call(m)
    assert needle in str(e.value)
    after = snapshot(cache, m)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


@pytest.mark.parametrize("make, error, needle", [
    (lambda d: [], ValueError, "kv_caches is empty"),
    (lambda d: "cache", TypeError, "kv_caches must be a list of layers"),
    (lambda d: [[]], ValueError, "layer 0 has no shards"),
    (lambda d: [[d["a"]], [d["b"], d["c"]]], ValueError, "layer 1 has 2 shards but layer 0 has 1"),
    (lambda d: [d["a"], d["other"]], ValueError, "arrays from two devices"),
    (lambda d: [np.zeros((4, 4))], TypeError, "expected a kvref.sim.DeviceArray, a single-device jax.Array or an XLA CPU"),
])
def test_bad_construction(make, error, needle):
    dev, other = kvref.SimDevice("tpu7x"), kvref.SimDevice("tpu7x", id=1)
    arrays = {k: dev.zeros((512, 8, 2048), "bf16") for k in "abc"}
    arrays["other"] = other.zeros((512, 8, 2048), "bf16")
    with pytest.raises(error, match=needle):
        kvref.KVCacheManager(make(arrays), 4)


@pytest.mark.parametrize("kwargs, needle", [
    ({"host_blocks": 0}, "host_blocks must be a positive integer, got 0"),
    ({"host_blocks": 2.0}, "got 2.0"),
    ({"host_blocks": 4, "slice_policy": "mixed"}, "slice_policy 'mixed' is not one of"),
])
def test_bad_options(kwargs, needle):
    dev = kvref.SimDevice("tpu7x")
    with pytest.raises(ValueError, match=needle):
        kvref.KVCacheManager([dev.zeros((512, 8, 2048), "bf16")], **kwargs)


def test_injected_dma_failure_fails_the_future(setup):
    dev, cache, m = setup
    dev.set_dma_faults(fail_every=5)
    future = m.d2h(np.arange(12), np.arange(4, 16))
    with pytest.raises(kvref.DeviceError, match="injected DMA failure"):
        future.result(timeout=30)
    assert future.done() and isinstance(future.exception(), kvref.DeviceError)


def test_dma_failure_by_block(setup):
    dev, cache, m = setup
    block = m.bytes_per_block
    cache.fail_dma_in(5 * block, 6 * block)
    with pytest.raises(kvref.DeviceError, match=r"touches failing range \[163840, 196608\)"):
        m.h2d([0, 1, 2], [4, 5, 6]).result(timeout=30)
    m.h2d([0, 1], [4, 6]).result(timeout=30)  # blocks beside it still move


def test_slow_dma_can_time_out(setup):
    dev, cache, m = setup
    dev.set_dma_faults(delay_us=200_000)
    future = m.d2h(np.arange(4), np.arange(4))
    with pytest.raises(TimeoutError):
        future.result(timeout=0.01)
    future.result(timeout=30)
    assert future.done()


def test_a_timeout_past_what_the_waits_hold_is_refused_naming_the_bound():
    """1e300 s was taken, and every wait then failed at once (the clock's duration overflowed)."""
    device = kvref.SimDevice("v5e")
    cache = device.put(np.zeros((64, 8, 256), np.float32))
    with pytest.raises(ValueError, match=r"timeout_s must be at most 10000000 s"):
        kvref.KVCacheManager([cache], 8, timeout_s=1e300)
    manager = kvref.KVCacheManager([cache], 8, timeout_s=1e7)
    manager.d2h([1], [1]).result()  # the largest is honoured


@pytest.mark.parametrize("timeout", [1e10, float("inf"), float("nan"), -1.0, "10"])
def test_a_futures_wait_limit_goes_through_the_same_check(setup, timeout):
    """result(1e10) or result(inf) on a transfer still running raised TimeoutError at once."""
    dev, cache, m = setup
    dev.set_dma_faults(delay_us=200_000)
    future = m.d2h(np.arange(4), np.arange(4))
    with pytest.raises(TypeError if isinstance(timeout, str) else ValueError, match=r"timeout must be"):
        future.result(timeout=timeout)
    future.result(timeout=30)  # still running then, and it lands
    assert future.done()
