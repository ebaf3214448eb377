"""tpu-sync-jax 0.0.1rc20261023185136: start_read accepts requests it cannot
carry out instead of refusing them at the call. Lists of different lengths
are accepted and never reported at all (the request waits forever); an empty
endpoint, a local block out of range and a uuid still being pulled are
accepted and then reported in failed_recving. A correct manager raises at
start_read, naming what is wrong.

Run: .venv-peer/bin/python reports/cpu/findings/pull_start_read_accepts_what_it_cannot_do.py"""

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


def manager():
    return KVCacheManager([jax.device_put(np.zeros((64, 8, 128), np.float32))], 0, max_blocks=16, num_slots=4,
                          timeout_s=3.0)


producer, consumer = manager(), manager()
endpoint = producer.get_local_endpoints()[0]["endpoint"]
producer.register_read("held", 7, [1, 2])
consumer.start_read("held", 7, endpoint, [1, 2], [1, 2])  # uuid 7 is now being pulled
accepted = []
for req, uuid, where, remote, local in (("lengths", 1, endpoint, [1, 2, 3], [1, 2]),
                                        ("empty endpoint", 2, "", [1], [1]),
                                        ("local block 64 of 64", 3, endpoint, [1], [64]),
                                        ("uuid 7 again", 7, endpoint, [1], [9])):
    try:
        consumer.start_read(req, uuid, where, remote, local)
        accepted.append(req)
    except (RuntimeError, ValueError) as e:
        print(f"ok: {req}: refused: {e}")
reported = {}
deadline = time.monotonic() + 8.0  # past timeout_s
while time.monotonic() < deadline:
    _, done, failed = consumer.poll_stats()
    reported.update({r: "done" for r in done} | {r: "failed" for r in failed})
    time.sleep(0.05)
for req in accepted:
    print(f"{req}: accepted by start_read, then {reported.get(req, 'never reported')}")
if accepted:
    raise AssertionError(f"start_read accepted {accepted} instead of refusing them")
