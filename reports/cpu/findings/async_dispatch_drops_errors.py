"""tpu-sync-jax 0.0.1rc20261023185136 with RAIDEN_ENABLE_ASYNC_DISPATCH=1: a
d2h, h2d or d2h_auto_allocate that the default dispatch refuses
(INVALID_ARGUMENT: a block past the end, a negative block) is accepted, its
future's Await() returns normally, and nothing is moved, not even the valid
entries of the same request. A correct manager refuses the request, or its
future reports the failure.

Run: .venv-peer/bin/python reports/cpu/findings/async_dispatch_drops_errors.py"""

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

cache = jax.device_put(np.zeros((64, 8, 128), np.float32))
manager = KVCacheManager([cache], 0, host_blocks_to_allocate=8)
silent = []
for name, call in (("d2h of block 64", lambda: manager.d2h([64], [0])),
                   ("h2d into block -1", lambda: manager.h2d([0], [-1])),
                   ("a save of block 64", lambda: manager.d2h_auto_allocate([64])[1])):
    try:
        call().Await()
    except (ValueError, RuntimeError) as e:
        print("refused:", name, e)
    else:
        silent.append(name)
if silent:
    raise AssertionError(f"accepted, and Await() returned normally: {silent}")
print("ok")
