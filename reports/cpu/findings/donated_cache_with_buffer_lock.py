"""tpu-sync-jax 0.0.1rc20261023185136 on JAX CPU arrays, built with the buffer
lock on (unsafe_skip_buffer_lock=False): the serving engine's next step, a
jitted function that donates the KV cache and returns the updated one, never
returns. (With the library's default, which skips the lock, the step returns
and XLA reuses the buffer.)

Run: .venv-peer/bin/python reports/cpu/findings/donated_cache_with_buffer_lock.py
A correct manager prints "ok"; here the watchdog dumps the stacks after 30 s
and exits 1."""

import faulthandler
import os
import sys

from probes.run import netns  # noqa: E402  (the library listens on every interface: run it where only lo exists)

if reason := netns.enter():  # re-executes this script under `unshare -rn`, lo up
    print("SKIP", reason)
    sys.exit(netns.SKIP_EXIT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
faulthandler.dump_traceback_later(float(os.environ.get("FINDING_TIMEOUT", "30")), exit=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from tpu_sync.api.jax.kv_cache_manager import KVCacheManager  # noqa: E402

cache = jax.device_put(np.zeros((512, 8, 2048), jnp.bfloat16))
manager = KVCacheManager([cache], 0, host_blocks_to_allocate=512, unsafe_skip_buffer_lock=False)
manager.d2h([0], [0]).Await()
step = jax.jit(lambda c, new: c.at[...].set(new), donate_argnums=0)
cache = step(cache, jnp.ones((512, 8, 2048), jnp.bfloat16))
cache.block_until_ready()
print("ok")
