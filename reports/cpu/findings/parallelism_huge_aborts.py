"""tpu-sync-jax 0.0.1rc20261023185136: KVCacheManager(..., parallelism=100000)
starts one thread per unit with no cap and aborts the process (SIGABRT,
"terminate called without an active exception"). A correct manager refuses
the value or clamps it; it never takes the process down.

Run: .venv-peer/bin/python reports/cpu/findings/parallelism_huge_aborts.py
(exits 134 here; "ok" from a correct manager)"""

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
try:
    manager = KVCacheManager([cache], 0, host_blocks_to_allocate=8, parallelism=10**5)
    manager.d2h([0], [0]).Await()
except (ValueError, RuntimeError) as e:
    print("ok: refused:", e)
else:
    print("ok: clamped")
