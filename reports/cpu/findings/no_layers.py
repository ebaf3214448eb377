"""tpu-sync-jax 0.0.1rc20261023185136: KVCacheManager([], ...) constructs. A
manager with no layers can move nothing; a correct one refuses the empty list.

Run: .venv-peer/bin/python reports/cpu/findings/no_layers.py"""

import os
import sys

from probes.run import netns  # noqa: E402  (the library listens on every interface: run it where only lo exists)

if reason := netns.enter():  # re-executes this script under `unshare -rn`, lo up
    print("SKIP", reason)
    sys.exit(netns.SKIP_EXIT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from tpu_sync.api.jax.kv_cache_manager import KVCacheManager  # noqa: E402

try:
    KVCacheManager([], 0, host_blocks_to_allocate=8)
except Exception as e:  # the refusal a correct manager gives
    print("ok:", type(e).__name__, e)
else:
    raise AssertionError("KVCacheManager([]) was constructed")
