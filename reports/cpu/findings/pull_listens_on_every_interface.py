"""tpu-sync-jax 0.0.1rc20261023185136: a manager listens on the wildcard
address [::] (every interface of the host, IPv4 too), whatever it is built
for: one built for pulls opens its control and data ports there, and one
built only to offload (host_blocks_to_allocate, no control port) still
opens a data port. A manager should listen only where it is asked to, and
one that only offloads not at all.

Run: .venv-peer/bin/python reports/cpu/findings/pull_listens_on_every_interface.py"""

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

from probes.suite.sockets import listeners  # noqa: E402

cache = [jax.device_put(np.zeros((64, 8, 128), np.float32))]
found = {}
for what, build in (("a pulling manager", lambda: KVCacheManager(cache, 0, max_blocks=16, num_slots=4)),
                    ("an offload-only manager", lambda: KVCacheManager(cache, 0, host_blocks_to_allocate=16))):
    before = set(listeners())
    manager = build()
    found[what] = [l for l in listeners() if l not in before]
    print(f"{what}: listens on {', '.join(map(str, found[what])) or 'nothing'}")
wild = {what: [str(l) for l in opened if l.wildcard] for what, opened in found.items()}
if any(wild.values()) or found["an offload-only manager"]:
    raise AssertionError(f"listeners on a wildcard address: {wild}; the offload-only manager listens on "
                         f"{[str(l) for l in found['an offload-only manager']]}")
