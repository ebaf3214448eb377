"""Pulls between two managers that must not land: requests refused at the
call that receives them, pulls that fail (the producer killed, a refused
connection, a remote that never answers, the consumer's manager dropped),
and the sockets a manager listens on. Each runs as a producer and a
consumer worker (probes.run.pair)."""

from __future__ import annotations

import os
import signal
import socket
import time

import kvref
from kvref.polling import wait_for
from probes.iut.adapter import Adapter
from probes.suite.cases import Case
from probes.suite.pull_sides import (FAILING_TIMEOUT_S, PEER_WAIT_S, PROMPT_S, SETTLE_GRACE_S, SUBJECT,
                                     Side, endpoint_for, no_pulls, poll, pull_library, uuid_of)
from probes.suite.refusals import first_line
from probes.iut.sockets import free_loopback_port, listeners, loopback_bytes, socket_inodes
from probes.suite.verdicts import CORRUPT, ERROR, PASS, SKIP, Outcome

REFUSAL_KINDS = ("lengths", "empty_endpoint", "local_out_of_range", "uuid_in_use", "register_out_of_range",
                 "register_uuid_in_use", "remote_unregistered", "settings")
BAD_SETTINGS = (("timeout_s", 0.0), ("timeout_s", -1.0), ("timeout_s", float("nan")), ("max_blocks", 0))
FAILURE_KINDS = ("producer_killed", "connection_refused", "silent_remote", "manager_dropped")
PULLED = 16  # blocks a refused request names
DIES = "dies"  # what a side posts before it kills itself (probes.run.runner reads it)
KILL_AT_SHARE = 0.25  # the producer dies once this share of the pull's bytes has crossed lo
# Or once this long has passed since the pull started: a loaded machine may take seconds to get a pull's bytes
# moving. The consumer's timeout_s is twice that (KILLED_TIMEOUT_S): the kill, not the timeout, must end the
# pull, so it must fail before its own deadline, which leaves a loaded machine seconds to see it.
KILL_WAIT_S = 10.0
KILLED_TIMEOUT_S = 2 * KILL_WAIT_S
# What the producer posts before it dies: whether the pull was under way, and when (the wall clock: the two
# sides may be two hosts), so the consumer judges how soon the failure came from the kill, not from its start.
KILLED_UNDER_WAY = "killed-under-way"
# A pull big enough to be in flight when its producer dies: 16 MiB a layer.
LARGE = kvref.ShapeKey(SUBJECT.dtype, (SUBJECT.dims[0], SUBJECT.dims[1], SUBJECT.dims[2] * 4))


def pull_refusals(case: Case, iut: Adapter) -> Outcome:
    """A request that cannot be carried out must be refused by the call that
    receives it, naming it: start_read with lists of different lengths, an
    empty endpoint, a local block out of range, or a uuid still being pulled;
    register_read with a block out of range or a uuid still registered. A
    pull of blocks the producer never registered cannot be refused by
    start_read: it must be reported failed before timeout_s, the consumer's
    blocks as they were."""
    lib = pull_library(iut)
    if lib is None:
        return no_pulls(iut)
    side = Side(case, iut, lib)
    blocks = SUBJECT.dims[0]
    uuid = uuid_of(case)
    try:
        side.build(timeout_s=FAILING_TIMEOUT_S)
        if side.producer:
            outcome = Outcome(PASS, "registered; nothing to judge on this side")
            if case.kind == "register_out_of_range":
                outcome = _expect_refusal(side, f"register_read with block {blocks}",
                                          lambda: side.manager.register_read("req-0", uuid, [0, blocks]))
            else:
                side.manager.register_read("req-0", uuid, list(range(PULLED)))
            if case.kind == "register_uuid_in_use":
                outcome = _expect_refusal(side, f"a second register_read under uuid {uuid}",
                                          lambda: side.manager.register_read("req-1", uuid, [PULLED]))
            side.rendezvous.post("registered", side.manager.get_local_endpoints())
            side.rendezvous.wait("finished", PEER_WAIT_S)
            return outcome
        endpoints = side.rendezvous.wait("registered", PEER_WAIT_S)
        try:
            if case.kind.startswith("register_"):
                return Outcome(PASS, "the refusal is the producer's; nothing to judge on this side")
            return _refused_pull(side, case.kind, endpoint_for(endpoints), uuid)
        finally:
            side.rendezvous.post("finished")
    finally:
        side.close()


def _refused_settings(side: Side) -> Outcome:
    """A pulling manager built with a setting that means nothing must be refused by its constructor."""
    for name, value in BAD_SETTINGS:
        settings = {"timeout_s": FAILING_TIMEOUT_S, "max_blocks": SUBJECT.dims[0], name: value}
        try:
            manager = side.lib.pull_manager(side.caches, "slots", False, settings["timeout_s"], settings["max_blocks"])
        except Exception as e:
            if not side.iut.refuses(e):
                return Outcome(ERROR, f"a manager built with {name}={value}: {first_line(e)}, not a clean refusal")
            continue
        side.lib.close_manager(manager)
        return Outcome(ERROR, f"a manager built with {name}={value} was accepted; a pull's {name} must be positive"
                       + (" and finite" if name == "timeout_s" else ""))
    return Outcome(PASS, f"refused at construction: {', '.join(f'{n}={v}' for n, v in BAD_SETTINGS)}")


def _refused_pull(side: Side, kind: str, endpoint, uuid: int) -> Outcome:
    blocks = SUBJECT.dims[0]
    if kind == "settings":
        return _refused_settings(side)
    remote, local = list(range(PULLED)), list(range(PULLED, 2 * PULLED))
    start = side.manager.start_read
    if kind == "lengths":
        return _expect_refusal(side, f"start_read of {PULLED} remote blocks into {PULLED - 1} local ones",
                               lambda: start("req-0", uuid, endpoint, remote, local[:-1]))
    if kind == "empty_endpoint":
        for empty in ("", []):
            outcome = _expect_refusal(side, f"start_read from remote_endpoint={empty!r}",
                                      lambda: start(f"req-{empty!r}", uuid, empty, remote, local))
            if outcome.verdict != PASS:
                return outcome
        return outcome
    if kind == "local_out_of_range":
        return _expect_refusal(side, f"start_read into local block {blocks}",
                               lambda: start("req-0", uuid, endpoint, remote, [*local[:-1], blocks]))
    if kind == "uuid_in_use":
        with _silent_listener() as silent:
            start("req-silent", uuid, silent, remote, local)
            return _expect_refusal(side, f"a second start_read under uuid {uuid}, still being pulled",
                                   lambda: start("req-1", uuid, endpoint, remote, [b + PULLED for b in local]))
    if kind == "remote_unregistered":
        started = time.monotonic()
        start("req-0", uuid, endpoint, [blocks - 1 - b for b in remote], local)
        return _expect_failed(side, "req-0", started, PROMPT_S, "a pull of blocks never registered")
    raise ValueError(f"unknown refusal kind {kind!r}")


def _expect_refusal(side: Side, what: str, call) -> Outcome:
    """`call` must raise the library's refusal; one that is accepted is
    followed until it settles, to say what happened instead."""
    started = time.monotonic()
    try:
        call()
    except Exception as e:
        if side.iut.refuses(e):
            return Outcome(PASS, f"{what}: refused at the call ({first_line(e)})")
        return Outcome(ERROR, f"{what}: raised {first_line(e)}, which is not a clean refusal")
    if side.producer:
        return Outcome(ERROR, f"{what}: accepted")
    later = poll(side.manager, started, lambda s: bool(s.done or s.failed), FAILING_TIMEOUT_S + SETTLE_GRACE_S)
    after = (f"then reported failed {max(later.failed.values()):.1f}s later" if later.failed else
             "then reported done" if later.done else "and never reported")
    return Outcome(ERROR, f"{what}: accepted, {after} (timeout_s={FAILING_TIMEOUT_S}s)")


def _expect_failed(side: Side, req: str, started: float, within: float, what: str, settled=None,
                   timeout_s: float = FAILING_TIMEOUT_S) -> Outcome:
    """`req` must be reported failed within `within` seconds of `started`
    (PROMPT_S for a failure the manager sees at once; timeout_s and a grace
    for a remote that never answers), once, and leave every local block as
    it was. `settled`: what polling has seen already."""
    bound = max(within, timeout_s) + SETTLE_GRACE_S
    settled = settled or poll(side.manager, started, lambda s: s.state(req) != "unsettled", bound)
    state = settled.state(req)
    if state != "failed":
        return Outcome(ERROR, f"{what}: {state if state != 'unsettled' else 'never reported'} "
                       f"(polled {bound:.0f}s; timeout_s={timeout_s:g}s)")
    seconds = settled.failed[req]
    if seconds > within:
        return Outcome(ERROR, f"{what}: reported failed only after {seconds:.1f}s (timeout_s={timeout_s:g}s); "
                       f"a failure the manager can see at once is expected within {within:.1f}s")
    if settled.twice:
        return Outcome(ERROR, f"{what}: reported {sorted(set(settled.twice))} more than once")
    changed = side.unchanged()
    if changed:
        return Outcome(CORRUPT, f"{what}: reported failed, yet {changed}")
    reason = side.lib.pull_failure(side.manager, req)
    return Outcome(PASS, f"{what}: failed after {seconds:.2f}s, the local blocks as they were"
                   + (f" ({reason.strip().splitlines()[0][:160]})" if reason.strip() else ""), seconds=seconds)


class _silent_listener:
    """A loopback socket that takes connections into its backlog and never
    answers: a remote that never replies. Its 'host:port' on entry."""

    def __enter__(self) -> str:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def __exit__(self, *exc) -> None:
        self.sock.close()


def pull_failures(case: Case, iut: Adapter) -> Outcome:
    """Pulls that cannot land must be reported failed, once, and leave the
    consumer's blocks as they were: the producer killed once the pull is
    under way (from the kill, which the producer posts as it dies: before
    the consumer's timeout_s would have ended the pull, so neither a
    machine slow to get the pull moving nor one slow to poll is counted
    against the manager), a refused connection (promptly), a
    remote that accepts and never answers (by timeout_s, the consumer polling
    past it). The consumer's manager dropped mid-pull must take its threads
    and sockets with it, and the producer's request must still be reported
    done sending by its timeout."""
    lib = pull_library(iut)
    if lib is None:
        return no_pulls(iut)
    side = Side(case, iut, lib, key=LARGE if case.kind == "producer_killed" else SUBJECT)
    blocks = side.key.dims[0]
    uuid = uuid_of(case)
    everything = list(range(blocks))
    try:
        if side.producer:
            side.build(timeout_s=FAILING_TIMEOUT_S)
            side.manager.register_read("req-0", uuid, everything)
            side.rendezvous.post("registered", side.manager.get_local_endpoints())
            if case.kind == "producer_killed":
                sent = loopback_bytes()
                side.rendezvous.wait("started", PEER_WAIT_S)
                under_way = _until_under_way(sent + side.pull_bytes(len(everything)) * KILL_AT_SHARE)
                side.rendezvous.post(KILLED_UNDER_WAY, {"under_way": under_way, "at": time.time()})
                side.rendezvous.post(DIES)
                os.kill(os.getpid(), signal.SIGKILL)
            side.rendezvous.wait("finished", PEER_WAIT_S)
            if case.kind != "manager_dropped":
                return Outcome(PASS, "registered; nothing to judge on this side")
            return _freed_after_drop(side)
        endpoints = side.rendezvous.wait("registered", PEER_WAIT_S)
        try:
            if case.kind == "manager_dropped":
                return _dropped_mid_pull(side, endpoint_for(endpoints), uuid, everything)
            side.build(timeout_s=KILLED_TIMEOUT_S if case.kind == "producer_killed" else FAILING_TIMEOUT_S)
            return _failed_pull(side, case.kind, endpoint_for(endpoints), uuid, everything)
        finally:
            side.rendezvous.post("finished")
    finally:
        side.close()


def _until_under_way(sent: float) -> bool:
    """Until `sent` bytes have crossed lo (a pull part-way through, whatever its
    transport), or KILL_WAIT_S: whether they had."""
    return wait_for(lambda: loopback_bytes() >= sent, KILL_WAIT_S, 0.001)


def _freed_after_drop(side: Side) -> Outcome:
    """The producer's side of a consumer dropped mid-pull: by its timeout the
    request must be done sending, which is when a serving stack frees its
    blocks (a failure the producer reports frees nothing)."""
    bound = FAILING_TIMEOUT_S + SETTLE_GRACE_S
    told = poll(side.manager, time.monotonic(), lambda s: "req-0" in s.sent or "req-0" in s.failed, bound)
    if "req-0" in told.sent:
        return Outcome(PASS, f"the dropped consumer's request was reported done sending after {told.sent['req-0']:.1f}s")
    if "req-0" in told.failed:
        return Outcome(ERROR, "the request whose consumer was dropped mid-pull was reported in failed_recving "
                       f"after {told.failed['req-0']:.1f}s, never done sending: a serving stack frees a "
                       "producer's blocks on done_sending only, so they are never freed")
    return Outcome(ERROR, f"the request whose consumer was dropped mid-pull was never reported (polled {bound:.0f}s)")


def _failed_pull(side: Side, kind: str, endpoint, uuid: int, everything: list[int]) -> Outcome:
    local = everything[::-1]
    started = time.monotonic()
    if kind == "producer_killed":
        side.manager.start_read("req-0", uuid, endpoint, everything, local)
        side.rendezvous.post("started")
        killed = side.rendezvous.wait(KILLED_UNDER_WAY, PEER_WAIT_S)
        at = time.monotonic() - max(0.0, time.time() - killed["at"])  # the kill, on this side's clock
        settled = poll(side.manager, at, lambda s: s.state("req-0") != "unsettled",
                       KILLED_TIMEOUT_S + SETTLE_GRACE_S)
        if settled.state("req-0") == "done" and not side.check_blocks(list(zip(everything, local))):
            return Outcome(SKIP, "the pull landed before its producer died: no failure to judge")
        if not killed["under_way"]:
            return Outcome(ERROR, f"nothing in flight: {KILL_AT_SHARE:.0%} of the pull's bytes had not crossed lo "
                           f"within {KILL_WAIT_S:.0f}s when its producer was killed, so no pull was cut part-way")
        before_deadline = started + KILLED_TIMEOUT_S - at  # from the kill: a failure at timeout_s comes after it
        if before_deadline <= 0:
            return Outcome(SKIP, f"the producer was killed {-before_deadline:.1f}s after the consumer's timeout_s "
                                 "had passed: a failure from the kill cannot be told from one at the timeout")
        return _expect_failed(side, "req-0", at, before_deadline, "a pull whose producer was killed (timed from the "
                              "kill; it must fail from the kill, before the consumer's timeout_s ends it)", settled,
                              KILLED_TIMEOUT_S)
    if kind == "connection_refused":
        side.manager.start_read("req-0", uuid, f"127.0.0.1:{free_loopback_port()}", everything, local)
        return _expect_failed(side, "req-0", started, PROMPT_S, "a pull from a port nothing listens on")
    if kind == "silent_remote":
        with _silent_listener() as silent:
            side.manager.start_read("req-0", uuid, silent, everything, local)
            return _expect_failed(side, "req-0", started, FAILING_TIMEOUT_S + SETTLE_GRACE_S,
                                  "a pull from a remote that never answers")
    raise ValueError(f"unknown failure kind {kind!r}")


def _dropped_mid_pull(side: Side, endpoint, uuid: int, everything: list[int]) -> Outcome:
    """Build and close one manager first (what the library starts once stays),
    then count this process's threads and sockets; a second manager, closed
    right after its pull starts, must leave no more of either."""
    side.build(timeout_s=FAILING_TIMEOUT_S)
    side.drop()
    threads, sockets = _threads(), len(socket_inodes())
    side.build(timeout_s=FAILING_TIMEOUT_S)
    side.manager.start_read("req-0", uuid, endpoint, everything, everything[::-1])
    side.drop()
    wait_for(lambda: not _left_behind(threads, sockets), SETTLE_GRACE_S, 0.05)
    if left := _left_behind(threads, sockets):
        return Outcome(ERROR, f"a manager closed mid-pull left {' and '.join(left)} behind "
                       f"({SETTLE_GRACE_S:.0f}s after)")
    return Outcome(PASS, "a manager closed mid-pull left no thread or socket behind")


def _threads() -> int:
    """Every thread of this process, the library's native ones too."""
    return len(os.listdir("/proc/self/task"))


def _left_behind(threads: int, sockets: int) -> list[str]:
    """The threads and sockets this process holds beyond the counts given."""
    extra = (_threads() - threads, len(socket_inodes()) - sockets)
    return [f"{n} {what}" for n, what in zip(extra, ("thread(s)", "socket(s)")) if n > 0]


def pull_sockets(case: Case, iut: Adapter) -> Outcome:
    """What each manager listens on, read from this worker's /proc: the
    producer's listeners (built to serve pulls on loopback) must all be on
    a loopback address, none on a wildcard address (every interface); the
    consumer's manager, built only to offload and pull, must open no
    listening socket at all."""
    lib = pull_library(iut)
    if lib is None:
        return no_pulls(iut)
    side = Side(case, iut, lib)
    try:
        before = set(listeners())
        side.build(form="slots" if side.producer else "pool")
        opened = [l for l in listeners() if l not in before]
        side.rendezvous.post("built")
        side.rendezvous.wait("built", PEER_WAIT_S)
        if side.producer:
            exposed = [str(l) for l in opened if not l.loopback]
            if not opened:
                return Outcome(ERROR, "a manager built to serve pulls opened no listening socket")
            if exposed:
                wild = [str(l) for l in opened if l.wildcard]
                return Outcome(ERROR, f"listens on {', '.join(exposed)}"
                               + (" (a wildcard address: every interface of the host)" if wild else "")
                               + f"; asked to serve pulls on loopback. All its listeners: "
                               f"{', '.join(map(str, opened))}")
            side.drop()
            wait_for(lambda: not any(l in opened for l in listeners()), SETTLE_GRACE_S, 0.05)
            if left := [l for l in listeners() if l in opened]:
                return Outcome(ERROR, f"still listening on {', '.join(map(str, left))} {SETTLE_GRACE_S:.0f}s after "
                               "the manager was closed")
            return Outcome(PASS, f"listened only on loopback ({', '.join(map(str, opened))}), and no more once "
                           "closed")
        if opened:
            return Outcome(ERROR, f"an offload-only manager opened listening socket(s) {', '.join(map(str, opened))}")
        return Outcome(PASS, "an offload-only manager opened no listening socket")
    finally:
        side.close()

