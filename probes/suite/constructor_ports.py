"""The port a serving stack names when it builds a manager (tpu-sync's
local_control_port): the manager serves pulls there and nowhere else, or
is refused. The disaggregated connector advertises that port to its peers,
so a manager listening elsewhere, or two managers sharing one port, send
the peers' pulls to a manager that never registered them."""

from __future__ import annotations

import socket

from probes.iut.adapter import Adapter
from probes.iut.protocol import PortLibrary
from probes.suite.cases import Case
from probes.suite.pull_sides import PULL_TIMEOUT_S, SUBJECT
from probes.iut.sockets import free_loopback_port, listening_ports
from probes.suite.verdicts import ERROR, PASS, SKIP, Outcome

PORT_KINDS = ("named_port", "port_of_a_manager", "port_held_elsewhere")
MAX_BLOCKS = 16  # blocks one pull moves; its slots are the manager's host pool


def constructor_ports(case: Case, iut: Adapter) -> Outcome:
    """named_port: a manager built on a free port the caller names lists
    that port in get_local_endpoints() and listens on it. port_of_a_manager:
    a second manager built on the port the first one listens on must be
    refused (two listeners on one port split the peers' pulls between two
    managers that each know only their own registrations), and the first
    then still lists its port. port_held_elsewhere: a port another socket of
    the process listens on must be refused, never exchanged for another port
    the caller is not told of."""
    lib = iut.library if isinstance(iut.library, PortLibrary) else None
    if lib is None:
        return Outcome(SKIP, f"{iut.name}'s managers take no port from the caller (its library has no "
                       "probes.iut.protocol.PortLibrary)")
    layers = [[iut.make_cache(SUBJECT, case.seed + 2 * n + i)[0] for i in range(2)] for n in range(2)]
    made = []
    try:
        if case.kind == "named_port":
            port = free_loopback_port()
            made.append(lib.port_manager(layers[0], port, PULL_TIMEOUT_S, MAX_BLOCKS))
            return _serves_at(made[0], port) or Outcome(PASS, f"built on port {port}, it listens there and says so")
        if case.kind == "port_of_a_manager":
            made.append(lib.port_manager(layers[0], 0, PULL_TIMEOUT_S, MAX_BLOCKS))
            port = _ports(made[0])[0]
            refused = _refused(lambda: made.append(lib.port_manager(layers[1], port, PULL_TIMEOUT_S, MAX_BLOCKS)))
            if not refused:
                return Outcome(ERROR, f"a second manager was built on port {port}, where the first listens "
                               f"(it lists {_ports(made[1])}): the peers' pulls to port {port} reach either")
            return _serves_at(made[0], port) or Outcome(PASS, f"a second manager on the first's port {port} was "
                                                        f"refused ({refused}); the first kept it")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
            held.bind(("127.0.0.1", 0))
            held.listen()
            port = held.getsockname()[1]
            refused = _refused(lambda: made.append(lib.port_manager(layers[0], port, PULL_TIMEOUT_S, MAX_BLOCKS)))
        if not refused:
            return Outcome(ERROR, f"built on port {port}, which another socket listened on, it was accepted "
                           f"(it lists {_ports(made[0])})")
        return Outcome(PASS, f"a port another socket listened on was refused: {refused}")
    finally:
        for manager in made:
            iut.library.close_manager(manager)


def _ports(manager) -> list[int]:
    return [int(e["endpoint"].rsplit(":", 1)[1]) for e in manager.get_local_endpoints()]


def _serves_at(manager, port: int) -> Outcome | None:
    """None when `manager` lists `port` first and this process listens on it; else the ERROR."""
    listed = _ports(manager)
    if listed[:1] != [port]:
        return Outcome(ERROR, f"asked to serve on port {port}, its endpoints list ports {listed}")
    if port not in listening_ports():
        return Outcome(ERROR, f"its endpoints list port {port}, but nothing in this process listens there")
    return None


def _refused(build) -> str:
    """The error `build()` raised (its type and first line), or "" if it built."""
    try:
        build()
    except Exception as e:  # whatever the library raises is its refusal
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
    return ""
