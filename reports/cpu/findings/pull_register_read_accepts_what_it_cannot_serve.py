"""tpu-sync-jax 0.0.1rc20261023185136: register_read of a block the manager
does not have (64 of 64) returns True, as if it were ready to be pulled; a
second registration under a uuid still registered returns False, which the
API documents as "nothing to be transferred", without saying it was
refused. A correct manager raises at register_read, naming the block or the
uuid.

Run: .venv-peer/bin/python reports/cpu/findings/pull_register_read_accepts_what_it_cannot_serve.py"""

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

producer = KVCacheManager([jax.device_put(np.zeros((64, 8, 128), np.float32))], 0, max_blocks=16, num_slots=4,
                          timeout_s=3.0)
wrong = []
for what, call in (("block 64 of 64", lambda: producer.register_read("out-of-range", 1, [0, 64])),
                   ("uuid 2 while registered", lambda: (producer.register_read("first", 2, [1]),
                                                        producer.register_read("second", 2, [3]))[1])):
    try:
        said = call()
    except (RuntimeError, ValueError) as e:
        print(f"ok: {what}: refused: {e}")
    else:
        print(f"{what}: register_read returned {said}, no error")
        wrong.append(what)
if wrong:
    raise AssertionError(f"register_read did not refuse {wrong}")
