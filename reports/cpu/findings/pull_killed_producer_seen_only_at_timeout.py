"""tpu-sync-jax 0.0.1rc20261023185136: when the producer's process dies while
a consumer pulls from it, the consumer reports the pull failed only when
timeout_s has passed (here 5 s), though the connection broke at once. A
serving stack waits that long before it can reschedule the request; a
correct manager reports a lost producer promptly.

Run: .venv-peer/bin/python reports/cpu/findings/pull_killed_producer_seen_only_at_timeout.py"""

import os
import signal
import subprocess
import sys
import time

from probes.run import netns  # the library listens on every interface: run it where only lo exists

if reason := netns.enter():  # re-executes this script under `unshare -rn`, lo up
    print("SKIP", reason)
    sys.exit(netns.SKIP_EXIT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

TIMEOUT_S = 5.0
PRODUCER = f"""
import sys, time, jax, numpy as np
from tpu_sync.api.jax.kv_cache_manager import KVCacheManager
caches = [jax.device_put(np.ones((256, 8, 4096), np.float32)) for _ in range(4)]
m = KVCacheManager(caches, 0, max_blocks=256, num_slots=2, timeout_s={TIMEOUT_S})
m.register_read("r", 1, list(range(256)))
print(m.get_local_endpoints()[0]["endpoint"], flush=True)
time.sleep(60)
"""

import jax  # noqa: E402
import numpy as np  # noqa: E402
from tpu_sync.api.jax.kv_cache_manager import KVCacheManager  # noqa: E402


def loopback_bytes() -> int:
    """Bytes sent over lo in this namespace so far: the pull's traffic alone."""
    with open("/proc/net/dev") as f:
        return next(int(line.split(":")[1].split()[8]) for line in f if line.strip().startswith("lo:"))

producer = subprocess.Popen([sys.executable, "-c", PRODUCER], stdout=subprocess.PIPE, text=True)
try:
    endpoint = producer.stdout.readline().strip()
    consumer = KVCacheManager([jax.device_put(np.zeros((256, 8, 4096), np.float32)) for _ in range(4)], 0,
                              max_blocks=256, num_slots=2, timeout_s=TIMEOUT_S)
    sent = loopback_bytes()
    consumer.start_read("r", 1, endpoint, list(range(256)), list(range(256)))
    started = time.monotonic()
    while loopback_bytes() < sent + 16 * 2**20 and time.monotonic() - started < 2.0:
        time.sleep(0.001)  # until a quarter of the pull's 64 MiB has crossed lo
    os.kill(producer.pid, signal.SIGKILL)
    killed = time.monotonic()
    state = "never reported"
    while time.monotonic() - killed < 2 * TIMEOUT_S and state == "never reported":
        _, done, failed = consumer.poll_stats()
        state = "done" if "r" in done else "failed" if "r" in failed else state
        time.sleep(0.01)
    after = time.monotonic() - killed
finally:
    producer.kill()
    producer.wait()
print(f"the pull: {state}, {after:.2f}s after its producer was killed (timeout_s={TIMEOUT_S})")
if state == "done":
    print("SKIP: the pull landed before its producer died")
elif state != "failed" or after > 2.0:
    raise AssertionError(f"a pull whose producer was killed was reported {state} only {after:.1f}s later")
