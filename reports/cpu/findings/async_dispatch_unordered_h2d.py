"""tpu-sync-jax 0.0.1rc20261023185136 with RAIDEN_ENABLE_ASYNC_DISPATCH=1:
the offload connector loads with h2d and does not await it before the next
model step; here the step, a jitted computation dispatched right after the
h2d returns, reads a mix of loaded and old blocks. A correct manager orders
the load before the computations dispatched after it (or lands it before
h2d returns, as the default dispatch does here).

Run: .venv-peer/bin/python reports/cpu/findings/async_dispatch_unordered_h2d.py"""

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

os.environ["RAIDEN_ENABLE_ASYNC_DISPATCH"] = "1"  # read by the library when it loads

import jax  # noqa: E402
import numpy as np  # noqa: E402
from tpu_sync.api.jax.kv_cache_manager import KVCacheManager  # noqa: E402

blocks = 512
values = np.repeat(np.arange(1, blocks + 1, dtype=np.float32), 1024 * 128).reshape(blocks, 1024, 128)
cache = jax.device_put(values)  # block b holds b + 1
manager = KVCacheManager([cache], 0, host_blocks_to_allocate=blocks)
manager.d2h(list(range(blocks)), list(range(blocks))).Await()
step = jax.jit(lambda x: x + 0)
step(cache).block_until_ready()
for trial in range(10):
    targets = list(range(blocks))[::-1] if trial % 2 == 0 else list(range(blocks))
    load = manager.h2d(list(range(blocks)), targets)  # not awaited, as the connector does
    seen = np.asarray(step(cache))[:, 0, 0]
    load.Await()
    expected = np.empty(blocks, np.float32)
    expected[targets] = np.arange(1, blocks + 1)
    if not np.array_equal(seen, expected):
        raise AssertionError(f"trial {trial}: the step after an un-awaited h2d saw "
                             f"{int((seen != expected).sum())} of {blocks} blocks not yet loaded")
print("ok")
