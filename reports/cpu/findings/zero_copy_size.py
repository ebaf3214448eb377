"""tpu-sync-jax 0.0.1rc20261023185136: a copy size of 0 blocks is accepted
silently (nothing to copy, no error). A correct manager refuses it: a run of
zero blocks is a caller's bug.

Run: .venv-peer/bin/python reports/cpu/findings/zero_copy_size.py"""

import os
import sys

from probes.run import netns  # noqa: E402  (the library listens on every interface: run it where only lo exists)

if reason := netns.enter():  # re-executes this script under `unshare -rn`, lo up
    print("SKIP", reason)
    sys.exit(netns.SKIP_EXIT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from tpu_sync.api.jax.kv_cache_manager import KVCacheManager  # noqa: E402

cache = jax.device_put(np.zeros((512, 8, 2048), np.float32))
manager = KVCacheManager([cache], 0, host_blocks_to_allocate=8)
try:
    manager.d2h([0], [0], [0]).Await()
except Exception as e:  # the refusal a correct manager gives
    print("ok:", type(e).__name__, e)
else:
    raise AssertionError("d2h(src=[0], dst=[0], sizes=[0]) was accepted silently")
