"""tpu-sync-jax 0.0.1rc20261023185136: a cache split along its blocks over
two devices (tpu-inference splits the block dimension over its data axis)
is accepted, and then a block id is taken as every shard's own local block:
moving block 1 into block 2 also moves block 5 into block 6 (the second
device's local blocks 1 and 2), and a block id past one device's count is
refused only when a transfer is made ("Copy range exceeds source device
buffer size"). A manager must either move global blocks, each on the device
that holds it, or refuse the sharding when it is built.

Run: .venv-peer/bin/python reports/cpu/findings/block_split_cache_moves_every_shard.py"""

# The library listens on every interface and connects to the host's own
# address, so this runs in a network namespace whose only interface is lo:
# outside one, it re-executes itself under `unshare -rn` and brings lo up
# before the library is imported; where none can be made, it prints SKIP
# and exits 77, having run nothing. (The standard library alone.)
import fcntl
import os
import shutil
import socket
import struct
import subprocess
import sys

ENTERED = "KVPROBE_NETNS"  # set in a process re-executed inside a namespace
SKIP_EXIT = 77  # a script that could not enter one exits with this, having run nothing
NONE_HERE = "no loopback-only network namespace can be made here"
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
IFREQ = "16sH22x"  # struct ifreq: the name, then ifr_flags in the 24-byte union


def interfaces() -> list[str]:
    """The network interfaces this process sees (its network namespace's)."""
    with open("/proc/net/dev") as f:
        return [line.split(":", 1)[0].strip() for line in f.readlines()[2:] if ":" in line]


def lo_flags(s: socket.socket) -> int:
    return struct.unpack(IFREQ, fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack(IFREQ, b"lo", 0)))[1]


def bring_lo_up() -> None:
    """Set IFF_UP on lo (a new namespace's lo is down): an ioctl, else `ip link set lo up`."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = lo_flags(s)
        if flags & IFF_UP:
            return
        try:
            fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP))
            return
        except OSError as e:
            failed = e
    ip = shutil.which("ip")
    if ip is None or subprocess.run([ip, "link", "set", "lo", "up"], capture_output=True).returncode:
        raise OSError(f"could not bring lo up: {failed}")


def enter() -> str | None:
    """Put this process in a loopback-only network namespace before it imports
    the library: inside one already, bring lo up and return None; else re-exec
    this interpreter, its flags and arguments under `unshare -rn` (no return).
    Returns why none can be made here: the caller then runs nothing of the library."""
    seen = interfaces()
    if seen == ["lo"]:
        try:
            bring_lo_up()
        except OSError as e:
            return f"{NONE_HERE}: {e}"
        return None
    if os.environ.get(ENTERED):
        return f"{NONE_HERE}: re-executed under `unshare -rn`, this process still sees {seen}"
    unshare = shutil.which("unshare")
    if unshare is None:
        return f"{NONE_HERE}: `unshare` (util-linux) is not installed"
    tried = subprocess.run([unshare, "-rn", sys.executable, "-S", "-c", ""], capture_output=True, text=True)
    if tried.returncode:
        return f"{NONE_HERE}: `unshare -rn` refused ({' '.join((tried.stderr or '').split())[-300:]})"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(unshare, [unshare, "-rn", sys.executable, *sys.orig_argv[1:]], {**os.environ, ENTERED: "1"})


if NO_NAMESPACE := enter():
    print("SKIP", NO_NAMESPACE)
    sys.exit(SKIP_EXIT)

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
