"""How many sub-managers the wrapper splits a manager into, read from the
host as tpu-sync-jax reads it: with $ENABLE_MULTI_NUMA on and the shards
on one NUMA node, one sub-manager per data-plane NIC ("rail"), the shards
dealt round-robin (shard i to sub-manager i % N), each sub-manager on the
next port. A data-plane NIC is one named in $TPU_RAIDEN_DATA_NICS (an
allowlist, "ens6,enp192s4"), or without that list one with a PCI device
and an MTU above 1500; the loopback interface never is.

Decided where the production library is silent or lax:
- Interfaces are listed from sysfs (`class/net` under $TPU_RAIDEN_SYSFS_ROOT,
  else /sys), where the production library also reads their MTU and
  device; it lists them by address (getifaddrs), so an interface with two
  addresses counts once here.
- The shards of a cache on several NUMA nodes are not split by node: the
  devices this runs on (JAX CPU, the simulated device) publish no NUMA
  node, as the production library logs for them.
- More rails than shards make one sub-manager per shard.
- A value of $ENABLE_MULTI_NUMA other than 1, true, 0, false or empty
  (any case), or an allowlisted name no interface has, is refused by name:
  the production library takes both as "off" and "no such rail", and a
  host then silently serves on one rail."""

from __future__ import annotations

import os

from kvref.bounded_reads import read_file

MULTI_NUMA_VARIABLE = "ENABLE_MULTI_NUMA"
DATA_NICS_VARIABLE = "TPU_RAIDEN_DATA_NICS"
SYSFS_VARIABLE = "TPU_RAIDEN_SYSFS_ROOT"
ON, OFF = ("1", "true"), ("", "0", "false")
JUMBO_MTU = 1500  # a data-plane NIC's MTU is above this; control and fallback ones are at it


def sub_managers(shards: int, environ=os.environ) -> int:
    """The sub-managers a manager over caches of `shards` parts is split into."""
    setting = environ.get(MULTI_NUMA_VARIABLE, "").strip().lower()
    if setting not in ON + OFF:
        raise ValueError(f"${MULTI_NUMA_VARIABLE}={environ[MULTI_NUMA_VARIABLE]!r}: expected 1 or true (a "
                         "sub-manager per data-plane NIC), 0, false or unset")
    if setting in OFF or shards < 2:
        return 1
    rails = data_nics(environ)
    return min(len(rails), shards) if len(rails) >= 2 else 1


def data_nics(environ=os.environ) -> list[str]:
    """The host's data-plane NICs, by name."""
    net = os.path.join(environ.get(SYSFS_VARIABLE) or "/sys", "class", "net")
    try:
        names = sorted(n for n in os.listdir(net) if n != "lo")
    except OSError as e:
        raise ValueError(f"cannot list the host's interfaces at {net} ({e.strerror}); set ${SYSFS_VARIABLE} "
                         "to a sysfs root that has class/net") from None
    allowed = list(dict.fromkeys(n.strip() for n in environ.get(DATA_NICS_VARIABLE, "").split(",") if n.strip()))
    if allowed:
        missing = [n for n in allowed if n not in names]
        if missing:
            raise ValueError(f"${DATA_NICS_VARIABLE} names {missing}, which this host does not have (its "
                             f"interfaces: {names})")
        return allowed
    return [n for n in names if os.path.exists(os.path.join(net, n, "device")) and _mtu(net, n) > JUMBO_MTU]


MTU_FILE_BYTES = 32  # an MTU's digits and a newline, with room to spare


def _mtu(net: str, name: str) -> int:
    try:  # bounded: a file planted there may be a FIFO, /dev/zero or gigabytes
        return int(read_file(os.path.join(net, name, "mtu"), MTU_FILE_BYTES, "an interface's MTU").strip())
    except (OSError, ValueError):  # an interface without a readable MTU is no data-plane NIC
        return 0
