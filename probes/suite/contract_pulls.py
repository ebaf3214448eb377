"""Pulls between managers in the contract (kvref.pulls states the rules
the pull probes check): a producer registers a request's blocks under a
uuid, a consumer pulls them into blocks of its own, both poll for what
settled. In a sequence both managers live in the worker, beside the
offload manager, over caches of their own, and a second consumer has
blocks of another size (a geometry that differs).

What holds: a pull of registered blocks lands exactly (remote block i into
local block i, every layer); one the producer cannot serve (a uuid not
registered, a registration already pulled, blocks of another size) fails
and writes nothing; a pull whose registration comes LATE_BY_S after it
lands, and one whose registration comes past the manager's timeout_s
fails (a serving engine's producer registers in its next step, and its
consumer may be ahead: a producer waits for a registration up to its
timeout_s; the delay is drawn across that bound); one in flight when its producer goes
away may land or fail; a registration not pulled within timeout_s
expires, and is told done sending (the `expire` rule waits past that
bound, and a later pull of it fails); a request that cannot be carried
out is refused at the call that receives it; every accepted pull settles
exactly once, as done or failed, within its timeout; the producer tells
each registration done sending once. A consumer's telemetry (dump_metrics_to_string, where it has it) holds one
record of each pull that landed, with its request, uuid, blocks, bytes and
stages, and at most one of each that failed."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

import kvref
from kvref.polling import wait_for
from probes.iut.host_data import random_host
from probes.iut.protocol import NotInPlace, PullLibrary
from probes.suite.contract_rules import REFUSED, Broken, Session, exported, judged
from probes.suite.contract import Judgment, Must
from probes.suite.pull_sides import pull_bytes
from probes.suite.manager_process import ManagerProcess
from probes.suite.pull_telemetry import record_problem, records_in
from probes.suite.refusals import first_line
from probes.suite.verdicts import CORRUPT, ERROR

TIMEOUT_S = 6.0  # each consumer's timeout_s: a pull that cannot land fails within it
# The producer's: how long it keeps a registration no pull took, and how long a pull waits for its registration.
# As long as a consumer's: at 2 s, a registration a step under load left a second old expired before its pull
# reached it, and the reference earned an ERROR in a loaded test run.
PRODUCER_TIMEOUT_S = TIMEOUT_S
LATE_BY_S = 0.2  # how long an `early` pull's registration mostly comes after it: the pull reaches the producer first
# How late an `early` pull's registration comes, drawn across the bounds the API states: within the
# producer's timeout_s it must land; past the consumer's, it must have failed. The later ones are drawn
# rarely: each holds its sequence that long.
LATE_BY = ((LATE_BY_S, 0.9), (PRODUCER_TIMEOUT_S / 2, 0.08), (TIMEOUT_S + 2.0, 0.02))
# A registration not pulled within the producer's timeout_s expires (told done sending). One
# younger than FRESH_S must still be served; an older one may have expired
# (a loaded machine, or a model step that compiles, takes seconds).
FRESH_S = PRODUCER_TIMEOUT_S / 2
# The `expire` rule waits until every registration is EXPIRY_MARGIN_S past the producer's timeout_s, then
# gives the producer EXPIRY_GRACE_S more to say each is done sending (a loaded machine polls late).
EXPIRY_MARGIN_S = 1.0
EXPIRY_GRACE_S = 5.0
EXPIRY_DRAWN = 0.03  # of the pull steps drawn while registrations wait, once a sequence: it holds it T + 1 s
MAX_BLOCKS = 8  # the most blocks one pull moves
SETTLE_S = TIMEOUT_S + 10.0  # beyond which a pull that never settled is a finding (a loaded machine is slow)
POLL_S = 0.005
LEFT_BEHIND_S = 10.0  # for what cleans up after a dead process (a resource tracker) before its leftovers count
DONE, FAILED, EITHER = "done", "failed", "done or failed"


@dataclass
class Pull:
    uuid: int
    remote: list[int]
    local: list[int]
    consumer: int  # 0: the consumer of the same geometry; 1: the one whose blocks differ
    expect: str
    source: list[list[bytes]]  # per layer, the producer's remote blocks when it began (its producer may go)
    index: int = -1  # the step that started it: its key in the export model
    served: bool = True  # the producer had (or was to have) what it asks for: some bytes may cross
    settled: str = ""


@dataclass
class PullWorld:
    """The producer and the two consumers, and what the model knows of them."""

    lib: PullLibrary
    key: kvref.ShapeKey
    managers: list  # producer, consumer, consumer of another geometry
    keys: list[kvref.ShapeKey]
    blocks: list[list[list[bytes]]]  # per manager, per layer, per block
    caches: list[list]
    registrations: dict[int, list[int]] = field(default_factory=dict)  # uuid -> blocks, not yet pulled
    registered_at: dict[int, float] = field(default_factory=dict)  # uuid -> when its register_read was called
    registered_by: dict[int, str] = field(default_factory=dict)  # uuid -> the request that registered it
    expired: bool = False  # the sequence waited past the producer's timeout_s once (each wait costs seconds)
    pulled: set[int] = field(default_factory=set)  # uuids whose registration a pull took
    pulls: dict[str, Pull] = field(default_factory=dict)
    sent: set[str] = field(default_factory=set)  # requests the producer told done sending
    reasons: dict[str, str] = field(default_factory=dict)  # a failed pull's reason, as the library says it
    started: list[tuple[str, Pull]] = field(default_factory=list)  # every pull accepted, in order
    first_keys: tuple = ()  # the managers' geometries as the world was built
    port: int = 0  # the port of a producer in a process of its own (probes.suite.contract_restarts)
    draws: int = 0  # pull steps drawn: the key of the restarts' own stream
    restarts: int = 0  # restarts drawn

    def other_geometry(self, key: kvref.ShapeKey) -> kvref.ShapeKey:
        """Of the world's two geometries (the producer's first, the second consumer's first), the one `key` is not."""
        return self.shapes[1] if key == self.shapes[0] else self.shapes[0]

    @property
    def shapes(self) -> tuple[kvref.ShapeKey, kvref.ShapeKey]:
        return self.first_keys[0], self.first_keys[2]

    @property
    def rows(self) -> int:
        return self.key.dims[0]

    def fresh(self, uuid: int) -> bool:
        """Whether the registration under `uuid` must still be there."""
        return uuid in self.registrations and time.monotonic() - self.registered_at[uuid] < FRESH_S


def world(session: Session) -> PullWorld:
    """The session's pull managers, built at the first pull rule."""
    if getattr(session, "pulls", None) is None:
        lib = session.iut.library
        other = kvref.ShapeKey(session.key.dtype, (session.key.dims[0], session.key.dims[1] * 2, *session.key.dims[2:]))
        keys = [session.key, session.key, other]
        caches, blocks = [], []
        for n, key in enumerate(keys):
            own, own_blocks = session.own_caches(key, session.spec.get("seed", 0) + 100 * (n + 1))
            caches.append(own)
            blocks.append(own_blocks)
        try:
            managers = [lib.pull_manager(c, "slots", True, PRODUCER_TIMEOUT_S if n == 0 else TIMEOUT_S, MAX_BLOCKS)
                        for n, c in enumerate(caches)]
        except Exception as e:  # these caches are addressable: building a pull manager must work
            raise Broken(ERROR, f"a pull manager could not be built: {type(e).__name__}: {e}") from e
        session.pulls = PullWorld(lib, session.key, managers, keys, blocks, caches, first_keys=tuple(keys))
        exported(session, lambda e: e.pools_unknown())  # a pull manager's pool is the library's to size
        session.closers.append(lambda: close_pull_managers(session.pulls))
    return session.pulls


def register(session: Session, index: int, step: dict) -> None:
    """register_read on the producer: valid blocks (True), or a block out of range (refused)."""
    w = world(session)
    uuid = step["uuid"]
    if any(p.uuid == uuid and not p.settled and p.expect != DONE for p in w.pulls.values()):
        return  # a pull in flight that names it may yet find it: the `early` pull's case, not this one's
    blocks_ok = all(0 <= b < w.rows for b in step["blocks"]) and len(set(step["blocks"])) == len(step["blocks"])
    valid = blocks_ok and uuid not in w.registrations
    # A uuid whose pull took it may be used again once that pull settled, which
    # its producer may know before the model has polled, or not yet; so may
    # one whose registration may have expired.
    if blocks_ok and uuid in w.registrations and not w.fresh(uuid):
        valid, judgment = True, Judgment(Must.EITHER, "a uuid whose registration may have expired, used again")
    elif valid and uuid in w.pulled:
        judgment = Judgment(Must.EITHER, "a uuid a pull took, used again")
    else:
        judgment = Judgment(Must.DO if valid else Must.REFUSE, "" if valid else "a block out of range or a uuid in use")
    called = time.monotonic()
    said = judged(session, judgment, f"register_read {step['req']} uuid {step['uuid']} {step['blocks']}",
                  lambda: w.managers[0].register_read(step["req"], step["uuid"], step["blocks"]))
    if said is REFUSED:
        return
    if said is False:  # register_read says no: a refusal, which the judgment may allow
        if judgment.must == Must.DO:
            raise Broken(ERROR, f"register_read {step['req']} {step['blocks']}: False for a valid registration")
        return
    if not valid:
        raise Broken(ERROR, f"register_read {step['req']} {step['blocks']}: accepted; it must be refused")
    w.pulled.discard(uuid)
    w.registrations[uuid] = list(step["blocks"])
    w.registered_at[uuid], w.registered_by[uuid] = called, step["req"]
    if w.caches[0] is not None:  # the producer is in this process: a registration no pull lands may count as failed
        exported(session, lambda e: e.registered(("registered", uuid)))


def pull(session: Session, index: int, step: dict) -> None:
    """start_read on a consumer: of a registration (landing exactly, paired
    in the order given), of a uuid not registered, or into blocks of
    another size."""
    w = world(session)
    consumer, uuid = step["consumer"], step["uuid"]
    busy = {b for p in w.pulls.values() if not p.settled and p.consumer == consumer for b in p.local}
    if step["req"] in w.pulls or busy & set(step["local"]):
        return  # a replay without the steps that made these free
    bad = _bad_pull(step["remote"], step["local"], w.rows)
    if bad:
        refused = judged(session, Judgment(Must.REFUSE, bad), f"start_read {step['req']} {step['remote']} -> "
                         f"{step['local']}", lambda: w.managers[1 + consumer].start_read(
                             step["req"], uuid, "127.0.0.1:1", step["remote"], step["local"]))
        assert refused is REFUSED  # judged raises for anything else
        return
    registered = w.registrations.get(uuid)
    fits = w.keys[1 + consumer] == w.keys[0]  # its blocks are the producer's size
    if registered is not None and fits and list(step["remote"]) == [registered[i] for i in step["pick"]]:
        expect = DONE if w.fresh(uuid) else EITHER
    elif step.get("early") and registered is None and uuid not in w.pulled and consumer == 0 and fits:
        # registered after the pull began: the producer waits for it up to its timeout_s
        expect = DONE if _late_by(step) < PRODUCER_TIMEOUT_S else FAILED if _late_by(step) > TIMEOUT_S else EITHER
    else:
        expect = FAILED
    endpoint = w.managers[0].get_local_endpoints()
    endpoint = endpoint[0]["endpoint"] if len(endpoint) == 1 else endpoint
    judgment = Judgment(Must.DO if expect == DONE else Must.EITHER, "a pull the producer cannot serve may be "
                        "refused at start_read, or fail")
    if any(p.uuid == uuid and p.consumer == consumer and not p.settled for p in w.pulls.values()):
        # Which of the two the producer serves is a race, as is whether the first settled already.
        judgment = Judgment(Must.EITHER, "a uuid a pull in flight on this consumer may still use: refused, or "
                                         "pulled")
        expect = EITHER if expect == DONE else expect
    if step.get("drop") and session.iut.backend == "sim":  # slow the producer's copies, so it goes mid-pull
        for cache in w.caches[0] or ():
            session.iut.hold_copies(cache, 0.5)
    served = registered is not None or bool(step.get("early")) or any(
        p.uuid == uuid and not p.settled for p in w.pulls.values())
    started = judged(session, judgment, f"start_read {step['req']} uuid {uuid} {step['remote']} -> {step['local']}",
                     lambda: w.managers[1 + consumer].start_read(step["req"], uuid, endpoint, step["remote"],
                                                                 step["local"], step.get("parallelism", 1)))
    if started is REFUSED:
        return
    exported(session, lambda e: _may_count(e, session, w, len(step["local"]), consumer))
    crossing = len(step["remote"]) * session.block_bytes(w.keys[0]) * len(w.blocks[0])  # as the device counters
    exported(session, lambda e: e.pull_begun(("pull", index), crossing, w.caches[0] is not None,
                                             w.caches[1 + consumer] is not None,
                                             (len(w.blocks[0]), len(w.blocks[1 + consumer]))))
    if registered is not None and expect != FAILED:
        w.pulled.add(uuid)
        del w.registrations[uuid]
    source = [[layer[r] if 0 <= r < len(layer) else b"" for r in step["remote"]] for layer in w.blocks[0]]
    w.pulls[step["req"]] = Pull(uuid, list(step["remote"]), list(step["local"]), consumer, expect, source, index,
                                served)
    w.started.append((step["req"], w.pulls[step["req"]]))
    if step.get("drop"):  # the producer dies in the middle of the pull
        drop_producer(session, index, step)
    if step.get("early") and registered is None and uuid not in w.pulled and consumer == 0:
        # Its registration comes after it: taken by the pull that waits for it, or (past timeout_s) left.
        time.sleep(_late_by(step))
        judged(session, Judgment(Must.DO, "a registration its pull came before, which waits for it"),
               f"register_read {step['req']} {_late_by(step):g} s after its pull",
               lambda: w.managers[0].register_read(step["req"], uuid, step["remote"]))
        if expect == FAILED:
            w.registrations[uuid], w.registered_at[uuid] = list(step["remote"]), time.monotonic()
            w.registered_by[uuid] = step["req"]
        else:
            w.pulled.add(uuid)


def _may_count(exports, session: Session, w: PullWorld, blocks: int, consumer: int) -> None:
    """A pull's bytes may count as a device transfer on either side, once:
    the producer's read of its blocks (d2h), the consumer's write (h2d)."""
    for d2h, n in ((True, 0), (False, 1 + consumer)):
        if w.caches[n] is not None:  # a producer in a process of its own counts there
            layers = len(w.caches[n])  # its time: up to a sample per block of each layer
            exports.maybe(d2h, blocks * session.block_bytes(w.keys[n]) * layers, blocks * layers, may_fail=False)


def _late_by(step: dict) -> float:
    return float(step.get("late_by", LATE_BY_S))


def serve(session: Session, index: int, step: dict) -> None:
    """A serving step on one pull manager's caches, pulls in flight or not:
    it writes blocks that no pull in flight reads or writes (a scheduler
    keeps a request's blocks out of the step until its transfer settles),
    taking each layer's cache donated and writing it in place, dispatched
    and not awaited. Pulls in flight must land all the same, and later pulls
    carry the new contents."""
    w = world(session)
    n, key = step["manager"], w.keys[step["manager"]]
    blocks = [b for b in step["blocks"] if b not in _in_flight(w, n)]  # a replay may name blocks busy now
    if not blocks or w.caches[n] is None:  # a producer in a process of its own steps there, not here
        return
    shape = kvref.ShapeKey(key.dtype, (len(blocks), *key.dims[1:]))
    for n_step in range(step.get("steps", 1)):  # one after another, as a serving loop dispatches them
        for layer, cache in enumerate(w.caches[n]):
            values = random_host(shape, step["seed"] + 1000 * n_step + layer, finite=True)
            try:
                w.caches[n][layer] = session.iut.update_blocks(cache, blocks, values)
            except NotInPlace as e:  # JAX CPU keeps a donated cache in place unless its buffer was held at dispatch
                raise Broken(ERROR, f"a serving step on {MANAGERS[n]}'s layer {layer}, beside its manager's pulls, "
                                    f"did not keep the cache in place: {e} (a thread that asks a cache for its "
                                    "buffer as a step is dispatched defeats the donation, and moves the cache)") from e
    for layer in range(len(w.caches[n])):
        values = random_host(shape, step["seed"] + 1000 * (step.get("steps", 1) - 1) + layer, finite=True)
        logical = np.zeros(key.dims, values.dtype)
        logical[blocks] = values
        new = session.blocks_of(key, logical)
        for b in blocks:
            w.blocks[n][layer][b] = new[b]


MANAGERS = ("the producer", "consumer 0", "consumer 1")


def _in_flight(w: PullWorld, n: int) -> set[int]:
    """Blocks of manager `n` a pull may still read (the producer's registered
    blocks, and those a pull in flight names) or write (a consumer's)."""
    if n == 0:
        registered = {b for blocks in w.registrations.values() for b in blocks}
        return registered | {b for p in w.pulls.values() if not p.settled for b in p.remote}
    return {b for p in w.pulls.values() if not p.settled and p.consumer == n - 1 for b in p.local}


def _bad_pull(remote, local, rows: int) -> str:
    """Why start_read must refuse a request at once, or ""."""
    if len(remote) != len(local):
        return "remote and local block lists of different lengths"
    if any(not 0 <= b < rows for b in local) or len(set(local)) != len(local):
        return "a local block out of range or named twice"
    if len(local) > MAX_BLOCKS:
        return f"more than the {MAX_BLOCKS} blocks a pull moves"
    return ""


def drop_producer(session: Session, index: int, step: dict) -> None:
    """The producer goes away (closed) with pulls still in flight, which may
    land or fail but must settle; a new producer over the same caches
    takes its place."""
    w = world(session)
    if isinstance(w.managers[0], ManagerProcess):  # the same settings, in a process again
        replace_producer(session, w, "close", w.keys[0], w.port, step.get("seed", index))
        return
    _producer_goes(w)
    for cache in w.caches[0] if session.iut.backend == "sim" else ():
        cache.release_dma_hold()  # copies held for the pull go on, and meet a producer closing
    w.lib.close_manager(w.managers[0])
    w.registrations.clear()
    try:
        w.managers[0] = w.lib.pull_manager(w.caches[0], "slots", True, PRODUCER_TIMEOUT_S, MAX_BLOCKS)
    except Exception as e:  # as at the first build
        raise Broken(ERROR, f"a pull manager could not be built again: {type(e).__name__}: {e}") from e
    w.sent.clear()


def _producer_goes(w: PullWorld) -> None:
    """A pull in flight from a producer that goes may land or fail."""
    for p in w.pulls.values():
        if not p.settled and p.expect == DONE:
            p.expect = EITHER


def replace_producer(session: Session, w: PullWorld, how: str, key: kvref.ShapeKey, port: int, seed: int) -> None:
    """The producer goes (`how`: "kill", SIGKILL where it is a process of its
    own; "close", as its library closes a manager), and one in a process of
    its own takes its place: caches of `key` whose layers hold random_host of
    seed, seed + 1, a manager on `port` (0: one it picks). Pulls in flight
    may land or fail; registrations go with the producer."""
    _producer_goes(w)
    _replace(session, w, 0, how, key, port, seed)
    w.registrations.clear()
    w.sent.clear()
    w.port = port


def replace_consumer(session: Session, w: PullWorld, consumer: int, how: str, key: kvref.ShapeKey,
                     seed: int) -> None:
    """A consumer goes as `how` says, and one in a process of its own takes
    its place, over caches of `key` holding random_host of seed, seed + 1.
    Its pulls in flight go with it (nothing is left to report them); the
    producer and the other consumer go on."""
    w.pulls = {req: p for req, p in w.pulls.items() if p.settled or p.consumer != consumer}
    _replace(session, w, 1 + consumer, how, key, 0, seed)


def _replace(session: Session, w: PullWorld, n: int, how: str, key: kvref.ShapeKey, port: int, seed: int) -> None:
    old = w.managers[n]
    if isinstance(old, ManagerProcess):
        old.kill() if how == "kill" else old.close()
    else:
        w.lib.close_manager(old)
    seeds = [seed + layer for layer in range(len(w.blocks[n]))]
    try:
        w.managers[n] = ManagerProcess(session.iut, key, seeds, port, PRODUCER_TIMEOUT_S if n == 0 else TIMEOUT_S,
                                       MAX_BLOCKS)
    except Exception as e:  # these caches are addressable: starting a manager must work
        raise Broken(ERROR, f"{MANAGERS[n]} could not be started in a process of its own after one was {how}d "
                            f"(port {port or 'its own'}, {key}): {first_line(e)}") from e
    w.keys[n], w.caches[n] = key, None
    w.blocks[n] = [session.blocks_of(key, random_host(key, s, finite=True)) for s in seeds]
    # A manager built without a shared-memory key names none that outlives it; what the newcomer takes
    # over (a fixed name it binds again) is not left behind.
    if isinstance(old, ManagerProcess) and (left := _left_behind(old, w.managers[n])):
        raise Broken(ERROR, f"{MANAGERS[n]}, {'killed' if how == 'kill' else 'closed'}, left behind "
                            f"{'; '.join(left[:3])}: nothing of its library's reclaims it now, and each restart "
                            "adds more")


def _left_behind(gone: ManagerProcess, successor: ManagerProcess) -> list[str]:
    """What a gone manager's process left behind (probes.suite.leftovers) that
    its successor did not take over, once whatever cleans up after a dead
    process (a resource tracker) had LEFT_BEHIND_S."""
    taken = successor.holdings()  # read once, not on every poll of the wait
    wait_for(lambda: not gone.left_behind(taken), LEFT_BEHIND_S, 0.05)
    return gone.left_behind(taken)


def close_pull_managers(w: PullWorld) -> None:
    for manager in w.managers:
        manager.close() if isinstance(manager, ManagerProcess) else w.lib.close_manager(manager)


def expire(session: Session, index: int, step: dict) -> None:
    """Time passes past the producer's timeout_s, the managers polled as an
    engine's loop polls them: every registration no pull took must expire,
    told done sending within EXPIRY_GRACE_S more, and a later pull of it
    fails."""
    w = world(session)
    due = {uuid: w.registered_at[uuid] + PRODUCER_TIMEOUT_S + EXPIRY_MARGIN_S for uuid in w.registrations}
    if not due:
        return  # a replay without the registrations
    # Polling as it waits, as an engine's loop asks get_finished every iteration while these wait to be pulled
    # (and as kvref's managers follow caches a step took on the caller's thread).
    until = time.monotonic() + max(0.0, min(max(due.values()) - time.monotonic(), PRODUCER_TIMEOUT_S + EXPIRY_MARGIN_S))
    wait_for(lambda: _poll(session, w) or time.monotonic() >= until, PRODUCER_TIMEOUT_S + EXPIRY_MARGIN_S, 0.05)
    wanted = {w.registered_by[uuid] for uuid in due}
    wait_for(lambda: _poll(session, w) or wanted <= w.sent, EXPIRY_GRACE_S, POLL_S)
    kept = sorted(wanted - w.sent)
    if kept:
        raise Broken(ERROR, f"registrations of {kept[:4]} were not told done sending "
                            f"{PRODUCER_TIMEOUT_S + EXPIRY_MARGIN_S + EXPIRY_GRACE_S:g} s after register_read, "
                            f"though no pull took them (the producer's timeout_s is {PRODUCER_TIMEOUT_S:g} s): "
                            "they never expire, and the engine never gets their blocks back")
    for uuid in due:
        del w.registrations[uuid]
    w.expired = True


def settle(session: Session, index: int, step: dict) -> None:
    """Poll until every pull settled: each exactly once, as the model says,
    within its timeout; then the consumers' blocks against the model."""
    w = world(session)
    wait_for(lambda: _poll(session, w) or all(p.settled for p in w.pulls.values()), SETTLE_S, POLL_S)
    for _ in range(3):  # a few polls more: nothing is reported again
        _poll(session, w)
    open_ = [req for req, p in w.pulls.items() if not p.settled]
    if open_:
        raise Broken(ERROR, f"pulls {open_[:4]} never settled within {SETTLE_S} s (timeout_s {TIMEOUT_S})")
    for consumer in (0, 1):
        for layer in range(len(w.blocks[1 + consumer])):
            wrong = _wrong_blocks(session, w, 1 + consumer, layer)
            if wrong:
                into = [f"{req} {p.settled} (uuid {p.uuid}, {p.remote} -> {p.local})" for req, p in w.started
                        if p.consumer == consumer and set(p.local) & set(wrong)]
                raise Broken(CORRUPT, f"consumer {consumer} layer {layer}: blocks {wrong[:8]} differ from the model "
                                      f"after its pulls settled (pulls into them: {'; '.join(into[-4:]) or 'none'})")
        _check_telemetry(w, consumer)
    w.pulls = {req: p for req, p in w.pulls.items() if not p.settled}


def _wrong_blocks(session: Session, w: PullWorld, n: int, layer: int) -> list[int]:
    """The blocks of manager `n`'s layer that differ from the model, read where its caches live."""
    manager = w.managers[n]
    if isinstance(manager, ManagerProcess):
        return session.wrong_in(w.keys[n], manager.fetch(layer), w.blocks[n][layer])
    return session.wrong_blocks(w.keys[n], w.caches[n][layer], w.blocks[n][layer])


def _check_telemetry(w: PullWorld, consumer: int) -> None:
    """The consumer's records against the pulls it accepted (all settled):
    one of each that landed, whole, at most one of each that failed."""
    dump = getattr(w.managers[1 + consumer], "dump_metrics_to_string", None)
    if not callable(dump):
        return
    records = records_in(dump())
    if isinstance(records, str):
        raise Broken(ERROR, f"consumer {consumer}: {records}")
    layer_keys = [w.keys[1 + consumer]] * len(w.caches[1 + consumer])
    pulls: dict[tuple[str, int], list[Pull]] = {}
    for req, p in w.started:
        if p.consumer == consumer:
            pulls.setdefault((req, p.uuid), []).append(p)
    for (req, uuid), alike in pulls.items():
        mine = [r for r in records if r.get("req_id") == req and r.get("uuid") == uuid]
        landed = [p for p in alike if p.settled == DONE]
        if not len(landed) <= len(mine) <= len(alike):
            raise Broken(ERROR, f"consumer {consumer}'s telemetry holds {len(mine)} records of request {req!r} "
                                f"(uuid {uuid}); it started {len(alike)} pulls of it, {len(landed)} landed")
        if len(mine) == len(landed) == 1:
            blocks = len(landed[0].remote)
            problem = record_problem(mine[0], req, (blocks, pull_bytes(layer_keys, blocks)), stages=True)
            if problem:
                raise Broken(ERROR, f"consumer {consumer}'s record of {req!r} (uuid {uuid}): {problem}")


def _poll(session: Session, w: PullWorld) -> None:
    sending, _, _ = w.managers[0].poll_stats()
    for req in sending:
        if req in w.sent:
            raise Broken(ERROR, f"the producer told {req} done sending twice")
        w.sent.add(req)
    for consumer in (0, 1):
        _, done, failed = w.managers[1 + consumer].poll_stats()
        for req, how in [*((r, DONE) for r in done), *((r, FAILED) for r in failed)]:
            p = w.pulls.get(req)
            if p is None or p.consumer != consumer:
                raise Broken(ERROR, f"consumer {consumer} reported {req} {how}, a pull it never made or "
                                    f"reported before")
            if p.settled:
                raise Broken(ERROR, f"{req} reported {p.settled} and then {how}")
            if how == FAILED:
                manager = w.managers[1 + consumer]  # why, as the library says it, or "": never a failure
                w.reasons[req] = manager.failure(req) if isinstance(manager, ManagerProcess) else \
                    w.lib.pull_failure(manager, req)
            if p.expect not in (how, EITHER):
                why = f" ({w.reasons[req]})" if how == FAILED and w.reasons[req] else ""
                raise Broken(ERROR, f"{req} (uuid {p.uuid}, {p.remote} -> {p.local}) reported {how}{why}; "
                                    f"the model says {p.expect}")
            p.settled = how
            exported(session, lambda e: e.pull_ended(("pull", p.index), how == DONE, p.served,
                                                     ("registered", p.uuid)))
            if how == DONE:
                for layer, blocks in enumerate(w.blocks[1 + consumer]):
                    for row, l in zip(p.source[layer], p.local):
                        blocks[l] = row


def draw_pull_step(rng, session: Session) -> dict:
    """One of the pull rules, from what the pull managers hold now. A
    producer going away (drop_producer, and `drop` mid-pull) is not drawn:
    on kvref-sim a pull left in flight by it has been seen never to settle
    and to hold its worker's exit; it runs when a sequence names it."""
    w = getattr(session, "pulls", None)
    registrations = w.registrations if w else {}
    unsettled = bool(w and any(not p.settled for p in w.pulls.values()))
    uuid = int(rng.integers(1, 2**50))
    used = [p.uuid for _, p in w.started] if w else []
    if used and rng.random() < 0.15:  # the low bits of a uuid used before: a table keyed by them collides
        uuid = (int(rng.integers(1, 2**29)) << 21) | (used[int(rng.integers(len(used)))] & (2**21 - 1))
    req = f"req-{int(rng.integers(2**31))}" if rng.random() < 0.85 else f'req "{int(rng.integers(2**31))}" \\ \u00e9'
    rows = session.key.dims[0]
    kind = rng.random()
    # Serving steps are drawn from a stream of their own: where an IUT takes them, every other step is
    # drawn as where it does not, so a seed means the same sequence of the other rules on every IUT.
    own = np.random.default_rng([uuid, 7])
    if w and session.spec.get("serves") and own.random() < 0.2:
        manager = int(own.integers(3))
        blocks = [int(b) for b in own.choice(w.keys[manager].dims[0], int(own.integers(1, 3)), replace=False)]
        return {"rule": "serve", "manager": manager, "blocks": blocks, "seed": int(own.integers(2**31)),
                "steps": int(own.integers(1, 9))}
    if unsettled and kind < 0.35:
        return {"rule": "settle"} if rng.random() < 0.85 else {"rule": "drop_producer"}
    if registrations and not w.expired and own.random() < EXPIRY_DRAWN:
        return {"rule": "expire"}
    pulled = sorted(w.pulled) if w else []
    if not registrations or kind < 0.55:
        n = int(rng.integers(1, MAX_BLOCKS + 1))
        blocks = [int(b) for b in rng.choice(rows, n, replace=False)]
        odd = rng.random()
        if odd < 0.1:
            blocks[-1] = rows if rng.random() < 0.5 else -1
        elif odd < 0.25 and registrations:  # another request's very blocks (a shared prefix)
            blocks = list(registrations[sorted(registrations)[int(rng.integers(len(registrations)))]])
        elif odd < 0.5 and pulled:  # a uuid whose pull settled, used again
            uuid = pulled[int(rng.integers(len(pulled)))]
        return {"rule": "register", "req": req, "uuid": uuid, "blocks": blocks}
    uuids = sorted(registrations)
    taken = uuids[int(rng.integers(len(uuids)))]
    if pulled and rng.random() < 0.15:  # a registration a pull took already
        taken = pulled[int(rng.integers(len(pulled)))]
        registrations = {taken: [int(b) for b in rng.choice(rows, 2, replace=False)]}
    blocks = registrations[taken]
    pick = [int(i) for i in rng.permutation(len(blocks))]  # every registered block, paired in a new order
    local = [int(b) for b in rng.choice(rows, len(blocks), replace=False)]
    step = {"rule": "pull", "req": req, "uuid": taken, "pick": pick, "remote": [blocks[i] for i in pick],
            "local": local, "consumer": 0, "parallelism": int(rng.choice([1, 1, 2, 3, 4]))}
    odd = rng.random()
    if odd < 0.08:  # refused at once: lists of different lengths, or a local block out of range
        step["local"] = local[:-1] if len(local) > 1 and rng.random() < 0.5 else local[:-1] + [rows]
        return step
    if odd < 0.09:
        step["uuid"] = uuid  # never registered: its producer waits for it timeout_s, so drawn rarely
    elif odd < 0.2:
        step["consumer"] = 1  # blocks of another size
    elif odd < 0.3:
        late_by = float(rng.choice([d for d, _ in LATE_BY], p=[p for _, p in LATE_BY]))
        step.update(uuid=uuid, early=True, late_by=late_by)  # registered after the pull began
    elif odd < 0.42:
        step["drop"] = True  # its producer goes away while it runs
    return step


RULES = {"register": register, "pull": pull, "settle": settle, "drop_producer": drop_producer, "serve": serve,
         "expire": expire}
# What exercises each call of probes.iut.protocol's PullLibrary and PullManager.
CALLS = {"pull_manager": "world", "close_manager": "drop_producer", "pull_failure": "settle",
         "register_read": "register", "start_read": "pull", "poll_stats": "settle", "get_local_endpoints": "pull"}
