"""tpu-sync-jax 0.0.1rc20261023185136: a cache split along its blocks over
two devices (tpu-inference splits the block dimension over its data axis)
is accepted, and then a block id is taken as every shard's own local block:
moving block 1 into block 2 also moves block 5 into block 6 (the second
device's local blocks 1 and 2), and a block id past one device's count is
refused only when a transfer is made ("Copy range exceeds source device
buffer size"). A manager must either move global blocks, each on the device
that holds it, or refuse the sharding when it is built.

Run: .venv-peer/bin/python reports/cpu/findings/block_split_cache_moves_every_shard.py"""

import os
import sys

from probes.run import netns  # the library listens on every interface: run it where only lo exists

if reason := netns.enter():  # re-executes this script under `unshare -rn`, lo up
    print("SKIP", reason)
    sys.exit(netns.SKIP_EXIT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402
from tpu_sync.api.jax.kv_cache_manager import KVCacheManager  # noqa: E402

mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
host = np.arange(8 * 4 * 128, dtype=np.float32).reshape(8, 4, 128)  # 8 blocks, 4 on each device
cache = jax.device_put(host.copy(), NamedSharding(mesh, PartitionSpec("data")))
manager = KVCacheManager([cache], 0, host_blocks_to_allocate=8)
manager.d2h([1], [0]).Await()
manager.h2d([0], [2]).Await()
got = np.asarray(cache)
changed = [b for b in range(8) if not np.array_equal(got[b], host[b])]
assert changed == [2], f"moving global block 1 into block 2 changed blocks {changed}"
print("ok: only block 2 changed")
