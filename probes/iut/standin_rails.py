"""A stand-in host with several data-plane NICs ("rails"), for the
libraries that split a manager into a sub-manager per rail when
ENABLE_MULTI_NUMA is on, each as the library finds its rails:

- kvref's facade reads them from sysfs (kvref.compat.data_rails):
  `rails_environment` makes a sysfs tree whose class/net holds that many
  NICs with a PCI device and a jumbo MTU, and the variables that point the
  facade at it. The tree goes when the worker exits.
- tpu-sync-jax lists the host's interfaces by address (getifaddrs), so it
  needs real ones: `enter_rails_namespace` moves the calling process into a
  network namespace of its own with lo and that many veth interfaces, each
  with an address of its own, which the two workers of a case share
  (`join_namespace`). Every socket stays inside that namespace: the
  addresses are the namespace's own, and nothing in it routes anywhere else.
  Libraries that need this say so with `NEEDS_INTERFACES = True`."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from kvref.compat.data_rails import DATA_NICS_VARIABLE, JUMBO_MTU, MULTI_NUMA_VARIABLE, SYSFS_VARIABLE

RAIL_NAMES = "kvrail{}"  # never a real interface's name
RAIL_ADDRESS = "10.233.{}.1/24"  # each rail's own subnet, inside the case's namespace only
IP_SECONDS = 10.0


def rail_names(rails: int) -> list[str]:
    return [RAIL_NAMES.format(i) for i in range(rails)]


def rails_environment(rails: int) -> dict[str, str]:
    """The variables under which the facade splits its managers over `rails` stand-in NICs."""
    root = Path(tempfile.mkdtemp(prefix="kvprobe-rails-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    for name in rail_names(rails):
        nic = root / "class" / "net" / name
        (nic / "device").mkdir(parents=True)
        (nic / "mtu").write_text(f"{JUMBO_MTU * 6}\n")
    return {**multi_rail_switches(rails), SYSFS_VARIABLE: str(root)}


def multi_rail_switches(rails: int) -> dict[str, str]:
    """ENABLE_MULTI_NUMA on, and the rails named as the data-plane NICs."""
    return {MULTI_NUMA_VARIABLE: "1", DATA_NICS_VARIABLE: ",".join(rail_names(rails))}


def cannot_make_interfaces() -> str | None:
    """Why no namespace with rails can be made here, or None."""
    if not hasattr(os, "unshare") or not hasattr(os, "setns"):
        return "this Python has no os.unshare/os.setns (3.12 and later do)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) to make the rails' interfaces"
    return None


def enter_rails_namespace(rails: int) -> None:
    """Move this process (its calling thread, and every thread it starts
    from now on) into a new network namespace with lo and `rails` veth
    interfaces up, each with its own address. OSError naming the step that
    failed."""
    os.unshare(os.CLONE_NEWNET)
    steps = [["link", "set", "lo", "up"]]
    for i, name in enumerate(rail_names(rails)):
        steps += [["link", "add", name, "type", "veth", "peer", "name", f"{name}p"],
                  ["addr", "add", RAIL_ADDRESS.format(i), "dev", name],
                  ["link", "set", name, "up"], ["link", "set", f"{name}p", "up"]]
    for step in steps:
        done = subprocess.run(["ip", *step], capture_output=True, text=True, timeout=IP_SECONDS)
        if done.returncode:
            raise OSError(f"`ip {' '.join(step)}` failed in the rails' namespace: {done.stderr.strip()}")


def join_namespace(pid: int) -> None:
    """Move this process into the network namespace process `pid` is in."""
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        os.setns(fd, os.CLONE_NEWNET)
    finally:
        os.close(fd)
