"""A worker's registration with its serving fleet's controller (tpu-sync's
raiden_worker_port, raiden_controller_address, worker_id, node_id): the
controller routes transfers by what each worker registered, so a
registration that names a port nobody serves, or a worker that listens
elsewhere than it was told, sends a fleet's traffic nowhere. A stand-in
controller (probes.suite.controller) records what arrives."""

from __future__ import annotations

import time

from probes.iut.adapter import Adapter
from probes.iut.protocol import WorkerLibrary
from probes.suite.cases import Case
from probes.suite.controller import StandinController
from probes.suite.pull_sides import PULL_TIMEOUT_S, SUBJECT
from probes.suite.pulls import HALF_HEADS
from probes.suite.threads import unfinished
from probes.iut.sockets import free_loopback_port, listening_ports
from probes.suite.verdicts import ERROR, PASS, SKIP, Outcome

WORKER_KINDS = ("no_controller", "registers", "named_worker_port", "second_worker_port", "controller_unreachable")
KEYS = (SUBJECT, HALF_HEADS)  # two block sizes, so a registration's block bytes are told apart by layer
REGISTRATION_WAIT_S = 10.0  # for a registration to reach the controller after the manager is built
REPEAT_WAIT_S = 2.0  # after the first, for a repeat of it (one manager registers once)
UNREACHABLE_TIMEOUT_S = 20.0  # the manager's timeout_s where its controller is down
STARTUP_BOUND_S = 8.0  # the longest a manager may take to build while its controller is down


def worker_registration(case: Case, iut: Adapter) -> Outcome:
    """no_controller: a manager given a worker port and no controller
    listens on no worker port and says 0 (nothing would drive it).
    registers: built with a controller, the manager's worker listens and
    reports its port, and exactly one registration reaches the controller
    with the worker id and node id given, that worker endpoint, transfer
    endpoints this process listens on whose parts cover the cache's once
    each, and one block size per layer. named_worker_port: the worker
    listens on the port named and registers it. second_worker_port: a
    second manager naming another worker port than the first's is refused,
    or its worker listens there. controller_unreachable: with
    the controller down, the manager is still built within 8 s (its
    timeout_s is 20) and serves at its endpoints."""
    lib = iut.library if isinstance(iut.library, WorkerLibrary) else None
    if lib is None:
        return Outcome(SKIP, f"{iut.name}'s managers register with no controller (its library has no "
                       "probes.iut.protocol.WorkerLibrary)")
    caches = [iut.make_cache(key, case.seed + i)[0] for i, key in enumerate(KEYS)]
    worker_id, node_id = f"kvprobe-worker-{case.seed}", 1 + case.seed % 7
    made = []

    def build(worker_port: int, controller: str | None, timeout_s: float = PULL_TIMEOUT_S):
        made.append(lib.worker_manager(caches, worker_port, controller, worker_id, node_id, timeout_s))
        return made[-1]

    try:
        if case.kind == "no_controller":
            port = free_loopback_port()
            manager = build(port, None)
            said, active = manager.get_raiden_worker_port(), manager.is_listener_active
            listens = port in listening_ports()
            if said or active or listens:
                return Outcome(ERROR, f"with worker port {port} and no controller it says worker port {said}, "
                               f"listener active {active}, and {'listens' if listens else 'does not listen'}"
                               f" on {port}: a worker port nothing drives")
            return Outcome(PASS, f"with worker port {port} and no controller, no worker listens and it says 0")
        if case.kind == "controller_unreachable":
            dead = f"127.0.0.1:{free_loopback_port()}"
            started = time.monotonic()
            failed = []

            def build_unreachable():
                try:
                    build(0, dead, UNREACHABLE_TIMEOUT_S)
                except Exception as e:  # raised again in the probe's thread
                    failed.append(e)

            if unfinished([build_unreachable], STARTUP_BOUND_S):  # it goes on in a daemon thread
                return Outcome(ERROR, f"with its controller {dead} down it was not built within "
                               f"{STARTUP_BOUND_S:.0f} s (its timeout_s is {UNREACHABLE_TIMEOUT_S:.0f}): a host "
                               "cannot serve while its controller is down")
            if failed:
                raise failed[0]
            took, manager = time.monotonic() - started, made[-1]
            listening = listening_ports()
            unserved = [e["endpoint"] for e in manager.get_local_endpoints() if _port(e["endpoint"]) not in listening]
            if unserved or not manager.get_local_endpoints():
                return Outcome(ERROR, f"with its controller down it was built but serves none of "
                               f"{unserved or 'no endpoints'}")
            return Outcome(PASS, f"with its controller {dead} down it was built in {took:.2f} s and serves")
        with StandinController() as controller:
            if case.kind == "second_worker_port":
                return _second_port(build, controller.address)
            named = free_loopback_port() if case.kind == "named_worker_port" else 0
            manager = build(named, controller.address)
            got = controller.registrations(1, REGISTRATION_WAIT_S)
            if got:
                got = controller.registrations(2, REPEAT_WAIT_S)
        return _judge(manager, got, named, worker_id, node_id, iut)
    finally:
        for manager in made:
            iut.library.close_manager(manager)


def _second_port(build, controller: str) -> Outcome:
    """A second manager naming another worker port than the first's worker
    listens on: refused, or listening there, never told another port."""
    first = build(0, controller).get_raiden_worker_port()
    named = free_loopback_port()
    try:
        second = build(named, controller).get_raiden_worker_port()
    except Exception as e:  # whatever the library raises is its refusal
        return Outcome(PASS, f"a second manager naming worker port {named} while the worker listens on {first} "
                       f"was refused: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
    listens = named in listening_ports()
    if second != named or not listens:
        return Outcome(ERROR, f"a second manager naming worker port {named} was built and says worker port "
                       f"{second} (the first's is {first}); it listens on {named}: {listens}")
    return Outcome(PASS, f"a second manager's worker listens on the port it named, {named}")


def _judge(manager, got: list[dict], named: int, worker_id: str, node_id: int, iut: Adapter) -> Outcome:
    port, listening = manager.get_raiden_worker_port(), listening_ports()
    if len(got) != 1:
        return Outcome(ERROR, f"the controller received {len(got)} registrations for one manager, not 1 (it "
                       f"waits {REGISTRATION_WAIT_S:.0f} s for the first, then {REPEAT_WAIT_S:.0f} s for a repeat)")
    reg = got[0]
    problems = []
    if named and port != named:
        problems.append(f"asked for worker port {named}, it says {port}")
    if port <= 0 or port not in listening:
        problems.append(f"its worker port {port} is not one this process listens on")
    if _port(reg.get("raiden_worker_endpoint", "")) != port:
        problems.append(f"it registered worker endpoint {reg.get('raiden_worker_endpoint')!r}, its port is {port}")
    if reg.get("worker_id") != worker_id or int(reg.get("node_id", 0)) != node_id:
        problems.append(f"it registered worker {reg.get('worker_id')!r} on node {reg.get('node_id', 0)}, "
                        f"given {worker_id!r} on node {node_id}")
    endpoints = reg.get("raiden_transfer_endpoints", [])
    parts = [int(s) for e in endpoints for s in e.get("shards", [])]
    shards = int(reg.get("num_kv_shards", 0))
    unserved = [e.get("endpoint") for e in endpoints if _port(e.get("endpoint", "")) not in listening]
    if not endpoints or unserved:
        problems.append(f"it registered transfer endpoints {[e.get('endpoint') for e in endpoints]}, of which "
                        f"{unserved} this process does not listen on")
    if shards < 1 or sorted(parts) != list(range(shards)):
        problems.append(f"its transfer endpoints hold parts {parts} of a block of {shards} shards, not each once")
    # A block's bytes as the device lays the layer out (its rows are byte ranges on every generation).
    expected = [iut.layout(key).physical_size_bytes // key.dims[0] // max(shards, 1) for key in KEYS]
    sizes = [int(b) for b in reg.get("block_array_bytes", [])]
    if sizes != expected:
        problems.append(f"it registered block bytes {sizes} for layers of {expected} bytes a block")
    if problems:
        return Outcome(ERROR, "; ".join(problems))
    return Outcome(PASS, f"it registered worker {worker_id!r} at port {port} with transfer endpoints "
                   f"{[e['endpoint'] for e in endpoints]} and block bytes {sizes}")


def _port(endpoint: str) -> int:
    tail = endpoint.rpartition(":")[2]
    return int(tail) if tail.isascii() and tail.isdigit() else -1
