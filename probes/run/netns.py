"""Loopback-only network namespaces: the one place the harness makes them
(a pull case's namespace with stand-in NICs is probes.iut.standin_rails').

The production library listens on every interface and, for pulls between
managers, connects to the host's own interface address even when given
127.0.0.1. So whatever runs it (the workers of a `loopback_only` IUT, the
reproducers of its findings, the benchmark) runs in a user and network
namespace of its own (`unshare -rn`) whose only interface is lo, brought up
here before the library is imported. Where none can be made (no `unshare`,
or the kernel refuses it), `unavailable()` says why, and the callers skip:
the library never runs outside one.

- `enter()`: the running process re-executes itself inside one, at the top
  of a script, before it imports the library; returns why it could not;
- `opening()`: the lines between the markers below (`enter()` and what it
  needs, with the standard library alone), which every reproducer starts
  with (probes.run.reproducers): it enters a namespace without this
  harness installed;
- `unavailable()`: None, or why no namespace can be made here (asked once);
- `python_command(python, module, *args)`: `python -m module args` inside a
  new namespace (`python -m probes.run.netns module args` under `unshare
  -rn`: lo up, only lo checked, then the module runs as `__main__`; the
  module `-c` runs the code in its first argument, as `python -c` does);
- `bring_lo_up()`, `interfaces()`, `only_loopback()`, `lo_is_up()`.

Standard library only: it runs first in a fresh interpreter."""

from __future__ import annotations

import functools
import runpy
from pathlib import Path

OPENING_STARTS, OPENING_ENDS = "# >>> the opening", "# <<< the opening"

# >>> the opening: every reproducer starts with the lines from here to "<<<", word for word
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
# <<< the opening


@functools.cache
def opening() -> str:
    """The lines between the markers above, word for word: what every
    reproducer starts with (probes.run.reproducers)."""
    lines = Path(__file__).read_text().splitlines(keepends=True)
    start, end = (next(i for i, line in enumerate(lines) if line.startswith(marker))
                  for marker in (OPENING_STARTS, OPENING_ENDS))
    return "".join(lines[start + 1:end])


def only_loopback() -> bool:
    return interfaces() == ["lo"]


def lo_is_up() -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return bool(lo_flags(s) & IFF_UP)


def check_inside() -> None:
    """Bring lo up and make sure lo is all there is; raise otherwise."""
    seen = interfaces()
    if seen != ["lo"]:
        raise RuntimeError(f"not in a loopback-only network namespace: this process sees {seen}")
    bring_lo_up()
    if not lo_is_up():
        raise RuntimeError("lo is still down in the loopback-only network namespace")


def _unshare() -> str:
    return shutil.which("unshare") or "unshare"


@functools.cache
def unavailable() -> str | None:
    """None when a loopback-only network namespace can be made here, else the
    reason. Asked once per process: `unshare -rn` runs this module's check (lo
    up, nothing but lo) with this interpreter."""
    if shutil.which("unshare") is None:
        return f"{NONE_HERE}: `unshare` (util-linux) is not installed"
    try:
        done = subprocess.run(python_command(sys.executable, "--check"), capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{NONE_HERE}: `unshare -rn` failed: {e}"
    if done.returncode:
        said = " ".join((done.stderr or done.stdout).split())[-300:]
        return f"{NONE_HERE}: `unshare -rn` refused ({said}){_restriction()}"
    return None


# Where a kernel keeps unprivileged users out of new user namespaces, and the setting that lets them in.
RESTRICTIONS = {"/proc/sys/kernel/apparmor_restrict_unprivileged_userns": ("1", "0"),  # Ubuntu 24.04's AppArmor
                "/proc/sys/kernel/unprivileged_userns_clone": ("0", "1")}  # Debian's older kernels


def _restriction() -> str:
    """Why `unshare -rn` is refused, where a kernel setting says so, with the fix."""
    for path, (restricted, allowed) in RESTRICTIONS.items():
        try:
            with open(path) as f:
                if f.read(8).strip() == restricted:
                    return (f"; this kernel keeps unprivileged users out of user namespaces ({path} is "
                            f"{restricted}): `sudo sysctl -w {path[len('/proc/sys/'):].replace('/', '.')}={allowed}`")
        except OSError:
            continue
    return ""


def python_command(python: str, module: str, *args: str) -> list[str]:
    """The command running `python -m module args` in a loopback-only network
    namespace of its own, with lo up before the module is imported."""
    return [_unshare(), "-rn", python, "-m", "probes.run.netns", module, *args]


def main(argv: list[str]) -> int:
    """`python -m probes.run.netns --check` | `... MODULE [ARG...]` | `... -c CODE [ARG...]`,
    run under `unshare -rn`."""
    check_inside()
    if argv == ["--check"]:
        print(" ".join(interfaces()), "up")
        return 0
    module, *args = argv
    if module == "-c":
        sys.argv = ["-c", *args[1:]]
        exec(compile(args[0], "<string>", "exec"), {"__name__": "__main__"})
        return 0
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
