"""tpu-sync-jax 0.0.1rc20261023185136: settings a serving engine passes
through from the environment are taken unchecked: parallelism=0, and
timeout_s of 0, -1 or NaN (which the wrapper drops when
host_blocks_to_allocate is given) build a manager without a word. A correct
manager refuses each, naming the setting.

Run: .venv-peer/bin/python reports/cpu/findings/settings_taken_unchecked.py"""

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
taken = []
for setting in ({"parallelism": 0}, {"timeout_s": 0.0}, {"timeout_s": -1.0}, {"timeout_s": float("nan")}):
    try:
        KVCacheManager([cache], 0, host_blocks_to_allocate=8, **setting)
    except (ValueError, RuntimeError) as e:
        print("refused:", setting, e)
    else:
        taken.append(setting)
if taken:
    raise AssertionError(f"taken without a word: {taken}")
print("ok")
