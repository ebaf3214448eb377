"""tpu-sync-jax 0.0.1rc20261023185136: KVCacheManager([], ...) constructs. A
manager with no layers can move nothing; a correct one refuses the empty list.

Run: .venv-peer/bin/python reports/cpu/findings/no_layers.py"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from tpu_sync.api.jax.kv_cache_manager import KVCacheManager  # noqa: E402

try:
    KVCacheManager([], 0, host_blocks_to_allocate=8)
except Exception as e:  # the refusal a correct manager gives
    print("ok:", type(e).__name__, e)
else:
    raise AssertionError("KVCacheManager([]) was constructed")
