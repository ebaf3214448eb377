"""tpu-sync-jax 0.0.1rc20261023185136 with RAIDEN_ENABLE_ASYNC_DISPATCH=1:
the offload connector loads with h2d and does not await it before the next
model step; here the step, a jitted computation dispatched right after the
h2d returns, reads a mix of loaded and old blocks. A correct manager orders
the load before the computations dispatched after it (or lands it before
h2d returns, as the default dispatch does here).

Run: .venv-peer/bin/python reports/cpu/findings/async_dispatch_unordered_h2d.py"""

import os
import sys

from probes.run import netns  # the library listens on every interface: run it where only lo exists

if reason := netns.enter():  # re-executes this script under `unshare -rn`, lo up
    print("SKIP", reason)
    sys.exit(netns.SKIP_EXIT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

os.environ["RAIDEN_ENABLE_ASYNC_DISPATCH"] = "1"  # read by the library when it loads

import jax  # noqa: E402
import numpy as np  # noqa: E402
from tpu_sync.api.jax.kv_cache_manager import KVCacheManager  # noqa: E402

blocks = 512
values = np.repeat(np.arange(1, blocks + 1, dtype=np.float32), 1024 * 128).reshape(blocks, 1024, 128)
cache = jax.device_put(values)  # block b holds b + 1
manager = KVCacheManager([cache], 0, host_blocks_to_allocate=blocks)
manager.d2h(list(range(blocks)), list(range(blocks))).Await()
step = jax.jit(lambda x: x + 0)
step(cache).block_until_ready()
for trial in range(10):
    targets = list(range(blocks))[::-1] if trial % 2 == 0 else list(range(blocks))
    load = manager.h2d(list(range(blocks)), targets)  # not awaited, as the connector does
    seen = np.asarray(step(cache))[:, 0, 0]
    load.Await()
    expected = np.empty(blocks, np.float32)
    expected[targets] = np.arange(1, blocks + 1)
    if not np.array_equal(seen, expected):
        raise AssertionError(f"trial {trial}: the step after an un-awaited h2d saw "
                             f"{int((seen != expected).sum())} of {blocks} blocks not yet loaded")
print("ok")
