"""tpu-sync-jax 0.0.1rc20261023185136: KVCacheManager(..., parallelism=100000)
starts one thread per unit with no cap and aborts the process (SIGABRT,
"terminate called without an active exception"). A correct manager refuses
the value or clamps it; it never takes the process down.

Run: .venv-peer/bin/python reports/cpu/findings/parallelism_huge_aborts.py
(exits 134 here; "ok" from a correct manager)"""

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

import resource  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from tpu_sync.api.jax.kv_cache_manager import KVCacheManager  # noqa: E402

cache = jax.device_put(np.zeros((64, 8, 128), np.float32))
# A thread takes one of the machine's process ids (32768 by default, and root is not held to
# RLIMIT_NPROC): room for about 1024 more 8 MiB stacks, so the library runs out here, not
# every other process on the machine.
with open("/proc/self/status") as f:
    mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
resource.setrlimit(resource.RLIMIT_AS, (min(mapped + 1024 * (8 << 20), hard if hard >= 0 else 1 << 62), hard))
try:
    manager = KVCacheManager([cache], 0, host_blocks_to_allocate=8, parallelism=10**5)
    manager.d2h([0], [0]).Await()
except (ValueError, RuntimeError) as e:
    print("ok: refused:", e)
else:
    print("ok: clamped")
