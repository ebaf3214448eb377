"""tpu-sync-jax 0.0.1rc20261023185136: unlock_blocks of a chunk that is no
longer locked (unlocked once already) is accepted silently, as is one id
twice in one call. A correct manager refuses it, so that a scheduler's
double free is seen instead of hidden.

Run: .venv-peer/bin/python reports/cpu/findings/double_unlock_accepted.py"""

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

cache = jax.device_put(np.zeros((64, 8, 128), np.float32))
manager = KVCacheManager([cache], 0, host_blocks_to_allocate=8)
chunks, future = manager.d2h_auto_allocate([0, 1])
future.Await()
manager.unlock_blocks([chunks[0]])
try:
    manager.unlock_blocks([chunks[0]])
except RuntimeError as e:
    print("ok:", e)
else:
    raise AssertionError(f"chunk {chunks[0]} was unlocked twice without a word")
