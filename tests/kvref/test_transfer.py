"""transfer_d2h / transfer_h2d: one device array <-> one host array."""

import numpy as np
import pytest

import kvref
from tests.kv import random_cache


def test_round_trip_through_a_host_array():
    dev = kvref.SimDevice("tpu7x")
    cache, host = random_cache(dev, "bf16", (512, 8, 2048))
    staging = np.zeros((8, 32768), np.uint8)
    kvref.transfer_d2h(cache, staging, [10, 20, 30], [0, 1, 2])
    physical = cache.physical_bytes().reshape(512, 32768)
    np.testing.assert_array_equal(staging[:3], physical[[10, 20, 30]])
    cache.fill_(0)
    kvref.transfer_h2d_async(cache, staging, [0, 1], [40, 41]).result(timeout=30)
    np.testing.assert_array_equal(dev.fetch(cache)[[40, 41]].view(np.uint8),
                                  host[[10, 20]].view(np.uint8))


def test_same_checks_as_the_manager():
    dev = kvref.SimDevice("tpu7x")
    with pytest.raises(kvref.LayoutError, match=r"bf16\[512,6144\]\{1,0:T\(8,128\)\(2,1\)\}"):
        kvref.transfer_d2h(dev.zeros((512, 6144), "bf16"), np.zeros(12288, np.uint8), [0], [0])
    cache = dev.zeros((512, 8, 2048), "bf16")
    with pytest.raises(ValueError, match="not a whole number of 32768-byte blocks"):
        kvref.transfer_d2h(cache, np.zeros(1000, np.uint8), [0], [0])
    with pytest.raises(ValueError, match="host block range"):
        kvref.transfer_d2h(cache, np.zeros(32768, np.uint8), [0], [1])
    with pytest.raises(ValueError, match="C-contiguous and writable"):
        kvref.transfer_d2h(cache, np.zeros((2, 32768), np.uint8)[:, ::2], [0], [0])
    with pytest.raises(TypeError, match="host_array must be a NumPy array"):
        kvref.transfer_d2h(cache, bytearray(32768), [0], [0])


def test_deferred_array_is_materialized_first():
    dev = kvref.SimDevice("tpu7x")
    with dev.defer_and_fuse():
        cache = dev.full((512, 8, 2048), 2, "bf16")
    staging = np.zeros(32768, np.uint8)
    kvref.transfer_d2h(cache, staging, [3], [0])
    assert cache.state == kvref.BufferState.MATERIALIZED
    assert staging.view(kvref.element_type("bf16").numpy).astype(np.float32).max() == 2
