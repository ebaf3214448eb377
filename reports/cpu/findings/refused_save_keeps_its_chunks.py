"""tpu-sync-jax 0.0.1rc20261023185136: a d2h_auto_allocate that is refused
(here a run past the last device block: INVALID_ARGUMENT) still takes its
host chunks, and returns no ids, so the caller can never unlock them: the
pool shrinks with every refused save. A correct manager takes no chunk.

Run: .venv-peer/bin/python reports/cpu/findings/refused_save_keeps_its_chunks.py"""

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
try:
    manager.d2h_auto_allocate([62], [4])  # blocks 62..65 of a 64-block cache
except RuntimeError as e:
    print("refused, as it should be:", e)
else:
    raise AssertionError("a save of blocks past the end was accepted")
chunks, future = manager.d2h_auto_allocate(list(range(8)))  # the whole pool: must still be free
future.Await()
print("ok: every chunk still free after the refusal", chunks)
