"""tpu-sync-jax 0.0.1rc20261023185136: two managers in two processes with
enable_shm=True and the same RAIDEN_SHM_KEY are both accepted and share the
pool's memory, but each hands out chunks from an allocator of its own: the
second's save lands in the chunks the first was given, so the first restores
the second's bytes. And the key's segments stay in /dev/shm after both have
exited. A correct manager refuses the second attach (or shares one
allocator), and removes its segments.

Run: .venv-peer/bin/python reports/cpu/findings/shared_pool_two_allocators.py"""

import os
import subprocess
import sys
from pathlib import Path

from probes.run import netns  # the library listens on every interface: run it where only lo exists

if reason := netns.enter():  # re-executes this script under `unshare -rn`, lo up
    print("SKIP", reason)
    sys.exit(netns.SKIP_EXIT)

KEY = f"kvprobe-finding-{os.getpid()}"
WORKER = """
import sys, jax, numpy as np
from tpu_sync.api.jax.kv_cache_manager import KVCacheManager
seed = int(sys.argv[1])
caches = [jax.device_put(np.full((64, 8, 128), seed + layer, np.float32)) for layer in range(2)]
m = KVCacheManager(caches, 0, host_blocks_to_allocate=16, enable_shm=True)
input()                                     # save when told
chunks, future = m.d2h_auto_allocate(list(range(16)))
future.Await()
print("saved", chunks, flush=True)
input()                                     # restore when told
m.h2d(chunks, list(range(16, 32))).Await()
got, own = [float(np.asarray(c)[16:32].mean()) for c in caches], [float(seed + layer) for layer in range(2)]
print("restored its own bytes" if got == own else f"restored {got}, not its own {own}", flush=True)
"""


def start(seed: int) -> subprocess.Popen:
    env = {**os.environ, "RAIDEN_SHM_KEY": KEY, "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen([sys.executable, "-c", WORKER, str(seed)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)


def say(proc: subprocess.Popen) -> str:
    proc.stdin.write("\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


first, second = start(100), start(200)
try:
    print("first:", say(first))
    print("second:", say(second))
    restored = [say(first), say(second)]
    for proc in (first, second):
        proc.stdin.close()
        proc.wait(timeout=60)
finally:
    for proc in (first, second):
        proc.kill()
left = sorted(p.name for p in Path("/dev/shm").glob(f"*{KEY}*"))
for name in left:
    (Path("/dev/shm") / name).unlink()
print("first:", restored[0])
print("second:", restored[1])
print("left in /dev/shm after both exited:", left)
wrong = [r for r in restored if r != "restored its own bytes"]
if wrong or left:
    raise AssertionError(f"restored other bytes: {wrong}; segments left: {left}")
