"""Pulls between two managers that land: blocks moved exactly, both
constructor forms, layers of two block sizes, a uuid used again once settled,
and several pulls in flight at once. Each probe runs as a producer and a
consumer worker (probes.run.pair); the consumer judges the bytes, the
producer what it was told."""

from __future__ import annotations

import time

import numpy as np

import kvref
from probes.iut.adapter import Adapter
from probes.suite.cases import Case
from probes.suite.pull_sides import (LAYERS, PEER_WAIT_S, PULL_TIMEOUT_S, SETTLE_GRACE_S, SHARDED, SUBJECT, NoRails, Side,
                                     endpoint_for, no_pulls, plain_copy_gbps, poll, pull_library, uuid_of)
from probes.suite.sharded import no_mesh
from probes.suite.verdicts import CORRUPT, ERROR, PASS, SKIP, Outcome

MESH_KINDS = ("sharded", "sub_managers", "broadcast")  # caches split across heads over four devices
BLOCK_KINDS = ("permuted", "subset", "mixed_block_sizes", "pool_form", "parallel", *MESH_KINDS)
STREAMS = 3  # the parallel kind's start_read parallelism: it does not divide SUBSET
SUB_MANAGERS = 2  # of the sub_managers and broadcast kinds, over the four parts of a SHARDED block
SUBSET = 32  # blocks in a subset pull
HALF_HEADS = kvref.ShapeKey(SUBJECT.dtype, (SUBJECT.dims[0], SUBJECT.dims[1] // 2, SUBJECT.dims[2]))


def pairs_for(case: Case, blocks: int, count: int | None = None, avoid=()) -> list[tuple[int, int]]:
    """(remote, local) block pairs both sides derive from the case: every
    block permuted, or `count` remote blocks in a random order into other
    local blocks (none in `avoid`)."""
    rng = np.random.default_rng(case.seed + 17 * len(avoid))
    if count is None:
        return list(zip(rng.permutation(blocks).tolist(), rng.permutation(blocks).tolist()))
    free = [b for b in range(blocks) if b not in set(avoid)]
    return list(zip(rng.choice(blocks, count, replace=False).tolist(),
                    rng.choice(free, count, replace=False).tolist()))


def pull_blocks(case: Case, iut: Adapter) -> Outcome:
    """The consumer pulls the producer's blocks (every block in a
    permutation, or a reordered subset into other blocks, in one stream or
    in STREAMS (start_read's parallelism); in the
    max_blocks/num_slots form, or the host-pool form; layers of one block
    size, or two; caches split across their heads over four devices, each
    manager whole or split into sub-managers that each serve part of a
    block): it must be reported done exactly once within timeout_s, each
    local block must then hold its paired remote block in every layer and
    part, and every other block its own bytes; the producer must be told
    done sending exactly once. Pulling every part of a split producer from
    its first sub-manager alone (broadcast) may fail, never land wrong
    bytes."""
    lib = pull_library(iut)
    if lib is None:
        return no_pulls(iut)
    keys = (SUBJECT, HALF_HEADS) * 2 if case.kind == "mixed_block_sizes" else ()
    split = case.kind in MESH_KINDS
    if split and iut.sharded_arrays() is None:
        return no_mesh(iut)
    side = Side(case, iut, lib, keys=(SHARDED[0],) * LAYERS if split else keys,
                sharding=SHARDED[1] if split else None)
    form = "pool" if case.kind == "pool_form" else "slots"
    blocks = side.layer_keys[0].dims[0]
    pairs = pairs_for(case, blocks, None if case.kind == "permuted" else min(SUBSET, blocks // 2))
    sub_managers = SUB_MANAGERS if case.kind in ("sub_managers", "broadcast") else 1
    try:
        try:
            side.build(form=form, sub_managers=sub_managers, listen=True if sub_managers > 1 else None)
        except NoRails as e:
            return Outcome(SKIP, f"{iut.name} splits a manager over the host's data-plane NICs, and no "
                           f"stand-in NICs can be made here: {e}")
        made = len(side.manager.get_local_endpoints())
        if sub_managers > 1 and made < sub_managers:
            return Outcome(SKIP, f"asked for {sub_managers} sub-managers, {iut.name} made {made}: no split to "
                           "pull across")
        if side.producer:  # a broadcast pull that fails leaves its request to its timeout
            return produce(side, [("req-0", uuid_of(case), [r for r, _ in pairs])],
                           sent=() if case.kind == "broadcast" else None)
        if case.kind == "broadcast":
            return consume(side, [("req-0", uuid_of(case), pairs)], fails=("req-0",), may_land=True,
                           endpoint=lambda endpoints: endpoints[0]["endpoint"])
        return consume(side, [("req-0", uuid_of(case), pairs)],
                       parallelism=STREAMS if case.kind == "parallel" else 1)
    finally:
        side.close()


def produce(side: Side, requests: list[tuple[str, int, list[int]]], sent: tuple[str, ...] | None = None) -> Outcome:
    """Register each (request, uuid, blocks), post the endpoints, wait for the
    consumer to finish, then expect each request (of `sent`, default all)
    done sending, once."""
    for req, uuid, blocks in requests:
        if not side.manager.register_read(req, uuid, blocks):
            return Outcome(ERROR, f"register_read({req!r}, {uuid}, {len(blocks)} blocks) said nothing needs "
                           "to be transferred")
    side.rendezvous.post("registered", side.manager.get_local_endpoints())
    side.rendezvous.wait("finished", PEER_WAIT_S)
    names = list(sent) if sent is not None else [req for req, _, _ in requests]
    told = poll(side.manager, time.monotonic(), lambda s: all(r in s.sent for r in names), SETTLE_GRACE_S)
    missing = [r for r in names if r not in told.sent]
    if missing or told.twice:
        return Outcome(ERROR, f"done_sending: {missing} never reported after their pulls landed" if missing
                       else f"done_sending reported {sorted(set(told.twice))} more than once")
    return Outcome(PASS, f"{len(names)} request(s) reported done sending once each")


def consume(side: Side, requests: list[tuple[str, int, list[tuple[int, int]]]],
            fails: tuple[str, ...] = (), may_land: bool = False, endpoint=endpoint_for,
            parallelism: int = 1) -> Outcome:
    """Start each (request, uuid, pairs) pull at once, from `endpoint(the
    producer's endpoints)`, with start_read's `parallelism`; those in `fails`
    must fail (or, `may_land`, land exactly), the others land; then check
    every block."""
    endpoints = side.rendezvous.wait("registered", PEER_WAIT_S)
    try:
        started = time.monotonic()
        for req, uuid, pairs in requests:
            side.manager.start_read(req, uuid, endpoint(endpoints), [r for r, _ in pairs], [l for _, l in pairs],
                                    parallelism=parallelism)
        names = [req for req, _, _ in requests]
        settled = poll(side.manager, started, lambda s: all(s.state(r) != "unsettled" for r in names),
                       PULL_TIMEOUT_S + SETTLE_GRACE_S)
    finally:
        side.rendezvous.post("finished")
    fails = tuple(r for r in fails if not (may_land and settled.state(r) == "done"))
    wrong = {r: settled.state(r) for r in names if settled.state(r) != ("failed" if r in fails else "done")}
    if wrong:
        reasons = {r: side.lib.pull_failure(side.manager, r) for r, state in wrong.items() if state == "failed"}
        return Outcome(ERROR, f"requests ended {wrong} (expected {'failed' if fails else 'done'} for "
                       f"{sorted(wrong)}, within timeout_s={PULL_TIMEOUT_S}s + {SETTLE_GRACE_S}s)"
                       + (f"; reasons {reasons}" if reasons else ""))
    if settled.twice:
        return Outcome(ERROR, f"poll_stats reported {sorted(set(settled.twice))} more than once")
    landed = [pair for req, _, pairs in requests if req not in fails for pair in pairs]
    wrong_bytes = side.check_blocks(landed)
    if wrong_bytes:
        return Outcome(CORRUPT, f"after the pulls reported done: {wrong_bytes}")
    moved = side.pull_bytes(len(landed))
    last = max(settled.done.values(), default=0.0)
    return Outcome(PASS, f"{len(landed)} blocks x {len(side.caches)} layers pulled exactly, each request "
                   f"reported once; {len(fails)} failed as expected", bytes_moved=moved, seconds=last or None,
                   baseline_gbps=plain_copy_gbps(moved) if moved else None)


def pull_reuse(case: Case, iut: Adapter) -> Outcome:
    """A uuid and request id pulled once, settled on both sides, then used
    again for other blocks: the second pull must land the second
    registration's blocks (not the first's), each reported once."""
    lib = pull_library(iut)
    if lib is None:
        return no_pulls(iut)
    side = Side(case, iut, lib)
    first = pairs_for(case, SUBJECT.dims[0], SUBSET)
    second = pairs_for(case, SUBJECT.dims[0], SUBSET, avoid=[l for _, l in first])
    uuid = uuid_of(case)
    try:
        side.build()
        if side.producer:
            outcome = produce(side, [("req-0", uuid, [r for r, _ in first])])
            if outcome.verdict != PASS:
                return outcome
            side.rendezvous.post("again")
            return _produce_again(side, uuid, [r for r, _ in second])
        outcome = consume(side, [("req-0", uuid, first)])
        if outcome.verdict != PASS:
            return outcome
        side.rendezvous.wait("again", PEER_WAIT_S)
        endpoints = side.rendezvous.wait("registered-again", PEER_WAIT_S)
        started = time.monotonic()
        side.manager.start_read("req-0", uuid, endpoint_for(endpoints), [r for r, _ in second],
                                [l for _, l in second])
        settled = poll(side.manager, started, lambda s: s.state("req-0") != "unsettled",
                       PULL_TIMEOUT_S + SETTLE_GRACE_S)
        side.rendezvous.post("finished-again")
        if settled.state("req-0") != "done" or settled.twice:
            reason = side.lib.pull_failure(side.manager, "req-0") if settled.state("req-0") == "failed" else ""
            return Outcome(ERROR, f"the second pull under uuid {uuid} ended {settled.state('req-0')}"
                           + (" and was reported twice" if settled.twice else "") + (f" ({reason})" if reason else ""))
        wrong = side.check_blocks(first + second)
        if wrong:
            return Outcome(CORRUPT, f"after the second pull under the same uuid: {wrong}")
        return Outcome(PASS, f"uuid {uuid} and request 'req-0' pulled twice, each pull's own blocks landing")
    finally:
        side.close()


def _produce_again(side: Side, uuid: int, blocks: list[int]) -> Outcome:
    try:
        if not side.manager.register_read("req-0", uuid, blocks):
            return Outcome(ERROR, "register_read said nothing needs to be transferred")
    except Exception as e:
        return Outcome(ERROR, f"register_read under uuid {uuid} once its first transfer had settled on both "
                       f"sides was refused: {type(e).__name__}: {e}")
    side.rendezvous.post("registered-again", side.manager.get_local_endpoints())
    side.rendezvous.wait("finished-again", PEER_WAIT_S)
    return Outcome(PASS, "registered the same uuid again once it had settled")


def pull_concurrent(case: Case, iut: Adapter) -> Outcome:
    """Three pulls in flight at once between one pair of managers: two of
    the same remote blocks (two registrations of equal block ids) into
    different local blocks, and one naming a block the producer never
    registered. Each must settle on its own, exactly once: the two land
    exactly, the third fails and leaves its local blocks as they were."""
    lib = pull_library(iut)
    if lib is None:
        return no_pulls(iut)
    side = Side(case, iut, lib)
    first = pairs_for(case, SUBJECT.dims[0], SUBSET)
    twin = [(r, l) for (r, _), (_, l) in zip(first, pairs_for(case, SUBJECT.dims[0], SUBSET,
                                                               avoid=[l for _, l in first]))]
    taken = [l for _, l in first + twin]
    stray = pairs_for(case, SUBJECT.dims[0], 4, avoid=taken)
    registered = [r for r, _ in first]
    unregistered = [(b, l) for b, (_, l) in zip([r for r in range(SUBJECT.dims[0]) if r not in registered], stray)]
    uuids = [uuid_of(case, n) for n in range(3)]
    try:
        side.build()
        if side.producer:
            return produce(side, [("req-a", uuids[0], registered), ("req-b", uuids[1], registered),
                                  ("req-c", uuids[2], registered)], sent=("req-a", "req-b"))
        return consume(side, [("req-a", uuids[0], first), ("req-b", uuids[1], twin),
                              ("req-c", uuids[2], unregistered)], fails=("req-c",))
    finally:
        side.close()

