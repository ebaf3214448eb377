"""tpu-sync-jax 0.0.1rc20261023185136: a manager built with
host_blocks_to_allocate (the form the offload connector uses) cannot pull:
start_read is accepted and the pull reported failed (it has no staging
slots), although its pool has the room. A manager should either pull or
refuse start_read by name.

Run: .venv-peer/bin/python reports/cpu/findings/pull_pool_form_cannot_pull.py"""

import os
import sys
import time

from probes.run import netns  # the library listens on every interface: run it where only lo exists

if reason := netns.enter():  # re-executes this script under `unshare -rn`, lo up
    print("SKIP", reason)
    sys.exit(netns.SKIP_EXIT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from tpu_sync.api.jax.kv_cache_manager import KVCacheManager  # noqa: E402

source = jax.device_put(np.arange(64 * 8 * 128, dtype=np.float32).reshape(64, 8, 128))
producer = KVCacheManager([source], 0, host_blocks_to_allocate=16, timeout_s=3.0)
consumer = KVCacheManager([jax.device_put(np.zeros((64, 8, 128), np.float32))], 0, host_blocks_to_allocate=16,
                          timeout_s=3.0)
producer.register_read("r", 1, [1, 2])
consumer.start_read("r", 1, producer.get_local_endpoints()[0]["endpoint"], [1, 2], [3, 4])
state = "never reported"
deadline = time.monotonic() + 6.0
while time.monotonic() < deadline and state == "never reported":
    _, done, failed = consumer.poll_stats()
    state = "done" if "r" in done else "failed" if "r" in failed else state
    time.sleep(0.02)
print("the pull:", state)
if state != "done":
    raise AssertionError(f"a pull between host_blocks_to_allocate managers was accepted and ended {state}")
