"""The TCP sockets this process holds, read from /proc: which of them listen,
and at which address (a wildcard address is every interface the network
namespace has); and how many bytes have crossed lo."""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass

LISTEN = "0A"  # the TCP state /proc/net/tcp writes for a listening socket


@dataclass(frozen=True)
class Listener:
    address: str
    port: int

    @property
    def wildcard(self) -> bool:
        return ipaddress.ip_address(self.address).is_unspecified

    @property
    def loopback(self) -> bool:
        address = ipaddress.ip_address(self.address)
        mapped = getattr(address, "ipv4_mapped", None)
        return (mapped or address).is_loopback

    def __str__(self) -> str:
        return f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"


def socket_inodes(pid: int | str = "self") -> set[int]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed since it was listed
            continue
        if link.startswith("socket:["):
            found.add(int(link[8:-1]))
    return found


def listeners(pid: int | str = "self") -> list[Listener]:
    """The process's listening TCP sockets (IPv4 and IPv6)."""
    mine = socket_inodes(pid)
    found = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                lines = f.readlines()[1:]
        except FileNotFoundError:  # no IPv6 in this kernel
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == LISTEN and int(fields[9]) in mine:
                host, port = fields[1].split(":")
                found.append(Listener(_address(host), int(port, 16)))
    return found


def listening_ports(pid: int | str = "self") -> set[int]:
    """The ports the process listens on, at any address."""
    return {l.port for l in listeners(pid)}


def loopback_bytes() -> int:
    """Bytes sent over lo in this network namespace so far (/proc/net/dev):
    in a namespace of its own, the traffic of its processes only."""
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                return int(counters.split()[8])
    raise RuntimeError("this network namespace has no lo")


def _address(hex_text: str) -> str:
    """/proc/net/tcp's address: 32-bit words, each in the host's (little-endian) byte order."""
    raw = bytes.fromhex(hex_text)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def free_loopback_port() -> int:
    """A loopback port nothing listens on now (bound, then let go)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
