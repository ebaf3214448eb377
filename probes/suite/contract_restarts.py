"""Process death and restart, as faults of the pull world: at any step,
pulls in flight or not, a manager goes (killed with SIGKILL, no clean exit,
as a host's process dies; or closed as its library closes a manager) and
one in a process of its own takes its place
(probes.suite.manager_process), with the same settings or changed ones:
for the producer the same identity (its port) or another, for either the
same geometry or the world's other one, caches of new contents.

What the model says the survivors and the newcomer see. When the producer
goes: a pull in flight from it may land or fail, and settles within its
timeout; the registrations went with it, so a later pull of one of their
uuids fails, even from a newcomer on the same port; every later pull of a
newcomer's registration lands exactly where its blocks are the consumer's
size, and fails writing nothing where they are not. When a consumer goes:
its pulls in flight go with it; the producer and the other consumer go on,
and the newcomer's pulls land or fail as any consumer's. The offload
manager beside them is judged as before. The first restart of a manager
that lives in the worker closes it (a worker cannot kill itself and go on);
later ones kill or close the manager's process."""

from __future__ import annotations

import numpy as np

from probes.iut.protocol import PortLibrary
from probes.iut.sockets import free_loopback_port
from probes.suite.contract_pulls import replace_consumer, replace_producer, world
from probes.suite.contract_rules import Session
from probes.suite.manager_process import ManagerProcess

# Each restart starts a process (a second or more of imports): drawn in RESTART_SEQUENCES of the sequences,
# for RESTART_DRAWN of their pull steps, at most MOST_RESTARTS times in one.
RESTART_SEQUENCES = 0.1
CAMPAIGN_RESTART_SEQUENCES = 0.4  # a campaign spends its time where a probe's budget cannot (spec "restarts")
RESTART_DRAWN = 0.05
MOST_RESTARTS = 2
SEED_BASE = 5000  # a newcomer's contents: no layer of the session's caches has these seeds


def restart_producer(session: Session, index: int, step: dict) -> None:
    """The producer goes as `step["how"]` says, and another takes its place:
    on its port (`same_port`) or another, over caches of its own geometry
    or the second consumer's (`geometry`: "same" or "other")."""
    w = world(session)
    key = w.keys[0] if step["geometry"] == "same" else w.other_geometry(w.keys[0])
    replace_producer(session, w, step["how"], key, _port(session, w, step["same_port"]), SEED_BASE + step["seed"])


def restart_consumer(session: Session, index: int, step: dict) -> None:
    """A consumer goes as `step["how"]` says, pulls in flight or not, and
    another takes its place, over caches of its geometry or the other one."""
    w = world(session)
    n = 1 + step["consumer"]
    key = w.keys[n] if step["geometry"] == "same" else w.other_geometry(w.keys[n])
    replace_consumer(session, w, step["consumer"], step["how"], key, SEED_BASE + step["seed"])


def _port(session: Session, w, same: bool) -> int:
    """The newcomer's port: the one the producer listens on (its identity),
    or a free one; 0 (one it picks) where its library takes no port."""
    if not isinstance(session.iut.library, PortLibrary):
        return 0
    if same and isinstance(w.managers[0], ManagerProcess) and w.port:
        return w.port
    if same:
        endpoints = w.managers[0].get_local_endpoints()
        address = endpoints[0].get("endpoint") if endpoints and isinstance(endpoints[0], dict) else None
        if isinstance(address, str) and address.rpartition(":")[2].isdigit():
            return int(address.rpartition(":")[2])
    return free_loopback_port()


def draw_restart(session: Session) -> dict | None:
    """A restart, now and then, once the pull world is up: from a stream of
    its own (as serving steps are), so a seed draws the same other steps
    whether or not restarts are drawn."""
    w = getattr(session, "pulls", None)
    if w is None or session.iut.iut.owns_device:  # a second process cannot open the device the worker holds
        return None
    w.draws += 1
    share = session.spec.get("restarts", RESTART_SEQUENCES)
    if w.restarts >= MOST_RESTARTS or np.random.default_rng([session.seed, 13]).random() >= share:
        return None
    own = np.random.default_rng([session.seed, w.draws, 11])
    if own.random() >= RESTART_DRAWN:
        return None
    w.restarts += 1
    how, geometry = "kill" if own.random() < 0.7 else "close", "same" if own.random() < 0.8 else "other"
    if own.random() < 0.6:
        return {"rule": "restart_producer", "how": how, "same_port": bool(own.random() < 0.6), "geometry": geometry,
                "seed": int(own.integers(2**20))}
    return {"rule": "restart_consumer", "consumer": int(own.random() < 0.3), "how": how, "geometry": geometry,
            "seed": int(own.integers(2**20))}


RULES = {"restart_producer": restart_producer, "restart_consumer": restart_consumer}
