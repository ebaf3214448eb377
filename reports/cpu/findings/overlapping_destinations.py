"""tpu-sync-jax 0.0.1rc20261023185136: d2h with two source blocks copied to the
same host block is accepted silently; the host block ends up holding one of
them. A correct manager refuses the request and changes nothing.

Run: .venv-peer/bin/python reports/cpu/findings/overlapping_destinations.py"""

import os
import sys

from probes.run import netns  # noqa: E402  (the library listens on every interface: run it where only lo exists)

if reason := netns.enter():  # re-executes this script under `unshare -rn`, lo up
    print("SKIP", reason)
    sys.exit(netns.SKIP_EXIT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from tpu_sync.api.jax.kv_cache_manager import KVCacheManager  # noqa: E402

cache = jax.device_put(np.arange(512 * 8 * 2048, dtype=np.float32).reshape(512, 8, 2048) % 1000)
manager = KVCacheManager([cache], 0, host_blocks_to_allocate=8)
try:
    manager.d2h([0, 1], [2, 2]).Await()
except Exception as e:  # the refusal a correct manager gives
    print("ok:", type(e).__name__, e)
else:
    raise AssertionError("d2h(src=[0, 1], dst=[2, 2]) was accepted: two blocks written to one host block")
