"""tpu-sync-jax 0.0.1rc20261023185136: a request the producer registered and
no consumer pulled (its consumer went away) is reported, when timeout_s
passes, in the producer's own failed_recving and never in done_sending. A
serving stack frees a producer's blocks on done_sending only (tpu-inference's
connector leaves failed_recving pending), so those blocks are never freed.

Run: .venv-peer/bin/python reports/cpu/findings/pull_unpulled_request_never_done_sending.py"""

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

producer = KVCacheManager([jax.device_put(np.zeros((64, 8, 128), np.float32))], 0, max_blocks=16, num_slots=4,
                          timeout_s=2.0)
producer.register_read("unpulled", 5, [1, 2, 3])
seen = {"done_sending": [], "done_recving": [], "failed_recving": []}
deadline = time.monotonic() + 6.0  # three times timeout_s
while time.monotonic() < deadline:
    for name, reported in zip(seen, producer.poll_stats()):
        seen[name] += reported
    time.sleep(0.05)
print(seen)
if "unpulled" not in seen["done_sending"]:
    raise AssertionError(f"the unpulled request was never done sending after timeout_s: {seen}")
