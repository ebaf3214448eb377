"""tpu-sync-jax 0.0.1rc20261023185136: two managers in two processes with
enable_shm=True and the same RAIDEN_SHM_KEY are both accepted and share the
pool's memory, but each hands out chunks from an allocator of its own: the
second's save lands in the chunks the first was given, so the first restores
the second's bytes. And the key's segments stay in /dev/shm after both have
exited. A correct manager refuses the second attach (or shares one
allocator), and removes its segments.

Run: .venv-peer/bin/python reports/cpu/findings/shared_pool_two_allocators.py"""

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

from pathlib import Path  # noqa: E402

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
