"""Where a manager listens for pulls and where a consumer pulls from: `host:port`
text, and the routes of a pull (which endpoint serves which parts of a block),
each checked once with an error naming what was wrong."""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass

from kvref.values import integer

LOOPBACK = "127.0.0.1"
PORT = re.compile(r"[0-9]{1,5}")  # ASCII digits only: str.isdigit takes other scripts' digits too


@dataclass(frozen=True)
class Route:
    """One endpoint of a pull and the parts of a block (host slots) pulled
    from it; `shards` None: every part the consumer has."""

    address: str
    shards: tuple[int, ...] | None = None


def address(text, what: str = "an endpoint") -> str:
    """`host:port` (an IPv6 host in brackets), the port in [0, 65535]."""
    if not isinstance(text, str):
        raise TypeError(f"{what} must be 'host:port' text, got {type(text).__name__}")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not PORT.fullmatch(port) or int(port) > 65535:
        raise ValueError(f"{what} {text!r} is not 'host:port' with a port in [0, 65535]")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(f"{what} {text!r}: an IPv6 host goes in brackets, '[::1]:port'")
    return text


def is_wildcard(host: str) -> bool:
    """Whether binding `host` binds every interface: judged on the address it
    resolves to as a number (no name lookup), so every spelling of 0.0.0.0
    and :: ('0', '0x0', '0.0', '[0:0::0]', '::ffff:0.0.0.0') is one, and ''."""
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        return True
    try:
        found = socket.getaddrinfo(host, None, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError, ValueError):
        return False  # a name: not a number that binds every interface
    for _, _, _, _, sockaddr in found:
        ip = ipaddress.ip_address(sockaddr[0].partition("%")[0])
        if ip.is_unspecified or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_unspecified):
            return True
    return False


def port_of(text: str) -> int:
    return int(text.rpartition(":")[2])


def with_port(text: str, port: int) -> str:
    return f"{text.rpartition(':')[0]}:{port}"


def routes(remote_endpoint) -> list[Route]:
    """A consumer's `remote_endpoint`: one 'host:port' (every part from it),
    or a non-empty list of {"endpoint": 'host:port', "shards": [parts]}
    descriptors (get_local_endpoints' form), no part named twice."""
    if isinstance(remote_endpoint, str):
        if not remote_endpoint:
            raise ValueError("remote_endpoint is empty; expected 'host:port' or a list of endpoint descriptors")
        return [Route(address(remote_endpoint, "remote_endpoint"))]
    if not isinstance(remote_endpoint, (list, tuple)):
        raise TypeError(f"remote_endpoint must be 'host:port' or a list of endpoint descriptors, "
                        f"got {type(remote_endpoint).__name__}")
    if not remote_endpoint:
        raise ValueError("remote_endpoint is an empty list; expected at least one endpoint descriptor")
    found, seen = [], {}
    for i, descriptor in enumerate(remote_endpoint):
        if not isinstance(descriptor, dict) or set(descriptor) != {"endpoint", "shards"}:
            raise ValueError(f"remote_endpoint[{i}] must be a dict with keys 'endpoint' and 'shards', "
                             f"got {descriptor!r}")
        shards = descriptor["shards"]
        if isinstance(shards, (str, bytes)) or not hasattr(shards, "__iter__"):
            raise TypeError(f"remote_endpoint[{i}]['shards'] must be a list of parts, got {shards!r}")
        parts = tuple(integer(s, f"remote_endpoint[{i}]['shards'] entry", 0) for s in shards)
        if not parts:
            raise ValueError(f"remote_endpoint[{i}]['shards'] is empty; expected the parts it serves")
        for part in parts:
            if part in seen:
                raise ValueError(f"part {part} is named by remote_endpoint[{seen[part]}] and [{i}]")
            seen[part] = i
        found.append(Route(address(descriptor["endpoint"], f"remote_endpoint[{i}]['endpoint']"), parts))
    return found
