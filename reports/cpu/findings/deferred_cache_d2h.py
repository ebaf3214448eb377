"""tpu-sync-jax 0.0.1rc20261023185136 on JAX CPU arrays: a KVCacheManager built
over caches that a jitted computation is still producing (as a serving engine
hands over a freshly computed cache) does not wait for them; the first d2h
then crashes (SIGSEGV) or copies bytes that are not the computed ones.

Run: .venv-peer/bin/python reports/cpu/findings/deferred_cache_d2h.py
A correct manager prints "ok"; this one crashes or fails the assertion."""

import faulthandler
import os
import sys

from probes.run import netns  # noqa: E402  (the library listens on every interface: run it where only lo exists)

if reason := netns.enter():  # re-executes this script under `unshare -rn`, lo up
    print("SKIP", reason)
    sys.exit(netns.SKIP_EXIT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
faulthandler.enable()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from tpu_sync.api.jax.kv_cache_manager import KVCacheManager  # noqa: E402

ROWS, DIMS = 512, (512, 3, 2048)


@jax.jit
def recompute(x, rounds, key):
    """x itself, after `rounds` (even) XORs: long enough to still be running."""
    bits = lax.bitcast_convert_type(x, jnp.uint16)
    bits = lax.fori_loop(0, rounds, lambda i, v: v ^ key, bits)
    return lax.bitcast_convert_type(bits, x.dtype)


host = np.random.default_rng(0).integers(-8, 8, DIMS).astype(jnp.bfloat16)
source = jax.device_put(host.copy())
source.block_until_ready()
caches = [recompute(source, 8000, jnp.uint16(0x5A)) for _ in range(2)]  # seconds of work
print("pending at construction:", [not c.is_ready() for c in caches])
manager = KVCacheManager(caches, 0, host_blocks_to_allocate=ROWS)
manager.d2h(list(range(ROWS)), list(range(ROWS))).Await()
floats = ROWS * 3 * 2048 * 2 // 4
pool = np.asarray(manager._impl.read_host_memory(0, 0, floats), dtype=np.float32).tobytes()
assert pool == host.tobytes(), "d2h copied bytes that are not the computed cache"
print("ok")
