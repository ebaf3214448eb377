"""tpu-sync-jax 0.0.1rc20261023185136: the offload connector saves right
after dispatching the model step that takes the KV cache. When the step's
output is a new buffer (XLA need not reuse the donated one) and the old
array is gone, d2h_auto_allocate saves the bytes from before the step, or
freed memory, with no error: the manager still addresses the buffer it was
built over. A correct manager moves the step's bytes, or refuses the
deleted array by name.

Run: .venv-peer/bin/python reports/cpu/findings/save_after_the_step_took_the_cache.py"""

import os
import sys

from probes.run import netns  # the library listens on every interface: run it where only lo exists

if reason := netns.enter():  # re-executes this script under `unshare -rn`, lo up
    print("SKIP", reason)
    sys.exit(netns.SKIP_EXIT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from tpu_sync.api.jax.kv_cache_manager import KVCacheManager  # noqa: E402

old = np.zeros((512, 8, 2048), np.float32)
cache = jax.device_put(old)
manager = KVCacheManager([cache], 0, host_blocks_to_allocate=8)
new = np.ones_like(old)
updated = jax.jit(lambda c, n: c.at[...].set(n))(cache, jax.device_put(new))  # a fresh buffer
updated.block_until_ready()
cache.delete()  # as donation deletes it
try:
    chunks, future = manager.d2h_auto_allocate([0, 1])
    future.Await()
except Exception as e:  # a refusal by name is right
    print("ok: refused:", type(e).__name__, e)
    raise SystemExit(0)
saved = np.asarray(manager._impl.read_host_memory(0, 0, 8 * 2048), np.float32)
if not np.array_equal(saved, new[0].reshape(-1)):
    raise AssertionError(f"the save holds {np.unique(saved)[:4]}..., not the step's bytes (all 1.0)")
print("ok")
